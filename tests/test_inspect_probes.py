"""Probes: the condition table, action and sigma sensitivity (with golden values on toy models
whose answers are known in closed form), the band recommendation, and gate statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import RecordingAdapter, ToyBackbone, raw_batch, tiny_base, toy_raw

from workbench import (
    Add,
    ComposedModel,
    Condition,
    Diffusion,
    FlowMatching,
    GatedResidual,
    MaskMix,
    NoiseGated,
    SideAdapter,
)
from workbench.adapters.latent_residual import LatentResidual
from workbench.core.callbacks import GateStatistics
from workbench.errors import InspectError
from workbench.inspect import action_sensitivity, condition_table, gate_history, gate_statistics, sigma_sensitivity
from workbench.inspect.common import t_for_noise_level

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def toy_model(composer=None, **adapter_kw) -> ComposedModel:
    torch.manual_seed(0)
    return ComposedModel(ToyBackbone(), RecordingAdapter(**adapter_kw), composer or GatedResidual(gate_init=0.5),
                         FlowMatching())


# -- condition table -------------------------------------------------------------------------
def test_condition_table_rows_are_what_the_adapter_sees():
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1, per_frame="mean", dropout=0.5)
    model = ComposedModel(base, adapter, GatedResidual(), base.default_objective())
    raw = raw_batch(b=4)
    rows = {r["name"]: r for r in condition_table(model, raw)}
    action = raw["action"].mean(dim=1)
    assert rows["action"] == {
        "name": "action", "key": "action", "alias": False, "shape": (4, 4), "dtype": "float32", "frames": "mean",
        "dropout": 0.5, "dropout_applied": False, "dropped": 0,
        "min": pytest.approx(float(action.min())), "mean": pytest.approx(float(action.mean())),
        "max": pytest.approx(float(action.max())),
    }
    assert rows["first_frame"]["frames"] == "per-sample" and rows["first_frame"]["shape"] == (4, 4, 4, 4)
    adapter.train()
    dropped = {r["name"]: r for r in condition_table(adapter, raw, step=3)}["action"]
    assert dropped["dropout_applied"] and dropped["dropped"] == int(adapter.view(raw, step=3).dropped("action").sum())


def test_condition_table_reports_aliases_and_missing_optionals():
    consumes = (Condition("action", aliases=("pf_act",), dim=4, per_frame="mean"),
                Condition("proprio", required=False))
    model = ComposedModel(ToyBackbone(provides=("pf_act", "fs")), RecordingAdapter(consumes=consumes), Add(),
                          FlowMatching())
    raw = toy_raw()
    raw["pf_act"] = raw.pop("action")
    rows = {r["name"]: r for r in condition_table(model, raw)}
    assert rows["action"]["key"] == "pf_act" and rows["action"]["alias"] is True
    assert rows["proprio"]["key"] is None and rows["proprio"]["mean"] is None


# -- action sensitivity ----------------------------------------------------------------------
def test_action_sensitivity_matches_the_closed_form():
    # RecordingAdapter: out = mix(x_t) + W @ mean_T(action), so d out / d action_d = W[:, d] everywhere;
    # GatedResidual(0.5) and flow matching: x0 = x_t - t (base + 0.5 out), so d x0 = t * 0.5 * d out.
    model = toy_model()
    levels = (0.2, 0.5, 0.8)
    sens = action_sensitivity(model, toy_raw(b=3), levels=levels, eps=0.05)
    w = model.adapter.proj.weight.detach()
    expected = w.square().mean(dim=0).sqrt().numpy()  # RMS over channels, per action dimension
    assert sens.adapter.shape == (3, 4)
    np.testing.assert_allclose(sens.adapter, np.tile(expected, (3, 1)), rtol=1e-4)
    np.testing.assert_allclose(sens.x0, np.outer(levels, expected) * 0.5, rtol=1e-4)
    assert (sens.swap_gap["x0"] > 0).all() and (sens.swap_gap["adapter"] > 0).all()
    np.testing.assert_allclose(sens.swap_gap["x0"], np.array(levels) * 0.5 * sens.swap_gap["adapter"], rtol=1e-4)
    assert len(sens.rows()) == 12 and sens.rows()[0]["dim"] == 0


def test_swap_gap_is_zero_when_every_clip_has_the_same_actions():
    raw = toy_raw(b=2)
    raw["action"] = raw["action"][:1].expand(2, -1, -1).clone()
    raw["latents"] = raw["latents"][:1].expand(2, -1, -1, -1, -1).clone()
    sens = action_sensitivity(toy_model(), raw, levels=(0.5,))
    assert sens.swap_gap["x0"].tolist() == [0.0] and sens.swap_gap["adapter"].tolist() == [0.0]


def test_action_sensitivity_on_tiny_video_runs_the_base_once_per_level():
    base = tiny_base()
    model = ComposedModel(base, LatentResidual(width=16, depth=1), GatedResidual(gate_init=0.5),
                          base.default_objective())
    calls = [0]
    denoise = base.denoise
    base.denoise = lambda *a: (calls.__setitem__(0, calls[0] + 1), denoise(*a))[1]
    sens = action_sensitivity(model, raw_batch(), levels=(0.3, 0.6))
    assert calls[0] == 2 and sens.adapter.shape == (2, 4)


def test_action_sensitivity_reads_how_far_a_readout_moves_per_unit_of_action(tmp_path, monkeypatch):
    from conftest import nonzero_model

    from workbench.inspect import Readout
    from workbench.inspect.previews.decoding import as_uint8, render_float

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    model = nonzero_model()
    reads = []

    def brightness(frames):  # uint8 [T, H, W, 3] -> the mean colour of each frame [T, 3]
        reads.append(len(frames))
        return frames.reshape(len(frames), -1, 3).mean(axis=1)

    readout = Readout(brightness, name="colour", unit="u")
    raw = raw_batch()
    sens = action_sensitivity(model, raw, levels=(0.4, 0.8), readout=readout, readout_eps=0.5, decode="preview")
    assert sens.readout["adapter"].shape == (2, 4) and (sens.readout["adapter"] > 0).all()
    # tiny_video's base does not read the actions: its prediction, so its readout, does not move (and is not decoded)
    assert (sens.readout["base"] == 0).all()
    assert len(reads) == 2 * (2 * 4 + 2) * 2  # per level: true, swapped and 2 per dimension, for each of 2 clips
    assert sens.readout_name == "colour" and sens.readout_unit == "u" and sens.readout_eps == 0.5
    assert sens.rows()[0]["colour_adapter"] == sens.readout["adapter"][0, 0]
    # the number is the finite difference of the readout, by hand
    obj, batch = model.objective, model.base.prepare_batch(raw)
    from workbench.inspect.common import seeded_noise, t_tensor

    t = t_tensor(obj, 0.8, 2, batch.latents.device)
    x_t = obj.add_noise(batch.latents, seeded_noise(batch, 0), t)
    read = []
    for sign in (1, -1):
        action = batch.cond["action"].clone()
        action[..., 2] += sign * 0.5
        moved = type(batch)(latents=batch.latents, cond={**batch.cond, "action": action}, loss_mask=batch.loss_mask,
                            per_frame=batch.per_frame, meta=batch.meta)
        with torch.no_grad():
            x0 = obj.x0_from_prediction(model.predict(x_t, t, moved, with_adapter=True).composed, x_t, t)
        read.append([brightness(as_uint8(render_float(model.base, x0, "preview", i)))[1:] for i in range(2)])
    expected = np.mean([np.linalg.norm(a - b, axis=-1).mean() for a, b in zip(*read)]) / (2 * 0.5)
    assert sens.readout["adapter"][1, 2] == pytest.approx(expected, rel=1e-6)
    assert (sens.readout_swap_gap > 0).all()
    plain = action_sensitivity(model, raw, levels=(0.4, 0.8))
    assert plain.readout is None and np.array_equal(plain.x0, sens.x0)  # the latent numbers do not change


def test_action_sensitivity_readout_errors():
    model = ComposedModel(tiny_base(), LatentResidual(width=16, depth=1), GatedResidual(), FlowMatching())
    with pytest.raises(InspectError, match="readout must map frames to positions: a callable .* got int"):
        action_sensitivity(model, raw_batch(), readout=3)
    with pytest.raises(InspectError, match="readout_eps must be a positive step for the finite differences, got 0"):
        action_sensitivity(model, raw_batch(), readout=lambda f: f.mean(axis=(1, 2)), readout_eps=0)


# -- sigma sensitivity and the band ----------------------------------------------------------
class BandOracle(SideAdapter):
    """Knows the clean latents (as condition 'x0') and corrects the base exactly, but only for noise
    levels in [lo, hi]; elsewhere it outputs zero."""

    consumes = (Condition("x0", dim=48),)

    def __init__(self, lo: float, hi: float):
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x_t, t, cond, base_output=None):
        s = self.noise_level(t).view(-1, 1, 1, 1, 1)
        velocity = (x_t - cond.x0.view_as(x_t)) / s  # the flow-matching target noise - x0
        inside = ((s >= self.lo) & (s <= self.hi)).to(x_t.dtype)
        return inside * (velocity - base_output)


def oracle_model(lo=0.3, hi=0.7):
    torch.manual_seed(0)
    return ComposedModel(ToyBackbone(provides=("x0",)), BandOracle(lo, hi), Add(), FlowMatching())


def oracle_raw(b=4):
    latents = torch.randn(b, 4, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    return {"latents": latents, "x0": latents.flatten(1)}


def test_sigma_sensitivity_finds_the_band_where_the_adapter_helps():
    sens = sigma_sensitivity(oracle_model(0.3, 0.7), oracle_raw(), levels=LEVELS, condition="x0")
    inside = (sens.levels >= 0.3 - 1e-6) & (sens.levels <= 0.7 + 1e-6)
    assert (sens.adapted[inside] < 1e-8).all()  # the oracle is exact in its band
    np.testing.assert_array_equal(sens.adapted[~inside], sens.base[~inside])
    assert (sens.swapped[inside] > sens.base[inside]).all()  # a wrong clip's x0 is worse than no adapter
    band = sens.recommend_band()
    assert (band.lo, band.hi) == pytest.approx((0.25, 0.75))
    assert band.t_range == pytest.approx((0.25, 0.75))  # flow matching: t is the noise level
    np.testing.assert_allclose(band.levels, [0.3, 0.4, 0.5, 0.6, 0.7])
    gated = band.composer(Add())
    assert isinstance(gated, NoiseGated) and (gated.lo, gated.hi) == pytest.approx((0.25, 0.75))
    assert [r["level"] for r in sens.rows()] == pytest.approx(list(LEVELS))


def test_no_band_is_recommended_when_the_adapter_helps_nowhere():
    model = toy_model(zero=True)
    raw = toy_raw(b=3)
    assert sigma_sensitivity(model, raw, levels=(0.2, 0.8)).recommend_band() is None


def test_band_reaches_the_ends_and_the_noise_gate_is_opened_for_the_probe():
    model = oracle_model(0.0, 1.0)
    model.composer = NoiseGated(Add(), lo=0.6, hi=0.7)  # would hide the adapter almost everywhere
    sens = sigma_sensitivity(model, oracle_raw(), levels=(0.2, 0.5, 0.8), condition="x0")
    assert (sens.adapted < 1e-8).all() and (model.composer.lo, model.composer.hi) == (0.6, 0.7)
    band = sens.recommend_band()
    assert (band.lo, band.hi) == (0.0, 1.0)


def test_noise_levels_map_to_timesteps():
    diffusion = Diffusion()
    t = t_for_noise_level(diffusion, 0.5)
    assert isinstance(t, int) and abs(float(diffusion.noise_level(torch.tensor([t]))) - 0.5) < 2e-3
    assert t_for_noise_level(FlowMatching(shift=3.0), 0.4) == 0.4
    with pytest.raises(InspectError, match=r"noise level 1.5 is outside \[0, 1\]"):
        t_for_noise_level(diffusion, 1.5)


# -- gates -----------------------------------------------------------------------------------
def test_gate_statistics_of_a_bare_composer():
    rows = gate_statistics(NoiseGated(GatedResidual(gate_init=0.5), lo=0.3, hi=0.7), levels=(0.1, 0.5, 0.9))
    assert [r["weight"] for r in rows] == [0.0, 0.5, 0.0]
    assert [r["noise_weight"] for r in rows] == [0.0, 1.0, 0.0]
    assert all(r["gate_mean"] == 0.5 for r in rows)
    per_channel = gate_statistics(GatedResidual(gate_init=0.2, per_channel=True, channels=3), levels=(0.5,))[0]
    assert per_channel["weight_mean"] == pytest.approx(0.2) and per_channel["gate_min"] == pytest.approx(0.2)
    mask = gate_statistics(MaskMix(channels=4, gate_init=0.25, identity_init=False), levels=(0.5,))[0]
    assert mask["weight_mean"] == pytest.approx(0.25) and mask["mask"] == pytest.approx(0.25)


def test_gate_statistics_on_a_batch_measure_the_effective_weight():
    model = toy_model(NoiseGated(GatedResidual(gate_init=0.5), lo=0.4, hi=1.0))
    rows = gate_statistics(model, levels=(0.2, 0.6), batch=toy_raw())
    assert rows[0]["weight"] == 0.0 and rows[1]["weight"] == pytest.approx(0.5, rel=1e-5)
    assert rows[1]["noise_weight_mean"] == 1.0 and rows[1]["gate"] == 0.5


def test_gate_history_from_the_training_callback():
    composer = GatedResidual(gate_init=0.1)
    callback = GateStatistics(composer, every_n_steps=1)
    for step in (0, 10, 20):
        with torch.no_grad():
            composer.gate.fill_(step / 100)
        callback.on_step_end(None, step, {})
    history = gate_history(callback)
    assert history["step"].tolist() == [0, 10, 20]
    np.testing.assert_allclose(history["gate_mean"], [0.0, 0.1, 0.2], atol=1e-7)
    ragged = gate_history([{"step": 0, "a": 1.0}, {"step": 1, "b": 2.0}])
    assert math.isnan(ragged["a"][1]) and ragged["b"].tolist()[1] == 2.0


@pytest.mark.parametrize("call, message", [
    (lambda m: action_sensitivity(m, toy_raw(), condition="acton"),
     r"condition='acton' is not a condition of this model \(conditions: 'action', 'c_concat', 'fs'\)\. "
     r"Did you mean 'action'\?"),
    (lambda m: action_sensitivity(m, toy_raw(b=1)), r"Swapping 'action' between clips needs a batch of at least 2"),
    (lambda m: action_sensitivity(m, toy_raw(), eps=0), r"eps must be a positive step"),
    (lambda m: sigma_sensitivity(m, toy_raw(), levels=(0.5, 2.0)), r"levels must be noise levels in \[0, 1\]"),
    (lambda m: gate_statistics("gated"), r"gate_statistics needs a ComposedModel or a Composer, got str"),
])
def test_probe_error_wording(call, message):
    with pytest.raises(InspectError, match=message):
        call(toy_model())
