"""Video quality metrics: PSNR, SSIM, and PSNR restricted to the pixels that move.

Conventions
-----------
A video reaches these functions in one of two layouts, told apart by its dtype:

* **integer** (normally ``uint8``) numpy arrays or torch tensors are *channel-last* pixel
  values in ``0..255``: a clip ``[T, H, W, 3]``, a batch ``[B, T, H, W, 3]`` (any number of
  leading axes is accepted; the metrics also take single frames ``[H, W, 3]``);
* **floating** arrays or tensors are *channel-first* model outputs in ``[-1, 1]``: a clip
  ``[3, T, H, W]`` or a batch ``[B, 3, T, H, W]`` (the channel axis is always the 4th from the
  end).

Before measuring, both inputs are brought to the same scale and layout: channel-last
``[..., T, H, W, 3]`` in uint8 units (``0..255``). Floating inputs are mapped with
``(x + 1) * 127.5`` and clipped to ``0..255`` but **not rounded**; call :func:`to_uint8_video`
first to measure exactly what a saved video would show. Masks and the result of
:func:`moving_mask` are therefore laid out channel-last, ``[..., T, H, W]``, whatever the
layout of the inputs.

``pred`` and ``target`` may use different layouts (e.g. a float prediction against a uint8
ground truth); after conversion their shapes must be equal, otherwise
:class:`~workbench.errors.DataError` is raised naming both shapes.

Metrics over a batch pool every element (PSNR of the mean squared error over the whole
batch, SSIM averaged over every window of every frame); use :func:`per_clip` for one value
per clip.

The world-model study's action error (where a probe finds the arm in a predicted video) builds on
these conventions in :mod:`workbench.worldmodel.probe`.

This module imports only numpy and torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from workbench.errors import DataError, did_you_mean, listing

__all__ = [
    "DEFAULT_MOVING_THRESHOLD",
    "moving_mask",
    "moving_psnr",
    "per_clip",
    "psnr",
    "ssim",
    "to_uint8_video",
]

DEFAULT_MOVING_THRESHOLD = 10.0
"""Default :func:`moving_mask` threshold, in uint8 units (max over channels of ``|diff|``)."""

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03

# Work in chunks of frames so float64 copies stay small (and, for SSIM, in cache: ~5 maps
# of this many pixels, twice). Measured: 64k pixels per SSIM chunk is ~10x faster than 2M.
_CHUNK_ELEMENTS = 1 << 20
_SSIM_CHUNK_PIXELS = 1 << 16

_LAYOUT_HELP = (
    "Videos are uint8 channel-last [T, H, W, 3] / [B, T, H, W, 3] in 0..255, or float "
    "channel-first [3, T, H, W] / [B, 3, T, H, W] in [-1, 1]."
)


# --------------------------------------------------------------------------- conversion


def _to_numpy(x: Any, name: str) -> np.ndarray:
    """``x`` (numpy array, torch tensor, or nested list) as a numpy array, on the CPU."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy()
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"{name}: expected a numpy array or torch tensor, got {type(x).__name__} ({exc}). {_LAYOUT_HELP}"
        ) from exc


def _check_dtype(a: np.ndarray, name: str) -> None:
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise DataError(
            f"{name}: unsupported dtype {a.dtype} (shape {tuple(a.shape)}). Allowed: an integer dtype "
            f"(uint8 pixel values, channel-last) or a floating dtype (values in [-1, 1], channel-first). "
            f"{_LAYOUT_HELP}"
        )


def _float_channel_first_error(a: np.ndarray, name: str) -> DataError:
    hint = ""
    if a.ndim >= 3 and a.shape[-1] == 3:
        hint = (
            " It looks channel-last: float videos must be channel-first in [-1, 1]; for "
            "channel-last 0..255 values convert them to uint8 first (x.round().clip(0, 255)"
            ".astype(np.uint8))."
        )
    return DataError(
        f"{name}: a float video must be channel-first [3, T, H, W] or [B, 3, T, H, W] (3 on the "
        f"4th axis from the end), got shape {tuple(a.shape)} with dtype {a.dtype}.{hint} {_LAYOUT_HELP}"
    )


def _check_uint8_layout(a: np.ndarray, name: str, min_ndim: int) -> None:
    if a.ndim < min_ndim or a.shape[-1] != 3:
        want = "[T, H, W, 3] or [B, T, H, W, 3]"
        if min_ndim == 3:
            want = "[H, W, 3], " + want
        raise DataError(
            f"{name}: an integer (uint8) video must be channel-last {want}, got shape {tuple(a.shape)} "
            f"with dtype {a.dtype}. {_LAYOUT_HELP}"
        )


def _check_int_range(a: np.ndarray, name: str) -> None:
    if a.dtype == np.uint8 or a.size == 0:
        return
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi > 255:
        raise DataError(
            f"{name}: integer pixel values must lie in 0..255, got values from {lo} to {hi} (dtype "
            f"{a.dtype}). Clip them (x.clip(0, 255)) or pass float values in [-1, 1] channel-first."
        )


def unit_to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Finite floats in ``[-1, 1]`` → uint8 in any layout, on their device: ``(x + 1) * 127.5`` in float64,
    rounded and clipped (what :func:`to_uint8_video` computes; ``x`` is never changed in place)."""
    return (x.double() + 1.0).mul_(127.5).round_().clamp_(0, 255).to(torch.uint8)


def to_uint8_video(x: Any) -> np.ndarray:
    """Convert a video to uint8 channel-last ``[..., T, H, W, 3]``.

    Floating input is channel-first ``[..., 3, T, H, W]`` in ``[-1, 1]``: it is mapped with
    ``(x + 1) * 127.5``, rounded to the nearest integer and clipped to ``0..255``. Integer input
    is already channel-last ``[..., T, H, W, 3]`` and is returned as uint8 (values must lie in
    ``0..255``). numpy arrays and torch tensors (any device) are accepted; the result is numpy.
    """
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.ndim >= 4 and x.shape[-4] == 3:
        x = x.detach()
        if bool(torch.isfinite(x).all()):  # (else the numpy path below says what is wrong)
            # the same float64 arithmetic as below, in torch on the tensor's device: one pass each, and
            # only the uint8 frames are moved to channel-last and to the CPU
            return unit_to_uint8(x).movedim(-4, -1).contiguous().cpu().numpy()
    a = _to_numpy(x, "to_uint8_video")
    _check_dtype(a, "to_uint8_video")
    if np.issubdtype(a.dtype, np.integer):
        _check_uint8_layout(a, "to_uint8_video", 4)
        _check_int_range(a, "to_uint8_video")
        return np.ascontiguousarray(a, dtype=np.uint8)
    if a.ndim < 4 or a.shape[-4] != 3:
        raise _float_channel_first_error(a, "to_uint8_video")
    finite = np.isfinite(a)
    if not finite.all():
        raise DataError(
            f"to_uint8_video: the float video (shape {tuple(a.shape)}) contains {int((~finite).sum())} "
            "NaN or infinite values, which have no pixel value. Fix the model output (or replace them, "
            "e.g. torch.nan_to_num(x)) before converting."
        )
    a = np.moveaxis(a, -4, -1)
    out = np.rint((a.astype(np.float64) + 1.0) * 127.5)
    return np.ascontiguousarray(np.clip(out, 0, 255).astype(np.uint8))


def _channel_last(x: Any, name: str, min_ndim: int = 3) -> np.ndarray:
    """``x`` validated and laid out channel-last ``[..., H, W, 3]``, still in its own dtype.

    A view where possible (uint8 input is not copied); :func:`_scale` maps it to 0..255.
    """
    a = _to_numpy(x, name)
    _check_dtype(a, name)
    if np.issubdtype(a.dtype, np.integer):
        _check_uint8_layout(a, name, min_ndim)
        return a
    if a.ndim < 4 or a.shape[-4] != 3:
        raise _float_channel_first_error(a, name)
    return np.moveaxis(a, -4, -1)


def _scale(a: np.ndarray) -> np.ndarray:
    """Channel-last values as float64 on the 0..255 scale (float input mapped, clipped, unrounded)."""
    if np.issubdtype(a.dtype, np.integer):
        return a.astype(np.float64)
    return np.clip((a.astype(np.float64) + 1.0) * 127.5, 0.0, 255.0)


def _as_frames(a: np.ndarray) -> np.ndarray:
    """Channel-last ``[..., H, W, 3]`` as ``[N, H, W, 3]`` (a view for contiguous uint8 input)."""
    return a.reshape((-1, *a.shape[-3:]))


def _shape_of(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def _pair(pred: Any, target: Any, who: str) -> tuple[np.ndarray, np.ndarray]:
    p = _channel_last(pred, f"{who}: pred")
    t = _channel_last(target, f"{who}: target")
    if p.shape != t.shape:
        raw_p, raw_t = _shape_of(pred), _shape_of(target)
        converted = ""
        if (raw_p, raw_t) != (p.shape, t.shape):
            converted = f" (channel-last {p.shape} vs {t.shape} after conversion)"
        raise DataError(
            f"{who}: pred has shape {raw_p} but target has shape {raw_t}{converted}; they must hold the "
            f"same frames at the same size. Crop, resize or slice one to match the other. {_LAYOUT_HELP}"
        )
    return p, t


def _check_positive(value: Any, what: str, who: str, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise DataError(
            f"{who}: {what} must be a finite number {bound}, got {value!r}. "
            + ("Use 255 for uint8-scale pixels (the default)." if what == "data_range" else "")
        )
    return v


def _broadcast_mask(mask: Any, shape: tuple[int, ...], who: str) -> np.ndarray:
    m = _to_numpy(mask, f"{who}: mask")
    if m.dtype != np.bool_:
        raise DataError(
            f"{who}: mask must be boolean, got dtype {m.dtype} (shape {tuple(m.shape)}). Threshold it "
            "first, e.g. mask > 0.5 (torch) or mask.astype(bool) (numpy)."
        )
    pixel_shape = shape[:-1]
    try:
        if m.ndim == len(shape):  # per element, channel axis included
            return np.broadcast_to(m, shape)
        return np.broadcast_to(m[..., None], shape)  # per pixel, shared by the 3 channels
    except ValueError:
        raise DataError(
            f"{who}: mask of shape {tuple(m.shape)} does not broadcast to the videos' pixels "
            f"{pixel_shape} (channel-last [..., T, H, W]) or elements {shape}. Pass a boolean mask shaped "
            "[..., T, H, W] (per pixel) or [..., T, H, W, 3] (per channel), in the channel-last layout "
            "even when the videos are float channel-first."
        ) from None


# --------------------------------------------------------------------------- PSNR


def _psnr(pred: Any, target: Any, data_range: float, mask: Any, who: str) -> float:
    data_range = _check_positive(data_range, "data_range", who)
    p, t = _pair(pred, target, who)
    m = None if mask is None else _as_frames(_broadcast_mask(mask, p.shape, who))
    p, t = _as_frames(p), _as_frames(t)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, int(np.prod(p.shape[1:]))))
    total = 0.0
    count = 0
    for start in range(0, p.shape[0], chunk):
        sq = np.square(_scale(p[start : start + chunk]) - _scale(t[start : start + chunk]))
        if m is None:
            total += float(sq.sum())
            count += sq.size
        else:
            keep = m[start : start + chunk]
            total += float(sq[keep].sum())
            count += int(np.count_nonzero(keep))
    if count == 0:
        return float("nan")
    mse = total / count
    if mse == 0.0:
        return float("inf")
    return float(10.0 * math.log10(data_range**2 / mse))


def psnr(pred: Any, target: Any, data_range: float = 255.0, mask: Any = None) -> float:
    """Peak signal-to-noise ratio in dB, ``10 * log10(data_range**2 / MSE)``.

    The MSE pools every element of the call (all clips, frames, pixels and channels) on the
    0..255 scale described in the module docstring. ``mask`` (boolean, numpy or torch) keeps
    only the pixels where it is True: shaped like the channel-last pixels ``[..., T, H, W]``
    (shared by the 3 channels) or like the elements ``[..., T, H, W, 3]``; leading axes
    broadcast. Returns ``inf`` when the (masked) inputs are identical and ``nan`` when the mask
    selects nothing (or the videos are empty).
    """
    return _psnr(pred, target, data_range, mask, "psnr")


# --------------------------------------------------------------------------- SSIM


def _gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(coords**2) / (2.0 * sigma**2))
    return g / g.sum()


def _channel_images(frames: np.ndarray) -> torch.Tensor:
    h, w = frames.shape[1:3]
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(_scale(frames), -1, 1)).reshape(-1, h, w))


def ssim(pred: Any, target: Any, data_range: float = 255.0) -> float:
    """Structural similarity (Wang et al. 2004), averaged over frames, channels and windows.

    Each frame's channels are compared separately with an 11-tap Gaussian window
    (sigma 1.5; the 2-D window is the outer product of the 1-D one), ``K1 = 0.01``,
    ``K2 = 0.03``, ``C1 = (K1 * data_range)**2``, ``C2 = (K2 * data_range)**2``, over the
    ``(H - 10) x (W - 10)`` windows that fit inside the frame (no padding). The result is the
    mean SSIM over every window of every channel of every frame (and clip) of the call: 1.0 for
    identical inputs. Frames must be at least 11 x 11 pixels. Inputs follow the module
    conventions (uint8 channel-last or float [-1, 1] channel-first, brought to 0..255).
    """
    data_range = _check_positive(data_range, "data_range", "ssim")
    p, t = _pair(pred, target, "ssim")
    h, w = p.shape[-3], p.shape[-2]
    if h < SSIM_WINDOW or w < SSIM_WINDOW:
        raise DataError(
            f"ssim: frames must be at least {SSIM_WINDOW}x{SSIM_WINDOW} pixels for the {SSIM_WINDOW}-tap "
            f"Gaussian window, got {h}x{w} (video shape {p.shape}, channel-last). Upscale the frames "
            "(workbench.media.upscale) or use psnr."
        )
    p, t = _as_frames(p), _as_frames(t)
    n = p.shape[0]
    if n == 0:
        return float("nan")
    g = _gaussian_window()
    g_rows = g.view(1, 1, SSIM_WINDOW, 1).expand(5, 1, SSIM_WINDOW, 1)
    g_cols = g.view(1, 1, 1, SSIM_WINDOW).expand(5, 1, 1, SSIM_WINDOW)
    c1 = (SSIM_K1 * data_range) ** 2
    c2 = (SSIM_K2 * data_range) ** 2
    chunk = max(1, _SSIM_CHUNK_PIXELS // (h * w * 3))  # frames per chunk
    total = 0.0
    count = 0
    with torch.no_grad():
        for start in range(0, n, chunk):
            # [n, H, W, 3] -> [n * 3, H, W]: one image per channel of each frame.
            x = _channel_images(p[start : start + chunk])
            y = _channel_images(t[start : start + chunk])
            stack = torch.stack([x, y, x * x, y * y, x * y], dim=1)  # [n, 5, H, W]
            f = F.conv2d(F.conv2d(stack, g_rows, groups=5), g_cols, groups=5)
            mu_x, mu_y, e_xx, e_yy, e_xy = f.unbind(dim=1)
            var_x = e_xx - mu_x * mu_x
            var_y = e_yy - mu_y * mu_y
            cov = e_xy - mu_x * mu_y
            num = (2.0 * mu_x * mu_y + c1) * (2.0 * cov + c2)
            den = (mu_x * mu_x + mu_y * mu_y + c1) * (var_x + var_y + c2)
            s = num / den
            total += float(s.sum())
            count += s.numel()
    return total / count


# --------------------------------------------------------------------------- moving pixels


def _as_reference_frame(frame: Any, name: str) -> np.ndarray:
    """A reference frame as float64 channel-last ``[..., H, W, 3]`` on the 0..255 scale."""
    a = _to_numpy(frame, name)
    _check_dtype(a, name)
    if np.issubdtype(a.dtype, np.integer):
        if a.ndim < 3 or a.shape[-1] != 3:
            raise DataError(
                f"{name}: an integer (uint8) frame must be channel-last [H, W, 3] or [B, H, W, 3], got "
                f"shape {tuple(a.shape)}. A float frame is channel-first [3, H, W] / [B, 3, H, W] in [-1, 1]."
            )
        return a.astype(np.float64)
    if a.ndim < 3 or a.shape[-3] != 3:
        raise DataError(
            f"{name}: a float frame must be channel-first [3, H, W] or [B, 3, H, W] in [-1, 1], got shape "
            f"{tuple(a.shape)}. A uint8 frame is channel-last [H, W, 3] / [B, H, W, 3]."
        )
    a = np.moveaxis(a, -3, -1).astype(np.float64)
    return np.clip((a + 1.0) * 127.5, 0.0, 255.0)


def moving_mask(target: Any, first_frame: Any = None,
                threshold: float = DEFAULT_MOVING_THRESHOLD) -> np.ndarray:
    """Boolean mask ``[..., T, H, W]`` of the pixels where ``target`` moves.

    A pixel of frame ``t`` is moving when it differs from the reference frame by more than
    ``threshold``, measured as the max over the 3 channels of ``|diff|`` in uint8 units. The
    reference is ``first_frame`` when given (uint8 ``[H, W, 3]`` / ``[B, H, W, 3]`` or float
    ``[3, H, W]`` / ``[B, 3, H, W]`` in [-1, 1]), else the target's own frame 0. Frame 0 is
    always excluded (all False): it is the conditioning frame, not a prediction.
    """
    threshold = _check_positive(threshold, "threshold", "moving_mask", allow_zero=True)
    t = _channel_last(target, "moving_mask: target", min_ndim=4)
    frame_shape = t.shape[:-4] + t.shape[-3:]
    if first_frame is None:
        ref = _scale(t[..., 0, :, :, :])
    else:
        ref = _as_reference_frame(first_frame, "moving_mask: first_frame")
        try:
            fits = np.broadcast_shapes(ref.shape, frame_shape) == frame_shape
        except ValueError:
            fits = False
        if not fits:
            raise DataError(
                f"moving_mask: first_frame of shape {_shape_of(first_frame)} does not match target of "
                f"shape {_shape_of(target)}: the frame must have the target's H, W (and batch size, if "
                f"batched). Channel-last, the frame is {ref.shape} and the target's frames {frame_shape}."
            )
    mask = np.zeros(t.shape[:-1], dtype=bool)  # frame 0 stays False
    for i in range(1, t.shape[-4]):
        mask[..., i, :, :] = np.abs(_scale(t[..., i, :, :, :]) - ref).max(axis=-1) > threshold
    return mask


def moving_psnr(
    pred: Any,
    target: Any,
    threshold: float = DEFAULT_MOVING_THRESHOLD,
    data_range: float = 255.0,
    first_frame: Any = None,
) -> float:
    """PSNR over the moving pixels of ``target`` (see :func:`moving_mask`) only.

    Returns ``nan`` when nothing moves (e.g. a static clip, or a single frame).
    """
    mask = moving_mask(target, first_frame=first_frame, threshold=threshold)
    return _psnr(pred, target, data_range, mask, "moving_psnr")


# --------------------------------------------------------------------------- per clip

_METRICS: dict[str, Callable[..., float]] = {"psnr": psnr, "ssim": ssim, "moving_psnr": moving_psnr}
_PER_CLIP_KEYWORDS = ("mask", "first_frame")


def per_clip(metric: Callable[..., float] | str, preds: Any, targets: Any, **kw: Any) -> np.ndarray:
    """One value of ``metric(pred, target, **kw)`` per clip of a batch, as float64 ``[B]``.

    ``metric`` is a callable (e.g. :func:`psnr`, :func:`ssim`, :func:`moving_psnr`, or your
    own) or one of their names. ``preds`` and ``targets`` are batches with 5 axes, clip first
    (``[B, T, H, W, 3]`` uint8 or ``[B, 3, T, H, W]`` float); ``metric`` receives
    ``preds[i], targets[i]`` with their original type. The keywords ``mask`` and
    ``first_frame``, when given, must be per clip too (leading axis ``B``) and are split the
    same way; every other keyword is passed unchanged.
    """
    if isinstance(metric, str):
        if metric not in _METRICS:
            raise DataError(
                f"per_clip: unknown metric {metric!r}; allowed names: {listing(_METRICS)}."
                f"{did_you_mean(metric, _METRICS)} Or pass a callable metric(pred, target, **kw)."
            )
        metric = _METRICS[metric]
    if not callable(metric):
        raise DataError(
            f"per_clip: metric must be callable or one of {listing(_METRICS)}, got {type(metric).__name__}."
        )
    if not isinstance(preds, (np.ndarray, torch.Tensor)):
        preds = _to_numpy(preds, "per_clip: preds")
    if not isinstance(targets, (np.ndarray, torch.Tensor)):
        targets = _to_numpy(targets, "per_clip: targets")
    ps, ts = _shape_of(preds), _shape_of(targets)
    if len(ps) != 5 or len(ts) != 5:
        raise DataError(
            f"per_clip: preds and targets must be batches with 5 axes, clip first ([B, T, H, W, 3] uint8 or "
            f"[B, 3, T, H, W] float), got preds {ps} and targets {ts}. For a single clip call the metric "
            "directly, or add a batch axis (x[None])."
        )
    if ps[0] != ts[0]:
        raise DataError(
            f"per_clip: preds has shape {ps} ({ps[0]} clips) but targets has shape {ts} ({ts[0]} clips); "
            "the batch sizes must match."
        )
    b = ps[0]
    split: dict[str, Any] = {}
    for key in _PER_CLIP_KEYWORDS:
        value = kw.get(key)
        if value is None:
            continue
        vs = _shape_of(value)
        if not vs or vs[0] != b:
            raise DataError(
                f"per_clip: {key} must be given per clip with leading axis B={b}, got shape {vs}. Stack one "
                f"{key} per clip, or broadcast a shared one (e.g. np.broadcast_to(m, ({b}, *m.shape)))."
            )
        split[key] = value
    rest = {k: v for k, v in kw.items() if k not in split}
    out = np.empty(b, dtype=np.float64)
    for i in range(b):
        extra = {k: v[i] for k, v in split.items()}
        out[i] = float(metric(preds[i], targets[i], **rest, **extra))
    return out
