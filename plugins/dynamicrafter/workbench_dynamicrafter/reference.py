"""Tiny configurations and seeded random weights in the official key layout (parity checks, ``path: tiny``).

:data:`PARITY_SIZES` changes the size knobs away from the release (a different width for every
tower, two U-Net levels, three frames, ...) except what the release hard-codes: the vision
tower's 224-pixel input, 8 heads in ``init_attn``, 77 text tokens and 16 image tokens per frame.
:func:`random_state` fills a key → shape layout with values that depend only on the seed and
each key's name, so the same weights can be made on another machine, in another process, or
inside the upstream code. Output layers the release initialises at zero get random values too,
so a parity check never compares zeros.

This module imports only torch: the script that runs the upstream code imports it from the file.
"""

from __future__ import annotations

import zlib

import torch

PARITY_SIZES = dict(
    model_channels=32, channel_mult=(1, 2), num_res_blocks=1, attention_resolutions=(1, 2), head_channels=16,
    context_dim=48, init_attn_heads=8, frames=3,
    text_width=48, text_layers=3, text_heads=2, text_vocab=1000,
    vision_width=64, vision_layers=2, vision_heads=4, vision_image_size=224, vision_patch=14,
    clip_embed_dim=24,
    resampler_dim=40, resampler_depth=2, resampler_heads=3, resampler_head_dim=8, resampler_ff_mult=2,
    vae_channels=(32, 64), vae_res_blocks=1,
)

SCHEDULE = {"betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod",
            "sqrt_one_minus_alphas_cumprod", "log_one_minus_alphas_cumprod", "sqrt_recip_alphas_cumprod",
            "sqrt_recipm1_alphas_cumprod", "posterior_variance", "posterior_log_variance_clipped",
            "posterior_mean_coef1", "posterior_mean_coef2", "scale_arr"}


def random_tensor(key: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A seeded random value for ``key``: norm-like 1-D weights near 1, matrices ~ 0.6 / sqrt(fan_in),
    everything else ~ 0.1 (biases, embeddings, scalars)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % 2**63)
    noise = torch.randn(tuple(shape), generator=g, dtype=torch.float32)
    if len(shape) == 1 and key.endswith(".weight"):
        return 1.0 + 0.1 * noise
    if len(shape) >= 2 and not key.endswith(("positional_embedding", "latents", "token_embedding.weight")):
        fan_in = 1
        for d in shape[1:]:
            fan_in *= d
        return noise * (0.6 / fan_in**0.5)
    return 0.1 * noise


def random_state(layout: dict[str, tuple[int, ...]], seed: int,
                 skip: set[str] = SCHEDULE) -> dict[str, torch.Tensor]:
    """Seeded random values for every key of ``layout`` (upstream names → shapes) except ``skip``."""
    return {key: random_tensor(key, tuple(shape), seed) for key, shape in layout.items() if key not in skip}
