"""Fork cost: ``traj.fork(at=k)`` of an N-step run vs the full run (target <= (N - k) / N + 0.05)."""

from __future__ import annotations

import sys

import torch
from _bench import STEPS, finish, interleaved, judge, median, ratio, setup, start

from workbench.inspect import record


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    model, batch = setup()
    traj = record(model, batch, steps=STEPS, seed=0)
    pushed = {"action": torch.full_like(batch.cond["action"], 0.9)}
    variants = {"full": lambda: record(model, batch, steps=STEPS, seed=0)}
    for k in (5, 10, 15):
        variants[f"fork@{k}"] = lambda k=k: traj.fork(at=k, cond=pushed)
    t = interleaved(variants, repeats=15)
    print(f"full run {median(t['full']) * 1e3:.1f} ms ({STEPS} steps, CPU time)")
    for k in (5, 10, 15):
        judge(f"fork at {k:2d} / full", ratio(t, f"fork@{k}", "full"), (STEPS - k) / STEPS + 0.05)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
