"""Writing branches side by side as one video: one row per step, one column per branch.

:meth:`Trajectory.export` (decoded frames of one field) and :meth:`StepperState.export` (one
view, float maps coloured on a shared range) both end here: the same default steps, the same
labels, the same grid and frame rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.inspect.common import InspectError

DEFAULT_ROWS = 4


def default_steps(branches: Sequence[Any], rows: int = DEFAULT_ROWS) -> list[int]:
    """Up to ``rows`` steps that every branch stored, spread evenly from the first to the last."""
    common = sorted(set.intersection(*(set(b.stored) for b in branches)))
    if len(common) <= rows:
        return common
    return list(dict.fromkeys(common[round(i * (len(common) - 1) / (rows - 1))] for i in range(rows)))


def step_label(trajectory: Any, step: int | str) -> str:
    """A row label: ``"final"``, or the step and its noise level (``"step 5\\nnoise 0.62"``)."""
    if step == "final":
        return "final"
    k = int(step) % len(trajectory)
    return f"step {k}\nnoise {float(trajectory.noise_levels[k]):.2f}"


def write_grid(path: str | Path, branches: Sequence[Any], steps: Sequence[int | str],
               rows: Sequence[Sequence[np.ndarray]], fps: float | None = None, scale: int = 1) -> Path:
    """Write ``rows`` (per step, per branch: uint8 frames ``[T, H, W, 3]``) as an MP4 / GIF grid.

    Rows are labelled by step (and noise level, read off ``branches[0]``), columns by branch
    label; ``fps`` defaults to the card's, else 10.
    """
    from workbench.media import label_grid, write_video

    if not steps:
        raise InspectError("export has no steps to show: the branches share no stored step "
                           "and the run is not complete.")
    first = branches[0]
    grid = label_grid(rows, row_labels=[step_label(first, s) for s in steps],
                      col_labels=[b.label for b in branches], scale=scale)
    return write_video(path, grid, fps=fps or first.model.base.card.sampling.fps or 10)


__all__ = ["DEFAULT_ROWS", "default_steps", "step_label", "write_grid"]
