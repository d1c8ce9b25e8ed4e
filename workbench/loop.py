"""The small training loop every side trainer runs on, the one learning-rate schedule, and the Ctrl-C guard.

:class:`AdapterExperiment <workbench.train.experiment.AdapterExperiment>` trains adapters with
callbacks, checkpoints and distributed data; the library also trains a few small models of its
own — the tiny preview decoder (:mod:`workbench.inspect.previews.tiny_preview`), and in the world-model
wing the embedded backbone (:mod:`workbench.worldmodel.pretrain`) and the hand probe
(:mod:`workbench.worldmodel.probe`). Those run on :class:`TrainingLoop`: a loss per step from
your function, the update, a progress bar, and a Ctrl-C that never leaves a half-made step (see
the example below).

:class:`LRSchedule` is the learning rate of every loop, AdapterExperiment's included
(``TrainingConfig.lr_at`` is one): a linear warm-up then a cosine decay to a floor, a constant,
or the one-cycle policy.

Why a leaf module: three layers need it — ``inspect`` (the preview distillation), ``train``
(the schedule and the guard) and the world-model wing — and ``inspect`` may not import
``train``. It is machinery, not part of the component contract, so it does not belong in
``core`` either. It needs only torch (tqdm when a bar is shown) and the project's errors, so any
module of the library can import it without pulling in anything else.

Examples:
    >>> import torch.nn.functional as F
    >>> net, gen = torch.nn.Linear(4, 1), torch.Generator().manual_seed(0)
    >>> x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)
    >>> loop = TrainingLoop(torch.optim.AdamW(net.parameters()), LRSchedule(peak=1e-3, steps=50, warmup=5),
    ...                     clip_grad_norm=1.0, randomness=[gen], name="my model")
    >>> losses = loop.run(lambda step: F.mse_loss(net(x[step % 8]), y[step % 8]))
    >>> len(losses)                                # one loss per step
    50
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from workbench.errors import ConfigError

SHAPES = ("cosine", "constant", "one_cycle")


def _anneal(start: float, end: float, pct: float) -> float:
    """Cosine from ``start`` (``pct = 0``) to ``end`` (``pct = 1``); the arithmetic of torch's OneCycleLR."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate at each optimizer step (0-based) of a run of ``steps`` steps.

    ``shape``:

    * ``"cosine"``: ``warmup`` steps rising linearly to ``peak`` (step ``k`` gets
      ``peak (k + 1) / warmup``), then a cosine from ``peak`` at step ``warmup`` down to
      ``floor · peak`` at step ``steps`` (held there if the run goes on).
    * ``"constant"``: the same warm-up, then ``peak``.
    * ``"one_cycle"``: the 1cycle policy exactly as ``torch.optim.lr_scheduler.OneCycleLR``
      computes it (cosine annealing, two phases): a cosine from ``peak / div`` at step 0 up to
      ``peak`` at step ``warmup - 1``, then down to ``peak / div / final_div`` at the last step.
      With ``momentum = (low, high)``, Adam's ``beta1`` runs the other way: ``high`` at the ends,
      ``low`` at the peak (:meth:`beta1_at`). :meth:`one_cycle` builds one from ``pct_start``.

    Examples:
        >>> s = LRSchedule(peak=1e-3, steps=100, warmup=10, floor=0.1)
        >>> s.lr_at(0), s.lr_at(9), s.lr_at(10), round(s.lr_at(99), 7)
        (0.0001, 0.001, 0.001, 0.0001003)
    """

    peak: float
    steps: int
    warmup: float = 0
    shape: Literal["cosine", "constant", "one_cycle"] = "cosine"
    floor: float = 0.0
    div: float = 25.0
    final_div: float = 1e4
    momentum: tuple[float, float] | None = None

    def __post_init__(self):
        problems = []
        if self.shape not in SHAPES:
            problems.append(f"shape {self.shape!r} is not one of {', '.join(SHAPES)}")
        if not self.peak > 0:
            problems.append(f"peak must be > 0, got {self.peak}")
        if self.steps < 0:
            problems.append(f"steps must be >= 0, got {self.steps}")
        if self.warmup < 0:
            problems.append(f"warmup must be >= 0, got {self.warmup}")
        if not 0 <= self.floor <= 1:
            problems.append(f"floor must be in [0, 1] (a fraction of peak), got {self.floor}")
        if not (self.div > 0 and self.final_div > 0):
            problems.append(f"div and final_div must be > 0, got {self.div} and {self.final_div}")
        if self.momentum is not None and (self.shape != "one_cycle" or len(self.momentum) != 2
                                          or not all(0 <= m < 1 for m in self.momentum)):
            problems.append(f"momentum must be (low, high) in [0, 1) with shape 'one_cycle', "
                            f"got {self.momentum!r} with shape {self.shape!r}")
        if problems:
            raise ConfigError(f"LRSchedule: {'; '.join(problems)}.")

    @classmethod
    def one_cycle(cls, peak: float, steps: int, pct_start: float = 0.1, div: float = 25.0,
                  final_div: float = 1e4, momentum: tuple[float, float] | None = (0.85, 0.95)) -> LRSchedule:
        """The 1cycle policy: the peak at ``pct_start`` of the run (what ``OneCycleLR`` takes)."""
        if not 0 <= pct_start <= 1:
            raise ConfigError(f"LRSchedule.one_cycle: pct_start must be in [0, 1], got {pct_start}.")
        return cls(peak=peak, steps=steps, warmup=float(pct_start * steps), shape="one_cycle", div=div,
                   final_div=final_div, momentum=momentum)

    def _one_cycle_phase(self, step: int) -> tuple[bool, float]:
        """``(rising, pct)``: which half of the cycle ``step`` is in, and how far along (0 to 1)."""
        top = self.warmup - 1  # the step at the peak (OneCycleLR's end of the first phase)
        if step <= top and top > 0:
            return True, step / top
        span = (self.steps - 1) - top
        return False, (step - top) / span if span > 0 else 1.0

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        if self.shape == "one_cycle":
            start = self.peak / self.div
            rising, pct = self._one_cycle_phase(step)
            return (_anneal(start, self.peak, pct) if rising
                    else _anneal(self.peak, start / self.final_div, pct))
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if self.shape == "constant":
            return self.peak
        span = max(1, self.steps - self.warmup)
        return _anneal(self.peak, self.peak * self.floor, min(1.0, (step - self.warmup) / span))

    def beta1_at(self, step: int) -> float | None:
        """Adam's ``beta1`` for step ``step`` when the schedule cycles it (``momentum``), else ``None``."""
        if self.momentum is None:
            return None
        low, high = self.momentum
        rising, pct = self._one_cycle_phase(step)
        return _anneal(high, low, pct) if rising else _anneal(low, high, pct)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set ``optimizer``'s learning rate (and ``beta1``, when cycled) for ``step``; returns the rate."""
        lr, beta1 = self.lr_at(step), self.beta1_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
            if beta1 is not None:
                group["betas"] = (beta1, *group["betas"][1:])
        return lr


class SigintGuard:
    """For the length of a run: a Ctrl-C (the notebook stop button) that arrives while ``holding``
    is held until :meth:`release`, so an optimizer update is never cut in half.

    The handler is installed once per run, not per step (installing one costs more than the rest
    of a loop's bookkeeping); outside the held sections it passes Ctrl-C on to the handler it
    replaced. Only the main thread can receive signals: elsewhere (a background fit) it does nothing.
    """

    def __init__(self):
        self.holding = False
        self.received = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> SigintGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        self.holding = self.received = False
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, signum, frame) -> None:
        if self.holding:
            self.received = True
        elif callable(self._previous):
            self._previous(signum, frame)
        elif self._previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def release(self) -> None:
        """End the held section; raise the Ctrl-C that arrived during it, now that it is safe."""
        self.holding = False
        if self.received:
            self.received = False
            raise KeyboardInterrupt


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C stopped a :class:`TrainingLoop` cleanly between two steps.

    The model holds the weights of the last completed step (``step``; a partial step is
    discarded and its random draws are rolled back). :meth:`resume` continues the work where it
    stopped and returns what the interrupted call would have returned, bit for bit as if it had
    never stopped. It is a ``KeyboardInterrupt``, so code that stops on Ctrl-C still stops.
    """

    def __init__(self, name: str, step: int, steps: int, resume: Callable[[], Any]):
        super().__init__(
            f"Interrupted: {name} stopped cleanly after step {step} of {steps} "
            f"(a partial step was discarded, so the model holds step {step}'s weights). "
            f"Continue with resume() on this exception (`except Interrupted as stop: stop.resume()`; "
            f"in a notebook, `sys.last_value.resume()`)."
        )
        self.name, self.step, self.steps = name, step, steps
        self._resume = resume

    def resume(self) -> Any:
        """Continue the interrupted work; returns its result (an interruption raises a new
        :class:`Interrupted`)."""
        return self._resume()

    def then(self, rest: Callable[[Any], Any]) -> Interrupted:
        """This interruption, with ``rest(result)`` run after the interrupted work when it is resumed."""
        return Interrupted(self.name, self.step, self.steps, lambda: then(self.resume, rest))


def then(work: Callable[[], Any], rest: Callable[[Any], Any]) -> Any:
    """``rest(work())``, such that an :class:`Interrupted` from ``work`` resumes into ``rest`` too.

    How a trainer with several stages stays resumable: each stage's :class:`TrainingLoop` can be
    interrupted, and the exception that reaches the caller continues the whole remaining run.
    """
    try:
        result = work()
    except Interrupted as stop:
        raise stop.then(rest) from None
    return rest(result)


def _snapshot(sources: Sequence[Any]) -> list[Any]:
    out = []
    for source in sources:
        if isinstance(source, np.random.Generator):
            out.append(source.bit_generator.state)
        elif isinstance(source, torch.Generator):
            out.append(source.get_state())
        else:
            raise ConfigError(f"TrainingLoop(randomness=...): expected numpy or torch Generators, got "
                              f"{type(source).__name__}.")
    return out


def _restore(sources: Sequence[Any], states: list[Any]) -> None:
    for source, state in zip(sources, states):
        if isinstance(source, np.random.Generator):
            source.bit_generator.state = state
        else:
            source.set_state(state)


class TrainingLoop:
    """Optimizer steps of one model under an :class:`LRSchedule`, with progress and Ctrl-C rollback.

    Each step: the schedule's learning rate (and ``beta1``) is set, ``loss_fn(step)`` returns the
    step's scalar loss (it draws its own batch), the gradients are computed, clipped to
    ``clip_grad_norm`` (over the optimizer's parameters) and applied, then ``after_update(step)``
    runs (an EMA of the weights, say). The update and ``after_update`` are held together: a
    Ctrl-C waits until both are done. A Ctrl-C earlier in the step discards it, restoring the
    state of every generator in ``randomness`` (numpy or torch) and torch's global one, so a
    resumed run draws exactly what an uninterrupted one would have; the loop then raises
    :class:`Interrupted`. ``losses`` holds every completed step's loss; ``step`` counts them.

    ``progress``: a tqdm bar named ``name``, showing the mean loss of the last ``report_every`` steps.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LRSchedule, *,
                 clip_grad_norm: float | None = None, after_update: Callable[[int], None] | None = None,
                 randomness: Sequence[Any] = (), name: str = "training", progress: bool = True,
                 report_every: int = 50):
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ConfigError(f"TrainingLoop: clip_grad_norm must be > 0 or None, got {clip_grad_norm}.")
        self.optimizer, self.schedule = optimizer, schedule
        self.clip_grad_norm, self.after_update = clip_grad_norm, after_update
        self.randomness = list(randomness)
        _snapshot(self.randomness)  # refuses what it cannot roll back, before any step
        self.name, self.progress, self.report_every = name, progress, max(1, report_every)
        self.step = 0
        self.losses: list[float] = []

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def run(self, loss_fn: Callable[[int], torch.Tensor], until: int | None = None) -> list[float]:
        """Run steps until ``until`` (default: the schedule's ``steps``); returns ``losses``.

        Called again after an interruption (or with a later ``until``), it continues from ``step``.
        """
        until = self.schedule.steps if until is None else until
        bar = None
        if self.progress and self.step < until:
            from tqdm.auto import tqdm

            bar = tqdm(total=until, initial=self.step, desc=self.name, unit="step")
        try:
            with SigintGuard() as guard:
                while self.step < until:
                    self._one_step(loss_fn, guard)
                    if bar is not None:
                        bar.update(1)
                        if self.step % self.report_every == 0:
                            bar.set_postfix(loss=f"{np.mean(self.losses[-self.report_every:]):.4f}")
        except KeyboardInterrupt:
            raise Interrupted(self.name, self.step, until, lambda: self.run(loss_fn, until)) from None
        finally:
            if bar is not None:
                bar.close()
        return self.losses

    def _one_step(self, loss_fn: Callable[[int], torch.Tensor], guard: SigintGuard) -> None:
        step = self.step
        states = _snapshot(self.randomness)
        global_state = torch.get_rng_state()
        try:
            self.schedule.apply(self.optimizer, step)
            loss = loss_fn(step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            value = float(loss.detach())
            guard.holding = True  # a Ctrl-C from here on waits until the update is complete
            try:
                if self.clip_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
                self.optimizer.step()
                if self.after_update is not None:
                    self.after_update(step)
                self.losses.append(value)
                self.step = step + 1
            except BaseException:
                guard.holding = False
                raise
            guard.release()  # raises the Ctrl-C held during the update, if one came
        except KeyboardInterrupt:
            if self.step == step:  # the step did not complete: undo it entirely
                self.optimizer.zero_grad(set_to_none=True)
                _restore(self.randomness, states)
                torch.set_rng_state(global_state)
            raise


__all__ = ["Interrupted", "LRSchedule", "SigintGuard", "TrainingLoop", "then"]
