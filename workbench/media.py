"""Writing videos and images, and laying videos out in labelled grids.

Frames follow :mod:`workbench.metrics` conventions: uint8 channel-last ``[T, H, W, 3]`` (numpy
or torch), or float channel-first ``[3, T, H, W]`` in ``[-1, 1]`` (converted with
:func:`workbench.metrics.to_uint8_video`). Every function returns or writes uint8 RGB.

imageio, imageio-ffmpeg and Pillow are imported inside the functions that need them, so
importing this module costs only numpy and torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import DataError
from workbench.metrics import to_uint8_video

__all__ = ["VIDEO_EXTENSIONS", "label_grid", "save_image", "side_by_side", "upscale", "write_video"]

VIDEO_EXTENSIONS = (".mp4", ".gif")
"""Extensions :func:`write_video` understands."""

_MACRO_BLOCK = 16
_MP4_QUALITY = 8  # imageio-ffmpeg's 0..10 scale; 8 keeps small clips' colours close.


def _video_uint8(frames: Any, who: str) -> np.ndarray:
    """``frames`` as a uint8 ``[T, H, W, 3]`` numpy array (one clip, not a batch)."""
    try:
        video = to_uint8_video(frames)
    except DataError as exc:
        raise DataError(f"{who}: {exc}") from None
    if video.ndim != 4:
        raise DataError(
            f"{who}: expected one clip, uint8 [T, H, W, 3] or float [3, T, H, W], got shape "
            f"{tuple(getattr(frames, 'shape', np.shape(video)))} ({video.ndim - 4} extra leading axes). "
            "Pass one clip at a time (videos[i]), or lay a batch out with label_grid."
        )
    if video.shape[0] == 0:
        raise DataError(f"{who}: the video has no frames (shape {tuple(video.shape)}); give at least one.")
    return video


def _check_fps(fps: Any) -> float:
    try:
        value = float(fps)
    except (TypeError, ValueError):
        value = float("nan")
    if not (value > 0 and np.isfinite(value)):
        raise DataError(f"write_video: fps must be a positive number, got {fps!r}. The default is 10.")
    return value


def _pad_to_multiple(video: np.ndarray, multiple: int) -> np.ndarray:
    """Pad H and W up to a multiple of ``multiple`` by repeating the last row / column."""
    h, w = video.shape[1:3]
    ph, pw = (-h) % multiple, (-w) % multiple
    if not (ph or pw):
        return video
    return np.pad(video, ((0, 0), (0, ph), (0, pw), (0, 0)), mode="edge")


def _write_mp4(path: Path, video: np.ndarray, fps: float) -> None:
    import imageio_ffmpeg

    # H.264 in yuv420p needs even sizes and imageio-ffmpeg wants multiples of 16; pad rather
    # than let ffmpeg rescale, so each original pixel stays at its coordinates.
    video = np.ascontiguousarray(_pad_to_multiple(video, _MACRO_BLOCK))
    h, w = video.shape[1:3]
    writer = imageio_ffmpeg.write_frames(
        str(path),
        size=(w, h),
        fps=fps,
        codec="libx264",
        pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p",
        quality=_MP4_QUALITY,
        macro_block_size=_MACRO_BLOCK,
        ffmpeg_log_level="error",
    )
    writer.send(None)  # start ffmpeg
    try:
        for frame in video:
            writer.send(frame.tobytes())
    finally:
        writer.close()


def _write_gif(path: Path, video: np.ndarray, fps: float) -> None:
    import imageio.v3 as iio

    duration_ms = 1000.0 / fps
    iio.imwrite(path, video, extension=".gif", plugin="pillow", is_batch=True, duration=duration_ms, loop=0)


def write_video(path: str | Path, frames: Any, fps: float = 10) -> Path:
    """Write one clip to ``path`` and return it as a :class:`~pathlib.Path`.

    The format follows the extension:

    * ``.mp4``: H.264 (``libx264``, pixel format ``yuv420p``) through imageio-ffmpeg. Sizes
      that are not a multiple of 16 are padded at the bottom / right by repeating the edge
      pixels (64 x 64 needs none), so a reader should crop to the original size.
    * ``.gif``: Pillow through imageio, looping forever, ``1000 / fps`` ms per frame. Pillow
      quantizes each frame to a 256-colour palette and merges identical consecutive frames
      into one longer frame (the playback timing is kept).

    ``frames`` is uint8 ``[T, H, W, 3]`` (numpy or torch) or float ``[3, T, H, W]`` in
    ``[-1, 1]``. Missing parent directories are created; an existing file is replaced.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in VIDEO_EXTENSIONS:
        raise DataError(
            f"write_video: unknown file extension {path.suffix or '(none)'!r} in {str(path)!r}; allowed: "
            f"{', '.join(VIDEO_EXTENSIONS)}. Name the file with .mp4 (H.264) or .gif (looping)."
        )
    fps = _check_fps(fps)
    video = _video_uint8(frames, "write_video")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    if suffix == ".mp4":
        _write_mp4(path, video, fps)
    else:
        _write_gif(path, video, fps)
    return path


def _check_factor(factor: Any, name: str, who: str) -> int:
    if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or factor < 1:
        raise DataError(f"{who}: {name} must be a whole number >= 1, got {factor!r}. "
                        f"Use e.g. 4 for 64 -> 256.")
    return int(factor)


def upscale(frames: Any, factor: int) -> np.ndarray:
    """Nearest-neighbour upscale by a whole ``factor``: each pixel becomes ``factor x factor``.

    Takes uint8 channel-last ``[..., H, W, 3]`` (a frame, a clip or a batch) or float
    channel-first ``[..., 3, T, H, W]`` video, and returns uint8 channel-last.
    """
    factor = _check_factor(factor, "factor", "upscale")
    a = _uint8_any(frames, "upscale")
    if factor == 1:
        return a
    return np.repeat(np.repeat(a, factor, axis=-3), factor, axis=-2)


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or hasattr(x, "detach")


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.double()
        return x.numpy()
    return np.asarray(x)


def _uint8_any(x: Any, who: str) -> np.ndarray:
    """A uint8 channel-last frame ``[H, W, 3]`` or video ``[..., T, H, W, 3]``."""
    a = _as_numpy(x)
    try:
        if a.ndim == 3 and a.dtype.kind in "ui":  # one channel-last frame
            return to_uint8_video(a[None])[0]
        return to_uint8_video(a)
    except DataError as exc:
        raise DataError(f"{who}: {exc}") from None


def _clip_for_grid(video: Any, where: str) -> np.ndarray:
    a = _uint8_any(video, f"label_grid: {where}")
    if a.ndim == 3:  # a single frame: one-frame clip
        a = a[None]
    if a.ndim != 4 or a.shape[0] == 0:
        raise DataError(
            f"label_grid: {where} must be one clip, uint8 [T, H, W, 3] (T >= 1) or a frame [H, W, 3], got "
            f"shape {tuple(a.shape)} after conversion."
        )
    return a


def _pad_frames(video: np.ndarray, t: int) -> np.ndarray:
    if video.shape[0] == t:
        return video
    tail = np.repeat(video[-1:], t - video.shape[0], axis=0)
    return np.concatenate([video, tail], axis=0)


def _text_size(draw: Any, font: Any, text: str) -> tuple[int, int, int, int]:
    """``(width, height, x_offset, y_offset)`` of ``text`` as drawn at the origin."""
    if not text:
        return 0, 0, 0, 0
    left, top, right, bottom = draw.multiline_textbbox((0, 0), text, font=font)
    return right - left, bottom - top, left, top


def label_grid(
    videos: Sequence[Sequence[Any]] | Sequence[Any],
    row_labels: Sequence[Any] | None = None,
    col_labels: Sequence[Any] | None = None,
    pad: int = 2,
    scale: int = 1,
) -> np.ndarray:
    """Lay clips out in a labelled grid; returns uint8 ``[T, H', W', 3]``.

    ``videos`` is a list of rows, each a list of clips (uint8 ``[T, H, W, 3]``, float
    ``[3, T, H, W]`` in [-1, 1], or single frames ``[H, W, 3]``), e.g. sampling steps x
    branches, or truth | base | adapter | swapped. A flat list of clips is one row. Every clip
    must have the same ``H x W``; rows may be shorter than the longest one (the missing cells
    stay white). Clips shorter than the longest are held on their last frame.

    ``col_labels`` (one per column) are drawn in a header strip above the columns and
    ``row_labels`` (one per row) in a strip left of the rows, black on white in Pillow's
    default font (``ImageFont.load_default()``); multi-line labels (``"\\n"``) work. A column
    or row widens to fit its label. ``pad`` white pixels separate the cells and surround the
    grid; ``scale`` upscales each clip (nearest-neighbour) before layout, labels unscaled.
    """
    from PIL import Image, ImageDraw, ImageFont

    if _is_array(videos):
        raise DataError(
            "label_grid: videos must be a list of rows (each a list of clips) or a flat list of clips, got "
            f"a single {type(videos).__name__} of shape {tuple(videos.shape)}. Wrap it: label_grid([[clip]]) "
            "or, for a batch, label_grid([list(batch)])."
        )
    rows_in = list(videos)
    if not rows_in:
        raise DataError("label_grid: videos is empty; pass at least one row with one clip.")
    if all(_is_array(r) for r in rows_in):
        rows_in = [rows_in]  # a flat list of clips: one row
    if isinstance(pad, bool) or not isinstance(pad, (int, np.integer)) or pad < 0:
        raise DataError(f"label_grid: pad must be a whole number >= 0, got {pad!r}.")
    pad = int(pad)
    scale = _check_factor(scale, "scale", "label_grid")

    rows: list[list[np.ndarray]] = []
    size: tuple[int, int] | None = None
    first_where = ""
    for r, row in enumerate(rows_in):
        if _is_array(row) or isinstance(row, (str, bytes)):
            raise DataError(
                f"label_grid: row {r} must be a list of clips, got a {type(row).__name__}. Pass videos as "
                "[[clip, clip], [clip, clip]] (rows of clips) or [clip, clip] (one row)."
            )
        cells = []
        for c, clip in enumerate(row):
            where = f"videos[{r}][{c}]"
            a = _clip_for_grid(clip, where)
            if size is None:
                size, first_where = a.shape[1:3], where
            elif a.shape[1:3] != size:
                raise DataError(
                    f"label_grid: every clip must have the same H x W; {first_where} is {size[0]}x{size[1]} "
                    f"but {where} is {a.shape[1]}x{a.shape[2]} (shape {tuple(a.shape)}). Resize or upscale "
                    "the clips to one size first."
                )
            cells.append(upscale(a, scale) if scale > 1 else a)
        rows.append(cells)
    if size is None:
        raise DataError("label_grid: every row is empty; pass at least one clip.")
    n_rows = len(rows)
    n_cols = max(len(row) for row in rows)
    for name, labels in (("row_labels", row_labels), ("col_labels", col_labels)):
        if isinstance(labels, (str, bytes)):
            raise DataError(
                f"label_grid: {name} must be a list with one label per {name[:3]}, "
                f"got the string {labels!r}. "
                f"Wrap it in a list: {name}=[{labels!r}]."
            )
    if row_labels is not None and len(row_labels) != n_rows:
        raise DataError(
            f"label_grid: got {len(row_labels)} row_labels for {n_rows} rows; give one label per row "
            "(use '' for none) or row_labels=None."
        )
    if col_labels is not None and len(col_labels) != n_cols:
        raise DataError(
            f"label_grid: got {len(col_labels)} col_labels for {n_cols} columns (the longest row); give one "
            "label per column (use '' for none) or col_labels=None."
        )
    t = max(cell.shape[0] for row in rows for cell in row)
    cell_h, cell_w = size[0] * scale, size[1] * scale

    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    margin = 2
    cols_txt = [str(s) for s in col_labels] if col_labels is not None else []
    rows_txt = [str(s) for s in row_labels] if row_labels is not None else []
    col_sizes = [_text_size(measure, font, s) for s in cols_txt]
    row_sizes = [_text_size(measure, font, s) for s in rows_txt]
    # Column labels share one top line (so baselines agree), whatever their ascenders.
    drawn = [sz for text, sz in zip(cols_txt, col_sizes) if text]
    header_top = min((sz[3] for sz in drawn), default=0)
    header_h = max((sz[3] + sz[1] for sz in drawn), default=0) - header_top
    header_h = header_h + 2 * margin if drawn else 0
    left_w = max((s[0] for s in row_sizes), default=0)
    left_w = left_w + 2 * margin if left_w else 0
    col_w = [max(cell_w, (col_sizes[c][0] + 2 * margin) if col_sizes else 0) for c in range(n_cols)]
    row_h = [max(cell_h, (row_sizes[r][1] + 2 * margin) if row_sizes else 0) for r in range(n_rows)]

    # x / y of each column / row's top-left corner.
    x0 = [pad + (left_w + pad if left_w else 0)]
    for c in range(1, n_cols):
        x0.append(x0[-1] + col_w[c - 1] + pad)
    y0 = [pad + (header_h + pad if header_h else 0)]
    for r in range(1, n_rows):
        y0.append(y0[-1] + row_h[r - 1] + pad)
    width = x0[-1] + col_w[-1] + pad
    height = y0[-1] + row_h[-1] + pad

    background = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(background)
    for c, (text, (tw, _, ox, _)) in enumerate(zip(cols_txt, col_sizes)):
        if text:
            x = x0[c] + (col_w[c] - tw) // 2 - ox
            y = pad + margin - header_top
            draw.multiline_text((x, y), text, fill=(0, 0, 0), font=font, align="center")
    for r, (text, (tw, th, ox, oy)) in enumerate(zip(rows_txt, row_sizes)):
        if text:
            x = pad + (left_w - tw) // 2 - ox
            y = y0[r] + (row_h[r] - th) // 2 - oy
            draw.multiline_text((x, y), text, fill=(0, 0, 0), font=font, align="center")

    out = np.repeat(np.asarray(background, dtype=np.uint8)[None], t, axis=0)
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            y = y0[r] + (row_h[r] - cell_h) // 2
            x = x0[c] + (col_w[c] - cell_w) // 2
            out[:, y : y + cell_h, x : x + cell_w] = _pad_frames(cell, t)
    return out


def side_by_side(
    videos: Sequence[Any], labels: Sequence[Any] | None = None, pad: int = 2, scale: int = 1
) -> np.ndarray:
    """Clips in one labelled row: ``label_grid([videos], col_labels=labels, ...)``."""
    return label_grid([list(videos)], col_labels=labels, pad=pad, scale=scale)


def save_image(path: str | Path, image: Any) -> Path:
    """Save one frame as PNG and return the :class:`~pathlib.Path`.

    ``image`` is uint8 ``[H, W, 3]`` (numpy or torch) or grayscale ``[H, W]``; a float frame is
    channel-first ``[3, H, W]`` in [-1, 1]. Missing parent directories are created.
    """
    from PIL import Image

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise DataError(
            f"save_image: unknown file extension {path.suffix or '(none)'!r} in {str(path)!r}; "
            "allowed: .png. Name the file with .png (use write_video for .mp4 / .gif)."
        )
    a = _image_uint8(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path, format="PNG")
    return path


def _image_uint8(image: Any) -> np.ndarray:
    a = _as_numpy(image)
    if a.dtype.kind == "f":
        if a.ndim != 3 or a.shape[0] != 3:
            raise DataError(
                f"save_image: a float image must be channel-first [3, H, W] in [-1, 1], got shape {a.shape}. "
                "A uint8 image is channel-last [H, W, 3]."
            )
        return to_uint8_video(a[:, None])[0]
    if a.dtype.kind not in "ui" or not (a.ndim == 2 or (a.ndim == 3 and a.shape[-1] == 3)):
        raise DataError(
            f"save_image: expected one uint8 frame [H, W, 3] or [H, W], got shape {a.shape} with dtype "
            f"{a.dtype}. For a clip, pick a frame (video[t]) or use write_video."
        )
    if a.ndim == 2:
        return np.ascontiguousarray(a, dtype=np.uint8) if a.dtype == np.uint8 else _gray(a)
    return to_uint8_video(a[None])[0]


def _gray(a: np.ndarray) -> np.ndarray:
    if a.size and (a.min() < 0 or a.max() > 255):
        raise DataError(f"save_image: integer pixel values must lie in 0..255, "
                        f"got {int(a.min())}..{int(a.max())}.")
    return a.astype(np.uint8)
