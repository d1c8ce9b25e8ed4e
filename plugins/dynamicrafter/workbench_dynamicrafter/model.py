"""The whole DynamiCrafter model (U-Net, VAE, text and image towers, resampler) and its loader.

:class:`DynamiCrafterModel` exposes each part as a documented callable in upstream's layouts, so
the pieces can be compared with the release one by one:

* ``unet(x, t, context=..., fs=...)`` — ``x`` ``(B, 8, T, h, w)`` (noisy latents + concat latents);
* ``encode_text(tokens)`` — ``(B, 77)`` token ids → ``(B, 77, 1024)``;
* ``encode_image(image)`` — ``(B, 3, H, W)`` in [-1, 1] → ``(B, 257, 1280)``;
* ``resample(tokens)`` — image tokens → ``(B, 16 T, 1024)``;
* ``vae_encode(frames)`` / ``vae_decode(latents)`` — ``(N, 3, H, W)`` ↔ scaled latents ``(N, 4, H/8, W/8)``.

:func:`from_checkpoint` builds it on the meta device and assigns the checkpoint's tensors, so the
weights are never held twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from workbench.errors import CheckpointError
from workbench_dynamicrafter.checkpoint import (
    LazySafetensors,
    check_layout,
    read_checkpoint,
    unused_shapes,
    unwrap,
    upstream_layout,
)
from workbench_dynamicrafter.encoders import (
    CLIP_MEAN,
    CLIP_STD,
    Resampler,
    autoencoder,
    resize_like_release,
    text_tower,
    vision_tower,
)
from workbench_dynamicrafter.unet import Float32GroupNorm, UNet3D
from workbench_dynamicrafter.variants import Sizes, Variant, compatible, get_variant, recognise, schedule_buffers


class DynamiCrafterModel(nn.Module):
    """Every network of one DynamiCrafter variant (see the module docstring for the callables)."""

    def __init__(self, variant: Variant, sizes: Sizes | None = None):
        super().__init__()
        self.variant, self.sizes = variant, sizes or variant.sizes
        s = self.sizes
        self.unet = UNet3D(s, in_channels=2 * s.latent_channels, out_channels=s.latent_channels,
                           default_fs=variant.default_fs, learnable_image_scale=variant.learnable_image_scale)
        self.vae = autoencoder(s)
        self.text = text_tower(s)
        self.vision = vision_tower(s)
        self.resampler = Resampler(s)

    # -- the documented callables ---------------------------------------------------------------
    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, 77)`` (open_clip's: start 49406, end 49407, padded with 0) → ``(B, 77, width)``:
        the penultimate layer through ``ln_final``, every position."""
        return self.text(input_ids=tokens.to(self.unet.out[2].weight.device)).last_hidden_state

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        """Frames ``(B, 3, H, W)`` in [-1, 1] → every token of the vision tower's last layer ``(B, 257, width)``."""
        weight = _inner(self.vision).embeddings.patch_embedding.weight
        x = resize_like_release(image.to(device=weight.device, dtype=torch.float32), self.sizes.vision_image_size)
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        x = ((x + 1.0) / 2.0 - mean) / std
        return self.vision(pixel_values=x.to(weight.dtype)).last_hidden_state

    def resample(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``(B, 257, vision_width)`` → per-frame image context ``(B, 16 T, context_dim)``."""
        return self.resampler(tokens)

    def vae_encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames ``(N, 3, H, W)`` in [-1, 1] → scaled latents ``(N, 4, H/8, W/8)`` (posterior mean x 0.18215),
        one frame at a time."""
        out = [self.vae.encode(f[None].to(self.vae.dtype)).latent_dist.mode() for f in frames]
        return torch.cat(out) * self.variant.scale_factor

    def vae_decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents ``(N, 4, h, w)`` → frames ``(N, 3, 8h, 8w)`` (unclamped), one frame at a time."""
        out = [self.vae.decode((z[None] / self.variant.scale_factor).to(self.vae.dtype)).sample for z in latents]
        return torch.cat(out)

    def parameter_counts(self) -> dict[str, int]:
        return {name: sum(p.numel() for p in getattr(self, name).parameters())
                for name in ("unet", "vae", "text", "vision", "resampler")}


def float32_keys(model: nn.Module) -> set[str]:
    """The state-dict keys of ``model``'s float32 GroupNorms (kept in float32 whatever the load dtype)."""
    return {f"{name}.{p}" for name, m in model.named_modules() if isinstance(m, Float32GroupNorm)
            for p, _ in m.named_parameters(recurse=False)}


def _inner(tower: nn.Module) -> nn.Module:
    """The transformer inside a transformers CLIP model (older versions nest it, newer ones do not)."""
    return getattr(tower, "text_model", None) or getattr(tower, "vision_model", None) or tower


def _resolve_variant(state: Mapping, variant: str | None) -> tuple[Variant, str]:
    guessed, why = recognise(state)
    if variant is None:
        return get_variant("512" if guessed == "512/1024" else guessed), why
    chosen = get_variant(variant)
    if not compatible(chosen.name, guessed):
        names = guessed.split("/")
        raise CheckpointError(f"dynamicrafter: variant={variant!r} was requested, but the checkpoint looks like the "
                              f"{' or '.join(names)} model: {why}. Pass "
                              f"{' or '.join(f'variant={n!r}' for n in names)} (or leave it unset to use what the keys "
                              f"say).")
    return chosen, why


def _check_schedule(state: Mapping, variant: Variant) -> None:
    expected = schedule_buffers(variant)
    for name, value in expected.items():
        if name not in state:
            continue
        got = state[name]
        if got.device.type == "meta":
            return
        got = got.float().cpu()
        if not torch.allclose(got, value, rtol=1e-4, atol=1e-6):
            raise CheckpointError(
                f"dynamicrafter: the checkpoint's {name} buffer differs from the {variant.name} model's schedule "
                f"(prediction {variant.prediction}, zero-terminal-SNR {variant.zero_snr}, dynamic rescale "
                f"{variant.dynamic_rescale}); max difference {(got - value).abs().max():.3g}. This is not a released "
                f"{variant.name} checkpoint, or it was saved with a different schedule: pass the right variant.")


def from_checkpoint(path_or_state_dict: str | Path | Mapping, variant: str | None = None, *,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    **size_overrides) -> DynamiCrafterModel:
    """Load an official checkpoint (file or state dict, upstream key layout) into :class:`DynamiCrafterModel`.

    ``variant``: ``"256"`` / ``"512"`` / ``"1024"`` / ``"512_interp"``, or ``None`` to recognise it
    from the keys (the ``512`` model and its interpolation sibling look the same: pass
    ``"512_interp"`` for that one). ``size_overrides``: :class:`Sizes` fields for non-released sizes.
    Every key must be consumed with its shape; otherwise a :class:`CheckpointError` lists the first
    few missing / unexpected / misshaped keys and their counts. ``device="meta"`` checks the layout
    without any weights.
    """
    if isinstance(path_or_state_dict, (str, Path)):
        state = read_checkpoint(path_or_state_dict)
    elif isinstance(path_or_state_dict, Mapping):
        state = unwrap(path_or_state_dict)
    else:
        raise CheckpointError(f"dynamicrafter: from_checkpoint takes a path or a state dict, got "
                              f"{type(path_or_state_dict).__name__}.")
    if "model.diffusion_model.framestride_embed.0.weight" in state:  # the 256 release's name for fps_embedding
        renamed = {k.replace(".framestride_embed.", ".fps_embedding."): k for k in state}
        state = _Renamed(state, renamed)
    chosen, _ = _resolve_variant(state, variant)
    sizes = chosen.sizes.replace(**size_overrides) if size_overrides else chosen.sizes
    with torch.device("meta"):
        model = DynamiCrafterModel(chosen, sizes)
    layout = upstream_layout(model)
    check_layout(state, layout, unused_shapes(model), chosen.name)
    _check_schedule(state, chosen)
    float32 = float32_keys(model)  # norms that compute in float32 keep their weights in float32
    ours: dict[str, torch.Tensor] = {}
    for key, targets in layout.items():
        if not targets:
            continue
        tensor = state[key]
        for target in targets:
            want = torch.float32 if target.key in float32 else dtype
            piece = tensor.to(device=device, dtype=want) if tensor.is_floating_point() else tensor.to(device=device)
            piece = piece if target.part is None else piece.chunk(target.part[1], dim=0)[target.part[0]]
            ours[target.key] = piece.reshape(target.shape)
    buffers = {k: v for k, v in model.state_dict(keep_vars=True).items() if k not in ours}
    if buffers:
        raise CheckpointError(f"dynamicrafter: internal layout error, no checkpoint tensor for {sorted(buffers)[:5]}")
    model.load_state_dict(ours, strict=True, assign=True)
    for tower in (model.text, model.vision):  # non-persistent: rebuilt, not loaded
        embeddings = _inner(tower).embeddings
        count = embeddings.position_embedding.weight.shape[0]
        embeddings.register_buffer("position_ids", torch.arange(count, device=device).expand(1, -1), persistent=False)
    stale = [name for name, buffer in model.named_buffers() if buffer.device.type == "meta"]
    if stale and torch.device(device).type != "meta":
        raise CheckpointError(f"dynamicrafter: internal error, buffers {stale[:5]} were not loaded")
    return model.eval().requires_grad_(False)


class _Renamed(Mapping):
    """A view of a state dict with some keys renamed (``new → old``)."""

    def __init__(self, state: Mapping, names: dict[str, str]):
        self.state, self.names = state, names

    def __getitem__(self, key):
        return self.state[self.names[key]]

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def shape(self, key):
        if isinstance(self.state, LazySafetensors):
            return self.state.shape(self.names[key])
        return tuple(self.state[self.names[key]].shape)
