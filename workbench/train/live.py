"""A training run a notebook can start, stop and resume while staying responsive.

    session = FitSession(exp, data, steps=200)
    session.start()          # trains in a background thread; returns at once
    session.stop()           # the run ends after the step in progress (exactly, as on Ctrl-C)
    session.start()          # resumes towards the same 200 steps
    session.wait()           # blocks until the run ends; the experiment is then usable

Training is ``exp.fit`` itself, so stopping and resuming keep its guarantees: a stop ends the
run at a step boundary (the stop is raised as ``KeyboardInterrupt`` from a callback before the
next step begins, which ``fit`` handles exactly like Ctrl-C), and the resumed run is
bit-identical to an uninterrupted one. :meth:`FitSession.run` does the same in the calling
thread (a notebook cell that blocks; the kernel's interrupt button then stops it).

While a background run is going, the experiment belongs to it: call :meth:`FitSession.wait`
before sampling or evaluating with the same experiment. Torch's intra-op thread count is
process-wide (``torch.set_num_threads``), so the background run uses what the notebook set.

A session never makes a step wait for the device: ``history`` grows when the experiment reads
its losses back (every ``training.sync_every`` steps, and when the run ends), while the
``"step"`` event, for progress, comes after every step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from workbench.core.callbacks import Callback
from workbench.errors import InspectError

State = Literal["ready", "running", "stopping", "stopped", "done", "failed"]
Listener = Callable[["FitSession", str], None]


class _SessionHook(Callback):
    """Raises the stop request at a step boundary, reports each completed step, and collects the
    losses the experiment has read back (never the step's own loss tensor: reading it would make
    every step wait for the device)."""

    def __init__(self, session: FitSession):
        self.session = session
        self.seen = 0  # entries of exp.loss_history already in the session's history

    def key(self) -> Any:
        return (type(self), id(self.session))

    def on_fit_start(self, exp) -> None:
        self.seen = len(exp.loss_history)

    def on_step_start(self, exp, step: int) -> None:
        if self.session._stop.is_set():
            raise KeyboardInterrupt  # fit undoes nothing (no work done yet) and stops after step `step`

    def on_step_end(self, exp, step: int, metrics: dict) -> None:
        self._collect(exp)
        self.session._notify("step")

    def on_fit_end(self, exp) -> None:
        self._collect(exp)

    def _collect(self, exp) -> None:
        losses = exp.loss_history
        new = len(losses) - self.seen
        if new > 0:
            first = getattr(exp, "synced_step", exp.step) - new + 1
            self.session.history.extend(zip(range(first, first + new), losses[self.seen:]))
            self.seen = len(losses)


class FitSession:
    """``exp.fit(data, ...)`` towards ``exp.step + steps`` total steps, startable, stoppable, resumable.

    ``history``: ``(step, loss)`` of every step this session ran, as far as the experiment has
    read the losses back (every ``training.sync_every`` steps; all of them once the run has
    ended). ``state``: ``ready``, ``running``, ``stopping`` (a stop was requested), ``stopped``
    (steps remain; start again to resume), ``done``, or ``failed`` (``error`` holds the exception;
    :meth:`wait` re-raises it).
    Listeners ``fn(session, event)`` are called with ``"start"``, ``"step"`` (after each step) and
    ``"end"``, from the thread that trains.

    Args:
        exp: The :class:`~workbench.AdapterExperiment` to train.
        data: What ``exp.fit`` takes (default: the config's ``data:`` block).
        steps: How many more steps this session trains.

    Raises:
        InspectError: When ``exp`` is not an experiment or ``steps`` is not a positive int.
    """

    def __init__(self, exp: Any, data: Any = None, steps: int = 100):
        if not callable(getattr(exp, "fit", None)) or not hasattr(exp, "step"):
            raise InspectError(f"FitSession needs an AdapterExperiment (with fit() and step), got "
                               f"{type(exp).__name__}.")
        self.exp, self.data = exp, data
        self.target = exp.step + self._check_steps(steps)
        self.history: list[tuple[int, float]] = []
        self.state: State = "ready"
        self.error: BaseException | None = None
        self.seconds = 0.0  # wall time spent training in this session
        self._stop = threading.Event()
        self._lock = threading.Lock()  # state changes from the caller's and the training thread
        self._thread: threading.Thread | None = None
        self._listeners: list[Listener] = []
        self._hook = _SessionHook(self)

    @staticmethod
    def _check_steps(steps: Any) -> int:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InspectError(f"steps must be a positive int (optimizer steps to train), got {steps!r}.")
        return steps

    # -- state -----------------------------------------------------------------------------
    @property
    def remaining(self) -> int:
        return max(0, self.target - self.exp.step)

    @property
    def running(self) -> bool:
        return self.state in ("running", "stopping")

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def _notify(self, event: str) -> None:
        for fn in list(self._listeners):
            fn(self, event)

    def describe(self) -> str:
        done = self.exp.step
        loss = f", loss {self.history[-1][1]:.4f}" if self.history else ""
        return f"step {done}/{self.target}{loss} ({self.state})"

    # -- control ---------------------------------------------------------------------------
    def _prepare(self, steps: int | None) -> None:
        if self.running:
            raise InspectError("This run is already training; stop() it or wait() for it first.")
        if steps is not None:
            self.target = self.exp.step + self._check_steps(steps)
        if self.remaining == 0:
            raise InspectError(f"Nothing left to train: the experiment is at step {self.exp.step}, "
                               f"the target of this run. Pass steps=N to train N more.")
        with self._lock:
            self.error = None
            self._stop.clear()
            self.state = "running"

    def _train(self) -> None:
        started = time.perf_counter()
        self._notify("start")
        error = None
        try:
            self.exp.fit(self.data, steps=self.remaining, callbacks=[self._hook], progress=False)
        except BaseException as err:  # kept for wait() to re-raise in the caller's thread
            error = err
        finally:
            with self._lock:
                self.error = error
                self.state = "failed" if error is not None else "done" if self.remaining == 0 else "stopped"
            self.seconds += time.perf_counter() - started
            self._notify("end")

    def start(self, steps: int | None = None) -> FitSession:
        """Train the remaining steps (or ``steps`` more) in a background thread; returns at once."""
        self._prepare(steps)
        self._thread = threading.Thread(target=self._train, name="workbench-fit", daemon=True)
        self._thread.start()
        return self

    def resume(self, steps: int | None = None) -> FitSession:
        """:meth:`start` again after a stop: continues towards the same target (or ``steps`` more)."""
        return self.start(steps)

    def run(self, steps: int | None = None) -> FitSession:
        """Train in the calling thread (blocking) and re-raise any error; Ctrl-C stops it cleanly."""
        self._prepare(steps)
        self._train()
        return self.wait()

    def stop(self) -> None:
        """Ask the run to end after the step in progress (nothing happens if it is not running)."""
        with self._lock:
            if self.running:
                self._stop.set()
                self.state = "stopping"

    def wait(self, timeout: float | None = None) -> FitSession:
        """Block until a background run ends (or ``timeout`` seconds pass); re-raise its error if it
        failed."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return self
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return self


__all__ = ["FitSession"]
