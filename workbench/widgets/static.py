"""What a saved notebook keeps of a view: its picture and its text, not the live widget.

A view (:class:`workbench.widgets.base.View`) displays as a live widget, a PNG (its picture with the
status lines the live view writes beside its controls) and a text line. A widget lives only in its
kernel; reopened without it, a notebook can show the widget only from widget state saved in the file,
and JupyterLab marks such a notebook modified as soon as it restores that state (each restored widget
model sets the "dirty" flag). Kept static instead, a reopened notebook shows each view's picture as it
was when saved and is not modified by opening it; running the cell brings the live widget back.

:func:`keep_static` does that to a notebook; :func:`keep_static_on_save` is the same as a Jupyter server
pre-save hook, which ``make lab`` installs (``--ContentsManager.pre_save_hook``) with widget state saving
on: the notebook open in the browser keeps its live widgets, the file on disk gets their pictures.
"""

from __future__ import annotations

from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HOOK = "workbench.widgets.static.keep_static_on_save"  # the import string a Jupyter server is given


def keep_static(notebook: Any) -> int:
    """Turn every widget view that has a static picture beside it (a view's output) into that picture, in
    ``notebook`` (a dict or ``nbformat`` node, changed in place); other widgets stay as they are.

    With the notebook's saved widget state (JupyterLab writes it at each save when "Save Widget State
    Automatically" is on), a view's picture is made anew from the state its widgets are in now — its status
    lines and pictures in the order the live view shows them — rather than kept as it was when the cell
    ran, and its text line becomes those status lines. The widget state then goes too, unless a widget
    that is not a view needs it. Returns how many views were turned into pictures.
    """
    saved = (notebook.get("metadata") or {}).get("widgets") or {}
    state = (saved.get(STATE) or {}).get("state") or {}
    dropped, live = 0, 0
    for cell in notebook.get("cells", ()):
        for output in cell.get("outputs", ()) or ():
            data = output.get("data") or {}
            if WIDGET_VIEW not in data:
                continue
            if "image/png" not in data:
                live += 1
                continue
            model = (data[WIDGET_VIEW] or {}).get("model_id", "")
            parts = _parts(state, model) if model in state else []
            if any(kind == "image" for kind, _ in parts):
                data["image/png"], lines = _picture(parts)
                name = "".join(data.get("text/plain", "")).split(": ", 1)[0]
                if lines and name:
                    data["text/plain"] = f"{name}: " + "; ".join(lines)
            del data[WIDGET_VIEW]
            dropped += 1
    if dropped and not live and saved:
        notebook["metadata"].pop("widgets", None)  # nothing left to restore: reopening changes nothing
    return dropped


STATE = "application/vnd.jupyter.widget-state+json"
# the class of a view's status lines (``workbench.widgets.base.status_line``)
STATUS_CLASS = "workbench-status"
# the class of a picture that no longer matches the view's controls (the ablation's final picture while an
# edit is carried through): shown faded, and left out of what a save keeps (it would mix two edits)
STALE_CLASS = "workbench-stale"


def plain_lines(markup: str) -> list[str]:
    """The text of a status line's HTML, one string per ``<div>`` / ``<br>`` line, tags dropped."""
    import html
    import re

    text = re.sub(r"(?i)<br\s*/?>|</div>", "\n", markup)
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return [" ".join(line.split()) for line in text.split("\n") if line.strip()]


def _parts(state: dict, model: str) -> list[tuple[str, Any]]:
    """The status lines (``("text", [line, ...])``) and pictures (``("image", png bytes)``) of the widget
    ``model`` and its children, in the order they are shown; a picture marked stale is left out."""
    import base64

    parts: list[tuple[str, Any]] = []
    stack, seen = [model], set()
    while stack:
        key = stack.pop()
        entry = state.get(key)
        if entry is None or key in seen:
            continue
        seen.add(key)
        values = entry.get("state") or {}
        name = entry.get("model_name", "")
        if name == "HTMLModel" and STATUS_CLASS in (values.get("_dom_classes") or ()):
            lines = plain_lines(values.get("value", ""))
            if lines:
                parts.append(("text", lines))
        elif name == "ImageModel" and STALE_CLASS not in (values.get("_dom_classes") or ()):
            buffers = {tuple(b.get("path", ())): b for b in entry.get("buffers", ())}
            value = buffers.get(("value",))
            if value is not None and value.get("encoding") == "base64" and value.get("data"):
                parts.append(("image", base64.b64decode(value["data"])))
        children = [c.removeprefix("IPY_MODEL_") for c in values.get("children", ()) if isinstance(c, str)]
        stack += children[::-1]
    return parts


def _picture(parts: list[tuple[str, Any]]) -> tuple[str, list[str]]:
    """The parts stacked as one PNG (base64 text, as a notebook stores it) and every status line."""
    import base64

    from workbench.widgets.panels import array_png, png_array, stack_images, text_image

    images = [png_array(png)[..., :3] for kind, png in parts if kind == "image"]
    width = max(im.shape[1] for im in images)
    rows, lines = [], []
    for kind, value in parts:
        if kind == "text":
            rows.append(text_image(value, width))
            lines += value
        else:
            rows.append(png_array(value)[..., :3])
    return base64.b64encode(array_png(stack_images(rows, gap=6))).decode("ascii"), lines


def keep_static_on_save(model: dict, **_: Any) -> None:
    """A Jupyter server pre-save hook (``ContentsManager.pre_save_hook``): a notebook is written with its
    views as pictures of their current state (:func:`keep_static`)."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        keep_static(model["content"])


__all__ = ["HOOK", "STALE_CLASS", "STATE", "STATUS_CLASS", "WIDGET_VIEW", "keep_static",
           "keep_static_on_save", "plain_lines"]
