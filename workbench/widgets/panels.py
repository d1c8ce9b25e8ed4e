"""Fast pictures: panels composed straight from arrays with Pillow, no matplotlib figure per move.

What the views redraw on every slider move (the Stepper's branches, the ablation's recorded | edited |
difference row, the hand path): uint8 RGB arrays laid out for a notebook's width, with titles, notes
and colour bars drawn by Pillow, and a fast PNG encoder. The figures the views draw once (loss curves,
gates, sensitivity heatmaps) are matplotlib's, in :mod:`workbench.widgets.render`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import replace
from functools import cache

import numpy as np

from workbench.inspect.previews.pictures import Panel

PICTURE_WIDTH = 1000  # the width a row of panels is laid out for: a notebook's output area at ~1400 px
MAX_PANEL = 384  # the largest a frame is drawn (a single panel would otherwise fill the row)
MIN_PANEL = 128
TEXT_RGB = (40, 40, 40)
NOTE_RGB = (178, 24, 43)  # a note on a panel (e.g. "adapter off here"): the diverging map's red
GRID_RGB = (228, 228, 228)  # the grid lines of a chart, under its paths
BEYOND_RGB = (255, 214, 0)  # a dot on a signed map's pixel beyond its colour range: not in the diverging map
BACKGROUND = 255


@cache
def label_font(size: int):
    """The font the pictures' labels are drawn in, ``size`` pixels high (Pillow's default)."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _text_width(draw, text: str, font) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    return int(right - left)


def panel_scale(frame: int, panels: int, bars: int = 0, width: int = PICTURE_WIDTH) -> int:
    """The integer factor a ``frame``-pixel picture is drawn at so that ``panels`` of them (and ``bars``
    colour bars) fill about ``width`` pixels; frames stay between ``MIN_PANEL`` and ``MAX_PANEL`` pixels."""
    room = (width - 10 * (panels + 1) - 90 * bars) / max(1, panels)
    room = min(max(room, MIN_PANEL), MAX_PANEL)
    return max(1, int(room // max(1, frame)))


def _wrap(text: str, draw, font, width: int) -> list[str]:
    """``text`` broken into lines no wider than ``width`` pixels (at spaces; a long word stays whole)."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}" if line else word
            if line and _text_width(draw, trial, font) > width:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return lines


def panels_image(panels: Sequence[Panel], title: str | None = None, panel_pixels: int | None = None,
                 width: int = PICTURE_WIDTH) -> np.ndarray:
    """A row of pictures as uint8 RGB ``[H, W, 3]``, composed from the arrays themselves.

    What :func:`panels_figure` shows, drawn without matplotlib (a slider move must not build a
    figure): each panel scaled up by an integer factor (nearest neighbour) so that the row fills
    about ``width`` pixels (``panel_pixels``: the size of a frame instead), under its title and its
    note (in red); float maps coloured over their range, with a colour strip and its end values
    (and what the colours measure) once per range shared by several panels. Text grows with the
    frames, so it stays legible where the browser shrinks the picture to fit.
    """
    from PIL import Image, ImageDraw

    panels = list(panels)
    bars: dict[tuple, Panel] = {}
    for p in panels:
        if p.kind != "rgb":
            bars.setdefault((p.kind, p.vrange), p)
    frame = max((max(p.image.shape[0], p.image.shape[1]) for p in panels), default=64)
    scale = (max(1, panel_pixels // frame) if panel_pixels
             else panel_scale(frame, len(panels), len(bars), width))
    pictures = [np.repeat(np.repeat(p.colored(), scale, axis=0), scale, axis=1) for p in panels]
    beyond = [beyond_range(p) for p in panels]
    for picture, (mask, _) in zip(pictures, beyond):
        if mask is not None:
            picture[_dots(mask, scale)] = BEYOND_RGB
    panels = [p if note is None else replace(p, note=f"{p.note}\n{note}" if p.note else note)
              for p, (_, note) in zip(panels, beyond)]
    size = max((im.shape[1] for im in pictures), default=frame * scale)
    small_px = min(22, max(14, round(size * 0.06)))
    font, small = label_font(small_px + 2), label_font(small_px)
    line_h = small_px + 4
    gap, strip = max(10, small_px // 2 + 4), max(14, small_px)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    heads = [(_wrap(_drawable(p.title), probe, small, max(size, 80)),
              _wrap(_drawable(p.note), probe, small, max(size, 80)) if p.note else []) for p in panels]
    lines = max((len(a) + len(b) for a, b in heads), default=1)
    title = _drawable(title) if title else title
    title_h = small_px + 10 if title else 0
    head = line_h * lines + 4
    bar_w = (strip + 5 * small_px) * len(bars)
    width = sum(im.shape[1] for im in pictures) + gap * (len(pictures) + 1) + bar_w
    height_img = max((im.shape[0] for im in pictures), default=size)
    labels = sorted({p.label for p in bars.values() if p.label})
    foot = line_h * len(labels)
    if title:
        width = max(width, _text_width(probe, title, font) + 2 * gap)
    canvas = Image.new("RGB", (width, title_h + head + height_img + gap + foot), (BACKGROUND,) * 3)
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text(((width - _text_width(draw, title, font)) // 2, 3), title, fill=TEXT_RGB, font=font)
    x = gap
    top = title_h + head
    for im, (title_lines, note_lines) in zip(pictures, heads):
        canvas.paste(Image.fromarray(np.ascontiguousarray(im)), (x, top))
        for i, (line, colour) in enumerate([(t, TEXT_RGB) for t in title_lines]
                                           + [(n, NOTE_RGB) for n in note_lines]):
            tx = x + max(0, (im.shape[1] - _text_width(draw, line, small)) // 2)
            draw.text((tx, title_h + 2 + line_h * i), line, fill=colour, font=small)
        x += im.shape[1] + gap
    for p in bars.values():  # a vertical colour strip, top = the largest value
        lo, hi = p.vrange
        ramp = np.linspace(hi, lo, height_img, dtype=np.float64)[:, None].repeat(strip, axis=1)
        canvas.paste(Image.fromarray(_colorize(ramp, p.cmap, lo, hi)), (x, top))
        middle = top + height_img // 2 - small_px // 2
        for value, y in ((hi, top), (0.5 * (lo + hi), middle), (lo, top + height_img - small_px - 2)):
            draw.text((x + strip + 3, y), f"{value:+.2g}" if p.kind == "signed" else f"{value:.2g}",
                      fill=TEXT_RGB, font=small)
        x += strip + 5 * small_px
    for i, label in enumerate(labels):
        draw.text((gap, top + height_img + gap // 2 + line_h * i), _drawable(f"colours: {label}"),
                  fill=TEXT_RGB, font=small)
    return np.asarray(canvas)


def beyond_range(panel: Panel) -> tuple[np.ndarray | None, str | None]:
    """Where a signed map goes beyond its colour range (there its colour saturates, so a difference of 3 looks
    like one of 1): the mask ``[H, W]`` and a note saying how the picture marks it, e.g. ``"yellow dots:
    beyond ±1 (12 pixels)"``; ``(None, None)`` where nothing is beyond, or for other pictures."""
    if panel.kind != "signed":
        return None, None
    mask = np.abs(np.nan_to_num(np.asarray(panel.image, np.float64))) > panel.limit
    count = int(mask.sum())
    if not count:
        return None, None
    return mask, f"yellow dots: beyond ±{panel.limit:.2g} ({count} pixel{'s' if count != 1 else ''})"


def _dots(mask: np.ndarray, scale: int) -> np.ndarray:
    """``mask`` ``[H, W]`` scaled up by ``scale``: a dot in the middle of each marked pixel."""
    dot = max(1, scale // 2)
    cell = np.zeros((scale, scale), bool)
    start = (scale - dot) // 2
    cell[start:start + dot, start:start + dot] = True
    return np.kron(mask, cell).astype(bool)


def path_image(recorded: np.ndarray, edited: np.ndarray, axes: Sequence[str], unit: str = "", name: str = "",
               frame: int | None = None, width: int = PICTURE_WIDTH, height: int = 170,
               labels: tuple[str, str] = ("recorded", "edited"), title: str = "") -> np.ndarray:
    """Two paths ``[T, D]`` (e.g. the hand a readout finds in the recorded and in an edited video) as a row
    of small line charts, one per dimension, over frames: uint8 RGB ``[H, W, 3]``, drawn without matplotlib.

    The recorded path is grey, the edited one red; ``frame`` is marked by a vertical line; ``title``
    (e.g. how far the edit moved the hand) is written beside the legend.
    """
    from PIL import Image, ImageDraw

    recorded, edited = np.asarray(recorded, np.float64), np.asarray(edited, np.float64)
    t, dims = recorded.shape
    small_px = 14
    font, small = label_font(small_px + 1), label_font(small_px)
    canvas = Image.new("RGB", (width, height), (BACKGROUND,) * 3)
    draw = ImageDraw.Draw(canvas)
    colours = {labels[0]: (120, 120, 120), labels[1]: NOTE_RGB}
    x = 10
    for label, colour in colours.items():  # the legend, top left
        draw.line([(x, 10), (x + 22, 10)], fill=colour, width=3)
        draw.text((x + 27, 2), label, fill=TEXT_RGB, font=small)
        x += 40 + _text_width(draw, label, small)
    if title:
        draw.text((x + 10, 1), _drawable(title), fill=NOTE_RGB, font=font)
    suffix = f" ({unit})" if unit else ""
    chart_w = (width - 10) // max(1, dims)
    left_pad, top, bottom = 8 + 4 * small_px, 26 + small_px + 6, height - small_px - 10
    for d in range(dims):
        x0 = 10 + d * chart_w + left_pad
        x1 = 10 + (d + 1) * chart_w - 14
        values = np.concatenate([recorded[:, d], edited[:, d]])
        lo, hi = float(values.min()), float(values.max())
        pad = max(0.05 * (hi - lo), 0.5 if unit == "cm" else 1e-6)
        lo, hi = lo - pad, hi + pad
        axis = f"{name} {axes[d]}".strip() if d < len(axes) else f"d{d}"
        draw.text((x0, 26), _drawable(f"{axis}{suffix}"), fill=TEXT_RGB, font=font)
        draw.rectangle([x0, top, x1, bottom], outline=(200, 200, 200))

        def px(i: int, v: float, x0=x0, x1=x1, lo=lo, hi=hi) -> tuple[float, float]:
            return (x0 + (x1 - x0) * i / max(1, t - 1), bottom - (bottom - top) * (v - lo) / (hi - lo))

        if frame is not None and 0 <= frame < t:
            fx = px(frame, lo)[0]
            draw.line([(fx, top), (fx, bottom)], fill=(190, 190, 220), width=2)
        ticks = axis_ticks(lo, hi)
        decimals = _tick_decimals(ticks)
        for value in ticks:  # a grid line and a label at each round value, behind the paths
            y = round(px(0, value)[1])
            if top < y < bottom:
                draw.line([(x0 + 1, y), (x1 - 1, y)], fill=GRID_RGB, width=1)
            text = f"{value:.{decimals}f}"
            draw.text((x0 - 6 - _text_width(draw, text, small), y - small_px // 2 - 1), text, fill=TEXT_RGB,
                      font=small)
        for path, colour in ((recorded[:, d], colours[labels[0]]), (edited[:, d], colours[labels[1]])):
            points = [px(i, float(v)) for i, v in enumerate(path)]
            draw.line(points, fill=colour, width=3 if colour == NOTE_RGB else 2)
        draw.text((x0, bottom + 3), "frame 0", fill=TEXT_RGB, font=small)
        end = f"{t - 1}"
        draw.text((x1 - _text_width(draw, end, small), bottom + 3), end, fill=TEXT_RGB, font=small)
    return np.asarray(canvas)


def axis_ticks(lo: float, hi: float, count: int = 3) -> list[float]:
    """Round values inside ``[lo, hi]`` to label an axis with: about ``count`` of them (at least two), spaced
    1, 2, 2.5 or 5 times a power of ten: ``axis_ticks(60.4, 74.7) == [65.0, 70.0]``,
    ``axis_ticks(8.0, 26.9) == [10.0, 15.0, 20.0, 25.0]``."""
    import math

    if not hi > lo:
        return [lo]
    span = hi - lo
    for step in sorted(m * 10.0 ** e
                       for e in range(math.floor(math.log10(span)) - 2, math.floor(math.log10(span)) + 1)
                       for m in (1, 2, 2.5, 5)):
        first = math.ceil(lo / step - 1e-9)
        ticks = [round((first + i) * step, 10) for i in range(int((hi - first * step) // step + 1e-9) + 1)]
        ticks = [t for t in ticks if lo - 1e-9 <= t <= hi + 1e-9]
        if len(ticks) <= count + 1 and len(ticks) >= 2:
            return ticks
    return [lo, hi]


def _tick_decimals(ticks: Sequence[float]) -> int:
    """The decimals that write every tick exactly (at most 3)."""
    for decimals in range(4):
        if all(abs(t - round(t, decimals)) < 1e-9 for t in ticks):
            return decimals
    return 3


def text_image(lines: Sequence[str], width: int = PICTURE_WIDTH, size: int = 14) -> np.ndarray:
    """Lines of text on white as uint8 RGB ``[H, width, 3]`` (a line too wide is wrapped at spaces): what a
    view's status lines say, for a page that shows its picture without the live widgets."""
    from PIL import Image, ImageDraw

    font = label_font(size)
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    rows = [row for line in lines for row in _wrap(_drawable(line), probe, font, max(40, width - 16))]
    line_h = size + 5
    canvas = Image.new("RGB", (width, line_h * len(rows) + 6), (BACKGROUND,) * 3)
    draw = ImageDraw.Draw(canvas)
    for i, row in enumerate(rows):
        draw.text((8, 3 + line_h * i), row, fill=TEXT_RGB, font=font)
    return np.asarray(canvas)


def stack_images(images: Sequence[np.ndarray], gap: int = 6) -> np.ndarray:
    """uint8 RGB pictures one above the other, left-aligned on white: ``[H, W, 3]``."""
    width = max(im.shape[1] for im in images)
    rows = []
    for i, im in enumerate(images):
        row = np.full((im.shape[0], width, 3), BACKGROUND, dtype=np.uint8)
        row[:, :im.shape[1]] = im[..., :3]
        rows.append(row)
        if i < len(images) - 1:
            rows.append(np.full((gap, width, 3), BACKGROUND, dtype=np.uint8))
    return np.concatenate(rows, axis=0)


def _drawable(text: str) -> str:
    """``text`` in characters Pillow's built-in font has (it lacks the minus sign and the en dash)."""
    return text.replace("\u2212", "-").replace("\u2013", "-")


def _colorize(values: np.ndarray, cmap: str, lo: float, hi: float) -> np.ndarray:
    from workbench.inspect.previews.colors import colorize

    return colorize(values, cmap, lo, hi)


def array_png(image: np.ndarray) -> bytes:
    """uint8 ``[H, W, 3]`` → PNG bytes (fast compression: these are redrawn on every move)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def png_array(png: bytes) -> np.ndarray:
    """Decode PNG bytes (e.g. an ``Image`` widget's value) into a uint8 array ``[H, W, C]``."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGBA"))


__all__ = ["BACKGROUND", "BEYOND_RGB", "GRID_RGB", "MAX_PANEL", "MIN_PANEL", "NOTE_RGB", "PICTURE_WIDTH",
           "array_png", "axis_ticks", "beyond_range", "label_font", "panel_scale", "panels_image",
           "path_image", "png_array", "stack_images", "text_image"]
