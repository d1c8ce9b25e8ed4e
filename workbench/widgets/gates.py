"""Gates: gate / mask values over noise levels, over training steps, and as a map at one step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from workbench.core.composed import ComposedModel
from workbench.core.composers import NoiseGated, composer_tree
from workbench.inspect.common import InspectError
from workbench.inspect.probes import DEFAULT_LEVELS, gate_statistics
from workbench.inspect.trajectory import Trajectory
from workbench.inspect.views import find_gate_history, view_image
from workbench.widgets import render
from workbench.widgets.base import View, button


class Gates(View):
    """Where the composer lets the adapter act.

    Left: the effective adapter weight at each noise level (``gate_statistics``: with a
    ``batch``, ``RMS(composed - base) / RMS(adapter)`` on one noise draw; without, the composer
    probed on its own), with a ``NoiseGated`` band shaded. Middle: the gate values the
    composer's ``GateStatistics`` callback recorded over training (when an experiment is given).
    Right: the effective gate map at a chosen step and frame of ``trajectory``. ``history``:
    gate rows (``gate_history`` columns) to plot instead of the experiment's own.

    >>> Gates(exp, batch=raw, trajectory=traj)
    """

    def __init__(self, source: Any, batch: Any = None, trajectory: Trajectory | None = None,
                 levels: Sequence[float] = DEFAULT_LEVELS, index: int = 0, step: int | None = None,
                 history: Any = None):
        super().__init__()
        model = source if isinstance(source, ComposedModel) else getattr(source, "model", None)
        if not isinstance(model, ComposedModel):
            raise InspectError(f"Gates needs an AdapterExperiment or a ComposedModel, got {type(source).__name__}.")
        self.source, self.model, self.batch, self.levels = source, model, batch, tuple(levels)
        self.trajectory, self.index, self._history = trajectory, index, history
        self.add_class("workbench-gates")
        self.recompute_button = button("recompute", "probe the composer again (after more training)", icon="refresh")
        self.recompute_button.on_click(lambda _: self.recompute())
        rows: list[widgets.Widget] = [self.recompute_button]
        self.step_slider = self.frame_slider = None
        if trajectory is not None:
            stored = trajectory.stored
            first = step if step is not None else stored[len(stored) // 2]
            self.step_slider = widgets.SelectionSlider(options=stored, value=trajectory[first].index,
                                                       description="map step", continuous_update=False,
                                                       layout=widgets.Layout(width="320px"))
            frames = len(view_image(trajectory, stored[0], "gate", index=index))
            self.frame_slider = widgets.IntSlider(value=min(1, frames - 1), min=0, max=frames - 1,
                                                  description="map frame", continuous_update=False,
                                                  layout=widgets.Layout(width="320px"))
            self.step_slider.observe(lambda _: self.refresh(), names="value")
            self.frame_slider.observe(lambda _: self.refresh(), names="value")
            rows += [self.step_slider, self.frame_slider]
        self.children = (widgets.HBox(rows), self.image)
        self.recompute()

    @property
    def band(self) -> tuple[float, float] | None:
        gated = [c for c in composer_tree(self.model.composer) if isinstance(c, NoiseGated)]
        return (gated[0].lo, gated[0].hi) if gated else None

    def recompute(self) -> None:
        """Probe the composer again and re-read the training history."""
        self.rows = gate_statistics(self.model, self.levels, batch=self.batch)
        self.history = self._history if self._history is not None else find_gate_history(self.source)
        self.refresh()

    @property
    def weight(self) -> np.ndarray:
        column = "weight" if "weight" in self.rows[0] else "weight_mean"
        return np.array([r.get(column, np.nan) for r in self.rows], dtype=np.float64)

    def refresh(self) -> None:
        def draw():
            panel = None
            if self.trajectory is not None:
                image = view_image(self.trajectory, self.step_slider.value, "gate", index=self.index)
                frame = min(self.frame_slider.value, len(image) - 1)
                panel = image.frame(frame)
                rec = self.trajectory[self.step_slider.value]
                panel.title = (f"gate map · step {rec.index} of {rec.steps}\nnoise level "
                               f"{float(rec.noise_level[0]):.2f} · {image.frame_name(frame)}")
            self.show(render.gates_figure(self.levels, self.weight, self.history, panel, self.band))

        self.timed(draw)

    def summary(self) -> str:
        weights = ", ".join(f"{lv:.1f}: {w:.3f}" for lv, w in zip(self.levels, self.weight))
        gates = ", ".join(f"{k}={v:.4f}" for k, v in self.model.composer.gate_values().items()) or "no gate"
        where = ""
        if self.trajectory is not None:
            where = f"; map at step {self.step_slider.value}, frame {self.frame_slider.value}"
        return f"adapter weight by noise level {{{weights}}}; {gates}{where}"
