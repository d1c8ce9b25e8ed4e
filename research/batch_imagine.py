"""Do ``imagine()``'s final frames and distances depend on the batch size? And with the prototype?

    OMP_NUM_THREADS=1 python research/batch_imagine.py [--starts 1] [--batches 12,5,1] [--micro 1]

Replays the shipped policy episodes of the first ``--starts`` start states (12 episodes per start: two
tasks, six policies) with the shipped adapter (8 steps, gate x2, seed 0), once per batch size with the
library's ``imagine()`` and once with :func:`batch_invariance.imagine_invariant`, and reports, against
the first batch size: the largest grey-level difference of the final frames, how many episodes differ,
the largest distance difference, and each run's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import batch_invariance as bi  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--starts", type=int, default=1)
    p.add_argument("--batches", default="12,5,1")
    p.add_argument("--micro", default="1")
    p.add_argument("--skip-plain", action="store_true")
    p.add_argument("--out", default="outputs/r40/batch_imagine.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from workbench.train import AdapterExperiment
    from workbench.worldmodel.demo import TRAINED_ADAPTER
    from workbench.worldmodel.policies import imagine, load_policies

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    episodes = load_policies().select(starts=args.starts)
    batches = [int(b) for b in args.batches.split(",")]
    report = {"episodes": len(episodes), "torch": torch.__version__,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "runs": {}}

    def run(label, fn):
        got = {b: fn(b) for b in batches}
        ref = got[batches[0]]
        rows = {}
        for b, g in got.items():
            d = np.abs(g["final_frames"].astype(int) - ref["final_frames"].astype(int))
            rows[b] = {"max_grey_diff": int(d.max()),
                       "episodes_differing": int((d.reshape(len(d), -1).max(1) > 0).sum()),
                       "max_distance_diff_cm": float(np.abs(g["distance"] - ref["distance"]).max() * 100),
                       "cpu_s": round(g["cpu_seconds"], 1)}
            print(f"{label:28} batch {b:3}: {rows[b]}", flush=True)
        report["runs"][label] = rows

    if not args.skip_plain:
        run("imagine()", lambda b: imagine(exp, episodes, steps=8, seed=0, gate_scale=2.0, batch=b))
    for m in [int(x) for x in args.micro.split(",")]:
        run(f"invariant, micro {m}", lambda b, m=m: bi.imagine_invariant(exp.model, episodes, steps=8, seed=0,
                                                                         gate_scale=2.0, batch=b, micro=m))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
