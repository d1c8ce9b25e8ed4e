"""The recorder: a ``compose_fn`` + ``on_step`` pair handed to the backbone's native sampler.

The sampler calls ``compose_fn`` for every prediction and ``on_step`` once per step after that
step's calls. :class:`Recorder` answers the calls of a fork's replayed prefix from the parent's
cache (no model call) and evaluates the live ones through the composed model, keeping what the
:class:`~workbench.inspect.recording.storage.StoragePolicy` asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from workbench.core.backbone import StepRecord
from workbench.core.composed import ComposedModel, Prediction
from workbench.core.conditions import Batch
from workbench.errors import CallbackError
from workbench.inspect.common import InspectError
from workbench.inspect.recording.settings import Settings
from workbench.inspect.recording.step import TrajectoryStep
from workbench.inspect.recording.storage import StoragePolicy, store

OnTrajectoryStep = Callable[[TrajectoryStep], None]


class StopSampling(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raise from an ``on_step`` callback to stop sampling after that step.

    :func:`record` (and :meth:`Trajectory.fork`) then return the partial trajectory
    (``traj.complete`` is False); ``traj.resume()`` finishes it, bit-identical to a run that was
    never stopped. This is how a notebook's stop button pauses a sample.
    """


class Recorder:
    """Serves replayed steps from a cache and records the live ones."""

    def __init__(self, model: ComposedModel, settings: Settings, storage: StoragePolicy, *, keep: bool,
                 prefix: Sequence[TrajectoryStep], live_from: int,
                 on_step: OnTrajectoryStep | None):
        self.model, self.settings, self.storage, self.keep = model, settings, storage, keep
        self.prefix, self.live_from, self.user_on_step = prefix, live_from, on_step
        self.step = 0  # the index of the step the sampler is in
        self.calls: list[torch.Tensor] = []  # compose_fn outputs of the current step
        self.pending: Prediction | None = None
        self.log: list[TrajectoryStep] = []  # the live steps, when kept
        self.native: torch.dtype | None = None

    def compose(self, x_t: torch.Tensor, t: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.step < self.live_from:
            cached = self.prefix[self.step].calls[len(self.calls)]
            self.calls.append(cached)
            # a copy: the sampler may modify its prediction in place, the parent's cache must not change
            return cached.to(device=x_t.device, copy=True, non_blocking=True)
        pred = self.model.predict(x_t, t, batch, with_adapter=self.settings.with_adapter)
        if not self.calls:
            self.pending = pred
        self.calls.append(pred.composed)
        return pred.composed

    def on_step(self, rec: StepRecord) -> None:
        if rec.index != self.step:
            raise InspectError(
                f"The sampler reported step {rec.index} while step {self.step} was expected: recording needs "
                f"on_step called once per step, in order, after that step's compose_fn calls."
            )
        if not self.calls:
            raise InspectError(f"The sampler finished step {rec.index} without calling compose_fn; "
                               f"nothing to record.")
        live = self._record(rec) if self.step >= self.live_from else None
        self.step += 1  # the step is done (and stored) before the user sees it: a stop keeps it
        self.calls, self.pending = [], None
        if live is not None and self.user_on_step is not None:
            try:
                self.user_on_step(live)
            except StopSampling:
                raise
            except Exception as err:
                name = getattr(self.user_on_step, "__qualname__", type(self.user_on_step).__name__)
                raise CallbackError(f"on_step callback {name} raised at step {rec.index} of {rec.steps}: "
                                    f"{type(err).__name__}: {err}") from err

    def _record(self, rec: StepRecord) -> TrajectoryStep | None:
        if not self.keep and self.user_on_step is None:
            return None
        model, storage, pred = self.model, self.storage, self.pending
        self.native = rec.x_t.dtype
        noise_level = model.objective.noise_level(rec.t)
        keep_fields = self.keep and storage.keeps(rec.index, rec.steps, self.live_from)
        want_x0 = (keep_fields and "x0" in storage.fields) or self.user_on_step is not None
        # x0 is the composed prediction's estimate at the step's x_t, in the dtype the composition saw: what
        # x0_of(recompose) gives for this step. Under guidance the sampler's update mixes in the unconditional
        # branch; its estimate is the live step's guided_x0 (equal to x0 where nothing is mixed in).
        x0 = (model.objective.x0_from_prediction(pred.composed, rec.x_t.to(pred.x_t.dtype), rec.t)
              if want_x0 else None)
        live = TrajectoryStep(rec.index, rec.steps, rec.t, noise_level, rec.x_t, x0, pred.base, pred.adapter,
                              pred.composed, pred.diagnostics)
        if self.user_on_step is not None:
            live.guided_x0 = (x0 if rec.prediction is pred.composed
                              else model.objective.x0_from_prediction(rec.prediction, rec.x_t, rec.t))
        if self.keep:
            device, dtype = storage.device, storage.dtype
            t = store(rec.t, device)
            # (an objective whose noise level is t itself: one private copy serves both)
            noise = t if noise_level is rec.t else store(noise_level, device)
            kept = TrajectoryStep(rec.index, rec.steps, t, noise, stored=None)  # its fields skipped
            if keep_fields:
                values = {}
                for name in storage.fields:
                    value = getattr(live, name)
                    if value is None:
                        values[name] = None
                    elif (value is x0 and self.user_on_step is None
                            and _fresh(x0, (pred.composed, rec.x_t, rec.t))):
                        values[name] = store(x0, device, dtype, private=True)  # nobody else holds it: no copy
                    else:
                        values[name] = store(value, device, dtype)
                diagnostics = pred.diagnostics.map(lambda v: store(v, device, dtype))
                kept = TrajectoryStep(rec.index, rec.steps, t, noise, diagnostics=diagnostics,
                                      stored=storage.fields, **values)
            if storage.replay:
                kept.calls = tuple(kept.composed if i == 0 and keep_fields and storage.shares_replay(c.dtype)
                                   else store(c, device) for i, c in enumerate(self.calls))
            self.log.append(kept)
        return live


def _fresh(x0: torch.Tensor, sources: tuple[torch.Tensor, ...]) -> bool:
    """Whether the x0 estimate is a tensor of its own: the objective computed it from ``sources`` (the
    composed prediction, ``x_t``, ``t``) rather than returning one of them, or a view of one."""
    own = x0.untyped_storage().data_ptr()
    return all(own != other.untyped_storage().data_ptr() for other in sources)


def generator_state(generator: torch.Generator | None, seed: int, device: torch.device) -> torch.Tensor:
    if generator is not None:
        if generator.device.type != device.type:
            raise InspectError(f"generator is on {generator.device}, but the batch is on {device}; "
                               f"the initial noise is drawn on the batch's device. "
                               f"Pass torch.Generator(device='{device}').")
        return generator.get_state()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InspectError(f"seed must be an int, got {seed!r}.")
    return torch.Generator(device=device).manual_seed(int(seed)).get_state()


__all__ = ["OnTrajectoryStep", "Recorder", "StopSampling", "generator_state"]
