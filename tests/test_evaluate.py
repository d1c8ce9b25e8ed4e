"""The hand-position probe, the action error, and `workbench eval` on Meta-World files."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from workbench.cli import main
from workbench.data.metaworld import MetaWorldClips, sample_path
from workbench.errors import CheckpointError, DataError
from workbench.worldmodel.common import UNSEEN_PATH, clip_source, load_run
from workbench.worldmodel.demo import TRAINED_ADAPTER
from workbench.worldmodel.evaluate import summarise
from workbench.worldmodel.probe import WEIGHTS, HandProbe, action_error, hand_error_cm, shipped_probe

h5py = pytest.importorskip("h5py")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def val_clips():
    return MetaWorldClips(path="sample", window=16, stride=16, split="val")


# -- the probe ------------------------------------------------------------------------------------

def test_shipped_probe_is_small_and_documented():
    assert WEIGHTS.stat().st_size <= 2**20
    meta = json.loads(WEIGHTS.with_suffix(".json").read_text())
    assert "generator seed 1" in meta["trained_on"]  # pretraining's seed, not the sample's (0)
    assert meta["held_out_error_cm"]["mean"] < 3.0
    assert shipped_probe().provenance == meta


def test_probe_finds_the_hand_on_real_held_out_frames(val_clips):
    """On the sample's validation episodes (a seed the probe never saw) it lands within a few cm."""
    items = [val_clips[i] for i in (0, 5, 10, 20)]
    video = torch.stack([it["video"] for it in items])  # (4, 3, 16, 64, 64) float
    ee = torch.stack([it["ee_pos"] for it in items])  # (4, 16, 3)
    err = hand_error_cm(video, ee)
    assert err.shape == (4, 16)
    assert err.mean() < 4.0
    # the same frames as uint8 channel-last give the same numbers
    from workbench.metrics import to_uint8_video

    assert np.allclose(hand_error_cm(to_uint8_video(video), ee.numpy()), err)
    # a wrong position 10 cm away is seen as (about) 10 cm away
    moved = ee + torch.tensor([0.10, 0.0, 0.0])
    assert 6.0 < hand_error_cm(video, moved).mean() < 14.0
    assert action_error(video, ee) == pytest.approx(err[:, 1:].mean())


def test_action_error_rejects_positions_that_do_not_match_the_frames(val_clips):
    video = val_clips[0]["video"][None]
    with pytest.raises(DataError, match=r"ee_pos has shape \(1, 15, 3\), expected \(1, 16, 3\)"):
        hand_error_cm(video, np.zeros((1, 15, 3)))


def test_probe_command_trains_and_writes_provenance(tmp_path, capsys):
    out = tmp_path / "p.safetensors"
    assert main(["probe", "train", "--data", "sample", "--out", str(out), "--steps", "3", "--batch-size", "4",
                 "--width", "8", "--no-progress"]) == 0
    assert "held-out error" in capsys.readouterr().out
    probe = HandProbe.from_pretrained(out)
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["architecture"] == {"width": 8, "image_size": 64}
    assert meta["held_out"].startswith("12 episodes (15% of each task) x 48 frames")
    # the commands that made it: this one, and the sample's own (as its module documents it)
    assert meta["command"] == ("workbench probe train --data metaworld_sample.h5 --steps 3 --batch-size 4 "
                               "--width 8 --out p.safetensors")
    assert meta["data_command"] == (
        "workbench data metaworld --tasks reach-v3,push-v3,pick-place-v3,door-open-v3,drawer-close-v3,"
        "button-press-topdown-v3 --episodes 60 --frames 48 --size 64 --seed 0 --action-repeat 2 "
        "--out metaworld_sample.h5")
    assert probe.positions(np.zeros((2, 64, 64, 3), np.uint8)).shape == (2, 3)
    with pytest.raises(CheckpointError, match="Probe weights not found: .*add --target object for an object probe"):
        HandProbe.from_pretrained(tmp_path / "missing.safetensors")


def test_an_object_probe_learns_the_position_the_raw_observations_record(tmp_path, capsys):
    """--target object regresses the object's position, columns 4:7 of the file's raw observations ('obs', beside
    the schema): the probe's output scale is their mean over the training episodes."""
    from workbench.data.metaworld import split_episodes
    from workbench.worldmodel.probe import ProbeTrainConfig

    out = tmp_path / "object.safetensors"
    assert main(["probe", "train", "--data", "sample", "--target", "object", "--out", str(out), "--steps", "1",
                 "--batch-size", "4", "--width", "8", "--no-progress"]) == 0
    cfg = ProbeTrainConfig(data="sample")
    with h5py.File(sample_path(), "r") as f:
        puck = f["obs"][..., 4:7].astype(np.float32)
        tasks = [t.decode() if isinstance(t, bytes) else str(t) for t in f["task"][()]]
    held = np.zeros(len(tasks), dtype=bool)
    held[split_episodes(tasks, cfg.val_fraction, cfg.seed)[1]] = True
    expected = puck[~held].reshape(-1, 3).mean(0)
    assert np.allclose(HandProbe.from_pretrained(out).mean.numpy(), expected, rtol=0, atol=1e-6)
    assert not np.allclose(expected, shipped_probe().mean.numpy(), atol=1e-2)  # not the hand's


# -- summaries ------------------------------------------------------------------------------------

def test_summary_counts_wins_gains_and_action_error_per_task():
    def arr(*v):
        return np.array(v, dtype=float)

    scores = {"base": {"psnr": arr(10, 10, 10, 10), "ssim": np.full(4, 0.5), "moving_psnr": arr(10, 11, 12, np.nan),
                       "action_error": arr(8, 8, 6, 6)},
              "adapter": {"psnr": np.full(4, 12.0), "ssim": np.full(4, 0.6), "moving_psnr": arr(12, 13, 11, np.nan),
                          "action_error": arr(4, 4, 3, 3)},
              "swapped": {"psnr": np.full(4, 11.0), "ssim": np.full(4, 0.55), "moving_psnr": arr(11, 11, 12, 5),
                          "action_error": arr(9, 9, 9, 9)}}
    items = [{"task": t, "episode": e, "start": 0} for t, e in (("a", 0), ("a", 1), ("b", 2), ("b", 3))]
    s = summarise({"scores": scores, "moving_fraction": arr(0.1, 0.2, 0.3, 0.0), "items": items,
                   "probe_error": arr(1, 1, 2, 2)}, targets={"gain_db": 1.0, "wins": 0.75, "action_ratio": 0.6})
    assert s["adapter_beats_swapped_fraction"] == pytest.approx(2 / 3)
    assert s["adapter_minus_base_moving_psnr_db"] == pytest.approx(1.0)
    assert s["action_error_adapter_over_base"] == pytest.approx(3.5 / 7)
    assert s["action_error_ratio_to_probe"]["base"] == pytest.approx(7 / 1.5)
    assert s["targets"] == {"adapter_beats_base_by_1db_moving": True, "adapter_beats_swapped_on_75pct_of_clips": False,
                            "action_error_at_most_0.6x_base": True}
    assert s["per_task"]["a"]["clips"] == 2 and s["per_task"]["a"]["adapter_beats_swapped_fraction"] == 1.0
    assert s["per_task"]["b"]["mean"]["adapter"]["action_error"] == pytest.approx(3.0)
    assert s["mean_moving_fraction"] == pytest.approx(0.15)


# -- workbench eval -------------------------------------------------------------------------------

def _check_report(out, clips, tasks):
    metrics = json.loads((out / "metrics.json").read_text())
    s = metrics["summary"]
    assert s["clips"] == clips and sorted(s["per_task"]) == sorted(tasks)
    for variant in ("base", "adapter", "swapped"):
        for metric in ("psnr", "ssim", "moving_psnr", "action_error"):
            values = metrics["per_clip"][f"{variant}_{metric}"]
            assert len(values) == clips and all(np.isfinite(values)), (variant, metric)
    assert all(v > 0 for v in metrics["per_clip"]["probe_error_on_truth_cm"])
    for name in ("side_by_side.mp4", "side_by_side.gif"):
        assert (out / name).stat().st_size > 1000
    return metrics


def test_eval_the_shipped_adapter_on_the_sample(tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", str(TRAINED_ADAPTER), "--data", "sample", "--tasks", "reach-v3,push-v3", "--stride", "48",
                 "--sampling-steps", "4", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "(b) base + adapter, true actions" in printed and "probe on the true frames" in printed
    metrics = _check_report(out, 4, ["push-v3", "reach-v3"])
    assert metrics["evaluation"]["data"] == "metaworld_sample.h5" and metrics["evaluation"]["split"] == "val"
    assert len({it["episode"] for it in metrics["per_clip"]["items"]}) == 4  # one clip per episode


def test_eval_on_a_freshly_generated_file_of_unseen_tasks(tmp_path, capsys):
    for name in ("metaworld", "mujoco"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    from workbench.worldmodel.generate import generate
    from workbench.worldmodel.sim import RenderingUnavailable

    try:
        path = generate(tmp_path / "unseen.h5", tasks="drawer-open-v3,window-open-v3", episodes=2, frames=16,
                        size=64, seed=5, action_repeat=2, progress=False)
    except RenderingUnavailable as err:
        pytest.skip(str(err))
    out = tmp_path / "eval"
    assert main(["eval", str(TRAINED_ADAPTER), "--data", str(path), "--split", "all", "--sampling-steps", "4",
                 "--out", str(out), "--no-progress"]) == 0
    _check_report(out, 2, ["drawer-open-v3", "window-open-v3"])


def test_the_shipped_unseen_file_holds_six_other_tasks():
    clips = clip_source("unseen", window=16, split="all")
    seen = set(MetaWorldClips(path="sample", window=16, split="all").task_names)
    assert len(set(clips.task_names)) == 6 and not set(clips.task_names) & seen
    assert clips.attrs["seed"] not in (0, 1) and clips.path == UNSEEN_PATH


def _copy_sample(path, frames=48, **attrs):
    with h5py.File(sample_path()) as src, h5py.File(path, "w") as dst:
        for name in ("frames", "actions", "ee_pos", "proprio"):
            dst.create_dataset(name, data=src[name][:4, :frames])
        dst.create_dataset("task", data=src["task"][:4], dtype=h5py.string_dtype())
        dst.attrs.update({k: v for k, v in src.attrs.items()})
        dst.attrs.update(attrs)
    return path


@pytest.mark.parametrize("change, pattern", [
    (dict(schema_version=2), r"schema_version 2 is newer than this workbench reads \(1\)"),
    (dict(schema_version=0), r"schema_version 0 is older than this workbench reads \(1\); regenerate it"),
    (dict(frames=12), r"episodes have T=12 frames, shorter than window=16"),
])
def test_eval_explains_a_file_it_cannot_use(tmp_path, capsys, change, pattern):
    path = _copy_sample(tmp_path / "bad.h5", **change)
    assert main(["eval", str(TRAINED_ADAPTER), "--data", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(__import__("re").findall(pattern, err)) == 1, err


def test_eval_explains_a_run_dir_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no adapter checkpoint \(no step-\*/ directory, no LATEST\)"):
        load_run(tmp_path / "run")
    assert main(["eval", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "Run directory not found" in capsys.readouterr().err


def test_eval_rejects_clips_of_another_length():
    from workbench.train.experiment import AdapterExperiment
    from workbench.worldmodel.evaluate import evaluate_world_model

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    clips = MetaWorldClips(path="sample", window=8, stride=8, split="val")
    with pytest.raises(DataError, match=r"Clips have 8 frames of 64x64, but TinyVideo predicts clips of 16 frames of "
                                        r"64x64 \(its clip\(\), from its card's sampling defaults\); build the clip "
                                        r"source with window=16 and size=\(64, 64\)"):
        evaluate_world_model(exp, clips, sampling_steps=2, progress=False)


def test_gate_scale_one_is_the_learned_gate_and_needs_a_gate():
    from workbench import Replace
    from workbench.train.experiment import AdapterExperiment
    from workbench.worldmodel.evaluate import evaluate_world_model, scaled_gate

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    clips = torch.utils.data.Subset(clip_source("sample", window=16, split="val", stride=48), [0, 1])
    plain = evaluate_world_model(exp, clips, sampling_steps=2, progress=False)
    same = evaluate_world_model(exp, clips, sampling_steps=2, progress=False, gate_scale=1.0)
    double = evaluate_world_model(exp, clips, sampling_steps=2, progress=False, gate_scale=2.0)
    assert np.array_equal(plain["adapter"], same["adapter"]) and np.array_equal(plain["base"], double["base"])
    assert not np.array_equal(plain["adapter"], double["adapter"])
    assert exp.model.composer.gate_values() == AdapterExperiment.load(TRAINED_ADAPTER).model.composer.gate_values()
    from workbench.errors import CompositionError

    with pytest.raises(CompositionError, match="gate_scale=2.0 needs a learned gate"):
        scaled_gate(Replace(), 2.0)


def test_eval_swaps_the_control_video_for_an_adapter_that_reads_one(tmp_path, capsys):
    """``--control edges``: each clip carries its edge video, all three predictions get it, (c) swaps it. A
    ControlNet reading the edges changes with them; the shipped action adapter, which does not read them, gives
    (b) == (c) exactly."""
    from workbench import AdapterExperiment, TrainingConfig
    from workbench.adapters.controlnet import ControlNet
    from workbench.backbones.tiny_video import TinyVideo
    from workbench.worldmodel.evaluate import evaluate_world_model

    torch.manual_seed(0)
    exp = AdapterExperiment(base=TinyVideo.from_pretrained(),
                            adapter=ControlNet(condition="control", aliases=(), video=True, dim=1),
                            training=TrainingConfig(steps=3, learning_rate=1e-2, batch_size=2, progress=False,
                                                    output_dir=str(tmp_path / "run")))
    exp.fit(MetaWorldClips(path="sample", window=16, stride=48, split="train", control="edges"))
    exp.save_checkpoint()
    out = tmp_path / "eval"
    assert main(["eval", str(tmp_path / "run"), "--data", "sample", "--tasks", "reach-v3,push-v3", "--stride", "48",
                 "--sampling-steps", "2", "--control", "edges", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "(b) base + adapter, true control" in printed and "(c) adapter, swapped control" in printed
    metrics = _check_report(out, 4, ["push-v3", "reach-v3"])
    assert metrics["evaluation"]["swapped"] == "control"
    assert metrics["per_clip"]["adapter_moving_psnr"] != metrics["per_clip"]["swapped_moving_psnr"]

    shipped = AdapterExperiment.load(TRAINED_ADAPTER)
    clips = torch.utils.data.Subset(clip_source("sample", window=16, split="val", stride=48, control="edges"), [0, 6])
    result = evaluate_world_model(shipped, clips, sampling_steps=2, progress=False, condition="control")
    assert np.array_equal(result["adapter"], result["swapped"])  # the action adapter does not read the edges
    assert not np.array_equal(result["adapter"], result["base"])
    with pytest.raises(DataError, match=r"The clips carry no 'control' to swap in \(c\); they hold \['action', "):
        evaluate_world_model(shipped, torch.utils.data.Subset(clip_source("sample", window=16, split="val"), [0, 6]),
                             sampling_steps=2, progress=False, condition="control")


def test_the_robot_state_reaches_a_prediction_as_measured_at_the_first_frame():
    """A clip's ee_pos / proprio are given to every prediction, with each frame holding the first frame's value:
    nothing of the future state leaks into a prediction, whatever the adapter reads."""
    from workbench.train.experiment import AdapterExperiment
    from workbench.worldmodel.evaluate import evaluate_world_model

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    given = []
    base = exp.model.base
    prepare = base.prepare_batch
    base.prepare_batch = lambda raw: given.append(raw) or prepare(raw)
    clips = torch.utils.data.Subset(clip_source("sample", window=16, split="val", stride=48), [0, 6])
    evaluate_world_model(exp, clips, sampling_steps=1, progress=False)
    assert len(given) == 3
    for raw in given:
        for key, width in (("ee_pos", 3), ("proprio", 10)):
            first = torch.stack([clips[i][key][0] for i in range(2)])
            assert raw[key].shape == (2, 16, width) and torch.equal(raw[key], first[:, None].expand(2, 16, width))
        assert torch.equal(raw["action"], torch.stack([clips[i]["action"] for i in range(2)])) or raw is given[2]


# -- which clips, and how the video labels them --------------------------------------------------------------
class _Clips:
    """What :func:`spread_over_tasks` reads of a clip source: ``(episode, start)`` per clip, a task per episode."""

    def __init__(self, clips_per_episode: list[int], tasks: list[str]):
        self.index = [(e, 8 * k) for e, n in enumerate(clips_per_episode) for k in range(n)]
        self.task_names = tasks

    def __len__(self) -> int:
        return len(self.index)


def test_a_few_clips_of_one_task_come_from_several_episodes():
    from workbench.worldmodel.common import spread_over_tasks, swap_partner

    source = _Clips([6, 2, 5], ["my_videos"] * 3)  # one task, a long first episode: where --clips 4 failed
    chosen = spread_over_tasks(source, 4)
    assert [source.index[i] for i in chosen] == [(0, 0), (0, 8), (1, 0), (2, 0)]
    swap_partner([source.index[i][0] for i in chosen])  # (c) finds actions of another episode for each
    two_tasks = _Clips([3, 3, 3, 3], ["push", "reach", "push", "reach"])
    assert [two_tasks.index[i] for i in spread_over_tasks(two_tasks, 4)] == [(0, 0), (1, 0), (2, 0), (3, 0)]


def test_the_side_by_side_labels_each_row_as_the_table_does(tmp_path, monkeypatch):
    import workbench.media as media
    from workbench.worldmodel.evaluate import write_videos

    drawn = {}
    monkeypatch.setattr(media, "label_grid", lambda rows, row_labels, col_labels, scale: drawn.update(
        rows=row_labels, columns=col_labels) or np.zeros((1, 8, 8, 3), np.uint8))
    monkeypatch.setattr(media, "write_video", lambda path, frames, fps: path)
    frames = np.zeros((1, 2, 8, 8, 3), np.uint8)
    result = {"truth": frames, "base": frames, "adapter": frames, "swapped": frames,
              "items": [{"task": "push-v3", "episode": 3, "start": 16}],
              "scores": {"base": {"moving_psnr": [11.0]}, "adapter": {"moving_psnr": [14.5]},
                         "swapped": {"moving_psnr": [12.25]}}}
    write_videos(tmp_path, result, clips=1, fps=10)
    assert drawn["columns"] == ["truth", "(a) base alone", "(b) adapter,\ntrue actions", "(c) adapter,\nswapped"]
    assert drawn["rows"] == ["push\nep 3 t16\nmoving PSNR\na 11.0\nb 14.5\nc 12.2"]
