"""Condition probe: what ``adapter.view()`` sees, as a table and a small plot per condition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from workbench.core.composed import ComposedModel
from workbench.inspect.probes import condition_plots, condition_table
from workbench.widgets import render
from workbench.widgets.base import View


class ConditionProbe(View):
    """The conditions the adapter receives for ``raw`` (a raw batch or a prepared ``Batch``).

    A table (name, matched key, shape, frame reduction, dropout, value range) and one plot per
    condition for the chosen clip. ``step=k`` shows what training step ``k`` passed (dropout
    included; the adapter must be in train mode for dropout to apply). ``dim_names`` names the
    dimensions of a condition, e.g. ``{"action": ["dx", "dy", "dz", "grip"]}``.

    >>> ConditionProbe(exp.model, raw, dim_names={"action": ["dx", "dy", "dz", "grip"]})
    """

    def __init__(self, model_or_adapter: Any, raw: Any, step: int | None = None,
                 dim_names: Mapping[str, Sequence[str]] | None = None):
        super().__init__()
        self.model, self.raw, self.dim_names = model_or_adapter, raw, dict(dim_names or {})
        adapter = model_or_adapter.adapter if isinstance(model_or_adapter, ComposedModel) else model_or_adapter
        batch_size = _batch_size_of(adapter.view(raw))
        self.index_select = widgets.Dropdown(options=list(range(batch_size)), value=0, description="clip",
                                             layout=widgets.Layout(width="160px"))
        self.step_box = widgets.IntText(value=-1 if step is None else step, description="train step",
                                        tooltip="-1: the sampling view (no dropout); k: what training step k saw",
                                        layout=widgets.Layout(width="200px"))
        self.table = widgets.HTML()
        self.index_select.observe(lambda _: self.refresh(), names="value")
        self.step_box.observe(lambda _: self.refresh(), names="value")
        self.children = (widgets.HBox([self.index_select, self.step_box]), self.table, self.image)
        self.refresh()

    @property
    def step(self) -> int | None:
        return None if self.step_box.value < 0 else int(self.step_box.value)

    @property
    def rows(self) -> list[dict]:
        return condition_table(self.model, self.raw, step=self.step)

    def refresh(self) -> None:
        def draw():
            rows = self.rows
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
