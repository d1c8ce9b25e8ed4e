"""How far from the recorded frame is each kind of self-forwarded context?

    OMP_NUM_THREADS=1 python research/context_fidelity.py [--run DIR] [--windows 48]

For windows of the training episodes that start at frame ``s`` (15 <= s), the context frame ``s`` is made
the ways :mod:`context_sources` makes it (the one-step estimate from pure noise, a 2-, 4- and 8-step sample
from the window that starts at ``s - 15``, gate x2, through pixels) and compared with the recorded frame:
the hand probe's distance to the recorded hand position (cm) and the PSNR. The 8-step sample is what the
rollout's second chunk starts from, so the closer a cheaper kind's numbers are to it, the better it stands in.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_sources as cs  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run", default="workbench/worldmodel/weights/metaworld_action")
    p.add_argument("--windows", type=int, default=48)
    p.add_argument("--out", default="outputs/r40/context_fidelity.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from workbench.train import AdapterExperiment
    from workbench.worldmodel.probe import shipped_probe

    exp = AdapterExperiment.load(args.run)
    data = exp.default_data()
    pairs = [(int(e), int(s)) for e, s in data.index if s >= 15][:: max(1, sum(1 for _, s in data.index if s >= 15)
                                                                         // args.windows)][:args.windows]
    probe = shipped_probe()
    report = {"run": args.run, "windows": len(pairs)}
    kinds = {"x0 (t=1)": dict(self_mode="x0"), "sample 2": dict(self_mode="sample", self_steps=2),
             "sample 4": dict(self_mode="sample", self_steps=4), "sample 8": dict(self_mode="sample", self_steps=8)}
    truth_frames = np.stack([data.read("frames", [e])[0, s] for e, s in pairs])
    truth_ee = np.stack([data.read("ee_pos", [e])[0, s] for e, s in pairs])
    source = cs.ContextSource(cs.ContextConfig(self_prob=1.0), exp.model, data)  # (its episode bank, once)
    for name, options in kinds.items():
        source.config = cs.ContextConfig(self_prob=1.0, **options)
        frames = []
        for lo in range(0, len(pairs), 12):
            part = pairs[lo:lo + 12]
            _, f = source._predict([e for e, _ in part], [s for _, s in part], step=lo)
            frames.append(f)
        frames = np.concatenate(frames)
        hand = np.linalg.norm(probe.positions(frames) - truth_ee, axis=-1) * 100
        mse = ((frames.astype(np.float64) - truth_frames) ** 2).reshape(len(frames), -1).mean(1)
        psnr = 10 * np.log10(255.0**2 / np.maximum(mse, 1e-10))
        report[name] = {"hand_cm": round(float(hand.mean()), 2), "psnr_db": round(float(psnr.mean()), 2)}
        print(f"{name:10} hand {hand.mean():5.2f} cm  PSNR {psnr.mean():5.2f} dB", flush=True)
    floor = np.linalg.norm(probe.positions(truth_frames) - truth_ee, axis=-1) * 100
    report["probe_on_recorded_cm"] = round(float(floor.mean()), 2)
    print(f"probe on the recorded frames: {floor.mean():.2f} cm")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
