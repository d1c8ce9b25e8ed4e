"""Seeds derived from a seed: pure functions of their inputs, no torch, no state.

A rollout (:func:`workbench.inspect.rollout`) samples chunk ``k`` with :func:`chunk_seed`
``(seed, k)``: chunk 0 uses ``seed`` itself (a one-chunk rollout draws exactly what
``record(model, raw, seed=seed)`` draws), and every later chunk its own well-mixed seed, so a
fork that re-rolls chunks from ``k`` on draws the same noise the original rollout drew for them.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed of chunk ``chunk`` of a rollout seeded ``seed``: ``seed`` for chunk 0, otherwise a
    splitmix64 mix of both, in ``0 .. 2**63 - 1`` (what ``torch.Generator.manual_seed`` takes).

    Examples:
        >>> chunk_seed(7, 0)
        7
        >>> chunk_seed(7, 1) == chunk_seed(7, 1) != chunk_seed(8, 1)
        True
    """
    for name, value in (("seed", seed), ("chunk", chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"chunk_seed: {name} must be an int >= 0, got {value!r}.")
    if chunk == 0:
        return seed
    return _splitmix64((_splitmix64(seed & _MASK64) ^ (chunk * 0xD1B54A32D192ED03)) & _MASK64) >> 1


__all__ = ["chunk_seed"]
