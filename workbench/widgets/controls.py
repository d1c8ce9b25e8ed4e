"""Controls shared by views: sliders that edit a condition."""

from __future__ import annotations

import math
from collections.abc import Callable

import ipywidgets as widgets

from workbench.inspect.probes.ablation import ConditionEdit
from workbench.widgets.base import button

ALL_FRAMES = -1


class ConditionSliders(widgets.VBox):
    """One slider per dimension of a :class:`ConditionEdit`, labelled by its ``names``, on every frame
    or on one frame.

    Moving a slider sets that dimension (for every clip) and calls ``on_change()``. Choosing
    another frame in "apply to" shows that frame's values without editing anything; "reset"
    restores the original values.
    """

    def __init__(self, edit: ConditionEdit, index: int = 0, on_change: Callable[[], None] | None = None,
                 step: float = 0.05):
        super().__init__()
        self.edit, self.index, self.on_change = edit, index, on_change
        options = [("all frames", ALL_FRAMES)]
        if edit.frames is not None:
            options += [(f"frame {t}", t) for t in range(edit.frames)]
        self.frame_select = widgets.Dropdown(options=options, value=ALL_FRAMES, description="apply to",
                                             layout=widgets.Layout(width="220px"))
        lo = min(-1.0, math.floor(float(edit.original.min())))
        hi = max(1.0, math.ceil(float(edit.original.max())))
        self.sliders = [
            widgets.FloatSlider(value=edit.get(d, None, index), min=lo, max=hi, step=step, description=name,
                                continuous_update=False, readout_format="+.2f",
                                layout=widgets.Layout(width="340px"))
            for d, name in enumerate(edit.names)
        ]
        for d, slider in enumerate(self.sliders):
            slider.add_class("workbench-condition-slider")
            slider.observe(lambda change, d=d: self._moved(d, change["new"]), names="value")
        self.note = widgets.HTML(layout=widgets.Layout(margin="0 0 0 8px"))
        varying = edit.varying(index)
        if varying:  # "all frames" shows the mean: say that a move replaces the sequence
            ranges = ", ".join(f"{name} {lo:+.2f}…{hi:+.2f}" for name, (lo, hi) in varying.items())
            self.note.value = (f"<small>recorded values vary over frames ({ranges}); "
                               f"on all frames the sliders show the mean, "
                               f"and moving one sets every frame to its value</small>")
        self.reset_button = button("reset", "back to the recorded values", icon="undo")
        self.reset_button.on_click(lambda _: self.reset())
        self.frame_select.observe(lambda _: self._sync(), names="value")
        self._syncing = False
        self.children = (widgets.HBox([self.frame_select, self.reset_button]), self.note, *self.sliders)

    @property
    def frame(self) -> int | None:
        return None if self.frame_select.value == ALL_FRAMES else int(self.frame_select.value)

    def _moved(self, dim: int, value: float) -> None:
        if self._syncing:
            return
        self.edit.set(dim, value, self.frame)
        if self.on_change is not None:
            self.on_change()

    def _sync(self) -> None:
        """Show the current values (of the chosen frame) without editing."""
        self._syncing = True
        try:
            for d, slider in enumerate(self.sliders):
                slider.value = self.edit.get(d, self.frame, self.index)
        finally:
            self._syncing = False

    def reset(self) -> None:
        self.edit.reset()
        self._sync()
        if self.on_change is not None:
            self.on_change()
