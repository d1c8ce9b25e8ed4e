"""Shared set-up for the ratio benchmarks (imported by them; running it does nothing).

One CPU thread; :func:`setup` builds a realistic small tiny_video (32x32, 8 frames, width 32,
20 Euler steps) with a nonzero ``latent_residual`` adapter behind an open gate. Timings are
interleaved (every variant once per round, the order rotated from round to round so that no
variant always runs first) and reported as medians.

Every benchmark takes ``--quick`` (:func:`start`): one round, no warm-up, its own loops cut down,
every line printed and nothing judged — seconds, so the test suite runs each one and a benchmark
cannot rot unnoticed. Without it, :func:`judge` prints each ratio against its target and
:func:`finish` gives the exit status: non-zero, after everything ran and printed, when a target
was missed (``make bench`` runs them all and lists those).
"""

from __future__ import annotations

import argparse
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
BENCH_BASE = dict(image_size=32, frames=8, width=32, ae_width=16, depth=2, sampling_steps=10)


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
    return model, base.prepare_batch(base.example_batch())


QUICK = False
"""``--quick``: one round, no warm-up, reduced loops (:func:`scaled`); ratios printed, not judged."""

RESULTS: list[tuple[str, float, float, bool]] = []
"""What :func:`judge` saw in this run: ``(label, value, target, held)``."""


def start(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """Parse a benchmark's command line: ``--quick`` (see the module docstring), and its own flags (kept in
    ``extra``); resets :data:`RESULTS`."""
    global QUICK
    parser = argparse.ArgumentParser(description=(description or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one round, no warm-up, reduced loops: the benchmark runs (seconds), nothing is judged")
    args, args.extra = parser.parse_known_args(argv)
    QUICK = args.quick
    RESULTS.clear()
    if QUICK:
        print("(quick mode: one round, reduced loops; the ratios below are not measurements)")
    return args


def scaled(full: int, quick: int = 1) -> int:
    """``full`` normally, ``quick`` under ``--quick``."""
    return quick if QUICK else full


def judge(label: str, value: float, target: float, *, at_most: bool = True, fmt: str = ".3f") -> bool:
    """Print ``label = value (target <= t)`` and whether it holds; remembered for :func:`finish`."""
    held = value <= target if at_most else value >= target
    mark = "" if QUICK else ("  ok" if held else "  SHORT of its target")
    print(f"{label} = {value:{fmt}} (target {'<=' if at_most else '>='} {target:.2f}){mark}")
    RESULTS.append((label, value, target, held))
    return held


def finish() -> int:
    """The benchmark's exit status: 0 when every judged ratio held (always under ``--quick``), else 1 after
    listing those that fell short."""
    short = [r for r in RESULTS if not r[3]]
    if QUICK or not short:
        return 0
    print(f"{len(short)} of {len(RESULTS)} targets missed: " + "; ".join(f"{label} = {value:.3f}"
                                                                      for label, value, _, _ in short))
    return 1


def interleaved(variants: dict[str, Callable[[], object]], repeats: int = 9, warmup: int = 1) -> dict[str, list[float]]:
    """CPU seconds of each variant in each of ``repeats`` interleaved rounds (every variant once per round;
    one round and no warm-up under ``--quick``).

    CPU time of this (single-threaded) process rather than wall time: on a shared machine the
    wall clock also counts other people's work, which swamps a few-percent difference. Round
    ``r`` starts with variant ``r mod n``: whatever the first call of a round pays (caches
    evicted by the previous variant) is shared evenly.
    """
    if QUICK:
        repeats, warmup = 1, 0
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.process_time()
            variants[name]()
            if round_ >= warmup:
                times[name].append(time.process_time() - start)
    return times


def median(times: list[float]) -> float:
    return statistics.median(times)


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a / b`` timed in the same round (robust to load drifting between rounds)."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def report(title: str, times: dict[str, list[float]], ratio_of: tuple[str, str], target: float | None = None) -> float:
    """Print each variant's median and the ratio ``a / b`` (median over rounds; against ``target`` through
    :func:`judge` when given); return the ratio."""
    a, b = ratio_of
    value = ratio(times, a, b)
    print(title)
    for name, samples in times.items():
        print(f"  {name:<28} {median(samples) * 1e3:9.2f} ms")
    if target is None:
        print(f"  ratio {a} / {b} = {value:.3f}")
    else:
        judge(f"  ratio {a} / {b}", value, target)
    return value


if __name__ == "__main__":
    print("helpers for the other benchmarks; nothing to measure here")
