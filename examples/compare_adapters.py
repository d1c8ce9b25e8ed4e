"""Which adapter follows the actions? The world-model demo's comparison across adapter kinds.

Each kind is trained and scored exactly as ``workbench demo`` trains and scores its adapter: the
frozen pretrained tiny_video, the shipped Meta-World sample, 900 steps of batch 8 (AdamW 2e-3,
cosine), flow matching with shift 3, then 36 held-out clips predicted from their first frame
with the base's own 20-step sampler — base alone, adapter with the true actions, adapter with
swapped actions — scored on the moving pixels. One kind per call (they are CPU-heavy):

    OMP_NUM_THREADS=1 python examples/compare_adapters.py action_modulation
    OMP_NUM_THREADS=1 python examples/compare_adapters.py controlnet
    OMP_NUM_THREADS=1 python examples/compare_adapters.py latent_residual
    OMP_NUM_THREADS=1 python examples/compare_adapters.py controlnet_edges   # reads edge videos, not actions
    OMP_NUM_THREADS=1 python examples/compare_adapters.py --speed        # CPU seconds per training step
    python examples/compare_adapters.py --table          # the table of docs/results/adapters.md from the runs so far

Each run writes ``outputs/compare/KIND/`` (the demo's files: metrics.json, side_by_side.mp4, run/).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

#: The adapters compared, at similar trainable-parameter counts (the demo's latent_residual: 52k).
KINDS = {
    "latent_residual": None,  # the demo's own adapter and composer
    "action_modulation": {"type": "action_modulation", "config": {"hidden": 32, "lora": {"rank": 4}}},
    "controlnet": {"type": "controlnet", "config": {"blocks": 2}},
    # the two fed the running sum of the actions too (the displacement since the first frame), as latent_residual is
    "action_modulation_sum": {"type": "action_modulation", "config": {"hidden": 32, "cumulative": True,
                                                                      "lora": {"rank": 4}}},
    "controlnet_sum": {"type": "controlnet", "config": {"blocks": 2, "cumulative": True}},
    # the same branch fed each clip's edge video instead of its actions; (c) swaps the edges
    "controlnet_edges": {"type": "controlnet", "config": {"blocks": 2, "condition": "control", "aliases": [],
                                                          "video": True, "dim": 1}},
}
#: What else a kind changes in the demo's setting.
SETTING = {"controlnet_edges": {"control": "edges"}}
OUT = Path("outputs/compare")


def run(kind: str, steps: int | None, clips: int | None = None, quick: bool = False) -> dict:
    import torch

    from workbench.worldmodel.demo import DemoConfig, run_demo

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    overrides = {"output": str(OUT / kind), **({"steps": steps} if steps else {}),
                 **({"eval_clips": clips} if clips else {})}
    if KINDS[kind] is not None:
        # replace has no gate to scale: the inside kinds are sampled as trained
        overrides.update(adapter=KINDS[kind], composer={"type": "replace"}, gate_scale=None, **SETTING.get(kind, {}))
    started = time.perf_counter()
    # quick: the demo's reduced budget without what no row reads (the unseen tasks' clips, the world summary)
    cfg = DemoConfig.quick(**{"world": False, "unseen_clips": 0, "video_clips": 1, **overrides}) if quick \
        else DemoConfig(**overrides)
    metrics = run_demo(cfg, progress=False)
    from workbench.train import AdapterExperiment

    exp = AdapterExperiment.load(OUT / kind / "run")
    row = {"kind": kind, "trainable": sum(p.numel() for p in exp.model.trainable_parameters()),
           "gain_db": metrics["summary"]["adapter_minus_base_moving_psnr_db"],
           "wins": metrics["summary"]["adapter_beats_swapped_fraction"],
           "s_per_step": metrics["training"]["seconds"] / metrics["training"]["steps"],
           "steps": metrics["training"]["steps"], "clips": metrics["evaluation"]["clips"],
           "seconds": round(time.perf_counter() - started, 1)}
    (OUT / kind / "row.json").write_text(json.dumps(row, indent=1))
    print(json.dumps(row))
    return row


def speed(rounds: int = 3, steps: int = 2, batch: int = 8) -> dict[str, float]:
    """CPU seconds per training step of each kind (``batch`` 16-frame clips, the demo's 8 by default; one thread).

    Timed in interleaved rounds as CPU time of this process (a shared machine's wall clock
    counts other people's work); the median per kind. Writes ``outputs/compare/speed.json``.
    """
    import statistics

    import torch

    from workbench.data.control import edges
    from workbench.data.metaworld import MetaWorldClips
    from workbench.worldmodel.demo import DemoConfig, build_experiment

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    clips = MetaWorldClips(path="sample", window=16, stride=4, split="train")
    items = [clips[i] for i in range(batch)]
    # every tensor a clip carries (video, actions, the hand's position the demo's adapter reads, ...)
    raw = {k: torch.stack([it[k] for it in items]) for k, v in items[0].items() if torch.is_tensor(v)}
    raw["control"] = torch.stack([edges(it["video"]) for it in items])
    exps = {}
    for kind, adapter in KINDS.items():
        overrides = {} if adapter is None else {"adapter": adapter, "composer": {"type": "replace"},
                                                **SETTING.get(kind, {})}
        exp = build_experiment(DemoConfig(**overrides), OUT / "speed" / kind)
        exp.training.cache_latents = False
        exps[kind] = exp
    times: dict[str, list[float]] = {kind: [] for kind in exps}
    for round_ in range(rounds + 1):
        for kind, exp in exps.items():
            start = time.process_time()
            exp.fit([raw] * 1000, steps=steps, progress=False)
            if round_:  # the first round warms up
                times[kind].append((time.process_time() - start) / steps)
    out = {kind: statistics.median(v) for kind, v in times.items()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "speed.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return out


def table() -> str:
    speeds = json.loads((OUT / "speed.json").read_text()) if (OUT / "speed.json").exists() else {}
    lines = ["| adapter | reads | trainable params | steps | clips | moving-pixel PSNR gain over base | beats the "
             "swapped condition | action error vs base | CPU s/step |", "|---|---|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        file = OUT / kind / "row.json"
        if file.exists():
            r = json.loads(file.read_text())
            summary = json.loads((OUT / kind / "metrics.json").read_text())["summary"]
            reads = "edge video" if SETTING.get(kind, {}).get("control") else "actions"
            cost = f"{speeds[kind]:.2f}" if kind in speeds else "n/a"
            lines.append(f"| `{kind}` | {reads} | {r['trainable'] / 1000:.0f}k | {r['steps']} | {r['clips']} | "
                         f"{r['gain_db']:+.2f} dB | {100 * r['wins']:.0f}% | "
                         f"{summary['action_error_adapter_over_base']:.2f}× | {cost} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", nargs="?", choices=sorted(KINDS))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the demo's 900)")
    parser.add_argument("--clips", type=int, default=None, help="held-out clips scored (default: the demo's 36)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: the demo's reduced budget without its world summary; with --speed, one "
                             "timed round of one step of batch 2")
    parser.add_argument("--speed", action="store_true", help="time a training step of each kind (CPU time)")
    parser.add_argument("--table", action="store_true", help="print the table of the runs so far")
    args = parser.parse_args()
    if args.kind:
        run(args.kind, args.steps, args.clips, args.quick)
    if args.speed:
        speed(rounds=1, steps=1, batch=2) if args.quick else speed()
    if args.table or not (args.kind or args.speed):
        print(table())


if __name__ == "__main__":
    main()
