"""Ablation sliders: one slider per condition dimension, re-rendering the prediction at a step."""

from __future__ import annotations

import time
from collections.abc import Sequence

import ipywidgets as widgets

from workbench.inspect.ablation import Ablation
from workbench.inspect.trajectory import Trajectory
from workbench.widgets import render
from workbench.widgets.base import View, status_line
from workbench.widgets.controls import ConditionSliders


class AblationSliders(View):
    """Slide each dimension of ``condition`` (e.g. the 4 action dimensions, on every frame or on
    one frame) and see the x0 estimate at a chosen step: recorded | edited | edited − recorded.

    A slider move re-runs only the adapter and the composer: the base output recorded at that
    step is reused (:meth:`Trajectory.recompose`). The logic is
    :class:`workbench.inspect.Ablation` (``self.state``).

    >>> AblationSliders(traj, step=10, dim_names=["dx", "dy", "dz", "grip"])
    """

    def __init__(self, trajectory: Trajectory, step: int | None = None, condition: str = "action", index: int = 0,
                 dim_names: Sequence[str] | None = None, decode: str = "preview", frame: int | None = None):
        super().__init__()
        self.state = Ablation(trajectory, step=step, condition=condition, index=index, decode=decode,
                              dim_names=dim_names)
        steps = trajectory.stored
        self.add_class("workbench-ablation")
        self.image.add_class("workbench-ablation-image")
        self.step_slider = widgets.SelectionSlider(options=steps, value=self.state.step, description="step",
                                                   continuous_update=False, layout=widgets.Layout(width="340px"))
        frames = len(self.state.images()[0])
        first = frame if frame is not None else frames - 1  # the last frame: where actions have acted longest
        self.frame_slider = widgets.IntSlider(value=first, min=0, max=frames - 1, description="frame",
                                              continuous_update=False, layout=widgets.Layout(width="340px"))
        self.sliders = ConditionSliders(self.state.edit, index=index, on_change=self.refresh)
        self.status = status_line()
        self.status.add_class("workbench-ablation-status")
        self.step_slider.observe(lambda c: (self.state.seek(c["new"]), self.refresh()), names="value")
        self.frame_slider.observe(lambda _: self.refresh(), names="value")
        controls = widgets.VBox([self.step_slider, self.frame_slider, self.sliders])
        self.children = (widgets.HBox([controls, self.status]), self.image)
        self.refresh()

    def refresh(self) -> None:
        """Redraw for the current sliders; a burst of moves draws only the last (see :meth:`request`)."""
        def draw():
            started = time.perf_counter()
            panels, caption = self.state.panels(self.frame_slider.value)
            self.show_array(render.panels_image(panels, title=caption))
            edited = ", ".join(self.state.describe_edits()) or "nothing"
            self.status.value = (f"x0 change (RMS, latent units): <b>{self.state.change():.4f}</b><br>"
                                 f"edited: {edited}<br>re-rendered in {1000 * (time.perf_counter() - started):.0f} ms"
                                 + ("" if self.state.trajectory.model.adapter.reuses_base_output else
                                    "<br>slower path: each edit re-runs the base (the adapter works inside it)"))

        self.request(draw)

    def summary(self) -> str:
        return f"{self.state.describe()}, frame {self.frame_slider.value}"
