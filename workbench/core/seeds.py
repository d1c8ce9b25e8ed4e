"""Seeds derived from a seed: pure functions of their inputs, no torch, no state.

A rollout (:func:`workbench.inspect.rollout`) samples chunk ``k`` with :func:`chunk_seed`
``(seed, k)``: chunk 0 uses ``seed`` itself (a one-chunk rollout draws exactly what
``record(model, raw, seed=seed)`` draws), and every later chunk its own well-mixed seed, so a
fork that re-rolls chunks from ``k`` on draws the same noise the original rollout drew for them.

Each episode of a rollout draws its own noise: the episode numbered ``e`` (its place in the whole set
of episodes, whatever batch or process rolls it out) starts chunk ``k`` from noise drawn with
:func:`noise_seed` ``(seed, e, k)``, so an episode's frames do not depend on the batch it sits in.
Episode 0 uses the rollout's seed itself (:func:`episode_seed`), so a one-episode rollout's chunk 0
draws what ``record(model, raw, seed=seed)`` draws.
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


def episode_seed(seed: int, episode: int) -> int:
    """The seed of episode ``episode`` of a set rolled out with ``seed``: ``seed`` for episode 0, otherwise
    a splitmix64 mix of both (with another constant than :func:`chunk_seed`'s, so episode ``e``'s chunk 0
    and episode 0's chunk ``e`` draw different noise), in ``0 .. 2**63 - 1``.

    Examples:
        >>> episode_seed(7, 0)
        7
        >>> episode_seed(7, 1) != chunk_seed(7, 1)
        True
    """
    for name, value in (("seed", seed), ("episode", episode)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"episode_seed: {name} must be an int >= 0, got {value!r}.")
    if episode == 0:
        return seed
    return _splitmix64((_splitmix64(seed & _MASK64) ^ (episode * 0x8CB92BA72F3D8DD7)) & _MASK64) >> 1


def noise_seed(seed: int, episode: int, chunk: int) -> int:
    """The seed chunk ``chunk`` of episode ``episode`` draws its initial noise with, in a rollout seeded
    ``seed``: ``chunk_seed(episode_seed(seed, episode), chunk)``.

    Examples:
        >>> noise_seed(7, 0, 0), noise_seed(7, 0, 3) == chunk_seed(7, 3)
        (7, True)
    """
    return chunk_seed(episode_seed(seed, episode), chunk)


__all__ = ["chunk_seed", "episode_seed", "noise_seed"]
