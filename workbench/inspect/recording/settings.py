"""How the live steps of a run evaluate: with or without the adapter, another composer, a gate override.

A :class:`Settings` travels with a trajectory and stacks through forks; :func:`applied` puts
one in force on a model for the length of a ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from workbench.core.composed import ComposedModel
from workbench.core.composers import Composer
from workbench.inspect.common import InspectError


@dataclass(frozen=True, eq=False)
class Settings:
    """How the live steps of a run evaluate: with or without the adapter, another composer, a gate override.

    ``None`` everywhere means the model as it is (``model.adapter_enabled``, ``model.composer``).
    """

    with_adapter: bool | None = None
    composer: Composer | None = None
    gate_override: float | torch.Tensor | None = None

    def merged(self, with_adapter: bool | None = None, composer: Composer | None = None,
               gate_override: Any = None) -> Settings:
        """These settings with the given ones in force (``None`` keeps this one's)."""
        check_with_adapter(with_adapter, "None keeps the parent's setting")
        if composer is not None and not isinstance(composer, Composer):
            raise InspectError(f"composer must be a workbench.Composer, got {type(composer).__name__}.")
        return Settings(with_adapter=self.with_adapter if with_adapter is None else with_adapter,
                        composer=composer if composer is not None else self.composer,
                        gate_override=gate_override if gate_override is not None else self.gate_override)

    def check(self, model: ComposedModel) -> None:
        """Raise now, not mid-sampling, when these settings do not fit ``model`` (a gate override its
        composer refuses)."""
        if self.gate_override is not None:
            composer = self.composer if self.composer is not None else model.composer
            with composer.override_gate(self.gate_override):
                pass

    def describe(self) -> str:
        """What these settings change, e.g. ``"adapter off, gate=0.5"`` (empty when they change nothing)."""
        parts = []
        if self.with_adapter is not None:
            parts.append(f"adapter {'on' if self.with_adapter else 'off'}")
        if self.composer is not None:
            parts.append(self.composer.describe())
        if self.gate_override is not None:
            g = self.gate_override
            parts.append(f"gate={float(g):g}" if torch.as_tensor(g).numel() == 1 else "gate=override")
        return ", ".join(parts)


def check_with_adapter(value: Any, none: str | None = None, who: str = "") -> None:
    """Raise unless ``value`` is a bool (or ``None`` where ``none`` says what it means)."""
    if isinstance(value, bool) or (value is None and none is not None):
        return
    allowed = "True (base + adapter) or False (the frozen base alone)" + (f"; {none}" if none else "")
    raise InspectError(f"{who}with_adapter={value!r} is not allowed: it takes {allowed}.")


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


__all__ = ["Settings", "applied", "check_with_adapter"]
