"""Pure render functions: plain data in, a matplotlib ``Figure`` (or HTML) out.

Nothing here holds state or touches a widget; the views call these and put the PNG into an
``Image``. Figures are built with ``matplotlib.figure.Figure`` directly (never pyplot), so
rendering does not depend on the notebook backend and does not display anything by itself.
Signed maps use the diverging colour map of :mod:`workbench.inspect.previews.colors` (blue below zero,
red above, white at zero), gates its sequential map; each float map carries a labelled colour bar.
The pictures redrawn on every slider move are Pillow's, in :mod:`workbench.widgets.panels`, and are
served here too, so a view imports its drawing from one place.
"""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import numpy as np

from workbench.inspect.previews.colors import lut
from workbench.inspect.previews.pictures import Panel
from workbench.widgets.panels import (  # noqa: F401 - the fast pictures, served here too
    MIN_PANEL,
    NOTE_RGB,
    PICTURE_WIDTH,
    array_png,
    panel_scale,
    panels_image,
    path_image,
    png_array,
    stack_images,
    text_image,
)

DPI = 100
PANEL_INCHES = 2.7
FIGURE_INCHES = 10.0  # a notebook's output area at ~1400 px: wider figures are shrunk, their text with them
TITLE_SIZE = 9
LABEL_SIZE = 9


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


@cache
def colormap(name: str):
    """The matplotlib colour map of :func:`workbench.inspect.previews.colors.lut` ``name``."""
    from matplotlib.colors import ListedColormap

    return ListedColormap(lut(name), name=f"workbench-{name}")


def figure_png(fig) -> bytes:
    """The figure as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    buf = io.BytesIO()
    canvas.print_png(buf)
    return buf.getvalue()


def figure_array(fig) -> np.ndarray:
    """The figure as drawn: uint8 RGBA ``[H, W, 4]``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba()).copy()




def _draw_panel(ax, panel: Panel):
    ax.set_title(panel.title, fontsize=TITLE_SIZE)
    ax.set_xticks([])
    ax.set_yticks([])
    if panel.kind == "rgb":
        ax.imshow(panel.image, interpolation="nearest")
        return None
    lo, hi = panel.vrange
    return ax.imshow(panel.image, cmap=colormap(panel.cmap), vmin=lo, vmax=hi, interpolation="nearest")


def _note(ax, note: str) -> None:
    """A panel's note under it, in red (the colour of notes on the fast pictures)."""
    if note:
        ax.set_xlabel(note, fontsize=TITLE_SIZE - 1, color="#b2182b")


def _colorbar(fig, mappable, axes, label: str):
    """A labelled colour bar whose ticks carry their own magnitude (no separate "1e-5" offset)."""
    from matplotlib.ticker import FuncFormatter

    bar = fig.colorbar(mappable, ax=axes, shrink=0.85, pad=0.02,
                       format=FuncFormatter(lambda v, _: f"{v:.2g}"))
    bar.set_label(label, fontsize=LABEL_SIZE - 1)
    bar.ax.tick_params(labelsize=LABEL_SIZE - 2)
    return bar


def panels_figure(panels: Sequence[Panel], title: str | None = None,
                  panel_inches: float | str = PANEL_INCHES):
    """A row of pictures (e.g. the branches of a step, or recorded | edited | difference).

    Float maps get a colour bar labelled with what they measure; maps of the same kind and
    range share one bar. A panel's note is written under it (in red), wrapped to its width.
    ``panel_inches``: the size of each picture, or ``"fit"``: as large as fits ``FIGURE_INCHES``
    (a notebook's output width) up to ``PANEL_INCHES``, so that a long row is shown at its size
    rather than shrunk by the browser, text included.
    """
    n = max(1, len(panels))
    scales = {(p.kind, p.vrange) for p in panels if p.kind != "rgb"}
    if panel_inches == "fit":
        panel_inches = max(1.4, min(PANEL_INCHES, (FIGURE_INCHES - 0.9 * len(scales)) / n))
    width = panel_inches * n + (0.9 if scales else 0.0)  # constrained layout makes room for further bars
    if title:  # wide enough for the title line (about 0.08 inch per character at this size)
        width = max(width, 0.08 * max(len(line) for line in title.split("\n")) + 0.3)
    fig = _figure(width, panel_inches + (0.3 if title else 0))
    axes = np.atleast_1d(fig.subplots(1, n))
    bars: dict[tuple, tuple[Any, list, str]] = {}
    texts = []  # (axes, text, what it says): wrapped to the width of its picture below
    for ax, panel in zip(axes, panels):
        mappable = _draw_panel(ax, panel)
        _note(ax, panel.note)
        texts += [(ax, ax.title, panel.title), (ax, ax.xaxis.label, panel.note)]
        if mappable is not None:
            key = (panel.kind, panel.vrange)
            entry = bars.setdefault(key, (mappable, [], panel.label))
            entry[1].append(ax)
    for mappable, axs, label in bars.values():
        bar = _colorbar(fig, mappable, axs, label)
        texts.append((bar.ax, bar.ax.yaxis.label, label))
    if title:
        fig.suptitle(title, fontsize=TITLE_SIZE + 1)
    _fit_texts(fig, texts)
    return fig


def shared_ranges(panels: Sequence[Panel]) -> list[Panel]:
    """``panels`` with one colour range per measure (float maps of the same kind and label): the largest of
    their ranges, leaving out maps that are zero everywhere (they say nothing about the scale), so that the
    colours compare across the panels and :func:`panels_figure` draws one colour bar per measure, e.g. the
    adapter's output of two branches side by side."""
    limits: dict[tuple[str, str], float] = {}
    for p in panels:
        if p.kind != "rgb" and np.any(p.image):
            limits[p.kind, p.label] = max(limits.get((p.kind, p.label), 0.0), p.limit)
    return [replace(p, limit=limits[p.kind, p.label]) if (p.kind, p.label) in limits else p for p in panels]


def _fit_texts(fig, texts, rounds: int = 4) -> None:
    """Wrap each text to the picture it belongs to, measured as drawn, and make the figure as much taller as
    the added lines need: a title or note never runs past its picture into a neighbour or a colour bar.

    ``texts``: ``(axes, text artist, what it says)``; a colour bar's label (vertical) is wrapped to the
    bar's height. The layout moves when lines are added, so this measures and wraps again until it holds.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    for _ in range(rounds):
        fig.draw_without_rendering()
        renderer = canvas.get_renderer()
        grown = 0.0
        for ax, artist, text in texts:
            if not text:
                continue
            box = ax.get_window_extent(renderer)
            vertical = artist.get_rotation() % 180 == 90
            room = (box.height if vertical else box.width) - 2
            wrapped = _wrap_measured(text, room, artist.get_fontproperties(), renderer)
            if wrapped != artist.get_text():
                added = wrapped.count("\n") - artist.get_text().count("\n")
                artist.set_text(wrapped)
                if not vertical and added > 0:
                    grown = max(grown, added * artist.get_fontsize() * 1.25 / 72)
        if not grown:
            return
        fig.set_figheight(fig.get_figheight() + grown)


def _wrap_measured(text: str, room: float, prop, renderer) -> str:
    """``text`` broken at spaces into lines no wider than ``room`` pixels as drawn (a longer word stays
    whole)."""
    def width(line: str) -> float:
        return renderer.get_text_width_height_descent(line, prop, ismath=False)[0]

    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}" if line else word
            if line and width(trial) > room:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return "\n".join(lines)


def filmstrip(videos: Mapping[str, np.ndarray], frames: Sequence[int], fps: float | None = None,
              frame_inches: float = 1.5, title: str | None = None):
    """Rows of videos (uint8 ``[T, H, W, 3]`` each, labelled by their key) at chosen ``frames``.

    Columns are titled by frame index (and time in seconds when ``fps`` is given), e.g. truth
    and predictions of the same clip one above the other.
    """
    rows, cols = len(videos), len(frames)
    fig = _figure(frame_inches * cols + 1.2, frame_inches * rows + 0.3 + (0.3 if title else 0))
    axes = np.asarray(fig.subplots(rows, cols, squeeze=False))
    for r, (label, video) in enumerate(videos.items()):
        for c, f in enumerate(frames):
            ax = axes[r, c]
            ax.imshow(video[min(f, len(video) - 1)], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {f}" + (f" ({f / fps:.2f} s)" if fps else ""), fontsize=TITLE_SIZE)
            if c == 0:
                ax.set_ylabel(label, fontsize=LABEL_SIZE)
    if title:
        fig.suptitle(title, fontsize=TITLE_SIZE + 1)
    return fig


def curves_figure(x: Sequence[float], curves: Mapping[str, Sequence[float]], xlabel: str, ylabel: str,
                  title: str = "", band: tuple[float, float] | None = None, band_label: str = ""):
    """Lines over a shared x (e.g. losses per noise level), with an optional shaded band."""
    fig = _figure(5.6, 3.3)
    ax = fig.subplots()
    if band is not None:
        ax.axvspan(band[0], band[1], color="#f4d7a8", alpha=0.6, lw=0, label=band_label or None)
    styles = ["o-", "s--", "^:", "d-."]
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(x, values, styles[i % len(styles)], ms=4, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=TITLE_SIZE + 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE - 1, loc="best")
    return fig


CHUNK_LINE = {"color": "#7b4fa0", "linestyle": (0, (4, 3)), "linewidth": 1.0}
"""How :func:`mark_chunks` draws a chunk boundary: dashed violet, unlike a grid line (thin, solid, grey)."""


def mark_chunks(ax, starts: Sequence[int], label: str = "chunk boundary") -> None:
    """Vertical lines on ``ax`` at the frames ``starts`` where the chunks of a rollout begin, drawn unlike
    grid lines (:data:`CHUNK_LINE`) and under the curves; the first carries ``label`` for a legend. The
    x axis's grid lines are switched off, which the boundaries would otherwise sit among."""
    ax.grid(False, axis="x")
    for i, start in enumerate(starts):
        ax.axvline(start, zorder=1, label=label if i == 0 else None, **CHUNK_LINE)


def message_figure(text: str, width: float = 4.0, height: float = 1.0):
    """A small figure that only says ``text`` (e.g. nothing to show yet)."""
    fig = _figure(width, height)
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=LABEL_SIZE)
    return fig


def _ema(values: Sequence[float], smoothing: float) -> np.ndarray:
    """Bias-corrected exponential moving average: each point weighs the values seen so far by
    ``smoothing ** age``, normalised by the weights' sum. Seeding the average with the first value
    instead would drag it towards that value for tens of steps, a decline that looks like learning."""
    out, avg, weight = [], 0.0, 0.0
    for v in values:
        avg = smoothing * avg + (1 - smoothing) * v
        weight = smoothing * weight + (1 - smoothing)
        out.append(avg / weight)
    return np.asarray(out)


def loss_figure(steps: Sequence[int], losses: Sequence[float], target: int | None = None, start: int = 0,
                smoothing: float = 0.9, title: str = "training loss"):
    """Loss per optimizer step (light) with its exponential moving average (dark).

    The x axis runs to ``target`` (the run's planned end; ``None`` after it stopped: the steps it
    trained) with the last point inside it. Few steps get markers (one step is a visible point, not
    an empty axis); the legend sits above the axes, where it never covers the end of the curve.
    """
    from matplotlib.ticker import MaxNLocator

    fig = _figure(6.0, 3.0)
    ax = fig.subplots()
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=TITLE_SIZE + 1, pad=22 if len(steps) else 6)  # room for the legend above
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    last = steps[-1] if len(steps) else start
    # the last point inside the axes
    right = max(target or 0, last + max(1, 0.03 * (last - start)), start + 1)
    ax.set_xlim(start, right)
    if len(steps):
        marker = {"marker": "o", "ms": 4} if len(steps) <= 30 else {}
        ax.plot(steps, losses, color="#9bbcd9", lw=1, label="per step", **marker)
        ax.plot(steps, _ema(losses, smoothing), color="#1f4e8c", lw=2,
                label=f"moving average ({smoothing:g}, bias-corrected)", **marker)
        ax.legend(fontsize=LABEL_SIZE - 1, loc="lower left", bbox_to_anchor=(0, 1.02), ncols=2, frameon=False,
                  borderaxespad=0)
        positive = np.asarray(losses) > 0
        if positive.all() and max(losses) / min(losses) > 20:
            ax.set_yscale("log")
        elif len(steps) == 1:  # one value: a range around it, so that the point sits inside the axes
            v = float(losses[0])
            ax.set_ylim(v - max(abs(v) * 0.1, 1e-3), v + max(abs(v) * 0.1, 1e-3))
    else:
        ax.text(0.5, 0.5, "no steps yet", transform=ax.transAxes, ha="center", va="center", color="0.4")
    return fig


def _gate_band(ax, band: tuple[float, float] | None):
    if band is not None:
        ax.axvspan(band[0], band[1], color="#f4d7a8", alpha=0.5, lw=0, label="NoiseGated band")


def gates_figure(levels: Sequence[float], weight: Sequence[float], history: Mapping[str, np.ndarray] | None,
                 gate_map: Panel | None, band: tuple[float, float] | None = None,
                 weight_label: str = "effective adapter weight"):
    """Gates over noise levels, over training steps, and as a spatial map at one step.

    ``weight``: per noise level in ``levels``, how much of the adapter output reaches the
    prediction. ``history``: ``gate_history`` columns (``step`` plus gate values) or ``None``.
    ``gate_map``: a :class:`Panel` of the effective gate at one step, or ``None``.
    """
    n = 3 if gate_map is not None else 2
    fig = _figure(FIGURE_INCHES / 3 * n, 3.3)
    axes = fig.subplots(1, n)
    ax = axes[0]
    _gate_band(ax, band)
    ax.plot(levels, weight, "o-", color="#1f4e8c", label=weight_label)
    ax.set_xlabel("noise level (0 = clean, 1 = pure noise)")
    ax.set_ylabel("weight")
    ax.set_xlim(0, 1)
    top = max(1.05, float(np.nanmax(weight)) * 1.1) if len(weight) else 1.05
    ax.set_ylim(min(0.0, float(np.nanmin(weight)) * 1.1) if len(weight) else 0.0, top)
    ax.set_title("adapter weight over noise levels", fontsize=TITLE_SIZE + 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE - 2, loc="best")
    ax = axes[1]
    ax.set_title("gate over training", fontsize=TITLE_SIZE + 1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("gate value")
    ax.grid(alpha=0.3)
    if history and len(history.get("step", ())) and any(k != "step" for k in history):
        styles = ["o-", "s--", "^:", "d-.", "v-"]
        for i, (label, values) in enumerate(_merge_equal_columns(history).items()):
            ax.plot(history["step"], values, styles[i % len(styles)], ms=4, lw=1.5, label=label)
        ax.legend(fontsize=LABEL_SIZE - 2, loc="best")
    else:
        ax.text(0.5, 0.5, "no training history\n(gated composers record it every 10 steps)",
                transform=ax.transAxes, ha="center", va="center", color="0.4", fontsize=LABEL_SIZE - 1)
    if gate_map is not None:
        import textwrap

        _colorbar(fig, _draw_panel(axes[2], gate_map), axes[2], gate_map.label)
        _note(axes[2], textwrap.fill(gate_map.note, 40))
    return fig


def _heatmap(fig, ax, values: np.ndarray, levels: Sequence[float], names: Sequence[str], title: str, bar: str,
             second: np.ndarray | None = None, fmt: str = "{:.2g}"):
    """One noise level × dimension heatmap with its values written in the cells (``second``: a value
    to write under each, e.g. the base's)."""
    top = float(values.max()) if values.size and values.max() > 0 else 1.0
    im = ax.imshow(values, cmap=colormap("sequential"), vmin=0, vmax=top, aspect="auto", origin="lower")
    ax.set_xticks(range(values.shape[1]), names, fontsize=LABEL_SIZE)
    ax.set_yticks(range(len(levels)), [f"{lv:.2f}" for lv in levels], fontsize=LABEL_SIZE)
    ax.set_xlabel("action dimension")
    ax.set_ylabel("noise level")
    ax.set_title(title, fontsize=TITLE_SIZE + 1)
    rows = values.shape[0]
    size = LABEL_SIZE if rows <= 7 and second is None else LABEL_SIZE - 1
    for (i, d), v in np.ndenumerate(values):
        text = fmt.format(v) if second is None else f"{fmt.format(v)}\nbase {fmt.format(second[i, d])}"
        ax.text(d, i, text, ha="center", va="center", fontsize=size,
                color="black" if v > 0.6 * top else "white")
    _colorbar(fig, im, ax, bar)


def _merge_equal_columns(history: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns of a gate history (``step`` left out), those with equal values merged under one label
    (``"gate_mean = gate_abs_max"`` for a scalar gate), so that no line hides under another."""
    merged: dict[str, np.ndarray] = {}
    for key, values in history.items():
        if key == "step":
            continue
        values = np.asarray(values, dtype=np.float64)
        same = next((label for label, v in merged.items() if np.array_equal(v, values, equal_nan=True)), None)
        if same is None:
            merged[key] = values
        else:
            merged[f"{same} = {key}"] = merged.pop(same)
    return merged


def sensitivity_figure(levels: Sequence[float], values: np.ndarray, swap_gap: Mapping[str, np.ndarray],
                       scale: Sequence[float], quantity: str = "x0", dim_names: Sequence[str] | None = None,
                       readout: Mapping[str, np.ndarray] | None = None, readout_label: str = ""):
    """Heatmap of sensitivity per action dimension × noise level, and the swap-actions gap.

    ``values`` ``(levels, dims)``: RMS change per unit of each dimension; ``swap_gap``:
    ``{"x0": (levels,), "adapter": (levels,)}``; ``scale``: RMS adapter output per level.
    ``readout``: ``{"adapter": (levels, dims), "base": (levels, dims)}``, how far a readout's
    position moves per unit of each dimension (``readout_label``: what and in which unit, e.g.
    "hand (cm)"), drawn as a second heatmap; the base's values appear in its cells unless they are
    zero everywhere (then the title says so).
    """
    values = np.asarray(values, dtype=np.float64)
    dims = values.shape[1]
    names = list(dim_names) if dim_names is not None else [f"d{d}" for d in range(dims)]
    heat_w = 1.0 + 0.45 * dims
    widths = [heat_w] + ([heat_w] if readout is not None else []) + [3.0]
    fig = _figure(min(10.0, sum(widths) + 0.8 * (len(widths) - 1)), 3.8)  # fits a notebook's output width
    grid = fig.add_gridspec(1, len(widths), width_ratios=widths)
    what = "x0 estimate" if quantity == "x0" else "adapter output"
    _heatmap(fig, fig.add_subplot(grid[0]), values, levels, names, f"sensitivity of the {what}",
             f"RMS change of the {what}\nper unit of action")
    if readout is not None:
        moved, base = np.asarray(readout["adapter"], np.float64), np.asarray(readout["base"], np.float64)
        base_zero = not np.any(base)
        title = f"{readout_label or 'readout'} per unit of action"
        if base_zero:
            title += "\n(the base alone: 0 everywhere)"
        _heatmap(fig, fig.add_subplot(grid[1]), moved, levels, names, title,
                 f"{readout_label or 'readout'} moved per unit\n(mean over clips and frames)",
                 second=None if base_zero else base, fmt="{:.1f}")
    ax = fig.add_subplot(grid[-1])
    ax.plot(levels, swap_gap["x0"], "o-", color="#b2182b", label="swap gap, x0 estimate")
    ax.plot(levels, swap_gap["adapter"], "s--", color="#2166ac", label="swap gap, adapter output")
    ax.plot(levels, scale, ":", color="0.4", label="adapter output size (RMS)")
    ax.set_xlabel("noise level (1 = pure noise)")
    ax.set_ylabel("RMS difference (latent units)")
    ax.set_title("true vs swapped actions", fontsize=TITLE_SIZE + 1)
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LABEL_SIZE - 1, loc="best")
    return fig


def condition_figure(series: Mapping[str, Mapping[str, Any]],
                     dim_names: Mapping[str, Sequence[str]] | None = None):
    """One small plot per condition, as :func:`workbench.inspect.probes.sensitivity.condition_plots`
    describes it.

    Per-frame values: one line per dimension over frames; per-clip vectors: bars; images
    (e.g. the first frame): the picture; a missing optional condition: a note.
    """
    from matplotlib.ticker import MaxNLocator

    names = list(series)
    n = max(1, len(names))
    legends = sum(series[name]["kind"] == "series" for name in names)
    fig = _figure(3.4 * n + 0.7 * legends, 2.9)  # room for each legend beside its plot
    axes = np.atleast_1d(fig.subplots(1, n))
    for ax, name in zip(axes, names):
        item = series[name]
        kind, title = item["kind"], item["title"]
        ax.set_title(title, fontsize=TITLE_SIZE)
        if kind == "series":
            values = np.asarray(item["values"])  # (T, D)
            labels = (dim_names or {}).get(name) or [f"d{d}" for d in range(values.shape[1])]
            for d in range(values.shape[1]):
                ax.plot(range(values.shape[0]), values[:, d], "o-", ms=2.5, lw=1.2, label=labels[d])
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # frames are whole numbers
            ax.set_xlabel("frame")
            ax.set_ylabel("value")
            ax.grid(alpha=0.3)
            # beside the plot, at the size of the axis labels: readable, and it hides no line
            ax.legend(fontsize=LABEL_SIZE - 1, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                      handlelength=1.5)
        elif kind == "vector":
            values = np.asarray(item["values"])
            labels = (dim_names or {}).get(name) or [f"d{d}" for d in range(values.shape[0])]
            ax.bar(range(values.shape[0]), values, color="#1f4e8c")
            ax.set_xticks(range(values.shape[0]), labels, fontsize=LABEL_SIZE - 2)
            ax.set_ylabel("value")
            ax.axhline(0, color="0.3", lw=0.8)
        elif kind == "image":
            ax.imshow(item["values"], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            ax.text(0.5, 0.5, item.get("note", "missing"), transform=ax.transAxes, ha="center", va="center",
                    color="0.4", fontsize=LABEL_SIZE)
            ax.set_axis_off()
    return fig


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value)


TABLE_COLUMNS = ("name", "key", "shape", "dtype", "frames", "dropout", "dropped", "min", "mean", "max")


def condition_table_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """:func:`workbench.inspect.condition_table` rows as an HTML table."""
    head = "".join(f"<th style='padding:2px 8px;text-align:left'>{html.escape(c)}</th>" for c in columns)
    cells = ("".join(f"<td style='padding:2px 8px'>{html.escape(_cell(row.get(c)))}</td>" for c in columns)
             for row in rows)
    body = "".join(f"<tr>{c}</tr>" for c in cells)
    return f"<table style='border-collapse:collapse;font-size:90%'><tr>{head}</tr>{body}</table>"


def condition_table_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """The same table as aligned plain text (for pages without a front end)."""
    cells = [list(columns)] + [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells)


__all__ = ["array_png", "colormap", "condition_figure", "condition_table_html", "condition_table_text",
           "curves_figure", "figure_array", "figure_png", "filmstrip", "gates_figure", "loss_figure",
           "mark_chunks", "message_figure", "panel_scale", "panels_figure", "panels_image", "path_image",
           "png_array", "sensitivity_figure", "shared_ranges", "stack_images", "text_image"]
