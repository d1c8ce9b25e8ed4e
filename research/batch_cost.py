"""CPU cost of the fixed micro-batch layout: one sampling step's network calls (the frozen denoiser and the
adapter, composed, gate x2) for a batch of 24 clips of 16 frames, made at once or in micro-batches.

    OMP_NUM_THREADS=1 python research/batch_cost.py

Prints the median CPU seconds of ``repeats`` interleaved rounds per layout, and the ratio to one call.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import batch_invariance as bi  # noqa: E402
import torch  # noqa: E402


def main(repeats: int = 5, batch: int = 24) -> None:
    torch.set_num_threads(1)
    from workbench.core.composers import scaled_gate
    from workbench.train import AdapterExperiment
    from workbench.worldmodel.demo import TRAINED_ADAPTER
    from workbench.worldmodel.rollout_eval import long_episodes

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    model = exp.model.eval()
    items = long_episodes("long", frames=16)
    items = (items * 2)[:batch]
    raw = {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in ("video", "action", "ee_pos", "camera")}
    b = model.base.prepare_batch(raw)
    x = torch.randn(b.latents.shape, generator=torch.Generator().manual_seed(0))
    t = torch.full((batch,), 0.7)
    gate = scaled_gate(model.composer, 2.0)
    layouts = {"one call": None, "micro 8": 8, "micro 4": 4, "micro 2": 2, "micro 1": 1}
    seconds = {k: [] for k in layouts}
    with torch.no_grad(), model.composer.override_gate(gate):
        for _ in range(repeats):
            for name, micro in layouts.items():
                began = time.process_time()
                if micro is None:
                    model.compose_step(x, t, b)
                else:
                    with bi.invariant(model, list(range(batch)), micro=micro):
                        model.compose_step(x, t, b)
                seconds[name].append(time.process_time() - began)
    one = sorted(seconds["one call"])[repeats // 2]
    for name, s in seconds.items():
        med = sorted(s)[repeats // 2]
        print(f"{name:9} {med:.3f} s per step of {batch} clips  ({med / one:.2f}x)")


if __name__ == "__main__":
    main()
