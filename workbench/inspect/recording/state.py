"""State readers: the state a rollout gives a chunk, read off the frames the model produced.

An adapter may read a state at a window's first frame: the action path reads where the hand is
(``ee_pos``). In a rollout every chunk after the first starts from a frame the model made, so that
state is read off the frame by a **state reader**, never taken from the recording. A reader says
which conditions its reading fills (:attr:`StateReader.keys`: names an adapter declares in its
``consumes``) and maps uint8 frames ``[B, T, H, W, 3]`` (a chunk's context frames) to the state at
the last one, ``[B, D]`` (or ``[B, T, D]``: the last row is used).

Readers register by name like any component: ``@register("state_reader", name)`` on a subclass and
an entry point in the group ``workbench.state_readers`` of its distribution, so that
``rollout(..., state=name)`` finds it without its package being imported first. The library
registers none; the world-model wing registers its hand probe as ``"probe"``.

Two values of ``state=`` read the start clip's record instead of the frames, so they are modes of the
rollout, not readers: :data:`START` (the state recorded at frame 0, for every chunk: what any dataset
with a recorded state, such as LeRobot's ``observation.state``, knows when the episode starts) and
:data:`RECORDED` (the recorded state at each chunk's first frame: a ceiling).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from workbench.errors import UnknownComponentError, did_you_mean, listing
from workbench.inspect.common import InspectError
from workbench.registry import registered, resolve

#: The ``state=`` of :func:`~workbench.inspect.rollout` that gives each chunk the *recorded* state at its
#: first frame: a ceiling for measurements (is state estimation what drifts?), not a world model.
RECORDED = "recorded"
#: The ``state=`` of :func:`~workbench.inspect.rollout` that gives every chunk the state the start clip
#: records at frame 0: what is known when the episode starts, held (stale once the robot has moved). For
#: data whose state nothing reads off the frames (a recorded ``observation.state``); nothing recorded
#: after frame 0 is read.
START = "start"


class StateReader:
    """Reads the state a rollout's chunk is given off the frames the model produced.

    Wrap a function, ``StateReader(fn, keys=("ee_pos",))``, or subclass it: set :attr:`keys` and
    override :meth:`read` (a registered reader is built with no arguments). A reader that can also
    read single frames offers :meth:`readout`, which the Drive view draws as the path.

    Examples:
        >>> def brightness(frames):                       # uint8 [B, T, H, W, 3] -> [B, 1]
        ...     return frames[:, -1].reshape(len(frames), -1).mean(axis=1, keepdims=True) / 255
        >>> reader = StateReader(brightness, keys=("light",))
        >>> reader(np.full((2, 1, 8, 8, 3), 255, np.uint8)).tolist()
        [[1.0], [1.0]]
    """

    #: The conditions the reading fills: an adapter that declares one of them (by name or alias) is given it.
    keys: tuple[str, ...] = ()

    def __init__(self, read: Callable[[np.ndarray], Any] | None = None, *, keys: Sequence[str] | None = None):
        if read is not None and not callable(read):
            raise InspectError(f"StateReader(read, keys=...): read must be a function of frames "
                               f"(uint8 [B, T, H, W, 3] -> [B, D]), got {type(read).__name__}.")
        if read is None and type(self).read is StateReader.read:
            raise InspectError("StateReader needs a function to read with: "
                               "StateReader(fn, keys=('ee_pos',)), or a subclass that defines read(frames).")
        self.fn = read
        keys = self.keys if keys is None else keys
        if isinstance(keys, str) or not keys or not all(isinstance(k, str) and k.isidentifier()
                                                        for k in keys):
            raise InspectError(f"StateReader keys must name the conditions its reading fills, e.g. "
                               f"keys=('ee_pos',); got {keys!r}.")
        self.keys = tuple(keys)

    @property
    def name(self) -> str:
        """The wrapped function's name, or the class's."""
        return getattr(self.fn, "__name__", None) or type(self).__name__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, keys={self.keys})"

    def read(self, frames: np.ndarray) -> Any:
        """The state at the last of ``frames`` (uint8 ``[B, T, H, W, 3]``): ``[B, D]`` (or ``[B, T, D]``)."""
        return self.fn(frames)

    def __call__(self, frames: np.ndarray) -> Any:
        return self.read(frames)

    def readout(self) -> Any:
        """The reader as a readout of single frames (uint8 ``[T, H, W, 3]`` -> ``[T, D]``, a
        :class:`~workbench.inspect.probes.readout.FrameReadout`) for a path a view draws, or None (the
        default) where it offers none."""
        return None


def state_reader(name: str) -> StateReader:
    """The state reader registered as ``name``, built (in process, or through the
    ``workbench.state_readers`` entry points)."""
    names = registered("state_reader")
    if name not in names:
        raise UnknownComponentError(
            f"state={name!r} names no state reader. Registered: {listing(names)}.{did_you_mean(name, names)} "
            f"Pass state=None (no state), state={START!r} (the state recorded at frame 0, held), "
            f"state={RECORDED!r} (the recorded state: a ceiling, for measurements), "
            f"a StateReader(fn, keys=(...)), or register one: "
            f"@register('state_reader', {name!r}) on a StateReader subclass, with an entry point in the "
            f"group 'workbench.state_readers' of its package (then reinstall it).")
    reader = resolve("state_reader", name)()
    if not isinstance(reader, StateReader):
        raise InspectError(f"The state reader registered as {name!r} built a {type(reader).__name__}, "
                           f"not a StateReader: register a subclass of workbench.inspect.StateReader.")
    return reader


def resolve_state(state: Any, who: str) -> tuple[StateReader | None, str]:
    """``state=`` as ``(reader, mode)``: ``(None, "none")``, ``(None, "start")``, ``(None, "recorded")``, a
    registered reader and its name, or a given reader and ``"reader"``."""
    if state is None:
        return None, "none"
    if isinstance(state, str):
        return (None, state) if state in (START, RECORDED) else (state_reader(state), state)
    if isinstance(state, StateReader):
        return state, "reader"
    if callable(state):
        name = getattr(state, "__name__", type(state).__name__)
        raise InspectError(f"{who}: state={name} is a plain function, which does not say which conditions "
                           f"its reading fills. Wrap it: state=StateReader({name}, keys=('ee_pos',)), "
                           f"with the condition(s) it reads.")
    raise InspectError(f"{who}: state={state!r}; pass None (no state), {START!r}, {RECORDED!r}, the name of "
                       f"a registered state reader, or a StateReader.")


__all__ = ["RECORDED", "START", "StateReader", "resolve_state", "state_reader"]
