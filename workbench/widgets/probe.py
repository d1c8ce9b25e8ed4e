"""Condition probe: what ``adapter.view()`` sees, as a table and a small plot per condition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from workbench.core.composed import ComposedModel
from workbench.inspect.probes.sensitivity import condition_plots, condition_table
from workbench.widgets import render
from workbench.widgets.base import View


class ConditionProbe(View):
    """The conditions the adapter receives for ``raw`` (a raw batch or a prepared ``Batch``).

    A table (name, matched key, shape, frame reduction, dropout, value range) and one plot per
    condition for the chosen clip.

    Args:
        model_or_adapter: A :class:`~workbench.ComposedModel` (images decoded by its backbone) or an adapter.
        raw: A raw batch or a prepared ``Batch``.
        step: Show what training step ``k`` passed (dropout included; the adapter must be in train mode
            for dropout to apply).
        dim_names: Names of the dimensions of a condition, e.g. ``{"action": ["dx", "dy", "dz", "grip"]}``.

    Examples:
        >>> view = ConditionProbe(exp.model, raw, dim_names={"action": ["dx", "dy", "dz", "grip"]})
    """

    def __init__(self, model_or_adapter: Any, raw: Any, step: int | None = None,
                 dim_names: Mapping[str, Sequence[str]] | None = None):
        super().__init__()
        self.model, self.raw, self.dim_names = model_or_adapter, raw, dict(dim_names or {})
        adapter = (model_or_adapter.adapter if isinstance(model_or_adapter, ComposedModel)
                   else model_or_adapter)
        batch_size = _batch_size_of(adapter.view(raw))
        self.index_select = widgets.Dropdown(options=list(range(batch_size)), value=0, description="clip",
                                             layout=widgets.Layout(width="160px"))
        self.when_select = widgets.ToggleButtons(options=[("as sampled", "sampling"),
                                                          ("as in training", "training")],
                                                 value="sampling" if step is None else "training",
                                                 tooltips=["what sampling passes: no condition dropout",
                                                           "what training step k passed, "
                                                           "its dropout included"],
                                                 style={"button_width": "110px"})
        self.step_box = widgets.BoundedIntText(value=0 if step is None else int(step), min=0, max=10**9,
                                               description="step", layout=widgets.Layout(width="150px"))
        self.note = widgets.HTML()
        self.table = widgets.HTML()
        self.index_select.observe(lambda _: self.refresh(), names="value")
        self.when_select.observe(lambda _: self.refresh(), names="value")
        self.step_box.observe(lambda _: self._step_typed(), names="value")
        self.children = (widgets.HBox([self.index_select, self.when_select, self.step_box]), self.note,
                         self.table, self.image)
        self.refresh()

    @property
    def step(self) -> int | None:
        """The training step whose view is shown, or ``None`` for the sampling view."""
        return int(self.step_box.value) if self.when_select.value == "training" else None

    def _step_typed(self) -> None:
        if self.when_select.value == "training":
            self.refresh()
        else:  # a step typed in means training's view
            self.when_select.value = "training"

    @property
    def rows(self) -> list[dict]:
        return condition_table(self.model, self.raw, step=self.step)

    def _note(self) -> str:
        adapter = self.model.adapter if isinstance(self.model, ComposedModel) else self.model
        if self.step is None:
            return "<small>as sampling passes the conditions: no dropout</small>"
        if not adapter.training:
            return (f"<small>training step {self.step}: the adapter is in eval mode, so no dropout applies; "
                    f"<code>model.train()</code> shows what step {self.step} dropped</small>")
        return f"<small>exactly what training step {self.step} passed, its condition dropout included</small>"

    def refresh(self) -> None:
        def draw():
            rows = self.rows
            self.note.value = self._note()
            self.table.value = render.condition_table_html(rows)
            plots = condition_plots(self.model, self.raw, step=self.step, index=self.index_select.value)
            self.show(render.condition_figure(plots, self.dim_names))

        self.timed(draw)

    def summary(self) -> str:
        return "what the adapter sees\n" + render.condition_table_text(self.rows)


def _batch_size_of(view) -> int:
    for value in view.declared.values():
        if hasattr(value, "shape") and len(value.shape):
            return int(value.shape[0])
    return 1
