"""Tests for workbench.metrics (PSNR, SSIM, moving-pixel PSNR) and workbench.media (video I/O, grids)."""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench import media, metrics
from workbench.errors import DataError, WorkbenchError

REPO_ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- fixtures


def moving_square(t: int = 6, h: int = 64, w: int = 64) -> np.ndarray:
    """A blue background with a yellow square moving right 8 px a frame: uint8 [T, H, W, 3]."""
    video = np.zeros((t, h, w, 3), dtype=np.uint8)
    video[:] = (30, 60, 200)
    for i in range(t):
        video[i, 10:30, 5 + 8 * i : 25 + 8 * i] = (250, 200, 10)
    return video


def noisy(video: np.ndarray, sigma: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(video + rng.normal(0.0, sigma, video.shape), 0, 255).round().astype(np.uint8)


@pytest.fixture
def textured() -> np.ndarray:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.float64)
    # Smooth it a little so SSIM has structure to lose.
    base = (base + np.roll(base, 1, axis=1) + np.roll(base, 1, axis=2)) / 3.0
    return base.round().astype(np.uint8)


# --------------------------------------------------------------------------- to_uint8_video


def test_to_uint8_video_maps_range_and_moves_channels_last():
    x = torch.zeros(2, 3, 4, 5, 6)
    x[:, 0] = -1.0  # red channel -> 0
    x[:, 1] = 1.0  # green -> 255
    x[:, 2] = 0.0  # blue -> 127.5 -> 128 (nearest)
    x[0, 2, 0, 0, 0] = 3.0  # clipped to 255
    x[0, 1, 0, 0, 1] = -7.0  # clipped to 0
    u = metrics.to_uint8_video(x)
    assert isinstance(u, np.ndarray) and u.dtype == np.uint8
    assert u.shape == (2, 4, 5, 6, 3)
    assert (u[..., 0] == 0).all()
    assert u[0, 0, 0, 1, 1] == 0 and (u[1, ..., 1] == 255).all()
    assert u[0, 0, 0, 0, 2] == 255 and u[1, 0, 0, 0, 2] == 128
    # A single clip, numpy; and uint8 input passes through unchanged.
    clip = metrics.to_uint8_video(x[0].numpy())
    assert clip.shape == (4, 5, 6, 3)
    video = moving_square()
    assert np.array_equal(metrics.to_uint8_video(torch.from_numpy(video)), video)


def test_to_uint8_video_rejects_nan_and_channel_last_floats():
    x = torch.zeros(3, 2, 4, 4)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        metrics.to_uint8_video(x)
    with pytest.raises(DataError, match=r"channel-first.*\(2, 4, 4, 3\).*looks channel-last"):
        metrics.to_uint8_video(np.zeros((2, 4, 4, 3), dtype=np.float32))
    with pytest.raises(DataError, match="0..255"):
        metrics.to_uint8_video(np.full((2, 4, 4, 3), 300, dtype=np.int64))


# --------------------------------------------------------------------------- PSNR


def test_psnr_closed_form_on_constant_offset():
    target = np.full((6, 64, 64, 3), 100, dtype=np.uint8)
    assert metrics.psnr(target + 1, target) == pytest.approx(20 * math.log10(255), abs=1e-9)
    assert metrics.psnr(target + 1, target) == pytest.approx(48.1308, abs=1e-4)
    assert metrics.psnr(target + 5, target) == pytest.approx(20 * math.log10(255 / 5), abs=1e-9)
    # Integer arithmetic never wraps: a pred below the target counts the same.
    assert metrics.psnr(target - 5, target) == pytest.approx(20 * math.log10(255 / 5), abs=1e-9)
    assert metrics.psnr(target + 5, target, data_range=1.0) == pytest.approx(20 * math.log10(1 / 5))


def test_psnr_identical_is_inf_and_pools_the_batch():
    video = moving_square()
    assert metrics.psnr(video, video) == math.inf
    # Batch: MSE pooled over both clips (one exact, one off by 2) -> MSE 2.
    target = np.stack([video, video])
    pred = target.copy()
    pred[1] = np.clip(pred[1].astype(int) + 2, 0, 255).astype(np.uint8)
    assert (pred[1].astype(int) - target[1] == 2).all()
    assert metrics.psnr(pred, target) == pytest.approx(10 * math.log10(255**2 / 2.0))


def test_psnr_accepts_float_channel_first_against_uint8():
    video = moving_square().astype(np.float64)
    as_float = np.moveaxis(video / 127.5 - 1.0, -1, 0)  # [3, T, H, W] in [-1, 1]
    assert metrics.psnr(as_float, moving_square()) > 200  # equal up to float rounding
    assert metrics.psnr(torch.from_numpy(as_float), torch.from_numpy(moving_square())) > 200
    # Off by one uint8 step everywhere (as float, unrounded).
    off = np.moveaxis((video + 1.0) / 127.5 - 1.0, -1, 0)
    target = moving_square()
    keep = target < 255  # where +1 is not clipped
    assert keep.all()
    assert metrics.psnr(off, target) == pytest.approx(20 * math.log10(255), abs=1e-6)


def test_masked_psnr_ignores_unmasked_pixels():
    target = np.full((3, 16, 16, 3), 100, dtype=np.uint8)
    pred = target.copy()
    pred[:, :8] = 102  # masked region: off by 2
    pred[:, 8:] = 0  # unmasked region: off by 100
    mask = np.zeros((3, 16, 16), dtype=bool)
    mask[:, :8] = True
    expected = 20 * math.log10(255 / 2)
    assert metrics.psnr(pred, target, mask=mask) == pytest.approx(expected)
    assert metrics.psnr(pred, target) < expected - 10
    # Per-element masks, broadcast masks and torch masks agree.
    assert metrics.psnr(pred, target, mask=np.repeat(mask[..., None], 3, axis=-1)) == pytest.approx(expected)
    assert metrics.psnr(pred, target, mask=mask[0]) == pytest.approx(expected)
    assert metrics.psnr(pred, target, mask=torch.from_numpy(mask)) == pytest.approx(expected)
    # Only one channel selected.
    channel = np.zeros((3, 16, 16, 3), dtype=bool)
    channel[..., 1] = True
    pred2 = target.copy()
    pred2[..., 1] = 104
    pred2[..., 0] = 0
    assert metrics.psnr(pred2, target, mask=channel) == pytest.approx(20 * math.log10(255 / 4))


def test_masked_psnr_empty_mask_is_nan_and_bad_masks_raise():
    target = np.full((3, 16, 16, 3), 100, dtype=np.uint8)
    assert math.isnan(metrics.psnr(target, target, mask=np.zeros((3, 16, 16), dtype=bool)))
    with pytest.raises(DataError, match=r"mask must be boolean, got dtype float64"):
        metrics.psnr(target, target, mask=np.ones((3, 16, 16)))
    with pytest.raises(DataError, match=r"mask of shape \(3, 8, 16\) does not broadcast.*\(3, 16, 16\)"):
        metrics.psnr(target, target, mask=np.ones((3, 8, 16), dtype=bool))


def test_shape_mismatch_names_both_shapes():
    a = np.zeros((6, 64, 64, 3), dtype=np.uint8)
    b = np.zeros((6, 32, 64, 3), dtype=np.uint8)
    for fn in (metrics.psnr, metrics.ssim, metrics.moving_psnr):
        with pytest.raises(DataError) as info:
            fn(a, b)
        message = str(info.value)
        assert "pred has shape (6, 64, 64, 3)" in message
        assert "target has shape (6, 32, 64, 3)" in message
        assert isinstance(info.value, WorkbenchError) and isinstance(info.value, ValueError)
    # Mixed layouts report the converted shapes as well.
    with pytest.raises(DataError, match=r"\(2, 3, 6, 64, 64\).*\(6, 64, 64, 3\).*after conversion"):
        metrics.psnr(torch.zeros(2, 3, 6, 64, 64), a)


def test_invalid_inputs_raise_data_error():
    video = moving_square()
    with pytest.raises(DataError, match="data_range must be a finite number > 0, got 0"):
        metrics.psnr(video, video, data_range=0)
    with pytest.raises(DataError, match="unsupported dtype bool"):
        metrics.psnr(video > 0, video > 0)
    with pytest.raises(DataError, match=r"channel-last.*got shape \(6, 64, 64, 4\)"):
        metrics.psnr(np.zeros((6, 64, 64, 4), np.uint8), np.zeros((6, 64, 64, 4), np.uint8))


# --------------------------------------------------------------------------- moving mask / PSNR


def test_moving_mask_excludes_frame_zero_and_static_pixels():
    video = moving_square()
    mask = metrics.moving_mask(video)
    assert mask.shape == (6, 64, 64) and mask.dtype == bool
    assert not mask[0].any()
    # Never-touched background (below the square's rows) is static.
    assert not mask[:, 30:].any() and not mask[:, :10].any()
    # Frame 1: the square moved 8 px right; newly covered columns 25..32 and uncovered 5..12 move.
    expected = np.zeros((64, 64), dtype=bool)
    expected[10:30, 25:33] = True
    expected[10:30, 5:13] = True
    assert np.array_equal(mask[1], expected)
    # Float channel-first input gives the same mask.
    as_float = torch.from_numpy(np.moveaxis(video / 127.5 - 1.0, -1, 0))
    assert np.array_equal(metrics.moving_mask(as_float), mask)
    # Batched.
    assert metrics.moving_mask(np.stack([video, video])).shape == (2, 6, 64, 64)


def test_moving_mask_threshold_and_first_frame():
    video = np.full((3, 8, 8, 3), 100, dtype=np.uint8)
    video[1, 0, 0, 2] = 110  # |diff| 10: not more than the threshold
    video[1, 0, 1, 1] = 111  # |diff| 11 in one channel: moving
    video[2, 5, 5] = (89, 100, 100)  # |diff| 11, negative
    mask = metrics.moving_mask(video)
    assert metrics.DEFAULT_MOVING_THRESHOLD == 10
    assert np.argwhere(mask).tolist() == [[1, 0, 1], [2, 5, 5]]
    assert metrics.moving_mask(video, threshold=10.5).sum() == 2
    assert metrics.moving_mask(video, threshold=0).sum() == 3
    # An explicit reference frame; frame 0 still excluded.
    ref = np.full((8, 8, 3), 50, dtype=np.uint8)
    mask_ref = metrics.moving_mask(video, first_frame=ref)
    assert not mask_ref[0].any() and mask_ref[1:].all()
    with pytest.raises(DataError, match=r"first_frame of shape \(4, 4, 3\) does not match target"):
        metrics.moving_mask(video, first_frame=np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(DataError, match=r"\[T, H, W, 3\]"):
        metrics.moving_mask(video[0])


def test_moving_psnr_measures_only_moving_pixels():
    target = moving_square()
    mask = metrics.moving_mask(target)
    # Errors on static pixels only: invisible to moving_psnr.
    pred = target.copy()
    pred[:, 40:] = 0
    assert metrics.moving_psnr(pred, target) == math.inf
    assert metrics.psnr(pred, target) < 20
    # Errors of 3 on the moving pixels: closed form.
    pred = target.astype(np.int16)
    pred[mask] -= 3
    pred = pred.astype(np.uint8)
    assert metrics.moving_psnr(pred, target) == pytest.approx(20 * math.log10(255 / 3))
    # A static clip has no moving pixels.
    static = np.repeat(target[:1], 4, axis=0)
    assert math.isnan(metrics.moving_psnr(static, static))


# --------------------------------------------------------------------------- SSIM


def _gaussian_2d() -> np.ndarray:
    x = np.arange(11) - 5.0
    g = np.exp(-(x**2) / (2 * 1.5**2))
    g /= g.sum()
    return np.outer(g, g)


def _ssim_window(x: np.ndarray, y: np.ndarray, weights: np.ndarray, data_range: float = 255.0) -> float:
    """SSIM of one 11x11 window, written out from the definition."""
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = (weights * x).sum(), (weights * y).sum()
    vx = (weights * (x - mx) ** 2).sum()
    vy = (weights * (y - my) ** 2).sum()
    cxy = (weights * (x - mx) * (y - my)).sum()
    return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))


def test_ssim_identical_is_one_and_symmetric(textured):
    assert metrics.ssim(textured, textured) == pytest.approx(1.0, abs=1e-12)
    other = noisy(textured, 20.0)
    assert metrics.ssim(textured, other) == pytest.approx(metrics.ssim(other, textured), abs=1e-12)


def test_ssim_decreases_under_growing_noise(textured):
    scores = [metrics.ssim(noisy(textured, sigma), textured) for sigma in (2, 5, 10, 20, 40, 80)]
    assert all(a > b for a, b in zip(scores, scores[1:])), scores
    assert 0.0 < scores[-1] < scores[0] < 1.0


def test_ssim_matches_hand_computed_single_window():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (11, 11, 3)).astype(np.uint8)
    y = np.clip(x.astype(int) + rng.integers(-30, 31, x.shape), 0, 255).astype(np.uint8)
    weights = _gaussian_2d()
    expected = np.mean([_ssim_window(x[..., c].astype(float), y[..., c].astype(float), weights) for c in range(3)])
    assert metrics.ssim(x, y) == pytest.approx(expected, abs=1e-10)
    assert metrics.ssim(x[None], y[None]) == pytest.approx(expected, abs=1e-10)


def test_ssim_matches_brute_force_over_windows():
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (2, 13, 15, 3)).astype(np.uint8)
    y = noisy(x, 25.0, seed=5)
    weights = _gaussian_2d()
    values = [
        _ssim_window(x[t, i : i + 11, j : j + 11, c].astype(float), y[t, i : i + 11, j : j + 11, c], weights)
        for t in range(2)
        for c in range(3)
        for i in range(3)
        for j in range(5)
    ]
    assert metrics.ssim(x, y) == pytest.approx(np.mean(values), abs=1e-10)


def test_ssim_constant_frames_closed_form():
    a = np.full((1, 12, 12, 3), 40, dtype=np.uint8)
    b = np.full((1, 12, 12, 3), 200, dtype=np.uint8)
    c1 = (0.01 * 255) ** 2
    expected = (2 * 40 * 200 + c1) / (40**2 + 200**2 + c1)  # variances are zero
    assert metrics.ssim(a, b) == pytest.approx(expected, abs=1e-10)


def test_ssim_float_input_and_small_frames():
    video = moving_square()
    as_float = torch.from_numpy(np.moveaxis(video / 127.5 - 1.0, -1, 0)).float()
    assert metrics.ssim(as_float, video) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(DataError, match=r"at least 11x11 pixels.*got 8x64"):
        metrics.ssim(video[:, :8], video[:, :8])


# --------------------------------------------------------------------------- per_clip


def test_per_clip_matches_single_calls():
    clip_a = moving_square()
    clip_b = noisy(clip_a, 10.0)
    targets = np.stack([clip_a, clip_a])
    preds = np.stack([clip_a.copy(), clip_b])
    preds[0] = np.clip(preds[0].astype(int) + 1, 0, 255).astype(np.uint8)
    values = metrics.per_clip(metrics.psnr, preds, targets)
    assert values.shape == (2,) and values.dtype == np.float64
    assert values[0] == pytest.approx(metrics.psnr(preds[0], targets[0]))
    assert values[1] == pytest.approx(metrics.psnr(preds[1], targets[1]))
    assert np.allclose(metrics.per_clip("ssim", preds, targets), [metrics.ssim(p, t) for p, t in zip(preds, targets)])
    moving = metrics.per_clip("moving_psnr", torch.from_numpy(preds), torch.from_numpy(targets), threshold=20)
    assert moving[1] == pytest.approx(metrics.moving_psnr(preds[1], targets[1], threshold=20))
    # Float channel-first batches, and a per-clip mask split along the batch.
    float_preds = torch.from_numpy(np.moveaxis(preds / 127.5 - 1.0, -1, 1))
    assert np.allclose(metrics.per_clip(metrics.psnr, float_preds, targets), values)
    mask = np.zeros((2, 6, 64, 64), dtype=bool)
    mask[1, :, :32] = True
    masked = metrics.per_clip(metrics.psnr, preds, targets, mask=mask)
    assert math.isnan(masked[0])
    assert masked[1] == pytest.approx(metrics.psnr(preds[1], targets[1], mask=mask[1]))


def test_per_clip_errors():
    video = np.stack([moving_square()] * 2)
    with pytest.raises(DataError, match=r"unknown metric 'psnrr'.*Did you mean 'psnr'"):
        metrics.per_clip("psnrr", video, video)
    with pytest.raises(DataError, match=r"2 clips.*1 clips|\(2, 6, 64, 64, 3\).*\(1, 6, 64, 64, 3\)"):
        metrics.per_clip(metrics.psnr, video, video[:1])
    with pytest.raises(DataError, match="5 axes"):
        metrics.per_clip(metrics.psnr, video[0], video[0])
    with pytest.raises(DataError, match=r"mask must be given per clip with leading axis B=2"):
        metrics.per_clip(metrics.psnr, video, video, mask=np.ones((6, 64, 64), dtype=bool))


# --------------------------------------------------------------------------- media: video files


def _read_mp4(path: Path) -> np.ndarray:
    import imageio.v3 as iio

    # imageio-ffmpeg's reader leaves its pipes to the garbage collector; keep that quiet.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        frames = iio.imread(path, plugin="FFMPEG", index=None)
        gc.collect()
    return np.asarray(frames)


def test_mp4_round_trip(tmp_path):
    video = moving_square()
    path = media.write_video(tmp_path / "nested" / "dir" / "clip.mp4", video, fps=10)
    assert path == tmp_path / "nested" / "dir" / "clip.mp4" and path.is_file()
    back = _read_mp4(path)
    assert back.shape == (6, 64, 64, 3) and back.dtype == np.uint8
    mean_in = video.reshape(-1, 3).mean(axis=0)
    mean_out = back.reshape(-1, 3).mean(axis=0)
    assert np.abs(mean_in - mean_out).max() < 3.0, (mean_in, mean_out)
    # Frame by frame the content survives H.264 (the square is where it should be).
    err = np.abs(back.astype(float) - video).mean(axis=(1, 2, 3))
    assert (err < 6.0).all(), err
    assert metrics.psnr(back, video) > 25


def test_mp4_pads_odd_sizes_and_accepts_float_and_torch(tmp_path):
    rng = np.random.default_rng(0)
    video = np.repeat(rng.integers(0, 256, (1, 30, 50, 3), dtype=np.uint8), 3, axis=0)
    video = np.repeat(np.repeat(video[:, ::6, ::10], 6, axis=1), 10, axis=2)[:, :30, :50]  # blocky
    path = media.write_video(tmp_path / "odd.mp4", torch.from_numpy(video))
    back = _read_mp4(path)
    assert back.shape == (3, 32, 64, 3)  # padded up to multiples of 16
    assert np.abs(back[:, :30, :50].astype(float) - video).mean() < 12
    as_float = torch.from_numpy(np.moveaxis(moving_square() / 127.5 - 1.0, -1, 0)).float()
    back = _read_mp4(media.write_video(tmp_path / "float.mp4", as_float))
    assert back.shape == (6, 64, 64, 3)


def test_gif_round_trip_is_exact_for_few_colours(tmp_path):
    import imageio.v3 as iio

    video = moving_square()
    path = media.write_video(tmp_path / "clip.gif", video, fps=10)
    back = np.asarray(iio.imread(path, index=None))
    assert back.shape[:3] == (6, 64, 64)
    assert np.array_equal(back[..., :3], video)
    meta = iio.immeta(path, index=0)
    assert meta["loop"] == 0 and meta["duration"] == 100
    # Writing again replaces the file rather than appending frames.
    media.write_video(path, video[:3], fps=5)
    assert np.asarray(iio.imread(path, index=None)).shape[0] == 3


def test_write_video_rejects_unknown_extension_and_bad_frames(tmp_path):
    video = moving_square()
    with pytest.raises(DataError) as info:
        media.write_video(tmp_path / "clip.avi", video)
    message = str(info.value)
    assert "'.avi'" in message and ".mp4" in message and ".gif" in message
    assert not (tmp_path / "clip.avi").exists()
    with pytest.raises(DataError, match="unknown file extension '\\(none\\)'"):
        media.write_video(tmp_path / "clip", video)
    with pytest.raises(DataError, match="one clip"):
        media.write_video(tmp_path / "batch.mp4", np.stack([video, video]))
    with pytest.raises(DataError, match="fps must be a positive number"):
        media.write_video(tmp_path / "clip.gif", video, fps=0)


# --------------------------------------------------------------------------- media: images and grids


def test_upscale_nearest_neighbour():
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    big = media.upscale(frame, 4)
    assert big.shape == (8, 12, 3)
    assert np.array_equal(big[::4, ::4], frame) and np.array_equal(big[3::4, 3::4], frame)
    video = moving_square()
    assert media.upscale(video, 2).shape == (6, 128, 128, 3)
    assert media.upscale(torch.from_numpy(video), 1).shape == (6, 64, 64, 3)
    with pytest.raises(DataError, match="whole number >= 1"):
        media.upscale(video, 0)


def test_label_grid_without_labels_is_an_exact_layout():
    a = moving_square()
    b = 255 - a
    grid = media.label_grid([[a, b], [b, a[:2]]], pad=3)
    assert grid.shape == (6, 3 + 2 * (64 + 3), 3 + 2 * (64 + 3), 3) and grid.dtype == np.uint8
    assert np.array_equal(grid[:, 3:67, 3:67], a)
    assert np.array_equal(grid[:, 3:67, 70:134], b)
    assert np.array_equal(grid[:, 70:134, 3:67], b)
    # The short clip is held on its last frame.
    assert np.array_equal(grid[:2, 70:134, 70:134], a[:2])
    assert all(np.array_equal(grid[t, 70:134, 70:134], a[1]) for t in range(2, 6))
    # Padding is white.
    assert (grid[:, :3] == 255).all() and (grid[:, :, 67:70] == 255).all()


def test_label_grid_draws_label_strips():
    a = moving_square()
    grid = media.label_grid(
        [[a, a, a], [a, a]], row_labels=["base", "adapter"], col_labels=["truth", "step 2", "swapped"], scale=2
    )
    t, height, width, _ = grid.shape
    assert t == 6 and height > 2 * 128 and width > 3 * 128
    cells_top = height - 2 * (128 + 2)  # [pad][header][pad] [row 0][pad] [row 1][pad]
    cells_left = width - 3 * (128 + 2)
    assert cells_top > 2 and cells_left > 2
    header = grid[:, : cells_top - 2, cells_left:]
    left = grid[:, cells_top:, : cells_left - 2]
    assert (header != 255).any() and (left != 255).any()
    # Text is black on white: the strips hold only greys.
    assert (header.max(axis=-1) - header.min(axis=-1) == 0).all()
    assert header.min() < 100
    # The labels are the same on every frame; the first cell is the upscaled clip.
    assert (grid[:, : cells_top - 2] == grid[:1, : cells_top - 2]).all()
    assert np.array_equal(grid[:, cells_top : cells_top + 128, cells_left : cells_left + 128], media.upscale(a, 2))
    # The missing cell of the short row stays white.
    assert (grid[:, -130:-2, -130:-2] == 255).all()


def test_label_grid_validation():
    a = moving_square()
    with pytest.raises(DataError, match=r"videos\[0\]\[0\] is 64x64 but videos\[0\]\[1\] is 32x64"):
        media.label_grid([[a, a[:, :32]]])
    with pytest.raises(DataError, match="got 1 col_labels for 2 columns"):
        media.label_grid([[a, a]], col_labels=["x"])
    with pytest.raises(DataError, match="got 3 row_labels for 1 rows"):
        media.label_grid([[a, a]], row_labels=["x", "y", "z"])
    with pytest.raises(DataError, match="list of rows"):
        media.label_grid(a)


def test_side_by_side_is_a_single_row_grid():
    a = moving_square()
    b = torch.from_numpy(np.moveaxis(a / 127.5 - 1.0, -1, 0))
    row = media.side_by_side([a, b], ["truth", "pred"])
    assert np.array_equal(row, media.label_grid([[a, a]], col_labels=["truth", "pred"]))
    assert np.array_equal(media.side_by_side([a, a]), media.label_grid([a, a]))
    assert media.side_by_side([a, a]).shape == (6, 2 + 64 + 2, 2 + 2 * (64 + 2), 3)


def test_save_image_png_round_trip(tmp_path):
    from PIL import Image

    frame = moving_square()[3]
    path = media.save_image(tmp_path / "out" / "frame.png", frame)
    assert path.is_file()
    assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), frame)
    path = media.save_image(tmp_path / "float.png", torch.zeros(3, 4, 5))
    assert np.asarray(Image.open(path)).shape == (4, 5, 3)
    with pytest.raises(DataError, match=r"unknown file extension '.jpg'.*allowed: .png"):
        media.save_image(tmp_path / "frame.jpg", frame)
    with pytest.raises(DataError, match="one uint8 frame"):
        media.save_image(tmp_path / "clip.png", moving_square())


# --------------------------------------------------------------------------- import hygiene


def test_import_does_not_pull_imageio_or_pil():
    code = (
        "import sys, workbench.metrics, workbench.media\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('imageio', 'imageio_ffmpeg', 'PIL', 'matplotlib'))\n"
        "print(','.join(bad))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
