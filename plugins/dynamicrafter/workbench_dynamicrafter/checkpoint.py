"""Reading official DynamiCrafter checkpoints and mapping their keys onto our modules.

The layout is derived from the model itself: every tensor of ours has one upstream name (the
text and vision towers' ``q/k/v`` projections are thirds of one ``in_proj``; the VAE's attention
projections are ``1x1`` convolutions upstream), and the upstream tensors we do not use (the last
text layer, the towers' output projections, the image embedder's leftover text parts, the schedule
buffers) are listed with their shapes. Loading consumes every key of the checkpoint exactly once.

Files: ``.safetensors`` (read lazily, one tensor at a time), or a Lightning ``.ckpt`` read with
``torch.load(weights_only=True)``; nesting under ``state_dict`` (Lightning) or ``module``
(DeepSpeed, whose keys carry a 16-character ``_forward_module.`` prefix) is unwrapped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.errors import CheckpointError

CONVERT_HINT = "workbench-dynamicrafter convert model.ckpt out.safetensors --trust-pickle"
SCHEDULE_KEYS = ("betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod",
                 "sqrt_one_minus_alphas_cumprod", "log_one_minus_alphas_cumprod", "sqrt_recip_alphas_cumprod",
                 "sqrt_recipm1_alphas_cumprod", "posterior_variance", "posterior_log_variance_clipped",
                 "posterior_mean_coef1", "posterior_mean_coef2", "scale_arr")


@dataclass(frozen=True)
class Target:
    """Where one upstream tensor goes: our key, and ``part`` = (index, count) of a dim-0 split."""

    key: str
    shape: tuple[int, ...]
    part: tuple[int, int] | None = None
    upstream_shape: tuple[int, ...] = ()


# -- our names → upstream names -----------------------------------------------------------------
_CLIP_LAYER = [(r"self_attn\.([qkv])_proj\.(weight|bias)$", None),
               (r"self_attn\.out_proj\.", "attn.out_proj."),
               (r"layer_norm1\.", "ln_1."), (r"layer_norm2\.", "ln_2."), (r"mlp\.fc1\.", "mlp.c_fc."),
               (r"mlp\.fc2\.", "mlp.c_proj.")]
_CLIP_TOP = {"embeddings.token_embedding.weight": "token_embedding.weight",
             "embeddings.position_embedding.weight": "positional_embedding",
             "final_layer_norm.weight": "ln_final.weight", "final_layer_norm.bias": "ln_final.bias",
             "embeddings.class_embedding": "class_embedding",
             "embeddings.patch_embedding.weight": "conv1.weight",
             "pre_layrnorm.weight": "ln_pre.weight", "pre_layrnorm.bias": "ln_pre.bias",
             "post_layernorm.weight": "ln_post.weight", "post_layernorm.bias": "ln_post.bias"}


def _clip_name(key: str) -> tuple[str, tuple[int, int] | None]:
    key = re.sub(r"^(text_model|vision_model)\.", "", key)
    if key in _CLIP_TOP:
        return _CLIP_TOP[key], None
    m = re.match(r"encoder\.layers\.(\d+)\.(.*)$", key)
    if not m:
        raise KeyError(key)
    index, rest = m.groups()
    qkv = re.match(r"self_attn\.([qkv])_proj\.(weight|bias)$", rest)
    if qkv:
        return f"transformer.resblocks.{index}.attn.in_proj_{qkv.group(2)}", ("qkv".index(qkv.group(1)), 3)
    for pattern, new in _CLIP_LAYER[1:]:
        if re.match(pattern, rest):
            return f"transformer.resblocks.{index}." + re.sub(pattern, new, rest, count=1), None
    raise KeyError(key)


_VAE_RESNET = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2",
               "conv_shortcut": "nin_shortcut"}
_VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def _vae_name(key: str, levels: int) -> str:
    """diffusers ``AutoencoderKL`` name → the LDM name in the checkpoint."""
    rules = [
        (r"^(encoder)\.down_blocks\.(\d+)\.resnets\.(\d+)\.(\w+)\.",
         lambda m: f"{m[1]}.down.{m[2]}.block.{m[3]}.{_VAE_RESNET[m[4]]}."),
        (r"^(encoder)\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.",
         lambda m: f"{m[1]}.down.{m[2]}.downsample.conv."),
        (r"^(decoder)\.up_blocks\.(\d+)\.resnets\.(\d+)\.(\w+)\.",
         lambda m: f"{m[1]}.up.{levels - 1 - int(m[2])}.block.{m[3]}.{_VAE_RESNET[m[4]]}."),
        (r"^(decoder)\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.",
         lambda m: f"{m[1]}.up.{levels - 1 - int(m[2])}.upsample.conv."),
        (r"^(\w+)\.mid_block\.resnets\.(\d+)\.(\w+)\.",
         lambda m: f"{m[1]}.mid.block_{int(m[2]) + 1}.{_VAE_RESNET[m[3]]}."),
        (r"^(\w+)\.mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.",
         lambda m: f"{m[1]}.mid.attn_1.{_VAE_ATTN[m[2]]}."),
        (r"^(\w+)\.conv_norm_out\.", lambda m: f"{m[1]}.norm_out."),
    ]
    for pattern, new in rules:
        m = re.match(pattern, key)
        if m:
            return new(m) + key[m.end():]
    return key


def upstream_layout(model) -> dict[str, list[Target]]:
    """Upstream key → the targets in ``model`` (a :class:`~workbench_dynamicrafter.model.DynamiCrafterModel`)
    it fills; ``[]`` for upstream tensors that are checked and dropped (see :func:`unused_shapes`)."""
    layout: dict[str, list[Target]] = {}
    levels = len(model.sizes.vae_channels)
    for key, value in model.state_dict(keep_vars=True).items():
        part = None
        component, rest = key.split(".", 1)
        if component == "unet":
            name = "model.diffusion_model." + rest.replace("temporal_conv.", "temopral_conv.")
        elif component == "resampler":
            name = "image_proj_model." + rest
        elif component == "vae":
            name = "first_stage_model." + _vae_name(rest, levels)
        elif component == "text":
            name, part = _clip_name(rest)
            name = "cond_stage_model.model." + name
        elif component == "vision":
            name, part = _clip_name(rest)
            name = "embedder.model.visual." + name
        else:
            raise KeyError(f"no upstream name for {key}")
        shape = tuple(value.shape)
        upstream = shape if part is None else (shape[0] * part[1], *shape[1:])
        if component == "vae" and ".attentions." in rest and len(shape) == 2:
            upstream = (*shape, 1, 1)  # 1x1 convolutions in the LDM autoencoder
        layout.setdefault(name, []).append(Target(key, shape, part, upstream))
    for name in unused_shapes(model):
        layout[name] = []
    return layout


def unused_shapes(model) -> dict[str, tuple[int, ...]]:
    """The upstream tensors DynamiCrafter's inference never reads, with their expected shapes."""
    s, v = model.sizes, model.variant
    text, vision, embed = s.text_width, s.vision_width, s.clip_embed_dim
    last = f"cond_stage_model.model.transformer.resblocks.{s.text_layers - 1}."
    out = {last + "ln_1.weight": (text,), last + "ln_1.bias": (text,),
           last + "attn.in_proj_weight": (3 * text, text),
           last + "attn.in_proj_bias": (3 * text,), last + "attn.out_proj.weight": (text, text),
           last + "attn.out_proj.bias": (text,), last + "ln_2.weight": (text,), last + "ln_2.bias": (text,),
           last + "mlp.c_fc.weight": (4 * text, text), last + "mlp.c_fc.bias": (4 * text,),
           last + "mlp.c_proj.weight": (text, 4 * text), last + "mlp.c_proj.bias": (text,),
           "cond_stage_model.model.text_projection": (text, embed), "cond_stage_model.model.logit_scale": (),
           "embedder.model.visual.proj": (vision, embed),
           "embedder.model.token_embedding.weight": (s.text_vocab, text),
           "embedder.model.positional_embedding": (s.text_length, text),
           "embedder.model.ln_final.weight": (text,),
           "embedder.model.ln_final.bias": (text,), "embedder.model.text_projection": (text, embed),
           "embedder.model.logit_scale": ()}
    for name in SCHEDULE_KEYS:
        if name != "scale_arr" or v.dynamic_rescale is not None:
            out[name] = (v.timesteps + 400,) if name == "scale_arr" else (v.timesteps,)
    return out


# -- reading files ------------------------------------------------------------------------------
class LazySafetensors(Mapping):
    """A safetensors file as a read-only mapping that reads each tensor when asked."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = path
        self._file = safe_open(str(path), framework="pt")
        self._keys = list(self._file.keys())

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._keys:
            raise KeyError(key)
        return self._file.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(key).get_shape())


def unwrap(state: Mapping) -> Mapping:
    """The flat ``{key: tensor}`` inside a Lightning (``state_dict``) or DeepSpeed (``module``) checkpoint."""
    if "state_dict" in state and isinstance(state["state_dict"], Mapping):
        state = state["state_dict"]
    elif "module" in state and isinstance(state["module"], Mapping):
        state = {k[16:] if k.startswith("_forward_module.") else k: v for k, v in state["module"].items()}
    return state


def read_checkpoint(path: str | Path) -> Mapping:
    """``path`` as a flat mapping of tensors (safetensors lazily; ``.ckpt`` / ``.pt`` / ``.pth`` safely)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise CheckpointError(f"dynamicrafter: checkpoint {str(path)!r} does not exist. Expected an official "
                              f"DynamiCrafter model.ckpt (Doubiiu/DynamiCrafter_512, ...) "
                              f"or a .safetensors conversion of one ({CONVERT_HINT}).")
    if file.suffix == ".safetensors":
        try:
            return LazySafetensors(file)
        except Exception as err:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"dynamicrafter: cannot read {file} as safetensors ({err}). Re-download or "
                                  f"re-convert it.") from err
    try:
        state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises UnpicklingError / RuntimeError for refused pickles
        raise CheckpointError(
            f"dynamicrafter: {file} cannot be read safely (torch.load(weights_only=True) refused it: "
            f"{str(err).splitlines()[0][:200]}). Official Lightning checkpoints can carry pickled training "
            f"state; convert it once, if you trust the file: "
            f"`{CONVERT_HINT.replace('model.ckpt', str(file))}`, then load the .safetensors file."
        ) from err
    if not isinstance(state, Mapping):
        raise CheckpointError(f"dynamicrafter: {file} holds a {type(state).__name__}, not a state dict.")
    return unwrap(state)


def shape_of(state: Mapping, key: str) -> tuple[int, ...]:
    shape = getattr(state, "shape", None)  # lazy files and renamed views read shapes without the data
    return shape(key) if callable(shape) else tuple(state[key].shape)


def check_layout(state: Mapping, layout: dict[str, list[Target]], unused: dict[str, tuple[int, ...]],
                 variant: str) -> None:
    """Every expected key present with its shape, nothing else; else one error listing the problems."""
    keys = set(state)
    missing = sorted(k for k in layout if k not in keys)
    unexpected = sorted(k for k in keys if k not in layout)
    wrong = []
    for key in sorted(keys & set(layout)):
        targets = layout[key]
        shape = targets[0].upstream_shape if targets else unused[key]
        got = shape_of(state, key)
        if got != shape:
            wrong.append(f"{key}: checkpoint {list(got)}, model {list(shape)}")
    if missing or unexpected or wrong:
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
            if items:
                parts.append(f"{len(items)} {label} (first: {', '.join(items[:5])})")
        raise CheckpointError(
            f"dynamicrafter: the checkpoint does not match the {variant} model's layout: {'; '.join(parts)}. "
            f"Pass the variant the checkpoint was released as "
            f"(variant='256' / '512' / '1024' / '512_interp'), "
            f"and size overrides only for non-released sizes."
        )


def upstream_shapes(model) -> dict[str, tuple[int, ...]]:
    """Every key a checkpoint for ``model`` holds, with its shape (the upstream layout)."""
    unused = unused_shapes(model)
    layout = upstream_layout(model)
    return {key: targets[0].upstream_shape if targets else unused[key] for key, targets in layout.items()}
