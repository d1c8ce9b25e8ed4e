"""Recorded native sampling: a :class:`Trajectory` to scrub, fork, resume and re-compose.

    traj = record(model, batch, steps=20, seed=0)        # the backbone's own sampler, recorded
    traj[5].x0                                           # x0 estimate entering step 5 (CPU)
    alt = traj.fork(at=8, cond={"action": pushed})       # steps 0-7 replayed, 8-19 live
    pred = traj.recompose(step=8, cond={"action": pushed})  # adapter + composer only
    frames = traj.frames(8, kind="x0")                   # uint8 [T, H, W, 3], linear preview

Recording never re-implements a sampler: :func:`record` hands ``base.generate`` a ``compose_fn``
(the composed model, with every intermediate kept) and an ``on_step`` (which stores them), so
a recorded run is bit-identical to ``model.generate`` with the same seed. A fork reruns the
same sampler from the same noise with a ``compose_fn`` that returns the parent's cached
composed predictions for the steps before ``at`` — no model call — and evaluates live from
``at`` on; the sampler's own arithmetic then reproduces ``x_at`` bit for bit, for any native
sampler that calls ``compose_fn`` in the same order. A fork at 0 is a fresh run with the new
settings, and a stopped run resumed (``traj.resume()``) equals the uninterrupted one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from workbench.core.backbone import StepRecord
from workbench.core.composed import ComposedModel, Prediction
from workbench.core.composers import ComposeContext, Composer
from workbench.core.conditions import Batch
from workbench.errors import CallbackError
from workbench.inspect.common import (
    InspectError,
    StepError,
    StorageWarning,
    check_choice,
    check_model,
    prepare,
    with_conditions,
)
from workbench.inspect.preview import DEFAULT_CHUNK_FRAMES, render

FIELDS = ("x_t", "x0", "base", "adapter", "composed")
KINDS = FIELDS
ADAPTER_CHOICES = ("on", "off", True, False, None)


class StopSampling(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raise from an ``on_step`` callback to stop sampling after that step.

    :func:`record` (and :meth:`Trajectory.fork`) then return the partial trajectory
    (``traj.complete`` is False); ``traj.resume()`` finishes it, bit-identical to a run that was
    never stopped. This is how a notebook's stop button pauses a sample.
    """


# -- storage ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoragePolicy:
    """What a recording keeps, where, and at what precision.

    Args:
        device: where stored tensors go: ``"cpu"`` (default; from CUDA the copies are
            ``non_blocking`` into pinned memory) or ``None`` to keep them on the model's device.
        dtype: floating dtype of the stored fields and diagnostics (``None`` keeps the model's,
            e.g. float32; ``torch.float16`` halves the memory of a recording).
        every: keep the fields of every ``every``-th step counted from the first live one (0, k,
            2k, ... for a fresh run; ``at``, ``at + k``, ... for a fork) and always the last.
        fields: which per-step tensors to keep, a subset of ``x_t``, ``x0``, ``base``,
            ``adapter``, ``composed``; the composer's diagnostics come with them. ``t`` and the
            noise level are kept for every step.
        replay: keep what forks and :meth:`Trajectory.resume` need — the composed prediction of
            *every* step, at the model's dtype, whatever ``dtype`` / ``every`` / ``fields`` say
            (where a stored ``composed`` is already that, it is not kept twice). ``False``
            saves that memory; the trajectory can then only fork at 0.
        max_bytes: before recording, :func:`estimate_memory` is checked against it; over it
            :func:`record` raises (``on_exceed="raise"``) or warns with a :class:`StorageWarning`
            (``"warn"``) and records anyway.
    """

    device: str | torch.device | None = "cpu"
    dtype: torch.dtype | None = None
    every: int = 1
    fields: tuple[str, ...] = FIELDS
    replay: bool = True
    max_bytes: int | None = None
    on_exceed: Literal["raise", "warn"] = "raise"

    def __post_init__(self):
        if isinstance(self.fields, str):
            object.__setattr__(self, "fields", (self.fields,))
        object.__setattr__(self, "fields", tuple(self.fields))
        for name in self.fields:
            check_choice(name, FIELDS, "StoragePolicy fields entry")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise InspectError(f"StoragePolicy every={self.every!r}; must be an int >= 1 (1 = every step).")
        if self.dtype is not None and not (isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise InspectError(f"StoragePolicy dtype={self.dtype!r}; must be a floating torch dtype (e.g. "
                               f"torch.float16) or None to keep the model's.")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise InspectError(f"StoragePolicy max_bytes={self.max_bytes!r}; must be >= 0 or None.")
        check_choice(self.on_exceed, ("raise", "warn"), "StoragePolicy on_exceed")
        if self.device is not None:
            object.__setattr__(self, "device", torch.device(self.device))

    def keeps(self, index: int, steps: int, start: int = 0) -> bool:
        """Whether step ``index`` of ``steps`` keeps its fields in a run live from ``start``."""
        return (index - start) % self.every == 0 or index == steps - 1

    def shares_replay(self, native: torch.dtype) -> bool:
        """Whether a stored ``composed`` is exactly the replay cache (same dtype)."""
        return "composed" in self.fields and self.dtype in (None, native)


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _store(x: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A private copy of ``x`` for the trajectory (never aliasing what the sampler holds)."""
    x = x.detach()
    converted = dtype is not None and x.is_floating_point() and x.dtype != dtype
    if converted:
        x = x.to(dtype)  # on the source device: moves half the bytes for float16
    if device is None or _same_device(device, x.device):
        return x if converted else x.clone()
    if device.type == "cpu" and x.device.type == "cuda":
        out = torch.empty(x.shape, dtype=x.dtype, device="cpu", pin_memory=True)
        return out.copy_(x, non_blocking=True)
    return x.to(device, non_blocking=True)


def _synchronize(device: torch.device) -> None:
    """Wait for the non_blocking copies off ``device`` (once per run, not per step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- what one step holds ---------------------------------------------------------------------
@dataclass
class TrajectoryStep:
    """One sampling step. Latent-shaped tensors are ``(B, C, T, h, w)``; ``None`` = not stored.

    ``t`` ``(B,)`` is in the objective's units; ``noise_level`` (alias ``sigma``) ``(B,)`` in
    [0, 1]. ``x_t`` entered the step; ``base`` / ``adapter`` / ``composed`` are the predictions
    at ``x_t`` (``adapter`` is ``None`` when the adapter was off), ``composed`` being what the
    composer returned to the sampler; ``x0`` is the objective's clean-sample estimate from the
    prediction the sampler used. ``diagnostics``: the composer's (gates, masks, noise weight).
    """

    index: int
    steps: int
    t: torch.Tensor
    noise_level: torch.Tensor
    x_t: torch.Tensor | None = None
    x0: torch.Tensor | None = None
    base: torch.Tensor | None = None
    adapter: torch.Tensor | None = None
    composed: torch.Tensor | None = None
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)
    stored: tuple[str, ...] = FIELDS

    @property
    def sigma(self) -> torch.Tensor:
        return self.noise_level

    def get(self, kind: str) -> torch.Tensor:
        """The tensor of ``kind`` (one of ``x_t``, ``x0``, ``base``, ``adapter``, ``composed``)."""
        check_choice(kind, KINDS, "kind")
        if kind not in self.stored:
            raise InspectError(f"Step {self.index} has no {kind!r}: it was not stored (StoragePolicy fields="
                               f"{self.stored}). Record with {kind!r} in StoragePolicy.fields.")
        value = getattr(self, kind)
        if value is None:
            raise InspectError(f"Step {self.index} has no {kind!r}: the adapter was off for this step.")
        return value


# -- settings a fork may change --------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Settings:
    """How the live steps of a run evaluate: adapter on / off, another composer, a gate override.

    ``None`` everywhere means the model as it is (``model.adapter_enabled``, ``model.composer``).
    """

    adapter: bool | None = None
    composer: Composer | None = None
    gate_override: float | torch.Tensor | None = None

    def merged(self, adapter: Any = None, composer: Composer | None = None, gate_override: Any = None) -> Settings:
        check_choice(adapter, ADAPTER_CHOICES, "adapter", "None keeps the parent's setting.")
        if composer is not None and not isinstance(composer, Composer):
            raise InspectError(f"composer must be a workbench.Composer, got {type(composer).__name__}.")
        flag = {"on": True, "off": False}.get(adapter, adapter)
        return Settings(adapter=self.adapter if flag is None else bool(flag),
                        composer=composer if composer is not None else self.composer,
                        gate_override=gate_override if gate_override is not None else self.gate_override)

    def describe(self) -> list[str]:
        parts = []
        if self.adapter is not None:
            parts.append(f"adapter {'on' if self.adapter else 'off'}")
        if self.composer is not None:
            parts.append(self.composer.describe())
        if self.gate_override is not None:
            g = self.gate_override
            parts.append(f"gate={float(g):g}" if torch.as_tensor(g).numel() == 1 else "gate=override")
        return parts


@contextmanager
def applied(model: ComposedModel, settings: Settings) -> Iterator[ComposedModel]:
    """``model`` in eval mode with ``settings`` in force for the block; restored afterwards."""
    was_training = model.training
    original = model.composer
    swapped_mode = settings.composer.training if settings.composer is not None else None
    with ExitStack() as stack:
        try:
            model.train(False)
            if settings.composer is not None:
                model.composer = settings.composer
                settings.composer.train(False)
            if settings.gate_override is not None:
                stack.enter_context(model.composer.override_gate(settings.gate_override))
            yield model
        finally:
            stack.close()
            if settings.composer is not None:
                settings.composer.train(swapped_mode)
                model.composer = original
            model.train(was_training)


def _check_gate_override(model: ComposedModel, settings: Settings) -> None:
    """Raise now (not mid-sampling) when the gate override does not fit the composer."""
    if settings.gate_override is not None:
        composer = settings.composer if settings.composer is not None else model.composer
        with composer.override_gate(settings.gate_override):
            pass


# -- the recorder: a compose_fn + on_step pair handed to the native sampler ------------------
OnTrajectoryStep = Callable[[TrajectoryStep], None]


class _Recorder:
    """Serves replayed steps from a cache and records the live ones."""

    def __init__(self, model: ComposedModel, settings: Settings, storage: StoragePolicy, *, keep: bool,
                 replay_prefix: Sequence[Sequence[torch.Tensor]], live_from: int,
                 on_step: OnTrajectoryStep | None):
        self.model, self.settings, self.storage, self.keep = model, settings, storage, keep
        self.prefix, self.live_from, self.user_on_step = replay_prefix, live_from, on_step
        self.step = 0  # the index of the step the sampler is in
        self.calls: list[torch.Tensor] = []  # compose_fn outputs of the current step
        self.pending: Prediction | None = None
        self.records: dict[int, TrajectoryStep] = {}
        self.replay: list[list[torch.Tensor]] = []
        self.t: list[torch.Tensor] = []
        self.noise: list[torch.Tensor] = []
        self.native: torch.dtype | None = None

    def compose(self, x_t: torch.Tensor, t: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.step < self.live_from:
            cached = self.prefix[self.step][len(self.calls)]
            self.calls.append(cached)
            # a copy: the sampler may modify its prediction in place, the parent's cache must not change
            return cached.to(device=x_t.device, copy=True, non_blocking=True)
        pred = self.model.predict(x_t, t, batch, adapter=self.settings.adapter)
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
            raise InspectError(f"The sampler finished step {rec.index} without calling compose_fn; nothing to record.")
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
        x0 = model.objective.x0_from_prediction(rec.prediction, rec.x_t, rec.t) if want_x0 else None
        live = TrajectoryStep(rec.index, rec.steps, rec.t, noise_level, rec.x_t, x0, pred.base, pred.adapter,
                              pred.composed, pred.diagnostics)
        if self.keep:
            device, dtype = storage.device, storage.dtype
            self.t.append(_store(rec.t, device))
            self.noise.append(_store(noise_level, device))
            if keep_fields:
                values = {name: _store(getattr(live, name), device, dtype) if getattr(live, name) is not None
                          else None for name in storage.fields}
                diagnostics = {k: _store(v, device, dtype) for k, v in pred.diagnostics.items()}
                self.records[rec.index] = TrajectoryStep(rec.index, rec.steps, self.t[-1], self.noise[-1],
                                                         diagnostics=diagnostics, stored=storage.fields, **values)
            if storage.replay:
                shared = self.records.get(rec.index)
                cached = [shared.composed if i == 0 and shared is not None and storage.shares_replay(c.dtype)
                          else _store(c, device) for i, c in enumerate(self.calls)]
                self.replay.append(cached)
        return live


# -- the trajectory --------------------------------------------------------------------------
class Trajectory:
    """A recorded run of the backbone's native sampler (see the module docstring).

    Navigation: ``len(traj)`` steps run, ``traj[k]`` a :class:`TrajectoryStep` (negative ``k``
    counts from the end), ``traj.stored`` the indices with fields, ``traj.times`` /
    ``traj.noise_levels`` per step, ``traj.final`` the final latents, ``traj.seek(k)`` /
    ``traj.position`` / ``traj.current`` a cursor for views. Forks keep ``parent`` and
    ``fork_step``. Tensors live where the :class:`StoragePolicy` put them.
    """

    def __init__(self, *, model: ComposedModel, batch: Batch, steps: int, sampler: str,
                 sampler_kwargs: dict[str, Any], generator_state: torch.Tensor, seed: int | None,
                 storage: StoragePolicy, settings: Settings, recorded: bool, records: dict[int, TrajectoryStep],
                 replay: list[list[torch.Tensor]] | None, t: list[torch.Tensor], noise: list[torch.Tensor],
                 done: int, final: torch.Tensor | None, native: torch.dtype, parent: Trajectory | None = None,
                 fork_step: int | None = None, label: str | None = None):
        self.model, self.batch, self.steps, self.sampler = model, batch, steps, sampler
        self.sampler_kwargs, self.generator_state, self.seed = sampler_kwargs, generator_state, seed
        self.storage, self.settings, self.recorded = storage, settings, recorded
        self._records, self._replay, self._t, self._noise = records, replay, t, noise
        self._done, self._final, self.native_dtype = done, final, native
        self.parent, self.fork_step = parent, fork_step
        self.label = label or self._default_label()
        self.position = 0

    def _default_label(self) -> str:
        if self.parent is None:
            return "run" if self.seed is None else f"run (seed {self.seed})"
        changes = self.settings.describe()
        if self.batch is not self.parent.batch:
            changes.append("cond")
        return f"fork@{self.fork_step}" + (": " + ", ".join(changes) if changes else "")

    def __repr__(self) -> str:
        state = "complete" if self.complete else f"stopped after {self._done}"
        shape = tuple(self.batch.latents.shape)
        return (f"Trajectory({self.label!r}, {self._done}/{self.steps} steps {state}, latents {shape}, "
                f"stored {len(self._records)} steps, {self.nbytes() / 2**20:.2f} MiB)")

    @property
    def description(self) -> str:
        """What was run, and how each step's predictions were made (base calls per step)."""
        return f"{self.label}: {self._done}/{self.steps} steps; {self.model.evaluation_note()}"

    # -- navigation ------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """False when sampling was stopped (:class:`StopSampling`) before the last step."""
        return self._done == self.steps

    def __len__(self) -> int:
        return self._done

    def _index(self, k: Any, what: str = "step") -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise StepError(f"{what} must be an int step index, got {k!r} ({type(k).__name__}).")
        n = self._done
        if not -n <= k < n:
            extra = "" if self.complete else f" of {self.steps} (stopped early; traj.resume() finishes it)"
            span = f"0..{n - 1}, or -{n}..-1 from the end" if n else "none"
            raise StepError(f"{what}={int(k)} is out of range: this trajectory has {n} recorded steps{extra} "
                            f"({span}).")
        return int(k) % n

    def __getitem__(self, k: int) -> TrajectoryStep:
        index = self._index(k)
        record = self._records.get(index)
        if record is None:
            if not self.recorded:
                raise StepError(f"Step {index} was not stored: this run was sampled with record=False, which keeps "
                                f"only traj.final. Sample with record=True to step through it.")
            stored = ", ".join(map(str, self.stored)) or "none"
            raise StepError(f"Step {index} was not stored: StoragePolicy(every={self.storage.every}) keeps steps "
                            f"{stored}. Pick one of those, or traj.fork(at={index}) to compute it again live.")
        return record

    def __iter__(self) -> Iterator[TrajectoryStep]:
        return (self._records[k] for k in self.stored)

    @property
    def stored(self) -> tuple[int, ...]:
        """Indices of the steps whose fields were kept."""
        return tuple(sorted(self._records))

    @property
    def times(self) -> torch.Tensor:
        """``t`` of batch element 0 at each recorded step ``(len(traj),)`` (objective units)."""
        return torch.stack([t[0] for t in self._t]) if self._t else torch.empty(0)

    @property
    def noise_levels(self) -> torch.Tensor:
        """Noise level in [0, 1] of batch element 0 at each recorded step ``(len(traj),)``."""
        return torch.stack([s[0] for s in self._noise]) if self._noise else torch.empty(0)

    @property
    def final(self) -> torch.Tensor:
        """Final latents ``(B, C, T, h, w)``, exactly what ``base.generate`` returned."""
        if self._final is None:
            raise StepError(f"This trajectory stopped after {self._done} of {self.steps} steps and has no final "
                            f"latents yet; traj.resume() finishes it.")
        return self._final

    def seek(self, k: int) -> TrajectoryStep:
        """Move the cursor to step ``k`` (views scrub with it) and return that step."""
        step = self[k]
        self.position = step.index
        return step

    @property
    def current(self) -> TrajectoryStep:
        return self[self.position]

    def replayed(self, k: int) -> bool:
        """Whether step ``k`` was served from the parent (a fork's prefix) rather than computed by this run."""
        return self.fork_step is not None and self._index(k) < self.fork_step

    def nbytes(self, own: bool = True) -> int:
        """Bytes held by the stored tensors (each storage once); ``own``: without a fork's shared prefix."""
        start = (self.fork_step or 0) if own else 0
        tensors: list[torch.Tensor] = []
        for k, rec in self._records.items():
            if k >= start:
                tensors += [v for v in (rec.x_t, rec.x0, rec.base, rec.adapter, rec.composed) if v is not None]
                tensors += list(rec.diagnostics.values())
        tensors += self._t[start:] + self._noise[start:]
        tensors += [c for calls in (self._replay or [])[start:] for c in calls]
        if self._final is not None:
            tensors.append(self._final)
        seen = {}
        for x in tensors:
            seen[(x.device, x.untyped_storage().data_ptr())] = x.untyped_storage().nbytes()
        return sum(seen.values())

    # -- replay ----------------------------------------------------------------------------
    def fork(self, at: int, cond: Mapping[str, Any] | Batch | None = None, adapter: Any = None,
             composer: Composer | None = None, gate_override: float | torch.Tensor | None = None, *,
             storage: StoragePolicy | None = None, on_step: OnTrajectoryStep | None = None,
             label: str | None = None) -> Trajectory:
        """Rerun from the same noise: steps before ``at`` replayed from this trajectory, the rest live.

        Args:
            at: the first live step, ``0..len(self)``. 0 is a fresh run with the new settings;
                ``len(self)`` with no change resumes (or, when complete, replays) this run.
            cond: condition overrides merged into the batch (``{"action": tensor}``) or a new raw
                batch / :class:`Batch` (same latent shape unless ``at=0``). The prefix replays this
                trajectory's predictions; the sampler's own use of the batch (tiny_video pins frame
                0 to ``first_frame``) sees the new one.
            adapter: ``"on"`` / ``"off"`` for the live steps (``None``: as this trajectory).
            composer: another composer for the live steps. ``gate_override``: the gate value the
                composer uses in the live steps (``Composer.override_gate``).
            storage: the fork's :class:`StoragePolicy` (default: this trajectory's).
            on_step: called with each live step (device tensors), like :func:`record`'s.

        Settings stack: a fork of a fork keeps its parent's changes unless it overrides them.
        Live steps use the model as it is now. Model calls happen only for steps ``>= at``.

        >>> alt = traj.fork(at=10, cond={"action": torch.zeros(8, 4)}, adapter="on")
        >>> torch.equal(alt[9].x_t, traj[9].x_t)
        True
        """
        if isinstance(at, bool) or not isinstance(at, (int, np.integer)) or not 0 <= at <= self._done:
            extra = "" if self.complete else f" of {self.steps} (it was stopped)"
            raise StepError(
                f"fork(at={at!r}): at must be a step index from 0 to {self._done}: this trajectory has "
                f"{self._done} recorded steps{extra}. at=0 reruns from the initial noise with the new settings; "
                f"at={self._done} replays every recorded step and continues live."
            )
        at = int(at)
        if at > 0 and self._replay is None:
            raise StepError(
                f"fork(at={at}): this trajectory kept no replay cache (sampled with record=False, or "
                f"StoragePolicy(replay=False)), so only at=0 is possible. Sample with record=True and "
                f"StoragePolicy(replay=True) to fork later steps."
            )
        batch = with_conditions(self.model, self.batch, cond)
        if at > 0 and batch.latents.shape != self.batch.latents.shape:
            raise InspectError(
                f"fork(at={at}, cond=...): the new batch has latents {tuple(batch.latents.shape)}, but this "
                f"trajectory sampled {tuple(self.batch.latents.shape)}; a prefix replays only onto the same shape. "
                f"Fork at 0 for a batch of another shape."
            )
        settings = self.settings.merged(adapter, composer, gate_override)
        prefix = {k: r for k, r in self._records.items() if k < at}
        return _run(self.model, batch, steps=self.steps, sampler=self.sampler, sampler_kwargs=self.sampler_kwargs,
                    generator_state=self.generator_state, seed=self.seed, storage=storage or self.storage,
                    settings=settings, keep=True, on_step=on_step, parent=self, at=at, prefix_records=prefix,
                    prefix_replay=(self._replay or [])[:at], prefix_t=self._t[:at], prefix_noise=self._noise[:at],
                    label=label)

    def resume(self, on_step: OnTrajectoryStep | None = None) -> Trajectory:
        """Finish a stopped run (``fork(at=len(self))`` with no change): bit-identical to an unstopped run."""
        return self.fork(at=self._done, on_step=on_step, label=f"{self.label} (resumed)")

    def recompose(self, step: int, cond: Mapping[str, Any] | Batch | None = None, adapter: Any = None,
                  composer: Composer | None = None, gate_override: float | torch.Tensor | None = None) -> Prediction:
        """Re-evaluate the composed prediction at ``step``'s ``x_t`` with changed conditions or settings.

        The stored base prediction is reused when the adapter allows it
        (``adapter.reuses_base_output``): only the adapter and the composer run. Otherwise (or
        when ``base`` was not stored) the base runs too. Exact when ``x_t`` / ``base`` were stored
        at the model's dtype. Returns a :class:`Prediction` on the model's device;
        :meth:`x0_of` turns it into an x0 estimate and :meth:`render` into frames.

        >>> pred = traj.recompose(8, cond={"action": pushed})   # no base call
        >>> frames = traj.render(traj.x0_of(pred))
        """
        rec = self[step]
        if rec.x_t is None:
            raise InspectError(f"recompose(step={rec.index}) needs x_t, which was not stored; record with 'x_t' in "
                               f"StoragePolicy.fields.")
        device, dtype = self.batch.latents.device, self.native_dtype
        x_t = rec.x_t.to(device=device, dtype=dtype, non_blocking=True)
        t = rec.t.to(device=device, non_blocking=True)
        base_output = None if rec.base is None else rec.base.to(device=device, dtype=dtype, non_blocking=True)
        batch = with_conditions(self.model, self.batch, cond)
        settings = self.settings.merged(adapter, composer, gate_override)
        _check_gate_override(self.model, settings)
        with applied(self.model, settings) as model, torch.no_grad():
            return model.predict(x_t, t, batch, adapter=settings.adapter, base_output=base_output)

    # -- rendering -------------------------------------------------------------------------
    def x0_of(self, prediction: Prediction) -> torch.Tensor:
        """The objective's x0 estimate from a :class:`Prediction` (e.g. one from :meth:`recompose`)."""
        return self.model.objective.x0_from_prediction(prediction.composed, prediction.x_t, prediction.t)

    def render(self, latents: torch.Tensor, decode: str = "preview", index: int = 0,
               chunk_frames: int | None = DEFAULT_CHUNK_FRAMES) -> np.ndarray:
        """Latents ``(B, C, T, h, w)`` → uint8 ``[T, H, W, 3]`` (see :func:`workbench.inspect.preview.render`)."""
        return render(self.model.base, latents, decode=decode, index=index, chunk_frames=chunk_frames)

    def frames(self, step: int | Literal["final"], kind: str = "x0", decode: str = "preview", index: int = 0,
               chunk_frames: int | None = DEFAULT_CHUNK_FRAMES) -> np.ndarray:
        """Frames of one step as uint8 ``[T, H, W, 3]`` for batch element ``index``.

        ``step``: an index or ``"final"`` (the final latents; ``kind`` is then ignored); ``kind``:
        ``x0`` (the clean-sample estimate), ``x_t``,
        ``base``, ``adapter`` or ``composed`` (predictions are shown as if they were latents);
        ``decode``: ``"preview"`` (linear, fitted once per backbone) or ``"full"`` (the decoder,
        ``chunk_frames`` latent frames at a time).
        """
        check_choice(kind, KINDS, "kind", "Pick what to show: x0 is the model's current guess of the clean video.")
        check_choice(decode, ("preview", "full"), "decode")
        if isinstance(step, str):
            if step != "final":
                raise StepError(f"step={step!r}: use an int step index or 'final'.")
            latents = self.final
        else:
            latents = self[step].get(kind)
        return self.render(latents, decode=decode, index=index, chunk_frames=chunk_frames)

    def export(self, path: str | Path, steps: Sequence[int | str] | None = None, branches: Sequence[Trajectory] = (),
               kind: str = "x0", decode: str = "preview", index: int = 0, fps: float | None = None,
               scale: int = 1) -> Path:
        """Write an MP4 / GIF grid: one row per step, one column per branch (this run first, then ``branches``).

        ``steps`` default: up to four stored steps spread over the run, plus ``"final"`` when
        every branch is complete. Labels name each step (and its noise level) and each branch.
        """
        from workbench.media import label_grid, write_video

        columns = [self, *branches]
        for b in branches:
            if not isinstance(b, Trajectory):
                raise InspectError(f"export branches must be Trajectory objects (forks), got {type(b).__name__}.")
        if steps is None:
            common = sorted(set.intersection(*(set(b.stored) for b in columns)))
            picks = [common[round(i * (len(common) - 1) / 3)] for i in range(4)] if len(common) > 4 else common
            steps = [*dict.fromkeys(picks)] + (["final"] if all(b.complete for b in columns) else [])
        if not steps:
            raise InspectError("export has no steps to show: nothing was stored and the run is not complete.")
        rows, row_labels = [], []
        for s in steps:
            rows.append([b.frames(s, kind=kind, decode=decode, index=index) for b in columns])
            if s == "final":
                row_labels.append("final")
            else:
                k = self._index(s)
                row_labels.append(f"step {k}\nnoise {float(self._noise[k][0]):.2f}")
        grid = label_grid(rows, row_labels=row_labels, col_labels=[b.label for b in columns], scale=scale)
        fps = fps or self.model.base.card.sampling.fps or 10
        return write_video(path, grid, fps=fps)


# -- entry points ----------------------------------------------------------------------------
def _generator_state(generator: torch.Generator | None, seed: int, device: torch.device) -> torch.Tensor:
    if generator is not None:
        if generator.device.type != device.type:
            raise InspectError(f"generator is on {generator.device}, but the batch is on {device}; the initial "
                               f"noise is drawn on the batch's device. Pass torch.Generator(device='{device}').")
        return generator.get_state()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InspectError(f"seed must be an int, got {seed!r}.")
    return torch.Generator(device=device).manual_seed(int(seed)).get_state()


def _latent_bytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()


def _estimate(model: ComposedModel, batch: Batch, steps: int, storage: StoragePolicy, settings: Settings,
              live_from: int = 0, keep: bool = True) -> int:
    shape, native = batch.latents.shape, batch.latents.dtype
    final = _latent_bytes(shape, native)
    if not keep:
        return final
    store_dtype = storage.dtype or native
    adapter_on = model.adapter_enabled if settings.adapter is None else settings.adapter
    fields = [f for f in storage.fields if adapter_on or f != "adapter"]
    kept = sum(storage.keeps(k, steps, live_from) for k in range(live_from, steps))
    per_step = len(fields) * _latent_bytes(shape, store_dtype)
    diagnostics = 0
    if adapter_on:  # a dry composition on zeros gives the diagnostics' exact shapes
        zeros = torch.zeros(shape, dtype=native, device=batch.latents.device)
        ones = torch.ones(shape[0], device=zeros.device)
        ctx = ComposeContext(x_t=zeros, t=ones, noise_level=ones, step=None)
        with applied(model, settings) as m, torch.no_grad():
            _, diag = m.composer.compose(zeros, zeros, ctx)
        diagnostics = sum(_latent_bytes(v.shape, store_dtype if v.is_floating_point() else v.dtype)
                          for v in diag.values())
    scalars = 2 * shape[0] * 8 * (steps - live_from)  # t and noise level per step (at most 8 bytes each)
    replay = 0
    if storage.replay:
        shared = kept if storage.shares_replay(native) else 0
        replay = (steps - live_from - shared) * _latent_bytes(shape, native)
    return final + kept * (per_step + diagnostics) + scalars + replay


def estimate_memory(model: ComposedModel, batch_or_cond: Mapping[str, Any] | Batch, steps: int | None = None,
                    storage: StoragePolicy | None = None, record: bool = True) -> int:
    """Bytes a recording of ``steps`` steps will hold under ``storage``, before running it.

    Exact for the latent-shaped fields, the replay cache, the final latents and the
    composer's diagnostics (taken from a dry composition on zeros); ``t`` / noise level are
    counted at 8 bytes each. Assumes one ``compose_fn`` call per step (a sampler calling it
    more often keeps one cached prediction per call).
    """
    model = check_model(model, "estimate_memory")
    batch = prepare(model, batch_or_cond)
    steps, _ = model.base.card.resolve_steps(steps)
    return _estimate(model, batch, steps, storage or StoragePolicy(), Settings(), keep=record)


def _check_budget(estimate: int, storage: StoragePolicy, steps: int, shape: torch.Size) -> None:
    if storage.max_bytes is None or estimate <= storage.max_bytes:
        return
    message = (
        f"Recording {steps} steps of {tuple(shape)} latents would hold {estimate / 2**20:.2f} MiB "
        f"(fields {', '.join(storage.fields)} every {storage.every} step(s) at "
        f"{str(storage.dtype or 'the model dtype').replace('torch.', '')}"
        f"{', plus the replay cache' if storage.replay else ''}), over StoragePolicy(max_bytes={storage.max_bytes}). "
        f"Keep less: dtype=torch.float16 halves the fields, every=k keeps every k-th step, fields=('x0',) keeps "
        f"only the x0 estimate, replay=False drops the fork cache; or raise max_bytes."
    )
    if storage.on_exceed == "raise":
        raise InspectError(message)
    warnings.warn(message, StorageWarning, stacklevel=3)


def _run(model: ComposedModel, batch: Batch, *, steps: int, sampler: str, sampler_kwargs: dict[str, Any],
         generator_state: torch.Tensor, seed: int | None, storage: StoragePolicy, settings: Settings, keep: bool,
         on_step: OnTrajectoryStep | None, parent: Trajectory | None = None, at: int = 0,
         prefix_records: dict[int, TrajectoryStep] | None = None, prefix_replay: Sequence[Sequence[torch.Tensor]] = (),
         prefix_t: Sequence[torch.Tensor] = (), prefix_noise: Sequence[torch.Tensor] = (),
         label: str | None = None) -> Trajectory:
    if not isinstance(storage, StoragePolicy):
        raise InspectError(f"storage must be a StoragePolicy, got {type(storage).__name__}.")
    _check_gate_override(model, settings)
    if storage.max_bytes is not None:
        _check_budget(_estimate(model, batch, steps, storage, settings, at, keep), storage, steps - at,
                      batch.latents.shape)
    generator = torch.Generator(device=batch.latents.device)
    generator.set_state(generator_state)
    recorder = _Recorder(model, settings, storage, keep=keep, replay_prefix=prefix_replay, live_from=at,
                         on_step=on_step)
    final = None
    with applied(model, settings), suppress(StopSampling):  # a stop request: keep what was recorded
        final = model.base.generate(batch, steps=steps, sampler=sampler, generator=generator,
                                    compose_fn=recorder.compose, on_step=recorder.on_step, **sampler_kwargs)
    if final is not None and recorder.step != steps:
        raise InspectError(f"The sampler reported {recorder.step} steps for a {steps}-step run; recording needs "
                           f"on_step called once per step.")
    stored_final = None if final is None else _store(final, storage.device)
    _synchronize(batch.latents.device)
    records = {**(prefix_records or {}), **recorder.records}
    replay = [*map(list, prefix_replay), *recorder.replay] if keep and storage.replay else None
    return Trajectory(model=model, batch=batch, steps=steps, sampler=sampler, sampler_kwargs=sampler_kwargs,
                      generator_state=generator_state, seed=seed, storage=storage, settings=settings, recorded=keep,
                      records=records, replay=replay, t=[*prefix_t, *recorder.t],
                      noise=[*prefix_noise, *recorder.noise], done=recorder.step, final=stored_final,
                      native=recorder.native or batch.latents.dtype, parent=parent,
                      fork_step=at if parent is not None else None, label=label)


def record(model: ComposedModel, batch_or_cond: Mapping[str, Any] | Batch, steps: int | None = None, seed: int = 0,
           record: bool = True, on_step: OnTrajectoryStep | None = None, *, storage: StoragePolicy | None = None,
           generator: torch.Generator | None = None, sampler: str | None = None, label: str | None = None,
           **sampler_kwargs: Any) -> Trajectory:
    """Sample with the backbone's own sampler, the adapter injected, and record every step.

    Args:
        model: the :class:`ComposedModel` (``exp.model``).
        batch_or_cond: a raw batch (``{"video": ..., "action": ...}`` / ``{"image": ...}``) or a
            prepared :class:`Batch`; moved to the base's device.
        steps / sampler: default to the card's (``base.card.sampling``), checked against its recipe.
        seed: the initial noise comes from ``torch.Generator(device=batch device).manual_seed(seed)``
            — exactly what ``model.generate(batch, generator=...)`` with that generator draws.
            ``generator``: use this one's current state instead (it is not advanced).
        record: ``False`` keeps only the final latents (and no fork cache).
        on_step: called after each step with a :class:`TrajectoryStep` of *device* tensors (for
            live previews); raise :class:`StopSampling` in it to stop early.
        storage: the :class:`StoragePolicy` (default: everything, every step, to CPU, model dtype).
        sampler_kwargs: passed to ``base.generate`` (and reused by forks).

    The final latents are bit-identical to ``model.generate`` with the same seed.

    >>> traj = record(model, batch, steps=20, seed=0)
    >>> torch.equal(traj.final, model.generate(batch, steps=20, generator=torch.Generator().manual_seed(0)))
    True
    """
    model = check_model(model, "record")
    batch = prepare(model, batch_or_cond)
    steps, sampler = model.base.card.resolve_steps(steps, sampler)
    state = _generator_state(generator, seed, batch.latents.device)
    return _run(model, batch, steps=steps, sampler=sampler, sampler_kwargs=dict(sampler_kwargs),
                generator_state=state, seed=None if generator is not None else int(seed),
                storage=storage or StoragePolicy(), settings=Settings(), keep=bool(record), on_step=on_step,
                label=label)


__all__ = [
    "FIELDS", "KINDS", "Settings", "StopSampling", "StoragePolicy", "Trajectory", "TrajectoryStep", "applied",
    "estimate_memory", "record",
]
