"""Fit: a short training run inline, with a progress bar, a live loss plot, stop and resume."""

from __future__ import annotations

import asyncio
import time
from numbers import Real
from typing import Any

import ipywidgets as widgets

from workbench.train.live import FitSession
from workbench.widgets import render
from workbench.widgets.base import View, button, status_line, status_lines


class Fit(View):
    """Train ``exp`` on ``data`` for ``steps`` more steps without freezing the notebook.

    "train" (or :meth:`start`) runs ``exp.fit`` in a background thread, so the kernel stays
    responsive: the progress bar and the loss plot update as steps complete, and "stop" ends
    the run after the step in progress — exactly as Ctrl-C would, so "train" again resumes and
    the result equals an uninterrupted run. ``await fit.finished()`` waits for the run to end
    while the kernel keeps serving the view (stop stays clickable during Run All); :meth:`wait`
    blocks instead. After either, the experiment is usable. :meth:`run` trains in the cell itself (blocking;
    the kernel's interrupt button stops it). After a run is done, "train" trains the number of
    steps in the box again. The logic is :class:`workbench.train.FitSession` (``self.session``).

    Args:
        exp: The :class:`~workbench.AdapterExperiment` to train.
        data: What ``exp.fit`` takes: a DataLoader / iterable of raw batches or a map-style dataset
            (default: the config's ``data:`` block).
        steps: How many more steps a run trains.
        smoothing: The weight of the loss plot's moving average, in [0, 1) (0: the raw losses).
        plot_every: Seconds between redraws of the loss plot while a run trains, once the view is displayed
            (a run before that, such as ``Fit(...).run()``, draws the plot once, when it ends).

    Examples:
        >>> fit = Fit(exp, train, steps=1).start()    # returns at once; display `fit` to watch it
        >>> fit = fit.wait()                          # a notebook's next cell: `await fit.finished()`
        >>> fit.session.state
        'done'
    """

    def __init__(self, exp: Any, data: Any = None, steps: int = 100, smoothing: float = 0.9,
                 plot_every: float = 0.5):
        super().__init__()
        self.session = FitSession(exp, data, steps)
        self.exp, self.smoothing, self.plot_every = exp, smoothing, plot_every
        self.start_step = exp.step
        self.add_class("workbench-fit")
        self.image.add_class("workbench-fit-image")
        self.progress = widgets.IntProgress(value=exp.step, min=exp.step, max=self.session.target,
                                            description="training", layout=widgets.Layout(width="360px"))
        self.train_button = button("train", "start, resume, or (when done) train the steps in the box",
                                   icon="play")
        self.stop_button = button("stop", "end the run after the step in progress", icon="stop")
        self.steps_box = widgets.BoundedIntText(value=steps, min=1, max=10**9, description="steps",
                                                layout=widgets.Layout(width="180px"))
        self.status = status_line()
        self.status.add_class("workbench-fit-status")
        self.train_button.on_click(lambda _: self._train_clicked())
        self.stop_button.on_click(lambda _: self.stop())
        self.session.add_listener(self._on_event)
        self._last_plot = 0.0
        self._displayed = False  # a picture nobody sees is not redrawn during a run
        self._started: tuple[float, int] | None = None  # (time, step) when the current run started
        # the status on a line of its own, below the controls: in the row beside them it wrapped
        self.children = (widgets.HBox([self.train_button, self.stop_button, self.steps_box, self.progress]),
                         self.status, self.image)
        self._update_controls()
        self._draw()

    # -- control ---------------------------------------------------------------------------
    def start(self, steps: int | None = None) -> Fit:
        """Train in the background (the remaining steps, or ``steps`` more); returns at once."""
        self.session.start(steps)
        return self

    def resume(self, steps: int | None = None) -> Fit:
        return self.start(steps)

    def run(self, steps: int | None = None) -> Fit:
        """Train in this cell (blocking) and show the result."""
        self.session.run(steps)
        return self

    def stop(self) -> None:
        """End the run after the step in progress."""
        self.session.stop()
        self._update_controls()

    def wait(self, timeout: float | None = None) -> Fit:
        """Block until the background run ends; re-raise its error. The experiment is then usable."""
        self.session.wait(timeout)
        if not self.session.running:
            self._draw()
            self._update_controls()
            self.refresh_display()
        return self

    async def finished(self) -> Fit:
        """Wait for the background run to end without blocking the kernel: ``await fit.finished()`` in a
        notebook cell. While it waits the kernel keeps handling widget messages, so "stop" works even
        during Run All with more cells queued behind this one (a blocking :meth:`wait` holds them off)."""
        while self.session.running:
            await asyncio.sleep(0.05)
        return self.wait()

    def _train_clicked(self) -> None:
        if self.session.state in ("ready", "stopped"):
            self.start()
        elif self.session.state in ("done", "failed"):
            self.start(self.steps_box.value)

    # -- drawing ---------------------------------------------------------------------------
    def _on_event(self, session: FitSession, event: str) -> None:
        if event == "start":
            self._started = (time.perf_counter(), self.exp.step)
            self.progress.max = session.target
            self._update_controls()
        elif event == "step":
            self._update_controls()
            if self._displayed and time.perf_counter() - self._last_plot >= self.plot_every:
                self._draw()
        else:  # end
            self._draw()
            self._update_controls()
            self.refresh_display()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        self._displayed = True
        return super()._repr_mimebundle_(**kwargs)

    def _draw(self) -> None:
        history = list(self.session.history)
        steps, losses = [s for s, _ in history], [v for _, v in history]
        title = f"training loss · {self.exp.name}" if getattr(self.exp, "name", None) else "training loss"
        # while it runs (or before) the axis spans the planned run; once stopped, the steps it trained
        target = self.session.target if self.session.running or not steps else None
        self.timed(lambda: self.show(render.loss_figure(steps, losses, target, self.start_step,
                                                        self.smoothing, title)))
        self._last_plot = time.perf_counter()

    def _update_controls(self) -> None:
        s = self.session
        self.progress.value = min(max(self.exp.step, self.progress.min), self.progress.max)
        self.train_button.disabled = s.running
        self.stop_button.disabled = not s.running
        self.train_button.description = {"stopped": "resume", "done": "train more", "failed": "retry"}.get(
            s.state, "train")
        loss = f" · loss {s.history[-1][1]:.4f}" if s.history else ""
        rate = ""
        if s.running and self._started is not None:
            elapsed, done = time.perf_counter() - self._started[0], self.exp.step - self._started[1]
            if done > 0 and elapsed > 0:
                per_second = done / elapsed
                rate = (f" · {per_second:.1f} steps/s · "
                        f"ETA {_duration((s.target - self.exp.step) / per_second)}")
        elif s.seconds > 0 and s.history:
            rate = f" · {len(s.history) / s.seconds:.1f} steps/s"
        lr = _learning_rate(self.exp)
        rate += f" · lr {lr:.2g}" if lr is not None else ""
        error = (f" · <span style='color:#b2182b'>{type(s.error).__name__}: {s.error}</span>" if s.error
                 else "")
        self.status.value = status_lines(f"step {self.exp.step}/{s.target}{loss} · {s.state}{rate}{error}")

    def summary(self) -> str:
        return self.session.describe()


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


def _learning_rate(exp: Any) -> float | None:
    """The optimizer's current learning rate when it is a plain number (never read back from a device)."""
    groups = getattr(getattr(exp, "optimizer", None), "param_groups", None)
    lr = groups[0].get("lr") if groups else None
    return float(lr) if isinstance(lr, Real) else None
