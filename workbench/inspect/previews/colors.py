"""Colour maps for signed and [0, 1] maps, as 256-entry RGB lookup tables (numpy only).

The widgets draw with the same tables (as matplotlib colour maps), so an exported video and
the picture on screen agree. ``diverging``: blue (negative) through white (zero) to red
(positive), for differences. ``sequential``: dark violet (0) through orange to pale yellow
(the top of the range), for gates and masks.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import InspectError

_ANCHORS = {
    "diverging": [(0.0, (0.13, 0.27, 0.60)), (0.25, (0.45, 0.66, 0.86)), (0.5, (0.97, 0.97, 0.97)),
                  (0.75, (0.94, 0.56, 0.45)), (1.0, (0.66, 0.09, 0.15))],
    "sequential": [(0.0, (0.08, 0.04, 0.20)), (0.35, (0.50, 0.12, 0.48)), (0.7, (0.93, 0.42, 0.22)),
                   (1.0, (0.99, 0.95, 0.65))],
}
CMAPS = tuple(_ANCHORS)


def lut(name: str) -> np.ndarray:
    """The ``(256, 3)`` float table in [0, 1] of colour map ``name`` (``diverging`` or ``sequential``)."""
    if name not in _ANCHORS:
        raise InspectError(f"Unknown colour map {name!r}; allowed: {', '.join(map(repr, CMAPS))}.")
    anchors = _ANCHORS[name]
    x = np.linspace(0.0, 1.0, 256)
    points = np.array([a for a, _ in anchors])
    colours = np.array([c for _, c in anchors])
    return np.stack([np.interp(x, points, colours[:, k]) for k in range(3)], axis=1)


def colorize(values: np.ndarray, cmap: str, vmin: float, vmax: float) -> np.ndarray:
    """Map a float array ``[...]`` onto uint8 RGB ``[..., 3]`` with ``cmap`` over ``[vmin, vmax]``
    (clipped)."""
    if not vmax > vmin:
        raise InspectError(f"colorize needs vmax > vmin, got vmin={vmin!r}, vmax={vmax!r}.")
    table = np.round(lut(cmap) * 255).astype(np.uint8)
    scaled = (np.asarray(values, dtype=np.float64) - vmin) / (vmax - vmin)
    index = np.clip(np.nan_to_num(scaled, nan=0.5) * 255 + 0.5, 0, 255).astype(np.intp)
    return table[index]


__all__ = ["CMAPS", "colorize", "lut"]
