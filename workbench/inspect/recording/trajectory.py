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

from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from workbench.core.composed import ComposedModel, Prediction
from workbench.core.composers import Composer
from workbench.core.conditions import Batch
from workbench.inspect.common import (
    InspectError,
    StepError,
    check_choice,
    check_model,
    prepare,
    with_conditions,
)
from workbench.inspect.previews.decoding import render
from workbench.inspect.previews.latent_space import DEFAULT_CHUNK_FRAMES
from workbench.inspect.previews.preview import DECODES
from workbench.inspect.recording.export import default_steps, write_grid
from workbench.inspect.recording.recorder import OnTrajectoryStep, Recorder, StopSampling, generator_state
from workbench.inspect.recording.settings import Settings, applied
from workbench.inspect.recording.step import TrajectoryStep
from workbench.inspect.recording.storage import (
    FIELDS,
    StoragePolicy,
    check_budget,
    estimate,
    store,
    synchronize,
)


class Trajectory:
    """A recorded run of the backbone's native sampler (see the module docstring).

    Navigation: ``len(traj)`` steps run, ``traj[k]`` a :class:`TrajectoryStep` (negative ``k``
    counts from the end), ``traj.stored`` the indices with fields, ``traj.times`` /
    ``traj.noise_levels`` per step, ``traj.final`` the final latents, ``traj.seek(k)`` /
    ``traj.position`` / ``traj.current`` a cursor for views. Forks keep ``parent`` and
    ``fork_step``. Tensors live where the :class:`StoragePolicy` put them.

    Each step run is one :class:`TrajectoryStep` (``t``, noise level, the stored fields, the predictions a
    fork replays); a fork's steps start with its parent's, shared.
    """

    def __init__(self, *, model: ComposedModel, batch: Batch, steps: int, sampler: str,
                 sampler_kwargs: dict[str, Any], generator_state: torch.Tensor, seed: int | None,
                 storage: StoragePolicy, settings: Settings, recorded: bool, log: list[TrajectoryStep],
                 done: int, final: torch.Tensor | None, native: torch.dtype, parent: Trajectory | None = None,
                 fork_step: int | None = None, label: str | None = None):
        self.model, self.batch, self.steps, self.sampler = model, batch, steps, sampler
        self.sampler_kwargs, self.generator_state, self.seed = sampler_kwargs, generator_state, seed
        self.storage, self.settings, self.recorded = storage, settings, recorded
        self._log = log  # one entry per step run when recorded; empty when only the final latents were kept
        self._done, self._final, self.native_dtype = done, final, native
        self.parent, self.fork_step = parent, fork_step
        self.label = label or self._default_label()
        self.position = 0

    def _default_label(self) -> str:
        if self.parent is None:
            return "run" if self.seed is None else f"run (seed {self.seed})"
        cond = "cond" if self.batch is not self.parent.batch else ""
        changes = ", ".join(part for part in (self.settings.describe(), cond) if part)
        return f"fork@{self.fork_step}" + (f": {changes}" if changes else "")

    def __repr__(self) -> str:
        state = "complete" if self.complete else f"stopped after {self._done}"
        shape = tuple(self.batch.latents.shape)
        return (f"Trajectory({self.label!r}, {self._done}/{self.steps} steps {state}, latents {shape}, "
                f"stored {len(self.stored)} steps, {self.nbytes() / 2**20:.2f} MiB)")

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
        record = self._log[index] if index < len(self._log) else None
        if record is None or record.stored is None:
            if not self.recorded:
                raise StepError(f"Step {index} was not stored: this run was sampled with record=False, "
                                f"which keeps only traj.final. Sample with record=True to step through it.")
            stored = ", ".join(map(str, self.stored)) or "none"
            raise StepError(f"Step {index} was not stored: StoragePolicy(every={self.storage.every}) "
                            f"keeps steps {stored}. "
                            f"Pick one of those, or traj.fork(at={index}) to compute it again live.")
        return record

    def __iter__(self) -> Iterator[TrajectoryStep]:
        return (entry for entry in self._log if entry.stored is not None)

    @property
    def log(self) -> tuple[TrajectoryStep, ...]:
        """One :class:`~workbench.inspect.recording.step.TrajectoryStep` per step run (its ``t``, noise level,
        stored fields and ``calls``, the predictions a fork replays); a fork's first entries are its
        parent's."""
        return tuple(self._log)

    @property
    def stored(self) -> tuple[int, ...]:
        """Indices of the steps whose fields were kept."""
        return tuple(k for k, entry in enumerate(self._log) if entry.stored is not None)

    @property
    def times(self) -> torch.Tensor:
        """``t`` of batch element 0 at each recorded step ``(len(traj),)`` (objective units)."""
        return torch.stack([entry.t[0] for entry in self._log]) if self._log else torch.empty(0)

    @property
    def noise_levels(self) -> torch.Tensor:
        """Noise level in [0, 1] of batch element 0 at each recorded step ``(len(traj),)``."""
        return torch.stack([entry.noise_level[0] for entry in self._log]) if self._log else torch.empty(0)

    @property
    def final(self) -> torch.Tensor:
        """Final latents ``(B, C, T, h, w)``, exactly what ``base.generate`` returned."""
        if self._final is None:
            raise StepError(f"This trajectory stopped after {self._done} of {self.steps} steps "
                            f"and has no final latents yet; traj.resume() finishes it.")
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
        """Whether step ``k`` was served from the parent (a fork's prefix)
        rather than computed by this run."""
        return self.fork_step is not None and self._index(k) < self.fork_step

    def nbytes(self, own: bool = True) -> int:
        """Bytes held by the stored tensors (each storage once); ``own``: without a fork's shared prefix."""
        start = (self.fork_step or 0) if own else 0
        tensors: list[torch.Tensor] = []
        for entry in self._log[start:]:
            tensors += [entry.t, entry.noise_level, *(entry.calls or ())]
            tensors += [v for v in (entry.x_t, entry.x0, entry.base, entry.adapter, entry.composed)
                        if v is not None]
            tensors += list(entry.diagnostics.as_dict().values())
        if self._final is not None:
            tensors.append(self._final)
        seen = {}
        for x in tensors:
            seen[(x.device, x.untyped_storage().data_ptr())] = x.untyped_storage().nbytes()
        return sum(seen.values())

    # -- replay ----------------------------------------------------------------------------
    def fork(self, at: int, cond: Mapping[str, Any] | Batch | None = None, with_adapter: bool | None = None,
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
            with_adapter: ``True`` (base + adapter) or ``False`` (the frozen base alone) for the live
                steps (``None``: as this trajectory).
            composer: another composer for the live steps. ``gate_override``: the gate value the
                composer uses in the live steps (``Composer.override_gate``).
            storage: the fork's :class:`StoragePolicy` (default: this trajectory's).
            on_step: called with each live step (device tensors), like :func:`record`'s.

        Settings stack: a fork of a fork keeps its parent's changes unless it overrides them.
        Live steps use the model as it is now. Model calls happen only for steps ``>= at``.

        Examples:
            >>> alt = traj.fork(at=10, cond={"action": torch.zeros(2, 16, 4)}, with_adapter=True)
            >>> torch.equal(alt[9].x_t, traj[9].x_t)          # served from the cache
            True
            >>> torch.equal(alt.final, traj.final)
            False
        """
        if isinstance(at, bool) or not isinstance(at, (int, np.integer)) or not 0 <= at <= self._done:
            extra = "" if self.complete else f" of {self.steps} (it was stopped)"
            raise StepError(
                f"fork(at={at!r}): at must be a step index from 0 to {self._done}: this trajectory has "
                f"{self._done} recorded steps{extra}. "
                f"at=0 reruns from the initial noise with the new settings; "
                f"at={self._done} replays every recorded step and continues live."
            )
        at = int(at)
        if at > 0 and (len(self._log) < at or any(entry.calls is None for entry in self._log[:at])):
            raise StepError(
                f"fork(at={at}): this trajectory kept no replay cache (sampled with record=False, or "
                f"StoragePolicy(replay=False)), so only at=0 is possible. Sample with record=True and "
                f"StoragePolicy(replay=True) to fork later steps."
            )
        batch = with_conditions(self.model, self.batch, cond)
        if at > 0 and batch.latents.shape != self.batch.latents.shape:
            raise InspectError(
                f"fork(at={at}, cond=...): the new batch has latents {tuple(batch.latents.shape)}, "
                f"but this trajectory sampled {tuple(self.batch.latents.shape)}; "
                f"a prefix replays only onto the same shape. Fork at 0 for a batch of another shape."
            )
        settings = self.settings.merged(with_adapter, composer, gate_override)
        return run(self.model, batch, steps=self.steps, sampler=self.sampler,
                    sampler_kwargs=self.sampler_kwargs,
                    generator_state=self.generator_state, seed=self.seed, storage=storage or self.storage,
                    settings=settings, keep=True, on_step=on_step, parent=self, at=at, prefix=self._log[:at],
                    label=label)

    def resume(self, on_step: OnTrajectoryStep | None = None) -> Trajectory:
        """Finish a stopped run (``fork(at=len(self))`` with no change): bit-identical to an unstopped run."""
        return self.fork(at=self._done, on_step=on_step, label=f"{self.label} (resumed)")

    def recompose(self, step: int, cond: Mapping[str, Any] | Batch | None = None,
                  with_adapter: bool | None = None, composer: Composer | None = None,
                  gate_override: float | torch.Tensor | None = None) -> Prediction:
        """Re-evaluate the composed prediction at ``step``'s ``x_t`` with changed conditions or settings.

        The stored base prediction is reused when the adapter allows it
        (``adapter.reuses_base_output``): only the adapter and the composer run. Otherwise (or
        when ``base`` was not stored) the base runs too. Exact when ``x_t`` / ``base`` were stored
        at the model's dtype. Returns a :class:`Prediction` on the model's device;
        :meth:`x0_of` turns it into an x0 estimate and :meth:`render` into frames.

        Examples:
            >>> pushed = raw["action"].clone()
            >>> pushed[..., 0] = 1.0                               # dx = +1 in every frame
            >>> pred = traj.recompose(8, cond={"action": pushed})   # no base call
            >>> frames = traj.render(traj.x0_of(pred))
            >>> frames.shape
            (16, 64, 64, 3)
        """
        rec = self[step]
        if rec.x_t is None:
            raise InspectError(f"recompose(step={rec.index}) needs x_t, which was not stored; "
                               f"record with 'x_t' in StoragePolicy.fields.")
        # the composition saw x_t in the batch's dtype (a bf16 pipeline's latents reach it cast, exactly)
        device, dtype = self.batch.latents.device, self.batch.latents.dtype
        x_t = rec.x_t.to(device=device, dtype=dtype, non_blocking=True)
        t = rec.t.to(device=device, non_blocking=True)
        base_output = None if rec.base is None else rec.base.to(device=device, dtype=dtype, non_blocking=True)
        batch = with_conditions(self.model, self.batch, cond)
        settings = self.settings.merged(with_adapter, composer, gate_override)
        settings.check(self.model)
        with applied(self.model, settings) as model, torch.no_grad():
            return model.predict(x_t, t, batch, with_adapter=settings.with_adapter, base_output=base_output)

    # -- rendering -------------------------------------------------------------------------
    def x0_of(self, prediction: Prediction) -> torch.Tensor:
        """The objective's x0 estimate from a :class:`Prediction` (e.g. one from :meth:`recompose`): from its
        composed prediction, as a recorded step's ``x0`` is, so ``x0_of(recompose(i))`` is ``traj[i].x0``."""
        return self.model.objective.x0_from_prediction(prediction.composed, prediction.x_t, prediction.t)

    def render(self, latents: torch.Tensor, decode: str = "preview", index: int = 0,
               chunk_frames: int | None = DEFAULT_CHUNK_FRAMES) -> np.ndarray:
        """Latents ``(B, C, T, h, w)`` → uint8 ``[T, H, W, 3]``.

        See :func:`workbench.inspect.previews.decoding.render`."""
        return render(self.model.base, latents, decode=decode, index=index, chunk_frames=chunk_frames)

    def frames(self, step: int | Literal["final"], kind: str = "x0", decode: str = "preview", index: int = 0,
               chunk_frames: int | None = DEFAULT_CHUNK_FRAMES) -> np.ndarray:
        """Frames of one step as uint8 ``[T, H, W, 3]`` for batch element ``index``.

        ``step``: an index or ``"final"`` (the final latents; ``kind`` is then ignored); ``kind``:
        ``x0`` (the clean-sample estimate), ``x_t``,
        ``base``, ``adapter`` or ``composed`` (predictions are shown as if they were latents);
        ``decode``: ``"preview"`` (linear, fitted once per backbone), ``"tiny"`` (the distilled
        tiny preview) or ``"full"`` (the decoder, ``chunk_frames`` latent frames at a time).
        """
        check_choice(kind, FIELDS, "kind",
                     "Pick what to show: x0 is the model's current guess of the clean video.")
        check_choice(decode, DECODES, "decode")
        if isinstance(step, str):
            if step != "final":
                raise StepError(f"step={step!r}: use an int step index or 'final'.")
            latents = self.final
        else:
            latents = self[step].get(kind)
        return self.render(latents, decode=decode, index=index, chunk_frames=chunk_frames)

    def export(self, path: str | Path, steps: Sequence[int | str] | None = None,
               branches: Sequence[Trajectory] = (),
               kind: str = "x0", decode: str = "preview", index: int = 0, fps: float | None = None,
               scale: int = 1) -> Path:
        """Write an MP4 / GIF grid: one row per step, one column per branch
        (this run first, then ``branches``).

        ``steps`` default: up to four stored steps spread over the run, plus ``"final"`` when
        every branch is complete. Labels name each step (and its noise level) and each branch.
        """
        columns = [self, *branches]
        for b in branches:
            if not isinstance(b, Trajectory):
                raise InspectError(f"export branches must be Trajectory objects (forks), "
                                   f"got {type(b).__name__}.")
        if steps is None:
            steps = default_steps(columns) + (["final"] if all(b.complete for b in columns) else [])
        rows = [[b.frames(s, kind=kind, decode=decode, index=index) for b in columns] for s in steps]
        return write_grid(path, columns, steps, rows, fps=fps, scale=scale)


# -- entry points ----------------------------------------------------------------------------
def run(model: ComposedModel, batch: Batch, *, steps: int, sampler: str, sampler_kwargs: dict[str, Any],
         generator_state: torch.Tensor, seed: int | None, storage: StoragePolicy, settings: Settings,
         keep: bool, on_step: OnTrajectoryStep | None, parent: Trajectory | None = None, at: int = 0,
         prefix: Sequence[TrajectoryStep] = (), label: str | None = None) -> Trajectory:
    if not isinstance(storage, StoragePolicy):
        raise InspectError(f"storage must be a StoragePolicy, got {type(storage).__name__}.")
    settings.check(model)
    if storage.max_bytes is not None:
        check_budget(estimate(model, batch, steps, storage, settings, at, keep, sampler_kwargs), storage,
                     steps - at, batch.latents.shape)
    generator = torch.Generator(device=batch.latents.device)
    generator.set_state(generator_state)
    recorder = Recorder(model, settings, storage, keep=keep, prefix=prefix, live_from=at, on_step=on_step)
    final = None
    with applied(model, settings), suppress(StopSampling):  # a stop request: keep what was recorded
        final = model.base.generate(batch, steps=steps, sampler=sampler, generator=generator,
                                    compose_fn=recorder.compose, on_step=recorder.on_step, **sampler_kwargs)
    if final is not None and recorder.step != steps:
        raise InspectError(f"The sampler reported {recorder.step} steps for a {steps}-step run; "
                           f"recording needs on_step called once per step.")
    stored_final = None if final is None else store(final, storage.device)
    synchronize(batch.latents.device)
    return Trajectory(model=model, batch=batch, steps=steps, sampler=sampler, sampler_kwargs=sampler_kwargs,
                      generator_state=generator_state, seed=seed, storage=storage, settings=settings,
                      recorded=keep,
                      log=[*prefix, *recorder.log] if keep else [], done=recorder.step, final=stored_final,
                      native=recorder.native or batch.latents.dtype, parent=parent,
                      fork_step=at if parent is not None else None, label=label)


def record(model: ComposedModel, batch_or_cond: Mapping[str, Any] | Batch, steps: int | None = None,
           seed: int = 0, record: bool = True, on_step: OnTrajectoryStep | None = None, *,
           storage: StoragePolicy | None = None,
           generator: torch.Generator | None = None, sampler: str | None = None, label: str | None = None,
           **sampler_kwargs: Any) -> Trajectory:
    """Sample with the backbone's own sampler, the adapter injected, and record every step.

    Args:
        model: the :class:`ComposedModel` (``exp.model``).
        batch_or_cond: a raw batch (``{"video": ..., "action": ...}`` / ``{"image": ...}``) or a
            prepared :class:`Batch`; moved to the base's device.
        steps: defaults to the card's (``base.card.sampling``), checked against its recipe.
        sampler: defaults to the card's, checked against its recipe like ``steps``.
        seed: the initial noise comes from ``torch.Generator(device=batch device).manual_seed(seed)``
            — exactly what ``model.generate(batch, generator=...)`` with that generator draws.
        generator: use this one's current state instead of ``seed`` (it is not advanced).
        record: ``False`` keeps only the final latents (and no fork cache).
        on_step: called after each step with a :class:`TrajectoryStep` of *device* tensors (for
            live previews); raise :class:`StopSampling` in it to stop early.
        storage: the :class:`StoragePolicy` (default: everything, every step, to CPU, model dtype).
        sampler_kwargs: passed to ``base.generate`` (and reused by forks).

    The final latents are bit-identical to ``model.generate`` with the same seed.

    Examples:
        >>> traj = record(model, raw, steps=8, seed=0)
        >>> torch.equal(traj.final, model.generate(raw, steps=8, generator=torch.Generator().manual_seed(0)))
        True
    """
    model = check_model(model, "record")
    batch = prepare(model, batch_or_cond)
    steps, sampler = model.base.card.resolve_steps(steps, sampler)
    state = generator_state(generator, seed, batch.latents.device)
    return run(model, batch, steps=steps, sampler=sampler, sampler_kwargs=dict(sampler_kwargs),
                generator_state=state, seed=None if generator is not None else int(seed),
                storage=storage or StoragePolicy(), settings=Settings(), keep=bool(record), on_step=on_step,
                label=label)


__all__ = ["Trajectory", "record", "run"]
