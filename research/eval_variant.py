"""Evaluate one trained variant the ways the ablation reports: the 144-frame rollouts and the two
single-window evaluations, in one process (so the adapter types of :mod:`context_sources` resolve).

    OMP_NUM_THREADS=1 python research/eval_variant.py NAME [--state probe] [--context-level 0.1] [--only rollout]

For ``outputs/r40/NAME/run`` (or ``--run DIR``):

* ``rollout``: what ``workbench eval RUN --rollout --steps 8 --gate-scale 2 --variants adapter`` computes
  (:func:`workbench.worldmodel.rollout_eval.evaluate_rollouts` on the 12 shipped 144-frame episodes, seed 0),
  with the state a chunk is given read by ``--state``: ``probe`` (the shipped hand probe on the produced
  frame, the default and the world model's), ``recorded`` (the ceiling) or ``reckoned`` (dead reckoning:
  the hand's path integrated from frame 0's recorded position through every action so far, the target
  clipped to Meta-World's mocap box; reads nothing recorded after frame 0, see :func:`reckoned_reader`);
* ``sample``: ``workbench eval RUN --data sample --clips 36 --gate-scale 2``;
* ``unseen``: ``workbench eval RUN --data unseen --split all --stride 48 --gate-scale 2``;

with every context corrupted to ``--context-level`` at sampling (default 0: as recorded/produced).
``--episodes N --frames F --steps S`` shrink the rollouts (a smoke test: the test suite runs one).
Writes ``eval[_level].json`` under ``outputs/r40/NAME`` with the numbers the table takes and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_sources as cs  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path("outputs/r40")
#: Meta-World's mocap box (``hand_low`` / ``hand_high`` of the v3 tasks), z raised to the table's top, where
#: the hand stops whatever its target does.
MOCAP_LOW, MOCAP_HIGH = (-0.525, 0.348, 0.05), (0.525, 1.025, 0.7)


def reckoned_path(actions, start, *, scale=0.02, response=0.25):
    """Dead reckoning: the hand ``[E, F, 3]`` from its position at frame 0 ``[E, 3]`` through the actions
    ``[E, F, A]``, the commanded target clipped to the mocap box, the hand lagging it (``response``)."""
    import torch

    a = torch.as_tensor(np.asarray(actions), dtype=torch.float32).clamp(-1, 1)
    lo, hi = torch.tensor(MOCAP_LOW), torch.tensor(MOCAP_HIGH)
    target = hand = torch.as_tensor(np.asarray(start), dtype=torch.float32)
    points = [hand]
    for t in range(1, a.shape[1]):
        target = torch.minimum(torch.maximum(target + scale * a[:, t - 1, :3], lo), hi)
        hand = hand + response * (target - hand)
        points.append(hand)
    return torch.stack(points, 1).numpy()


def reckoned_reader(items, stride: int = 15):
    """A state reader factory for :func:`~workbench.inspect.rollout` over ``items`` rolled out as one batch:
    the i-th read of a rollout (chunk ``i + 1``, starting at frame ``(i + 1) * stride``) returns the dead-
    reckoned hand there. It ignores the frames: it reads only frame 0's state and the actions."""
    path = reckoned_path(np.stack([np.asarray(it["action"]) for it in items]),
                         np.stack([np.asarray(it["ee_pos"])[0] for it in items]))

    def factory():
        calls = iter(range(1, 10**6))

        def read(frames):
            return path[:, next(calls) * stride]

        return read

    return factory


def teacher_forced_videos(model, items, actions, *, adapter, steps, seed, state, gate_scale, batch,
                          on_batch=None, stride: int = 15):
    """What :func:`~workbench.worldmodel.rollout_eval.rollout_videos` returns, but each chunk predicted from
    the **recorded** frame it starts at (and the recorded state there), with the noise the rollout's chunk
    draws (seed ``chunk_seed(seed, k)``): teacher forcing, the curve without exposure bias."""
    import torch

    from workbench.core.seeds import chunk_seed
    from workbench.inspect import rollout
    from workbench.metrics import to_uint8_video

    video = torch.stack([it["video"] for it in items])                     # (E, 3, F, H, W)
    ee = torch.stack([torch.as_tensor(it["ee_pos"]) for it in items])
    acts = torch.stack(actions)
    cam = torch.stack([torch.as_tensor(it["camera"]) for it in items])
    frames = video.shape[2]
    out = to_uint8_video(video).copy()
    chunks = []
    for k, s in enumerate(range(0, frames - 1, stride)):
        hi = min(s + stride + 1, frames)
        start = {"video": video[:, :, s:s + 1], "ee_pos": ee[:, s:s + 1], "camera": cam}
        ro = rollout(model, start, acts[:, s:hi], steps=steps, seed=chunk_seed(seed, k), state=state,
                     gate_scale=gate_scale if adapter else None, adapter="on" if adapter else "off", store=False)
        out[:, s + 1:hi] = ro.video[:, 1:]
        chunks.append(range(s + 1, hi))
    if on_batch is not None:
        on_batch(len(items))
    return out, chunks


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("--run")
    p.add_argument("--context-level", type=float, default=0.0)
    p.add_argument("--state", default="probe", choices=("probe", "recorded", "reckoned"))
    p.add_argument("--only", choices=("rollout", "sample", "unseen"), action="append")
    p.add_argument("--variants", default="adapter")
    p.add_argument("--episodes", type=int, default=None, help="rollout: this many episodes (default: all 12)")
    p.add_argument("--frames", type=int, default=None, help="rollout: each episode's first frames (default: 144)")
    p.add_argument("--steps", type=int, default=8, help="rollout: sampling steps per chunk")
    p.add_argument("--teacher-forced", action="store_true",
                   help="every chunk from its recorded first frame and state (no exposure bias)")
    args = p.parse_args(argv)
    import torch

    from workbench.cli import main as cli
    from workbench.train import AdapterExperiment
    from workbench.worldmodel import rollouts  # noqa: F401  (registers state="probe")
    from workbench.worldmodel.rollout_eval import evaluate_rollouts, long_episodes, summarise_rollouts

    torch.set_num_threads(1)
    cs.sample_with_context_level(args.context_level)
    cs.rollouts_declare_produced()  # (read only by an adapter trained with source_flag)
    run = args.run or str(ROOT / args.name / "run")
    tag = f"_{args.context_level:g}" if args.context_level > 0 else ""
    out = ROOT / args.name / f"eval{tag}"
    path = ROOT / args.name / f"eval{tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record: dict = json.loads(path.read_text()) if path.exists() else {}
    record.update(name=args.name, run=run, context_level=args.context_level)
    parts = {"sample": ["--data", "sample", "--clips", "36", "--gate-scale", "2"],
             "unseen": ["--data", "unseen", "--split", "all", "--stride", "48", "--gate-scale", "2"]}
    for part in ("rollout", "sample", "unseen"):
        if args.only and part not in args.only:
            continue
        cpu = time.process_time()
        if part == "rollout":
            exp = AdapterExperiment.load(run)
            items = long_episodes("long", size=exp.model.base.clip().size, episodes=args.episodes,
                                  frames=args.frames)
            if args.state == "reckoned":
                from workbench.inspect.recording.rollouts import register_state_reader

                register_state_reader("reckoned", reckoned_reader(items))
            variants = tuple(args.variants.split(","))
            if args.teacher_forced:
                import workbench.worldmodel.rollout_eval as rollout_eval

                rollout_eval.rollout_videos = teacher_forced_videos
            result = evaluate_rollouts(exp, items, steps=args.steps, seed=0, state=args.state, gate_scale=2.0,
                                       progress=False, variants=variants)
            rows = summarise_rollouts(result)["chunks"]
            key = "rollout" if args.state == "probe" else f"rollout_{args.state}"
            key = "teacher_forced" if args.teacher_forced else key
            for v in variants:
                record[f"{key}_{v}_hand_cm"] = [round(r[f"{v}_hand_error_cm"], 2) for r in rows]
                record[f"{key}_{v}_moving_psnr"] = [round(r[f"{v}_moving_psnr"], 2) for r in rows]
                record[f"{key}_{v}_hand_cm_per_episode"] = np.round(result["per_chunk"][v]["hand_error_cm"],
                                                                    2).tolist()
            record["tasks"] = [it["task"] for it in result["items"]]
            record["probe_floor_cm"] = [round(r["probe_floor_cm"], 2) for r in rows]
            record[f"{key}_cpu_s"] = round(time.process_time() - cpu, 1)
        else:
            rc = cli(["eval", run, *parts[part], "--no-progress", "--out", str(out / part)])
            if rc:
                return rc
            s = json.loads((out / part / "metrics.json").read_text())["summary"]
            record[part] = {"gain_db": round(s["adapter_minus_base_moving_psnr_db"], 3),
                            "beats_swapped": round(s["adapter_beats_swapped_fraction"], 3),
                            "action_error_cm": round(s["mean"]["adapter"]["action_error"], 3),
                            "base_action_error_cm": round(s["mean"]["base"]["action_error"], 3)}
            record[f"{part}_cpu_s"] = round(time.process_time() - cpu, 1)
        path.write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
