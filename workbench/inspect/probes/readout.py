"""Readouts: numbers read off predicted frames, so an instrument can say *where* an edit lands.

A latent difference says that a prediction changed, not whether the arm moved left or right. A
readout turns frames into positions in units a person checks (a hand position in cm, an object's
pixel position, ...). The library defines only the shape of one; a study brings its own (the
world-model wing's hand probe: ``HandProbe.readout()``).

    from workbench.inspect import Readout
    hand = Readout(probe.positions, name="hand", unit="cm", scale=100.0, axes=("x", "y", "z"))
    hand(frames)                           # uint8 [T, H, W, 3] -> float64 [T, 3], in cm

Any object with ``name``, ``unit`` and ``__call__(frames) -> [T, D]`` works where a readout is
taken (:class:`FrameReadout`); :func:`check_readout` wraps a bare function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from workbench.inspect.common import InspectError


@runtime_checkable
class FrameReadout(Protocol):
    """What instruments take as a readout: frames in, positions out.

    ``readout(frames)`` maps uint8 frames ``[T, H, W, 3]`` to positions ``[T, D]`` in ``unit``;
    ``name`` says what is read (``"hand"``)."""

    name: str
    unit: str

    def __call__(self, frames: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Readout:
    """A function from frames to positions, with what it reads and in which unit.

    Attributes:
        fn: Uint8 frames ``[T, H, W, 3]`` → an array ``[T, D]`` (numpy or torch).
        name: What it reads, e.g. ``"hand"``.
        unit: The unit of the scaled result, e.g. ``"cm"``.
        scale: The factor the result is multiplied by (e.g. 100 for metres → cm).
        axes: A name per dimension (default ``d0, d1, ...``).

    Examples:
        >>> from workbench.worldmodel.probe import HandProbe
        >>> probe = HandProbe.from_pretrained()
        >>> hand = Readout(probe.positions, name="hand", unit="cm", scale=100.0, axes=("x", "y", "z"))
        >>> hand(traj.frames("final", decode="full")).shape   # uint8 [T, H, W, 3] -> float64 [T, 3], in cm
        (16, 3)
    """

    fn: Callable[[np.ndarray], Any]
    name: str = "position"
    unit: str = ""
    scale: float = 1.0
    axes: tuple[str, ...] = ()

    def __post_init__(self):
        if not callable(self.fn):
            raise InspectError(f"Readout fn must be callable (frames -> positions), "
                               f"got {type(self.fn).__name__}.")
        object.__setattr__(self, "axes", tuple(self.axes))

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        out = self.fn(frames)
        if hasattr(out, "detach"):  # a torch tensor
            out = out.detach().cpu().numpy()
        return np.asarray(out, dtype=np.float64) * self.scale


def check_readout(readout: Any) -> FrameReadout | None:
    """``readout`` as a :class:`FrameReadout` (``None`` stays ``None``; a bare function gets a
    :class:`Readout` named after it, without a unit)."""
    if readout is None or isinstance(readout, FrameReadout):
        return readout
    if callable(readout):
        return Readout(readout, name=getattr(readout, "__name__", "readout"))
    raise InspectError(
        f"readout must map frames to positions: a callable (uint8 [T, H, W, 3] -> [T, D]), ideally a "
        f"workbench.inspect.Readout(fn, name=..., unit=...), got {type(readout).__name__}."
    )


def read_positions(readout: FrameReadout, frames: np.ndarray) -> np.ndarray:
    """``readout(frames)`` checked: float64 ``[T, D]``, one finite position per frame."""
    out = np.asarray(readout(frames), dtype=np.float64)
    if out.ndim == 1:
        out = out[:, None]
    if out.ndim != 2 or out.shape[0] != frames.shape[0]:
        raise InspectError(
            f"The readout {readout.name!r} returned shape {tuple(out.shape)} for {frames.shape[0]} frames; "
            f"it must return one position per frame, [{frames.shape[0]}, D]."
        )
    if not np.isfinite(out).all():
        raise InspectError(f"The readout {readout.name!r} returned NaN or infinite positions.")
    return out


def axis_names(readout: FrameReadout, dims: int) -> list[str]:
    """The readout's names for its ``dims`` dimensions (``x, y, z`` for three unnamed ones)."""
    axes = list(getattr(readout, "axes", ()) or ())
    if len(axes) == dims:
        return axes
    return ["x", "y", "z"] if dims == 3 else [f"d{d}" for d in range(dims)]


@dataclass
class PathComparison:
    """Two paths read off two videos of the same clip: the recorded prediction and an edited one.

    ``recorded`` / ``edited``: ``[T, D]`` in ``unit``. ``predicted``: the frames that count (a given
    first frame is the same in both and says nothing about the edit).
    """

    name: str
    unit: str
    axes: tuple[str, ...]
    recorded: np.ndarray
    edited: np.ndarray
    predicted: tuple[int, ...]

    @property
    def distance(self) -> np.ndarray:
        """Per frame, how far apart the two positions are ``(T,)``."""
        return np.linalg.norm(self.edited - self.recorded, axis=-1)

    @property
    def shift(self) -> np.ndarray:
        """``edited - recorded`` at the last frame ``(D,)``."""
        return self.edited[-1] - self.recorded[-1]

    @property
    def moved(self) -> float:
        """How far the edit moved the position at the last frame."""
        return float(self.distance[-1])

    @property
    def mean_distance(self) -> float:
        """The mean distance over the predicted frames."""
        frames = list(self.predicted) or list(range(len(self.distance)))
        return float(self.distance[frames].mean())

    def describe(self, frame: int | None = None) -> str:
        """E.g. ``"hand moved 22.1 cm at the last frame (x -20.3, y +8.1, z -3.0 cm); 9.7 cm on average"``."""
        unit = f" {self.unit}" if self.unit else ""
        last = len(self.distance) - 1
        f = last if frame is None else min(max(int(frame), 0), last)
        shift = self.edited[f] - self.recorded[f]
        parts = ", ".join(f"{a} {v:+.1f}" for a, v in zip(self.axes, shift))
        where = "at the last frame" if f == last else f"at frame {f}"
        return (f"{self.name} moved {float(self.distance[f]):.1f}{unit} {where} ({parts}{unit}); "
                f"{self.mean_distance:.1f}{unit} on average over the predicted frames")


def compare_paths(readout: FrameReadout, recorded: np.ndarray, edited: np.ndarray,
                  predicted: Sequence[int] = ()) -> PathComparison:
    """Read ``recorded`` and ``edited`` (uint8 ``[T, H, W, 3]`` each) with ``readout``.

    Args:
        readout: A :class:`Readout` (or any callable with its ``name`` and ``unit``).
        recorded: The recorded prediction's frames, uint8 ``[T, H, W, 3]``.
        edited: The edited prediction's frames, the same shape.
        predicted: The frames that count (a given first frame is the same in both and says nothing about
            the edit).

    Returns:
        The two paths, ``[T, D]`` each in the readout's unit.

    Raises:
        InspectError: When the readout returns different shapes for the two videos.
    """
    a, b = read_positions(readout, recorded), read_positions(readout, edited)
    if a.shape != b.shape:
        raise InspectError(f"The readout {readout.name!r} returned {a.shape} and {b.shape} "
                           f"for two videos of the same length.")
    return PathComparison(readout.name, readout.unit, tuple(axis_names(readout, a.shape[1])), a, b,
                          tuple(int(f) for f in predicted))


__all__ = ["FrameReadout", "PathComparison", "Readout", "axis_names", "check_readout", "compare_paths",
           "read_positions"]
