"""Train the demo's action adapter with a context remedy (or none): one row of the ablation.

    OMP_NUM_THREADS=1 python research/train_variant.py NAME [--steps 600] [--corrupt-prob 0.5 ...]

Builds exactly what ``workbench demo`` trains (:func:`workbench.worldmodel.demo.build_experiment` with
its defaults: 600 steps, learning rate 4e-3, batch 8, the shipped sample), on one process, installs
the context source (:mod:`context_sources`) and fits. Writes ``outputs/r40/NAME/run`` (the checkpoint
``workbench eval`` reads) and ``outputs/r40/NAME/train.json`` (the options, CPU seconds, losses).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_sources as cs  # noqa: E402
import torch  # noqa: E402

from workbench.worldmodel.demo import ADAPTER, DemoConfig, build_experiment  # noqa: E402

ROOT = Path("outputs/r40")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--train-seed", type=int, default=0, help="the run's training.seed (init, data order, noise)")
    p.add_argument("--level-adapter", action="store_true",
                   help="the adapter that reads the context's corruption level (latent_residual_context)")
    for f in dataclasses.fields(cs.ContextConfig):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            p.add_argument(flag, action="store_true")
        else:
            p.add_argument(flag, type=type(f.default) if f.default is not None else float, default=f.default)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    config = cs.ContextConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cs.ContextConfig)})
    adapter = copy.deepcopy(ADAPTER)
    if args.level_adapter or args.source_flag:
        adapter["type"] = "latent_residual_context"
        if args.source_flag:
            adapter["config"]["reads_source"] = True
    out = ROOT / args.name
    out.mkdir(parents=True, exist_ok=True)
    cfg = DemoConfig(output=str(out), steps=args.steps, learning_rate=args.lr, adapter=adapter, processes=1,
                     seed=args.train_seed)
    wall, cpu = time.perf_counter(), time.process_time()
    exp = build_experiment(cfg, out / "run")
    source = cs.install(exp, config)
    exp.fit(progress=False)
    cpu_s, wall_s = time.process_time() - cpu, time.perf_counter() - wall
    ckpt = exp.save_checkpoint()
    record = {"name": args.name, "steps": exp.step, "learning_rate": args.lr,
              "train_seed": args.train_seed, "adapter": adapter["type"],
              "context": dataclasses.asdict(config), "cpu_s": round(cpu_s, 1), "wall_s": round(wall_s, 1),
              "hook_cpu_s": round(source.seconds_in_hook, 1) if source else 0.0,
              "counts": source.counts if source else None, "checkpoint": str(ckpt),
              "gates": exp.model.composer.gate_values(),
              "loss_last100": sum(exp.loss_history[-100:]) / min(100, len(exp.loss_history)),
              "loss_history": [round(v, 5) for v in exp.loss_history]}
    (out / "train.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "loss_history"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
