"""Action sensitivity: per action dimension × noise level, with the swap-actions gap, and with a readout how
far the position it reads moves (e.g. the hand, in cm)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from workbench.core.composed import ComposedModel
from workbench.inspect.probes.sensitivity import DEFAULT_LEVELS, ActionSensitivityResult, action_sensitivity
from workbench.widgets import render
from workbench.widgets.base import View, button


class ActionSensitivity(View):
    """How much the adapter output and the x0 estimate move per unit of each action dimension.

    A heatmap (noise level × action dimension) of :func:`workbench.inspect.action_sensitivity`
    for the x0 estimate or the adapter output; with a ``readout`` (e.g. the world-model wing's hand
    probe, ``HandProbe.from_pretrained().readout()``) beside it a second heatmap: how far the
    position the readout finds in the x0 estimate moves per unit of each dimension (cm for the
    hand), with the frozen base alone's in each cell for comparison; and the swap-actions gap: how
    far the prediction moves when each clip gets another clip's actions. ``batch`` needs at least
    two clips. The result (an
    :class:`~workbench.inspect.probes.sensitivity.ActionSensitivityResult`) is ``self.result``.

    Examples:
        >>> view = ActionSensitivity(exp.model, raw, levels=(0.5,), dim_names=["dx", "dy", "dz", "grip"])
    """

    def __init__(self, model: ComposedModel, batch: Any, levels: Sequence[float] = DEFAULT_LEVELS,
                 condition: str = "action", dim_names: Sequence[str] | None = None, eps: float = 0.05,
                 seed: int = 0, quantity: str = "x0", readout: Any = None, readout_eps: float = 0.25,
                 decode: str = "tiny"):
        super().__init__()
        self.model, self.batch, self.levels = model, batch, tuple(levels)
        self.condition, self.dim_names, self.eps, self.seed = condition, dim_names, eps, seed
        self.readout, self.readout_eps, self.decode = readout, readout_eps, decode
        self.add_class("workbench-sensitivity")
        self.quantity_select = widgets.ToggleButtons(options=[("x0 estimate", "x0"),
                                                              ("adapter output", "adapter")],
                                                     value=quantity, style={"button_width": "120px"})
        self.recompute_button = button("recompute", "probe the model again (after more training)",
                                       icon="refresh")
        self.quantity_select.observe(lambda _: self.refresh(), names="value")
        self.recompute_button.on_click(lambda _: self.recompute())
        self.children = (widgets.HBox([self.quantity_select, self.recompute_button]), self.image)
        self.result: ActionSensitivityResult
        self.recompute()

    def recompute(self) -> None:
        self.result = action_sensitivity(self.model, self.batch, levels=self.levels, condition=self.condition,
                                         eps=self.eps, seed=self.seed, readout=self.readout,
                                         readout_eps=self.readout_eps, decode=self.decode)
        self.refresh()

    def refresh(self) -> None:
        r, q = self.result, self.quantity_select.value
        values = r.x0 if q == "x0" else r.adapter
        self.timed(lambda: self.show(render.sensitivity_figure(
            r.levels, values, r.swap_gap, r.adapter_scale, q, self.dim_names, readout=r.readout,
            readout_label=f"{r.readout_name} ({r.readout_unit})" if r.readout_unit else r.readout_name)))

    def summary(self) -> str:
        r = self.result
        names = (list(self.dim_names) if self.dim_names is not None
                 else [f"d{d}" for d in range(r.x0.shape[1])])
        top = int(np.argmax(r.x0.max(axis=0)))
        peak = int(np.argmax(r.swap_gap["x0"]))
        text = (f"x0 sensitivity per unit action, max {float(r.x0.max()):.4f} ({names[top]}); "
                f"swap gap (x0) largest at noise {float(r.levels[peak]):.2f}: "
                f"{float(r.swap_gap['x0'][peak]):.4f}")
        if r.readout is not None:
            moved, base = r.readout["adapter"], r.readout["base"]
            i, d = np.unravel_index(int(np.argmax(moved)), moved.shape)
            unit = f" {r.readout_unit}" if r.readout_unit else ""
            text += (f"; {r.readout_name} moves up to {float(moved[i, d]):.1f}{unit} per unit of {names[d]} "
                     f"(noise {float(r.levels[i]):.2f}), the base alone up to {float(base.max()):.1f}{unit}")
        return text
