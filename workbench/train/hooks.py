"""The callbacks of one ``fit``: collected once, looked up by hook, called with their errors named.

A :class:`~workbench.core.callbacks.Callback`'s hooks do nothing unless it overrides them, so
:class:`Hooks` keeps, for each hook, only the callbacks that override it: a hook nobody overrides
costs the loop one test of an empty list per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workbench.core.callbacks import Callback
from workbench.errors import CallbackError, CompositionError, NonFiniteLossError

#: The hooks, in the order a fit calls them.
HOOKS = ("on_fit_start", "on_step_start", "on_after_backward", "on_step_end", "on_eval", "on_fit_end")


def collect(callbacks: Iterable[Callback]) -> list[Callback]:
    """``callbacks`` in order, each kept once (by its :meth:`~workbench.core.callbacks.Callback.key`)."""
    seen, out = set(), []
    for cb in callbacks:
        if not isinstance(cb, Callback):
            raise CompositionError(f"Callbacks must subclass workbench.Callback, got {type(cb).__name__}.")
        if cb.key() in seen:
            continue
        seen.add(cb.key())
        out.append(cb)
    return out


def overriding(callbacks: list[Callback], hook: str) -> list[Callback]:
    """The callbacks whose ``hook`` does something (the base class's hooks do nothing)."""
    default = getattr(Callback, hook)
    return [cb for cb in callbacks if getattr(getattr(cb, hook), "__func__", None) is not default]


class Hooks:
    """The callbacks of one fit (:func:`collect`), and for each hook those that override it
    (``hooks.on_step_end``, ...). ``main``: whether this process is the run's main one; a callback
    with ``main_process_only`` is called there only."""

    def __init__(self, callbacks: Iterable[Callback], *, main: bool = True):
        self.callbacks = collect(callbacks)
        self.main = main
        self.on_fit_start = overriding(self.callbacks, "on_fit_start")
        self.on_step_start = overriding(self.callbacks, "on_step_start")
        self.on_after_backward = overriding(self.callbacks, "on_after_backward")
        self.on_step_end = overriding(self.callbacks, "on_step_end")
        self.on_eval = overriding(self.callbacks, "on_eval")
        self.on_fit_end = overriding(self.callbacks, "on_fit_end")

    def call(self, hook: str, exp: Any, *args: Any, callbacks: list[Callback] | None = None) -> None:
        """``cb.hook(exp, *args)`` for each callback that overrides ``hook`` (or each of
        ``callbacks``, some of them); an error is re-raised as a
        :class:`~workbench.errors.CallbackError` naming the callback, the hook and the step."""
        for cb in getattr(self, hook) if callbacks is None else callbacks:
            if cb.main_process_only and not self.main:
                continue  # (decided here, after every rank took the same collectives for the same list)
            try:
                getattr(cb, hook)(exp, *args)
            except (KeyboardInterrupt, NonFiniteLossError, CallbackError):
                raise
            except Exception as err:
                raise CallbackError(
                    f"Callback {type(cb).__name__} raised in {hook} at step {exp.step}: "
                    f"{type(err).__name__}: {err}"
                ) from err


__all__ = ["HOOKS", "Hooks", "collect", "overriding"]
