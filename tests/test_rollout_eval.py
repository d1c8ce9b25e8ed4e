"""`workbench eval RUN --rollout`: the shipped long held-out episodes, rolled out chunk by chunk (base, adapter,
swapped actions), scored per chunk (moving PSNR, hand error via the probe), with a table, a JSON and a drift
plot — on small sizes (two episodes, two chunks, two sampling steps)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from workbench.errors import DataError
from workbench.worldmodel.demo import TRAINED_ADAPTER
from workbench.worldmodel.rollout_eval import (
    LONG_PATH,
    evaluate_rollouts,
    format_rollout_table,
    long_episodes,
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
