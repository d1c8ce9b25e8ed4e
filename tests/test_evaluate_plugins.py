"""``workbench eval`` on runs of every shipped plugin backbone, at the clip size each one's contract states.

A tiny run of each example config (two training steps) is evaluated from the command line on two
held-out clips: the clip source is built from the backbone's ``clip()`` (no backbone-specific config
field is read), the three variants are predicted through the backbone's own sampler (Wan2.2 TI2V one
clip per call, EasyAnimate from the text, DynamiCrafter from the first frame), the side-by-side video
is written and, the frames being the hand probe's 64x64, the action error is scored. On frames the
probe cannot read, the action error says so instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import requires_plugins

from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


@requires_plugins
@pytest.mark.parametrize("example", ["wan22_action_modulation", "easyanimate", "dynamicrafter"])
def test_workbench_eval_runs_on_a_tiny_run_of_each_plugin(example, tmp_path, monkeypatch, capsys):
    import imageio.v3 as iio

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    run, out = tmp_path / "run", tmp_path / "eval"
    assert main(["train", str(ROOT / "examples" / "configs" / f"{example}.yaml"), "--steps", "2", "--output", str(run),
                 "--quiet"]) == 0
    assert main(["eval", str(run), "--data", "sample", "--out", str(out), "--clips", "2", "--stride", "48",
                 "--sampling-steps", "2", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "sample.h5 (val): 2 clips" in table and "(c) base + adapter, swapped" in table
    metrics = json.loads((out / "metrics.json").read_text())
    frames = {"wan22_action_modulation": 9, "easyanimate": 9, "dynamicrafter": 8}[example]
    assert metrics["evaluation"]["window"] == frames and metrics["evaluation"]["clips"] == 2
    summary = metrics["summary"]
    for variant in ("base", "adapter", "swapped"):
        mean = summary["mean"][variant]
        assert all(np.isfinite(mean[k]) for k in ("psnr", "ssim", "moving_psnr", "action_error")), (variant, mean)
    assert "action_error_note" not in summary  # 64x64 frames with recorded hand positions: scored
    grid = iio.imread(out / "side_by_side.gif")
    assert grid.shape[0] == frames and grid.shape[-1] in (3, 4)  # one picture per predicted frame
    assert sorted(metrics["files"]) == ["side_by_side.gif", "side_by_side.mp4"]


def test_the_action_error_says_why_it_is_not_scored_on_frames_the_probe_cannot_read():
    """A backbone predicting 32x32 clips: the probe reads 64x64 frames, so the action error is NaN and the table
    says why (rather than failing, or scoring frames the probe was not made for)."""
    from conftest import tiny_base

    from workbench import AdapterExperiment, TrainingConfig
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.worldmodel.evaluate import evaluate_world_model, format_table, summarise

    base = tiny_base(image_size=32, frames=4)
    exp = AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False))
    g = torch.Generator().manual_seed(0)
    clips = [{"video": torch.rand(3, 4, 32, 32, generator=g) * 2 - 1, "action": torch.rand(4, 4, generator=g),
              "ee_pos": torch.rand(4, 3, generator=g), "episode": i, "start": 0, "task": "reach-v3"} for i in range(2)]
    result = evaluate_world_model(exp, clips, sampling_steps=2, progress=False)
    assert result["action_error_note"] == "not scored: the hand probe reads 64x64 frames, these are 32x32"
    assert np.isnan(result["scores"]["adapter"]["action_error"]).all()
    assert result["adapter"].shape == (2, 4, 32, 32, 3)
    table = format_table(summarise(result), "synthetic")
    assert "action error not scored: the hand probe reads 64x64 frames, these are 32x32 (the columns above show " \
           "nan)" in table
