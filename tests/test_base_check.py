"""A base for your own videos: the check that says whether it carries the scene, fine-tuning a base on your
videos (`workbench pretrain --from`), the moving-pixel weight of the autoencoder's loss, and never
overwriting weights a run may stand on."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import TINY, cli, tiny_base

from workbench.backbones.tiny_video import TinyVideo
from workbench.errors import ConfigError
from workbench.worldmodel import pretrain
from workbench.worldmodel.base_check import (
    MIN_CARRIED_DB,
    MIN_FIRST_FRAME_DB,
    MIN_MOVING_GAIN_DB,
    BaseCheck,
    check_base,
    draw_check,
    judge,
)


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """Six imported episodes of the blob scene at 16x16 (one or two held out), 8 to 10 frames each."""
    from workbench.data.importer import import_folder
    from workbench.data.scenes import write_scene_folder

    tmp = tmp_path_factory.mktemp("scene")
    write_scene_folder(tmp / "videos", "blob", episodes=6, frames=(8, 10), size=32, seed=0)
    import_folder(tmp / "videos", tmp / "blob", size=(16, 16), window=4)
    return str(tmp / "blob")


def tiny_cfg(data: str, tmp_path, **changes) -> pretrain.PretrainConfig:
    return pretrain.PretrainConfig(**{
        "data": data, "size": 16, "window": 4, "ae_steps": 2, "steps": 2, "batch_size": 2, "ae_batch_size": 2,
        "check_clips": 2, "out": str(tmp_path / "base.safetensors"),
        "arch": {k: TINY[k] for k in ("width", "depth", "ae_width")}, **changes})


# -- the verdict ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scores, carries, words", [
    ((30.0, 25.0, 15.0, 28.0), True, "The base carries this scene: it keeps the first frame and draws what moves"),
    ((30.0, 15.0 + MIN_MOVING_GAIN_DB, 15.0, MIN_CARRIED_DB), True, "The base carries this scene"),  # at the edge
    ((20.0, 25.0, 15.0, 28.0), False, "The base cannot carry this scene: it redraws the given first frame at "
                                      "20.0 dB (below 24 dB: its objects blur away). An adapter trained on it "
                                      "will learn little. FIX"),
    ((30.0, 16.7, 15.6, 32.2), False, "The base cannot carry this scene: on the moving pixels its reconstruction "
                                      "(16.7 dB) is hardly better than the first frame held still (15.6 dB): it "
                                      "loses what moves. An adapter trained on it will learn little. FIX"),
    ((30.0, 25.0, 15.0, 17.8), False, "The base cannot carry this scene: its prediction keeps the still pixels at "
                                      "17.8 dB only (below 20 dB): it does not carry the given frame forward."),
    ((23.9, 18.0, 15.0, 19.9), False, "first frame at 23.9 dB (below 24 dB: its objects blur away); on the moving "
                                      "pixels its reconstruction (18.0 dB) is hardly better"),
])
def test_the_verdict_names_each_failing_score_and_the_fix(scores, carries, words):
    got, verdict = judge(*scores, fix="FIX")
    assert got is carries
    assert words in verdict
    assert verdict.endswith("FIX") is not carries


def test_the_thresholds_are_the_documented_ones():
    # docs/guides/your-own-data.md states them
    assert (MIN_FIRST_FRAME_DB, MIN_MOVING_GAIN_DB, MIN_CARRIED_DB) == (24.0, 4.0, 20.0)


# -- the numbers ---------------------------------------------------------------------------------------------------
def reference_psnr(pred: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> float:
    """PSNR on the uint8 scale over the masked pixels (all three channels), written out."""
    err = (pred.astype(np.float64) - truth.astype(np.float64))[mask]
    return float(10 * np.log10(255.0 ** 2 / np.mean(err ** 2)))


def test_a_base_that_holds_the_first_frame_still_scores_as_still_and_fails(scene, monkeypatch):
    base = tiny_base()
    monkeypatch.setattr(base, "encode", lambda video: video)  # "latents" that are the frames themselves
    monkeypatch.setattr(base, "decode", lambda z: z[:, :, :1].expand_as(z))  # every frame: the first
    check, videos = check_base(base, scene, clips=3, sampling_steps=0)
    truth = videos["truth"]
    assert truth.shape[1:] == (4, 16, 16, 3) and check.clips == len(truth) >= 2
    moving = np.abs(truth.astype(int) - truth[:, :1]).max(axis=-1) > 10  # the eval's moving pixels
    assert moving[:, 1:].any()
    still = reference_psnr(np.broadcast_to(truth[:, :1], truth.shape), truth, moving)
    assert check.still_psnr == pytest.approx(still, abs=1e-9)
    assert check.moving_psnr == pytest.approx(still, abs=1e-9)  # it draws exactly the still picture
    assert check.moving_fraction == pytest.approx(moving[:, 1:].mean())
    assert check.first_frame_psnr == float("inf") and check.carried_psnr is None
    assert not check.carries and "it loses what moves" in check.verdict


def test_a_base_that_returns_the_truth_carries_the_scene(scene, monkeypatch):
    base = tiny_base()
    monkeypatch.setattr(base, "encode", lambda video: video)
    monkeypatch.setattr(base, "decode", lambda z: z)
    check, videos = check_base(base, scene, clips=2, sampling_steps=0)
    assert check.first_frame_psnr == check.moving_psnr == check.reconstruction_psnr == float("inf")
    assert check.still_psnr < 40 and check.carries
    assert np.array_equal(videos["reconstruction"], videos["truth"])


def test_the_check_samples_the_base_and_draws_what_it_scored(scene, tmp_path):
    from PIL import Image

    check, videos = check_base(tiny_base(), scene, clips=2, sampling_steps=2)
    assert set(videos) == {"truth", "reconstruction", "prediction"}
    assert np.array_equal(videos["prediction"][:, 0], videos["reconstruction"][:, 0])  # frame 0 is given
    assert check.carried_psnr is not None and np.isfinite(check.carried_psnr)
    assert not check.carries  # a random init carries nothing
    path = draw_check(tmp_path / "check.png", check, videos, clips=2, frames=3, scale=2)
    picture = np.asarray(Image.open(path).convert("RGB"))
    # 104 pixels of labels, then 3 frames of 16x16 drawn at 2x with 4 pixels between; 46 of heading,
    # then per clip 3 rows of 32 + 4 and 8 more
    assert picture.shape == (46 + 2 * (3 * 36 + 8), 104 + 3 * 36, 3)
    top = 46 + (3 * 36 + 8)  # the second clip's truth row, last frame
    cell = picture[top:top + 32, 104 + 2 * 36:104 + 2 * 36 + 32]
    assert np.array_equal(cell, np.kron(videos["truth"][1, 3], np.ones((2, 2, 1), np.uint8)))
    assert BaseCheck(**vars(check)).summary().splitlines()[0].startswith("base check on 2 held-out clips")


# -- fine-tuning ---------------------------------------------------------------------------------------------------
def test_fine_tuning_starts_from_the_given_weights_and_changes_them(scene, tmp_path):
    start = tiny_base(image_size=32, frames=8)  # another size and clip length than the fine-tuning's
    with torch.no_grad():
        start.latent_mean.fill_(0.25)
    file = start.save_pretrained(tmp_path / "start.safetensors", model_id="start-model")
    cfg = tiny_cfg(scene, tmp_path, init=str(file), arch={})
    first = pretrain.starting_base(cfg, 16)
    assert (first.config.image_size, first.config.frames, first.config.width) == (16, 4, 16)
    for (name, a), b in zip(first.state_dict().items(), start.state_dict().values()):
        assert torch.equal(a, b), name
    tuned = pretrain.pretrain(cfg, progress=False)
    before, after = start.state_dict(), tuned.state_dict()
    for part in ("autoencoder.encoder.0.weight", "autoencoder.decoder.0.weight", "denoiser.stem.weight", "latent_std"):
        assert not torch.equal(before[part], after[part]), part
    assert tuned.provenance["initialised_from"] == "start.safetensors (start-model)"
    assert tuned.card.recipe.trained_on.startswith("fine-tuned from start.safetensors (start-model) on blob")
    assert tuned.provenance["pretrain_config"]["init"] == "start.safetensors"


def test_from_pretrained_starts_from_the_shipped_weights_at_any_size(scene, tmp_path):
    shipped = TinyVideo.from_pretrained(device="cpu")
    first = pretrain.starting_base(tiny_cfg(scene, tmp_path, init="pretrained", arch={}), 16)
    assert (first.config.image_size, first.config.frames, first.config.ae_width) == (16, 4, shipped.config.ae_width)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), shipped.state_dict().values()))
    assert first.provenance["initialised_from"] == "the shipped weights (tiny_video-metaworld-i2v)"


def test_from_refuses_an_architecture_its_weights_do_not_have(scene, tmp_path):
    with pytest.raises(ConfigError, match=r"--from pretrained starts from weights of another architecture than the "
                                          r"one asked for: --ae-width 8 \(the weights: 32\), --width 16 \(the "
                                          r"weights: 32\)\. Leave those flags out"):
        pretrain.starting_base(tiny_cfg(scene, tmp_path, init="pretrained", arch={"width": 16, "ae_width": 8,
                                                                                  "depth": 2}), 16)


def test_the_moving_weight_changes_the_loss_only_where_something_moves():
    rng = np.random.default_rng(0)
    still = np.repeat(rng.integers(0, 255, size=(2, 1, 16, 16, 3), dtype=np.uint8), 5, axis=1)  # nothing moves
    moving = still.copy()
    moving[:, 2:, 4:8, 4:8] = 255  # a square appears

    def first_loss(frames, weight):
        torch.manual_seed(0)
        base = tiny_base()
        cfg = pretrain.PretrainConfig(data="unused", val_data="unused", ae_steps=1, ae_batch_size=4, ae_crop=16,
                                      moving_weight=weight)
        return pretrain.train_autoencoder(base, frames, cfg, progress=False)[0]

    assert first_loss(still, 10.0) == pytest.approx(first_loss(still, 0.0), rel=1e-6)
    assert first_loss(moving, 10.0) != pytest.approx(first_loss(moving, 0.0), rel=1e-3)


# -- the command ---------------------------------------------------------------------------------------------------
def test_pretrain_keeps_existing_weights_unless_told_to_overwrite(scene, tmp_path, capsys):
    out = tmp_path / "base.safetensors"
    out.write_bytes(b"weights a run was trained on")
    args = ["pretrain", "--data", scene, "--from", "scratch", "--size", 16, "--window", 4, "--ae-steps", 1,
            "--steps", 1, "--batch-size", 2, "--ae-batch-size", 2, "--width", 16, "--depth", 1, "--ae-width", 8,
            "--out", out, "--no-progress"]
    status, _, err = cli(capsys, *args)
    assert status == 2
    assert f"--out {out} exists (weights written " in err
    assert "Choose another --out, or pass --overwrite to replace it (nothing was written)." in err
    assert out.read_bytes() == b"weights a run was trained on"
    assert not out.with_suffix(".json").exists()
    status, printed, err = cli(capsys, *args, "--overwrite")
    assert status == 0, err
    assert TinyVideo.from_pretrained(out).config.ae_width == 8
    assert "base check on " in printed and "The base cannot carry this scene" in printed  # one step learns nothing
    assert f"what it sees and draws: {out.with_suffix('.check.png')}" in printed
    assert out.with_suffix(".check.png").stat().st_size > 0


def test_every_pretrain_flag_says_what_it_does(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    pretrain.add_arguments(parser)
    flags = {a.option_strings[-1]: " ".join((a.help % {"default": a.default}).split())
             for a in parser._actions if a.option_strings}
    assert sorted(flags) == sorted([
        "--help", "--data", "--out", "--overwrite", "--from", "--val-data", "--size", "--camera", "--window",
        "--ae-steps", "--ae-batch-size", "--ae-learning-rate", "--moving-weight", "--steps", "--batch-size",
        "--learning-rate", "--seed", "--width", "--depth", "--ae-width", "--no-progress"])
    for flag, words in flags.items():
        what = re.sub(r"\(?default: [^)]*\)", "", words).strip(" ;(")
        assert len(what.split()) >= 3, f"{flag}: {words!r} says little beyond its default"
    assert flags["--from"].endswith("(default: pretrained)") and "default: 2500)" in flags["--steps"]
    with pytest.raises(SystemExit):
        cli(capsys, "pretrain", "--help")
    assert "--moving-weight MOVING_WEIGHT" in capsys.readouterr().out
