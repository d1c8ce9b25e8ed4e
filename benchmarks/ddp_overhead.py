"""2-rank data-parallel step time / single-process step time, same per-rank batch, on the CPU (gloo).

Each rank trains the benchmark tiny_video's adapter on its own micro-batch of 4 clips; the single
process trains one micro-batch of 4. The ratio is what the gradient all-reduce (and the rest of the
distributed bookkeeping) costs per step; the all-reduce moves the adapter's and composer's gradients
only, whose size is printed. The two ranks need a core each: on a machine with fewer cores the
ratio also counts the ranks competing for them.

    python ddp_overhead.py            # (make bench runs it)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROUNDS = 3
STEPS = 12
WARMUP = 3
QUICK_STEPS = 1  # --quick: one round of one step (after one warm-up step)


def worker() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from _bench import BENCH_BASE

    from workbench import AdapterExperiment, GatedResidual, TrainingConfig
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
    from workbench.data.synthetic import SyntheticMoves

    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    exp = AdapterExperiment(base=TinyVideo(TinyVideoConfig(**BENCH_BASE)), adapter=LatentResidual(width=32, depth=2),
                            composer=GatedResidual(),
                            training=TrainingConfig(learning_rate=1e-4, progress=False, batch_size=4, grad_accum=world,
                                                    sync_every=10, cache_latents=True))
    data = SyntheticMoves(items=64, frames=8, size=32)
    quick = os.environ.get("WORKBENCH_BENCH_QUICK") == "1"
    warmup, steps = (1, QUICK_STEPS) if quick else (WARMUP, STEPS)
    exp.fit(data, steps=warmup)  # also fills the latent cache
    start = time.perf_counter()
    exp.fit(data, steps=steps)
    seconds = (time.perf_counter() - start) / steps
    if exp.is_main:
        nbytes = sum(p.numel() * p.element_size() for p in exp.model.trainable_parameters())
        print("RESULT " + json.dumps({"step_s": seconds, "allreduce_bytes": nbytes, "world": world}), flush=True)
    if exp.dist is not None:
        exp.dist.close()


def run(cmd: list[str], quick: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKBENCH_BENCH_QUICK": "1" if quick else "0"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    from _bench import finish, scaled, start

    quick = start(argv, __doc__).quick
    rounds = scaled(ROUNDS, 1)
    here = os.path.abspath(__file__)
    single_cmd = [sys.executable, here, "--worker"]
    ddp_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", here, "--worker"]
    singles, ddps, ratios = [], [], []
    for r in range(rounds):  # alternate which one runs first
        pair = [("single", single_cmd), ("ddp", ddp_cmd)]
        results = dict((name, run(cmd, quick)) for name, cmd in (pair if r % 2 == 0 else pair[::-1]))
        singles.append(results["single"]["step_s"])
        ddps.append(results["ddp"]["step_s"])
        ratios.append(ddps[-1] / singles[-1])
        nbytes = results["ddp"]["allreduce_bytes"]
    value = statistics.median(ratios)
    steps = QUICK_STEPS if quick else STEPS
    print(f"DDP step overhead ({os.cpu_count()} CPU cores, gloo, per-rank batch 4, {rounds} rounds of {steps} steps)")
    print(f"  single process   {statistics.median(singles) * 1e3:9.2f} ms/step")
    print(f"  2 ranks          {statistics.median(ddps) * 1e3:9.2f} ms/step  (each rank: the same work + all-reduce)")
    print(f"  all-reduce: {nbytes / 1e3:.1f} kB of gradients per step, one collective (adapter + composer only)")
    print(f"  ratio 2 ranks / single = {value:.3f}")
    return finish()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if "--worker" in sys.argv:
        worker()
    else:
        sys.exit(main())
