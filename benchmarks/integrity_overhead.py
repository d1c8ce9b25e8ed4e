"""What verifying costs: a checkpoint save and load with SHA-256 manifests vs the same without them.

The checkpoint is that of the embedded model's world-model run (examples/configs/metaworld_world_model.yaml:
the pretrained tiny_video and its action adapter, with the AdamW state after a few steps). "with
digests" is what workbench does: every file hashed and listed in ``manifest.json`` on save; on
load, every file checked against it and the weights and optimizer state checked for nan / inf.
"plain" is the same save and load with the hashing, the manifest and the finiteness check taken
out (the code paths patched in this process only). A second, larger case (a 32 MB trainable
state, the size of a LoRA on a large backbone) shows how the cost grows with the bytes.

Both CPU time (the hashing is CPU work; fsync waits are not counted) and wall time are reported;
the goal is digests costing at most 5% of the embedded model's save. Nothing asserts on time.

    cd benchmarks && ../.venv/bin/python integrity_overhead.py
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import finish, interleaved, report, scaled, start

from workbench.train import checkpoint
from workbench.train.config import load_yaml, replace_training
from workbench.train.experiment import AdapterExperiment

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def plain():
    """Saves and loads without digests: no hashing, no manifest, no finiteness check."""
    saved = checkpoint.entry_of, checkpoint.manifest_bytes, checkpoint.write_bytes, checkpoint._raw_files, \
        checkpoint.non_finite
    write = checkpoint.write_bytes

    def raw_files(path):
        return {name: (path / name).read_bytes() for name in checkpoint.FILES}, True, None

    checkpoint.entry_of = lambda data: None
    checkpoint.manifest_bytes = lambda files, **extra: b""
    checkpoint.write_bytes = lambda path, data: None if Path(path).name == checkpoint.MANIFEST else write(path, data)
    checkpoint._raw_files = raw_files
    checkpoint.non_finite = lambda tree, where: []
    try:
        yield
    finally:
        (checkpoint.entry_of, checkpoint.manifest_bytes, checkpoint.write_bytes, checkpoint._raw_files,
         checkpoint.non_finite) = saved


def world_model_experiment(out: Path) -> AdapterExperiment:
    config = load_yaml(ROOT / "examples" / "configs" / "metaworld_world_model.yaml")
    config = replace_training(config, output_dir=str(out), progress=False, checkpoint_every=None)
    exp = AdapterExperiment.from_config(config)
    exp.fit(steps=2)  # AdamW state for every parameter, as in a real checkpoint
    return exp


class Big:
    """A save of a 32 MB trainable state (8M float32 values) with its AdamW moments (4 MB per tensor)."""

    def __init__(self, tensors: int = 8):
        g = torch.Generator().manual_seed(0)
        self.trainable = {f"lora.{i}": torch.randn(1024, 1024, generator=g) for i in range(tensors)}
        self.state = {"optimizer": {"state": {}, "param_groups": []}, "rng_cpu": torch.get_rng_state(), "step": 0}


def measure(name: str, save, load, rounds: int, target: float | None = None) -> dict[str, float]:
    wall: dict[str, list[float]] = {}

    def timed(key, fn):
        def run():
            start = time.perf_counter()
            fn()
            wall.setdefault(key, []).append(time.perf_counter() - start)
        return run

    def plain_save():
        with plain():
            save()

    def plain_load():
        with plain():
            load()

    times = interleaved({"save with digests": timed("save with digests", save),
                         "save plain": timed("save plain", plain_save)}, repeats=rounds)
    cpu_save = report(f"{name}: save (CPU time)", times, ("save with digests", "save plain"), target=target)
    save()  # (untimed) the checkpoint on disk is one with its manifest, whichever save ran last
    times = interleaved({"load with digests": timed("load with digests", load),
                         "load plain": timed("load plain", plain_load)}, repeats=rounds)
    cpu_load = report(f"{name}: load (CPU time)", times, ("load with digests", "load plain"))
    walls = {k: statistics.median(v) for k, v in wall.items()}
    print("  wall time medians: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in walls.items()))
    print(f"  wall ratio save {walls['save with digests'] / walls['save plain']:.3f}, "
          f"load {walls['load with digests'] / walls['load plain']:.3f}")
    return {"save": cpu_save, "load": cpu_load}


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    scratch = Path(tempfile.mkdtemp(prefix="integrity-bench-"))
    try:
        exp = world_model_experiment(scratch / "wm")
        size = sum(v.numel() * v.element_size() for v in exp.model.trainable_state_dict().values())
        path = exp.save_checkpoint(keep_last=1)
        files = sum(p.stat().st_size for p in path.iterdir())
        print(f"embedded world-model checkpoint: {size / 1e3:.0f} kB of trainable weights, {files / 1e3:.0f} kB "
              f"on disk")
        measure("embedded world model", lambda: exp.save_checkpoint(keep_last=1),
                lambda: checkpoint.load_checkpoint(path), rounds=15, target=1.05)

        big = Big(scaled(8, 1))
        run = scratch / "big"

        def save_big():
            return checkpoint.save_checkpoint(run, 1, trainable=big.trainable, state=big.state, config_yaml="{}\n",
                                              meta={}, keep_last=1)

        big_path = save_big()
        measure("32 MB trainable state", save_big, lambda: checkpoint.load_checkpoint(big_path), rounds=5)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
