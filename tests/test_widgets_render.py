"""Pure render functions: plain data in, a figure out — labelled axes, colour bars for float maps,
signed maps centred on zero, and nothing cut off."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from workbench.inspect.previews.pictures import Panel  # noqa: E402
from workbench.widgets import panels as fast  # noqa: E402
from workbench.widgets import render  # noqa: E402


def rgb(seed: int = 0, size: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)


def signed(seed: int = 0, size: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(size, size)).astype(np.float32)


def inside(fig) -> bool:
    """Everything drawn (titles, labels, tick labels, colour bars) lies inside the canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    drawn = fig.get_tightbbox(canvas.get_renderer())  # inches
    width, height = fig.get_size_inches()
    tolerance = 2 / fig.dpi
    return drawn.x0 >= -tolerance and drawn.y0 >= -tolerance and drawn.x1 <= width + tolerance and \
        drawn.y1 <= height + tolerance


def test_a_panel_note_is_written_under_it_wrapped_to_its_width():
    note = "effective weight 0.00 · adapter off here (NoiseGated band 0.30–1.00, noise level 0.05)"
    fig = render.panels_figure([Panel("run", "gate", np.zeros((4, 4)), "gate", note=note), Panel("x0", "rgb", rgb())])
    label = fig.axes[0].get_xlabel()
    assert label.replace("\n", " ") == note and label.count("\n") >= 1 and fig.axes[1].get_xlabel() == ""
    assert inside(fig)
    fast = render.panels_image([Panel("run", "gate", np.zeros((4, 4)), "gate", note=note)], panel_pixels=64)
    red = np.all(fast[..., :3] == render.NOTE_RGB, axis=-1)
    assert red.any()  # the note, in red, on the fast picture too


def test_a_difference_beyond_the_fixed_colour_range_is_marked_not_just_saturated():
    diff = np.zeros((8, 8), np.float32)
    diff[2, 3], diff[5, 5], diff[6, 1] = 1.5, -3.0, 1.0  # two beyond ±1; one at its edge, drawn as ±1 is
    mask, note = fast.beyond_range(Panel("edited − recorded", "signed", diff, "difference", 1.0))
    assert note == "yellow dots: beyond ±1 (2 pixels)" and np.argwhere(mask).tolist() == [[2, 3], [5, 5]]
    assert fast.beyond_range(Panel("d", "signed", diff, "difference", 3.0)) == (None, None)  # all inside ±3
    assert fast.beyond_range(Panel("g", "gate", np.full((4, 4), 2.0), "gate")) == (None, None)  # only signed maps
    marked = render.panels_image([Panel("d", "signed", diff, "difference", 1.0)], panel_pixels=64)
    wider = render.panels_image([Panel("d", "signed", diff, "difference", 3.0)], panel_pixels=64)
    yellow = np.all(marked[..., :3] == fast.BEYOND_RGB, axis=-1)
    assert yellow.sum() == 2 * 4 * 4  # a 4-pixel dot in each of the two 8-pixel cells beyond the range
    assert not np.all(wider[..., :3] == fast.BEYOND_RGB, axis=-1).any()
    assert marked.shape[0] > wider.shape[0]  # and a line under the title says what the dots mean


def test_fast_pictures_fill_the_row_and_their_text_grows_with_the_frames():
    one = render.panels_image([Panel("run", "rgb", rgb())], title="x0 estimate")
    three = render.panels_image([Panel(f"b{i}", "rgb", rgb()) for i in range(3)], title="x0 estimate")
    assert one.shape[1] <= render.PICTURE_WIDTH and three.shape[1] <= render.PICTURE_WIDTH + 20
    assert render.panel_scale(64, 1) == 6 and render.panel_scale(64, 3) == 5  # 384 px alone, 320 px for three
    assert render.panel_scale(64, 3, bars=1) == 4  # with a colour bar beside them
    assert render.panel_scale(64, 8) * 64 >= render.MIN_PANEL  # many branches: never smaller than 128 px


def test_panels_figure_draws_pictures_and_one_colour_bar_per_scale():
    panels = [Panel("run", "rgb", rgb()), Panel("a", "signed", signed(1), "difference", 2.0),
              Panel("b", "signed", signed(2), "difference", 2.0), Panel("gate", "gate", np.full((4, 4), 0.3), "gate")]
    fig = render.panels_figure(panels, title="x0 estimate · step 3 of 20 · noise level 0.85 · frame 15")
    images = [a for a in fig.axes if a.images]
    assert len(images) == 4
    bars = [a for a in fig.axes if not a.images and a.get_ylabel()]
    assert sorted(a.get_ylabel() for a in bars) == ["difference", "gate"]  # shared by the two signed maps
    signed_image = images[1].images[0]
    assert signed_image.get_clim() == (-2.0, 2.0)  # centred on zero
    assert inside(fig)
    assert render.figure_array(fig).shape[2] == 4


def test_a_row_can_fit_the_notebook_width_instead_of_being_shrunk_by_the_browser():
    panels = [Panel(f"step {i}", "rgb", rgb(i)) for i in range(6)]
    assert render.panels_figure(panels).get_figwidth() == pytest.approx(6 * render.PANEL_INCHES)
    fitted = render.panels_figure(panels, panel_inches="fit")
    assert fitted.get_figwidth() <= render.FIGURE_INCHES and inside(fitted)
    assert render.panels_figure(panels[:2], panel_inches="fit").get_figwidth() == pytest.approx(2 * render.PANEL_INCHES)


def test_panels_of_one_measure_can_share_one_colour_range_and_bar():
    run = Panel("run: adapter output", "signed", signed(1) * 0.3, "adapter output", 0.6)
    alone = Panel("base alone: adapter output", "signed", np.zeros((16, 16), np.float32), "adapter output", 1.0)
    other = Panel("run: x0 difference", "signed", signed(2), "x0 difference", 2.5)
    gates = [Panel(f"{name}: gate", "gate", np.zeros((4, 4)), "gate", 1.0) for name in ("run", "base alone")]
    shared = render.shared_ranges([run, alone, other, *gates])
    assert [p.limit for p in shared] == [0.6, 0.6, 2.5, 1.0, 1.0]  # the zero map takes the run's range
    assert [p.title for p in shared] == [run.title, alone.title, other.title, gates[0].title, gates[1].title]
    fig = render.panels_figure(shared)
    assert len(fig.axes) == 5 + 3  # five pictures, one colour bar per measure
    assert len(render.panels_figure([run, alone, other, *gates]).axes) == 5 + 4  # each range its own bar


def test_chunk_boundaries_are_drawn_unlike_grid_lines():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    ax.plot(range(40), np.sin(np.arange(40)))
    ax.grid(alpha=0.3)
    render.mark_chunks(ax, [16, 31])
    ax.grid(axis="y", alpha=0.3)
    boundaries = [line for line in ax.lines if list(line.get_xdata()) in ([16, 16], [31, 31])]
    assert len(boundaries) == 2 and [line.get_label() for line in boundaries][0] == "chunk boundary"
    assert all(line.get_linestyle() == "--" and line.get_color() == "#7b4fa0" for line in boundaries)
    assert not any(line.get_visible() for line in ax.xaxis.get_gridlines())  # no vertical grid line among them
    assert all(line.get_visible() and line.get_linestyle() == "-" for line in ax.yaxis.get_gridlines())


def test_a_long_title_widens_a_single_panel():
    title = "adapter − base (x0) · step 12 of 20 · noise level 0.40 · frame 15 (given)"
    fig = render.panels_figure([Panel("run (seed 0)", "signed", signed(), "x0 difference", 1.0)], title=title)
    assert inside(fig)


def test_panel_colours_match_the_exported_colours():
    from matplotlib.colors import Normalize

    panel = Panel("d", "signed", np.array([[-1.0, 0.0, 1.0]]), "difference", 1.0)
    drawn = render.colormap("diverging")(Normalize(-1, 1)(panel.image))[..., :3]
    np.testing.assert_allclose(drawn * 255, panel.colored(), atol=1.01)


def test_loss_figure_axes_and_smoothing():
    fig = render.loss_figure([1, 2, 3, 4], [1.0, 0.5, 0.8, 0.4], target=10, start=0)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("optimizer step", "loss")
    assert ax.get_xlim() == (0.0, 10.0)
    smoothed = ax.lines[1].get_ydata()
    # bias-corrected: weights 0.9 * 0.1 and 0.1 over their sum (a seeded average would say 0.95)
    assert smoothed[0] == 1.0 and smoothed[1] == pytest.approx((0.09 * 1.0 + 0.1 * 0.5) / 0.19)
    empty = render.loss_figure([], [], target=5)
    assert "no steps yet" in [t.get_text() for t in empty.axes[0].texts]


def test_one_step_of_loss_is_a_visible_point_and_the_legend_leaves_the_curve_alone():
    fig = render.loss_figure([1], [0.17], target=None, start=0)  # a run stopped after its first step
    ax = fig.axes[0]
    assert ax.lines[0].get_marker() == "o" and ax.lines[0].get_markersize() > 0  # one point shows
    lo, hi = ax.get_ylim()
    assert lo < 0.17 < hi and ax.get_xlim() == (0.0, 2.0)  # the step it trained, inside the axes
    assert render.loss_figure([1], [0.17], target=100_000).axes[0].get_xlim() == (0.0, 100_000.0)  # while it runs
    render.figure_array(fig)
    legend = ax.get_legend().get_window_extent()
    assert legend.y0 >= ax.get_window_extent().y1 - 1  # above the axes, never over the curve's end
    assert inside(fig)
    long = render.loss_figure(list(range(1, 101)), list(np.linspace(1, 0.1, 100)), target=100)
    assert long.axes[0].lines[0].get_marker() in ("None", None, "")  # many steps: a plain line


def test_a_gate_history_never_hides_one_column_under_another():
    history = {"step": np.array([10.0, 20.0]), "gate_mean": np.array([0.1, 0.2]),
               "gate_abs_max": np.array([0.1, 0.2]), "noise_weight": np.array([1.0, 1.0])}
    fig = render.gates_figure([0.1, 0.5], [0.1, 0.2], history, None)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert labels == ["gate_mean = gate_abs_max", "noise_weight"]
    assert [line.get_linestyle() for line in fig.axes[1].lines] == ["-", "--"]


def test_frame_axes_are_ticked_at_whole_frames():
    fig = render.condition_figure({"action": {"kind": "series", "title": "action", "values": np.zeros((16, 4))}})
    render.figure_array(fig)
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 15]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_gates_figure_with_and_without_history():
    levels = [0.1, 0.5, 0.9]
    fig = render.gates_figure(levels, [0.0, 0.4, 0.4], {"step": np.array([10.0, 20.0]),
                                                        "gate_mean": np.array([0.1, 0.2])},
                              Panel("gate", "gate", np.full((4, 4), 0.4), "effective gate"), band=(0.3, 1.0))
    assert [a.get_xlabel() for a in fig.axes[:2]] == ["noise level (0 = clean, 1 = pure noise)", "optimizer step"]
    assert inside(fig)
    off = Panel("gate map", "gate", np.zeros((4, 4)), "effective gate", note="effective weight 0.00 · adapter off here")
    fig = render.gates_figure(levels, [0.0, 0.4, 0.4], None, off, band=(0.3, 1.0))
    assert fig.axes[2].get_xlabel() == "effective weight 0.00 · adapter off here" and inside(fig)
    bare = render.gates_figure(levels, [0.1, 0.1, 0.1], None, None)
    assert len(bare.axes) == 2 and "no training history" in bare.axes[1].texts[0].get_text()


def test_sensitivity_figure_heatmap_labels():
    values = np.arange(12, dtype=float).reshape(3, 4) / 100
    fig = render.sensitivity_figure([0.2, 0.5, 0.8], values, {"x0": np.ones(3), "adapter": np.ones(3)},
                                    np.ones(3), dim_names=["dx", "dy", "dz", "grip"])
    heat = fig.axes[0]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["dx", "dy", "dz", "grip"]
    assert heat.get_ylabel() == "noise level" and len(heat.texts) == 12
    assert min(t.get_fontsize() for t in heat.texts) >= render.LABEL_SIZE  # legible at the notebook's width
    assert inside(fig)


def test_sensitivity_figure_with_a_readout_draws_a_second_heatmap_in_its_unit():
    values = np.arange(12, dtype=float).reshape(3, 4) / 100
    readout = {"adapter": np.arange(12, dtype=float).reshape(3, 4), "base": np.zeros((3, 4))}
    gap = {"x0": np.ones(3), "adapter": np.ones(3)}
    fig = render.sensitivity_figure([0.2, 0.5, 0.8], values, gap, np.ones(3), dim_names=["dx", "dy", "dz", "grip"],
                                    readout=readout, readout_label="hand (cm)")
    heat = [a for a in fig.axes if a.images]
    assert len(heat) == 2 and heat[1].get_title() == "hand (cm) per unit of action\n(the base alone: 0 everywhere)"
    assert [t.get_text() for t in heat[1].texts][:3] == ["0.0", "1.0", "2.0"]
    readout["base"] = np.full((3, 4), 0.5)  # a base that reads the actions: its value in each cell
    fig = render.sensitivity_figure([0.2, 0.5, 0.8], values, gap, np.ones(3), readout=readout,
                                    readout_label="hand (cm)")
    assert [a for a in fig.axes if a.images][1].texts[1].get_text() == "1.0\nbase 0.5"
    assert inside(fig) and fig.get_figwidth() * render.DPI <= 1100


def test_condition_figure_kinds():
    fig = render.condition_figure({
        "action": {"kind": "series", "title": "action, per frame", "values": np.zeros((8, 4))},
        "task": {"kind": "vector", "title": "task", "values": np.ones(3)},
        "first_frame": {"kind": "image", "title": "first_frame", "values": rgb()},
        "proprio": {"kind": "missing", "title": "proprio", "values": None, "note": "missing (optional, None)"},
    }, dim_names={"action": ["dx", "dy", "dz", "grip"]})
    assert fig.axes[0].get_xlabel() == "frame"
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["dx", "dy", "dz", "grip"]
    assert inside(fig)
    # readable: as large as the axis labels' ticks or larger (8 pt, 11 px at 100 dpi), and beside the plot, on no line
    assert all(t.get_fontsize() >= 8 for t in legend.get_texts())
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).x0 >= fig.axes[0].get_window_extent(renderer).x1 - 1


def test_filmstrip_and_curves():
    video = np.stack([rgb(i) for i in range(8)])
    fig = render.filmstrip({"truth": video, "prediction": video}, frames=[0, 3, 7], fps=40)
    assert fig.axes[0].get_title() == "frame 0 (0.00 s)" and fig.axes[3].get_ylabel() == "prediction"
    fig = render.curves_figure([0.1, 0.5], {"base": [1, 2], "adapted": [0.5, 1]}, "noise level", "loss",
                               band=(0.2, 0.6), band_label="recommended band")
    assert fig.axes[0].get_ylabel() == "loss" and inside(fig)


def test_condition_table_html_and_text():
    rows = [{"name": "action", "key": "action", "shape": (2, 8, 4), "dtype": "float32", "frames": "keep",
             "dropout": 0.0, "dropped": 0, "min": -1.0, "mean": 0.01234, "max": 1.0}]
    html = render.condition_table_html(rows)
    assert "<td style='padding:2px 8px'>(2, 8, 4)</td>" in html and "0.012" in html
    text = render.condition_table_text(rows).splitlines()
    assert text[0].split()[:2] == ["name", "key"] and text[1].split()[0] == "action"


def text_boxes(fig):
    """Every piece of text drawn (titles, notes, colour-bar labels and ticks), as display boxes, with
    the axes (picture or colour bar) each belongs to."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = []
    for ax in fig.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_yticklabels(), *ax.get_xticklabels()]
        boxes += [(ax, t, t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]
    if fig._suptitle is not None:
        boxes.append((None, fig._suptitle, fig._suptitle.get_window_extent(renderer)))
    return boxes, renderer


def test_titles_and_notes_fit_their_picture_and_touch_no_colour_bar():
    """Notebook 2's last step: two branches × (adapter output, gate), long titles and notes, three colour bars.
    Measured as drawn: each title and note lies within its picture's width, and no two texts overlap."""
    note = "adapter off here (NoiseGated band 0.30–1.00, noise level 0.05)"
    off = "adapter off here (this branch runs the base alone)"
    panels = [Panel("run: adapter output", "signed", signed(1) * 0.3, "adapter output (linear preview, mean RGB)",
                    0.62, note),
              Panel("run: gate", "gate", np.zeros((16, 16)), "effective gate (adapter weight)", 1.0,
                    f"effective weight 0.00 · {note}"),
              Panel("base alone: adapter output", "signed", np.zeros((16, 16)), "adapter output (linear preview, "
                    "mean RGB)", 1.0, off),
              Panel("base alone: gate", "gate", np.zeros((16, 16)), "effective gate (adapter weight)", 1.0,
                    f"effective weight 0.00 · {off}")]
    fig = render.panels_figure(panels, title="step 19 of 20 · frame 15", panel_inches="fit")
    boxes, renderer = text_boxes(fig)
    pictures = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(pictures) == 4
    for ax, panel in zip(pictures, panels):
        frame = ax.get_window_extent(renderer)
        for text in (ax.title, ax.xaxis.label):
            box = text.get_window_extent(renderer)
            assert frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1, (text.get_text(), box, frame)
        assert ax.title.get_text().replace("\n", " ") == panel.title  # wrapped, nothing cut
        assert ax.xaxis.label.get_text().replace("\n", " ") == panel.note
    for i, (_, a, box_a) in enumerate(boxes):
        for _, b, box_b in boxes[i + 1:]:
            assert not box_a.overlaps(box_b), (a.get_text(), b.get_text())
    bars = [ax for ax in fig.axes if ax not in pictures]
    for _, text, box in boxes:  # no text runs into a colour bar (its own labels sit beside it)
        for bar in bars:
            if text.axes is not bar:
                assert not box.overlaps(bar.get_window_extent(renderer)), text.get_text()
    assert inside(fig)


def test_hand_charts_label_round_values_on_y_with_grid_lines():
    assert fast.axis_ticks(60.4, 74.7) == [65.0, 70.0]
    assert fast.axis_ticks(8.0, 26.9) == [10.0, 15.0, 20.0, 25.0]
    assert fast.axis_ticks(-0.5, 0.5) == [-0.5, 0.0, 0.5]
    for lo, hi in ((0.013, 0.0171), (-17.9, 5.0), (61.0, 74.1), (1e3, 5e4)):
        ticks = fast.axis_ticks(lo, hi)
        assert 2 <= len(ticks) <= 4 and all(lo <= t <= hi for t in ticks), (lo, hi, ticks)
    t = np.arange(16.0)
    recorded = np.stack([t, 60 + t, 10 + t], axis=1)
    image = render.path_image(recorded, recorded + 1, ("x", "y", "z"), "cm", "hand")
    grid = np.all(image == fast.GRID_RGB, axis=-1)  # pixels of the grid lines
    rows = np.flatnonzero(grid.sum(axis=1) > 100)  # full-width lines across the charts
    assert len(rows) >= 2 * 3 - 2  # at least two per chart (some may share a row)
