"""What the instruments share: their error types, condition overrides, noise levels ↔ t, one noise draw.

Nothing here imports more than ``torch`` and the core.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from workbench.core.composed import ComposedModel
from workbench.core.conditions import Batch
from workbench.core.objectives import Objective
from workbench.errors import DataError, InspectError, StepError, did_you_mean, listing

__all__ = ["DEFAULT_LEVELS", "check_choice", "check_frame", "check_levels", "check_model", "condition_key",
           "condition_keys", "masked_rms", "model_lock", "prepare", "rolled_conditions", "seeded_noise",
           "t_for_noise_level", "t_tensor", "with_conditions"]

DEFAULT_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its RLock
_LOCKS_GUARD = threading.Lock()


def model_lock(model: ComposedModel) -> threading.RLock:
    """The lock an instrument holds while it runs ``model`` from another thread, or changes its state.

    A view that samples in the background (the ablation view carrying an edit to the last step)
    holds it for the whole run; the probes that change the model for a moment (opening its
    noise gates, switching its mode) take it too, so they never change a model a background run
    is using. Reentrant: one thread may take it again.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


def check_choice(value: Any, choices: Sequence[Any], what: str, fix: str = "") -> None:
    """Raise an :class:`InspectError` naming ``what``, the value and the allowed ones."""
    if value in choices:
        return
    hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
    allowed = ", ".join(repr(c) for c in choices)
    raise InspectError(f"{what}={value!r} is not allowed; "
                       f"allowed: {allowed}.{hint}{' ' + fix if fix else ''}")


def check_frame(frame: Any, frames: int, what: str = "the video") -> int:
    """``frame`` as an int in ``0..frames - 1``, or a :class:`StepError` saying what has how many frames."""
    if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)) or not 0 <= frame < frames:
        raise StepError(f"frame={frame!r} is out of range: {what} has {frames} frames (0..{frames - 1}).")
    return int(frame)


def check_model(model: Any, who: str) -> ComposedModel:
    if not isinstance(model, ComposedModel):
        raise InspectError(
            f"{who} needs a workbench.ComposedModel (base + adapter + composer + objective), got "
            f"{type(model).__name__}. "
            f"Pass exp.model, or build ComposedModel(base, adapter, composer, objective); "
            f"for the frozen base alone pass that model with with_adapter=False."
        )
    return model


def prepare(model: ComposedModel, batch_or_cond: Mapping[str, Any] | Batch) -> Batch:
    """``batch_or_cond`` as a :class:`Batch` on the base's device (raw data goes through
    ``prepare_batch``)."""
    batch = model.base.prepare_batch(batch_or_cond)
    device = model.base.device
    if batch.latents.device != device:
        batch = batch.to(device)
    return batch


def condition_keys(model: ComposedModel) -> dict[str, str]:
    """Every name a condition can be overridden by → the batch key it lives under.

    Backbone keys map to themselves; a declared condition's name and aliases map to the key it
    matched (``"actions"`` → ``"action"`` on tiny_video).
    """
    keys = {k: k for k in model.base.provides()}
    for rc in model.adapter.resolved_conditions:
        if rc.key is not None:
            for name in rc.condition.keys:
                keys.setdefault(name, rc.key)
    return keys


def with_conditions(model: ComposedModel, batch: Batch, cond: Mapping[str, Any] | Batch | None) -> Batch:
    """``batch`` with condition overrides merged in, or a new batch.

    ``cond`` is ``None`` (no change), a :class:`Batch` (used as is), a mapping whose keys all
    name conditions (``{"action": tensor}``: merged into ``batch.cond``; a value may drop the
    batch axis to apply to every sample, and ``None`` removes the condition), or any other
    mapping, read as a new raw batch for ``base.prepare_batch``.
    """
    if cond is None:
        return batch
    if isinstance(cond, Batch):
        return prepare(model, cond)
    if not isinstance(cond, Mapping):
        raise InspectError(
            f"cond must be a mapping of condition overrides (e.g. {{'action': tensor}}), a raw batch, or a "
            f"Batch; got {type(cond).__name__}."
        )
    keys = condition_keys(model)
    unknown = [k for k in cond if k not in keys]
    if unknown:
        try:
            return prepare(model, cond)
        except DataError as err:
            hints = "".join(did_you_mean(k, keys) for k in unknown)
            raise InspectError(
                f"cond has keys {listing(unknown)} that name no condition "
                f"(conditions: {listing(keys)}).{hints} "
                f"It was read as a new raw batch, "
                f"and {type(model.base).__name__}.prepare_batch refused it: {err}"
            ) from err
    merged = dict(batch.cond)
    for name, value in cond.items():
        key = keys[name]
        if value is None:
            merged.pop(key, None)
            continue
        current = batch.cond.get(key)
        if not isinstance(current, torch.Tensor):
            raise InspectError(
                f"cond[{name!r}]: this batch has no {key!r} to override "
                f"(its conditions: {listing(batch.cond)}). "
                f"Pass a new raw batch that includes it instead."
            )
        value = torch.as_tensor(value).to(device=current.device, dtype=current.dtype)
        if value.shape == current.shape[1:]:
            value = value.unsqueeze(0).expand_as(current)
        if value.shape != current.shape:
            raise InspectError(
                f"cond[{name!r}] has shape {tuple(value.shape)}, "
                f"but the batch's {key!r} is {tuple(current.shape)}. "
                f"Give the full shape, or {tuple(current.shape[1:])} for the same value on every sample."
            )
        merged[key] = value
    return dataclasses.replace(batch, cond=merged)


def rolled_conditions(model: ComposedModel, batch: Batch, condition: str, shift: int = 1) -> Batch:
    """``batch`` with ``condition`` taken from another clip (rolled along the batch): a wrong-condition
    control."""
    key = condition_key(model, batch, condition)
    if batch.batch_size < 2:
        raise InspectError(
            f"Swapping {condition!r} between clips needs a batch of at least 2 clips, "
            f"got {batch.batch_size}. "
            f"Pass a batch with several clips."
        )
    return dataclasses.replace(batch, cond={**batch.cond, key: torch.roll(batch.cond[key], shift, dims=0)})


def condition_key(model: ComposedModel, batch: Batch, condition: str) -> str:
    """The batch key of a condition the adapter reads, checked to be present."""
    keys = condition_keys(model)
    if condition not in keys:
        raise InspectError(
            f"condition={condition!r} is not a condition of this model (conditions: {listing(keys)})."
            f"{did_you_mean(condition, keys)}"
        )
    key = keys[condition]
    if not isinstance(batch.cond.get(key), torch.Tensor):
        raise InspectError(
            f"condition={condition!r}: this batch has no {key!r} (its conditions: {listing(batch.cond)}). "
            f"Pass a raw batch that includes it."
        )
    return key


def t_for_noise_level(objective: Objective, level: float) -> float | int:
    """The ``t`` (objective units) whose noise level is ``level`` in [0, 1]: ``objective.t_for_noise_level``.

    Flow matching: ``t`` is the noise level. Diffusion: the training timestep whose
    ``sqrt(1 - ᾱ_t)`` is closest to ``level``.
    """
    level = float(level)
    if not 0.0 <= level <= 1.0:
        raise InspectError(f"noise level {level!r} is outside [0, 1] (0 = clean, 1 = pure noise).")
    try:
        return objective.t_for_noise_level(level)
    except NotImplementedError as err:
        raise InspectError(
            f"Cannot map noise level {level} to t for {objective.describe()}: "
            f"it defines no t_for_noise_level. "
            f"Give the objective that method, or use FlowMatching or Diffusion."
        ) from err


def t_tensor(objective: Objective, level: float, batch_size: int, device: torch.device) -> torch.Tensor:
    """``(B,)`` timesteps at noise level ``level``, in the dtype the objective's sampler uses."""
    t = t_for_noise_level(objective, level)
    dtype = torch.long if isinstance(t, int) else torch.float32
    return torch.full((batch_size,), t, dtype=dtype, device=device)


def check_levels(levels: Sequence[float]) -> np.ndarray:
    """``levels`` as a float64 array of noise levels, checked to lie in [0, 1]."""
    out = np.asarray(list(levels), dtype=np.float64)
    if out.ndim != 1 or not out.size or ((out < 0) | (out > 1)).any():
        raise InspectError(f"levels must be noise levels in [0, 1] (0 = clean, 1 = pure noise), "
                           f"got {list(levels)!r}.")
    return out


def seeded_noise(batch: Batch, seed: int) -> torch.Tensor:
    """One standard-normal draw shaped like ``batch.latents``, from ``seed`` on the batch's device."""
    g = torch.Generator(device=batch.latents.device).manual_seed(int(seed))
    return torch.randn(batch.latents.shape, generator=g, device=batch.latents.device,
                       dtype=batch.latents.dtype)


def masked_rms(x: torch.Tensor, mask: torch.Tensor | None) -> float:
    """Root mean square of ``(B, C, T, ...)`` over the frames ``mask`` ``(B, T)`` selects (all when
    ``None``)."""
    sq = x.float().square()
    if mask is None:
        return float(sq.mean().sqrt())
    m = mask.to(device=sq.device, dtype=sq.dtype).view(sq.shape[0], 1, sq.shape[2], *([1] * (sq.ndim - 3)))
    count = (m.sum() * sq.shape[1] * math.prod(sq.shape[3:])).clamp_min(1.0)
    return float(((sq * m).sum() / count).sqrt())
