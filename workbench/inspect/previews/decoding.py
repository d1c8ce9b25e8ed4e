"""Latents to pictures: the one path every view, export and widget decodes through.

``decode="preview"`` uses the backbone's linear preview (fitted on first use, see
:mod:`workbench.inspect.previews.linear_preview`), ``"tiny"`` its distilled tiny preview (shipped for the
embedded model, cached per backbone, distilled on first use otherwise; see
:mod:`workbench.inspect.previews.tiny_preview`), ``"full"`` its decoder chunked along time. The work runs on
the base's device; only the frames leave it.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from workbench.core.backbone import BaseVideoModel, causal_latents
from workbench.inspect.common import InspectError, check_choice
from workbench.inspect.previews.latent_space import DEFAULT_CHUNK_FRAMES, decode_chunked
from workbench.inspect.previews.linear_preview import LatentPreview, preview_for
from workbench.inspect.previews.preview import DECODES
from workbench.metrics import to_uint8_video

DECODE_HINT = ("Use 'preview' (fast, linear), 'tiny' (a small distilled decoder, close to the full one) "
               "or 'full' (the backbone's decoder).")


def decode_video(base: BaseVideoModel, latents: torch.Tensor, decode: str = "preview", index: int = 0,
                 chunk_frames: int | None = DEFAULT_CHUNK_FRAMES,
                 preview: LatentPreview | None = None) -> torch.Tensor:
    """Latents ``(B, C, T', h, w)`` → video ``(3, T, H, W)`` in [-1, 1] of batch element ``index``
    (base device)."""
    check_choice(decode, DECODES, "decode", DECODE_HINT)
    if latents.ndim != 5:
        raise InspectError(f"render expects latents (B, C, T, h, w), got shape {tuple(latents.shape)}.")
    b = latents.shape[0]
    if isinstance(index, bool) or not isinstance(index, int) or not -b <= index < b:
        raise InspectError(f"index={index!r} is not a batch element; this batch has {b} (0..{b - 1}).")
    index %= b
    z = latents[index:index + 1].to(device=base.device, dtype=base.dtype, non_blocking=True)
    if decode == "full":
        return decode_chunked(base, z, chunk_frames)[0]
    if decode == "tiny":
        from workbench.inspect.previews.tiny_preview import tiny_preview_for

        return tiny_preview_for(base, tuple(z.shape[1:]))(z)[0]
    return (preview or preview_for(base, tuple(z.shape[1:])))(z)[0]


def render(base: BaseVideoModel, latents: torch.Tensor, *, decode: str = "preview", index: int = 0,
           chunk_frames: int | None = DEFAULT_CHUNK_FRAMES,
           preview: LatentPreview | None = None) -> np.ndarray:
    """Latents ``(B, C, T', h, w)`` → uint8 frames ``[T, H, W, 3]`` of batch element ``index``.

    Examples:
        >>> frames = render(model.base, traj.final)                   # the linear preview
        >>> frames = render(model.base, traj.final, decode="full")    # the backbone's own decoder
        >>> frames.shape, frames.dtype
        ((16, 64, 64, 3), dtype('uint8'))
    """
    # the linear preview straight to pixels (what a live view draws)
    if decode == "preview" and latents.ndim == 5:
        b = latents.shape[0]
        if not isinstance(index, bool) and isinstance(index, int) and -b <= index < b:
            index %= b
            z = latents[index:index + 1].to(device=base.device, dtype=base.dtype, non_blocking=True)
            frames = (preview or preview_for(base, tuple(z.shape[1:]))).uint8_frames(z)
            if frames is not None:
                return frames[0].cpu().numpy()
    return to_uint8_video(decode_video(base, latents, decode, index, chunk_frames, preview).float())


def render_float(base: BaseVideoModel, latents: torch.Tensor, decode: str = "preview",
                 index: int = 0) -> np.ndarray:
    """Latents ``(B, C, T', h, w)`` → float frames ``[T, H, W, 3]`` in [-1, 1] of batch element ``index``.

    What signed views subtract before colouring; :func:`as_uint8` turns it into a picture.
    """
    return decode_video(base, latents, decode, index).float().clamp(-1, 1).permute(1, 2, 3, 0).cpu().numpy()


_FRAMES_PER_LATENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # base -> {decode: r}


def render_float_frame(base: BaseVideoModel, latents: torch.Tensor, frame: int, decode: str = "preview",
                       index: int = 0) -> tuple[np.ndarray, int] | None:
    """Only frame ``frame``: ``(float [1, H, W, 3] in [-1, 1], frames in the whole video)``, decoding the one
    latent frame that covers it; ``None`` where a frame cannot be decoded alone (a causal video VAE, whose
    frames depend on the ones before, or a preview laid out that way: decode the whole clip instead).

    What a slider needs: moving to a step decodes one frame per branch, not the whole clip.
    """
    if causal_latents(base):
        return None
    t = latents.shape[2]
    known = _FRAMES_PER_LATENT.setdefault(base, {})
    if decode not in known:  # frames per latent frame, read off one decoded latent frame
        known[decode] = decode_video(base, latents[:, :, :1], decode, index).shape[1]
    r = known[decode]
    if not 0 <= frame < t * r:
        return None
    one = decode_video(base, latents[:, :, frame // r:frame // r + 1], decode, index)  # (3, r, H, W)
    if one.shape[1] != r:
        return None
    picture = one[:, frame % r:frame % r + 1].float().clamp(-1, 1).permute(1, 2, 3, 0).cpu().numpy()
    return picture, t * r


def as_uint8(frames: np.ndarray) -> np.ndarray:
    """Float frames ``[T, H, W, 3]`` in [-1, 1] (from :func:`render_float`) → uint8 ``[T, H, W, 3]``."""
    return to_uint8_video(np.moveaxis(frames, -1, 0))


__all__ = ["as_uint8", "decode_video", "render", "render_float", "render_float_frame"]
