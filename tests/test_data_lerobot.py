"""LeRobot datasets: reading v2.1 and v3.0, the errors, writing v3.0 from Meta-World, training from one."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("pyarrow", reason="the lerobot dataset needs pyarrow (pip install './[data]' in a clone)")
pytest.importorskip("av", reason="the lerobot dataset needs PyAV (pip install './[data]' in a clone)")

import lerobot_fixture as fx  # noqa: E402

from workbench.config import build  # noqa: E402
from workbench.data.lerobot import LeRobotClips  # noqa: E402
from workbench.errors import ConfigError, DataError  # noqa: E402

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
LEVELS = 4 / 127.5  # flat colours come back from H.264 within a few levels


@pytest.fixture(scope="module", params=["v2.1", "v3.0"])
def dataset(request, tmp_path_factory):
    return fx.write(tmp_path_factory.mktemp(request.param.replace(".", "")) / "ds", request.param)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    base = tmp_path_factory.mktemp("both")
    return fx.write(base / "v21", "v2.1"), fx.write(base / "v30", "v3.0")


def code(video: torch.Tensor) -> torch.Tensor:
    """Mean colour of each frame of (3, T, H, W) in [-1, 1], back in 0..255: (T, 3)."""
    return ((video.mean(dim=(2, 3)) + 1) * 127.5).T


# ------------------------------------------------------------------------------------------ reading
@pytest.mark.parametrize("camera", [0, 1])
def test_reads_windows_of_both_layouts(dataset, camera):
    clips = LeRobotClips(root=str(dataset), camera=fx.CAMERAS[camera], window=4, stride=2, split="all")
    assert clips.meta.version in ("v2.1", "v3.0")
    assert len(clips) == sum((n - 4) // 2 + 1 for n in fx.LENGTHS)
    assert clips.widths() == {"action": 5, "proprio": 7}
    for i in range(len(clips)):
        item = clips[i]
        e, s = item["episode"], item["start"]
        frames = np.arange(s, s + 4)
        assert item["video"].shape == (3, 4, *fx.HW) and item["video"].dtype == torch.float32
        want = torch.as_tensor(fx.frame_codes(e, frames, camera), dtype=torch.float32)
        assert torch.allclose(code(item["video"]), want, atol=4), (e, s)
        arrays = fx.episode_arrays(e, fx.LENGTHS[e])
        assert torch.equal(item["action"], torch.from_numpy(arrays["action"][s:s + 4]))  # exact
        assert torch.equal(item["proprio"], torch.from_numpy(arrays["observation.state"][s:s + 4]))
        assert s + 4 <= fx.LENGTHS[e]  # windows never cross an episode boundary
        assert item["task"] == item["prompt"] == fx.TASKS[e % 2]


def test_both_layouts_serve_the_same_items(both):
    a = LeRobotClips(root=str(both[0]), camera=fx.CAMERAS[1], window=5, stride=3, split="all")
    b = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[1], window=5, stride=3, split="all")
    assert a.index == b.index and len(a) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x["action"], y["action"]) and x["task"] == y["task"]
        assert torch.allclose(x["video"], y["video"], atol=2 * LEVELS)


def test_resampling_to_a_lower_fps_takes_every_other_frame(both):
    clips = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=4, stride=1, split="all", fps=5)
    assert clips.fps == 5 and clips.source_fps == 10
    assert [clips.served_length(e) for e in range(3)] == [6, 5, 8]  # frames 0, 2, 4, ... of 12, 9, 15
    item = clips[1]
    e, s = item["episode"], item["start"]
    rows = 2 * np.arange(s, s + 4)
    assert torch.equal(item["action"], torch.from_numpy(fx.episode_arrays(e, fx.LENGTHS[e])["action"][rows]))
    assert torch.allclose(code(item["video"])[:, 0], torch.as_tensor(8.0 * rows, dtype=torch.float32), atol=4)


def test_a_whole_episode_is_one_item_of_its_own_length(both):
    clips = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=4, stride=4, split="all", fps=5)
    for e, served in enumerate((6, 5, 8)):  # frames 0, 2, 4, ... of 12, 9, 15
        item = clips.episode(e)
        rows = 2 * np.arange(served)
        arrays = fx.episode_arrays(e, fx.LENGTHS[e])
        assert (item["episode"], item["start"], item["task"]) == (e, 0, fx.TASKS[e % 2])
        assert item["video"].shape == (3, served, *fx.HW)
        assert torch.equal(item["action"], torch.from_numpy(arrays["action"][rows]))
        assert torch.equal(item["proprio"], torch.from_numpy(arrays["observation.state"][rows]))
        assert torch.allclose(code(item["video"])[:, 0], torch.as_tensor(8.0 * rows, dtype=torch.float32), atol=4)
    first = clips.episode(2, 3)
    assert first["video"].shape[1] == 3 and torch.equal(first["action"], clips.episode(2)["action"][:3])
    with pytest.raises(DataError, match=r"episode 1 of .* has 5 frames at 5 fps; asked for 6\. Ask for 1 to 5"):
        clips.episode(1, 6)


def test_resize_to_the_backbone_size(both):
    clips = LeRobotClips(root=str(both[0]), camera=fx.CAMERAS[0], window=3, split="all", size=[16, 16])
    item = clips[0]
    assert item["video"].shape == (3, 3, 16, 16)
    want = torch.as_tensor(fx.frame_codes(0, np.arange(3), 0), dtype=torch.float32)
    assert torch.allclose(code(item["video"]), want, atol=4)


def test_a_control_video_derived_from_the_frames(both):
    from workbench.data.control import edges

    clips = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=3, split="all", control="edges")
    item = clips[0]
    assert torch.equal(item["control"], edges(item["video"])) and item["control"].shape == (1, 3, *fx.HW)
    assert "control" not in LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=3, split="all")[0]
    with pytest.raises(ConfigError, match=r"control: must be null \(no control video\) or one of \['edges'\]"):
        LeRobotClips(root=str(both[1]), control="canny")


def test_split_is_by_episode_and_seeded(both):
    root = str(both[1])
    train = LeRobotClips(root=root, window=4, camera=fx.CAMERAS[0], split="train", val_fraction=0.4, seed=1)
    val = LeRobotClips(root=root, window=4, camera=fx.CAMERAS[0], split="val", val_fraction=0.4, seed=1)
    assert set(train.episodes).isdisjoint(val.episodes) and sorted(train.episodes + val.episodes) == [0, 1, 2]
    assert {e for e, _ in train.index}.isdisjoint({e for e, _ in val.index})
    again = LeRobotClips(root=root, window=4, camera=fx.CAMERAS[0], split="val", val_fraction=0.4, seed=1)
    assert again.episodes == val.episodes


def test_only_the_served_window_is_decoded(tmp_path):
    root = fx.write_v30(tmp_path / "long", lengths=(30, 100), files=((0, 1),))
    clips = LeRobotClips(root=str(root), camera=fx.CAMERAS[0], window=4, stride=4, split="all")
    last = len(clips) - 1
    item = clips[last]
    assert (item["episode"], item["start"]) == (1, 96)
    # a key frame every 4 frames: at most one group of pictures before the window, never the whole file
    assert clips._video.decoded <= 4 + 4
    red = torch.as_tensor(8.0 * np.arange(96, 100) % 256, dtype=torch.float32)  # uint8 codes wrap around
    assert torch.allclose(code(item["video"])[:, 0], red, atol=4)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 1-core CI machines
def test_dataloader_workers_match_one_process(both):
    clips = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=4, stride=2, split="all")
    clips[0]  # a container opened in the parent: workers must open their own
    one = list(DataLoader(clips, batch_size=4, num_workers=0))
    two = list(DataLoader(clips, batch_size=4, num_workers=2))
    for a, b in zip(one, two):
        for key in ("video", "action", "proprio", "episode", "start"):
            assert torch.equal(a[key], b[key]), key
        assert a["prompt"] == b["prompt"] and isinstance(a["prompt"][0], str)


def test_task_strings_are_the_text_condition(both):
    """A batch's ``prompt`` is what text-conditioned backbones (wan22_ti2v, easyanimate) turn into prompts."""
    from workbench.backbones.diffusers_bridge import prompts_from

    clips = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=4, stride=4, split="all")
    batch = next(iter(DataLoader(clips, batch_size=4)))
    prompts = prompts_from(batch, "prompt", None, "a robot arm: {}", 4, "test")
    assert prompts == [f"a robot arm: {fx.TASKS[int(e) % 2]}" for e in batch["episode"]]


def test_registered_and_config_validated(both):
    clips = build("dataset", "lerobot", {"root": str(both[1]), "camera": fx.CAMERAS[0], "window": 4})
    assert isinstance(clips, LeRobotClips)
    with pytest.raises(ConfigError, match=r"dataset\.config\.camra: unknown key.*Did you mean 'camera'"):
        build("dataset", "lerobot", {"root": str(both[1]), "camra": "x"})
    with pytest.raises(ConfigError, match=r"size: must be \[height, width\]"):
        build("dataset", "lerobot", {"root": str(both[1]), "size": [64]})


# ------------------------------------------------------------------------------------------- errors
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_info_json(tmp_path, both):
    root = _copy(both[1], tmp_path / "ds")
    (root / "meta" / "info.json").unlink()
    with pytest.raises(DataError, match=r"ds/meta/info\.json is missing: .* is not a LeRobot dataset"):
        LeRobotClips(root=str(root))


def test_unknown_codebase_version(tmp_path, both):
    root = _copy(both[1], tmp_path / "ds")
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v1.6"}))
    with pytest.raises(DataError, match=r"info\.json: codebase_version 'v1\.6' is not a LeRobot layout this "
                                        r"workbench reads; supported: v2\.0, v2\.1, v3\.0"):
        LeRobotClips(root=str(root))


def test_unknown_camera_lists_the_cameras(both):
    with pytest.raises(DataError, match=r"info\.json: camera 'observation\.images\.frnt' is not a video feature of "
                                        r"this dataset\. Cameras: 'observation\.images\.front', "
                                        r"'observation\.images\.wrist'\. Did you mean .*'observation\.images\.front'"):
        LeRobotClips(root=str(both[0]), camera="observation.images.frnt")
    with pytest.raises(DataError, match=r"has 2 cameras .*choose one with `camera:`"):
        LeRobotClips(root=str(both[0]))


def test_unknown_action_feature(both):
    with pytest.raises(DataError, match=r"actions: 'actions' is not a feature of this dataset\. Numeric features: "
                                        r".*Did you mean 'action'"):
        LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], actions="actions")


def test_action_width_must_match_the_adapter(both):
    from conftest import tiny_base

    from workbench.adapters.latent_residual import LatentResidual
    from workbench.core.composers import GatedResidual
    from workbench.train import AdapterExperiment, TrainingConfig

    base = tiny_base(image_size=16, frames=4)
    clips = LeRobotClips(root=str(both[1]), camera=fx.CAMERAS[0], window=4, split="all", size=[16, 16])
    exp = AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1, dim=4), composer=GatedResidual(),
                            training=TrainingConfig(steps=1, batch_size=2, progress=False))
    with pytest.raises(DataError, match=r"info\.json: feature 'action' \(actions: action\) has width 5, but the "
                                        r"adapter \(LatentResidual\) declares Condition 'action' with dim=4\. Set "
                                        r"the adapter's dim: 5, as no feature of this dataset has width 4 \(its "
                                        r"numeric features: 'action' \(5\), 'episode_index' \(1\), 'frame_index' "
                                        r"\(1\), 'index' \(1\), 'observation\.state' \(7\), 'task_index' \(1\), "
                                        r"'timestamp' \(1\)\)\.$"):
        exp.fit(clips, steps=1)
    one = AdapterExperiment(base=tiny_base(image_size=16, frames=4), adapter=LatentResidual(width=16, depth=1, dim=7),
                            composer=GatedResidual(), training=TrainingConfig(steps=1, batch_size=2, progress=False))
    with pytest.raises(DataError, match=r"Set the adapter's dim: 5, or choose a feature of width 7 for `actions:` "
                                        r"\(this dataset's: 'observation\.state'\)\.$"):
        one.fit(clips, steps=1)
    ok = AdapterExperiment(base=tiny_base(image_size=16, frames=4), adapter=LatentResidual(width=16, depth=1, dim=5),
                           composer=GatedResidual(), training=TrainingConfig(steps=1, batch_size=2, progress=False))
    ok.fit(clips, steps=1)
    assert ok.step == 1


def test_episodes_shorter_than_the_window(both):
    with pytest.raises(DataError, match=r"episode_000001\.parquet: episode 1 has 9 frames at 10 fps, shorter than "
                                        r"window=10 \(1 of the 3 episodes .*\)\. Use window <= 9"):
        LeRobotClips(root=str(both[0]), camera=fx.CAMERAS[0], window=10, split="all")
    kept = LeRobotClips(root=str(both[0]), camera=fx.CAMERAS[0], window=10, split="all", drop_short=True)
    assert kept.episodes == [0, 2]


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_or_truncated_mp4(tmp_path, both, damage):
    root = _copy(both[1], tmp_path / "ds")
    video = root / "videos" / fx.CAMERAS[0] / "chunk-000" / "file-001.mp4"
    data = video.read_bytes()
    video.write_bytes(b"\x00garbage" * 50 if damage == "garbage" else data[: len(data) // 2])
    clips = LeRobotClips(root=str(root), camera=fx.CAMERAS[0], window=4, stride=4, split="all")
    last = len(clips) - 1  # episode 2 lives in file-001
    assert clips[0]["video"].shape[1] == 4  # the other file is fine
    with pytest.raises(DataError, match=r"file-001\.mp4: .*(corrupt or truncated|truncated)"):
        clips[last]


def test_imports_stay_light():
    code = ("import sys, workbench, workbench.data, workbench.data.lerobot, workbench.data.lerobot_write, "
            "workbench.data.sources; heavy = [m for m in ('pyarrow', 'av', 'h5py') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------------- what LeRobot writes and checks
def reference_quantile(values: np.ndarray, q: float, bins: int = 5000) -> float:
    """From the definition LeRobot uses: the value below which ``q * len(values)`` values fall on a histogram of
    ``bins`` equal bins over the values' range (widened by 1e-10 each side), linear inside the bin."""
    low, high = float(values.min()) - 1e-10, float(values.max()) + 1e-10
    width = (high - low) / bins
    counts = np.zeros(bins, np.int64)
    for v in values.tolist():
        counts[min(int((v - low) / width), bins - 1)] += 1
    target, seen = q * len(values), 0
    for k, c in enumerate(counts.tolist()):
        if seen + c >= target:
            return low if k == 0 else low + k * width + (target - seen) / c * width
        seen += c
    return high


def _written(tmp_path: Path) -> tuple[Path, dict[int, np.ndarray], dict[int, np.ndarray]]:
    from workbench.data.lerobot_write import LeRobotWriter

    rng = np.random.default_rng(7)
    actions, frames = {}, {}
    with LeRobotWriter(tmp_path / "ds", 10, {"action": ("float32", ["dx", "dy"]), "next.reward": ("float32", None)},
                       ["observation.images.main"]) as writer:
        for e, n in enumerate((9, 14, 1)):
            actions[e] = rng.normal(size=(n, 2)).astype(np.float32)
            frames[e] = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
            writer.add_episode({"observation.images.main": frames[e]},
                               {"action": actions[e], "next.reward": np.linspace(0, 1, n)}, f"task {e % 2}")
    return tmp_path / "ds", actions, frames


def test_statistics_carry_lerobots_quantiles_per_episode_and_over_the_dataset(tmp_path):
    import pyarrow.parquet as pq

    root, actions, frames = _written(tmp_path)
    rows = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    info = json.loads((root / "meta" / "info.json").read_text())
    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert fx.lerobot_stats_problems(stats, info) == []
    for e, row in enumerate(rows):
        n = len(actions[e])
        assert row["stats/action/count"] == [n] and row["stats/observation.images.main/count"] == [n]
        assert row["stats/action/min"] == pytest.approx(actions[e].min(0).tolist(), abs=1e-7)
        assert row["stats/action/mean"] == pytest.approx(actions[e].mean(0).tolist(), abs=1e-6)
        assert row["stats/frame_index/max"] == [n - 1.0]
        for q in (0.01, 0.10, 0.50, 0.90, 0.99):
            got = row[f"stats/action/q{round(q * 100):02d}"]
            bin_width = (actions[e].max(0) - actions[e].min(0)) / 5000
            want = ([reference_quantile(actions[e][:, d], q) for d in range(2)] if n > 1
                    else actions[e].mean(0).tolist())  # one row: every quantile is the mean
            assert np.allclose(got, want, atol=float(bin_width.max()) + 1e-6), (e, q, got, want)
        pixels = frames[e].reshape(-1, 3) / 255.0  # every frame of an episode this short is sampled
        assert np.asarray(row["stats/observation.images.main/mean"]).shape == (3, 1, 1)
        assert np.allclose(np.ravel(row["stats/observation.images.main/mean"]), pixels.mean(0), atol=1e-6)
        q90 = [reference_quantile(pixels[:, c] * 255, 0.9) / 255 for c in range(3)]
        assert np.allclose(np.ravel(row["stats/observation.images.main/q90"]), q90, atol=2 / 5000)
    everything = np.concatenate(list(actions.values()))
    counts = np.array([len(a) for a in actions.values()], np.float64)
    action = stats["action"]
    assert action["count"] == [len(everything)] and action["min"] == everything.min(0).tolist()
    assert np.allclose(action["mean"], everything.mean(0), atol=1e-6)
    assert np.allclose(action["std"], everything.std(0), atol=1e-5)
    for key in ("q01", "q10", "q50", "q90", "q99"):  # the count-weighted mean of the episodes' (lerobot 0.6.1)
        per_episode = np.array([row[f"stats/action/{key}"] for row in rows])
        assert np.allclose(action[key], (per_episode * counts[:, None]).sum(0) / counts.sum(), atol=1e-12)
    assert stats["next.reward"]["q99"] != stats["next.reward"]["q01"]


def test_a_dataset_lerobot_extends_still_opens_and_keeps_lerobots_columns(tmp_path):
    """LeRobot appends an episode in new files (``RULES["on_resume"]``) and then opens every meta/episodes file as
    one table: their columns must be the same, names and types, or it fails with a CastError."""
    import pyarrow.parquet as pq

    from workbench.data.importer import import_folder
    from workbench.data.video_io import H264Writer

    src = tmp_path / "src"
    src.mkdir()
    for e in range(2):
        writer = H264Writer(src / f"ep{e}.mp4", 10, 16, 16)
        writer.write(np.full((6, 16, 16, 3), 40 + 80 * e, np.uint8))
        writer.close()
        np.save(src / f"ep{e}.npy", np.full((6, 2), e, np.float32))
    root = tmp_path / "ours"
    import_folder(src, root, window=4)
    info = json.loads((root / "meta" / "info.json").read_text())
    assert set(info) <= set(fx.RULES["info_keys"])  # LeRobot drops any other key when it rewrites info.json
    video = info["features"]["observation.images.main"]["info"]
    assert set(video) == set(fx.RULES["video_info_keys"]) and video["is_depth_map"] is False
    ours = root / "meta/episodes/chunk-000/file-000.parquet"
    columns = {f.name: fx.arrow_type(f.type) for f in pq.read_schema(ours)}
    assert columns == fx.expected_episode_columns(info)  # no column of ours is missing, none is extra
    extra = json.loads((root / "meta" / "workbench.json").read_text())
    assert [e["source"] for e in extra["episodes"]] == ["ep0", "ep1"] and extra["window"] == 4

    action = np.stack([np.arange(5), -np.arange(5)], 1).astype(np.float32)
    theirs = fx.append_episode(root, {"observation.images.main": np.full((5, 16, 16, 3), 200, np.uint8)},
                               {"action": action}, "a task of LeRobot's")
    assert theirs.name == "file-001.parquet"
    assert {f.name: fx.arrow_type(f.type) for f in pq.read_schema(theirs)} == columns
    assert fx.lerobot_stats_problems(json.loads((root / "meta" / "stats.json").read_text()), info) == []
    clips = LeRobotClips(root=str(root), window=4, stride=1, split="all")
    assert [e.index for e in clips.meta.episodes] == [0, 1, 2]
    appended = [clips[i] for i in range(len(clips)) if clips[i]["episode"] == 2]
    assert [c["start"] for c in appended] == [0, 1] and appended[0]["task"] == "a task of LeRobot's"
    assert torch.equal(appended[1]["action"], torch.from_numpy(action[1:5]))
    assert abs(float(code(appended[0]["video"]).mean()) - 200) < 3
    first = clips[0]
    assert first["episode"] == 0 and torch.equal(first["action"], torch.zeros(4, 2))


# --------------------------------------------------------------------------- LeRobot's own reader
def _lerobot_items(root: Path, camera: str, indices: list[int]) -> tuple[list[dict], list[tuple], bool]:
    """Items of LeRobot's own ``LeRobotDataset`` and the (file, times) it asked its video decoder for.

    Where this torchvision has no video reader (LeRobot's ``pyav`` backend needs
    ``torchvision.io.VideoReader``), the requests are still recorded and the frames come back as
    ``None``: the metadata, tables and time arithmetic are still LeRobot's.
    """
    import lerobot.datasets.lerobot_dataset as lerobot_dataset

    requests: list[tuple] = []
    real = lerobot_dataset.decode_video_frames
    decoded = [True]

    def recording(path, timestamps, tolerance_s, backend=None):
        requests.append((Path(path).resolve(), [float(t) for t in timestamps]))
        try:
            return real(path, timestamps, tolerance_s, backend)
        except AttributeError:  # torchvision without io.VideoReader
            decoded[0] = False
            return torch.zeros(len(timestamps), 3, 1, 1)

    theirs = lerobot_dataset.LeRobotDataset("local/test", root=root, video_backend="pyav")
    lerobot_dataset.decode_video_frames = recording
    try:
        items = [theirs[i] for i in indices]
    finally:
        lerobot_dataset.decode_video_frames = real
    return items, [r for r in requests if camera in r[0].parts], decoded[0]  # it decodes every camera


def _cross_check(root: Path, camera: str, lengths, clips: int | None = None) -> None:
    ours = LeRobotClips(root=str(root), camera=camera, window=4, stride=4, split="all", state=None)
    served = []
    for i in range(len(ours) if clips is None else clips):
        item = ours[i]
        e = ours.index[i][0]
        first = sum(lengths[:e]) + item["start"]
        served += [(item, k, first + k) for k in range(4)]
    theirs, requests, decoded = _lerobot_items(root, camera, [g for _, _, g in served])
    for (item, k, _), ref, (path, times) in zip(served, theirs, requests):
        assert torch.equal(item["action"][k], ref["action"])  # exact
        assert item["task"] == ref["task"] and item["episode"] == int(ref["episode_index"])
        position = [p for p, ep in enumerate(ours.meta.episodes) if ep.index == item["episode"]][0]
        video, offset = ours.meta.episodes[position].videos[camera]
        assert path == video.resolve()
        want = offset + ours.frames_of[position]["timestamp"][item["start"] + k]
        assert times == pytest.approx([want], abs=1e-6)  # the same time in the same file
        if decoded:
            assert torch.allclose((item["video"][:, k] + 1) / 2, ref[camera], atol=1.5 / 255)


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is None,
                    reason="lerobot is not installed: its releases pin torch<2.11, diffusers<0.36 and "
                           "huggingface-hub<0.36, which conflict with this stack (constraints.txt); the reader "
                           "follows its layout with pyarrow + PyAV")
def test_lerobot_reads_what_we_read(both, sample_lerobot):
    """Where LeRobot itself installs, its LeRobotDataset reads the test layout and our writer's output as we do."""
    _cross_check(both[1], fx.CAMERAS[1], fx.LENGTHS)  # LeRobot reads v3.0 only (it converts v2.1 first)
    _cross_check(sample_lerobot, "observation.images.corner2_close", [48] * 60, clips=30)


# ------------------------------------------------------------------ Meta-World → LeRobot → workbench
def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB of two videos in [-1, 1] (as uint8 levels)."""
    mse = float(((a - b) * 127.5).pow(2).mean())
    return 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def sample_lerobot(tmp_path_factory):
    """The shipped Meta-World sample (60 episodes × 48 frames, 64×64) written as a LeRobot v3.0 dataset."""
    pytest.importorskip("h5py")
    from workbench.worldmodel.generate import metaworld_to_lerobot

    return metaworld_to_lerobot("sample", tmp_path_factory.mktemp("sample") / "metaworld_lerobot")


def compare_with_hdf5(root: Path, h5: str, split: str = "all", stride: int = 16) -> list[float]:
    """Every clip of the LeRobot copy against the HDF5 file's: exact signals, the frames' PSNR per clip. With the
    stride the window (the shipped sample's 48-frame episodes), the clips tile each episode: every frame and signal
    is compared once."""
    from workbench.data.metaworld import MetaWorldClips

    ours = LeRobotClips(root=str(root), window=16, stride=stride, split=split, ee_pos="observation.ee_pos")
    ref = MetaWorldClips(path=h5, window=16, stride=stride, split=split)
    assert ours.index == ref.index and len(ours) > 0
    assert ours.train_episodes == ref.train_episodes  # the same split rule on the same task names
    db = []
    for i in range(len(ours)):
        a, b = ours[i], ref[i]
        assert torch.equal(a["action"], b["action"])  # exact
        assert torch.equal(a["proprio"], b["proprio"]) and torch.equal(a["ee_pos"], b["ee_pos"])
        assert (a["episode"], a["start"], a["task"]) == (b["episode"], b["start"], b["task"])
        db.append(psnr(a["video"], b["video"]))
    return db


def test_shipped_sample_round_trip(sample_lerobot):
    info = json.loads((sample_lerobot / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 60 and info["fps"] == 40
    video = info["features"]["observation.images.corner2_close"]
    assert video["dtype"] == "video" and video["info"]["video.codec"] == "h264"
    assert info["features"]["observation.state"]["shape"] == [10]
    stats = json.loads((sample_lerobot / "meta" / "stats.json").read_text())
    assert len(stats["action"]["mean"]) == 4 and np.array(stats["observation.images.corner2_close"]["mean"]).shape \
        == (3, 1, 1)
    assert fx.lerobot_stats_problems(stats, info) == []
    import pyarrow.parquet as pq

    schema = pq.read_schema(sample_lerobot / "meta/episodes/chunk-000/file-000.parquet")
    assert {f.name: fx.arrow_type(f.type) for f in schema} == fx.expected_episode_columns(info)
    extra = json.loads((sample_lerobot / "meta" / "workbench.json").read_text())["episodes"]
    assert [e["source_episode"] for e in extra] == list(range(60)) and {e["success"] for e in extra} <= {True, False}
    db = compare_with_hdf5(sample_lerobot, "sample")
    print(f"\nshipped sample via LeRobot v3.0 / H.264 crf 18: PSNR per clip min {min(db):.2f} dB, "
          f"mean {np.mean(db):.2f} dB over {len(db)} clips")
    assert min(db) > 28.0


def _needs_simulator():
    for name in ("metaworld", "mujoco", "h5py"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install './[data]' in a clone)")


def test_generator_writes_lerobot_with_the_same_rollouts(tmp_path):
    _needs_simulator()
    from workbench.cli import main
    from workbench.worldmodel.generate import generate
    from workbench.worldmodel.sim import RenderingUnavailable

    args = dict(tasks="reach-v3,push-v3", episodes=2, frames=20, size=32, seed=3)
    try:
        h5 = generate(tmp_path / "rollouts.h5", progress=False, **args)
    except RenderingUnavailable as err:
        pytest.skip(str(err))
    out = tmp_path / "lerobot"
    argv = ["data", "metaworld", "--format", "lerobot", "--out", str(out), "--no-progress", "--tasks", args["tasks"],
            "--episodes", "2", "--frames", "20", "--size", "32", "--seed", "3"]
    assert main(argv) == 0
    assert not (tmp_path / "lerobot.rollouts.h5").exists()  # the intermediate file is gone
    db = compare_with_hdf5(out, str(h5), stride=4)  # clips at frames 0 and 4 of 20: every frame
    print(f"\ngenerated via LeRobot: PSNR per clip min {min(db):.2f} dB, mean {np.mean(db):.2f} dB")
    assert min(db) > 25.0
    assert main(argv) == 2  # --out exists: refused, nothing overwritten


def test_yaml_config_trains_and_resumes_bit_exactly(sample_lerobot, tmp_path):
    import yaml

    from workbench.cli import main

    config = yaml.safe_load((ROOT / "examples" / "configs" / "lerobot_world_model.yaml").read_text())
    assert config["data"]["type"] == "lerobot"
    config["data"]["config"]["root"] = str(sample_lerobot)
    config["training"].update(batch_size=2, warmup_steps=1, checkpoint_every=100)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", str(path), "--steps", "4", "--output", str(one), "--quiet"]) == 0
    assert main(["train", str(path), "--steps", "2", "--output", str(two), "--quiet"]) == 0
    assert main(["train", str(path), "--steps", "4", "--output", str(two), "--resume", "--quiet"]) == 0
    a = json.loads((one / "step-0000004" / "meta.json").read_text())["loss_history"]
    b = json.loads((two / "step-0000004" / "meta.json").read_text())["loss_history"]
    assert len(a) == 4 and a == b
    assert (one / "step-0000004" / "trainable.safetensors").read_bytes() == \
        (two / "step-0000004" / "trainable.safetensors").read_bytes()


def test_demo_takes_a_lerobot_directory(sample_lerobot, tmp_path):
    from workbench.cli import build_parser
    from workbench.worldmodel.demo import DemoConfig, run_demo

    camera = "observation.images.corner2_close"
    args = build_parser().parse_args(["demo", "--data", str(sample_lerobot), "--camera", camera])
    assert (args.data, args.camera) == (str(sample_lerobot), camera)
    out = tmp_path / "demo"
    cfg = DemoConfig.quick(output=str(out), data=str(sample_lerobot), camera=camera, steps=2, sampling_steps=2,
                           batch_size=2)
    metrics = run_demo(cfg, progress=False)
    assert metrics["evaluation"]["data"] == str(sample_lerobot) and metrics["training"]["steps"] == 2
    assert metrics["summary"]["clips"] == 4 and (out / "side_by_side.mp4").exists()
    from workbench.worldmodel.demo import wrote

    line = wrote(str(out), metrics)  # what `workbench demo` prints: no unseen/ (that step is Meta-World's)
    assert "unseen" not in line and not (out / "unseen").exists()
    assert line == f"wrote {out}/: side_by_side.mp4, side_by_side.gif, loss.png, metrics.json, run/ (checkpoint)"


def test_open_clips_reads_either_kind(sample_lerobot, tmp_path):
    from workbench.data.metaworld import MetaWorldClips
    from workbench.data.sources import open_clips

    lr = open_clips(sample_lerobot, window=16, stride=16, split="val", size=(64, 64))
    h5 = open_clips("sample", window=16, stride=16, split="val", size=(64, 64))
    assert isinstance(lr, LeRobotClips) and isinstance(h5, MetaWorldClips)
    assert lr.index == h5.index and torch.equal(lr[3]["action"], h5[3]["action"])
    with pytest.raises(DataError, match=r"is not a LeRobot dataset\. --data takes"):
        open_clips(tmp_path, window=16, stride=16)
    with pytest.raises(DataError, match=r"holds 64x64 frames, but 32x32 are needed"):
        open_clips("sample", window=16, stride=16, size=(32, 32))


def test_open_video_files_are_capped(both, monkeypatch):
    from workbench.data import video_io

    monkeypatch.setattr(video_io, "MAX_OPEN", 2)
    clips = LeRobotClips(root=str(both[0]), camera=fx.CAMERAS[1], window=4, stride=4, split="all")
    for i in range(len(clips)):  # three per-episode files, at most two open at a time
        item = clips[i]
        assert len(clips._video._open) <= 2
        want = torch.as_tensor(fx.frame_codes(item["episode"], np.arange(item["start"], item["start"] + 4), 1),
                               dtype=torch.float32)
        assert torch.allclose(code(item["video"]), want, atol=4)


def test_eval_scores_a_lerobot_directory_as_it_scores_the_hdf5_file(sample_lerobot, tmp_path, capsys):
    """`workbench eval RUN --data DIR`: the same held-out clips, the action error scored from the dataset's
    ee_pos feature, and the numbers of the HDF5 path within the codec's error."""
    from workbench.cli import main
    from workbench.worldmodel.demo import TRAINED_ADAPTER

    common = ["--stride", "48", "--clips", "2", "--sampling-steps", "2", "--no-progress"]
    assert main(["eval", str(TRAINED_ADAPTER), "--data", str(sample_lerobot), *common,
                 "--out", str(tmp_path / "lerobot")]) == 0
    assert main(["eval", str(TRAINED_ADAPTER), "--data", "sample", *common, "--out", str(tmp_path / "h5")]) == 0
    capsys.readouterr()
    ours, ref = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("lerobot", "h5"))
    assert ours["evaluation"]["data"] == "metaworld_lerobot"
    assert [(it["episode"], it["start"]) for it in ours["per_clip"]["items"]] == \
        [(it["episode"], it["start"]) for it in ref["per_clip"]["items"]]
    # whole-frame PSNR and the action error; the moving-pixel mask follows the codec's noise on the
    # first frame, so moving-pixel PSNR moves by up to 2 dB on two clips and is not compared
    for key in ("base_psnr", "adapter_psnr", "base_action_error", "adapter_action_error"):
        found, expected = ours["per_clip"][key], ref["per_clip"][key]
        assert np.all(np.isfinite(found)) and np.allclose(found, expected, atol=1.0), (key, found, expected)


def test_the_demo_draws_the_action_path_only_with_a_calibration_and_the_hand_position(sample_lerobot, tmp_path,
                                                                                       capsys):
    """The shipped sample converted to LeRobot keeps its calibration and hand position: the demo's adapter
    draws the action path. Without the calibration it reads the actions alone, and says so."""
    import shutil

    from workbench.worldmodel.demo import DemoConfig, build_experiment

    camera = "observation.images.corner2_close"
    exp = build_experiment(DemoConfig.quick(data=str(sample_lerobot), camera=camera), tmp_path / "a")
    assert exp.model.adapter.path is not None
    assert exp.resolved_config()["data"]["config"]["ee_pos"] == "observation.ee_pos"
    bare = shutil.copytree(sample_lerobot, tmp_path / "bare")
    info = json.loads((bare / "meta" / "info.json").read_text())
    del info["features"][camera]["calibration"]
    (bare / "meta" / "info.json").write_text(json.dumps(info))
    exp = build_experiment(DemoConfig.quick(data=str(bare), camera=camera), tmp_path / "b")
    assert exp.model.adapter.path is None
    assert f"{bare} records no camera calibration, so the adapter reads the actions without the action path" in \
        capsys.readouterr().out
