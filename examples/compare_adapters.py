"""Which adapter follows the actions? The world-model demo's comparison across adapter kinds.

Each kind is trained and scored exactly as ``workbench demo`` trains and scores its adapter: the
frozen pretrained tiny_video, the shipped Meta-World sample, 900 steps of batch 8 (AdamW 2e-3,
cosine), flow matching with shift 3, then 36 held-out clips predicted from their first frame
with the base's own 20-step sampler — base alone, adapter with the true actions, adapter with
swapped actions — scored on the moving pixels. One kind per call (they are CPU-heavy):

    OMP_NUM_THREADS=1 python examples/compare_adapters.py action_modulation
    OMP_NUM_THREADS=1 python examples/compare_adapters.py controlnet
    OMP_NUM_THREADS=1 python examples/compare_adapters.py latent_residual
    python examples/compare_adapters.py --table          # the README table from the runs so far

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
}
OUT = Path("outputs/compare")


def run(kind: str, steps: int | None, clips: int | None = None, quick: bool = False) -> dict:
    import torch

    from workbench.demo import DemoConfig, run_demo

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    overrides = {"output": str(OUT / kind), **({"steps": steps} if steps else {}),
                 **({"eval_clips": clips} if clips else {})}
    if KINDS[kind] is not None:
        overrides.update(adapter=KINDS[kind], composer={"type": "replace"})
    started = time.perf_counter()
    cfg = DemoConfig.quick(**overrides) if quick else DemoConfig(**overrides)
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


def table() -> str:
    lines = ["| adapter | trainable params | steps | clips | moving-pixel PSNR gain over base | beats swapped actions "
             "| s/step |", "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        file = OUT / kind / "row.json"
        if file.exists():
            r = json.loads(file.read_text())
            lines.append(f"| `{kind}` | {r['trainable'] / 1000:.0f}k | {r['steps']} | {r['clips']} | "
                         f"{r['gain_db']:+.2f} dB | {100 * r['wins']:.0f}% | {r['s_per_step']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", nargs="?", choices=sorted(KINDS))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the demo's 900)")
    parser.add_argument("--clips", type=int, default=None, help="held-out clips scored (default: the demo's 36)")
    parser.add_argument("--quick", action="store_true", help="the demo's reduced budget (a smoke test)")
    parser.add_argument("--table", action="store_true", help="print the table of the runs so far")
    args = parser.parse_args()
    if args.kind:
        run(args.kind, args.steps, args.clips, args.quick)
    if args.table or not args.kind:
        print(table())


if __name__ == "__main__":
    main()
