"""Drive: play the world model by hand, one chunk per key press."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import numpy as np

from workbench.core.composed import ComposedModel
from workbench.inspect.drive import KEY_HELP, KEYS, DriveState
from workbench.widgets import render
from workbench.widgets.base import View, button, status_line, status_lines

#: Frames of the newest chunk shown beside the start frame.
SHOWN_FRAMES = 4
SCALE = 3  # a 64-pixel frame drawn at 192 pixels
# the path: earlier chunks blue, the newest orange (the arm itself is red)
PAST_RGB, NEW_RGB, TEXT_RGB = (31, 119, 180), (255, 160, 0), (40, 40, 40)

_KEYPAD_ESM = """
function render({ model, el }) {
  const pad = document.createElement("div");
  pad.tabIndex = 0;
  pad.className = "workbench-drive-keys";
  // JupyterLab: the arrow keys drive, not the notebook
  pad.setAttribute("data-lm-suppress-shortcuts", "true");
  const label = () => { pad.textContent = model.get("label"); };
  label();
  model.on("change:label", label);
  pad.addEventListener("keydown", (event) => {
    if (!model.get("driving_keys").includes(event.key)) return;
    event.preventDefault();
    event.stopPropagation();
    model.send({ key: event.key });
  });
  pad.addEventListener("focus", () => pad.classList.add("workbench-drive-keys-focused"));
  pad.addEventListener("blur", () => pad.classList.remove("workbench-drive-keys-focused"));
  el.appendChild(pad);
}
export default { render };
"""

_KEYPAD_CSS = """
.workbench-drive-keys { padding: 6px 12px; border: 2px dashed #999; border-radius: 6px; cursor: pointer;
  white-space: nowrap; user-select: none; font-size: 13px; }
.workbench-drive-keys-focused { border: 2px solid #b2182b; background: #fdf1f1; outline: none; }
"""


def _keypad_class():
    import anywidget
    import traitlets

    class KeyPad(anywidget.AnyWidget):
        """A field that takes the keyboard while focused and sends each driving key to the kernel."""

        _esm = _KEYPAD_ESM
        _css = _KEYPAD_CSS
        label = traitlets.Unicode("click here, then drive with the arrow keys").tag(sync=True)
        driving_keys = traitlets.List(traitlets.Unicode(), default_value=list(KEYS)).tag(sync=True)

    return KeyPad


class Drive(View):
    """Drive the world model ``model`` (a ComposedModel: an experiment's is ``exp.model``) from the first
    frame of ``start``.

    Each driving key (click the key field first: ← → dx, ↑ ↓ dy, PageUp / PageDown dz, c / o the
    gripper, . hold still) sets the next chunk's action and predicts the chunk; the action sliders set
    it too, and "step" predicts a chunk with their values. The picture shows the start frame and
    frames of the newest chunk (the backbone's full decoder: a rollout decodes each chunk anyway,
    since the next chunk continues from its last frame), with the path (``readout``, by default
    the state reader's own: with ``state="probe"`` the hand the probe reads, in cm) drawn over them, and
    the path per axis below with the chunk boundaries. ``state`` is where a chunk's state comes from,
    as :func:`workbench.inspect.rollout` takes it. "undo" drops the last chunk, "branch" forks the
    episode at the chosen chunk with the current action (the old line is kept: "switch" goes back),
    "save" writes the driven episode as a clip file that :class:`workbench.data.metaworld.MetaWorldClips`
    reads, "open in the Stepper" steps through the chosen chunk's sampling run. The status line says how many
    sampling steps a chunk takes and what the last one cost (wall and CPU time).
    The logic is :class:`workbench.inspect.drive.DriveState` (``self.state``).

    Examples:
        >>> view = Drive(model, start=val[0], steps=4, state="probe")  # opens on a first chunk, hand still
        >>> view.key("ArrowRight")                        # what a key press does: one chunk with dx = +1
        >>> view.state.chunks, view.state.frames
        (2, 31)
    """

    def __init__(self, model: ComposedModel, start: Mapping[str, Any], steps: int = 8, seed: int = 0,
                 readout: Any = "state", speed: float = 1.0, gate_scale: float | None = None,
                 state: Any = None, dim_names: Sequence[str] | None = None,
                 save_path: str | Path = "outputs/driven.h5", first_chunk: bool = True):
        super().__init__()
        self.state = DriveState(model, start, steps=steps, seed=seed, readout=readout, speed=speed,
                                state=state, gate_scale=gate_scale, dim_names=dim_names)
        self.add_class("workbench-drive")
        self.image.add_class("workbench-drive-image")
        self.last_latency_s: float | None = None  # key press (or button) to picture, in the kernel
        self.last_action = ""  # what that was: "key ArrowRight", "step", "undo", "branch", "switch"
        try:
            self.keypad: widgets.Widget | None = _keypad_class()()
            self.keypad.on_msg(lambda _, content, __: self.key(content.get("key", "")))
            self.keypad.add_class("workbench-drive-keypad")
        except ImportError:  # anywidget missing: the sliders and buttons still drive
            self.keypad = None
        self.sliders = [widgets.FloatSlider(value=0.0, min=-1.0, max=1.0, step=0.05, description=name,
                                            continuous_update=False, readout_format="+.2f",
                                            layout=widgets.Layout(width="300px"))
                        for name in self.state.dim_names]
        for d, slider in enumerate(self.sliders):
            slider.add_class("workbench-drive-slider")
            slider.observe(lambda change, d=d: self._slid(d, change["new"]), names="value")
        self._syncing = False
        self.step_button = button("step", "predict one chunk with the sliders' action", icon="play")
        self.undo_button = button("undo", "drop the last chunk", icon="undo")
        self.chunk_select = widgets.Dropdown(options=[("chunk 0", 0)], value=0, description="chunk",
                                             layout=widgets.Layout(width="170px"))
        self.branch_button = button("branch", "fork the episode at this chunk with the current action "
                                              "(the old line is kept)", icon="code-fork")
        self.switch_select = widgets.Dropdown(options=[("(no other line)", -1)], value=-1,
                                              layout=widgets.Layout(width="200px"))
        self.switch_button = button("switch", "drive on from the line chosen", icon="exchange")
        self.stepper_button = button("open in the Stepper", "step through this chunk's sampling run",
                                     icon="search")
        self.save_path = widgets.Text(value=str(save_path), description="file",
                                      layout=widgets.Layout(width="320px"))
        self.save_button = button("save", "write the driven episode as a clip file "
                                          "(HDF5, MetaWorldClips reads it)", icon="download")
        self.status = status_line()
        self.status.add_class("workbench-drive-status")
        self.tool_status = status_line()
        self.stepper_box = widgets.VBox()
        self.step_button.on_click(lambda _: self.step())
        self.undo_button.on_click(lambda _: self.undo())
        self.branch_button.on_click(lambda _: self.branch())
        self.switch_button.on_click(lambda _: self.switch())
        self.stepper_button.on_click(lambda _: self.open_stepper())
        self.save_button.on_click(lambda _: self.save())
        keys = [self.keypad] if self.keypad is not None else [
            widgets.HTML("<i>keyboard: install anywidget (the widgets extra); "
                         "the sliders and step drive</i>")]
        help_line = widgets.HTML(f"<small>{html.escape(KEY_HELP)}</small>")
        self.children = (
            widgets.HBox([*keys, self.step_button, self.undo_button, self.status]),
            help_line,
            widgets.HBox([widgets.VBox(self.sliders[:2]), widgets.VBox(self.sliders[2:])]),
            self.image,
            widgets.HBox([self.chunk_select, self.branch_button, self.stepper_button, self.switch_select,
                          self.switch_button]),
            widgets.HBox([self.save_path, self.save_button, self.tool_status]),
            self.stepper_box,
        )
        if first_chunk:
            self.step()
        else:
            self.refresh()

    # -- driving ----------------------------------------------------------------------------------
    def key(self, key: str) -> None:
        """What a key press in the key field does: set the action it means and predict one chunk."""
        if key not in KEYS:
            return
        started = time.perf_counter()
        self.state.press(key)
        self._sync_sliders()
        self._step(started, f"key {key}")

    def _slid(self, dim: int, value: float) -> None:
        if self._syncing:
            return
        action = self.state.action.copy()
        action[dim] = value
        self.state.set_action(action)
        self.refresh()

    def _sync_sliders(self) -> None:
        self._syncing = True
        try:
            for slider, value in zip(self.sliders, self.state.action):
                slider.value = round(float(value), 2)
        finally:
            self._syncing = False

    def step(self, action: Sequence[float] | None = None) -> None:
        """Predict one chunk with ``action`` (default: the sliders' values)."""
        started = time.perf_counter()
        if action is not None:
            self.state.set_action(action)
            self._sync_sliders()
        self._step(started, "step")

    def _step(self, started: float, what: str) -> None:
        try:
            self.state.step()
        except Exception as err:
            self.tool_status.value = f"<span style='color:#b2182b'>{what} failed: {type(err).__name__}: " \
                                     f"{html.escape(str(err))}</span>"
            raise
        self._redraw(started, what)

    def undo(self) -> None:
        started = time.perf_counter()
        self.state.undo()
        self._redraw(started, "undo")

    def branch(self, chunk: int | None = None) -> None:
        """Fork at ``chunk`` (default: the chunk chosen) with the current action."""
        started = time.perf_counter()
        chunk = self.chunk_select.value if chunk is None else chunk
        self.state.branch(chunk)
        self.tool_status.value = (f"branched at chunk {chunk} with {self._action_text()}; "
                                  f"{len(self.state.branches)} other line(s) kept")
        self._redraw(started, "branch")

    def switch(self, line: int | None = None) -> None:
        line = self.switch_select.value if line is None else line
        if line < 0:
            return
        started = time.perf_counter()
        self.state.switch(line)
        self.tool_status.value = f"switched to line {line}"
        self._redraw(started, "switch")

    def open_stepper(self, chunk: int | None = None):
        """Show the Stepper on chunk ``chunk``'s recorded sampling run (default: the chunk chosen) below
        the view."""
        from workbench.widgets.stepper import Stepper

        chunk = self.chunk_select.value if chunk is None else chunk
        stepper = Stepper(self.state.trajectory(chunk), decode="full", dim_names=list(self.state.dim_names))
        self.stepper_box.children = (widgets.HTML(f"<b>chunk {chunk} in the Stepper</b>"), stepper)
        return stepper

    def save(self, path: str | Path | None = None) -> Path:
        written = self.state.save(path or self.save_path.value)
        self.tool_status.value = (f"wrote {html.escape(str(written))} "
                                  f"({written.stat().st_size / 1024:.0f} KiB, {self.state.frames} frames): "
                                  f"MetaWorldClips(path=..., split='all') reads it")
        return written

    # -- the picture --------------------------------------------------------------------------------
    def _redraw(self, started: float, what: str) -> None:
        def draw():
            self._update_controls()
            self._draw()
            self.last_latency_s = time.perf_counter() - started
            self.last_action = what
            self._status()

        self.request(draw)

    def refresh(self) -> None:
        def draw():
            self._update_controls()
            self._draw()
            self._status()

        self.request(draw)

    def _update_controls(self) -> None:
        n = self.state.chunks
        options = [(f"chunk {k}", k) for k in range(n)] or [("chunk 0", 0)]
        if list(self.chunk_select.options) != options:
            self.chunk_select.options = options
            self.chunk_select.value = options[-1][1]
        lines = [(f"line {i}: {ro.frame_count} frames", i) for i, ro in enumerate(self.state.branches)]
        self.switch_select.options = lines or [("(no other line)", -1)]
        self.undo_button.disabled = n == 0
        for b in (self.branch_button, self.stepper_button, self.save_button):
            b.disabled = n == 0

    def _draw(self) -> None:
        self.show_array(drive_picture(self.state))

    def _action_text(self) -> str:
        return ", ".join(f"{n}={v:+.2f}" for n, v in zip(self.state.dim_names, self.state.action))

    def _status(self) -> None:
        s = self.state
        lines = [f"<b>{s.chunks}</b> chunk{'s' if s.chunks != 1 else ''} · {s.frames} frames · "
                 f"<b>{s.steps} sampling steps</b> per chunk · frames: full decode · "
                 f"next: {self._action_text()}"]
        if s.timings and self.last_latency_s is not None:
            t = s.timings[-1]
            lines.append(f"last chunk: {t.wall_s:.2f} s ({t.cpu_s:.2f} s CPU); "
                         f"{html.escape(self.last_action)} to picture <b>{self.last_latency_s:.2f} s</b> "
                         f"in the kernel")
        if s.readout is None:
            lines.append(f"<i>{html.escape(s.readout_note)}</i>")
        self.status.value = status_lines(*lines)

    def summary(self) -> str:
        return self.state.describe()


def drive_picture(state: DriveState, shown: int = SHOWN_FRAMES) -> np.ndarray:
    """The start frame and ``shown`` frames of the newest chunk, the hand's path drawn over them, and the path
    per axis below (when the state has a readout): uint8 RGB ``[H, W, 3]``."""
    from PIL import Image, ImageDraw

    from workbench.widgets.panels import label_font

    video = state.video()
    n = len(video)
    if state.chunks:
        newest = state.rollout.chunks[-1].frames
        picks = sorted({int(round(x)) for x in np.linspace(newest.start, newest.stop - 1, shown)})
        first_new = newest.start
    else:
        picks, first_new = [], n
    frames = [0, *picks]
    pixels = state.path_pixels()
    panels = []
    for f in frames:
        im = Image.fromarray(np.ascontiguousarray(video[f])).resize(
            (video.shape[2] * SCALE, video.shape[1] * SCALE), Image.NEAREST)
        if pixels is not None:
            draw = ImageDraw.Draw(im)
            pts = [(float(u) * SCALE, float(v) * SCALE) for u, v in pixels[:f + 1]]
            old = pts[:min(len(pts), first_new + 1)]
            if len(old) > 1:
                draw.line(old, fill=PAST_RGB, width=2)
            new = pts[first_new:] if f >= first_new else []
            if len(new) > 1:
                draw.line(new, fill=NEW_RGB, width=3)
            u, v = pts[-1]
            draw.ellipse([u - 4, v - 4, u + 4, v + 4], outline=(0, 0, 0), fill=NEW_RGB)
        panels.append((np.asarray(im), "start" if f == 0 else f"frame {f} · chunk {state.chunk_of(f)}"))
    gap, head = 10, 22
    width = sum(p.shape[1] for p, _ in panels) + gap * (len(panels) + 1)
    height = head + max(p.shape[0] for p, _ in panels) + gap
    canvas = Image.new("RGB", (max(width, 400), height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    x = gap
    for picture, title in panels:
        canvas.paste(Image.fromarray(picture), (x, head))
        draw.text((x, 4), title, fill=TEXT_RGB, font=label_font(14))
        x += picture.shape[1] + gap
    pictures = [np.asarray(canvas)]
    path = state.path()
    if path is not None and len(path) > 1:
        pictures.append(path_chart(path, state, width=pictures[0].shape[1]))
    return render.stack_images(pictures)


def path_chart(path: np.ndarray, state: DriveState, width: int, height: int = 170) -> np.ndarray:
    """The path per axis over the episode's frames, the newest chunk in red, chunk starts as grey lines."""
    from PIL import Image, ImageDraw

    from workbench.widgets.panels import label_font

    unit = getattr(state.readout, "unit", "")
    name = getattr(state.readout, "name", "")
    axes = tuple(getattr(state.readout, "axes", ()) or ()) or tuple(f"d{d}" for d in range(path.shape[1]))
    t, dims = path.shape
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    small, font = label_font(13), label_font(14)
    newest = state.rollout.chunks[-1].frames.start if state.chunks else t
    starts = [c.frames.start for c in state.rollout.chunks] if state.chunks else []
    chart_w = (width - 10) // max(1, dims)
    top, bottom = 24, height - 22
    for d in range(dims):
        x0, x1 = 10 + d * chart_w + 48, 10 + (d + 1) * chart_w - 12
        lo, hi = float(path[:, d].min()), float(path[:, d].max())
        pad = max(0.05 * (hi - lo), 0.5 if unit == "cm" else 1e-6)
        lo, hi = lo - pad, hi + pad
        draw.text((x0, 4), f"{name} {axes[d] if d < len(axes) else d} ({unit})".strip(), fill=TEXT_RGB,
                  font=font)
        draw.rectangle([x0, top, x1, bottom], outline=(200, 200, 200))

        def px(i: float, v: float, x0=x0, x1=x1, lo=lo, hi=hi) -> tuple[float, float]:
            return x0 + (x1 - x0) * i / max(1, t - 1), bottom - (bottom - top) * (v - lo) / (hi - lo)

        for s in starts[1:]:
            sx = px(s, lo)[0]
            draw.line([(sx, top), (sx, bottom)], fill=(200, 200, 225), width=1)
        pts = [px(i, float(v)) for i, v in enumerate(path[:, d])]
        if newest > 0:
            draw.line(pts[:newest + 1], fill=PAST_RGB, width=2)
        if len(pts[newest:]) > 1:
            draw.line(pts[newest:], fill=NEW_RGB, width=3)
        for value, y in ((hi - pad, top), (lo + pad, bottom - 13)):
            text = f"{value:.1f}"
            draw.text((x0 - 6 - int(draw.textlength(text, font=small)), y), text, fill=TEXT_RGB, font=small)
        draw.text((x0, bottom + 3), "frame 0", fill=TEXT_RGB, font=small)
        end = f"{t - 1}"
        draw.text((x1 - int(draw.textlength(end, font=small)), bottom + 3), end, fill=TEXT_RGB, font=small)
    return np.asarray(canvas)
