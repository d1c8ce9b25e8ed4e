"""The figures and printed lines of the stored notebooks as a reader sees them in JupyterLab: printed
lines short enough not to wrap in the middle of a word, and notebook 5's action-error figure (its
own code, run here on made-up numbers) at a notebook's width, in cm, with a legend that covers no
curve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# JupyterLab breaks a printed line that is wider than the output area anywhere, mid-word included; this many
# characters of its monospace font fit a notebook beside the file browser on a 1400 px screen (the JupyterLab
# test, tests/test_widgets_lab.py, prints such a line and checks that it stays one line high)
PRINTED_WIDTH = 114


def code_cells(name: str) -> list[dict]:
    return [c for c in json.loads((NOTEBOOKS / name).read_text())["cells"] if c["cell_type"] == "code"]


def long_lines(cells: list[dict]) -> list[tuple[int, str]]:
    return [(i, line) for i, cell in enumerate(cells) for o in cell.get("outputs", ())
            if o.get("output_type") == "stream" for line in "".join(o["text"]).splitlines()
            if len(line) > PRINTED_WIDTH]


def test_printed_lines_fit_the_output_area():
    assert not long_lines(code_cells("02_step_through.ipynb"))  # its forks' results once ran to 168 characters
    figure = [c for c in code_cells("05_world_model_on_metaworld.ipynb")
              if "".join(c["source"]).startswith('err = result["hand_error"]')]
    assert len(figure) == 1 and not long_lines(figure)


def figure_cell() -> str:
    """Notebook 5's figure of the action error per frame and the reach clip's hand, x / y / z."""
    (source,) = ["".join(c["source"]) for c in code_cells("05_world_model_on_metaworld.ipynb")
                 if "".join(c["source"]).startswith('err = result["hand_error"]')]
    return source


class Probe:
    """Stands in for the shipped hand probe: positions in metres, as it reads them."""

    def positions(self, video: np.ndarray) -> np.ndarray:
        t = np.arange(len(video), dtype=np.float64)[:, None]
        return np.array([-0.15, 0.6, 0.1]) + 0.01 * t * np.array([1.0, 1.2, 0.8])


def test_the_action_error_figure_is_in_cm_at_a_notebook_width_with_its_legend_off_the_curves():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rng = np.random.default_rng(0)
    names = {"base": "(a) base alone", "adapter": "(b) adapter, true actions", "swapped": "(c) adapter, swapped"}
    result = {"hand_error": {k: rng.uniform(1, 20, (6, 16)) for k in ("truth", *names)},
              "scores": {k: {"action_error": rng.uniform(1, 20, 6)} for k in names}, "probe_error": np.ones(6),
              **{k: rng.integers(0, 255, (6, 16, 8, 8, 3)) for k in ("truth", *names)}}
    val = {9: {"ee_pos": Probe().positions(np.zeros((16, 1)))}}
    scope = {"np": np, "plt": plt, "result": result, "names": names, "val": val, "shipped_probe": Probe}
    plt.close("all")
    exec(compile(figure_cell(), "notebook 5, the action error figure", "exec"), scope)  # noqa: S102
    fig = scope["fig"]
    try:
        assert fig.get_figwidth() <= 10.0  # drawn at the output area's width (~1000 px), not shrunk to it
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        axes = [ax for ax in fig.axes]
        assert len(axes) == 4
        units = [ax.get_ylabel() for ax in axes] + [ax.get_title() for ax in axes]
        assert all("(m)" not in u for u in units) and all(ax.get_ylabel().endswith("(cm)") for ax in axes)
        # the hand is drawn in cm: the stand-in probe reads -0.15 m along x at frame 0
        assert axes[1].lines[1].get_ydata()[0] == pytest.approx(100 * Probe().positions(np.zeros((1, 1)))[0, 0])
        legends = [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend() is not None)]
        assert len(legends) == 1
        box = legends[0].get_window_extent(renderer)
        for ax in axes:  # the legend lies outside every plot: it covers no curve at any frame
            assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
        assert box.y0 >= 0 and box.y1 <= fig.bbox.height and box.x0 >= 0 and box.x1 <= fig.bbox.width
        assert min(t.get_fontsize() for t in legends[0].get_texts()) >= 9  # legible at the notebook's width
    finally:
        plt.close("all")


def test_notebook_10_says_what_its_charts_show_and_names_each_policy_one_way():
    """Its text is printed from the numbers its charts show, never typed (a typed ρ went stale against the chart
    once); each ρ comes with what it means; a policy has one name in every table and figure."""
    import re

    cells = json.loads((NOTEBOOKS / "10_policies_in_imagination.ipynb").read_text())["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert not re.search(r"[+−-]0\.\d\d", markdown)  # no ρ typed into the text
    assert "0 when the two orders have nothing to do with each other" in markdown and "−1: exactly reversed" in markdown
    code = [c for c in cells if c["cell_type"] == "code"]
    printed = ["".join(o["text"]) for c in code for o in c.get("outputs", ()) if o.get("output_type") == "stream"]
    closing = next(text for text in printed if "one swap of two neighbours" in text)
    bins = [(0.8, "close to the simulator's order"), (0.3, "partly the simulator's order"),
            (-0.3 + 1e-9, "no clear relation to the simulator's order"), (-2, "tends to reverse the simulator's order")]
    readings = re.findall(r"ρ ([+-]\d\.\d\d): (.+)", closing)
    assert len(readings) == 6  # three models, two tasks
    for rho, words in readings:  # each reading is the one its number calls for
        assert words == next(text for floor, text in bins if float(rho) >= floor), (rho, words)
    # one swap among 6 policies: sum of squared rank differences 2, rho = 1 - 6 * 2 / (6 * (6 ** 2 - 1))
    assert "moves ρ by 0.06 (from 1 to 0.94)" in closing
    assert not long_lines(code)  # and it stays on the lines it prints
    sources = "\n".join("".join(c["source"]) for c in code)
    assert sources.count("expert+") == 1 and sources.count("named(p)") == 3  # one naming, in the table and both figures
    assert "σ 0.1" in printed[0] and all("+noise" not in text for text in printed)
