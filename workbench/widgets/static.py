"""What a saved notebook keeps of a view: its picture and its text, not the live widget.

A view (:class:`workbench.widgets.base.View`) displays as a live widget, a PNG (its picture with the
status lines the live view writes beside its controls) and a text line. A widget lives only in its
kernel; reopened without it, a notebook can show the widget only from widget state saved in the file,
and JupyterLab marks such a notebook modified as soon as it restores that state (each restored widget
model sets the "dirty" flag). Kept static instead, a reopened notebook shows each view's PNG and is not
modified by opening it; running the cell brings the live widget back.

:func:`keep_static` does that to a notebook; :func:`keep_static_on_save` is the same as a Jupyter server
pre-save hook, which ``make lab`` installs (``--ContentsManager.pre_save_hook``): the notebook open in
the browser keeps its live widgets, the file on disk gets the pictures. This module imports nothing
heavy (the server imports it).
"""

from __future__ import annotations

from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HOOK = "workbench.widgets.static.keep_static_on_save"  # the import string a Jupyter server is given


def keep_static(notebook: Any) -> int:
    """Drop every widget view that has a static picture beside it (a view's output) from ``notebook``'s
    outputs (a notebook as a dict or ``nbformat`` node, changed in place); other widgets stay as they are.
    Returns how many were dropped."""
    dropped = 0
    for cell in notebook.get("cells", ()):
        for output in cell.get("outputs", ()) or ():
            data = output.get("data") or {}
            if WIDGET_VIEW in data and "image/png" in data:
                del data[WIDGET_VIEW]
                dropped += 1
    return dropped


def keep_static_on_save(model: dict, **_: Any) -> None:
    """A Jupyter server pre-save hook (``ContentsManager.pre_save_hook``): a notebook is written with its
    views as pictures (:func:`keep_static`)."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        keep_static(model["content"])


__all__ = ["HOOK", "WIDGET_VIEW", "keep_static", "keep_static_on_save"]
