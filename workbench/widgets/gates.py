"""Gates: gate / mask values over noise levels, over training steps, and as a map at one step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from workbench.inspect.common import DEFAULT_LEVELS
from workbench.inspect.probes.gates import GatesState
from workbench.inspect.recording.trajectory import Trajectory
from workbench.widgets import render
from workbench.widgets.base import View, button


class Gates(View):
    """Where the composer lets the adapter act.

    Left: the effective adapter weight at each noise level (``gate_statistics``: with a
    ``batch``, ``RMS(composed - base) / RMS(adapter)`` on one noise draw; without, the composer
    probed on its own), with a ``NoiseGated`` band shaded. Middle: the gate values the
    composer's ``GateStatistics`` callback recorded over training (when an experiment is given).
    Right: the effective gate map at a chosen step and frame of ``trajectory``. The logic is
    :class:`workbench.inspect.GatesState` (``self.state``).

    Args:
        source: An experiment (its gate history is plotted) or a :class:`~workbench.ComposedModel`.
        batch: A raw or prepared batch the weights are measured on (None: the composer alone, on probes).
        trajectory: A recorded trajectory whose gate maps the right panel draws.
        levels: The noise levels, in [0, 1].
        index: Which batch element the map shows.
        step: The trajectory's step shown first (default: the middle one of the stored steps).
        history: Gate rows (``gate_history`` columns) to plot instead of the experiment's own.

    Examples:
        >>> view = Gates(exp, batch=raw, trajectory=traj)
    """

    def __init__(self, source: Any, batch: Any = None, trajectory: Trajectory | None = None,
                 levels: Sequence[float] = DEFAULT_LEVELS, index: int = 0, step: int | None = None,
                 history: Any = None):
        super().__init__()
        self.state = GatesState(source, batch=batch, trajectory=trajectory, levels=levels, index=index,
                                step=step, history=history)
        self.add_class("workbench-gates")
        self.recompute_button = button("recompute", "probe the composer again (after more training)",
                                       icon="refresh")
        self.recompute_button.on_click(lambda _: self.recompute())
        rows: list[widgets.Widget] = [self.recompute_button]
        self.step_slider = self.frame_slider = None
        if trajectory is not None:
            state = self.state
            self.step_slider = widgets.SelectionSlider(options=trajectory.stored, value=state.step,
                                                       description="map step", continuous_update=False,
                                                       layout=widgets.Layout(width="320px"))
            self.frame_slider = widgets.IntSlider(value=state.frame, min=0, max=state.frames - 1,
                                                  description="map frame", continuous_update=False,
                                                  layout=widgets.Layout(width="320px"))
            self.step_slider.observe(lambda c: (state.seek(c["new"]), self.refresh()), names="value")
            self.frame_slider.observe(lambda c: (state.set_frame(c["new"]), self.refresh()), names="value")
            rows += [self.step_slider, self.frame_slider]
        self.children = (widgets.HBox(rows), self.image)
        self.refresh()

    @property
    def band(self) -> tuple[float, float] | None:
        return self.state.band

    @property
    def history(self) -> dict[str, np.ndarray] | None:
        return self.state.history

    @property
    def weight(self) -> np.ndarray:
        return self.state.weight

    def recompute(self) -> None:
        """Probe the composer again and re-read the training history."""
        self.state.recompute()
        self.refresh()

    def refresh(self) -> None:
        def draw():
            s = self.state
            self.show(render.gates_figure(s.levels, s.weight, s.history, s.map_panel(), s.band))

        self.timed(draw)

    def summary(self) -> str:
        return self.state.describe()
