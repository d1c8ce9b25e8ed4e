"""Meta-World data: the generator, the HDF5 schema checks, the clip dataset and the shipped sample."""

from __future__ import annotations

import importlib.util
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset

from workbench.config import build
from workbench.data.metaworld import MetaWorldClips, MetaWorldConfig, sample_path, split_episodes
from workbench.errors import ConfigError, DataError

h5py = pytest.importorskip("h5py")

torch.set_num_threads(1)


def write_file(path, n=2, t=8, hw=8, p=3, drop=(), tasks=None, attrs=None, **replace):
    """A small valid file in the generator's layout; ``replace`` swaps datasets, ``drop`` removes them."""
    rng = np.random.default_rng(0)
    data = {
        "frames": rng.integers(0, 256, size=(n, t, hw, hw, 3), dtype=np.uint8),
        "actions": rng.uniform(-1.5, 1.5, size=(n, t, 4)).astype(np.float32),
        "ee_pos": rng.normal(size=(n, t, 3)).astype(np.float32),
        "proprio": rng.normal(size=(n, t, p)).astype(np.float32),
        "task": np.array(tasks or [f"task-{i % 2}" for i in range(n)], dtype=object),
        "success": np.zeros(n, dtype=bool),
    }
    data.update(replace)
    with h5py.File(path, "w") as f:
        for name, value in data.items():
            if name in drop:
                continue
            if name == "task":
                f.create_dataset(name, data=value, dtype=h5py.string_dtype())
            else:
                f.create_dataset(name, data=value)
        f.attrs["schema_version"] = 1
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
    return path


# ---------------------------------------------------------------------------------------- generator
def _needs_simulator():
    for name in ("metaworld", "mujoco"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install './[data]' in a clone)")


def _generate(path, **kwargs):
    _needs_simulator()
    from workbench.worldmodel.generate import generate
    from workbench.worldmodel.sim import RenderingUnavailable

    try:
        return generate(path, progress=False, **kwargs)
    except RenderingUnavailable as err:
        pytest.skip(str(err))  # "MuJoCo cannot render offscreen here: ..."


def test_generator_writes_valid_deterministic_file(tmp_path):
    args = dict(tasks="reach-v3,push-v3", episodes=2, frames=6, size=32, seed=3)
    a = _generate(tmp_path / "a.h5", **args)
    b = _generate(tmp_path / "b.h5", **args)
    c = _generate(tmp_path / "c.h5", **{**args, "seed": 4})
    with h5py.File(a) as fa, h5py.File(b) as fb, h5py.File(c) as fc:
        shapes = {"frames": ((2, 6, 32, 32, 3), np.uint8), "actions": ((2, 6, 4), np.float32),
                  "ee_pos": ((2, 6, 3), np.float32), "proprio": ((2, 6, 10), np.float32),
                  "obs": ((2, 6, 39), np.float32), "reward": ((2, 6), np.float32),
                  "expert": ((2, 6), np.bool_), "success": ((2,), np.bool_)}
        for name, (shape, dtype) in shapes.items():
            assert fa[name].shape == shape, name
            assert fa[name].dtype == dtype, name
            np.testing.assert_array_equal(fa[name][()], fb[name][()], err_msg=f"{name}: same seed, new data")
        assert fa["frames"].chunks == (1, 6, 32, 32, 3)
        assert fa["frames"].compression == "gzip"
        assert [t.decode() for t in fa["task"][()]] == ["reach-v3", "push-v3"]
        assert not np.array_equal(fa["actions"][()], fc["actions"][()]), "another seed gives other actions"
        frames = fa["frames"][()]
        assert frames.std() > 10, "frames should show a scene, not a flat colour"
        assert np.abs(np.diff(frames.astype(np.int16), axis=1)).mean() > 0.1, "the arm should move"
        actions = fa["actions"][()]
        assert np.all(np.abs(actions) <= 1.0)
        np.testing.assert_array_equal(fa["ee_pos"][()], fa["obs"][:, :, :3])
        attrs = dict(fa.attrs)
        for key in ("generator_version", "metaworld_version", "mujoco_version", "camera", "camera_pos", "fps",
                    "seed", "size", "render_settings", "action_perturbation", "schema_version"):
            assert key in attrs, key
        assert attrs["fps"] == pytest.approx(80.0)
        assert attrs["seed"] == 3 and attrs["size"] == 32 and attrs["schema_version"] == 1
        assert json.loads(attrs["action_perturbation"])["noise_std"] > 0
        assert json.loads(attrs["render_settings"])["shadows"] is False
        assert len(json.loads(attrs["proprio_names"])) == 10
    clips = MetaWorldClips(MetaWorldConfig(path=str(a), window=4, stride=2, split="all"))
    assert len(clips) == 2 * 2
    assert clips[0]["video"].shape == (3, 4, 32, 32)


def test_generator_rejects_bad_arguments(tmp_path):
    _needs_simulator()
    from workbench.worldmodel.generate import generate
    from workbench.worldmodel.sim import RenderingUnavailable, import_simulator

    try:
        import_simulator()
    except RenderingUnavailable as err:
        pytest.skip(str(err))  # "MuJoCo cannot render offscreen here: ..."
    with pytest.raises(ConfigError, match=r"unknown Meta-World task 'psh-v3'\. Did you mean .*'push-v3'"):
        generate(tmp_path / "x.h5", tasks="psh-v3", episodes=1, frames=4, progress=False)
    with pytest.raises(ConfigError, match=r"frames: must be >= 2"):
        generate(tmp_path / "x.h5", tasks="push-v3", episodes=1, frames=1, progress=False)
    with pytest.raises(ConfigError, match=r"camera: unknown camera 'corner9'"):
        generate(tmp_path / "x.h5", tasks="push-v3", episodes=1, frames=4, camera="corner9", progress=False)
    with pytest.raises(ConfigError, match=r"Unknown action perturbation field.*'noise_sd'"):
        generate(tmp_path / "x.h5", tasks="push-v3", episodes=1, frames=4, noise={"noise_sd": 0.1},
                 progress=False)
    assert not (tmp_path / "x.h5").exists()


def test_a_missing_simulator_package_names_the_command_that_installs_it(monkeypatch):
    from workbench.worldmodel.sim import import_simulator

    monkeypatch.setitem(sys.modules, "metaworld", None)  # importing it raises ModuleNotFoundError
    with pytest.raises(DataError, match=r"^Generating Meta-World data needs the package 'metaworld', which is not "
                                        r'installed: pip install "\./\[data\]" in a clone of the repository '
                                        r'\(pip install -e "\./\[data\]" for an editable install; `make install` '
                                        r"there installs every extra\) \(metaworld, mujoco, h5py\)\.$"):
        import_simulator()


def test_cli_arguments_parse():
    import argparse

    from workbench.worldmodel.generate import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--tasks", "reach-v3,push-v3", "--episodes", "3", "--frames", "7", "--size", "48", "--seed", "2",
            "--out", "f.h5"]
    args = parser.parse_args(argv)
    assert (args.tasks, args.episodes, args.frames, args.size, args.seed, args.out) == (
        "reach-v3,push-v3", 3, 7, 48, 2, "f.h5")
    assert args.action_repeat == 1 and not args.no_progress
    assert (args.expert_share, args.expert_noise, args.expert_split) == (0.0, 0.1, "all")
    args = parser.parse_args([*argv, "--expert-share", "0.5", "--expert-noise", "0.05", "--expert-split", "train"])
    assert (args.expert_share, args.expert_noise, args.expert_split) == (0.5, 0.05, "train")
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--expert-split", "val"])


def test_expert_episodes_are_spread_over_each_task_and_chosen_by_the_tasks_alone():
    from workbench.worldmodel.sim import Perturbation, expert_episodes

    tasks = [f"t{i % 3}" for i in range(30)]  # ten episodes per task, in turn
    # every other episode of each task: its episodes 1, 3, 5, 7 and 9, i.e. file indices 3-5, 9-11, ...
    assert expert_episodes(tasks, Perturbation(expert_share=0.5)) == [i for i in range(30) if (i // 3) % 2]
    assert expert_episodes(tasks, Perturbation()) == []
    assert expert_episodes(tasks, Perturbation(expert_share=1.0)) == list(range(30))
    train, val = split_episodes(tasks, 0.2, seed=0)  # the metaworld dataset's default split
    assert expert_episodes(tasks, Perturbation(expert_share=1.0, expert_split="train")) == train
    half = expert_episodes(tasks, Perturbation(expert_share=0.5, expert_split="train"))
    assert set(half) <= set(train) and set(half).isdisjoint(val)
    assert [sum(tasks[i] == t for i in half) for t in ("t0", "t1", "t2")] == [4, 4, 4]  # half of 8 each
    # a quarter: each task's episodes 3 and 7 (the 4th and 8th of ten)
    assert expert_episodes(tasks, Perturbation(expert_share=0.25)) == [i for i in range(30) if i // 3 in (3, 7)]


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [({"expert_share": 1.5}, r"expert_share must be in \[0, 1\], got 1\.5"),
     ({"expert_split": "val"}, r"expert_split must be one of 'all', 'train', got 'val'"),
     ({"expert_noise_std": -0.1}, r"noise_std, grip_noise_std and expert_noise_std must be >= 0")],
)
def test_bad_expert_episode_settings_are_refused(fields, pattern):
    from workbench.worldmodel.sim import Perturbation

    with pytest.raises(ConfigError, match=r"Invalid action perturbation: " + pattern):
        Perturbation.coerce(fields)


def test_expert_episodes_replace_only_their_own_episodes(tmp_path):
    args = dict(tasks="push-v3", episodes=4, frames=6, size=16, seed=3)
    plain = _generate(tmp_path / "plain.h5", noise={"segment_fraction": 0.9}, **args)
    mixed = _generate(tmp_path / "mixed.h5", noise={"segment_fraction": 0.9, "expert_share": 0.5,
                                                    "expert_noise_std": 0.0}, **args)
    from metaworld.policies import ENV_POLICY_MAP

    expert = ENV_POLICY_MAP["push-v3"]()
    with h5py.File(plain) as fp, h5py.File(mixed) as fm:
        assert json.loads(fm.attrs["expert_episodes"]) == [1, 3] and json.loads(fp.attrs["expert_episodes"]) == []
        assert json.loads(fm.attrs["action_perturbation"])["expert_share"] == 0.5
        for name in ("frames", "actions", "obs", "expert"):  # the other episodes are the plain file's
            np.testing.assert_array_equal(fm[name][[0, 2]], fp[name][[0, 2]], err_msg=name)
        np.testing.assert_array_equal(fm["frames"][:, 0], fp["frames"][:, 0])  # every episode: the same scene
        assert fm["expert"][[1, 3]].all() and not fp["expert"][[1, 3]].all()
        # without noise, an expert episode's actions are the scripted policy's own, step by step (up to the
        # rounding of the observation it acted on, which the file stores as float32; noise 0.1 would be 1e5x more)
        obs, actions = fm["obs"][[1, 3]], fm["actions"][[1, 3]]
        want = [[np.clip(expert.get_action(o), -1, 1).astype(np.float32) for o in ep] for ep in obs]
        np.testing.assert_allclose(actions, np.array(want), rtol=0, atol=1e-5)
        assert np.abs(fp["actions"][[1, 3]] - np.array(want)).max() > 0.05  # the plain file's are perturbed


# ------------------------------------------------------------------------------------ schema checks
def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"not found: .*nowhere\.h5.*workbench data metaworld"):
        MetaWorldClips(path=str(tmp_path / "nowhere.h5"))


def test_not_hdf5(tmp_path):
    bad = tmp_path / "garbage.h5"
    bad.write_bytes(b"this is not an HDF5 file" * 10)
    with pytest.raises(DataError, match=r"garbage\.h5 is not a readable HDF5 file.*regenerate"):
        MetaWorldClips(path=str(bad))


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(DataError, match=r"is a directory"):
        MetaWorldClips(path=str(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(drop=("actions",)),
         r"missing dataset 'actions' \(expected float32 \[N, T, 4\]\); found datasets"),
        (dict(drop=("frames",)), r"missing dataset 'frames' \(expected uint8 \[N, T, H, W, 3\]\)"),
        (dict(drop=("task",)), r"missing dataset 'task' \(expected string \[N\]\)"),
        (dict(frames=np.zeros((2, 8, 8, 8, 3), np.float32)),
         r"dataset 'frames' has dtype float32, expected uint8 \[N, T, H, W, 3\]; regenerate"),
        (dict(frames=np.zeros((2, 8, 8, 8), np.uint8)),
         r"dataset 'frames' has shape \[2, 8, 8, 8\], expected uint8 \[N, T, H, W, 3\]"),
        (dict(actions=np.zeros((2, 8, 3), np.float32)),
         r"dataset 'actions' has shape \[2, 8, 3\], expected float32 \[N, T, 4\] with N=2, T=8"),
        (dict(actions=np.zeros((2, 8, 4), np.int32)), r"dataset 'actions' has dtype int32, expected float32"),
        (dict(ee_pos=np.zeros((2, 7, 3), np.float32)),
         r"dataset 'ee_pos' has shape \[2, 7, 3\], expected float32 \[N, T, 3\] with N=2, T=8 as in"),
        (dict(proprio=np.zeros((2, 8), np.float32)),
         r"dataset 'proprio' has shape \[2, 8\], expected float32 \[N, T, P\]"),
        (dict(task=np.array(["a"], dtype=object)),
         r"dataset 'task' is object \[1\], expected string \[N\] with N=2"),
        (dict(attrs={"schema_version": 99}), r"schema_version 99 is newer than this workbench reads \(1\)"),
    ],
)
def test_schema_errors_name_the_field(tmp_path, kwargs, pattern):
    path = write_file(tmp_path / "broken.h5", **kwargs)
    with pytest.raises(DataError, match=pattern):
        MetaWorldClips(path=str(path), window=4)


def test_episodes_shorter_than_window(tmp_path):
    path = write_file(tmp_path / "short.h5", t=8)
    with pytest.raises(DataError, match=r"episodes have T=8 frames, shorter than window=16\. Use window <= 8"
                                         r".*--frames 16"):
        MetaWorldClips(path=str(path))


def test_empty_split_and_unknown_task_filter(tmp_path):
    one = write_file(tmp_path / "one.h5", n=1)
    with pytest.raises(DataError, match=r"split 'val' has no episodes \(file has 1 episode"):
        MetaWorldClips(path=str(one), window=4, split="val")
    assert len(MetaWorldClips(path=str(one), window=4, split="train")) > 0
    two = write_file(tmp_path / "two.h5", n=2)
    with pytest.raises(DataError, match=r"tasks \['nope'\] are not in this file"):
        MetaWorldClips(path=str(two), window=4, split="all", tasks=["nope"])


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [("window", 1, r"window: must be >= 2"), ("stride", 0, r"stride: must be >= 1"),
     ("val_fraction", 1.0, r"val_fraction: must be in \[0, 1\)"), ("val_fraction", -0.1, r"val_fraction")],
)
def test_config_validation(field, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        MetaWorldConfig(path="x.h5", **{field: value})


def test_build_from_registry_validates_keys(tmp_path):
    path = write_file(tmp_path / "ok.h5")
    clips = build("dataset", "metaworld", {"path": str(path), "window": 4, "split": "all"})
    assert isinstance(clips, MetaWorldClips)
    with pytest.raises(ConfigError, match=r"dataset\.config\.windw: unknown key.*Did you mean 'window'"):
        build("dataset", "metaworld", {"path": str(path), "windw": 4})
    with pytest.raises(ConfigError, match=r"dataset\.config\.split: got str 'tarin'.*Did you mean 'train'"):
        build("dataset", "metaworld", {"path": str(path), "split": "tarin"})


# ------------------------------------------------------------------------------------- the dataset
def test_windows_strides_and_scaling(tmp_path):
    n, t, hw = 3, 10, 4
    frames = np.zeros((n, t, hw, hw, 3), np.uint8)
    frames[..., 0] = 255
    frames[..., 1] = 51
    frames[:, :, 0, 0, 2] = np.arange(t, dtype=np.uint8)[None] * 10  # encodes the step
    path = write_file(tmp_path / "w.h5", n=n, t=t, hw=hw, frames=frames)
    clips = MetaWorldClips(path=str(path), window=4, stride=3, split="all")
    assert len(clips) == n * 3  # starts 0, 3, 6
    assert [(e, s) for e, s in clips.index] == [(e, s) for e in range(n) for s in (0, 3, 6)]
    item = clips[4]
    assert (item["episode"], item["start"]) == (1, 3)
    video = item["video"]
    assert video.dtype == torch.float32 and video.shape == (3, 4, hw, hw)
    assert torch.all(video[0] == 1.0) and video.min() >= -1.0 and video.max() <= 1.0
    assert torch.allclose(video[1], torch.full_like(video[1], 51 / 127.5 - 1))
    assert torch.allclose(video[2, :, 0, 0], (torch.arange(3, 7) * 10) / 127.5 - 1)
    assert float(video[2, 0, 1, 1]) == -1.0
    with h5py.File(path) as f:
        raw_actions = f["actions"][1, 3:7]
        ee = f["ee_pos"][1, 3:7]
        proprio = f["proprio"][1, 3:7]
    assert item["action"].shape == (4, 4) and item["action"].dtype == torch.float32
    np.testing.assert_allclose(item["action"].numpy(), np.clip(raw_actions, -1, 1))
    np.testing.assert_allclose(item["ee_pos"].numpy(), ee)
    np.testing.assert_allclose(item["proprio"].numpy(), proprio)
    assert item["task"] == "task-1"
    with pytest.raises(IndexError):
        clips[len(clips)]
    # Stride larger than the room left: one window per episode.
    assert len(MetaWorldClips(path=str(path), window=10, stride=50, split="all")) == n
    memory = MetaWorldClips(path=str(path), window=4, stride=3, split="all", in_memory=True)
    assert torch.equal(memory[4]["video"], video)


def test_split_by_episode_is_disjoint_deterministic_and_stratified():
    tasks = [f"t{i % 3}" for i in range(30)]
    train, val = split_episodes(tasks, 0.2, seed=0)
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(30))
    assert len(val) == 6 and {tasks[e] for e in val} == {"t0", "t1", "t2"}
    assert split_episodes(tasks, 0.2, seed=0) == (train, val)
    assert split_episodes(tasks, 0.2, seed=1)[1] != val
    assert split_episodes(["a", "a"], 0.01, seed=0)[1] != []  # at least one val episode
    assert split_episodes(["a", "b"], 0.9, seed=0)[0] != []  # never everything in val
    assert split_episodes(["a", "a", "a"], 0.0, seed=0) == ([0, 1, 2], [])
    assert split_episodes(["a"], 0.5, seed=0) == ([0], [])


def test_dataset_splits_never_share_episodes(tmp_path):
    path = write_file(tmp_path / "s.h5", n=10, t=8)
    train = MetaWorldClips(path=str(path), window=4, split="train", val_fraction=0.3, seed=5)
    val = MetaWorldClips(path=str(path), window=4, split="val", val_fraction=0.3, seed=5)
    every = MetaWorldClips(path=str(path), window=4, split="all")
    assert {e for e, _ in train.index}.isdisjoint({e for e, _ in val.index})
    assert len(train) + len(val) == len(every)
    assert train.val_episodes == val.val_episodes
    only = MetaWorldClips(path=str(path), window=4, split="all", tasks=["task-0"])
    assert {only.task_names[e] for e in only.episodes} == {"task-0"}


def test_pickling_drops_the_file_handle(tmp_path):
    path = write_file(tmp_path / "p.h5")
    clips = MetaWorldClips(path=str(path), window=4, split="all")
    first = clips[0]
    assert clips._file is not None
    clone = pickle.loads(pickle.dumps(clips))
    assert clone._file is None
    assert torch.equal(clone[0]["video"], first["video"])
    clips.close()
    assert torch.equal(clips[0]["video"], first["video"])  # reopens


# -------------------------------------------------------------------------------- the shipped sample
@pytest.fixture(scope="module")
def sample():
    path = sample_path()
    if not path.exists():
        pytest.fail(f"shipped sample missing: {path}")
    return path


def test_shipped_sample_loads(sample):
    assert sample.stat().st_size < 6 * 2**20
    train = MetaWorldClips(MetaWorldConfig(path=str(sample)))
    val = MetaWorldClips(MetaWorldConfig(path="sample", split="val"))
    assert train.path == val.path == sample
    assert set(train.episodes).isdisjoint(val.episodes)
    assert len(train.episodes) + len(val.episodes) == train.num_episodes >= 48
    assert set(train.task_names) == {train.task_names[e] for e in val.episodes}  # every task in val
    item = train[0]
    assert item["video"].shape == (3, 16, 64, 64)
    assert item["action"].shape == (16, 4) and item["ee_pos"].shape == (16, 3)
    assert item["proprio"].shape == (16, train.proprio_dim)
    assert -1.0 <= float(item["video"].min()) < float(item["video"].max()) <= 1.0
    assert train.attrs["schema_version"] == 1 and train.attrs["size"] == 64


def test_sample_actions_drive_the_arm(sample):
    """The next end-effector displacement follows the action (so a model can learn to follow actions)."""
    with h5py.File(sample) as f:
        actions, ee, expert = f["actions"][()], f["ee_pos"][()], f["expert"][()]
        success = f["success"][()]
    displacement = np.diff(ee, axis=1)
    for axis in range(3):
        corr = np.corrcoef(actions[:, :-1, axis].ravel(), displacement[..., axis].ravel())[0, 1]
        assert corr > 0.5, (axis, corr)
    assert 0.2 < (~expert).mean() < 0.6, "random segments replace the expert part of the time"
    assert 0 < success.mean() < 1
    assert actions[..., :3].std() > 0.3


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 1-core CI machines
def test_dataloader_workers_match_single_process(sample):
    clips = MetaWorldClips(MetaWorldConfig(path=str(sample), split="val"))
    clips[0]  # open the file in the parent: workers must reopen their own handle
    subset = Subset(clips, list(range(0, len(clips), max(1, len(clips) // 8)))[:8])
    single = list(DataLoader(subset, batch_size=4, num_workers=0))
    multi = list(DataLoader(subset, batch_size=4, num_workers=2))
    assert len(single) == len(multi) == 2
    for a, b in zip(single, multi):
        assert a["video"].shape == (4, 3, 16, 64, 64) and a["action"].shape == (4, 16, 4)
        for key in ("video", "action", "ee_pos", "proprio", "episode", "start"):
            assert torch.equal(a[key], b[key]), key
        assert a["task"] == b["task"] and isinstance(a["task"][0], str)


def test_imports_stay_light():
    code = ("import sys, workbench, workbench.data, workbench.data.metaworld, workbench.worldmodel.generate; "
            "heavy = [m for m in ('h5py', 'metaworld', 'mujoco') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_read_returns_whole_episodes_and_names_the_schema(sample):
    clips = MetaWorldClips(path=str(sample), window=16)
    frames = clips.read("frames", [3, 1])
    assert frames.shape[0] == 2 and frames.dtype == np.uint8
    assert np.array_equal(frames[0], clips.read("frames")[1])  # episodes come back in file order
    with pytest.raises(DataError, match=r"no dataset 'frame' to read; the schema has \['actions', 'ee_pos', 'frames', "
                                        r"'proprio', 'task'\], the file holds \[.*'obs'"):
        clips.read("frame")
    # a dataset beside the schema (the raw observations the generator records) reads the same way
    assert {"frames", "actions", "ee_pos", "proprio", "task", "obs"} <= set(clips.datasets())
    import h5py

    with h5py.File(sample, "r") as f:
        assert np.array_equal(clips.read("obs", [3, 1]), f["obs"][[1, 3]])

