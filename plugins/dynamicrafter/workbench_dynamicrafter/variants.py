"""The DynamiCrafter variants: architecture sizes, schedule, conditioning and sampling defaults.

Each released checkpoint (``256``, ``512``, ``1024``, ``512_interp``) pairs one architecture with
one diffusion setup and one inference recipe (the release's inference config and run scripts).
:class:`Sizes` holds every size knob, so a tiny model for tests is the same code at toy widths.
:func:`recognise` tells the variants apart from a checkpoint's keys (and, where only values
differ, from its ``scale_arr`` buffer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from workbench.errors import CheckpointError, did_you_mean, listing


@dataclass(frozen=True)
class Sizes:
    """Every size knob of the model; the defaults are the released models' (all variants share them).

    U-Net: ``model_channels``, ``channel_mult``, ``num_res_blocks``, ``attention_resolutions``
    (downsampling rates with transformers), ``head_channels``, ``context_dim``, ``init_attn_heads``
    (the extra temporal transformer after the stem). Text tower: ``text_*``; vision tower:
    ``vision_*`` (``vision_image_size`` / ``vision_patch``: 224 / 14 → 257 tokens); resampler:
    ``resampler_*`` (``queries`` per frame, ``frames`` = the U-Net's ``temporal_length``); VAE:
    ``vae_channels`` (one entry per level), ``vae_res_blocks``.
    """

    model_channels: int = 320
    channel_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attention_resolutions: tuple[int, ...] = (4, 2, 1)
    head_channels: int = 64
    context_dim: int = 1024
    init_attn_heads: int = 8
    frames: int = 16
    text_width: int = 1024
    text_layers: int = 24
    text_heads: int = 16
    text_vocab: int = 49408
    text_length: int = 77
    vision_width: int = 1280
    vision_layers: int = 32
    vision_heads: int = 16
    vision_image_size: int = 224
    vision_patch: int = 14
    clip_embed_dim: int = 1024  # the towers' unused output projections (text_projection, visual.proj)
    resampler_dim: int = 1024
    resampler_depth: int = 4
    resampler_heads: int = 12
    resampler_head_dim: int = 64
    resampler_queries: int = 16
    resampler_ff_mult: int = 4
    vae_channels: tuple[int, ...] = (128, 256, 512, 512)
    vae_res_blocks: int = 2
    latent_channels: int = 4

    def replace(self, **changes) -> Sizes:
        unknown = [k for k in changes if k not in {f.name for f in dataclasses.fields(self)}]
        if unknown:
            names = [f.name for f in dataclasses.fields(self)]
            raise TypeError(f"unknown size override {unknown[0]!r}; allowed: {listing(names)}."
                            f"{did_you_mean(unknown[0], names)}")
        for key in ("channel_mult", "attention_resolutions", "vae_channels"):
            if key in changes:
                changes[key] = tuple(changes[key])
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Variant:
    """One released DynamiCrafter model: how it was trained and how its authors sample it."""

    name: str
    prediction: str  # "eps" or "v"
    zero_snr: bool  # betas rescaled to zero terminal SNR
    dynamic_rescale: float | None  # base_scale of the x0 rescale, None = off
    fs_kind: str  # "fs" (frame stride) or "fps": what the fs embedding was trained on
    fs: int  # the value the authors pass (run scripts)
    default_fs: int  # the U-Net's own default when none is given
    learnable_image_scale: bool  # the 256 model's per-layer alpha on image cross-attention
    spacing: str  # DDIM timestep spacing
    guidance_rescale: float
    height: int
    width: int
    interp: bool = False  # first and last frame given (the interpolation model)
    frames: int = 16
    steps: int = 50
    eta: float = 1.0
    guidance_scale: float = 7.5
    linear_start: float = 0.00085
    linear_end: float = 0.012
    timesteps: int = 1000
    scale_factor: float = 0.18215
    sizes: Sizes = field(default_factory=Sizes)


VARIANTS: dict[str, Variant] = {
    "256": Variant("256", "eps", False, None, "fs", 3, 3, True, "uniform", 0.0, 256, 256),
    "512": Variant("512", "v", True, 0.7, "fps", 24, 24, False, "uniform_trailing", 0.7, 320, 512),
    "1024": Variant("1024", "v", True, 0.3, "fps", 10, 10, False, "uniform_trailing", 0.7, 576, 1024),
    "512_interp": Variant("512_interp", "v", True, 0.7, "fps", 5, 24, False, "uniform_trailing", 0.7,
                          320, 512, interp=True),
}


def get_variant(name: str) -> Variant:
    key = str(name)
    if key not in VARIANTS:
        raise CheckpointError(f"dynamicrafter: unknown variant {name!r}; allowed: {listing(VARIANTS)}."
                              f"{did_you_mean(key, VARIANTS)}")
    return VARIANTS[key]


def recognise(state: dict) -> tuple[str, str]:
    """``(variant, why)`` guessed from a checkpoint in the upstream key layout.

    The 256 model alone has learnable image cross-attention scales (``...attn2.alpha``) and no
    ``scale_arr``. The 512 and 1024 models have identical keys; their ``scale_arr`` buffers end at
    their dynamic-rescale base scale (0.7 vs 0.3). ``512_interp`` cannot be told from ``512``.
    """
    keys = state.keys()
    if any(k.endswith("attn2.alpha") for k in keys):
        return "256", "it has learnable image cross-attention scales (attn2.alpha)"
    arr = state.get("scale_arr")
    if arr is None:
        return "256", "it has no scale_arr buffer (no dynamic rescale)"
    if arr.device.type == "meta":
        return "512/1024", ("it has a scale_arr buffer (512, 1024 or 512_interp; "
                            "its values are not readable here)")
    last = float(arr[-1])
    for name in ("512", "1024"):
        if abs(last - VARIANTS[name].dynamic_rescale) < 1e-4:
            return name, f"its scale_arr ends at {last:.2f}, the {name} model's dynamic-rescale base scale"
    return "512", f"it has a scale_arr buffer ending at {last:.3f} (neither 0.7 nor 0.3)"


def compatible(requested: str, recognised: str) -> bool:
    """Whether a checkpoint that looks like ``recognised`` may be loaded as ``requested``."""
    if requested == recognised:
        return True
    if recognised == "512/1024":
        return requested in ("512", "1024", "512_interp")
    return {requested, recognised} <= {"512", "512_interp"}


# -- the diffusion schedule (computed as upstream does: float64 numpy-equivalent, stored float32) ---
def betas_for(variant: Variant) -> torch.Tensor:
    """The training betas (float64): the "linear" schedule on sqrt(beta), then zero-terminal-SNR if set."""
    betas = torch.linspace(variant.linear_start**0.5, variant.linear_end**0.5, variant.timesteps,
                           dtype=torch.float64) ** 2
    if variant.zero_snr:
        root = torch.cumprod(1 - betas, 0).sqrt()
        first, last = root[0].clone(), root[-1].clone()
        root = (root - last) * (first / (first - last))
        abar = root**2
        betas = 1 - torch.cat([abar[:1], abar[1:] / abar[:-1]])
    return betas


def schedule_buffers(variant: Variant) -> dict[str, torch.Tensor]:
    """The schedule buffers a checkpoint carries, as the training code registers them (float32)."""
    betas = betas_for(variant)
    abar = torch.cumprod(1 - betas, 0)
    prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
    with torch.no_grad():
        out = {
            "betas": betas,
            "alphas_cumprod": abar,
            "alphas_cumprod_prev": prev,
            "sqrt_alphas_cumprod": abar.sqrt(),
            "sqrt_one_minus_alphas_cumprod": (1 - abar).sqrt(),
            "log_one_minus_alphas_cumprod": torch.log(1 - abar),
        }
        if variant.prediction == "v":
            out["sqrt_recip_alphas_cumprod"] = torch.zeros_like(abar)
            out["sqrt_recipm1_alphas_cumprod"] = torch.zeros_like(abar)
        else:
            out["sqrt_recip_alphas_cumprod"] = (1 / abar).sqrt()
            out["sqrt_recipm1_alphas_cumprod"] = (1 / abar - 1).sqrt()
        posterior = betas * (1 - prev) / (1 - abar)
        out["posterior_variance"] = posterior
        out["posterior_log_variance_clipped"] = torch.log(posterior.clamp_min(1e-20))
        out["posterior_mean_coef1"] = betas * prev.sqrt() / (1 - abar)
        out["posterior_mean_coef2"] = (1 - prev) * (1 - betas).sqrt() / (1 - abar)
        if variant.dynamic_rescale is not None:
            out["scale_arr"] = dynamic_scales(variant.dynamic_rescale, variant.timesteps)
    return {k: v.float() for k, v in out.items()}


def dynamic_scales(base: float, timesteps: int, turning_step: int = 400) -> torch.Tensor:
    """``scale_arr``: 1 → ``base`` over the first ``turning_step`` entries, then ``base`` (length 1400)."""
    return torch.cat([torch.linspace(1.0, base, turning_step, dtype=torch.float64),
                      torch.full((timesteps,), base, dtype=torch.float64)])


def ddim_timesteps(spacing: str, steps: int, timesteps: int = 1000) -> torch.Tensor:
    """The training timesteps DDIM visits, ascending (``uniform``: 1, 1+c, ...;
    ``uniform_trailing``: ..., 999)."""
    if spacing == "uniform":
        stride = timesteps // steps
        if stride < 1:
            raise ValueError(f"uniform spacing needs steps <= {timesteps}, got {steps}")
        return torch.arange(0, timesteps, stride, dtype=torch.long) + 1
    if spacing == "uniform_trailing":
        points = torch.arange(timesteps, 0, -timesteps / steps, dtype=torch.float64)
        return torch.round(points).flip(0).long() - 1
    raise ValueError(f"unknown DDIM spacing {spacing!r}; allowed: 'uniform', 'uniform_trailing'")
