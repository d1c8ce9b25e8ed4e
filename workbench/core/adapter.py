"""The adapter contract: the small trainable part that reads declared conditions."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from workbench.core.conditions import (
    Batch,
    Condition,
    Conditioning,
    ResolvedCondition,
    prepare_conditioning,
    resolve_conditions,
)
from workbench.errors import CompositionError, ConditionError

AT_INIT = ("zero_output", "identity", "any")
"""What an adapter promises at init (:attr:`Adapter.at_init`)."""


class Adapter(nn.Module):
    """Base class for adapters; derive from one of its two kinds.

    * :class:`SideAdapter` sits **beside** the frozen base: declare ``consumes = (Condition(...),
      ...)`` and implement ``forward(x_t, t, cond, base_output=None) -> correction`` with ``x_t``
      ``(B, C, T, H, W)``, ``t`` ``(B,)`` and ``cond`` a :class:`Conditioning`; a composer folds the
      correction onto the base's prediction.
    * :class:`InsideAdapter` works **inside** the base (LoRA, hooks, a ControlNet branch): it
      implements :meth:`engaged` / :meth:`switched_off`, and the adapted base's prediction is the
      prediction (composed with ``Replace``).

    Each declares one init behaviour, :attr:`at_init`, which the test suite proves bit-exactly.

    Construction (the convention every component follows): an adapter with settings has a
    ``config_class`` dataclass that validates itself, takes ``__init__(config=None, **overrides)``
    (a config or its fields by name, never both: see :func:`workbench.config.config_from`), keeps
    the validated config as ``self.config``, and ``build(kind, name, to_dict(self.config))`` rebuilds it.

    Examples:
        >>> from torch import nn
        >>> class ActionBias(SideAdapter):
        ...     consumes = (Condition("action", dim=4, per_frame="mean"),)
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.proj = nn.Linear(4, 4)
        ...     def forward(self, x_t, t, cond, base_output=None):
        ...         return self.proj(cond.action)[..., None, None, None]     # (B, C, 1, 1, 1)
        >>> ActionBias().consumes[0].name
        'action'
    """

    consumes: tuple[Condition, ...] = ()
    """The conditions it reads, matched against the backbone's ``provides()`` when bound."""
    at_init: Literal["zero_output", "identity", "any"] = "any"
    """``zero_output``: :meth:`forward` returns exactly 0 at init (a side adapter); ``identity``: the
    adapted base is exactly the base at init (an inside adapter); ``any``: no promise."""
    reuses_base_output: bool = True
    """The base's prediction does not depend on the adapter, so a cached one may be reused."""
    inside: bool = False
    """Set by the kind: ``True`` for an :class:`InsideAdapter` (changes the base's own forward)."""
    config_class: type | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.at_init not in AT_INIT:
            raise TypeError(f"{cls.__qualname__}.at_init = {cls.at_init!r}; allowed: {', '.join(AT_INIT)}.")

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_resolved", None)
        object.__setattr__(self, "_bound_to", None)
        object.__setattr__(self, "_noise_level_fn", None)
        self.condition_seed = 0

    # -- binding -----------------------------------------------------------------------------
    def bind(self, backbone) -> tuple[ResolvedCondition, ...]:
        """Match ``consumes`` against ``backbone.provides()``; raises before any compute."""
        resolved = resolve_conditions(
            self.consumes, backbone.provides(), adapter=type(self).__name__, backbone=type(backbone).__name__
        )
        # Stored outside the module tree: the adapter must never own (or train-mode) the base.
        object.__setattr__(self, "_resolved", resolved)
        object.__setattr__(self, "_bound_to", backbone)
        return resolved

    @property
    def bound_backbone(self):
        """The backbone :meth:`bind` matched this adapter against (``None`` before), held outside the
        module tree: the adapter never owns or train-modes the frozen base."""
        return self._bound_to

    @property
    def resolved_conditions(self) -> tuple[ResolvedCondition, ...]:
        if self._resolved is None:
            raise ConditionError(
                f"{type(self).__name__} is not bound to a backbone yet. Build it into a ComposedModel "
                f"or AdapterExperiment (or call adapter.bind(backbone)) first."
            )
        return self._resolved

    def set_objective(self, objective) -> None:
        """Called by ComposedModel: lets :meth:`noise_level` map ``t`` to [0, 1]."""
        object.__setattr__(self, "_noise_level_fn", objective.noise_level)

    def noise_level(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (objective units) as a noise level in [0, 1], ``(B,)``."""
        if self._noise_level_fn is None:
            raise ConditionError(f"{type(self).__name__} has no objective yet; "
                                 f"build it into a ComposedModel.")
        return self._noise_level_fn(t)

    def attach_base_model(self, base) -> None:
        """Hook for adapters that reach into the frozen base's modules. Default: nothing."""

    def engaged(self, cond: Conditioning, x_t: torch.Tensor, t: torch.Tensor):
        """Context in which the base's forward is the adapted one (``inside`` adapters). Default: nothing."""
        return contextlib.nullcontext(self)

    def switched_off(self):
        """Context in which the base is exactly the frozen base (``inside`` adapters). Default: nothing."""
        return contextlib.nullcontext(self)

    # -- conditioning ------------------------------------------------------------------------
    def conditioning(self, batch: Batch, like: torch.Tensor, *, step: int | None = None,
                     training: bool | None = None) -> Conditioning:
        """The prepared :class:`Conditioning` for ``batch`` (``like``: the ``x_t`` it goes with)."""
        return prepare_conditioning(
            self.resolved_conditions, batch, like,
            training=self.training if training is None else training,
            step=step, seed=self.condition_seed, owner=type(self).__name__,
        )

    def view(self, raw_or_batch: Mapping[str, Any] | Batch, *, step: int | None = None) -> Conditioning:
        """Exactly the conditioning this adapter gets in training, for a probe or an ablation.

        ``step=None`` gives the sampling view (no dropout); ``step=k`` (in train mode) the view
        of training step ``k``, dropout included, bit-identical to what the loop passed.
        """
        backbone = self._bound_to
        if backbone is None:
            _ = self.resolved_conditions  # raises the not-bound error
        batch = raw_or_batch if isinstance(raw_or_batch, Batch) else backbone.prepare_batch(raw_or_batch)
        return self.conditioning(batch, batch.latents, step=step, training=self.training and step is not None)

    # -- extension points --------------------------------------------------------------------
    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: Conditioning,
                base_output: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def callbacks(self) -> tuple:
        """Callbacks this adapter brings to any training run it is part of."""
        return ()


class SideAdapter(Adapter):
    """An adapter beside the frozen base: ``forward(x_t, t, cond, base_output=None) -> correction``.

    The base runs once per prediction (its output handed to ``forward`` as ``base_output``) and a
    composer folds the correction onto it. ``at_init = "zero_output"`` when ``forward`` returns
    exactly 0 at init: the usual composers are then the identity at init.
    """

    inside = False


class InsideAdapter(Adapter):
    """An adapter inside the frozen base: it changes the base's own forward, so the adapted base's
    prediction is the prediction (composed with ``Replace``).

    Implements :meth:`engaged` (the base's forward is the adapted one inside the block) and
    :meth:`switched_off` (the base is exactly the frozen base inside the block), and is exactly the
    base at init (``at_init = "identity"``). :class:`workbench.adapters.inside.InsideSpecAdapter` adds
    what the shipped ones share: where to reach (the backbone's ``inside_spec()``), hooks and LoRA.
    """

    inside = True
    reuses_base_output = False
    at_init = "identity"

    def forward(self, x_t, t, cond, base_output=None):
        raise CompositionError(
            f"{type(self).__name__} changes the base's own forward, so it has no output of its own: "
            f"evaluate it through its ComposedModel (model.predict(x_t, t, batch)), which runs the base "
            f"with it engaged."
        )
