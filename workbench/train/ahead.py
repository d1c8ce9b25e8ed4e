"""The frozen base one step ahead, in a second process: two CPU cores train what one trains.

An outside adapter's training step is two halves that need not run in one process: the frozen
base's half (read the batch, draw the noise and ``t`` from the step's seeded generator, run the
base without grad: a :class:`~workbench.core.composed.BaseHalf`) depends on the data and the seed
only, never on the trainable weights; the adapter's half (conditioning, adapter, composer, loss,
backward, optimizer) needs the base's output. :class:`BaseAhead` runs the first half in a second
process, steps ahead of the training process, which then runs only the second half: ``fit`` reads
the :class:`AheadStream` and asks it for each micro-batch's base half
(:meth:`~workbench.train.data.DataStream.base_half`), which it hands to
:meth:`ComposedModel.training_loss <workbench.core.composed.ComposedModel.training_loss>`.

The second process builds the same experiment from the same config (the same base weights, the
same seeded data order and noise) and runs the same functions on the same inputs with as many
threads, so the values it hands over are bit for bit those the training process would have
computed: the run trains exactly the weights, loss history and data position of the one-process
run (tested in ``tests/test_ahead.py``). Unlike ``torchrun`` data parallelism this keeps a run whose
step is one micro-batch (``grad_accum: 1``) unchanged; it splits each step's work, not its batch.

After training the same process predicts clips (:meth:`BaseAhead.predict`), so an evaluation
splits its chunks over both processes with each chunk's own seeded noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from workbench.core.backbone import max_generate_batch
from workbench.core.composed import BaseHalf
from workbench.core.conditions import Batch
from workbench.errors import WorkbenchError
from workbench.train.data import DataStream
from workbench.train.seeds import StepNoise
from workbench.workers import adopt_environment, worker_context


class AheadError(WorkbenchError, RuntimeError):
    """The second process failed, died or handed over values for another step."""


@dataclasses.dataclass
class Ahead:
    """One micro-batch as the second process hands it over: the prepared ``batch``, the frozen
    base's half of its training step, which step and micro-batch that is, and the data position
    after it (``{"epoch", "batches"}``, as the config's own data stream counts)."""

    step: int
    micro: int
    batch: Batch
    half: BaseHalf
    position: dict[str, int]

    def half_for(self, step: int, micro: int) -> BaseHalf:
        """:attr:`half`, checked to be for micro-batch ``micro`` of step ``step``."""
        if (self.step, self.micro) != (step, micro):
            raise AheadError(f"The batch computed ahead is for step {self.step}, micro-batch {self.micro}, "
                             f"but the training loop is at step {step}, micro-batch {micro}: "
                             f"the two processes disagree on the position. "
                             f"Train on one process (workbench demo --processes 1).")
        return self.half


def _serve(config: dict, steps: int, start: int, data_state: dict | None, threads: int, requests,
           results, environment: dict[str, str]) -> None:
    """The second process: the base's half of ``steps`` steps from ``start``, then prediction requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    adopt_environment(environment)
    torch.set_num_threads(threads)
    try:
        from workbench.inspect.recording.clips import predict_clips
        from workbench.train.config import parse_experiment
        from workbench.train.experiment import AdapterExperiment, autocast

        exp = AdapterExperiment.from_config(parse_experiment(config))
        model = exp.model
        stream = exp.feed.stream()  # the config's data, its latent cache and its seeded order
        if data_state is not None:
            stream.load_state_dict(data_state)
        noise = StepNoise(exp.training.seed, exp.device)  # the training process's draws
        for step in range(start, start + steps):
            for micro in range(exp.training.grad_accum):
                batch = exp.prepare(stream.next())
                with autocast(exp.training.amp_dtype, exp.device):  # as the training step runs it
                    half = model.base_half(batch, noise.generator(step, micro))
                results.put(("batch", Ahead(step, micro, batch, half, stream.state_dict())))
        while True:
            kind, *args = requests.get()
            if kind == "stop":
                break
            if kind == "weights":
                model.load_trainable_state_dict(args[0])
            elif kind == "predict":
                key, clips, kwargs = args
                results.put(("videos", key, predict_clips(model, clips, **kwargs)))
    except BaseException as err:  # reported to the training process, which raises it
        results.put(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))


class BaseAhead:
    """A second process running the frozen base's half of every training step ahead (see the module).

    ``config``: the experiment's resolved config (``exp.resolved_config()``); ``steps``: how many
    steps from ``start`` (the experiment's step) it prepares; ``data_state``: the data position at
    ``start`` (a resumed run's). ``depth``: how many micro-batches it may run ahead. ``start_method``: a
    multiprocessing start method, or None for :func:`workbench.workers.worker_context`'s. Use
    :meth:`stream` as the data of ``fit``; :meth:`close` (or the ``with`` block) ends it.
    """

    def __init__(self, config: Mapping[str, Any], *, steps: int, start: int = 0,
                 data_state: dict | None = None,
                 threads: int | None = None, depth: int = 3, start_method: str | None = None):
        import multiprocessing
        import os

        ctx = worker_context() if start_method is None else multiprocessing.get_context(start_method)
        self._requests = ctx.Queue()
        self._results = ctx.Queue(maxsize=depth)
        self._process = ctx.Process(
            target=_serve, name="workbench-base-ahead", daemon=True,
            args=(dict(config), steps, start, data_state, threads or torch.get_num_threads(), self._requests,
                  self._results, dict(os.environ)))
        self._process.start()
        self.steps = steps
        self._closed = False

    def __enter__(self) -> BaseAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- messages ----------------------------------------------------------------------------
    def _get(self, expect: str) -> tuple:
        while True:
            try:
                message = self._results.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive():
                    code = self._process.exitcode
                    self.close()
                    raise AheadError(
                        f"The second process (the frozen base's half of each step, and half the clips) "
                        f"exited with code {code} without a word. "
                        f"Run on one process: workbench demo --processes 1.") from None
                continue
            if message[0] == "error":
                self.close()
                raise AheadError(f"The second process failed: {message[1]}\n{message[2]}"
                                 f"Run on one process to see it there: workbench demo --processes 1.")
            if message[0] != expect:
                self.close()
                raise AheadError(f"The second process sent {message[0]!r} where {expect!r} was due.")
            return message[1:]

    def next_batch(self) -> Ahead:
        """The next micro-batch the second process prepared, with its base half and data position."""
        (ahead,) = self._get("batch")
        return ahead

    def stream(self, *, batch_size: int, seed: int = 0) -> AheadStream:
        """The training data as ``fit`` reads it: these batches, positioned as the config's stream."""
        return AheadStream(self, batch_size=batch_size, seed=seed)

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Give the second process the trained adapter and composer (``model.trainable_state_dict()``)."""
        self._requests.put(("weights", dict(state)))

    def predict(self, model, requests: Mapping[str, tuple[list, bool]], *, chunk: int = 12,
                on_chunk: Callable[[int], None] | None = None, **kwargs: Any) -> dict:
        """:func:`~workbench.inspect.recording.clips.predict_clips` for each of ``requests``
        (name -> ``(clips, adapter)``), the chunks shared between this process (``model``) and the
        second one.

        Each chunk is seeded by its place in its list (the ``offset`` of ``predict_clips``), so the
        videos are those one process predicts. The second process takes about half the work
        (a chunk with the adapter counted 1.4 times one without), and must hold the same weights
        (:meth:`load_weights`).
        """
        import numpy as np

        from workbench.inspect.recording.clips import predict_clips

        limit = max_generate_batch(model.base)
        chunk = max(1, min(chunk, limit) if limit else chunk)
        units = [(name, lo, len(clips[lo:lo + chunk]) * (1.4 if adapter else 1.0))
                 for name, (clips, adapter) in requests.items() for lo in range(0, len(clips), chunk)]
        mine, theirs, load = [], [], [0.0, 0.0]
        for unit in sorted(units, key=lambda u: -u[2]):  # the largest first, each to the lighter side
            side = 0 if load[0] <= load[1] else 1
            (mine, theirs)[side].append(unit)
            load[side] += unit[2]
        for name, lo, _ in theirs:
            clips, adapter = requests[name]
            self._requests.put(("predict", (name, lo), clips[lo:lo + chunk],
                                {"offset": lo, "chunk": chunk, "with_adapter": adapter, **kwargs}))
        parts: dict[tuple[str, int], np.ndarray] = {}
        for name, lo, _ in mine:
            clips, adapter = requests[name]
            parts[(name, lo)] = predict_clips(model, clips[lo:lo + chunk], offset=lo, chunk=chunk,
                                              with_adapter=adapter, **kwargs)
            if on_chunk is not None:
                on_chunk(len(clips[lo:lo + chunk]))
        for _ in theirs:
            key, videos = self._get("videos")
            parts[key] = videos
            if on_chunk is not None:
                on_chunk(len(videos))
        return {name: np.concatenate([parts[(name, lo)] for lo in range(0, len(clips), chunk)])
                for name, (clips, _) in requests.items()}

    def close(self, timeout: float = 2.0) -> None:
        """End the second process: asked to stop, which it does at once once its steps are handed over;
        ended if it has not stopped within ``timeout`` seconds (e.g. steps ahead of an interrupted fit)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._requests.put(("stop",))
        deadline = time.monotonic() + timeout
        while self._process.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # (a process blocked on a full queue stops once it is read)
                self._results.get(timeout=0.1)
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout)
        for q in (self._requests, self._results):
            q.cancel_join_thread()
            q.close()


class AheadStream(DataStream):
    """The batches a :class:`BaseAhead` prepares, with the position the config's own data stream
    would have after each (so checkpoints record the same data position), and the frozen base's half
    of each (:meth:`base_half`); a partial step rolled back on Ctrl-C is served again (``mark`` /
    ``rollback`` / ``commit`` are :class:`DataStream`'s)."""

    def __init__(self, ahead: BaseAhead, *, batch_size: int, seed: int = 0):  # (no source of its own to read)
        self.ahead = self.source = ahead
        self.batch_size, self.seed = batch_size, seed
        self.map_style, self.reiterable = False, False
        self.epoch, self.batches = 0, 0
        self._it = None
        self._pending: list = []
        self._recent: list | None = None
        self._served: Ahead | None = None

    def next(self) -> Batch:
        if self._pending:
            item, self.epoch, self.batches = self._pending.pop(0)
        else:
            item = self.ahead.next_batch()
            self.epoch, self.batches = int(item.position["epoch"]), int(item.position["batches"])
        if self._recent is not None:
            self._recent.append((item, self.epoch, self.batches))
        self._served = item
        return item.batch

    def base_half(self, step: int, micro: int) -> BaseHalf:
        """The frozen base's half of the batch last served, checked to be for micro-batch ``micro``
        of step ``step``."""
        if self._served is None:
            raise AheadError("No batch computed ahead has been served yet, so there is no base half to give.")
        return self._served.half_for(step, micro)

    def load_state_dict(self, state: dict) -> None:
        raise AheadError("A stream computed ahead starts where its BaseAhead was told to (data_state=...); "
                         "it cannot be repositioned.")


__all__ = ["Ahead", "AheadError", "AheadStream", "BaseAhead"]
