"""Windows per second from a LeRobot dataset (H.264, seeking) vs the HDF5 file of the same rollouts.

The shipped Meta-World sample (60 episodes x 48 frames, 64x64) is written once as a LeRobot v3.0
dataset; both datasets serve the same 16-frame training windows, in the same shuffled order,
through a DataLoader (batch 8) with 0 and with 2 worker processes. Wall time (workers run in other
processes), rounds interleaved, medians reported. Then one training step of the action adapter
on the pretrained ``tiny_video`` (batch 8 of raw 16x64x64 clips, no latent cache) is timed, and
the data time per batch is reported as a fraction of it: below 1, the loader keeps the step fed.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import finish, scaled, start
from torch.utils.data import DataLoader

from workbench.data.lerobot import LeRobotClips
from workbench.data.metaworld import MetaWorldClips
from workbench.worldmodel.generate import metaworld_to_lerobot

BATCH, BATCHES, ROUNDS = 8, 12, 5


def loader_seconds(dataset, workers: int, seed: int) -> float:
    """Wall seconds per batch over BATCHES batches (worker start-up included, as a training epoch pays it)."""
    batches = scaled(BATCHES, 2)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:BATCH * batches].tolist()
    loader = DataLoader(dataset, batch_size=BATCH, sampler=order, num_workers=workers)
    began = time.perf_counter()
    for _ in loader:
        pass
    return (time.perf_counter() - began) / batches


def step_seconds(hdf5: MetaWorldClips, steps: int = 4) -> float:
    import yaml

    from workbench.train import AdapterExperiment
    from workbench.train.config import parse_experiment

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "configs" /
                             "lerobot_world_model.yaml").read_text())
    config.pop("data")
    config["callbacks"] = []
    config["training"].update(batch_size=BATCH, cache_latents=False, progress=False, warmup_steps=1)
    exp = AdapterExperiment.from_config(parse_experiment(config))
    batch = next(iter(DataLoader(hdf5, batch_size=BATCH)))
    data = [batch] * (steps + 1)
    exp.fit(data, steps=1)  # warm-up
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        exp.fit(data, steps=1)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        root = metaworld_to_lerobot("sample", Path(tmp) / "metaworld_lerobot")
        print(f"wrote the sample as LeRobot v3.0 in {time.perf_counter() - began:.1f} s "
              f"({sum(f.stat().st_size for f in root.rglob('*') if f.is_file()) / 1e6:.2f} MB; "
              f"the HDF5 file is {MetaWorldClips(path='sample').path.stat().st_size / 1e6:.2f} MB)")
        hdf5 = MetaWorldClips(path="sample", window=16, stride=4, split="train")
        lerobot = LeRobotClips(root=str(root), window=16, stride=4, split="train", size=[64, 64])
        assert lerobot.index == hdf5.index
        results: dict[str, float] = {}
        for workers in (0, 2):
            times: dict[str, list[float]] = {"hdf5": [], "lerobot": []}
            for r in range(scaled(ROUNDS, 1)):
                pair = [("hdf5", hdf5), ("lerobot", lerobot)]
                for name, dataset in pair if r % 2 == 0 else pair[::-1]:
                    times[name].append(loader_seconds(dataset, workers, seed=r))
            h, lr = statistics.median(times["hdf5"]), statistics.median(times["lerobot"])
            ratio = statistics.median(b / a for a, b in zip(times["hdf5"], times["lerobot"]))
            print(f"DataLoader, {workers} worker(s), batch {BATCH} of 16x64x64 windows:")
            print(f"  hdf5     {h * 1e3:8.1f} ms/batch  {BATCH / h:7.1f} windows/s")
            print(f"  lerobot  {lr * 1e3:8.1f} ms/batch  {BATCH / lr:7.1f} windows/s")
            print(f"  ratio lerobot / hdf5 time per batch = {ratio:.2f}")
            results[f"lerobot_ms_{workers}"], results[f"hdf5_ms_{workers}"] = lr * 1e3, h * 1e3
            results[f"ratio_{workers}"] = ratio
        step = step_seconds(hdf5, scaled(4, 1))
        print(f"training step, tiny_video + action adapter, batch {BATCH}, raw video: {step * 1e3:.1f} ms")
        for workers in (0, 2):
            for name in ("hdf5", "lerobot"):
                share = results[f"{name}_ms_{workers}"] / 1e3 / step
                print(f"  data time / step time, {name:<7} {workers} worker(s): {share:.2f}")
                results[f"{name}_share_{workers}"] = share
        return finish()


if __name__ == "__main__":
    sys.exit(main())
