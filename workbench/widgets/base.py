"""What every view shares: a static PNG and text summary for pages without a front end."""

from __future__ import annotations

import base64
import time
from typing import Any

import ipywidgets as widgets

from workbench.widgets.render import array_png, figure_png, png_array, stack_images, text_image
from workbench.widgets.static import STATUS_CLASS, plain_lines


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
        self.image = widgets.Image(format="png",
                                   layout=widgets.Layout(align_self="flex-start", max_width="100%"))
        self.last_render_seconds: float | None = None  # logic + drawing of the last picture
        self._handles: list[Any] = []
        self._pending: Any = None  # the latest draw requested and not yet run

    def summary(self) -> str:
        raise NotImplementedError

    def show(self, fig) -> None:
        """Put ``fig`` (a matplotlib Figure) into the image."""
        self.image.value = figure_png(fig)

    def show_array(self, image) -> None:
        """Put a uint8 ``[H, W, 3]`` picture into the image (no figure: what slider moves use)."""
        self.image.value = array_png(image)

    def request(self, draw) -> None:
        """Run ``draw()`` now, or, while the kernel's event loop is serving messages, once they are
        handled: a burst of control changes (a fast drag, a held arrow key) then draws only the
        latest state instead of queueing a picture per change. The picture shown stays until the
        new one replaces it. Displaying the view draws anything still pending first.
        """
        import asyncio

        pending = self._pending is not None
        self._pending = draw
        if pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (scripts, tests, nbconvert): draw at once
            self.flush()
            return
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Draw what :meth:`request` left pending, if anything."""
        draw, self._pending = self._pending, None
        if draw is not None:
            self.timed(draw)

    def timed(self, draw) -> None:
        """Run ``draw()`` (logic + rendering of one picture) and keep its wall time."""
        started = time.perf_counter()
        draw()
        self.last_render_seconds = time.perf_counter() - started

    def settle(self) -> None:
        """Draw what is pending and wait for work the view does in the background (if any), so
        that the picture and the summary describe the current state (what a static page keeps)."""
        self.flush()

    def static_png(self) -> bytes:
        """The PNG a page without a front end shows: the view's status lines (what the live view writes
        beside its controls) above its picture."""
        return with_status(self.status_texts(), self.image.value)

    def status_texts(self, *within: widgets.Widget) -> list[str]:
        """The status lines shown now (of the view, or of the widgets ``within``), as plain text in the
        order they appear."""
        lines: list[str] = []
        stack = list(within or (self,))[::-1]
        while stack:
            widget = stack.pop()
            if isinstance(widget, widgets.HTML) and STATUS_CLASS in widget._dom_classes:
                lines += plain_lines(widget.value)
            elif isinstance(widget, widgets.Box) or widget is self:
                stack += list(widget.children)[::-1]
        return lines

    def __repr__(self) -> str:
        self.settle()
        return f"{type(self).__name__}: {self.summary()}"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        self.settle()
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = repr(self)
        png = self.static_png()
        if png:  # the display protocol carries images as base64 text
            data["image/png"] = base64.b64encode(png).decode("ascii")
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
    # a button keeps its label: in a crowded row the status text wraps, never the button
    return widgets.Button(description=description, tooltip=tooltip or description, icon=icon,
                          layout=widgets.Layout(width=width, flex="0 0 auto", overflow="visible"))


def mark_modified() -> None:
    """Have JupyterLab mark the notebook modified, where it saves widget state (as ``make lab`` sets it up).

    JupyterLab marks a notebook modified when a widget model opens, not when a model's state changes, so a
    picture that changes after the cell ran — work a view finishes in the background — would leave a save
    made meanwhile looking current. Opening (and at once closing) a widget model is that signal; elsewhere
    it does nothing.
    """
    widgets.Widget().close()


def status_line() -> widgets.HTML:
    """A line (or a few) saying what the view shows; a page without a front end gets it in the picture."""
    line = widgets.HTML(layout=widgets.Layout(margin="0 0 0 8px"))
    line.add_class(STATUS_CLASS)
    return line


def with_status(lines: list[str], png: bytes) -> bytes:
    """``png`` with ``lines`` of text above it (``png`` itself when there are none, or no picture)."""
    if not png or not lines:
        return png
    picture = png_array(png)[..., :3]
    return array_png(stack_images([text_image(lines, picture.shape[1]), picture], gap=4))


def status_lines(*lines: str) -> str:
    """HTML of status lines that each stay on one line (a narrow column scrolls rather than breaking
    a phrase in the middle)."""
    return "".join(f"<div style='white-space:nowrap'>{line}</div>" for line in lines if line)
