"""Shared setup for the inspection benchmarks (imported by them; running it does nothing).

A realistic small tiny_video (32x32, 8 frames, width 32, 20 Euler steps) with a nonzero
``latent_residual`` adapter behind an open gate, on one CPU thread. Timings are interleaved
(every variant once per round) and reported as medians; nothing asserts on time.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from workbench import ComposedModel, GatedResidual  # noqa: E402
from workbench.adapters.latent_residual import LatentResidual  # noqa: E402
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig  # noqa: E402

STEPS = 20


def setup(device: str = "cpu", objective: str = "flow_matching"):
    """``(model, batch)`` for the benchmarks."""
    torch.manual_seed(0)
    base = TinyVideo(TinyVideoConfig(image_size=32, frames=8, width=32, depth=2, sampling_steps=STEPS,
                                     objective=objective))
    adapter = LatentResidual(width=32, depth=2)
    with torch.no_grad():
        for p in adapter.out.parameters():
            p.normal_(0, 0.1)
    model = ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective()).to(device)
    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(2, 3, 8, 32, 32, generator=g) * 2 - 1, "action": torch.rand(2, 8, 4, generator=g)}
    return model, base.prepare_batch(raw)


def interleaved(variants: dict[str, Callable[[], object]], repeats: int = 9, warmup: int = 1) -> dict[str, list[float]]:
    """CPU seconds of each variant in each of ``repeats`` interleaved rounds (every variant once per round).

    CPU time of this (single-threaded) process rather than wall time: on a shared machine the
    wall clock also counts other people's work, which swamps a few-percent difference.
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(warmup + repeats):
        for name, fn in variants.items():
            start = time.process_time()
            fn()
            if round_ >= warmup:
                times[name].append(time.process_time() - start)
    return times


def median(times: list[float]) -> float:
    return statistics.median(times)


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a / b`` timed in the same round (robust to load drifting between rounds)."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


if __name__ == "__main__":
    print("helpers for the other benchmarks; nothing to measure here")
