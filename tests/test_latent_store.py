"""`workbench cache-latents` and training.cache_latents: DIR — a latent cache on disk."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml

from workbench.cli import main
from workbench.errors import DataError
from workbench.train.experiment import AdapterExperiment
from workbench.train.latent_store import DiskLatentCache

CONFIG = {
    "name": "cached",
    "base": {"type": "tiny_video", "config": {"image_size": 16, "frames": 8, "width": 16, "ae_width": 8, "depth": 1}},
    "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1, "dim": 4, "per_frame": "keep"}},
    "training": {"steps": 6, "learning_rate": 1.0e-3, "batch_size": 4, "sync_every": 1, "progress": False},
    "data": {"type": "synthetic_moves", "config": {"items": 10, "frames": 8, "size": 16}},
}


def write_config(tmp_path, name="run.yaml", **changes):
    config = json.loads(json.dumps(CONFIG))
    for path, value in changes.items():
        node = config
        *parents, leaf = path.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def shard_content(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118


def run_cli(*argv):
    assert main(list(argv)) == 0


@pytest.fixture
def cache_dir(tmp_path):
    out = tmp_path / "cache"
    run_cli("cache-latents", str(write_config(tmp_path)), "--out", str(out), "--shard-size", "4")
    return out


def fit(tmp_path, cache_latents, name):
    path = write_config(tmp_path, name=f"{name}.yaml", **{"training.cache_latents": cache_latents,
                                                         "training.output_dir": str(tmp_path / name)})
    exp = AdapterExperiment.from_yaml(path)
    exp.fit(steps=6)
    return exp


def test_the_cache_holds_exactly_what_encode_item_returns(cache_dir):
    cache = DiskLatentCache(cache_dir)
    exp = AdapterExperiment.from_yaml(write_config(cache_dir.parent, name="x.yaml"))
    data = exp.default_data()
    assert len(cache) == 10 and sorted(p.name for p in cache_dir.glob("shard-*.safetensors")) == [
        "shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"]
    for i in (0, 5, 9, -1):
        want = exp.model.base.encode_item(data[i % 10])
        got = cache[i]
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            else:
                assert got[key] == value and type(got[key]) is type(value), key
    with pytest.raises(IndexError, match="index 10 out of range for 10 cached items"):
        cache[10]


def test_training_from_the_disk_cache_equals_the_in_process_cache_bit_exactly(tmp_path, cache_dir):
    memory = fit(tmp_path, True, "memory")
    disk = fit(tmp_path, str(cache_dir), "disk")
    assert disk.loss_history == memory.loss_history
    for (name, a), (_, b) in zip(memory.model.adapter.state_dict().items(), disk.model.adapter.state_dict().items()):
        assert torch.equal(a, b), name


def test_an_interrupted_cache_resumes_and_writes_only_what_is_missing(tmp_path, cache_dir):
    shard = cache_dir / "shard-00001.safetensors"
    before = shard_content(shard)
    untouched = (cache_dir / "shard-00000.safetensors").stat().st_mtime_ns
    shard.unlink()
    with pytest.raises(DataError, match=r"is incomplete: 1 of 3 shards missing or unfinished \(first: "
                                        r"shard-00001.safetensors\). Rerun `workbench cache-latents`"):
        DiskLatentCache(cache_dir)
    run_cli("cache-latents", str(write_config(tmp_path)), "--out", str(cache_dir), "--shard-size", "4")
    after = shard_content(shard)
    assert after[1] == before[1] and after[0].keys() == before[0].keys()
    assert all(torch.equal(after[0][k], before[0][k]) for k in before[0])
    assert (cache_dir / "shard-00000.safetensors").stat().st_mtime_ns == untouched


@pytest.mark.parametrize("change, field", [
    ({"base.config.width": 8}, "backbone \\(type and config\\): config.width is 16 in the cache, 8 in this run"),
    ({"training.seed": 3}, "backbone weights: value is '[0-9a-f]+' in the cache, '[0-9a-f]+' in this run"),
    ({"data.config.seed": 1}, "data config: config.seed is 0 in the cache, 1 in this run"),
])
def test_a_cache_of_something_else_is_refused_naming_what_differs(tmp_path, cache_dir, change, field, capsys):
    path = write_config(tmp_path, name="other.yaml", **change, **{"training.cache_latents": str(cache_dir)})
    exp = AdapterExperiment.from_yaml(path)
    with pytest.raises(DataError, match=f"was made for another run \\({field}\\). Rebuild it"):
        exp.fit(steps=1)
    assert exp.step == 0
    assert main(["cache-latents", str(path), "--out", str(cache_dir)]) == 2
    assert re.search(f"holds a latent cache of something else \\({field}\\)", capsys.readouterr().err)


def test_a_directory_that_is_not_a_cache_says_how_to_make_one(tmp_path):
    with pytest.raises(DataError, match=r"is not a latent cache \(no cache.json\). Write one with "
                                        r"`workbench cache-latents CONFIG --out"):
        DiskLatentCache(tmp_path)


def test_a_config_without_data_has_nothing_to_cache(tmp_path, capsys):
    config = dict(CONFIG)
    config.pop("data")
    path = tmp_path / "nodata.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["cache-latents", str(path), "--out", str(tmp_path / "c")]) == 2
    assert "has no data: block, so there is nothing to encode" in capsys.readouterr().err


def test_the_disk_cache_is_not_bound_to_num_workers(tmp_path, cache_dir):
    from workbench.train.config import TrainingConfig

    assert TrainingConfig(cache_latents=str(cache_dir), num_workers=2).num_workers == 2


def test_ranks_share_the_encoding_and_write_the_same_cache(tmp_path, cache_dir):
    import os
    import subprocess
    import sys

    out = tmp_path / "ranked"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "workbench",
           "cache-latents", str(write_config(tmp_path)), "--out", str(out), "--shard-size", "4"]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0: 2 shard(s) written" in done.stdout and "rank 1: 1 shard(s) written" in done.stdout
    assert done.stdout.count("10 items of synthetic_moves cached") == 1
    single, ranked = DiskLatentCache(cache_dir), DiskLatentCache(out)
    assert single.identity == ranked.identity
    for i in range(10):
        a, b = single[i], ranked[i]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                            for k in a)
