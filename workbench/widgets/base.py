"""What every view shares: a static PNG and text summary for pages without a front end."""

from __future__ import annotations

import base64
import time
from typing import Any

import ipywidgets as widgets

from workbench.widgets.render import figure_png


class View(widgets.VBox):
    """An ``ipywidgets.VBox`` that also displays as a PNG and a one-line summary.

    Subclasses build their controls, put their current picture in ``self.image`` with
    :meth:`show`, and say what they show in :meth:`summary`. Where no front end renders
    widgets (nbconvert, nbval, a notebook viewer) the PNG and the summary are what a reader
    sees; a live front end shows the widget itself. :meth:`refresh_display` brings outputs
    already displayed up to date (used when a background run ends).
    """

    def __init__(self, children: tuple = (), **kwargs: Any):
        super().__init__(children=children, **kwargs)
        # natural size (not stretched to the container's width), shrunk only if it would not fit
        self.image = widgets.Image(format="png", layout=widgets.Layout(align_self="flex-start", max_width="100%"))
        self.last_render_seconds: float | None = None  # logic + drawing of the last picture
        self._handles: list[Any] = []

    def summary(self) -> str:
        raise NotImplementedError

    def show(self, fig) -> None:
        """Put ``fig`` (a matplotlib Figure) into the image."""
        self.image.value = figure_png(fig)

    def timed(self, draw) -> None:
        """Run ``draw()`` (logic + rendering of one picture) and keep its wall time."""
        started = time.perf_counter()
        draw()
        self.last_render_seconds = time.perf_counter() - started

    def __repr__(self) -> str:
        return f"{type(self).__name__}: {self.summary()}"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = repr(self)
        if self.image.value:  # the display protocol carries images as base64 text
            data["image/png"] = base64.b64encode(self.image.value).decode("ascii")
        return data

    def _ipython_display_(self) -> None:
        from IPython.display import display

        self._handles.append(display(self._repr_mimebundle_(), raw=True, display_id=True))

    def refresh_display(self) -> None:
        """Replace every output where this view was displayed with its current PNG and summary."""
        bundle = self._repr_mimebundle_()
        for handle in self._handles:
            handle.update(bundle, raw=True)


def button(description: str, tooltip: str = "", icon: str = "", width: str = "auto") -> widgets.Button:
    return widgets.Button(description=description, tooltip=tooltip or description, icon=icon,
                          layout=widgets.Layout(width=width))


def status_line() -> widgets.HTML:
    return widgets.HTML(layout=widgets.Layout(margin="0 0 0 8px"))
