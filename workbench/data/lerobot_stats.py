"""Feature statistics as LeRobot keeps them: per episode in ``meta/episodes``, over the dataset in
``meta/stats.json``.

LeRobot (v3.0 layout; the rules below are those of lerobot 0.6.1) records for every numeric feature and
every camera ``min``, ``max``, ``mean``, ``std``, ``count`` and the quantiles ``q01``, ``q10``, ``q50``,
``q90``, ``q99``; its quantile normalisation (the default of several of its policies) needs ``q01`` and
``q99``. The rules:

* **Per episode, a numeric feature** ``(T, D)``: each statistic per column over the episode's ``T`` rows
  (``count`` = ``[T]``). A quantile is read off a histogram of 5000 equal bins spanning the column's
  range: the value below which ``q * T`` of the rows fall, interpolated linearly inside its bin.
  An episode of one row has every quantile equal to its mean.
* **Per episode, a camera**: its frames sampled evenly (every frame of an episode of up to 100 frames,
  then about ``T ** 0.75``, at most 10000), frames of 300 pixels or more a side thinned to about 150
  (every k-th row and column), the statistics per colour channel over every sampled pixel, divided by
  255, each of shape ``(3, 1, 1)`` (``count`` = ``[frames sampled]``).
* **Over the dataset** (``meta/stats.json``): ``min`` of the minima, ``max`` of the maxima, ``mean``
  the count-weighted mean of the means, ``std`` from the pooled variance, ``count`` the sum, and each
  quantile the count-weighted mean of the episodes' quantiles.

``meta/episodes`` holds one list column per feature and statistic, ``stats/{feature}/{statistic}``
(doubles; ``count`` integers; a camera's nested ``(3, 1, 1)``).
"""

from __future__ import annotations

import numpy as np

#: The quantiles LeRobot records, and their names in the statistics.
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{round(q * 100):02d}" for q in QUANTILES)
#: Every statistic of a feature, in the order LeRobot writes them.
STATISTICS = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)
#: Bins of the histogram a quantile is read from.
BINS = 5000


def histogram_quantiles(column: np.ndarray, quantiles=QUANTILES, bins: int = BINS,
                        counts: np.ndarray | None = None) -> np.ndarray:
    """The ``quantiles`` of the values ``column`` (1-D) read off a ``bins``-bin histogram of their range,
    interpolated linearly inside the bin where the cumulative count reaches ``q * len(column)``.
    ``counts``: how many times each value of ``column`` occurs (default: once)."""
    low, high = column.min(), column.max()
    edges = np.linspace(low - 1e-10, high + 1e-10, bins + 1)
    cumulative = np.cumsum(np.histogram(column, bins=edges, weights=counts)[0])
    total = len(column) if counts is None else counts.sum()
    out = []
    for q in quantiles:
        target = q * total
        k = int(np.searchsorted(cumulative, target))
        if k == 0:
            out.append(edges[0])
        elif k >= bins:
            out.append(edges[-1])
        else:
            before, inside = cumulative[k - 1], cumulative[k] - cumulative[k - 1]
            step = edges[k + 1] - edges[k]
            out.append(edges[k] if inside == 0 else edges[k] + (target - before) / inside * step)
    return np.asarray(out, np.float64)


def vector_stats(values: np.ndarray, count: int | None = None) -> dict[str, np.ndarray]:
    """The statistics of ``values`` ``(N, D)`` per column (each ``(D,)``; ``count`` ``[count or N]``)."""
    # float32 data is summarised in float32 and integers in float64, as LeRobot does
    values = values.astype(np.result_type(values.dtype, np.float32), copy=False)
    n = len(values)
    mean = values.mean(axis=0)
    out = {"min": values.min(axis=0), "max": values.max(axis=0), "mean": mean}
    if n < 2:
        out["std"] = values.std(axis=0)
        quantiles = np.repeat(mean[None], len(QUANTILES), axis=0)
    else:
        out["std"] = np.sqrt(np.maximum(0.0, (values**2).mean(axis=0) - mean**2))
        quantiles = np.stack([histogram_quantiles(values[:, d]) for d in range(values.shape[1])], axis=1)
    out["count"] = np.array([n if count is None else count])
    out.update({key: quantiles[i] for i, key in enumerate(QUANTILE_KEYS)})
    return {key: out[key] for key in STATISTICS}


def sampled_frames(length: int) -> np.ndarray:
    """Which of an episode's ``length`` frames its camera statistics read: evenly spaced, all of a short
    episode's (up to 100), about ``length ** 0.75`` of a long one's, at most 10000."""
    wanted = max(min(100, length), min(int(length**0.75), 10_000))
    return np.round(np.linspace(0, length - 1, wanted)).astype(np.int64)


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """The statistics of one episode of a camera, uint8 ``frames`` ``(T, H, W, 3)``: per channel over the
    sampled frames' pixels, in [0, 1], each ``(3, 1, 1)`` (``count``: the frames sampled)."""
    picked = frames[sampled_frames(len(frames))]
    height, width = picked.shape[1:3]
    if max(height, width) >= 300:  # large frames are thinned to about 150 pixels a side
        step = int(width / 150) if width > height else int(height / 150)
        picked = picked[:, ::step, ::step]
    channels = []
    for c in range(picked.shape[-1]):  # from the count of each of the 256 levels: the same as every pixel
        counts = np.bincount(picked[..., c].reshape(-1), minlength=256).astype(np.float64)
        levels = np.flatnonzero(counts)
        counts = counts[levels]
        n = counts.sum()
        mean = (levels * counts).sum() / n
        std = np.sqrt(max(0.0, (levels**2 * counts).sum() / n - mean**2))
        channels.append([levels[0], levels[-1], mean, std,
                         *histogram_quantiles(levels.astype(np.float32), counts=counts)])
    table = np.asarray(channels, np.float64).T / 255.0  # (statistics but count, channels)
    keys = [k for k in STATISTICS if k != "count"]
    stats = {key: table[i].reshape(-1, 1, 1) for i, key in enumerate(keys)}
    stats["count"] = np.array([len(picked)])
    return {key: stats[key] for key in STATISTICS}


def aggregate(episodes: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's statistics over several episodes' (each a dict of :data:`STATISTICS`)."""
    counts = np.stack([s["count"] for s in episodes]).astype(np.float64)  # (E, 1)
    total = counts.sum(axis=0)
    means = np.stack([np.asarray(s["mean"], np.float64) for s in episodes])
    weights = counts.reshape(len(episodes), *([1] * (means.ndim - 1)))
    mean = (means * weights).sum(axis=0) / total
    variance = ((np.stack([np.asarray(s["std"], np.float64) for s in episodes]) ** 2 + (means - mean) ** 2)
                * weights).sum(axis=0) / total
    out = {"min": np.min(np.stack([s["min"] for s in episodes]), axis=0),
           "max": np.max(np.stack([s["max"] for s in episodes]), axis=0),
           "mean": mean, "std": np.sqrt(variance), "count": total.astype(np.int64)}
    for key in QUANTILE_KEYS:
        quantiles = np.stack([np.asarray(s[key], np.float64) for s in episodes])
        out[key] = (quantiles * weights).sum(axis=0) / total
    return out


def as_lists(stats: dict[str, np.ndarray]) -> dict[str, list]:
    """Statistics as JSON- and parquet-ready lists (``count`` as integers, the rest as floats)."""
    return {key: np.asarray(value).astype(np.int64 if key == "count" else np.float64).tolist()
            for key, value in stats.items()}


def episode_columns(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, list]:
    """One episode's statistics as the ``meta/episodes`` columns ``stats/{feature}/{statistic}``."""
    return {f"stats/{feature}/{key}": value
            for feature, by_key in stats.items() for key, value in as_lists(by_key).items()}


__all__ = ["BINS", "QUANTILES", "QUANTILE_KEYS", "STATISTICS", "aggregate", "as_lists", "episode_columns",
           "histogram_quantiles", "image_stats", "sampled_frames", "vector_stats"]
