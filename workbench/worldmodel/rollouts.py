"""State readers for rollouts: where a chunk's ``ee_pos`` comes from when it is not recorded.

:func:`workbench.inspect.rollout` gives an adapter that reads the robot's state (the action
path reads ``ee_pos``, the hand position at the first frame) the state at each chunk's first
frame. In a rollout that frame is one the model produced, so the state is read off it:

* :func:`probe_reader` (``state="probe"``): the shipped hand probe
  (:mod:`workbench.worldmodel.probe`) on the last context frame, in metres;
* :func:`recorded_reader` (``state="recorded"`` does the same inside the rollout): the recorded
  position — a ceiling for measurements (is state estimation what drifts?), not a world model;
* any callable ``frames_uint8 [B, T, H, W, 3] -> [B, 3]``.

The probe is registered under the name ``probe`` (the ``workbench.state_readers`` entry point,
and in process when this module is imported).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def probe_reader(probe: Any = None) -> Callable[[np.ndarray], np.ndarray]:
    """A state reader: the hand probe's position (metres) on the last of the frames, ``[B, 3]``.

    ``probe``: a :class:`~workbench.worldmodel.probe.HandProbe` (default: the shipped one)."""
    from workbench.worldmodel.probe import shipped_probe

    hand = probe if probe is not None else shipped_probe()

    def read(frames: np.ndarray) -> np.ndarray:
        frames = np.asarray(frames)
        return hand.positions(frames[:, -1])

    read.__name__ = "hand_probe"
    return read


def recorded_reader(ee_pos: Any, starts: list[int] | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """A stand-in reader that returns recorded positions ``ee_pos`` ``[B, F, 3]`` in order of calls: the
    position at ``starts[i]`` on the i-th call (for tests and ceilings outside :func:`rollout`)."""
    values = np.asarray(ee_pos, np.float64)
    calls = iter(starts or [])

    def read(frames: np.ndarray) -> np.ndarray:
        return values[:, next(calls)]

    return read


def register() -> None:
    """Register :func:`probe_reader` as ``state="probe"`` in this process."""
    from workbench.inspect.recording.rollouts import register_state_reader

    register_state_reader("probe", probe_reader)


register()

__all__ = ["probe_reader", "recorded_reader", "register"]
