"""Ablation sliders: one slider per condition dimension, re-rendering the prediction at a step, then
carrying the edit to the last step in the background."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import numpy as np

from workbench.inspect.common import model_lock
from workbench.inspect.probes.ablation import DIFFERENCE_RANGE, Ablation, Propagation
from workbench.inspect.recording.trajectory import Trajectory
from workbench.widgets import render
from workbench.widgets.base import View, mark_modified, status_line, status_lines
from workbench.widgets.controls import ConditionSliders
from workbench.widgets.static import STALE_CLASS

# a picture that no longer matches the sliders (the final one, while the edit is being carried through)
STALE_STYLE = f"<style>.{STALE_CLASS} {{ opacity: 0.45; }}</style>"


class AblationSliders(View):
    """Slide each dimension of ``condition`` (e.g. the 4 action dimensions, on every frame or on
    one frame) and see the x0 estimate at a chosen step: recorded | edited | edited − recorded;
    then, below, where the edit lands: the final prediction with the edit beside the recorded one.

    A slider move re-runs only the adapter and the composer at the chosen step: the base output
    recorded there is reused (:meth:`Trajectory.recompose`), so that picture answers at once.
    Then, without holding up the sliders, the remaining steps are sampled again with the edited
    condition — a fork of the recording at that step (:meth:`workbench.inspect.Ablation.propagate`)
    — and the final picture appears beside the recorded run's, with ``readout``'s numbers when
    one is given (e.g. the world-model wing's hand probe: ``readout=HandProbe.from_pretrained().readout()``,
    in cm). The next move cancels a propagation still running. The differences' colours span a
    range fixed for the view (``colour_range``, ±1 by default), so that a small edit shows faint
    and a large one strong colour; the "colours" menu switches to each edit's own range (stated in
    the titles) or holds the range shown now. ``propagate=False`` (or the checkbox) keeps only the
    instant picture. The logic is :class:`workbench.inspect.Ablation` (``self.state``).

    Args:
        trajectory: The recorded trajectory (from ``exp.sample`` or :func:`~workbench.inspect.record`).
        step: The step edited (default: the middle one of the stored steps).
        condition: The condition the sliders edit, a name the adapter declares.
        index: Which batch element the pictures show.
        dim_names: A name per dimension of the condition, for the sliders.
        decode: How the x0 estimates are decoded: ``"preview"``, ``"tiny"`` or ``"full"``.
        frame: The frame shown first (default: the last, where actions have acted longest).
        readout: A :class:`~workbench.inspect.Readout` whose numbers come with the propagated edit.
        propagate: False keeps only the instant picture (the checkbox switches it too).
        final_decode: How the propagated final frames are decoded (default: ``decode``).
        colour_range: The differences are coloured over ±``colour_range`` for every edit; None: over each
            difference's own largest magnitude.

    Examples:
        >>> from workbench.worldmodel.probe import HandProbe
        >>> hand = HandProbe.from_pretrained().readout()
        >>> view = AblationSliders(traj, step=10, dim_names=["dx", "dy", "dz", "grip"], readout=hand)
    """

    def __init__(self, trajectory: Trajectory, step: int | None = None, condition: str = "action",
                 index: int = 0, dim_names: Sequence[str] | None = None, decode: str = "preview",
                 frame: int | None = None, readout: Any = None, propagate: bool = True,
                 final_decode: str | None = None, colour_range: float | None = DIFFERENCE_RANGE):
        super().__init__()
        self.state = Ablation(trajectory, step=step, condition=condition, index=index, decode=decode,
                              dim_names=dim_names, readout=readout, final_decode=final_decode,
                              colour_range=colour_range)
        self.fixed_range = self.state.colour_range  # what "fixed" means for this view
        steps = trajectory.stored
        self.add_class("workbench-ablation")
        self.image.add_class("workbench-ablation-image")
        self.final_image = widgets.Image(format="png",
                                         layout=widgets.Layout(align_self="flex-start", max_width="100%"))
        self.final_image.add_class("workbench-ablation-final")
        self.step_slider = widgets.SelectionSlider(options=steps, value=self.state.step, description="step",
                                                   continuous_update=False,
                                                   layout=widgets.Layout(width="340px"))
        frames = len(self.state.images()[0])
        first = frame if frame is not None else frames - 1  # the last frame: where actions have acted longest
        self.frame_slider = widgets.IntSlider(value=first, min=0, max=frames - 1, description="frame",
                                              continuous_update=False, layout=widgets.Layout(width="340px"))
        self.sliders = ConditionSliders(self.state.edit, index=index, on_change=self.refresh)
        fixed = [(f"±{self.fixed_range:g}, fixed", "fixed")] if self.fixed_range is not None else []
        self.scale_menu = widgets.Dropdown(
            options=[*fixed, ("each edit's own", "edit"), ("hold as now", "held")],
            value="fixed" if fixed else "edit", description="colours",
            tooltip="the differences' colour range: the same for every edit (colour strength compares), "
                    "each edit's largest difference, or the range shown now, kept",
            layout=widgets.Layout(width="260px"))
        self.scale_menu.add_class("workbench-ablation-scale")
        self.propagate_box = widgets.Checkbox(value=bool(propagate),
                                              description="carry the edit to the last step",
                                              indent=False, layout=widgets.Layout(width="auto"))
        self.status = status_line()
        self.status.add_class("workbench-ablation-status")
        self.final_status = status_line()
        self.final_status.add_class("workbench-ablation-final-status")
        self.step_slider.observe(lambda c: (self.state.seek(c["new"]), self.refresh()), names="value")
        self.frame_slider.observe(lambda _: self.refresh(edit=False), names="value")
        self.scale_menu.observe(lambda c: self._scale(c["new"]), names="value")
        self.propagate_box.observe(lambda _: self.refresh(), names="value")
        # a fixed column: its notes wrap inside it, the status column beside it takes the rest
        controls = widgets.VBox([self.step_slider, self.frame_slider, self.sliders, self.scale_menu,
                                 self.propagate_box],
                                layout=widgets.Layout(flex="0 0 440px", width="440px"))
        self.status.layout = widgets.Layout(margin="0 0 0 8px", flex="1 1 auto", overflow="auto")
        self.children = (widgets.HTML(STALE_STYLE), widgets.HBox([controls, self.status]), self.image,
                         self.final_status, self.final_image)
        # the background run: one at a time, cancelled by the next move
        self._worker: threading.Thread | None = None
        self._starting: Any = None  # the event loop's handle that starts the worker, until it has
        self._cancel = threading.Event()
        self._generation = 0
        self._outcome: tuple[int, Propagation | None, BaseException | None] | None = None
        self._shown: Propagation | None = None  # the propagation the final picture shows
        self._final_array: np.ndarray | None = None
        self._final_limit: float | None = None  # the final difference's colour range, when held
        self._final_shown_limit: float | None = None  # the final difference's colour range shown now
        self._instant_limit: float | None = None  # the instant difference's colour range shown now
        self._instant_array: np.ndarray | None = None
        self.final_seconds: float | None = None  # wall time of the last propagation shown, move to picture
        self.final_error: Exception | None = None  # why the last propagation failed, if it did
        self._moved_at = time.perf_counter()
        self.refresh()

    # -- the instant picture ---------------------------------------------------------------
    def _concurrent(self) -> bool:
        """Whether the instant picture may be computed while a propagation runs: the adapter works beside
        the base, and recomposing changes nothing on the model (no swapped composer, no gate override)."""
        model, settings = self.state.trajectory.model, self.state.trajectory.settings
        return not (model.adapter.inside or model.training or settings.composer is not None
                    or settings.gate_override is not None)

    def refresh(self, edit: bool = True) -> None:
        """Redraw for the current sliders; a burst of moves draws only the last (see :meth:`request`).

        After an edit (or a step move) any propagation still running is cancelled at once, and the
        new one starts after the instant picture; ``edit=False`` (another frame, another colour
        range) only redraws both pictures.
        """
        if edit:
            self._cancel.set()
            self._moved_at = time.perf_counter()

        def draw():
            if not self._concurrent():
                self._join()  # it stops after the step in progress
            started = time.perf_counter()
            panels, caption = self.state.panels(self.frame_slider.value)
            self._instant_limit = panels[2].limit
            self._instant_array = render.panels_image(panels, title=caption)
            self.show_array(self._instant_array)
            edited = ", ".join(self.state.describe_edits()) or "nothing"
            self.status.value = status_lines(
                f"x0 change (RMS, latent units): <b>{self.state.change():.4f}</b>",
                f"edited: {html.escape(edited)}",
                f"colour scale {self._scale_words(panels[2].limit)}",
                f"re-rendered in {1000 * (time.perf_counter() - started):.0f} ms",
                "" if self.state.trajectory.model.adapter.reuses_base_output else
                "slower path: each edit re-runs the base (the adapter works inside it)")
            if edit:
                self._start_propagation()
            elif self.propagate_box.value:
                self._draw_final()

        self.request(draw)

    def _scale(self, mode: str) -> None:
        """The differences' colour range: ``"fixed"`` (the view's), ``"edit"`` (each edit's own) or ``"held"``
        (the ranges shown now, kept)."""
        if mode == "held":
            self.state.held_limit = self._instant_limit
            self._final_limit = self._final_shown_limit
        else:
            self.state.held_limit = None
            self.state.colour_range = self.fixed_range if mode == "fixed" else None
            self._final_limit = None
        self.refresh(edit=False)

    def _scale_words(self, limit: float) -> str:
        if self.state.held_limit is not None:
            return f"held at ±{limit:.2g}"
        if self.state.colour_range is not None:
            return f"fixed at ±{limit:.2g} for this view: colour strength compares between edits"
        return f"follows each edit: ±{limit:.2g} now (every edit looks as strong)"

    def _final_scale(self, result: Propagation) -> float:
        """The final difference's colour range now (held, the view's fixed one, or its own)."""
        if self.scale_menu.value == "held":
            if self._final_limit is None:  # held before any final picture: the first one's range
                self._final_limit = _limit(result)
            return self._final_limit
        if self.scale_menu.value == "fixed":
            return self.fixed_range
        return _limit(result)

    # -- the final picture, in the background ------------------------------------------------
    def _start_propagation(self) -> None:
        if self._starting is not None:  # a propagation not started yet: this edit replaces it
            self._starting.cancel()
            self._starting = None
        self._generation += 1
        generation = self._generation
        if not self.propagate_box.value:
            self.final_status.value = status_lines("<i>carrying the edit to the last step is off</i>")
            self.final_image.add_class(STALE_CLASS)
            return
        cached = self.state.cached_propagation()
        if cached is not None:
            self._show_final(generation, cached, None)
            return
        self._cancel = threading.Event()
        edits = ", ".join(self.state.describe_edits())
        self.final_status.value = status_lines(
            f"re-sampling steps {self.state.step}–{self.state.trajectory.steps - 1} "
            f"with {html.escape(edits)} …"
            if edits else "the recorded run's final prediction …")
        self.final_image.add_class(STALE_CLASS)
        loop = _running_loop()
        if loop is None:  # no event loop (a script, a test): run it here
            self._show_final(generation, *self._run(self._cancel))
            return

        # a cancelled run still in flight stops after its current step; this one waits for the model till then
        def work(cancel=self._cancel):
            _yield_to_the_kernel()
            outcome = self._run(cancel)
            self._outcome = (generation, *outcome)
            loop.call_soon_threadsafe(self._deliver, generation)

        self._outcome = None
        self._worker = threading.Thread(target=work, name="workbench-ablation-propagate", daemon=True)
        # started a moment after the instant picture, so that its messages go out first instead of waiting for
        # the interpreter while the fork holds it
        self._starting = loop.call_later(PROPAGATION_DELAY_S, self._start_worker)

    def _start_worker(self) -> None:
        """Start the propagation waiting to start, if any."""
        starting, self._starting = self._starting, None
        if starting is not None:
            starting.cancel()
            self._worker.start()

    def _run(self, cancel: threading.Event) -> tuple[Propagation | None, BaseException | None]:
        try:
            with model_lock(self.state.trajectory.model):
                return self.state.propagate(should_stop=cancel.is_set), None
        except Exception as err:  # shown in the view (a thread has nowhere else to raise it)
            return None, err

    def _deliver(self, generation: int) -> None:
        outcome = self._outcome
        if outcome is not None and outcome[0] == generation:
            self._outcome = None
            self._show_final(*outcome)
            if outcome[1] is not None and generation == self._generation:
                mark_modified()  # a save made while it ran kept the picture without it

    def _join(self) -> None:
        """Wait for the propagation running (one waiting to start is dropped: the next edit replaces it)."""
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None
        worker = self._worker
        if worker is not None and worker.ident is not None and worker is not threading.current_thread():
            worker.join()
        self._worker = None

    def settle(self) -> None:
        """Draw what is pending and wait for the propagation in flight, then show its picture."""
        self.flush()
        self._start_worker()  # one waiting to start runs now
        self._join()
        if self._outcome is not None:
            self._deliver(self._outcome[0])

    def _show_final(self, generation: int, result: Propagation | None, error: BaseException | None) -> None:
        if generation != self._generation:
            return  # a newer edit replaced this one
        self.final_error = error
        if error is not None:
            self.final_status.value = (f"<span style='color:#b2182b'>"
                                       f"carrying the edit to the last step failed: "
                                       f"{type(error).__name__}: {html.escape(str(error))}</span>")
            return
        if result is None:  # cancelled
            return
        self._shown = result
        self.final_seconds = time.perf_counter() - self._moved_at
        self._draw_final()

    def _draw_final(self) -> None:
        result = self._shown
        if result is None:
            return
        frame = self.frame_slider.value
        limit = self._final_shown_limit = self._final_scale(result)
        scale = {"held": "held", "fixed": "fixed"}.get(self.scale_menu.value, "this edit's own")
        scale = f"±{limit:.2g} {scale}" if self.scale_menu.value != "edit" else f"±{limit:.2g}, {scale}"
        pictures = [render.panels_image(result.panels(frame, limit, scale), title=result.caption(frame))]
        lines = ["<b>"
                 f"{html.escape(result.describe().split(': ', 1)[0] if result.path else result.describe())}"
                 "</b>"]
        if result.path is not None:
            p = result.path
            pictures.append(render.path_image(p.recorded, p.edited, p.axes, p.unit, p.name, frame,
                                              width=pictures[0].shape[1], title=p.describe().split(";")[0]))
            lines.append(html.escape(p.describe()))
            if frame != len(p.distance) - 1:
                lines.append(html.escape(p.describe(frame).split(";")[0]))
        else:
            lines.append("<i>no readout: pass readout= (e.g. a hand probe) for the numbers</i>")
        timing = (f"{result.resampled} steps re-sampled in {result.seconds:.2f} s"
                  if result.resampled else "nothing edited: the recorded run")
        lines.append(timing)
        self._final_array = render.stack_images(pictures)
        self.final_image.value = render.array_png(self._final_array)
        self.final_image.remove_class(STALE_CLASS)
        self.final_status.value = status_lines(*lines)

    def static_png(self) -> bytes:
        """What a page without a front end shows: the status lines and the instant picture, then the final
        one's status lines and the final picture below, as the live view lays them out."""
        if self._instant_array is None:
            return self.image.value
        parts = [render.text_image(self.status_texts(self.status), self._instant_array.shape[1]),
                 self._instant_array]
        final = self.status_texts(self.final_status)
        if final:
            parts.append(render.text_image(final, self._instant_array.shape[1]))
        if self._final_array is not None and self.propagate_box.value:
            parts.append(self._final_array)
        return render.array_png(render.stack_images(parts, gap=6))

    def summary(self) -> str:
        text = f"{self.state.describe()}, frame {self.frame_slider.value}"
        if self.propagate_box.value and self._shown is not None and self._shown.resampled:
            text += f"; {self._shown.describe()}"
        return text


def _limit(result: Propagation) -> float:
    """The colour range of a final difference: its largest magnitude (1 where it is zero)."""
    return float(np.abs(result.difference).max()) or 1.0


BACKGROUND_NICENESS = 10  # added to the process's niceness for the background run
PROPAGATION_DELAY_S = 0.05  # from the instant picture to the start of the background run


def _yield_to_the_kernel() -> None:
    """Lower this thread's scheduling priority (Linux: threads have their own niceness), so that on a
    busy CPU the kernel's thread — the next move's instant picture — runs first."""
    import contextlib
    import os
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):  # not allowed here: the thread keeps the process's priority
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid,
                           min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICENESS))


def _running_loop():
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
