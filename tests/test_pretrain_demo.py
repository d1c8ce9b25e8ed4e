"""The pretrained embedded base, `workbench pretrain`, and `workbench demo`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import WEIGHTS_DIR, TinyVideo
from workbench.cli import main
from workbench.errors import ConfigError, DataError
from workbench.worldmodel import pretrain
from workbench.worldmodel.common import swap_partner

SHIPPED = WEIGHTS_DIR / "tiny_video.safetensors"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped() -> TinyVideo:
    return TinyVideo.from_pretrained()


def test_shipped_weights_are_small_and_documented(shipped):
    assert SHIPPED.stat().st_size <= 10 * 2**20
    card = shipped.card
    assert card.recipe.method == "pretrain_i2v"
    assert "Meta-World" in card.recipe.trained_on and "no actions" in card.recipe.trained_on
    assert card.recipe.train_steps >= 1000
    assert card.components["denoiser"].source == card.components["vae"].source == "pretrained"
    assert card.capabilities == ("i2v",)
    assert (card.sampling.height, card.sampling.num_frames, card.sampling.fps) == (64, 16, 40)
    # the card that ships next to the weights says the same
    written = json.loads(SHIPPED.with_suffix(".json").read_text())
    assert written["card"]["recipe"]["val_loss"] == card.recipe.val_loss
    assert written["provenance"]["validation"] == shipped.provenance["validation"]


def test_shipped_weights_reproduce_the_card_validation_loss(shipped):
    recomputed = pretrain.validation_loss(shipped, **shipped.provenance["validation"])
    assert recomputed == pytest.approx(shipped.card.recipe.val_loss, rel=1e-3)
    # and the number means something: far below an untrained denoiser on the same clips
    assert shipped.card.recipe.val_loss < 0.5 * shipped.provenance["validation_loss_untrained"]


def test_shipped_autoencoder_reconstructs_held_out_frames(shipped):
    psnr = pretrain.reconstruction_psnr(shipped, "sample", "val")
    assert psnr == pytest.approx(shipped.provenance["autoencoder_val_psnr"], abs=0.01)
    assert psnr > 25.0


def test_validation_loss_is_deterministic_and_batch_independent(shipped):
    # 12 clips: batches of 4 (4 + 4 + 4) and of 7 (7 + 5) split them differently
    a = pretrain.validation_loss(shipped, window=16, stride=48, batch_size=4)
    b = pretrain.validation_loss(shipped, window=16, stride=48, batch_size=7)
    assert a == pytest.approx(b, rel=1e-6)
    assert pretrain.validation_loss(shipped, window=16, stride=48, seed=1) != pytest.approx(a, rel=1e-6)


def test_pretrain_command_runs_a_handful_of_steps(tmp_path, capsys):
    out = tmp_path / "tv.safetensors"
    code = main(["pretrain", "--data", "sample", "--from", "scratch", "--ae-steps", "2", "--steps", "3",
                 "--batch-size", "2", "--ae-batch-size", "4", "--width", "16", "--depth", "1", "--ae-width", "8",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    assert "3 denoiser steps" in capsys.readouterr().out
    base = TinyVideo.from_pretrained(out)
    assert base.config.width == 16 and base.config.frames == 16
    card = base.card
    assert card.recipe.train_steps == 3 and base.provenance["autoencoder_steps"] == 2
    assert "60 episodes x 48 frames" in card.recipe.trained_on
    assert card.recipe.val_loss == pytest.approx(
        pretrain.validation_loss(base, **base.provenance["validation"]), rel=1e-5)
    curves = json.loads(out.with_suffix(".curves.json").read_text())
    assert len(curves["denoiser_loss"]) == 3 and len(curves["autoencoder_loss"]) == 2
    assert all(np.isfinite(curves["denoiser_loss"]))


def test_pretrain_rejects_a_window_longer_than_the_episodes(tmp_path):
    with pytest.raises(Exception, match="shorter than window=64"):
        pretrain.pretrain(pretrain.PretrainConfig(data="sample", window=64, ae_steps=0, steps=0,
                                                  out=str(tmp_path / "x.safetensors")), progress=False)


@pytest.mark.parametrize("field, value, pattern", [
    ("ema", 1.0, "ema: must be in"),
    ("ae_crop", 12, "ae_crop: must be a multiple of 8"),
    ("window", 1, "window: must be >= 2"),
])
def test_pretrain_config_validation(field, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        pretrain.PretrainConfig(data="sample", **{field: value})


# -- the action adapter the demo trains --------------------------------------------------------

def test_demo_adapter_is_the_identity_at_init(shipped):
    from workbench import ComposedModel, GatedResidual
    from workbench.data.metaworld import MetaWorldClips
    from workbench.worldmodel.demo import ADAPTER

    torch.manual_seed(0)
    model = ComposedModel(shipped, LatentResidual(**ADAPTER["config"]), GatedResidual(), shipped.default_objective())
    g = torch.Generator().manual_seed(0)
    camera = MetaWorldClips(path="sample", window=16, split="val")[0]["camera"]
    raw = {"video": torch.rand(2, 3, 16, 64, 64, generator=g) * 2 - 1,
           "action": torch.rand(2, 16, 4, generator=g) * 2 - 1,
           "ee_pos": torch.tensor([0.0, 0.66, 0.2]) + torch.rand(2, 16, 3, generator=g) * 0.1,
           "camera": camera.expand(2, -1)}
    batch = shipped.prepare_batch(raw)
    x_t = torch.randn(batch.latents.shape, generator=g)
    pred = model.predict(x_t, torch.full((2,), 0.7), batch)
    assert torch.equal(pred.composed, pred.base)


# -- the demo ----------------------------------------------------------------------------------

def test_swap_partner_always_borrows_from_another_episode():
    episodes = [3, 3, 3, 7, 7, 9]
    partner = swap_partner(episodes)
    assert partner == [3, 3, 3, 5, 5, 0]
    assert all(episodes[p] != e for p, e in zip(partner, episodes))
    with pytest.raises(DataError, match="needs clips from at least two episodes; all 2 clips come from episode 1"):
        swap_partner([1, 1])


def test_video_rows_show_one_clip_per_task_first():
    from workbench.worldmodel.evaluate import _one_per_task

    items = [{"task": t} for t in ("push", "push", "reach", "push", "door")]
    assert _one_per_task(items, 3) == [0, 2, 4]
    assert _one_per_task(items, 10) == [0, 2, 4, 1, 3]


# -- the adapter the demo trained, shipped --------------------------------------------------------

def test_the_shipped_adapter_is_what_the_demo_trains():
    import yaml

    from workbench.worldmodel.demo import TRAINED_ADAPTER, DemoConfig

    config = yaml.safe_load((TRAINED_ADAPTER / "config.yaml").read_text())
    demo = DemoConfig()
    assert config["adapter"] == demo.adapter and config["composer"] == demo.composer
    assert config["objective"] == demo.objective and config["training"]["steps"] == demo.steps
    assert config["base"] == {"type": "tiny_video", "config": {"weights": "pretrained"}}
    metrics = json.loads((TRAINED_ADAPTER / "demo_metrics.json").read_text())
    assert metrics["training"]["steps"] == demo.steps and metrics["evaluation"]["clips"] == 36


def test_the_shipped_world_model_follows_the_actions():
    """On held-out clips the shipped adapter's predictions beat both the base and swapped actions."""
    from workbench import AdapterExperiment
    from workbench.data.metaworld import MetaWorldClips
    from workbench.worldmodel.demo import TRAINED_ADAPTER
    from workbench.worldmodel.evaluate import evaluate_world_model, summarise

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    val = MetaWorldClips(path="sample", window=16, stride=16, split="val")
    clips = torch.utils.data.Subset(val, [0, 9, 12, 18])  # push, reach, pick-place, button-press
    # 10 sampler steps: the margins are those of 20 (measured, seeds 0-2: adapter - base 2.0-2.6 dB, adapter -
    # swapped 2.2-2.5 dB at 10 steps; 1.9-2.3 and 2.0-2.3 dB at 20), at half the sampling
    summary = summarise(evaluate_world_model(exp, clips, sampling_steps=10, seed=0, progress=False))
    mean = summary["mean"]
    assert mean["adapter"]["moving_psnr"] > mean["base"]["moving_psnr"] + 0.5
    assert mean["adapter"]["moving_psnr"] > mean["swapped"]["moving_psnr"] + 0.5
    assert summary["adapter_beats_swapped_fraction"] >= 0.75


def test_the_example_config_is_the_demo_and_trains(tmp_path):
    import yaml

    from workbench.worldmodel.demo import DemoConfig

    path = ROOT / "examples" / "configs" / "metaworld_world_model.yaml"
    config = yaml.safe_load(path.read_text())
    demo = DemoConfig()
    assert config["adapter"] == demo.adapter and config["composer"] == demo.composer
    assert config["objective"] == demo.objective and config["training"]["steps"] == demo.steps
    assert main(["train", str(path), "--steps", "2", "--output", str(tmp_path / "wm"), "--quiet"]) == 0
    from workbench import AdapterExperiment

    assert AdapterExperiment.load(tmp_path / "wm").step == 2


def test_the_drift_config_is_the_world_model_config_with_self_forwarded_context_and_trains(tmp_path):
    import yaml

    from workbench import AdapterExperiment

    plain = yaml.safe_load((ROOT / "examples" / "configs" / "metaworld_world_model.yaml").read_text())
    path = ROOT / "examples" / "configs" / "metaworld_drift.yaml"
    drift = yaml.safe_load(path.read_text())
    context = drift["training"].pop("context")
    assert context == {"source": "self_forwarded", "p": 0.5, "steps": 2, "gate_scale": 2.0}
    assert {**drift, "name": plain["name"]} == plain   # nothing else differs from the shipped adapter's run
    assert main(["train", str(path), "--steps", "2", "--output", str(tmp_path / "drift"), "--quiet"]) == 0
    run = AdapterExperiment.load(tmp_path / "drift")
    assert run.step == 2 and run.context is not None
    assert run.resolved_config()["training"]["context"]["source"] == "self_forwarded"


def test_the_shipped_drift_adapter_is_the_drift_config_s_run():
    """The shipped drift-trained adapter is what `workbench train examples/configs/metaworld_drift.yaml` writes:
    the config's every field, 600 steps, and the label its instruments show."""
    import yaml

    from workbench.train import AdapterExperiment
    from workbench.worldmodel.demo import DRIFT_ADAPTER

    example = yaml.safe_load((ROOT / "examples" / "configs" / "metaworld_drift.yaml").read_text())
    shipped = yaml.safe_load((DRIFT_ADAPTER / "config.yaml").read_text())
    def given(value):  # a section as the config gives it (the run's copy also writes the unset fields, as null)
        return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value

    for section in ("base", "adapter", "composer", "objective", "data", "callbacks"):
        assert given(shipped[section]) == given(example[section]), section
    for key, value in example["training"].items():
        want = {**value, "max_level": 0.3, "stride": None} if key == "context" else value
        assert shipped["training"][key] == want, key
    assert shipped["training"]["output_dir"] == "outputs/metaworld_drift"
    assert json.loads((DRIFT_ADAPTER / "manifest.json").read_text())["step"] == 600
    run = AdapterExperiment.load(DRIFT_ADAPTER)
    assert run.model.trained_context == "trained on produced context p=0.5 (2-step samples)"


def test_the_demo_table_carries_the_stored_from_scratch_rows_at_its_own_budget():
    from safetensors.torch import load_file

    from workbench.worldmodel.demo import SCRATCH_MODEL, SCRATCH_REFERENCE, DemoConfig, scratch_reference_rows

    ref = json.loads(SCRATCH_REFERENCE.read_text())
    assert ref["training"]["trainable_parameters"] == 51930 and ref["training"]["steps"] == 600
    # as the stored run's own files say: its trained weights hold 51930 numbers, its checkpoint is at step 600
    assert sum(t.numel() for t in load_file(SCRATCH_MODEL / "trainable.safetensors").values()) == 51930
    assert json.loads((SCRATCH_MODEL / "manifest.json").read_text())["step"] == 600
    rows = scratch_reference_rows(DemoConfig())
    assert rows.startswith("from scratch, 600 steps (the parameter count of the actions-only adapter; no pretrained "
                           "denoiser), stored, not rerun: `workbench demo --from-scratch --output outputs/scratch`")
    assert "(d) from scratch, true actions      21.48  0.786        13.30           7.08" in rows
    assert "(d) beats (e) on 89% of clips" in rows
    # the row's numbers are the 36 clips' own scores, averaged here rather than read from the stored summary
    clips = {k: np.asarray(v) for k, v in ref["per_clip"].items() if k.startswith(("adapter_", "swapped_"))}
    assert len(clips["adapter_psnr"]) == 36
    row = next(line for line in rows.splitlines() if line.startswith("(d) from scratch, true actions"))
    assert row.split()[5:9] == [f"{clips[f'adapter_{m}'].mean():.{3 if m == 'ssim' else 2}f}"
                                for m in ("psnr", "ssim", "moving_psnr", "action_error")]
    wins = 100 * np.mean(clips["adapter_moving_psnr"] > clips["swapped_moving_psnr"])
    assert f"(d) beats (e) on {wins:.0f}% of clips" in rows
    assert scratch_reference_rows(DemoConfig.quick()) == ""  # other clips: nothing to compare with
    assert scratch_reference_rows(DemoConfig(from_scratch=True)) == ""
