"""The project's exception types.

Every error a user can cause is raised as one of these, with a message that says what was
wrong, the value received, what is allowed, and the change to make.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class WorkbenchError(Exception):
    """Base class of every error workbench raises on purpose."""


class ConfigError(WorkbenchError, ValueError):
    """A configuration (YAML or a component's config dataclass) is invalid."""


class ConditionError(WorkbenchError, ValueError):
    """An adapter's declared conditions do not match what the backbone supplies."""


class CompositionError(WorkbenchError, ValueError):
    """A composer, adapter or objective was set up in a way that cannot work."""


class CardError(WorkbenchError, ValueError):
    """A ModelCard failed validation."""


class SamplerMismatchError(WorkbenchError, ValueError):
    """A sampling request contradicts what the model's recipe assumes (e.g. its step count)."""


class UnknownComponentError(WorkbenchError, LookupError):
    """A component name is not registered in this environment."""


class CheckpointError(WorkbenchError, RuntimeError):
    """A checkpoint is missing, unreadable, or does not fit the experiment."""


class DataError(WorkbenchError, ValueError):
    """A data file or batch does not have the expected layout."""


class CapabilityError(DataError):
    """A request the backbone's current mode cannot serve (e.g. text-only on an image-to-video mode)."""


class NonFiniteLossError(WorkbenchError, FloatingPointError):
    """Training produced a NaN or infinite loss."""


class CallbackError(WorkbenchError, RuntimeError):
    """A callback raised; the message names the callback and the hook."""


class InspectError(WorkbenchError, ValueError):
    """An instrument (trajectory, preview, probe) was asked for something it cannot give."""


class StepError(InspectError, IndexError):
    """A step index that is out of range or was not stored."""


class PolicyError(WorkbenchError, RuntimeError):
    """A policy in closed-loop evaluation could not be loaded, raised, or returned actions it may not.

    The message names the policy (its name and where it was defined), the chunk, what it returned and
    what is allowed. ``result``: what was computed before it failed (a
    :class:`~workbench.inspect.recording.closed_loop.ClosedLoop` of the chunks done, or None when it failed
    at the first); ``observation``: the :class:`~workbench.inspect.recording.closed_loop.Observation` it was
    given (None when it failed to load).
    """

    def __init__(self, message: str, *, result=None, observation=None) -> None:
        super().__init__(message)
        self.result = result
        self.observation = observation


class ConformanceError(WorkbenchError, AssertionError):
    """A backbone broke promises of the contract (``workbench.testing.check_backbone``).

    Its message is the report's text.

    Args:
        report: The :class:`~workbench.testing.ConformanceReport` listing every promise checked, kept as
            ``.report``.
    """

    def __init__(self, report: Any) -> None:
        super().__init__(str(report))
        self.report = report


class StorageWarning(UserWarning):
    """A recording will hold more memory than its ``StoragePolicy.max_bytes`` allows."""


class SlowDtypeWarning(UserWarning):
    """bfloat16 was asked for on a CPU that computes it only by emulation (tens of times slower).

    Issued once per process by :func:`workbench.core.platform.resolve_dtype` when a CPU dtype
    resolves to bfloat16 and ``torch.backends.cpu.get_cpu_capability()`` reports an x86 CPU below
    AVX-512 (``AVX2``, ``DEFAULT``, ``NO AVX``; AVX-512 and AMX compute it natively). Silence it with
    ``warnings.filterwarnings("ignore", category=SlowDtypeWarning)``, or use ``dtype: auto``
    (float32 on a CPU).
    """


def did_you_mean(name: str, choices: Iterable[str], *, n: int = 3) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choices, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=n, cutoff=0.6)
    if not close:
        return ""
    if len(close) == 1:
        return f" Did you mean '{close[0]}'?"
    return " Did you mean one of " + ", ".join(f"'{c}'" for c in close) + "?"


def listing(names: Iterable[str]) -> str:
    """Sorted, quoted, comma-separated names; ``(none)`` when empty."""
    items = sorted({str(n) for n in names})
    return ", ".join(f"'{n}'" for n in items) if items else "(none)"

