"""Stepper: play / scrub a recorded trajectory, compare views, fork it, export it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from workbench.inspect.common import condition_keys
from workbench.inspect.probes.ablation import ConditionEdit
from workbench.inspect.recording.settings import Settings
from workbench.inspect.recording.trajectory import Trajectory
from workbench.inspect.stepper import StepperState
from workbench.inspect.views import VIEW_LABELS
from workbench.widgets import render
from workbench.widgets.base import View, button, status_line
from workbench.widgets.controls import ConditionSliders

#: The fork menu's choices, each the ``with_adapter`` a fork gets (``None``: as the branch it forks).
WITH_ADAPTER_CHOICES = {"adapter as recorded": None, "adapter on": True, "adapter off (base alone)": False}


class Stepper(View):
    """Step through ``trajectory`` (from ``exp.sample(...)``) and its forks, side by side.

    Controls: play / pause (the kernel steps the view, so it plays wherever the view is
    displayed, however many times), back / step, a step slider, a frame (time) slider, the view
    (x_t, x0, base, adapter, composed, adapter − base, gate), the decode (linear preview, tiny
    preview or full decoder, each labelled with its held-out dB against the full decode); "fork here"
    with a condition editor (one slider per dimension of ``condition``, on every frame or one
    frame) and an adapter on / off choice; export of the current view to MP4 or GIF. The logic
    is :class:`workbench.inspect.StepperState` (``self.state``).

    Examples:
        >>> # traj = exp.sample(raw, steps=20, seed=0)
        >>> view = Stepper(traj, dim_names=["dx", "dy", "dz", "grip"])
    """

    def __init__(self, trajectory: Trajectory, view: str = "x0", decode: str = "preview", index: int = 0,
                 frame: int | None = None, condition: str | None = "action",
                 dim_names: Sequence[str] | None = None,
                 interval: int = 500,
                 export_path: str | Path = "outputs/stepper.mp4"):
        super().__init__()
        self.state = StepperState(trajectory, view=view, decode=decode, index=index, frame=frame)
        steps = self.state.steps
        self.add_class("workbench-stepper")
        self.image.add_class("workbench-stepper-image")
        position = steps.index(self.state.step)
        # played by the kernel, not by the page: one timer however many times the view is displayed
        self.interval = interval
        self.play = widgets.ToggleButton(value=False, description="play", icon="play",
                                         tooltip="play / pause: one stored step every interval "
                                                 "(from the start when at the end)",
                                         layout=widgets.Layout(width="auto"))
        self._player: Any = None
        self.step_slider = widgets.IntSlider(value=position, min=0, max=len(steps) - 1, description="step",
                                             continuous_update=False, readout=False,
                                             layout=widgets.Layout(width="320px"))
        self.step_slider.add_class("workbench-step-slider")
        self.back_button = button("back", "previous stored step", icon="step-backward")
        self.forward_button = button("step", "next stored step", icon="step-forward")
        self.frame_slider = widgets.IntSlider(value=self.state.frame, min=0, max=self.state.frames - 1,
                                              description="frame",
                                              continuous_update=False, layout=widgets.Layout(width="320px"))
        self.frame_slider.add_class("workbench-frame-slider")
        self.view_select = widgets.Dropdown(options=[(VIEW_LABELS[v], v) for v in self.state.views],
                                            value=self.state.view,
                                            description="view", layout=widgets.Layout(width="260px"))
        self.decode_select = widgets.ToggleButtons(options=self._decode_options(), value=self.state.decode,
                                                   tooltips=["linear preview: least squares per latent pixel",
                                                             "tiny preview: a small decoder "
                                                             "distilled from the backbone's "
                                                             "(distilled on first use if none is cached)",
                                                             "the backbone's own decoder"],
                                                   style={"button_width": "112px"})
        self.where = status_line()
        self.step_slider.observe(lambda c: self._seek(steps[c["new"]]), names="value")
        self.play.observe(lambda c: self._play_changed(c["new"]), names="value")
        self.back_button.on_click(lambda _: self._move(-1))
        self.forward_button.on_click(lambda _: self._move(1))
        self.frame_slider.observe(lambda c: self._set(self.state.set_frame, c["new"]), names="value")
        self.view_select.observe(lambda c: self._set(self.state.set_view, c["new"]), names="value")
        self.decode_select.observe(lambda c: self._set_decode(c["new"]), names="value")

        # fork here, with a condition editor
        self.editor: ConditionSliders | None = None
        fork_children: list[widgets.Widget] = []
        if condition is not None and (condition != "action" or _has_condition(trajectory, condition)):
            # raises naming what exists
            edit = ConditionEdit(trajectory.model, trajectory.batch, condition, dim_names)
            self.editor = ConditionSliders(edit, index=index)
            fork_children.append(self.editor)
        self.with_adapter_select = widgets.Dropdown(options=tuple(WITH_ADAPTER_CHOICES),
                                                    value="adapter as recorded", description="fork with",
                                                    layout=widgets.Layout(width="300px"))
        self.fork_button = button("fork here", "rerun from this step with the edited condition",
                                  icon="code-fork")
        self.clear_button = button("remove forks", icon="trash")
        self.fork_status = status_line()
        self.fork_button.on_click(lambda _: self.fork_here())
        self.clear_button.on_click(lambda _: self.remove_forks())
        fork_children.append(widgets.HBox([self.with_adapter_select, self.fork_button, self.clear_button,
                                           self.fork_status]))

        # export
        self.export_path = widgets.Text(value=str(export_path), description="file",
                                        layout=widgets.Layout(width="360px"))
        self.export_format = widgets.Dropdown(options=[("MP4", ".mp4"), ("GIF", ".gif")],
                                              value=".gif" if str(export_path).endswith(".gif") else ".mp4",
                                              layout=widgets.Layout(width="90px"))
        self.export_button = button("export", "write the current view, every frame, four steps × branches",
                                    icon="download")
        self.export_status = status_line()
        self.export_format.observe(lambda c: self._set_suffix(c["new"]), names="value")
        self.export_button.on_click(lambda _: self.export())

        fork_box = widgets.VBox(fork_children)
        export_box = widgets.HBox([self.export_path, self.export_format, self.export_button,
                                   self.export_status])
        tools = widgets.Accordion(children=[fork_box, export_box], titles=("fork here", "export"))
        nav = widgets.HBox([self.play, self.back_button, self.forward_button, self.step_slider, self.where])
        options = widgets.HBox([self.view_select, self.decode_select, self.frame_slider])
        self.children = (nav, options, self.image, tools)
        self.refresh()

    # -- wiring ----------------------------------------------------------------------------
    def _seek(self, step: int) -> None:
        self.state.seek(step)
        self.refresh()

    def _play_changed(self, playing: bool) -> None:
        self.play.description, self.play.icon = ("pause", "pause") if playing else ("play", "play")
        if not playing or self._player is not None:
            return
        if self.state.step == self.state.steps[-1]:
            self.step_slider.value = 0
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop in this thread (a script): a timer thread plays instead
            self._player = threading.Thread(target=self._play_in_thread, daemon=True)
            self._player.start()
            return
        self._player = loop.create_task(self._play_in_loop())

    def _advance(self) -> bool:
        """One stored step forward; False (and play switched off) at the last step."""
        position = self.state.steps.index(self.state.step)
        if position + 1 >= len(self.state.steps):
            self.play.value = False
            return False
        self.step_slider.value = position + 1
        return True

    async def _play_in_loop(self) -> None:
        try:
            while self.play.value:
                await asyncio.sleep(self.interval / 1000)
                if not (self.play.value and self._advance()):
                    break
        finally:
            self._player = None

    def _play_in_thread(self) -> None:
        try:
            while self.play.value:
                time.sleep(self.interval / 1000)
                if not (self.play.value and self._advance()):
                    break
        finally:
            self._player = None

    def _move(self, delta: int) -> None:
        self.step_slider.value = self.state.steps.index(self.state.step_by(delta))

    def _set(self, setter, value: Any) -> None:
        setter(value)
        # an export holds every frame: only another view or decode outdates it
        if setter != self.state.set_frame:
            self.export_status.value = ""
        self.refresh()

    def _decode_options(self) -> list[tuple[str, str]]:
        """The decode choices, each labelled with its measured fidelity (held-out dB vs the full decode)."""
        db = self.state.fidelity()

        def label(name: str, value: float | None) -> str:
            return name if value is None or value == float("inf") else f"{name} {value:.1f} dB"

        return [(label("linear", db["preview"]), "preview"), (label("tiny", db["tiny"]), "tiny"),
                ("full", "full")]

    def _set_decode(self, decode: str) -> None:
        self._set(self.state.set_decode, decode)
        options = self._decode_options()  # a first "tiny" has just distilled (or loaded) it: show its dB
        if options != list(self.decode_select.options):
            self.decode_select.unobserve_all("value")
            self.decode_select.options = options
            self.decode_select.value = decode
            self.decode_select.observe(lambda c: self._set_decode(c["new"]), names="value")

    def _set_suffix(self, suffix: str) -> None:
        self.export_path.value = str(Path(self.export_path.value).with_suffix(suffix))

    def refresh(self) -> None:
        """Recompute and redraw the picture for the current state."""
        def draw():
            self.frame_slider.max = self.state.frames - 1
            self.show_array(render.panels_image(self.state.panels(), title=self.state.caption()))
            step = self.state.step
            noise = float(self.state.trajectory.noise_levels[step])
            self.where.value = (f"step <b>{step}</b> of {self.state.trajectory.steps} · "
                                f"noise level {noise:.2f}")

        self.request(draw)

    def summary(self) -> str:
        return self.state.describe()

    # -- actions ---------------------------------------------------------------------------
    def fork_here(self, cond: Any = None, with_adapter: bool | None = None,
                  label: str | None = None) -> Trajectory:
        """Fork at the current step with ``cond`` (default: the editor's edits) and show it alongside;
        ``with_adapter`` (default: the menu's choice) as :meth:`Trajectory.fork` takes it."""
        edits: list[str] = []
        if cond is None and self.editor is not None:
            cond = self.editor.edit.overrides()
            edits = self.editor.edit.describe_edits(self.state.index)
        if with_adapter is None:
            with_adapter = WITH_ADAPTER_CHOICES[self.with_adapter_select.value]
        if label is None and (edits or with_adapter is not None):  # say what changed, as the ablation does
            changes = [*edits, Settings(with_adapter=with_adapter).describe()]  # ("" when None)
            label = f"fork@{self.state.step}: {', '.join(c for c in changes if c)}"
        fork = self.state.fork_here(cond=cond, with_adapter=with_adapter, label=label)
        self.fork_status.value = f"added <i>{fork.label}</i>"
        self.export_status.value = ""
        self.refresh()
        return fork

    def remove_forks(self) -> None:
        while len(self.state.branches) > 1:
            self.state.remove_branch(len(self.state.branches) - 1)
        self.fork_status.value = ""
        self.export_status.value = ""
        self.refresh()

    def export(self, path: str | Path | None = None, **kwargs: Any) -> Path:
        """Write the current view of every branch (see :meth:`StepperState.export`)."""
        self.export_status.value = "writing…"
        try:
            written = self.state.export(path or self.export_path.value, **kwargs)
        except Exception as err:
            self.export_status.value = (f"<span style='color:#b2182b'>not written: "
                                        f"{type(err).__name__}: {err}</span>")
            raise
        self.export_status.value = (f"wrote {written} ({written.stat().st_size / 1024:.0f} KiB): "
                                    f"{self.state.view}, {len(self.state.branches)} "
                                    f"branch{'es' if len(self.state.branches) > 1 else ''}")
        return written


def _has_condition(trajectory: Trajectory, condition: str) -> bool:
    """Whether the batch carries ``condition`` (the default one is optional; others must exist)."""
    key = condition_keys(trajectory.model).get(condition)
    return key is not None and key in trajectory.batch.cond
