"""The probes as state readers: where a rollout's chunk finds the hand it starts from, and where a policy
finds the hand and the object.

:func:`workbench.inspect.rollout` gives an adapter that reads the robot's state (the action path
reads ``ee_pos``, the hand position at the first frame) the state at each chunk's first frame. In
a rollout that frame is one the model produced, so the state is read off it: :class:`HandProbeReader`
reads it with the shipped hand probe (:mod:`workbench.worldmodel.probe`), in metres. It is
registered as the state reader ``"probe"`` (``rollout(..., state="probe")``): in process when this
module is imported, and through the ``workbench.state_readers`` entry point otherwise.
:class:`ObjectProbeReader` reads the object (push-v3's puck) with the shipped object probe, as
``object_pos``: no adapter reads it, the scripted policies do (:mod:`workbench.worldmodel.scripted`), and it
is registered as ``"object_probe"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.inspect import Readout, StateReader
from workbench.registry import register

if TYPE_CHECKING:
    from workbench.worldmodel.probe import HandProbe


class _ProbeReader(StateReader):
    """A probe's reading of the last of the frames; ``probe`` defaults to :meth:`shipped`, loaded when first
    used."""

    def __init__(self, probe: HandProbe | None = None):
        super().__init__()
        self._probe = probe

    @staticmethod
    def shipped() -> HandProbe:
        raise NotImplementedError

    @property
    def probe(self) -> HandProbe:
        if self._probe is None:
            self._probe = self.shipped()
        return self._probe

    def read(self, frames: Any) -> np.ndarray:
        return self.probe.positions(np.asarray(frames)[:, -1])


@register("state_reader", "probe")
class HandProbeReader(_ProbeReader):
    """The hand position (metres, ``[B, 3]``) the probe reads off the last of the frames, as ``ee_pos``.

    ``probe``: a :class:`~workbench.worldmodel.probe.HandProbe` (default: the shipped one, loaded on
    first use).

    Examples:
        >>> reader = HandProbeReader()
        >>> frames = np.zeros((2, 1, 64, 64, 3), np.uint8)      # two context frames of one frame each
        >>> reader.keys, reader(frames).shape
        (('ee_pos',), (2, 3))
    """

    keys = ("ee_pos",)

    @staticmethod
    def shipped() -> HandProbe:
        from workbench.worldmodel.probe import shipped_probe

        return shipped_probe()

    def readout(self):
        """The probe's readout of single frames: the hand in cm (what the Drive view draws)."""
        return self.probe.readout()


@register("state_reader", "object_probe")
class ObjectProbeReader(_ProbeReader):
    """The object's position (metres, ``[B, 3]``: push-v3's puck) the object probe reads off the last of the
    frames, as ``object_pos``.

    ``probe``: a :class:`~workbench.worldmodel.probe.HandProbe` trained to read the object (default: the
    shipped object probe, loaded on first use).

    Examples:
        >>> ObjectProbeReader()(np.zeros((2, 1, 64, 64, 3), np.uint8)).shape
        (2, 3)
    """

    keys = ("object_pos",)

    @staticmethod
    def shipped() -> HandProbe:
        from workbench.worldmodel.probe import shipped_object_probe

        return shipped_object_probe()

    def readout(self):
        """The object probe's readout of single frames, in cm."""
        return Readout(self.probe.positions, name="object", unit="cm", scale=100.0, axes=("x", "y", "z"))


__all__ = ["HandProbeReader", "ObjectProbeReader"]
