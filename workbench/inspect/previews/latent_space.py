"""Latents and the video they decode to: what every latent preview needs to know about a backbone.

How many pixels and frames one latent pixel covers (:func:`latent_layout`, :func:`time_layout`,
with the causal first frame of a causal video VAE), whether the backbone samples in pixel space
(:func:`is_pixel_space`), its decoder run chunked along time (:func:`decode_chunked`), real
frames encoded (:func:`encode_samples`) or data-free latent clips (:func:`data_free_latents`) to
fit a preview on, and the latent shape of the card's resolution (:func:`latent_shape_from_card`).

A backbone whose VAE is causal in time (``T = 1 + r (T' - 1)``) says so with
``causal_latents = True`` (:class:`~workbench.core.capabilities.LatentLayout`); otherwise the
layout is read off the decoded length, which cannot tell the two apart when both fit (3 latent
frames decoding to 9 frames). ``decode_chunked``
decodes ``chunk_frames`` latent frames per call, exact for per-frame decoders such as
tiny_video's; a backbone with ``causal_latents = True`` is always decoded whole, since a causal
video VAE carries state from frame to frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from workbench.core.backbone import BaseVideoModel, causal_latents, pixel_space
from workbench.core.conditions import Batch
from workbench.inspect.common import InspectError

DEFAULT_CHUNK_FRAMES = 8


def is_pixel_space(base: BaseVideoModel, channels: int | None = None) -> bool:
    """True when the backbone samples in pixel space (its "latents" are the video)."""
    declared = pixel_space(base)
    if declared is not None:
        return bool(declared)
    card = getattr(base, "card", None)
    has_vae = card is not None and any(c.kind == "vae" for c in card.components.values())
    return not has_vae and channels == 3


def decode_chunked(base: BaseVideoModel, latents: torch.Tensor,
                   chunk_frames: int | None = DEFAULT_CHUNK_FRAMES,
                   ) -> torch.Tensor:
    """``base.decode`` in chunks of ``chunk_frames`` latent frames (``None``: all at once), under no_grad.

    Bounds the decoder's memory by the chunk; exact for per-frame decoders. A backbone that
    declares ``causal_latents = True`` is decoded whole whatever ``chunk_frames`` says: its VAE
    carries state from frame to frame and decodes the first latent frame of every call to a
    single frame, so pieces would restart it (wrong frames, and too few of them).
    """
    if chunk_frames is not None and (isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int)
                                     or chunk_frames < 1):
        raise InspectError(f"chunk_frames must be a positive int or None, got {chunk_frames!r}.")
    t = latents.shape[2]
    step = t if chunk_frames is None or causal_latents(base) else chunk_frames
    with torch.no_grad():
        parts = [base.decode(latents[:, :, s:s + step]) for s in range(0, t, step)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def latent_layout(z_shape: torch.Size, x_shape: torch.Size,
                  causal: bool | None = None) -> tuple[int, int, bool]:
    """``(d, r, causal)`` relating latents ``(N, C, T', h, w)`` to decoded video ``(N, 3, T, H, W)``
    (``causal``: see :func:`time_layout`)."""
    _, _, lt, lh, lw = z_shape
    _, xc, xt, xh, xw = x_shape
    if xc != 3:
        raise InspectError(
            f"base.decode returned {xc} channels (shape {tuple(x_shape)}); a preview fits RGB video "
            f"(B, 3, T, H, W). Give the backbone a decoder to RGB, "
            f"or declare Previews with pixel_space = True if its samples are frames."
        )
    if xh % lh or xw % lw or xh // lh != xw // lw:
        raise InspectError(
            f"The linear preview needs one integer spatial downsample: "
            f"latents {lh}x{lw} decode to {xh}x{xw}. "
            f"Use decode='full' for this backbone."
        )
    return (xh // lh, *time_layout(lt, xt, causal))


def time_layout(latent_frames: int, frames: int, causal: bool | None = None) -> tuple[int, bool]:
    """``(r, causal)``: ``frames`` video frames over ``latent_frames``, ``r`` per latent frame, or
    (causal VAE) frame 0 alone and then ``r`` per later latent frame.

    ``causal``: what the backbone declares (``causal_latents``); ``None`` infers it, preferring
    ``r`` frames per latent frame when both readings fit (3 latent frames → 9 frames).
    """
    if frames % latent_frames == 0 and not causal:
        return frames // latent_frames, False
    if latent_frames > 1 and (frames - 1) % (latent_frames - 1) == 0:
        return (frames - 1) // (latent_frames - 1), True
    raise InspectError(
        f"{latent_frames} latent frames decode to {frames} frames, which is neither r per latent frame "
        f"nor 1 + r per later frame (a causal VAE); the linear preview cannot lay that out. "
        f"Use decode='full'."
    )


def data_free_latents(channels: int, frames: int, height: int, width: int, count: int, seed: int = 0,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``count`` standard-normal latent clips ``(N, C, T', h, w)``: even ones white, odd ones smooth.

    The smooth ones are white noise on a grid 4x coarser, upsampled bilinearly and rescaled to
    unit variance per channel, so the fit sees both the frequencies of ``x_t`` and of clean latents.
    """
    g = torch.Generator().manual_seed(seed)
    white = torch.randn(count, channels, frames, height, width, generator=g)
    coarse = torch.randn(count * frames, channels, max(1, height // 4), max(1, width // 4), generator=g)
    smooth = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    smooth = smooth.view(count, frames, channels, height, width).permute(0, 2, 1, 3, 4)
    axes = (2, 3, 4)
    smooth = ((smooth - smooth.mean(dim=axes, keepdim=True))
              / smooth.std(dim=axes, keepdim=True).clamp_min(1e-6))
    odd = (torch.arange(count) % 2 == 1).view(-1, 1, 1, 1, 1)
    return torch.where(odd, smooth, white).to(device=device, dtype=dtype)


def latent_shape_from_card(base: BaseVideoModel) -> tuple[int, ...]:
    s = base.card.sampling
    if not (s.height and s.width):
        raise InspectError(
            f"fit_preview({type(base).__name__}) without samples needs latent_shape=(C, T, h, w): the card "
            f"gives no resolution to derive it from."
        )
    video = torch.zeros(1, 3, min(s.num_frames or 1, 5), s.height, s.width, device=base.device,
                        dtype=base.dtype)
    with torch.no_grad():
        return tuple(base.encode(video).shape[1:])


def encode_samples(base: BaseVideoModel, samples: Any) -> torch.Tensor:
    if isinstance(samples, (Mapping, Batch)):
        return base.prepare_batch(samples).latents
    video = torch.as_tensor(samples)
    if video.dtype == torch.uint8 and video.ndim == 5 and video.shape[-1] == 3:
        video = video.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    if video.ndim != 5 or video.shape[1] != 3:
        raise InspectError(
            f"fit_preview samples must be video (N, 3, T, H, W) in [-1, 1], uint8 (N, T, H, W, 3), "
            f"or a raw batch for prepare_batch; got shape {tuple(video.shape)} {video.dtype}."
        )
    with torch.no_grad():
        return base.encode(video.to(device=base.device, dtype=base.dtype))
