"""Shared set-up for the ratio benchmarks: one thread, a realistic small tiny_video, interleaved timing."""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

BENCH_BASE = dict(image_size=32, frames=8, width=32, ae_width=16, depth=2, sampling_steps=10)


def interleaved(fns: dict, repeats: int = 15, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternation (A B A B ...)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in times.items()}


def report(title: str, medians: dict[str, float], ratio_of: tuple[str, str], target: float | None = None) -> float:
    a, b = ratio_of
    ratio = medians[a] / medians[b]
    print(title)
    for name, value in medians.items():
        print(f"  {name:<28} {value * 1e3:9.2f} ms")
    goal = f" (target <= {target:.2f})" if target is not None else ""
    print(f"  ratio {a} / {b} = {ratio:.3f}{goal}")
    return ratio
