"""Condition ablation at one step of a recorded trajectory: edit a condition, see the new prediction.

    abl = Ablation(traj, step=10)              # traj from exp.sample(...)
    abl.set(3, 0.5)                            # gripper (dim 3) = +0.5 on every frame
    abl.set(0, -1.0, frame=5)                  # hand dx = -1 on frame 5 only
    recorded, edited, diff = abl.images()      # the x0 estimates: recorded | edited | difference
    abl.change()                               # RMS change of the x0 estimate (latent units)
    final = abl.propagate()                    # the edit carried to the last step (a fork)
    final.path.describe()                      # with a readout: "hand moved 21.4 cm at the last frame ..."

Each re-evaluation is :meth:`Trajectory.recompose`: the base output stored at that step is
reused (when the adapter allows it), so only the adapter and the composer run — that is what
makes a slider answer at once. Results are cached per (step, condition values).

One step shows where the model's guess moves, not where the sampled video ends up: the steps
after it would carry the edit further. :meth:`Ablation.propagate` samples them — a
:meth:`Trajectory.fork` at the step with the edited condition, so its prefix is the recording's
own, bit for bit — and returns the final prediction beside the recorded one, read by a
``readout`` (:mod:`workbench.inspect.probes.readout`) when one is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.core.backbone import causal_latents
from workbench.core.composed import ComposedModel, Prediction
from workbench.core.conditions import Batch
from workbench.inspect.cache import LRUCache
from workbench.inspect.common import (
    InspectError,
    StepError,
    check_choice,
    condition_key,
    masked_rms,
    rolled_conditions,
)
from workbench.inspect.previews.decoding import as_uint8, render_float, render_float_frame
from workbench.inspect.previews.pictures import Panel, ViewImage, signed_limit
from workbench.inspect.previews.preview import DECODES
from workbench.inspect.probes.readout import FrameReadout, PathComparison, check_readout, compare_paths
from workbench.inspect.recording.recorder import StopSampling
from workbench.inspect.recording.storage import StoragePolicy
from workbench.inspect.recording.trajectory import Trajectory
from workbench.inspect.views import given_frames

DIFFERENCE_RANGE = 1.0
"""The default colour range of an ablation's differences, in ``[-1, 1]`` units of mean RGB: ±1, the same for
every edit, so that a small edit shows faint colour and a large one strong colour."""


class ConditionEdit:
    """An editable copy of one condition of a batch (``(B, T, D)`` per frame, or ``(B, D)``).

    :meth:`set` puts a value on one dimension, on every frame or on one frame, for every clip
    of the batch; :meth:`overrides` is what :meth:`Trajectory.fork` / ``recompose`` take as ``cond``.
    """

    def __init__(self, model: ComposedModel, batch: Batch, condition: str = "action",
                 dim_names: Sequence[str] | None = None):
        self.condition = condition
        self.key = condition_key(model, batch, condition)
        value = batch.cond[self.key]
        if value.ndim not in (2, 3):
            raise InspectError(
                f"ConditionEdit edits vector conditions, (B, D) or per frame (B, T, D); "
                f"{condition!r} has shape {tuple(value.shape)}."
            )
        self.original = value.detach().clone()
        self.values = self.original.clone()
        self.names = list(dim_names) if dim_names is not None else [f"d{d}" for d in range(self.dims)]
        if len(self.names) != self.dims:
            raise InspectError(f"dim_names has {len(self.names)} names for the {self.dims} dimensions of "
                               f"{condition!r}; give one name per dimension.")

    @property
    def dims(self) -> int:
        return int(self.original.shape[-1])

    @property
    def frames(self) -> int | None:
        """Frames of a per-frame condition, ``None`` for a per-clip one."""
        return int(self.original.shape[1]) if self.original.ndim == 3 else None

    @property
    def changed(self) -> bool:
        return not torch.equal(self.values, self.original)

    def _check(self, dim: int, frame: int | None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 0 <= dim < self.dims:
            raise InspectError(f"dim={dim!r}: {self.condition!r} has {self.dims} dimensions "
                               f"(0..{self.dims - 1}).")
        if frame is None:
            return
        if self.frames is None:
            raise InspectError(f"frame={frame!r}: {self.condition!r} is one value per clip, not per frame; "
                               f"use frame=None.")
        if (isinstance(frame, bool) or not isinstance(frame, (int, np.integer))
                or not 0 <= frame < self.frames):
            raise StepError(f"frame={frame!r} is out of range: {self.condition!r} has {self.frames} frames "
                            f"(0..{self.frames - 1}), or frame=None for all of them.")

    def set(self, dim: int, value: float, frame: int | None = None) -> None:
        """Set dimension ``dim`` to ``value`` on ``frame`` (``None``: every frame), for every clip."""
        self._check(dim, frame)
        if frame is None:
            self.values[..., dim] = float(value)
        else:
            self.values[:, frame, dim] = float(value)

    def get(self, dim: int, frame: int | None = None, index: int = 0) -> float:
        """The current value of ``dim`` for clip ``index`` (on ``frame``, or its mean over frames)."""
        self._check(dim, frame)
        v = self.values[index]
        return float(v[..., dim].mean() if frame is None else v[frame, dim])

    def reset(self, dim: int | None = None) -> None:
        """Back to the original values (of one dimension, or all)."""
        if dim is None:
            self.values = self.original.clone()
        else:
            self._check(dim, None)
            self.values[..., dim] = self.original[..., dim]

    def describe_edits(self, index: int = 0) -> list[str]:
        """The edited dimensions for clip ``index`` by name, e.g. ``["d3=+0.50"]``, ``["dx=-1.00@f5"]``."""
        out = []
        values, original = self.values[index], self.original[index]
        for d, name in enumerate(self.names):
            if torch.equal(values[..., d], original[..., d]):
                continue
            col = values[..., d]
            if col.ndim == 0 or bool((col == col.reshape(-1)[0]).all()):
                out.append(f"{name}={float(col.reshape(-1)[0]):+.2f}")
            else:
                frames = [int(f) for f in torch.nonzero(col != original[..., d]).reshape(-1)]
                out.append(", ".join(f"{name}={float(col[f]):+.2f}@f{f}" for f in frames))
        return out

    def varying(self, index: int = 0) -> dict[str, tuple[float, float]]:
        """Per dimension whose recorded values differ between frames (clip ``index``): its ``(min, max)``.

        Setting such a dimension on every frame replaces that sequence by one value.
        """
        if self.frames is None:
            return {}
        original = self.original[index]
        return {name: (float(original[:, d].min()), float(original[:, d].max()))
                for d, name in enumerate(self.names)
                if float(original[:, d].max() - original[:, d].min()) > 1e-6}

    def overrides(self) -> dict[str, torch.Tensor] | None:
        """``{condition: values}`` for ``fork`` / ``recompose``, or ``None`` when nothing changed."""
        return {self.condition: self.values.clone()} if self.changed else None


@dataclass
class Propagation:
    """An edit carried to the last step: the final prediction of a fork beside the recorded one.

    ``trajectory``: the fork (``Trajectory.fork(at=step, cond=edited)``; the recording itself when
    nothing was edited). ``recorded`` / ``edited``: the final predictions of clip ``index``, uint8
    ``[T, H, W, 3]``, decoded with ``decode``. ``path``: what the readout reads off both (``None``
    without a readout). ``seconds``: the wall time of the fork and its readout; ``resampled``: the
    steps it sampled again (0 when nothing was edited: then it is the recording itself).
    """

    step: int
    steps: int
    edits: list[str]
    trajectory: Trajectory
    recorded: np.ndarray
    edited: np.ndarray
    decode: str
    given: tuple[bool, ...]
    path: PathComparison | None
    seconds: float
    resampled: int = 0

    @property
    def difference(self) -> np.ndarray:
        """``edited - recorded`` (mean over RGB, in [-1, 1] units) ``[T, H, W]``."""
        return (self.edited.astype(np.float32) - self.recorded.astype(np.float32)).mean(-1) / 127.5

    def panels(self, frame: int, limit: float | None = None, scale: str = "") -> list[Panel]:
        """Frame ``frame`` of the recorded and the edited final prediction and their difference.

        ``limit``: the difference's colour range (``None``: its own largest magnitude); ``scale``: how
        that range was chosen, for the title (e.g. ``"±1 fixed"``; by default the range itself).
        """
        frame = min(max(int(frame), 0), len(self.recorded) - 1)
        diff = self.difference
        edited = ", ".join(self.edits) or "unchanged"
        limit = signed_limit(diff) if limit is None else limit
        return [Panel("recorded run, final", "rgb", self.recorded[frame]),
                Panel(f"edited: {edited}\nfrom step {self.step}, final", "rgb", self.edited[frame]),
                Panel(f"edited − recorded, final\ncolours {scale or f'±{limit:.2g}'}", "signed", diff[frame],
                      "final difference (mean RGB, [-1, 1] units)", limit)]

    def caption(self, frame: int) -> str:
        frame = min(max(int(frame), 0), len(self.recorded) - 1)
        given = " (given)" if frame < len(self.given) and self.given[frame] else ""
        how = (f"steps {self.step}-{self.steps - 1} sampled again with the edit" if self.resampled
               else "no edit: the recorded run")
        return f"final prediction · {how} · frame {frame}{given}"

    def describe(self) -> str:
        """One line: what was edited, from which step, and (with a readout) how far the readout moved."""
        if not self.resampled:
            return "final prediction: no edit, the recorded run"
        where = f"final prediction with {', '.join(self.edits)} from step {self.step} of {self.steps}"
        return where if self.path is None else f"{where}: {self.path.describe()}"


def check_colour_range(colour_range: float | None) -> float | None:
    """``colour_range`` as a positive float, or ``None`` (the range follows each edit)."""
    if colour_range is None:
        return None
    if isinstance(colour_range, bool) or not isinstance(colour_range, (int, float)) or not colour_range > 0:
        raise InspectError(f"colour_range={colour_range!r} is not a colour range; "
                           f"it must be a positive number "
                           f"(the difference's colours span ±colour_range, default {DIFFERENCE_RANGE:g}) "
                           f"or None (the colours follow each edit's largest difference).")
    return float(colour_range)


class Ablation:
    """The prediction at one step of ``trajectory`` under an edited condition (see the module docstring).

    ``readout``: turns the final frames of :meth:`propagate` into positions (a
    :class:`~workbench.inspect.probes.readout.Readout`, e.g. the world-model wing's hand probe), so that
    the propagated edit comes with a number; ``final_decode``: how :meth:`propagate` decodes the
    final frames (default: ``decode``). ``colour_range``: the differences are coloured over
    ±``colour_range`` for every edit (default ±1, ``[-1, 1]`` units of mean RGB), so that colour
    strength compares between edits; ``None``: over each difference's own largest magnitude (every
    edit then looks equally strong; the title gives the range).
    """

    CACHE_SIZE = 32
    PROPAGATED = 8

    def __init__(self, trajectory: Trajectory, step: int | None = None, condition: str = "action",
                 index: int = 0, decode: str = "preview", dim_names: Sequence[str] | None = None,
                 readout: Any = None, final_decode: str | None = None,
                 colour_range: float | None = DIFFERENCE_RANGE):
        if not isinstance(trajectory, Trajectory):
            raise InspectError(f"Ablation needs a Trajectory (exp.sample(...) returns one), got "
                               f"{type(trajectory).__name__}.")
        stored = trajectory.stored
        if not stored:
            raise InspectError("This trajectory stored no steps (record=False?); sample with record=True.")
        b = trajectory.batch.batch_size
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < b:
            raise InspectError(f"index={index!r} is not a batch element; this batch has {b} (0..{b - 1}).")
        check_choice(decode, DECODES, "decode")
        if final_decode is not None:
            check_choice(final_decode, DECODES, "final_decode")
        self.colour_range = check_colour_range(colour_range)
        self.trajectory, self.index, self.decode = trajectory, index, decode
        self.final_decode = final_decode or decode
        self.readout: FrameReadout | None = check_readout(readout)
        self.edit = ConditionEdit(trajectory.model, trajectory.batch, condition, dim_names)
        self.step = stored[len(stored) // 2]
        if step is not None:
            self.seek(step)
        self._cache: LRUCache[Prediction] = LRUCache(self.CACHE_SIZE)
        self._propagated: LRUCache[Propagation] = LRUCache(self.PROPAGATED)
        self._recorded_final: tuple[tuple, np.ndarray] | None = None
        self.held_limit: float | None = None  # the difference's colour range, when held (over colour_range)
        self.evaluations = 0  # recompose calls made (cache misses)

    @property
    def condition(self) -> str:
        return self.edit.condition

    def seek(self, step: int) -> int:
        self.step = self.trajectory[step].index  # raises StepError naming the stored steps
        return self.step

    def set(self, dim: int, value: float, frame: int | None = None) -> None:
        self.edit.set(dim, value, frame)

    def reset(self, dim: int | None = None) -> None:
        self.edit.reset(dim)

    def _key(self) -> tuple:
        return self.step, self.edit.values.cpu().numpy().tobytes()

    def prediction(self) -> Prediction:
        """The composed prediction at the current step with the edited condition (cached)."""
        def evaluate() -> Prediction:
            pred = self.trajectory.recompose(self.step, cond={self.condition: self.edit.values})
            self.evaluations += 1
            return pred

        return self._cache.get(self._key(), evaluate)

    def original_x0(self) -> torch.Tensor:
        """The recorded x0 estimate at the current step ``(B, C, T, h, w)``: the step's ``x0``.

        A step's ``x0`` is made from its composed prediction (see
        :class:`~workbench.inspect.recording.step.TrajectoryStep`), as :meth:`ablated_x0` is from the edited
        one, so an unedited condition shows no change, guided sampling included (the guided estimate mixes
        in a branch an edit does not recompose).
        """
        rec, latents = self.trajectory[self.step], self.trajectory.batch.latents
        remake = {"composed", "x_t"} <= set(rec.stored) and rec.composed is not None
        if remake and (rec.x0 is None or rec.x0.dtype != latents.dtype):
            # not stored, or stored at another precision: made again from the stored composed prediction, as
            # the edit's is
            composed = rec.composed.to(device=latents.device, dtype=latents.dtype)
            x_t = rec.x_t.to(device=latents.device, dtype=latents.dtype)
            return self.trajectory.model.objective.x0_from_prediction(composed, x_t, rec.t.to(latents.device))
        return rec.get("x0").to(device=latents.device)

    def ablated_x0(self) -> torch.Tensor:
        """The x0 estimate with the edited condition ``(B, C, T, h, w)``, on the model's device.

        Given frames (e.g. an image-to-video model's first frame) stay as recorded: the composed
        prediction is constrained by the backbone (its ``constrain``,
        :class:`~workbench.core.capabilities.GivenFrames`) like the sampler's, so only predicted
        frames can differ.
        """
        return self.trajectory.x0_of(self.prediction())

    def change(self) -> float:
        """RMS difference between the edited and the recorded x0 estimate over the predicted frames."""
        after = self.ablated_x0().float()
        diff = after - self.original_x0().to(after.device).float()
        mask = self.trajectory.batch.loss_mask
        i = self.index
        return masked_rms(diff[i:i + 1], None if mask is None else mask[i:i + 1])

    # -- the difference's colour range -------------------------------------------------------
    def hold_scale(self, hold: bool = True) -> float | None:
        """Keep the difference's colour range where it is now (``hold=False``: back to ``colour_range``).

        With ``colour_range=None`` the range follows each edit (its largest magnitude); holding it
        makes moves comparable again: a larger change shows as stronger colour instead of being
        rescaled to the same extremes. Returns the held range (``None`` when released).
        """
        self.held_limit = self.difference_limit(self._difference()) if hold else None
        return self.held_limit

    def _difference(self) -> np.ndarray:
        return self.images(limit=1.0)[2].frames

    def difference_limit(self, difference: np.ndarray) -> float:
        """The colour range a difference is drawn with: the held one, else ``colour_range``, else its own."""
        if self.held_limit is not None:
            return self.held_limit
        return self.colour_range if self.colour_range is not None else signed_limit(difference)

    def describe_scale(self, limit: float) -> str:
        """How the difference's colours are scaled, e.g. ``"±1 fixed"``, ``"±0.13, this edit's own"``."""
        if self.held_limit is not None:
            return f"±{limit:.2g} held"
        return f"±{limit:.2g} fixed" if self.colour_range is not None else f"±{limit:.2g}, this edit's own"

    def images(self, limit: float | None = None, frame: int | None = None,
               ) -> tuple[ViewImage, ViewImage, ViewImage]:
        """``(recorded, edited, edited − recorded)`` x0 estimates: two RGB views and a signed one.

        The difference's colour range is ``limit``, else the held one (:meth:`hold_scale`), else
        ``colour_range`` (±1 unless the ablation was made with another, the same for every edit),
        else (``colour_range=None``) the difference's own largest magnitude. The difference's title
        says which. ``frame``: decode that frame only, where the backbone decodes a frame alone and the
        colour range does not depend on the other frames (the pictures then hold that frame:
        ``ViewImage.partial``); what a slider move draws.
        """
        base = self.trajectory.model.base
        rec = self.trajectory[self.step]
        caption = (f"x0 estimate · step {rec.index} of {rec.steps} · "
                   f"noise level {float(rec.noise_level[0]):.2f}")
        key = (self.step, self.decode, self.index)
        if getattr(self, "_before", (None,))[0] != key:  # the recorded picture does not change with the edits
            self._before = (key, None, {})  # (step, decode, clip), every frame, {frame: that frame alone}
        start, total = 0, None
        ranged = limit is not None or self.held_limit is not None or self.colour_range is not None
        one = render_float_frame(base, self.ablated_x0(), frame, self.decode, self.index) \
            if frame is not None and ranged else None
        if one is not None:
            after, total = one
            start = frame
            before = (self._before[1][frame:frame + 1] if self._before[1] is not None
                      else self._before[2].get(frame))
            if before is None:
                before = render_float_frame(base, self.original_x0(), frame, self.decode, self.index)[0]
                self._before[2][frame] = before
        else:
            if self._before[1] is None:
                self._before = (key, render_float(base, self.original_x0(), self.decode, self.index), {})
            before = self._before[1]
            after = render_float(base, self.ablated_x0(), self.decode, self.index)
        diff = (after - before).mean(-1).astype(np.float32)
        given = given_frames(self.trajectory.batch, self.index, total or diff.shape[0], causal_latents(base))
        edited = ", ".join(self.describe_edits()) or "unchanged"
        limit = limit if limit is not None else self.difference_limit(diff)
        label = ("x0 difference (mean RGB, [-1, 1] units)"
                 + (", held range" if self.held_limit is not None else ""))
        title = f"edited − recorded\ncolours {self.describe_scale(limit)}"
        held = {"given": given, "caption": caption, "start": start, "total": total}
        return (ViewImage("x0", f"recorded {self.condition}", "rgb", as_uint8(before), **held),
                ViewImage("x0", f"edited: {edited}", "rgb", as_uint8(after), **held),
                ViewImage("adapter-base", title, "signed", diff, label, limit, **held))

    def panels(self, frame: int = 0) -> tuple[list[Panel], str]:
        """The three pictures at ``frame`` and their common caption (view, step, noise, frame); decodes that
        frame only where it can (see :meth:`images`)."""
        images = self.images(frame=frame)  # every frame where ``frame`` is past the last one
        frame = min(frame, len(images[0]) - 1)
        return [im.frame(frame) for im in images], f"{images[0].caption} · {images[0].frame_name(frame)}"

    def describe_edits(self) -> list[str]:
        """The edited dimensions for clip ``index`` by name, e.g. ``["d3=+0.50"]``, ``["dx=-1.00@f5"]``."""
        return self.edit.describe_edits(self.index)

    def describe(self) -> str:
        edits = ", ".join(self.describe_edits()) or "no edit"
        return (f"step {self.step}/{self.trajectory.steps}, {self.condition}: {edits}; "
                f"x0 change {self.change():.4f}")

    # -- carried to the last step ------------------------------------------------------------
    def recorded_final(self) -> np.ndarray:
        """The recorded run's final prediction of clip ``index``, uint8 ``[T, H, W, 3]``
        (``final_decode``)."""
        key = (self.final_decode, self.index)
        if self._recorded_final is None or self._recorded_final[0] != key:
            frames = render_float(self.trajectory.model.base, self.trajectory.final, self.final_decode,
                                  self.index)
            self._recorded_final = (key, as_uint8(frames))
        return self._recorded_final[1]

    def cached_propagation(self) -> Propagation | None:
        """The propagation of the current step and edit if it was computed already, else ``None``."""
        key = (*self._key(), self.final_decode, self.index)
        return self._propagated.get(key, lambda: None) if key in self._propagated else None

    def propagate(self, should_stop: Callable[[], bool] | None = None) -> Propagation | None:
        """Sample the steps from the current one to the end with the edited condition: the final prediction.

        The run is :meth:`Trajectory.fork` at the current step with the edited condition — steps
        before it are the recording's own (served from its cache, bit for bit), the rest run
        live — so its final latents equal ``trajectory.fork(at=step, cond=edit.overrides()).final``.
        ``should_stop``: asked after each live step; when it answers True the run stops and this
        returns ``None`` (a newer edit replaces it). Results are cached per (step, edit).

        Examples:
            >>> abl = Ablation(traj, step=10)
            >>> abl.set(0, 1.0)                   # dx = +1 in every frame, from step 10 on
            >>> final = abl.propagate()
            >>> final.edited.shape, final.edited.dtype     # the final prediction with the edit
            ((16, 64, 64, 3), dtype('uint8'))
        """
        # what to run, read once: the view's thread may edit again while this runs
        step, values, edits = self.step, self.edit.values.clone(), self.describe_edits()
        key = (step, values.cpu().numpy().tobytes(), self.final_decode, self.index)
        if key in self._propagated:
            return self._propagated.get(key, lambda: None)
        if not self.trajectory.complete:
            raise InspectError(f"propagate needs a complete trajectory "
                               f"(its final prediction is the comparison); this one stopped "
                               f"after {len(self.trajectory)} of {self.trajectory.steps} steps. "
                               f"traj.resume() finishes it.")
        started = time.perf_counter()
        base = self.trajectory.model.base
        recorded = self.recorded_final()
        # nothing edited: a fork would replay the recording exactly
        if torch.equal(values, self.edit.original):
            fork, edited = self.trajectory, recorded
        else:
            def check(_step) -> None:
                if should_stop is not None and should_stop():
                    raise StopSampling

            storage = StoragePolicy(device=self.trajectory.storage.device,
                                    dtype=self.trajectory.storage.dtype, fields=("x0",), replay=True)
            fork = self.trajectory.fork(at=step, cond={self.condition: values}, storage=storage,
                                        on_step=check, label=f"fork@{step}: {', '.join(edits)}")
            if not fork.complete:
                return None
            edited = as_uint8(render_float(base, fork.final, self.final_decode, self.index))
        given = given_frames(self.trajectory.batch, self.index, len(recorded), causal_latents(base))
        predicted = [f for f in range(len(recorded)) if not (f < len(given) and given[f])]
        path = None if self.readout is None else compare_paths(self.readout, recorded, edited, predicted)
        result = Propagation(step, self.trajectory.steps, edits, fork, recorded, edited, self.final_decode,
                             given, path, time.perf_counter() - started,
                             0 if fork is self.trajectory else fork.steps - step)
        return self._propagated.get(key, lambda: result)


def swap_conditions(trajectory: Trajectory, condition: str = "action", shift: int = 1) -> dict[str, Any]:
    """``cond`` overrides with ``condition`` rolled across the batch: each clip gets another clip's values."""
    batch = rolled_conditions(trajectory.model, trajectory.batch, condition, shift)
    key = condition_key(trajectory.model, trajectory.batch, condition)
    return {condition: batch.cond[key]}


__all__ = ["Ablation", "ConditionEdit", "Propagation", "swap_conditions"]
