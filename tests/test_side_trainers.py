"""The side trainers on the shared loop: pretraining's two stages, the hand probe and the tiny-preview
distillation train as they did with loops of their own, and a Ctrl-C in any of them resumes into the
same result."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_base

from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.inspect.previews.tiny_preview import distil_tiny_preview
from workbench.loop import Interrupted
from workbench.worldmodel import pretrain
from workbench.worldmodel.probe import ProbeTrainConfig, train_probe

torch.set_num_threads(1)

# Measured with each trainer's own loop (a hand-written loop, its own cosine or torch's OneCycleLR)
# just before they moved onto workbench.loop, and equal bit for bit after the move on the same
# machine (an AMD EPYC). The tolerance leaves room for other CPUs' float32 kernels — on an Intel Xeon
# with AMX the weight digests land 2.2e-5 relative away after the same steps — while a changed draw
# order, schedule step or update moves these numbers by far more (the probe's digest: 1.5e-3 for a
# learning rate 1% higher, 1.7e-2 for one step fewer).
GOLDEN = {
    "autoencoder": {
        "losses": [0.4211203455924988, 0.2954760789871216, 0.38176584243774414, 0.3297676742076874,
                   0.42697203159332275, 0.2542288899421692],
        "weights": [-2.1806082980801875, 65.27770596888645],
        "latent_mean": [-0.07276754826307297, 0.02380141243338585, -0.06063798442482948, -0.07832512259483337],
        "latent_std": [0.011847303248941898, 0.00291269738227129, 0.011451750993728638, 0.009144680574536324],
    },
    "denoiser": {
        "losses": [2.215709924697876, 2.177452802658081, 2.175046682357788, 2.10774302482605, 2.0135133266448975,
                   2.011937141418457],
        "weights": [95.29802890282735, 198.64095171676038],
        "ema": [95.2816709540457, 198.63901692115147],
    },
    "probe": {"weights": [47.26884406097997, 98.78565704861285], "train_loss_final": 0.681966,
              "held_out_error_cm": {"mean": 14.651, "median": 13.584, "p90": 24.708}},
    "tiny_preview": {"weights": [1.8217947550120925, 8.315198651010753], "psnr": 57.43220153209289,
                     "linear_psnr": 57.82516651122513},
}
REL = 1e-4


def digest(tensors) -> list[float]:
    """Sum and sum of squares of every tensor of a module or state dict (float64)."""
    values = (tensors.state_dict() if hasattr(tensors, "state_dict") else tensors).values()
    values = list(values)
    return [sum(float(v.double().sum()) for v in values), sum(float(v.double().pow(2).sum()) for v in values)]


def state(module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def interrupt_at(monkeypatch):
    """Make the ``n``-th ``zero_grad`` of any optimizer (the loop calls it once per step, after the
    step's loss is drawn and computed, before backward) raise a KeyboardInterrupt, once."""
    original = torch.optim.Optimizer.zero_grad

    def arm(n: int) -> None:
        calls = [0]

        def zero_grad(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == n + 1:
                raise KeyboardInterrupt
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", zero_grad)

    return arm


# every pixel weighed alike, as the shipped weights were pretrained (and the golden values recorded)
PRETRAIN = dict(data="sample", ae_steps=6, ae_batch_size=4, ae_crop=16, warmup=2, steps=6, batch_size=2, window=4,
                seed=3, moving_weight=0)


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return pretrain._load_frames("sample")[0][:6, :12]


def _fresh_base(cfg: pretrain.PretrainConfig) -> TinyVideo:
    torch.manual_seed(cfg.seed)
    return TinyVideo(TinyVideoConfig(frames=4, image_size=64, width=8, depth=1, ae_width=8, device="cpu"))


def _pretrain_stages(frames: np.ndarray, interrupt=None, at: tuple[str, int] | None = None):
    cfg = pretrain.PretrainConfig(**PRETRAIN)
    base = _fresh_base(cfg)
    if at and at[0] == "autoencoder":
        interrupt(at[1])
    try:
        ae_losses = pretrain.train_autoencoder(base, frames, cfg, progress=False)
    except Interrupted as stop:
        assert stop.step == at[1] and "autoencoder stopped cleanly" in str(stop)
        ae_losses = stop.resume()
    latents = pretrain.encode_episodes(base, frames, progress=False)
    if at and at[0] == "denoiser":
        interrupt(at[1])
    try:
        den_losses, ema = pretrain.train_denoiser(base, latents, cfg, progress=False)
    except Interrupted as stop:
        assert stop.step == at[1] and "denoiser stopped cleanly" in str(stop)
        den_losses, ema = stop.resume()
    return base, ae_losses, den_losses, ema


def test_pretraining_trains_as_it_did_before_the_shared_loop(frames):
    base, ae_losses, den_losses, ema = _pretrain_stages(frames)
    ae, den = GOLDEN["autoencoder"], GOLDEN["denoiser"]
    assert ae_losses == pytest.approx(ae["losses"], rel=REL)
    assert digest(base.autoencoder) == pytest.approx(ae["weights"], rel=REL)
    assert base.latent_mean.tolist() == pytest.approx(ae["latent_mean"], rel=REL)
    assert base.latent_std.tolist() == pytest.approx(ae["latent_std"], rel=REL)
    assert den_losses == pytest.approx(den["losses"], rel=REL)
    assert digest(base.denoiser) == pytest.approx(den["weights"], rel=REL)
    assert digest(ema) == pytest.approx(den["ema"], rel=REL)


@pytest.mark.parametrize("at", [("autoencoder", 0), ("autoencoder", 3), ("denoiser", 4)])
def test_an_interrupted_pretraining_stage_resumes_bit_exactly(frames, interrupt_at, at):
    base, ae_losses, den_losses, ema = _pretrain_stages(frames)
    again, ae_again, den_again, ema_again = _pretrain_stages(frames, interrupt_at, at)
    assert (ae_again, den_again) == (ae_losses, den_losses)
    assert equal(state(again), state(base)) and equal(ema_again, ema)


def test_an_interrupted_pretrain_run_resumes_into_the_written_weights(tmp_path, interrupt_at, monkeypatch):
    # scoring the weights is validation_loss's subject (test_pretrain_demo.py); here a cheap stand-in
    monkeypatch.setattr(pretrain, "validation_loss", lambda base, **kw: digest(base.denoiser)[1])
    monkeypatch.setattr(pretrain, "reconstruction_psnr", lambda base, *a, **kw: digest(base.autoencoder)[1])
    settings = dict(data="sample", ae_steps=2, steps=3, batch_size=2, ae_batch_size=4, window=4, init="scratch",
                    arch={"width": 8, "depth": 1, "ae_width": 8}, check_clips=0)
    whole = pretrain.pretrain(pretrain.PretrainConfig(**settings, out=str(tmp_path / "a.safetensors")),
                              progress=False)
    interrupt_at(3)  # the denoiser's second step (the autoencoder took two)
    with pytest.raises(Interrupted) as stopped:
        pretrain.pretrain(pretrain.PretrainConfig(**settings, out=str(tmp_path / "b.safetensors")), progress=False)
    assert (stopped.value.name, stopped.value.step, stopped.value.steps) == ("denoiser", 1, 3)
    assert not (tmp_path / "b.safetensors").exists()
    resumed = stopped.value.resume()
    assert (tmp_path / "b.safetensors").is_file()
    assert equal(state(resumed), state(whole))
    assert resumed.card.recipe.val_loss == whole.card.recipe.val_loss


def _probe(tmp_path, name: str) -> ProbeTrainConfig:
    return ProbeTrainConfig(data="sample", out=str(tmp_path / f"{name}.safetensors"), steps=6, batch_size=4, width=8,
                            seed=2)


def test_the_hand_probe_trains_as_it_did_before_the_shared_loop(tmp_path, interrupt_at):
    probe = train_probe(_probe(tmp_path, "whole"), progress=False)
    golden = GOLDEN["probe"]
    assert digest(probe) == pytest.approx(golden["weights"], rel=REL)
    assert probe.provenance["train_loss_final"] == pytest.approx(golden["train_loss_final"], abs=2e-6)
    assert probe.provenance["held_out_error_cm"] == pytest.approx(golden["held_out_error_cm"], abs=2e-3)

    interrupt_at(4)
    with pytest.raises(Interrupted, match=r"hand probe stopped cleanly after step 4 of 6") as stopped:
        train_probe(_probe(tmp_path, "again"), progress=False)
    assert not (tmp_path / "again.safetensors").exists()
    resumed = stopped.value.resume()
    assert equal(state(resumed), state(probe)) and (tmp_path / "again.safetensors").is_file()
    assert resumed.provenance["train_loss_final"] == probe.provenance["train_loss_final"]


def test_the_tiny_preview_distils_as_it_did_with_one_cycle_lr(interrupt_at):
    settings = dict(n_fit=2, n_heldout=1, steps=12, width=8, seed=1)
    tiny = distil_tiny_preview(tiny_base(), **settings)
    golden = GOLDEN["tiny_preview"]
    assert digest(tiny.net) == pytest.approx(golden["weights"], rel=REL)
    assert (tiny.psnr, tiny.linear_psnr) == pytest.approx((golden["psnr"], golden["linear_psnr"]), rel=REL)

    interrupt_at(7)
    with pytest.raises(Interrupted, match=r"tiny preview stopped cleanly after step 7 of 12") as stopped:
        distil_tiny_preview(tiny_base(), **settings)
    resumed = stopped.value.resume()
    assert equal(state(resumed.net), state(tiny.net)) and resumed.psnr == tiny.psnr
