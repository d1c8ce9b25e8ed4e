"""Recording overhead: ``record(model, batch)`` vs a plain ``model.generate`` (target <= 1.05)."""

from __future__ import annotations

import sys

import torch
from _bench import STEPS, finish, interleaved, judge, median, ratio, setup, start

from workbench.inspect import StoragePolicy, record


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    model, batch = setup()
    light = StoragePolicy(dtype=torch.float16, every=4)
    t = interleaved({
        "generate": lambda: model.generate(batch, steps=STEPS, generator=torch.Generator().manual_seed(0)),
        "record": lambda: record(model, batch, steps=STEPS, seed=0),
        "record_light": lambda: record(model, batch, steps=STEPS, seed=0, storage=light),
    }, repeats=21)
    print(f"generate {median(t['generate']) * 1e3:.1f} ms, record {median(t['record']) * 1e3:.1f} ms "
          f"({STEPS} steps, CPU time)")
    judge("record / generate", ratio(t, "record", "generate"), 1.05)
    print(f"record(float16, every 4th step) / generate = {ratio(t, 'record_light', 'generate'):.3f}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
