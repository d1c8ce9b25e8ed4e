"""Pictures ready to draw: a :class:`ViewImage` (every frame of one view of one step) and its :class:`Panel`
frames.

RGB frames are uint8; signed differences and gates are float maps, drawn with a colour map
(diverging and centred on zero for signed maps) over a range the whole view shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from workbench.inspect.common import StepError
from workbench.inspect.previews.colors import colorize

Kind = Literal["rgb", "signed", "gate"]


@dataclass
class Panel:
    """One picture: ``image`` is uint8 ``[H, W, 3]`` (``kind="rgb"``) or float ``[H, W]``.

    Float maps are drawn with ``cmap`` over ``[-limit, limit]`` (signed) or ``[0, limit]`` (gate);
    ``label`` says what the colours measure; ``note`` what else a reader must know about this
    picture (e.g. "adapter off here (NoiseGated band 0.30–1.00, noise level 0.05)").
    """

    title: str
    kind: Kind
    image: np.ndarray
    label: str = ""
    limit: float = 1.0
    note: str = ""

    @property
    def cmap(self) -> str | None:
        return {"rgb": None, "signed": "diverging", "gate": "sequential"}[self.kind]

    @property
    def vrange(self) -> tuple[float, float]:
        return (-self.limit, self.limit) if self.kind == "signed" else (0.0, self.limit)

    def colored(self) -> np.ndarray:
        """uint8 ``[H, W, 3]``: the picture as drawn."""
        if self.kind == "rgb":
            return self.image
        return colorize(self.image, self.cmap, *self.vrange)


@dataclass
class ViewImage:
    """Every frame of one view of one step.

    ``title`` names the picture (the branch); ``caption`` what it shows (view, step, noise).
    ``frames``: uint8 ``[T, H, W, 3]`` (``rgb``) or float32 ``[T, H, W]`` (``signed`` / ``gate``).
    ``limit``: the colour range of a float map, the same for every frame (so scrubbing frames
    does not rescale the colours). ``given``: per frame, True where the frame is given to the
    model rather than predicted (the backbone's loss mask is 0 there), when that is known.
    ``note``: what else a reader must know about the picture (carried to each :class:`Panel`).
    """

    view: str
    title: str
    kind: Kind
    frames: np.ndarray
    label: str = ""
    limit: float = 1.0
    given: tuple[bool, ...] = ()
    caption: str = ""
    start: int = 0
    total: int | None = None
    note: str = ""

    def __len__(self) -> int:
        """Frames of the whole video (``frames`` may hold only some of them: ``start`` onwards)."""
        return int(self.frames.shape[0]) if self.total is None else self.total

    @property
    def partial(self) -> bool:
        """True when ``frames`` holds only frames ``start ..`` of the video (a view of one frame)."""
        return self.total is not None and self.total != self.frames.shape[0]

    def frame(self, i: int, limit: float | None = None) -> Panel:
        """Frame ``i`` as a :class:`Panel` (``limit`` overrides the colour range, e.g. to share it)."""
        if not 0 <= i < len(self):
            raise StepError(f"frame={i} is out of range: "
                            f"this view has {len(self)} frames (0..{len(self) - 1}).")
        if not 0 <= i - self.start < self.frames.shape[0]:
            raise StepError(f"frame={i} was not rendered: this picture holds frames {self.start}.."
                            f"{self.start + self.frames.shape[0] - 1} of {len(self)}; "
                            f"render the view with frame={i}.")
        return Panel(self.title, self.kind, self.frames[i - self.start], self.label,
                     self.limit if limit is None else limit, self.note)

    def frame_name(self, i: int) -> str:
        """``"frame 3"``, or ``"frame 0 (given)"`` for a frame the model is given."""
        return f"frame {i}" + (" (given)" if i < len(self.given) and self.given[i] else "")

    def colored(self, limit: float | None = None) -> np.ndarray:
        """uint8 ``[T, H, W, 3]``: every frame held, as drawn."""
        if self.kind == "rgb":
            return self.frames
        return np.stack([self.frame(self.start + i, limit).colored() for i in range(self.frames.shape[0])])


def signed_limit(values: np.ndarray) -> float:
    """The symmetric colour range of a signed map: its largest magnitude (1 for an all-zero map)."""
    peak = float(np.abs(values).max()) if values.size else 0.0
    return peak if peak > 0 else 1.0


def shared_limit(images) -> float:
    """The colour range several float maps share: the largest of their own ranges, leaving out maps
    that are zero everywhere (a difference that is identically zero, e.g. the base-alone branch in
    "adapter − base", says nothing about the scale and would otherwise force ±1); 1 when all are."""
    limits = [im.limit for im in images if im.kind != "rgb" and np.any(im.frames)]
    return max(limits) if limits else 1.0


__all__ = ["Kind", "Panel", "ViewImage", "shared_limit", "signed_limit"]
