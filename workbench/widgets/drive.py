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
from workbench.widgets.base import View, button, mark_modified, status_line, status_lines

#: Frames of the newest chunk shown beside the start frame.
SHOWN_FRAMES = 4
#: Chunks whose part of the hand's path is drawn over the frames: the newest and the ones before it, fading.
PATH_CHUNKS = 3
SCALE = 3  # a 64-pixel frame drawn at 192 pixels
BRANCH_PAUSE_S = 0.02  # between two chunks of a branch: the kernel serves the messages that came meanwhile
# the path: earlier chunks blue, the newest orange (the arm itself is red)
PAST_RGB, NEW_RGB, TEXT_RGB = (31, 119, 180), (255, 160, 0), (40, 40, 40)

_KEYPAD_ESM = """
function render({ model, el }) {
  const pad = document.createElement("div");
  pad.tabIndex = 0;
  pad.className = "workbench-drive-keys";
  const label = () => { pad.textContent = model.get("label"); };
  label();
  model.on("change:label", label);
  pad.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {  // leave the field: the keys go to the page (JupyterLab: command mode)
      event.preventDefault();
      event.stopPropagation();
      const cell = pad.closest(".jp-Cell");  // JupyterLab: its cell, in command mode (as Escape in a cell)
      if (cell) cell.focus({ preventScroll: true }); else pad.blur();
      return;
    }
    // a key the view does not use (Ctrl+S, Shift+Enter, Tab, ...) goes on to JupyterLab as usual
    if (event.ctrlKey || event.metaKey || event.altKey || event.shiftKey) return;
    if (!model.get("driving_keys").includes(event.key)) return;
    event.preventDefault();  // a driving key drives the view, not the page or the notebook's cell selection
    event.stopPropagation();
    model.send({ key: event.key });
  });
  pad.addEventListener("focus", () => pad.classList.add("workbench-drive-keys-focused"));
  pad.addEventListener("blur", () => pad.classList.remove("workbench-drive-keys-focused"));
  el.appendChild(pad);
  // after a click on one of the view's buttons (undo, branch, ...) the keys drive again: a focused button
  // would hand the arrow keys to the notebook, which moves its cell selection and scrolls the view away
  const refocus = (event) => {
    const view = pad.closest(".workbench-drive");
    const clicked = view && view.contains(event.target) && event.target.closest("button");
    if (clicked) pad.focus({ preventScroll: true });
  };
  document.addEventListener("click", refocus);
  return () => document.removeEventListener("click", refocus);
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
    it too, and "step" predicts a chunk with their values. Every other key goes on to the notebook
    (Ctrl+S, Shift+Enter), Escape leaves the field, and a click on a button gives the keys back to it.
    The picture shows the start frame and frames of the newest chunk (the backbone's full decoder: a
    rollout decodes each chunk anyway, since the next chunk continues from its last frame), with the
    path over the last chunks (``readout``, by default the state reader's own: with ``state="probe"``
    the hand the probe reads, in cm) drawn over them, and the path per axis below with the chunk
    boundaries. ``state`` is where a chunk's state comes from, as :func:`workbench.inspect.rollout`
    takes it. "undo" drops the last chunk, "branch" forks the episode at the chosen chunk with the
    current action, showing each later chunk as it is sampled again (a key press stops it; the old
    line is kept: "switch" goes back), "save" writes the driven episode as a clip file that
    :class:`workbench.data.metaworld.MetaWorldClips` reads, "open in the Stepper" steps through the
    chosen chunk's sampling run. The status line says how many
    sampling steps a chunk takes and what the last one cost (wall and CPU time).
    The logic is :class:`workbench.inspect.drive.DriveState` (``self.state``).

    Args:
        model: The :class:`~workbench.core.composed.ComposedModel` to drive (an experiment's is
            ``exp.model``).
        start: One raw clip, as a clip source serves it: the episode starts at its first frame.
        steps: Sampling steps per chunk (fewer: faster, coarser).
        seed: Chunk ``k`` samples with a seed mixed from ``(seed, k)``.
        readout: Frames → positions for the path; ``"state"`` (default): the state reader's own readout;
            None: no path.
        speed: The magnitude a key sets (actions are in [-1, 1]).
        gate_scale: Sample with the adapter's learned gate times this.
        state: Where a chunk's state comes from, as :func:`workbench.inspect.rollout` takes it (``"probe"``:
            the world-model wing's hand probe).
        dim_names: A name per action dimension (default ``dx, dy, dz, grip``).
        save_path: The file "save" writes the driven episode to.
        first_chunk: Predict a first chunk (hand still) when the view opens.

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
        self.tool_status.add_class("workbench-drive-tool-status")
        self._said_for: Any = None  # the line the tool status speaks of: it goes when the episode changes
        self._branching: Any = None  # a branch sampled chunk by chunk (branch_steps), while it runs
        self._branch_at: tuple[int, int, int] | None = None  # its fork chunk, the chunk done last, the last
        self.stepper_box = widgets.VBox()
        self.step_button.on_click(lambda _: self.step())
        self.undo_button.on_click(lambda _: self.undo())
        self.branch_button.on_click(lambda _: self.branch_in_steps())
        self.switch_button.on_click(lambda _: self.switch())
        self.stepper_button.on_click(lambda _: self.open_stepper())
        self.save_button.on_click(lambda _: self.save())
        keys = [self.keypad] if self.keypad is not None else [
            widgets.HTML("<i>keyboard: install anywidget (the widgets extra); "
                         "the sliders and step drive</i>")]
        help_line = widgets.HTML(f"<small>{html.escape(KEY_HELP)}</small>")
        # the status lines get a row of their own: beside the key field and the buttons they were cut off
        self.children = (
            widgets.HBox([*keys, self.step_button, self.undo_button]),
            self.status,
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
        """What a key press in the key field does: set the action it means and predict one chunk. While a
        branch is being sampled chunk by chunk, a key press stops it instead (and drives nothing)."""
        if key not in KEYS:
            return
        if self._branching is not None:
            self._stop_branching(f"by the key {key}")
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
        self._stop_branching("by step")
        started = time.perf_counter()
        if action is not None:
            self.state.set_action(action)
            self._sync_sliders()
        self._step(started, "step")

    def _step(self, started: float, what: str) -> None:
        try:
            self.state.step()
        except Exception as err:
            self._say(f"<span style='color:#b2182b'>{what} failed: {type(err).__name__}: "
                      f"{html.escape(str(err))}</span>")
            raise
        self._redraw(started, what)

    def undo(self) -> None:
        self._stop_branching("by undo")
        started = time.perf_counter()
        self.state.undo()
        self._redraw(started, "undo")

    def branch(self, chunk: int | None = None) -> None:
        """Fork at ``chunk`` (default: the chunk chosen) with the current action, every later chunk sampled
        again before this returns (:meth:`branch_in_steps` shows them one by one)."""
        self._stop_branching("by another branch")
        started = time.perf_counter()
        chunk = self.chunk_select.value if chunk is None else chunk
        self.state.branch(chunk)
        self._branched(chunk)
        self._redraw(started, "branch")

    def branch_in_steps(self, chunk: int | None = None) -> None:
        """What "branch" does: :meth:`branch`, one chunk at a time while the kernel serves messages, each
        chunk drawn as it comes (the status says how far it is) and a key press stopping it; the new line
        keeps the chunks sampled so far, and the old line stays kept. Without an event loop (a script) it
        is :meth:`branch`."""
        loop = _running_loop()
        if loop is None:
            self.branch(chunk)
            return
        self._stop_branching("by another branch")
        chunk = self.chunk_select.value if chunk is None else chunk
        steps = self.state.branch_steps(chunk)
        self._branching, self._branch_at = steps, (chunk, chunk - 1, self.state.chunks - 1)
        loop.call_soon(self._branch_next, loop, steps, time.perf_counter())

    def _branch_next(self, loop, steps, started: float) -> None:
        if self._branching is not steps:  # stopped, or replaced by another branch
            return
        chunk = self._branch_at[0]
        try:
            done, last = next(steps)
        except Exception as err:  # shown in the view: a callback of the event loop has nowhere to raise it
            self._branching = None
            self._say(f"<span style='color:#b2182b'>branch failed: {type(err).__name__}: "
                      f"{html.escape(str(err))}</span>")
            self.refresh()
            return
        self._branch_at = (chunk, done, last)
        if done == last:
            self._branching = None
            self._branched(chunk)
        else:
            self._say(f"branching at chunk {chunk} with {html.escape(self.state.action_text())}: "
                      f"chunk {done} of {last} sampled, the next ones follow (a key press stops it)")
        self._redraw(started, "branch")
        self.flush()  # drawn now, so the picture goes out before the next chunk is sampled
        if self._branching is steps:
            # a moment for the kernel to serve messages (a key press stops the branch) before the next chunk
            loop.call_later(BRANCH_PAUSE_S, self._branch_next, loop, steps, started)
        else:
            mark_modified()  # a save made meanwhile stored a picture of a branch half done

    def _stop_branching(self, why: str) -> None:
        """Stop a branch being sampled chunk by chunk: the new line keeps the chunks sampled so far."""
        steps, self._branching = self._branching, None
        if steps is None:
            return
        steps.close()
        chunk, done, last = self._branch_at
        if done < chunk:  # before its first chunk: nothing changed
            self._say(f"branch at chunk {chunk} stopped {html.escape(why)} before it began")
        else:
            self._say(f"branch at chunk {chunk} stopped {html.escape(why)} after chunk {done} of {last}: "
                      f"this line has {self.state.chunks} chunks; the old line is kept (switch goes back)")
        self._redraw(time.perf_counter(), "branch stopped")

    def _branched(self, chunk: int) -> None:
        self._say(f"branched at chunk {chunk} with {html.escape(self.state.action_text())}; "
                  f"{len(self.state.branches)} other line(s) kept")

    def switch(self, line: int | None = None) -> None:
        line = self.switch_select.value if line is None else line
        if line < 0:
            return
        self._stop_branching("by switch")
        started = time.perf_counter()
        self.state.switch(line)
        self._say(f"switched to line {line}")
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
        self._say(f"wrote {html.escape(str(written))} ({written.stat().st_size / 1024:.0f} KiB, "
                  f"{self.state.frames} frames): MetaWorldClips(path=..., split='all') reads it")
        return written

    def _say(self, text: str) -> None:
        """A line about the episode as it is now (what was saved, branched, ...): it goes when the episode
        changes, so the view never shows, or saves, a line about an episode it no longer shows."""
        self.tool_status.value = text
        self._said_for = self.state.rollout

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
        lines = [(label, i) for i, label in enumerate(self.state.line_labels())]
        self.switch_select.options = lines or [("(no other line)", -1)]
        self.undo_button.disabled = n == 0
        for b in (self.branch_button, self.stepper_button, self.save_button):
            b.disabled = n == 0

    def _draw(self) -> None:
        self.show_array(drive_picture(self.state))

    def _status(self) -> None:
        s = self.state
        if self._said_for is not s.rollout:
            self.tool_status.value = ""
        lines = [f"<b>{s.chunks}</b> chunk{'s' if s.chunks != 1 else ''} · {s.frames} frames · "
                 f"<b>{s.steps} sampling steps</b> per chunk · frames: full decode · "
                 f"next: {html.escape(s.action_text())}"]
        if s.timings and self.last_latency_s is not None:
            t = s.timings[-1]
            lines.append(f"last chunk: {t.wall_s:.2f} s ({t.cpu_s:.2f} s CPU); "
                         f"{html.escape(self.last_action)} to picture <b>{self.last_latency_s:.2f} s</b> "
                         f"in the kernel")
        if s.readout is None:
            lines.append(f"<i>{html.escape(s.readout_note)}</i>")
        if s.context_note:
            lines.append(f"<i>{html.escape(s.context_note)}</i>")
        self.status.value = status_lines(*lines)

    def summary(self) -> str:
        return self.state.describe()


def drive_picture(state: DriveState, shown: int = SHOWN_FRAMES) -> np.ndarray:
    """The start frame and ``shown`` frames of the newest chunk, the hand's path drawn over them, and the path
    per axis below (when the state has a readout): uint8 RGB ``[H, W, 3]``."""
    from PIL import Image, ImageDraw

    from workbench.widgets.panels import label_font

    video = state.video()
    chunks = [c.frames for c in state.rollout.chunks] if state.chunks else []
    picks = (sorted({int(round(x)) for x in np.linspace(chunks[-1].start, chunks[-1].stop - 1, shown)})
             if chunks else [])
    frames = [0, *picks]
    pixels = state.path_pixels()
    panels = []
    for f in frames:
        im = Image.fromarray(np.ascontiguousarray(video[f])).resize(
            (video.shape[2] * SCALE, video.shape[1] * SCALE), Image.NEAREST)
        if pixels is not None:
            draw = ImageDraw.Draw(im)
            for points, colour, width in path_segments(pixels[:f + 1] * SCALE, chunks):
                draw.line(points, fill=colour, width=width)
            u, v = (float(x) * SCALE for x in pixels[f])
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


def path_segments(pixels: np.ndarray, chunks: Sequence[range], shown: int = PATH_CHUNKS,
                  ) -> list[tuple[list[tuple[float, float]], tuple[int, int, int], int]]:
    """What of the path ``pixels`` ``[F, 2]`` (the frames so far) is drawn over a frame: ``(points, colour,
    width)`` lines for the last ``shown`` of ``chunks`` (the frames each chunk wrote, in order), the newest
    orange and thick, older ones blue and fading with age; older chunks are left out, so a long episode does
    not draw a tangle. Each chunk's line starts at the frame before its first, so the lines join."""
    lines = []
    for age, c in enumerate(reversed(chunks[-shown:])):  # age 0: the newest chunk
        points = [(float(u), float(v)) for u, v in pixels[max(0, c.start - 1):min(c.stop, len(pixels))]]
        if len(points) < 2:
            continue
        if age == 0:
            lines.append((points, NEW_RGB, 3))
        else:
            fade = min(0.8, 0.35 * (age - 1))  # toward white: none for the chunk just before the newest
            lines.append((points, tuple(int(round(p + (255 - p) * fade)) for p in PAST_RGB), 2))
    return lines[::-1]  # the oldest first: the newer lines are drawn over it


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


def _running_loop():
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
