"""Declared conditions: what an adapter reads, matched against what a backbone supplies.

An adapter declares ``consumes = (Condition("action", per_frame="keep", dim=4), ...)``. At
construction the names are matched against ``backbone.provides()`` (aliases resolved); a
mismatch raises before any compute. At each call the matched tensors are prepared: width
checked, frames collapsed as declared, dropout applied in training (per sample, seeded),
dtype and device matched to ``x_t``. A missing optional condition is ``None``, never zeros.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.errors import ConditionError, listing

PER_FRAME_CHOICES = (None, "mean", "sum", "keep")


@dataclass(frozen=True)
class Condition:
    """One input an adapter reads.

    Args:
        name: the attribute the adapter reads (``cond.action``).
        aliases: other keys the backbone may use for it; the first present wins, ``name`` first.
        dim: expected feature width (last axis); checked on every call.
        per_frame: how a per-frame tensor ``(B, T, ...)`` reaches the adapter: ``"keep"``
            (``(B, T, ...)``), ``"mean"`` / ``"sum"`` over frames (``(B, ...)``), or ``None`` for a
            per-sample condition (a per-frame tensor is then an error: the choice is explicit).
        required: when False and the backbone does not supply it, the adapter sees ``None``.
        dropout: probability of dropping the condition per sample in training (its values
            are replaced by zeros and ``cond.dropped(name)`` says which samples); 0 in eval.
        video: the condition is a video ``(B, C, T, H, W)`` (a control video: edges, depth, ...),
            checked to be 5-D with ``dim`` its channel count (axis 1); ``per_frame`` stays ``None``
            (its frames are axis 2, kept as they are).
    """

    name: str
    aliases: tuple[str, ...] = ()
    dim: int | None = None
    per_frame: str | None = None
    required: bool = True
    dropout: float = 0.0
    video: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ConditionError(f"Condition name must be a Python identifier, got {self.name!r}.")
        if isinstance(self.aliases, str):
            object.__setattr__(self, "aliases", (self.aliases,))
        object.__setattr__(self, "aliases", tuple(self.aliases))
        if self.per_frame not in PER_FRAME_CHOICES:
            raise ConditionError(
                f"Condition {self.name!r}: per_frame={self.per_frame!r}; "
                f"allowed: None, 'mean', 'sum', 'keep'."
            )
        if self.dim is not None and (not isinstance(self.dim, int) or self.dim < 1):
            raise ConditionError(f"Condition {self.name!r}: dim={self.dim!r}; "
                                 f"must be a positive int or None.")
        if self.video and self.per_frame is not None:
            raise ConditionError(
                f"Condition {self.name!r}: video=True with per_frame={self.per_frame!r}; a video condition "
                f"(B, C, T, H, W) keeps its frames on axis 2 as they are: leave per_frame=None."
            )
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ConditionError(
                f"Condition {self.name!r}: dropout={self.dropout!r}; must be in [0, 1) "
                f"(1 would drop it always: declare required=False instead)."
            )

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class ResolvedCondition:
    """A condition and the backbone key it matched (``None``: optional and not supplied)."""

    condition: Condition
    key: str | None


@dataclass
class Batch:
    """What ``backbone.prepare_batch`` returns: clean latents and the conditions it supplies.

    Attributes:
        latents: clean latents ``(B, C, T, H, W)``.
        cond: condition tensors by the backbone's own key names.
        loss_mask: ``(B, T)`` over latent frames, 1 where the loss counts (e.g. 0 on a
            conditioning first frame); ``None`` = everywhere.
        per_frame: keys of ``cond`` whose axis 1 is time (``(B, T, ...)``).
        meta: anything else the backbone wants to carry (not seen by adapters).
    """

    latents: torch.Tensor
    cond: dict[str, Any] = field(default_factory=dict)
    loss_mask: torch.Tensor | None = None
    per_frame: frozenset[str] = frozenset()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.latents.shape[0]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Batch:
        def move(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                if dtype is not None and v.is_floating_point():
                    return v.to(device=device, dtype=dtype, non_blocking=True)
                return v.to(device=device, non_blocking=True)
            return v

        return dataclasses.replace(
            self,
            latents=move(self.latents),
            cond={k: move(v) for k, v in self.cond.items()},
            loss_mask=move(self.loss_mask),
        )

    def select(self, index: slice | Sequence[int] | torch.Tensor) -> Batch:
        """Rows of the batch (tensors with a batch axis are indexed, the rest kept)."""
        b = self.batch_size

        def pick(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.ndim > 0 and v.shape[0] == b:
                return v[index]
            return v

        return dataclasses.replace(
            self, latents=self.latents[index], cond={k: pick(v) for k, v in self.cond.items()},
            loss_mask=pick(self.loss_mask),
        )


def resolve_conditions(
    conditions: Sequence[Condition], provides: Sequence[str], *, adapter: str, backbone: str
) -> tuple[ResolvedCondition, ...]:
    """Match declared conditions to the backbone's keys; raise before any compute on a mismatch."""
    provided = tuple(provides)
    seen: set[str] = set()
    resolved = []
    for cond in conditions:
        if not isinstance(cond, Condition):
            raise ConditionError(f"{adapter}.consumes must hold Condition objects, got {cond!r}.")
        if cond.name in seen:
            raise ConditionError(f"{adapter} declares condition {cond.name!r} twice.")
        seen.add(cond.name)
        key = next((k for k in cond.keys if k in provided), None)
        if key is None and cond.required:
            looked = ", ".join(f"'{k}'" for k in cond.keys)
            raise ConditionError(
                f"{adapter} consumes condition {cond.name!r} (looked for {looked}), but "
                f"{backbone}.provides() provides {listing(provided)}.\n"
                f"Fix it in one of three ways: add the key {cond.name!r} in the backbone's "
                f"prepare_batch; declare an alias on the Condition (e.g. "
                f"Condition({cond.name!r}, aliases=('<backbone key>',))); or mark it required=False "
                f"if the adapter can work without it."
            )
        resolved.append(ResolvedCondition(cond, key))
    return tuple(resolved)


@dataclass(frozen=True)
class ConditionInfo:
    """How one condition was prepared, for ``repr`` and the probes."""

    name: str
    key: str | None
    shape: tuple[int, ...] | None
    dtype: str | None
    per_frame: str | None
    dropout: float
    dropout_applied: bool
    dropped_mask: torch.Tensor | None = None  # CPU bool (B,); counted only when asked (no device sync)

    @property
    def dropped(self) -> int:
        return 0 if self.dropped_mask is None else int(self.dropped_mask.sum())


def _dropout_generator(seed: int, step: int, name: str) -> torch.Generator:
    mixed = (int(seed) * 1_000_003 + int(step) * 7_919 + zlib.crc32(name.encode())) % (2**63 - 1)
    return torch.Generator(device="cpu").manual_seed(mixed)


def dropout_mask(batch_size: int, rate: float, *, seed: int, step: int, name: str) -> torch.Tensor:
    """Per-sample bool mask (True = dropped), a pure function of (seed, step, name)."""
    draws = torch.rand(batch_size, generator=_dropout_generator(seed, step, name))
    return draws < rate


class Conditioning(Mapping):
    """The prepared conditions an adapter receives.

    ``cond.action`` is a declared condition (prepared); ``cond["fs"]`` reaches any key the
    backbone supplied (declared names give the prepared value). ``cond.dropped("action")`` is
    the per-sample bool mask of dropped samples (``None`` when dropout did not apply). An adapter's
    ``view`` makes one; it is read-only.

    Args:
        prepared: The declared conditions by name, each prepared as its :class:`Condition` says.
        raw: Every key of the backbone's batch, reachable as ``cond[key]``.
        info: What was declared about each prepared condition, by name.
        dropped: Per condition, the per-sample bool mask of samples whose condition was dropped
            (True = dropped), for those dropout applied to.
        owner: Who reads the conditions, named in the error an undeclared name raises.
    """

    def __init__(self, prepared: dict[str, Any], raw: Mapping[str, Any], info: dict[str, ConditionInfo],
                 dropped: dict[str, torch.Tensor], owner: str = "adapter"):
        object.__setattr__(self, "_prepared", prepared)
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_info", info)
        object.__setattr__(self, "_dropped", dropped)
        object.__setattr__(self, "_owner", owner)

    def select(self, index: slice | Sequence[int] | torch.Tensor, batch_size: int) -> Conditioning:
        """Rows of the conditioning, as :meth:`Batch.select` takes rows of a batch: the values whose first
        axis is the batch (``batch_size`` rows, which the conditioning itself does not know) are indexed, the
        rest kept."""
        n = batch_size

        def pick(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.ndim > 0 and v.shape[0] == n:
                return v[index]
            return v

        return Conditioning({k: pick(v) for k, v in self._prepared.items()},
                            {k: pick(v) for k, v in self._raw.items()}, self._info,
                            {k: pick(v) for k, v in self._dropped.items()}, self._owner)

    def __getattr__(self, name: str) -> Any:
        prepared = object.__getattribute__(self, "_prepared")
        if name in prepared:
            return prepared[name]
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self._owner} did not declare condition {name!r}; declared: {listing(prepared)}. "
            f"Add Condition({name!r}) to its consumes, or read a backbone key with cond[{name!r}] "
            f"(available: {listing(self._raw)})."
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Conditioning is read-only; build a new one with adapter.view(...).")

    def __getitem__(self, key: str) -> Any:
        if key in self._prepared:
            return self._prepared[key]
        if key in self._raw:
            return self._raw[key]
        raise KeyError(
            f"No condition {key!r}: declared {listing(self._prepared)}, backbone keys {listing(self._raw)}."
        )

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._prepared, *self._raw]))

    def __len__(self) -> int:
        return len(set(self._prepared) | set(self._raw))

    @property
    def declared(self) -> dict[str, Any]:
        """The prepared declared conditions, by name."""
        return dict(self._prepared)

    @property
    def info(self) -> dict[str, ConditionInfo]:
        return dict(self._info)

    def dropped(self, name: str) -> torch.Tensor | None:
        return self._dropped.get(name)

    def __repr__(self) -> str:
        lines = [f"Conditioning for {self._owner}:"]
        for info in self._info.values():
            if info.key is None:
                lines.append(f"  {info.name}: None (optional, not supplied by the backbone)")
                continue
            alias = "" if info.key == info.name else f" (matched alias '{info.key}')"
            frames = {None: "video" if len(info.shape) == 5 else "per-sample", "keep": "per-frame kept",
                      "mean": "frames -> mean", "sum": "frames -> sum"}[info.per_frame]
            if info.dropout == 0:
                drop = "no dropout"
            elif info.dropout_applied:
                drop = f"dropout {info.dropout:g}: {info.dropped} of {info.shape[0]} dropped"
            else:
                drop = f"dropout {info.dropout:g}: off (not training)"
            lines.append(f"  {info.name}{alias}: {tuple(info.shape)} {info.dtype}, {frames}, {drop}")
        extra = [k for k in self._raw if k not in self._prepared and k not in
                 {i.key for i in self._info.values()}]
        if extra:
            lines.append(f"  backbone keys (by subscript): {', '.join(extra)}")
        return "\n".join(lines)


def prepare_conditioning(
    resolved: Sequence[ResolvedCondition],
    batch: Batch,
    like: torch.Tensor,
    *,
    training: bool,
    step: int | None,
    seed: int,
    owner: str,
) -> Conditioning:
    """Build the :class:`Conditioning` an adapter sees for ``batch`` (``like`` is ``x_t``)."""
    raw = batch.cond
    batch_size = like.shape[0]
    prepared: dict[str, Any] = {}
    info: dict[str, ConditionInfo] = {}
    dropped: dict[str, torch.Tensor] = {}
    for rc in resolved:
        c = rc.condition
        if rc.key is None:
            prepared[c.name] = None
            info[c.name] = ConditionInfo(c.name, None, None, None, c.per_frame, c.dropout, False)
            continue
        if rc.key not in raw or raw[rc.key] is None:
            if not c.required:
                prepared[c.name] = None
                info[c.name] = ConditionInfo(c.name, None, None, None, c.per_frame, c.dropout, False)
                continue
            raise ConditionError(
                f"{owner} consumes condition {c.name!r} (backbone key {rc.key!r}); the backbone "
                f"declares it in provides(), but this batch has no {rc.key!r}. Keys in the batch: "
                f"{listing(raw)}. Pass it in the raw batch (e.g. an 'actions' array for an action "
                f"condition), or mark the condition required=False."
            )
        value = raw[rc.key]
        if not isinstance(value, torch.Tensor):
            raise ConditionError(
                f"{owner}: condition {c.name!r} (key {rc.key!r}) must be a tensor, got "
                f"{type(value).__name__}. Convert it in the backbone's prepare_batch."
            )
        is_frames = rc.key in batch.per_frame
        if c.video:
            if value.ndim != 5 or (c.dim is not None and value.shape[1] != c.dim):
                channels = f"C={c.dim}" if c.dim is not None else "C"
                raise ConditionError(
                    f"{owner}: condition {c.name!r} (key {rc.key!r}) is declared a video "
                    f"({batch_size}, {channels}, T, H, W), got shape {tuple(value.shape)}. "
                    f"Pass a control video with that layout in the raw batch's {rc.key!r}, "
                    f"or declare dim={value.shape[1] if value.ndim == 5 else '<channels>'}."
                )
        elif value.ndim == 5 and not is_frames:
            reads = "a per-frame vector" if c.per_frame else "a per-sample value"
            width = f" of width {c.dim}" if c.dim is not None else ""
            raise ConditionError(
                f"{owner}: condition {c.name!r} (key {rc.key!r}) is a video, shape {tuple(value.shape)} "
                f"(B, C, T, H, W), but the Condition reads {reads}{width}. Declare "
                f"Condition({c.name!r}, video=True, dim={value.shape[1]}) to read it as a video "
                f"(for controlnet: video: true, dim: {value.shape[1]})."
            )
        if is_frames and c.per_frame is None:
            raise ConditionError(
                f"{owner}: condition {c.name!r} (key {rc.key!r}) is per-frame, shape "
                f"{tuple(value.shape)} (B, T, ...), but the Condition has per_frame=None. Choose how "
                f"frames reach the adapter: per_frame='keep' (B, T, ...), 'mean' or 'sum' (B, ...)."
            )
        if not is_frames and c.per_frame is not None:
            raise ConditionError(
                f"{owner}: condition {c.name!r} (key {rc.key!r}) is per-sample, shape "
                f"{tuple(value.shape)}, but the Condition has per_frame={c.per_frame!r}. Use "
                f"per_frame=None for a per-sample condition."
            )
        if value.shape[0] != batch_size:
            raise ConditionError(
                f"{owner}: condition {c.name!r} has batch size {value.shape[0]}, x_t has {batch_size}."
            )
        if c.dim is not None and not c.video:
            width = value.shape[-1] if value.ndim >= 2 else None
            if width != c.dim:
                raise ConditionError(
                    f"{owner}: condition {c.name!r} (key {rc.key!r}) has width {width} "
                    f"(shape {tuple(value.shape)}), but the Condition declares dim={c.dim}. "
                    f"Declare dim={width} or fix the backbone's prepare_batch."
                )
        if c.per_frame == "mean":
            value = value.float().mean(dim=1) if not value.is_floating_point() else value.mean(dim=1)
        elif c.per_frame == "sum":
            value = value.sum(dim=1)
        if value.is_floating_point():
            value = value.to(device=like.device, dtype=like.dtype)
        else:
            value = value.to(device=like.device)
        applied = training and c.dropout > 0 and step is not None
        host_mask = None
        if applied:
            host_mask = dropout_mask(batch_size, c.dropout, seed=seed, step=step, name=c.name)
            mask = host_mask.to(like.device, non_blocking=True)
            dropped[c.name] = mask
            keep = (~mask).view(batch_size, *([1] * (value.ndim - 1)))
            value = torch.where(keep, value, torch.zeros((), dtype=value.dtype, device=value.device))
        prepared[c.name] = value
        info[c.name] = ConditionInfo(c.name, rc.key, tuple(value.shape),
                                     str(value.dtype).replace("torch.", ""),
                                     c.per_frame, c.dropout, applied, host_mask)
    return Conditioning(prepared, raw, info, dropped, owner)
