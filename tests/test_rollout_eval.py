"""`workbench eval RUN --rollout`: the shipped long held-out episodes, rolled out chunk by chunk (base, adapter,
swapped actions), scored per chunk (moving PSNR, hand error via the probe), with a table, a JSON and a drift
plot — on small sizes (two episodes, two chunks, two sampling steps). And on your own data: a dataset made by
the importer from videos of several lengths with their actions and states, and a tiny run trained on it."""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
import torch
from conftest import TINY, cli, perturb, tiny_base

from workbench.errors import DataError
from workbench.worldmodel.demo import TRAINED_ADAPTER
from workbench.worldmodel.rollout_eval import (
    LONG_PATH,
    evaluate_rollouts,
    format_rollout_table,
    long_episodes,
    rollout_state,
    summarise_rollouts,
)


@pytest.fixture(scope="module")
def exp():
    from workbench import AdapterExperiment

    return AdapterExperiment.load(TRAINED_ADAPTER)


def test_the_long_sample_is_twelve_held_out_episodes_of_the_training_tasks():
    assert LONG_PATH.stat().st_size <= 3 * 2**20
    with h5py.File(LONG_PATH, "r") as f, h5py.File(LONG_PATH.with_name("metaworld_sample.h5"), "r") as g:
        assert f["frames"].shape == (12, 144, 64, 64, 3) and f["actions"].shape == (12, 144, 4)
        assert sorted({t.decode() if isinstance(t, bytes) else t for t in f["task"][:]}) == sorted(
            {t.decode() if isinstance(t, bytes) else t for t in g["task"][:]})
        assert f.attrs["seed"] != g.attrs["seed"]  # episodes of their own: not the adapter's or the probe's
        same = ("camera", "action_repeat", "size")
        assert {k: f.attrs[k] for k in same} == {k: g.attrs[k] for k in same}
    items = long_episodes("long", frames=31, episodes=3)
    assert len(items) == 3 and items[0]["video"].shape == (3, 31, 64, 64) and items[0]["ee_pos"].shape == (31, 3)
    assert len({it["task"] for it in items}) == 3  # taken in turn from each task
    assert long_episodes("long", episodes=1)[0]["action"].shape == (144, 4)  # whole episodes by default


def test_rollouts_are_scored_per_chunk(exp):
    items = long_episodes("long", frames=31, episodes=2)
    result = evaluate_rollouts(exp, items, steps=2, gate_scale=2.0, progress=False)
    assert result["variants"] == ["base", "adapter", "swapped"]
    assert [list(f)[:1] + list(f)[-1:] for f in result["chunks"]] == [[1, 15], [16, 30]]
    for name in ("base", "adapter", "swapped"):
        assert result[name].shape == (2, 31, 64, 64, 3)
        assert np.array_equal(result[name][:, 0], result["truth"][:, 0])  # the given first frame
        assert result["per_chunk"][name]["hand_error_cm"].shape == (2, 2)
        assert np.isfinite(result["per_chunk"][name]["moving_psnr"]).all()
    # the hand error of a chunk is the mean of the probe's per-frame error over the frames it wrote
    assert result["per_chunk"]["adapter"]["hand_error_cm"][1, 1] == pytest.approx(
        result["hand_error"]["adapter"][1, 16:31].mean())
    assert result["partner"] == [1, 0]
    assert not np.array_equal(result["adapter"], result["swapped"])
    summary = summarise_rollouts(result)
    assert [row["frames"] for row in summary["chunks"]] == [[1, 15], [16, 30]]
    assert summary["first_chunk_base_cm"] == pytest.approx(result["per_chunk"]["base"]["hand_error_cm"][:, 0].mean())
    table = format_rollout_table(summary, result["variants"], "long")
    assert "hand error cm:" in table and "adapter at the last chunk:" in table and table.count("\n") == 4


def test_the_recorded_ceiling_and_a_variant_subset(exp):
    items = long_episodes("long", frames=31, episodes=2)
    probe = evaluate_rollouts(exp, items, steps=2, progress=False, variants=("adapter",))
    ceiling = evaluate_rollouts(exp, items, steps=2, progress=False, variants=("adapter",), state="recorded")
    assert probe["variants"] == ceiling["variants"] == ["adapter"]
    assert np.array_equal(probe["adapter"][:, :16], ceiling["adapter"][:, :16])  # chunk 0: the recorded frame-0 state
    assert not np.array_equal(probe["adapter"][:, 16:], ceiling["adapter"][:, 16:])
    assert "goal_last_adapter_below_first_base" not in summarise_rollouts(probe)
    with pytest.raises(DataError, match=r"variants \['nope'\]: choose from base, adapter, swapped, scratch"):
        evaluate_rollouts(exp, items, steps=2, progress=False, variants=("nope",))
    with pytest.raises(DataError, match="The 'scratch' variant needs a from-scratch run: --scratch RUN_DIR"):
        evaluate_rollouts(exp, items, steps=2, progress=False, variants=("scratch",))


def test_the_command_prints_the_table_and_writes_the_json_and_the_plot(tmp_path, capsys):
    from workbench.cli import main

    out = tmp_path / "rollout"
    code = main(["eval", str(TRAINED_ADAPTER), "--rollout", "--frames", "31", "--episodes", "2", "--steps", "2",
                 "--gate-scale", "2", "--variants", "base,adapter", "--out", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "metaworld_long.h5 (all), 2 steps, state=probe, gate x2: 2 episodes of 31 frames, per chunk" in printed
    metrics = json.loads((out / "rollout_metrics.json").read_text())
    assert metrics["evaluation"]["state"] == "probe" and metrics["evaluation"]["episodes"] == 2
    assert len(metrics["summary"]["chunks"]) == 2 and len(metrics["per_episode"]["adapter_hand_error_cm"]) == 2
    assert (out / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    torch.set_num_threads(1)


# -- on your own data ----------------------------------------------------------------------------------------------
#: Frames of each imported episode; the validation split (seeded, by episode) holds episodes 2 and 4.
LENGTHS = (12, 9, 7, 10, 12, 8, 11, 12)
VAL = (2, 4)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A dataset the importer made from 16x16 videos of a square the 2-D actions move, episodes of LENGTHS frames,
    each with a 2-D state (frame index, episode) as observation.state; and a run on it whose adapter reads that
    state (a tiny base saved as the run's weights, the adapter moved off its zero init)."""
    from workbench import AdapterExperiment
    from workbench.data.importer import import_folder, write_example_folder
    from workbench.train.config import parse_experiment

    root = tmp_path_factory.mktemp("own")
    src = write_example_folder(root / "my videos", episodes=len(LENGTHS), frames=max(LENGTHS), size=16)
    for e, n in enumerate(LENGTHS):
        stem = src / f"episode_{e:03d}"
        np.save(f"{stem}.npy", np.load(f"{stem}.npy")[:n])
        np.save(f"{stem}.state.npy", np.stack([np.arange(n), np.full(n, e)], axis=1).astype(np.float32))
    import_folder(src, root / "my_data", window=4, trim=True)
    weights = tiny_base(sampling_steps=2).save_pretrained(root / "base.safetensors")
    architecture = {**TINY, "sampling_steps": 2}
    config = {"name": "own", "base": {"type": "tiny_video", "config": {**architecture, "weights": str(weights)}},
              "adapter": {"type": "latent_residual",
                          "config": {"width": 16, "depth": 1, "dim": 2, "state": "proprio", "state_dim": 2}},
              "training": {"steps": 1, "batch_size": 2, "output_dir": str(root / "run"), "progress": False},
              "data": {"type": "lerobot", "config": {"root": str(root / "my_data"), "window": 4, "stride": 4,
                                                     "size": [16, 16]}}}
    exp = AdapterExperiment.from_config(parse_experiment(config))
    perturb(exp.model)
    exp.save_checkpoint()
    return root


def _metrics(out) -> dict:
    return json.loads((out / "rollout_metrics.json").read_text())


def _no_hand_error(metrics: dict, printed: str) -> None:
    """Moving PSNR per chunk, and nothing of the hand error, in the JSON or the table."""
    keys = {key for row in metrics["summary"]["chunks"] for key in row} | set(metrics["per_episode"])
    assert not [key for key in keys if "hand" in key or "probe" in key]
    assert metrics["evaluation"]["metrics"] == ["moving_psnr"]
    assert metrics["summary"]["hand_error_note"] == "not scored: the clips carry no recorded hand position (ee_pos)"
    assert "moving PSNR dB:" in printed and "hand error cm:" not in printed and "probe" not in printed


def test_without_data_a_run_on_your_own_data_rolls_out_its_own_held_out_episodes(own, tmp_path, capsys):
    status, printed, err = cli(capsys, "eval", own / "run", "--rollout", "--out", tmp_path / "ro", "--no-progress")
    assert status == 0, err
    metrics = _metrics(tmp_path / "ro")
    assert (metrics["evaluation"]["data"], metrics["evaluation"]["split"]) == ("my_data", "val")
    assert [it["episode"] for it in metrics["items"]] == list(VAL)
    assert "my_data (val), 2 steps, state=start: 2 episodes of 7 to 12 frames, per chunk" in printed
    assert "metaworld_long" not in printed + err and "--size" not in printed + err
    _no_hand_error(metrics, printed)


def test_each_episode_is_rolled_out_whole_by_default_whatever_its_length(own, tmp_path, capsys):
    status, printed, err = cli(capsys, "eval", own / "run", "--rollout", "--data", own / "my_data", "--split", "all",
                               "--out", tmp_path / "ro", "--no-progress")
    assert status == 0, err
    metrics = _metrics(tmp_path / "ro")
    assert [(it["episode"], it["frames"]) for it in metrics["items"]] == list(enumerate(LENGTHS))
    summary = metrics["summary"]
    assert (summary["frames"], summary["shortest"], summary["episodes"]) == (12, 7, 8)
    # chunks of the 4-frame window add 3 frames each: 1-3, 4-6, 7-9, 10-11 of the longest episode
    assert [row["frames"] for row in summary["chunks"]] == [[1, 3], [4, 6], [7, 9], [10, 11]]
    for variant in ("base", "adapter", "swapped"):
        per_chunk = metrics["per_episode"][f"{variant}_moving_psnr"]
        for n, chunks in zip(LENGTHS, per_chunk, strict=True):
            past = [lo >= n for lo in (1, 4, 7, 10)]  # a chunk past an episode's end has no number
            assert [value for value, gone in zip(chunks, past, strict=True) if gone] == [None] * sum(past)
            assert chunks[0] is not None, (variant, n, chunks)
    assert "8 episodes of 7 to 12 frames" in printed
    _no_hand_error(metrics, printed)


def test_frames_of_data_without_a_hand_position_are_scored_on_moving_pixels(own, tmp_path, capsys):
    status, printed, err = cli(capsys, "eval", own / "run", "--rollout", "--data", own / "my_data", "--frames", 7,
                               "--split", "all", "--variants", "base,adapter", "--out", tmp_path / "ro",
                               "--no-progress")
    assert status == 0, err
    metrics = _metrics(tmp_path / "ro")
    assert [it["frames"] for it in metrics["items"]] == [7] * 8
    rows = metrics["summary"]["chunks"]
    assert [row["frames"] for row in rows] == [[1, 3], [4, 6]]
    assert all(np.isfinite(row[f"{v}_moving_psnr"]) for row in rows for v in ("base", "adapter"))
    assert rows[0]["adapter_moving_psnr"] != rows[0]["base_moving_psnr"]  # the adapter changes the frames
    _no_hand_error(metrics, printed)
    assert (tmp_path / "ro" / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_state_is_the_one_recorded_at_each_episodes_first_frame(own):
    from workbench.worldmodel.common import load_run

    exp = load_run(own / "run")
    items = long_episodes(str(own / "my_data"), split="val", size=(16, 16), exp=exp)
    assert [(it["episode"], it["video"].shape[1]) for it in items] == [(2, 7), (4, 12)]
    given = []
    prepare = exp.model.base.prepare_batch
    exp.model.base.prepare_batch = lambda raw: given.append(raw) or prepare(raw)
    result = evaluate_rollouts(exp, items, steps=1, progress=False, variants=("adapter",))
    assert result["state"] == "start" and result["lengths"] == [7, 12]
    # both episodes in one batch, the longest first (the shorter one holds its last action to the longer's end);
    # every chunk of each is given its state of frame 0, (frame index 0, episode), never a later frame's
    assert len(given) == 4
    for raw in given:
        assert torch.equal(raw["proprio"], torch.tensor([[0.0, 4.0], [0.0, 2.0]])[:, None].expand(2, 4, 2))
    assert result["adapter"].shape == (2, 12, 16, 16, 3) and not result["adapter"][0, 7:].any()  # zero past 7 frames


def test_which_state_a_rollout_reads(own, exp):
    from workbench import ComposedModel, GatedResidual
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.worldmodel.common import load_run

    mine = load_run(own / "run")
    items = long_episodes(str(own / "my_data"), split="val", size=(16, 16))
    base = tiny_base()
    no_state = ComposedModel(base, LatentResidual(width=16, depth=1, dim=2), GatedResidual(),
                             base.default_objective())
    assert rollout_state(mine.model, items) == "start"  # it reads proprio: observation.state at the first frame
    assert rollout_state(no_state, items) is None  # it reads no state: none is given, though the data has one
    assert rollout_state(mine.model, [{k: v for k, v in it.items() if k != "proprio"} for it in items]) is None
    assert rollout_state(mine.model, items, "recorded") == "recorded"
    assert rollout_state(no_state, items, "none") is None
    with pytest.raises(DataError, match=r"--rollout-state none: the run's adapter reads 'proprio' at each chunk's "
                                        r"first frame, which the episodes record, so every chunk needs one\. Use "
                                        r"--rollout-state start"):
        rollout_state(mine.model, items, "none")
    assert rollout_state(exp.model, long_episodes("long", frames=2, episodes=1)) == "probe"  # the hand, on Meta-World
    with pytest.raises(DataError, match=r"--rollout-state probe: the hand probe reads 64x64 frames of the Meta-World "
                                        r"camera, these episodes have 16x16 frames\. Use --rollout-state start"):
        rollout_state(mine.model, items, "probe")


@pytest.mark.parametrize("args, message", [
    (["--frames", 9], r"--frames 9: episode 2 of my_data \(val\) has 7 frames\. Roll out at most 7 frames "
                      r"\(--frames 7: the shortest episode\), or leave --frames out"),
    (["--frames", 1], r"--frames 1: a rollout predicts the frames after the first, so it needs at least 2 frames"),
    (["--episodes", 1], r"The 'swapped' variant .* needs two episodes or more, and got only episode 2\. Roll out "
                        r"more \(--split all, or more --episodes\), or leave it out \(--variants base,adapter\)"),
    (["--state", "none"], r"The run's adapter reads 'proprio', which the clips of .*my_data do not serve \(they serve "
                          r"action\)\. Nothing was evaluated\. .* name its feature with --state FEATURE"),
])
def test_what_cannot_be_rolled_out_says_why_and_the_fix(own, tmp_path, capsys, args, message):
    status, _, err = cli(capsys, "eval", own / "run", "--rollout", *args, "--out", tmp_path / "ro", "--no-progress")
    assert status == 2 and re.search(message, err), err
