"""The whole DynamiCrafter model (U-Net, VAE, text and image towers, resampler) and its loader.

:class:`DynamiCrafterModel` exposes each part as a documented callable in upstream's layouts, so
the pieces can be compared with the release one by one:

* ``unet(x, t, context=..., fs=...)`` — ``x`` ``(B, 8, T, h, w)`` (noisy latents + concat latents);
* ``encode_text(tokens)`` — ``(B, 77)`` token ids → ``(B, 77, 1024)``;
* ``preprocess_image(image)`` — ``(B, 3, H, W)`` in [-1, 1] → the vision tower's input ``(B, 3, 224, 224)``;
* ``encode_image(image)`` — ``(B, 3, H, W)`` in [-1, 1] → ``(B, 257, 1280)``;
* ``resample(tokens)`` — image tokens → ``(B, 16 T, 1024)``;
* ``vae_posterior(frames)`` — ``(N, 3, H, W)`` → the posterior's mean and log-variance ``(N, 4, H/8, W/8)``;
* ``vae_encode(frames)`` / ``vae_decode(latents)`` — ``(N, 3, H, W)`` ↔ scaled latents ``(N, 4, H/8, W/8)``.

:func:`from_checkpoint` builds it on the meta device and assigns the checkpoint's tensors, so the
weights are never held twice; ``parts=("unet",)`` loads the U-Net alone (:func:`load_unet`) with
the same strict key checks over the whole file.
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
from workbench_dynamicrafter.variants import (
    Sizes,
    Variant,
    compatible,
    get_variant,
    recognise,
    schedule_buffers,
)

PARTS = ("unet", "vae", "text", "vision", "resampler")
"""The networks of a DynamiCrafter model, by attribute name."""


class DynamiCrafterModel(nn.Module):
    """The networks of one DynamiCrafter variant (see the module docstring for the callables).

    ``parts``: which of :data:`PARTS` to build (default all); a callable of a part not built
    raises a :class:`CheckpointError` naming it.
    """

    def __init__(self, variant: Variant, sizes: Sizes | None = None, parts: tuple[str, ...] = PARTS):
        super().__init__()
        self.variant, self.sizes = variant, sizes or variant.sizes
        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise CheckpointError(f"dynamicrafter: unknown part(s) {unknown}; "
                                  f"the parts are {', '.join(PARTS)}.")
        s = self.sizes
        self.parts = tuple(p for p in PARTS if p in parts)
        makers = {"unet": lambda: UNet3D(s, in_channels=2 * s.latent_channels, out_channels=s.latent_channels,
                                         default_fs=variant.default_fs,
                                         learnable_image_scale=variant.learnable_image_scale),
                  "vae": lambda: autoencoder(s), "text": lambda: text_tower(s),
                  "vision": lambda: vision_tower(s), "resampler": lambda: Resampler(s)}
        for name in self.parts:
            setattr(self, name, makers[name]())
        # every part's parameter count, built or not (from_checkpoint fills it)
        self.counts: dict[str, int] = {}

    def part(self, name: str) -> nn.Module:
        """The built part ``name`` (see :data:`PARTS`), or a CheckpointError saying it was not loaded."""
        if name not in self.parts:
            raise CheckpointError(f"dynamicrafter: this model was loaded with parts={self.parts}, "
                                  f"without {name!r}. "
                                  f"Load it with from_checkpoint(..., parts=(..., {name!r})).")
        return getattr(self, name)

    # -- the documented callables ---------------------------------------------------------------
    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, 77)`` (open_clip's: start 49406, end 49407, padded with 0) → ``(B, 77, width)``:
        the penultimate layer through ``ln_final``, every position."""
        text = self.part("text")
        device = _inner(text).embeddings.token_embedding.weight.device
        return text(input_ids=tokens.to(device)).last_hidden_state

    def preprocess_image(self, image: torch.Tensor) -> torch.Tensor:
        """Frames ``(B, 3, H, W)`` in [-1, 1] → the vision tower's input ``(B, 3, S, S)`` float32 (``S`` 224
        for the released models): resized as the release resizes (:func:`resize_like_release`: a Gaussian
        pre-blur when shrinking, then bicubic with aligned corners, no crop), mapped to [0, 1] and normalised
        with CLIP's mean and std (:data:`CLIP_MEAN`, :data:`CLIP_STD`)."""
        return preprocess_image(image, self.sizes.vision_image_size)

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        """Frames ``(B, 3, H, W)`` in [-1, 1] → every token of the vision tower's last layer
        ``(B, 257, width)`` (:meth:`preprocess_image`, then the tower without ``ln_post`` or the
        projection)."""
        vision = self.part("vision")
        weight = _inner(vision).embeddings.patch_embedding.weight
        x = self.preprocess_image(image.to(weight.device))
        return vision(pixel_values=x.to(weight.dtype)).last_hidden_state

    def resample(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``(B, 257, vision_width)`` → per-frame image context ``(B, 16 T, context_dim)``."""
        return self.part("resampler")(tokens)

    def vae_posterior(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames ``(N, 3, H, W)`` in [-1, 1] → the VAE posterior's ``(mean, logvar)``, each
        ``(N, 4, H/8, W/8)``, unscaled (multiply a latent by ``variant.scale_factor``, 0.18215, to get the
        U-Net's units), one frame at a time. ``logvar`` is clamped to [-30, 20] as the release's
        ``DiagonalGaussianDistribution`` clamps it; the release's ``encode_first_stage`` *samples*
        ``mean + exp(logvar / 2) * noise`` (unseeded), where :meth:`vae_encode` takes the mean."""
        vae = self.part("vae")
        means, logvars = [], []
        for f in frames:
            dist = vae.encode(f[None].to(device=vae.device, dtype=vae.dtype)).latent_dist
            means.append(dist.mean)
            logvars.append(dist.logvar)
        return torch.cat(means), torch.cat(logvars)

    def vae_encode(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames ``(N, 3, H, W)`` in [-1, 1] → scaled latents ``(N, 4, H/8, W/8)`` (posterior mean x
        0.18215), one frame at a time."""
        vae = self.part("vae")
        out = [vae.encode(f[None].to(vae.dtype)).latent_dist.mode() for f in frames]
        return torch.cat(out) * self.variant.scale_factor

    def vae_decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents ``(N, 4, h, w)`` → frames ``(N, 3, 8h, 8w)`` (unclamped), one frame at a time."""
        vae = self.part("vae")
        out = [vae.decode((z[None] / self.variant.scale_factor).to(vae.dtype)).sample for z in latents]
        return torch.cat(out)

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part (:data:`PARTS`), those not loaded included (counted from the checkpoint's
        shapes)."""
        built = {name: sum(p.numel() for p in getattr(self, name).parameters()) for name in self.parts}
        return {name: built.get(name, self.counts.get(name, 0)) for name in PARTS}


def preprocess_image(image: torch.Tensor, size: int = 224) -> torch.Tensor:
    """Frames ``(B, 3, H, W)`` in [-1, 1] → the CLIP vision tower's input ``(B, 3, size, size)`` float32, as
    the release prepares it: :func:`resize_like_release`, then ``(x + 1) / 2`` normalised with CLIP's mean and
    std."""
    x = resize_like_release(image.to(torch.float32), size)
    mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
    return ((x + 1.0) / 2.0 - mean) / std


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
        raise CheckpointError(f"dynamicrafter: variant={variant!r} was requested, but the checkpoint looks "
                              f"like the {' or '.join(names)} model: {why}. Pass "
                              f"{' or '.join(f'variant={n!r}' for n in names)} "
                              f"(or leave it unset to use what the keys say).")
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
                f"dynamicrafter: the checkpoint's {name} buffer differs from the {variant.name} model's "
                f"schedule (prediction {variant.prediction}, zero-terminal-SNR {variant.zero_snr}, "
                f"dynamic rescale {variant.dynamic_rescale}); "
                f"max difference {(got - value).abs().max():.3g}. This is not a released {variant.name} "
                f"checkpoint, or it was saved with a different schedule: pass the right variant.")


def from_checkpoint(path_or_state_dict: str | Path | Mapping, variant: str | None = None, *,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    parts: tuple[str, ...] = PARTS, **size_overrides) -> DynamiCrafterModel:
    """Load an official checkpoint (file or state dict, upstream key layout) into :class:`DynamiCrafterModel`.

    ``variant``: ``"256"`` / ``"512"`` / ``"1024"`` / ``"512_interp"``, or ``None`` to recognise it
    from the keys (the ``512`` model and its interpolation sibling look the same: pass
    ``"512_interp"`` for that one). ``size_overrides``: :class:`Sizes` fields for non-released sizes.
    Every key must be consumed with its shape; otherwise a :class:`CheckpointError` lists the first
    few missing / unexpected / misshaped keys and their counts. ``device="meta"`` checks the layout
    without any weights. ``parts``: which networks to load (:data:`PARTS`); the key checks cover the
    whole checkpoint whatever is loaded, and only the parts' tensors are read (lazily, from a
    ``.safetensors`` file). The U-Net's float32 GroupNorms are loaded in float32 whatever ``dtype``.

    >>> unet = from_checkpoint("/models/DynamiCrafter_512/model.ckpt", parts=("unet",)).unet  # doctest: +SKIP
    """
    if isinstance(path_or_state_dict, (str, Path)):
        state = read_checkpoint(path_or_state_dict)
    elif isinstance(path_or_state_dict, Mapping):
        state = unwrap(path_or_state_dict)
    else:
        raise CheckpointError(f"dynamicrafter: from_checkpoint takes a path or a state dict, got "
                              f"{type(path_or_state_dict).__name__}.")
    # the 256 release's name for fps_embedding
    if "model.diffusion_model.framestride_embed.0.weight" in state:
        renamed = {k.replace(".framestride_embed.", ".fps_embedding."): k for k in state}
        state = _Renamed(state, renamed)
    chosen, _ = _resolve_variant(state, variant)
    sizes = chosen.sizes.replace(**size_overrides) if size_overrides else chosen.sizes
    with torch.device("meta"):
        full = DynamiCrafterModel(chosen, sizes)
    layout = upstream_layout(full)
    check_layout(state, layout, unused_shapes(full), chosen.name)
    _check_schedule(state, chosen)
    counts = full.parameter_counts()
    if tuple(parts) == PARTS:
        model = full
    else:
        with torch.device("meta"):
            model = DynamiCrafterModel(chosen, sizes, parts=tuple(parts))
    model.counts = counts
    float32 = float32_keys(model)  # norms that compute in float32 keep their weights in float32
    ours: dict[str, torch.Tensor] = {}
    for key, targets in layout.items():
        targets = [t for t in targets if t.key.split(".", 1)[0] in model.parts]
        if not targets:
            continue
        tensor = state[key]
        for target in targets:
            want = torch.float32 if target.key in float32 else dtype
            piece = (tensor.to(device=device, dtype=want) if tensor.is_floating_point()
                     else tensor.to(device=device))
            piece = piece if target.part is None else piece.chunk(target.part[1], dim=0)[target.part[0]]
            ours[target.key] = piece.reshape(target.shape)
    buffers = {k: v for k, v in model.state_dict(keep_vars=True).items() if k not in ours}
    if buffers:
        raise CheckpointError(f"dynamicrafter: internal layout error, "
                              f"no checkpoint tensor for {sorted(buffers)[:5]}")
    model.load_state_dict(ours, strict=True, assign=True)
    for tower in (getattr(model, name) for name in ("text", "vision") if name in model.parts):
        embeddings = _inner(tower).embeddings  # non-persistent: rebuilt, not loaded
        count = embeddings.position_embedding.weight.shape[0]
        embeddings.register_buffer("position_ids", torch.arange(count, device=device).expand(1, -1),
                                   persistent=False)
    stale = [name for name, buffer in model.named_buffers() if buffer.device.type == "meta"]
    if stale and torch.device(device).type != "meta":
        raise CheckpointError(f"dynamicrafter: internal error, buffers {stale[:5]} were not loaded")
    return model.eval().requires_grad_(False)


REAL = Path(__file__).parent / "real"
"""The released configurations shipped with the plugin (``512.json``: sizes, variant and provenance)."""


def real_configuration(variant: str = "512") -> tuple[str, dict]:
    """``(variant, sizes)`` of a released model from its shipped JSON (``real/<variant>.json``)."""
    import json

    file = REAL / f"{variant}.json"
    if not file.is_file():
        shipped = sorted(p.stem for p in REAL.glob("*.json"))
        raise CheckpointError(f"dynamicrafter: no shipped configuration for variant {variant!r}; shipped: "
                              f"{', '.join(shipped)}.")
    doc = json.loads(file.read_text())
    return doc["variant"], doc["sizes"]


def random_model(variant: str = "512", *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, parts: tuple[str, ...] = PARTS, seed: int = 0,
                 **size_overrides) -> DynamiCrafterModel:
    """:class:`DynamiCrafterModel` with random weights: built with its parameters on the meta device, then
    each materialised once in ``dtype`` on ``device`` (the U-Net's float32 GroupNorms in float32) with
    deterministic values (:func:`workbench.backbones.random_weights.materialise`); in eval mode, frozen.
    Inside :func:`~workbench.backbones.random_weights.weights_on_meta` the parameters stay on meta (sizes
    only)."""
    from workbench.backbones.random_weights import empty_parameters, keeping_meta, materialise

    chosen = get_variant(variant)
    sizes = chosen.sizes.replace(**size_overrides) if size_overrides else chosen.sizes
    with torch.device("meta"):
        counts = DynamiCrafterModel(chosen, sizes).parameter_counts()
    with empty_parameters():
        model = DynamiCrafterModel(chosen, sizes, parts=tuple(parts))
    model.counts = counts
    keep = float32_keys(model)
    materialise(model, dtype=dtype, device="meta" if keeping_meta() else device, seed=seed, float32=keep)
    for tower in (getattr(model, name) for name in ("text", "vision") if name in model.parts):
        embeddings = _inner(tower).embeddings  # as from_checkpoint makes them
        count = embeddings.position_embedding.weight.shape[0]
        embeddings.register_buffer("position_ids", torch.arange(count).expand(1, -1), persistent=False)
    if not keeping_meta():
        model.to(device)
    return model.eval().requires_grad_(False)


def load_unet(path_or_state_dict: str | Path | Mapping, variant: str | None = None, *,
              device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
              **size_overrides) -> UNet3D:
    """The U-Net alone from an official checkpoint: :func:`from_checkpoint` with ``parts=("unet",)`` (the same
    strict checks of every key and shape in the file, the variant recognised the same way), in eval mode.

    >>> unet = load_unet("/models/DynamiCrafter_512/model.ckpt")          # doctest: +SKIP
    >>> eps_or_v = unet(x, t, context=context, fs=fs)                      # x (B, 8, T, h, w)
    """
    return from_checkpoint(path_or_state_dict, variant, device=device, dtype=dtype, parts=("unet",),
                           **size_overrides).unet


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
