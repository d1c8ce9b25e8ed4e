"""The callback base class, and the callbacks core components declare for themselves.

Hooks do nothing by default; override the ones you need. ``every_n_steps`` sets the cadence
of ``on_step_end`` (``None`` = every step). The trainer collects the callbacks declared by the
backbone, the adapter, the composer and the objective, plus the user's, without duplicates.
"""

from __future__ import annotations

from typing import Any


class Callback:
    """Base class: hooks ``on_fit_start``, ``on_step_start``, ``on_after_backward``,
    ``on_step_end``, ``on_eval``, ``on_fit_end``. Each receives the experiment (and, where
    relevant, the step and a metrics dict).

    A callback buildable from YAML follows the components' construction convention: a
    ``config_class`` dataclass, ``__init__(config=None, **overrides)``, the validated config kept
    as ``self.config`` (see :func:`workbench.config.config_from` and the built-ins in
    :mod:`workbench.train.callbacks`)."""

    every_n_steps: int | None = None
    main_process_only: bool = False  # in a distributed run, call it on rank 0 only (loggers)

    def key(self) -> Any:
        """Identity used to drop duplicates when callbacks are collected."""
        return (type(self), id(self))

    def due(self, step: int) -> bool:
        n = self.every_n_steps
        return n is None or n <= 1 or step % n == 0

    def on_fit_start(self, exp) -> None: ...

    def on_step_start(self, exp, step: int) -> None: ...

    def on_after_backward(self, exp, step: int) -> None: ...

    def on_step_end(self, exp, step: int, metrics: dict) -> None: ...

    def on_eval(self, exp, step: int, metrics: dict) -> None: ...

    def on_fit_end(self, exp) -> None: ...


class GateStatistics(Callback):
    """Records a gated composer's gate values every ``every_n_steps`` steps.

    Declared by the gated composers themselves, so any run that uses one gets it. History is
    a list of ``{"step": k, **gate_values}`` rows, read by the inspection layer and widgets.
    """

    def __init__(self, composer, every_n_steps: int = 10):
        self.composer = composer
        self.every_n_steps = every_n_steps
        self.history: list[dict[str, float]] = []

    def key(self) -> Any:
        return (type(self), id(self.composer))

    def on_step_end(self, exp, step: int, metrics: dict) -> None:
        values = self.composer.gate_values()
        if values:
            self.history.append({"step": step, **values})
