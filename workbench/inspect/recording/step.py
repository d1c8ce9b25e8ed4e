"""What one recorded sampling step holds."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.core.composers import Diagnostics
from workbench.inspect.common import InspectError, check_choice
from workbench.inspect.recording.storage import FIELDS


@dataclass
class TrajectoryStep:
    """One sampling step, as a recorded trajectory keeps it (one per step run) and as ``on_step`` sees it
    live. Latent-shaped tensors are ``(B, C, T, h, w)``; ``None`` = not stored.

    ``t`` ``(B,)`` is in the objective's units; ``noise_level`` (alias ``sigma``) ``(B,)`` in
    [0, 1]; both are kept for every step. ``x_t`` entered the step; ``base`` / ``adapter`` / ``composed``
    are the predictions at ``x_t`` (``adapter`` is ``None`` when the adapter was off), ``composed`` being
    what the composer returned to the sampler (under guidance: for the conditional batch). ``x0`` is the
    objective's clean-sample estimate **from** ``composed``, the one :meth:`Trajectory.x0_of
    <workbench.inspect.Trajectory.x0_of>` gives for a recomposed prediction, so an unedited
    recomposition reproduces it exactly. ``guided_x0`` (live steps handed to ``on_step`` only,
    never stored): the estimate from the prediction the sampler's update used, which under
    classifier-free guidance mixes in the unconditional branch; without guidance it is ``x0``.
    ``diagnostics``: what the composer applied (:class:`~workbench.core.composers.Diagnostics`:
    ``gate``, ``mask``, ``noise_weight``, ``extra``). ``stored``: the fields kept (the storage policy's
    ``fields``), or ``None`` where the policy skipped the step (only ``t`` and ``noise_level`` are kept then).
    ``calls``: every prediction the sampler received in the step, what a fork replays (``None`` when
    not kept, and on a live step). A fork's steps are its parent's first ``at`` steps, shared, followed
    by its own.
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
    stored: tuple[str, ...] | None = FIELDS
    guided_x0: torch.Tensor | None = None
    calls: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)

    @property
    def sigma(self) -> torch.Tensor:
        return self.noise_level

    def get(self, kind: str) -> torch.Tensor:
        """The tensor of ``kind`` (one of ``x_t``, ``x0``, ``base``, ``adapter``, ``composed``)."""
        check_choice(kind, FIELDS, "kind")
        if kind not in (self.stored or ()):
            raise InspectError(f"Step {self.index} has no {kind!r}: it was not stored (StoragePolicy fields="
                               f"{self.stored or ()}). Record with {kind!r} in StoragePolicy.fields.")
        value = getattr(self, kind)
        if value is None:
            raise InspectError(f"Step {self.index} has no {kind!r}: the adapter was off for this step.")
        return value


__all__ = ["TrajectoryStep"]
