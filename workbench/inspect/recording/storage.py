"""What a recording keeps, where, at what precision, and how many bytes that will be.

    storage = StoragePolicy(dtype=torch.float16, every=2, fields=("x0",), max_bytes=2**30)
    estimate_memory(model, batch, steps=20, storage=storage)   # bytes, before running anything
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from workbench.core.backbone import predictions_per_step
from workbench.core.composed import ComposedModel
from workbench.core.composers import ComposeContext, composition_of
from workbench.core.conditions import Batch
from workbench.errors import InspectError, StorageWarning
from workbench.inspect.common import check_choice, check_model, prepare
from workbench.inspect.recording.settings import Settings, applied

FIELDS = ("x_t", "x0", "base", "adapter", "composed")


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
        if self.dtype is not None and not (isinstance(self.dtype, torch.dtype)
                                           and self.dtype.is_floating_point):
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


def same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def store(x: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None = None, *,
          private: bool = False) -> torch.Tensor:
    """A private copy of ``x`` for the trajectory (never aliasing what the sampler holds).

    ``private``: ``x`` is already the trajectory's own (a tensor computed for it that nothing else
    holds), so where no conversion or move is needed it is kept as it is rather than copied."""
    x = x.detach()
    converted = dtype is not None and x.dtype != dtype and x.is_floating_point()
    if converted:
        x = x.to(dtype)  # on the source device: moves half the bytes for float16
    if device is None or device == x.device or same_device(device, x.device):
        return x if converted or private else x.clone()
    if device.type == "cpu" and x.device.type == "cuda":
        out = torch.empty(x.shape, dtype=x.dtype, device="cpu", pin_memory=True)
        return out.copy_(x, non_blocking=True)
    return x.to(device, non_blocking=True)


def synchronize(device: torch.device) -> None:
    """Wait for the non_blocking copies off ``device`` (once per run, not per step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- memory ----------------------------------------------------------------------------------
def latent_bytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()


def estimate(model: ComposedModel, batch: Batch, steps: int, storage: StoragePolicy, settings: Settings,
              live_from: int = 0, keep: bool = True, sampler_kwargs: Mapping[str, Any] | None = None) -> int:
    shape, native = batch.latents.shape, batch.latents.dtype
    final = latent_bytes(shape, native)
    if not keep:
        return final
    store_dtype = storage.dtype or native
    adapter_on = model.adapter_enabled if settings.with_adapter is None else settings.with_adapter
    fields = [f for f in storage.fields if adapter_on or f != "adapter"]
    kept = sum(storage.keeps(k, steps, live_from) for k in range(live_from, steps))
    per_step = len(fields) * latent_bytes(shape, store_dtype)
    diagnostics = 0
    if adapter_on:  # a dry composition on zeros gives the diagnostics' exact shapes
        zeros = torch.zeros(shape, dtype=native, device=batch.latents.device)
        ones = torch.ones(shape[0], device=zeros.device)
        ctx = ComposeContext(x_t=zeros, t=ones, noise_level=ones, step=None)
        with applied(model, settings) as m, torch.no_grad():
            diag = composition_of(m.composer, zeros, zeros, ctx).diagnostics
        diagnostics = sum(latent_bytes(v.shape, store_dtype if v.is_floating_point() else v.dtype)
                          for v in diag.as_dict().values())
    scalars = 2 * shape[0] * 8 * (steps - live_from)  # t and noise level per step (at most 8 bytes each)
    replay = 0
    if storage.replay:
        shared = kept if storage.shares_replay(native) else 0
        # each call's prediction is kept
        calls = predictions_per_step(model.base, batch, **(sampler_kwargs or {}))
        replay = ((steps - live_from) * calls - shared) * latent_bytes(shape, native)
    return final + kept * (per_step + diagnostics) + scalars + replay


def estimate_memory(model: ComposedModel, batch_or_cond: Mapping[str, Any] | Batch, steps: int | None = None,
                    storage: StoragePolicy | None = None, record: bool = True, **sampler_kwargs: Any) -> int:
    """Bytes a recording of ``steps`` steps will hold under ``storage``, before running it.

    Exact for the latent-shaped fields, the replay cache (one prediction per ``compose_fn`` call:
    the backbone's :func:`~workbench.core.backbone.predictions_per_step` for these
    ``sampler_kwargs``, e.g. two a step under classifier-free guidance), the final latents and
    the composer's diagnostics (taken from a dry composition on zeros); ``t`` / noise level are
    counted at 8 bytes each.
    """
    model = check_model(model, "estimate_memory")
    batch = prepare(model, batch_or_cond)
    steps, _ = model.base.card.resolve_steps(steps)
    return estimate(model, batch, steps, storage or StoragePolicy(), Settings(), keep=record,
                    sampler_kwargs=sampler_kwargs)


def check_budget(estimate: int, storage: StoragePolicy, steps: int, shape: torch.Size) -> None:
    if storage.max_bytes is None or estimate <= storage.max_bytes:
        return
    message = (
        f"Recording {steps} steps of {tuple(shape)} latents would hold {estimate / 2**20:.2f} MiB "
        f"(fields {', '.join(storage.fields)} every {storage.every} step(s) at "
        f"{str(storage.dtype or 'the model dtype').replace('torch.', '')}"
        f"{', plus the replay cache' if storage.replay else ''}), "
        f"over StoragePolicy(max_bytes={storage.max_bytes}). "
        f"Keep less: dtype=torch.float16 halves the fields, every=k keeps every k-th step, "
        f"fields=('x0',) keeps only the x0 estimate, replay=False drops the fork cache; or raise max_bytes."
    )
    if storage.on_exceed == "raise":
        raise InspectError(message)
    warnings.warn(message, StorageWarning, stacklevel=3)


__all__ = ["FIELDS", "StoragePolicy", "check_budget", "estimate", "estimate_memory", "latent_bytes",
           "same_device", "store", "synchronize"]
