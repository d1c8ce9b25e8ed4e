"""What one recorded sampling step holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.core.composers import Diagnostics
from workbench.inspect.common import InspectError, check_choice
from workbench.inspect.recording.storage import FIELDS


@dataclass
class TrajectoryStep:
    """One sampling step. Latent-shaped tensors are ``(B, C, T, h, w)``; ``None`` = not stored.

    ``t`` ``(B,)`` is in the objective's units; ``noise_level`` (alias ``sigma``) ``(B,)`` in
    [0, 1]. ``x_t`` entered the step; ``base`` / ``adapter`` / ``composed`` are the predictions
    at ``x_t`` (``adapter`` is ``None`` when the adapter was off), ``composed`` being what the
    composer returned to the sampler (under guidance: for the conditional batch). ``x0`` is the
    objective's clean-sample estimate **from** ``composed``, the one :meth:`Trajectory.x0_of
    <workbench.inspect.Trajectory.x0_of>` gives for a recomposed prediction, so an unedited
    recomposition reproduces it exactly. ``guided_x0`` (live steps handed to ``on_step`` only,
    never stored): the estimate from the prediction the sampler's update used, which under
    classifier-free guidance mixes in the unconditional branch; without guidance it is ``x0``.
    ``diagnostics``: what the composer applied (:class:`~workbench.core.composers.Diagnostics`:
    ``gate``, ``mask``, ``noise_weight``, ``extra``).
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
    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    stored: tuple[str, ...] = FIELDS
    guided_x0: torch.Tensor | None = None

    @property
    def sigma(self) -> torch.Tensor:
        return self.noise_level

    def get(self, kind: str) -> torch.Tensor:
        """The tensor of ``kind`` (one of ``x_t``, ``x0``, ``base``, ``adapter``, ``composed``)."""
        check_choice(kind, FIELDS, "kind")
        if kind not in self.stored:
            raise InspectError(f"Step {self.index} has no {kind!r}: it was not stored (StoragePolicy fields="
                               f"{self.stored}). Record with {kind!r} in StoragePolicy.fields.")
        value = getattr(self, kind)
        if value is None:
            raise InspectError(f"Step {self.index} has no {kind!r}: the adapter was off for this step.")
        return value


@dataclass(frozen=True)
class StepLog:
    """One step as a recorded trajectory keeps it: ``t`` and ``noise_level`` (always), ``fields`` (the
    stored :class:`TrajectoryStep`; ``None`` where the storage policy skipped the step) and ``calls``
    (every prediction the sampler received in the step, what a fork replays; ``None`` when not kept).
    A fork's log is its parent's first ``at`` entries, shared, followed by its own live steps."""

    t: torch.Tensor
    noise_level: torch.Tensor
    fields: TrajectoryStep | None = None
    calls: tuple[torch.Tensor, ...] | None = None


__all__ = ["StepLog", "TrajectoryStep"]
