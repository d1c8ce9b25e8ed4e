"""Per-sample computations in fixed micro-batches: the same values for a sample in any batch.

On a CPU (and on most accelerators) a convolution or a matrix product picks its kernel, and so its
order of summation, from the shapes it is given, the batch size included: the same sample comes out
different in its last bits in a batch of 1, 5 or 24, and a sampler's steps grow those bits into
visible differences. :func:`in_micro_batches` runs a per-sample function on micro-batches of exactly
``size`` rows (the last one padded with copies of its last row, whose outputs are dropped), so every
call has one shape whatever the batch, and a sample's values depend on its own inputs only (where the
kernels treat the rows of one shape alike, which ``size=1`` makes true of every kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (torch is imported where it is used: the world-model wing reads the default without it)
    import torch

#: Samples per network call where results must not depend on the batch (a rollout's and the policy
#: evaluation's ``micro_batch``). Four keeps most of the speed of one large call on a CPU (0.9-1.2x its time
#: per sampling step of 24 episodes, where one sample per call costs 1.8-2.4x) and gives the embedded model's
#: rollouts the same frames in batches of 1, 5 and 12; 1 makes it true of any kernel library.
DEFAULT_MICRO_BATCH = 4


def micro_batches(n: int, size: int) -> list[tuple[torch.Tensor, int]]:
    """The row indices of the micro-batches of ``size`` rows that cover ``n`` rows, each with how many of
    its rows are real (the last is padded with copies of its last row).

    Examples:
        >>> [(idx.tolist(), real) for idx, real in micro_batches(5, 2)]
        [([0, 1], 2), ([2, 3], 2), ([4, 4], 1)]
    """
    import torch

    out = []
    for lo in range(0, n, size):
        real = min(size, n - lo)
        index = torch.arange(lo, lo + real)
        if real < size:
            index = torch.cat([index, index[-1:].expand(size - real)])
        out.append((index, real))
    return out


def take_rows(value: Any, index: torch.Tensor, n: int) -> Any:
    """Rows ``index`` of ``value`` when it has a batch axis of ``n`` rows (a tensor or array whose first
    axis is ``n``; a ``Batch`` or ``Conditioning``, through their ``select``; a dict, value by value);
    anything else unchanged."""
    import torch

    from workbench.core.conditions import Batch, Conditioning

    if isinstance(value, Batch):
        return value.select(index)
    if isinstance(value, Conditioning):
        return value.select(index, n)
    if isinstance(value, dict):
        return {k: take_rows(v, index, n) for k, v in value.items()}
    if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == n:
        return value[index.to(value.device)]
    if type(value).__name__ == "ndarray" and value.ndim > 0 and value.shape[0] == n:  # (a numpy array)
        return value[index.numpy()]
    return value


def check_micro_batch(size: Any, who: str, error: type[Exception] | None = None) -> int | None:
    """``size`` as a micro-batch size (an int >= 1, or None for one call over the whole batch), or raise
    ``error`` (default :class:`~workbench.errors.ConfigError`) saying what is allowed."""
    from workbench.errors import ConfigError

    error = ConfigError if error is None else error
    if size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
        return size
    raise error(f"{who}: micro_batch={size!r} is not allowed: it takes an int >= 1 (the rows of every "
                      f"network call; the same frames for any batch size) or None (the whole batch in one "
                      f"call: faster, but a sample's last bits then depend on the batch it is in).")


def in_micro_batches(fn: Callable[..., Any], size: int | None, n: int, *args: Any) -> Any:
    """``fn(*args)`` for ``args`` whose batch axis holds ``n`` rows, computed in micro-batches of ``size``
    rows (see the module docstring) and joined along the batch axis; one call when ``size`` is None or
    ``n == size``. ``fn`` returns a tensor (or an array) with one row per input row.

    Examples:
        >>> x = torch.arange(5.0)[:, None]
        >>> sizes = []
        >>> out = in_micro_batches(lambda v: sizes.append(len(v)) or v * 2, 2, 5, x)
        >>> out.flatten().tolist(), sizes
        ([0.0, 2.0, 4.0, 6.0, 8.0], [2, 2, 2])
    """
    if size is None or n == size:
        return fn(*args)
    import torch

    parts = [fn(*(take_rows(a, index, n) for a in args))[:real] for index, real in micro_batches(n, size)]
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    import numpy as np

    return np.concatenate(parts)


__all__ = ["DEFAULT_MICRO_BATCH", "check_micro_batch", "in_micro_batches", "micro_batches", "take_rows"]
