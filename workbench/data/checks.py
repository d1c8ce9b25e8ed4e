"""Checks of the numbers a dataset serves, before any of them reaches a kernel.

A NaN, an infinity or an absurdly large value (1e30 is a common placeholder for a missing reading) in
an action or a state turns every loss it touches into NaN, and in a coordinate that a kernel samples
with (``grid_sample``) it reads memory it must not. Readers and writers call :func:`check_finite` on
what they read, so the error names the file, the episode and the frame instead.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import DataError

#: A recorded action or state is refused beyond this magnitude: a value of 1e30 is a placeholder or a
#: damaged number, never a measurement, and squared in a loss it is infinite.
MAX_ABS = 1e6


def check_finite(values: np.ndarray, where: str, what: str, *, rows: str = "frame", limit: float = MAX_ABS,
                 fix: str | None = None, first: int = 0) -> None:
    """Raise a DataError naming ``where``, the row (``frame``, counted from ``first``) and column of the
    first value that is NaN, infinite, or larger in magnitude than ``limit``; ``what`` names the values
    (e.g. ``"actions"``), ``fix`` says what to do (default: fix the source file)."""
    array = np.asarray(values)
    if array.size == 0 or array.dtype.kind not in "fc":
        return
    flat = array.reshape(len(array), -1) if array.ndim > 1 else array.reshape(-1, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isfinite(flat) | (np.abs(flat) > limit)
    if not bad.any():
        return
    row, col = (int(v) for v in np.argwhere(bad)[0])
    value = float(flat[row, col])
    count = int(bad.sum())
    kind = "NaN" if np.isnan(value) else ("infinite" if np.isinf(value)
                                          else f"{value:.3g}, beyond ±{limit:g}")
    column = f", column {col}" if flat.shape[1] > 1 else ""
    fix = fix or f"Fix or drop that {rows} (or the episode) in the source file, then run this again."
    raise DataError(f"{where}: {what} at {rows} {first + row}{column} is {kind} "
                    f"({count} such value(s) in all). "
                    f"A NaN, an infinity or a value that large is a gap or damage in the recording, not a "
                    f"measurement, and would turn every loss it touches into NaN. {fix}")


__all__ = ["MAX_ABS", "check_finite"]
