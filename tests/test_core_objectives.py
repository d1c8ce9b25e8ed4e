"""Objectives: targets, noising and x0 estimates against closed-form values; masked losses."""

from __future__ import annotations

import math

import pytest
import torch

from workbench import Diffusion, FlowMatching, Objective
from workbench.core.objectives import alphas_cumprod, masked_mse, shift_t
from workbench.errors import ConfigError

SHAPE = (4, 2, 3, 2, 2)


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g, dtype=torch.float64), torch.randn(SHAPE, generator=g, dtype=torch.float64)


def test_flow_matching_closed_form():
    fm = FlowMatching()
    x0, noise = data()
    t = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    x_t = fm.add_noise(x0, noise, t)
    assert torch.equal(x_t[0], x0[0]) and torch.equal(x_t[3], noise[3])
    assert torch.allclose(x_t[1], 0.75 * x0[1] + 0.25 * noise[1])
    v = fm.target(x0, noise, t)
    assert torch.equal(v, noise - x0)
    assert torch.allclose(fm.x0_from_prediction(v, x_t, t), x0)
    assert fm.prediction_type == "velocity"


def test_flow_matching_shift_and_sampling():
    fm = FlowMatching(shift=3.0)
    g = torch.Generator().manual_seed(0)
    t = fm.sample_t(20_000, g, "cpu")
    assert t.min() >= 0 and t.max() <= 1
    # shifted uniform: P(t' <= 0.5) = P(u <= 0.5 / (3 - 2 * 0.5)) = 0.25
    assert abs((t <= 0.5).float().mean().item() - 0.25) < 0.02
    ln = FlowMatching(t_sampling="logit_normal", logit_mean=0.0, logit_std=1.0)
    t = ln.sample_t(20_000, torch.Generator().manual_seed(1), "cpu")
    logits = torch.log(t / (1 - t))
    assert abs(logits.mean().item()) < 0.03 and abs(logits.std().item() - 1.0) < 0.03


@pytest.mark.parametrize("schedule", ["linear", "scaled_linear", "cosine"])
def test_diffusion_schedules(schedule):
    abar = alphas_cumprod(schedule, 1000)
    assert abar.shape == (1000,)
    assert torch.all(abar[1:] < abar[:-1]) and 0 < abar[-1] < abar[0] < 1


def test_linear_schedule_closed_form():
    abar = alphas_cumprod("linear", 3, 0.1, 0.3)
    assert torch.allclose(abar, torch.tensor([0.9, 0.9 * 0.8, 0.9 * 0.8 * 0.7], dtype=torch.float64))
    c = torch.arange(11, dtype=torch.float64) / 10
    f = torch.cos((c + 0.008) / 1.008 * math.pi / 2) ** 2
    expected = torch.cumprod(f[1:] / f[:-1], 0)
    cosine = alphas_cumprod("cosine", 10)
    assert torch.allclose(cosine[:-1], expected[:-1])
    assert torch.allclose(cosine[-1], expected[-2] * 0.001)  # beta clamped at 0.999


@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_diffusion_targets_and_x0_round_trip(prediction):
    d = Diffusion(prediction=prediction, schedule="linear")
    x0, noise = data()
    t = torch.tensor([0, 10, 500, 999])
    x_t = d.add_noise(x0, noise, t)
    a = d.alphas_cumprod[t].sqrt().view(-1, 1, 1, 1, 1)
    s = (1 - d.alphas_cumprod[t]).sqrt().view(-1, 1, 1, 1, 1)
    assert torch.allclose(x_t, a * x0 + s * noise, atol=1e-6)
    target = d.target(x0, noise, t)
    expected = {"eps": noise, "x0": x0, "v": a * noise - s * x0}[prediction]
    assert torch.allclose(target, expected, atol=1e-6)
    assert torch.allclose(d.x0_from_prediction(target, x_t, t), x0, atol=1e-4)
    assert torch.allclose(d.noise_level(t), s.flatten().float())


# -- what inspect and the backbones ask of an objective -------------------------------------
def test_flow_matching_prediction_from_x0_inverts_the_x0_estimate():
    fm = FlowMatching()
    x0, noise = data()
    t = torch.tensor([0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
    x_t = fm.add_noise(x0, noise, t)
    pred = fm.prediction_from_x0(x0, x_t, t)
    assert torch.allclose(pred, noise - x0)  # the velocity target itself
    assert torch.allclose(fm.x0_from_prediction(pred, x_t, t), x0)
    # at t = 0 every prediction gives x_t back: the divisor is clamped, the result stays finite
    zero = torch.zeros(4, dtype=torch.float64)
    assert torch.equal(fm.prediction_from_x0(x0, x_t, zero), (x_t - x0) / 1e-4)


@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_diffusion_prediction_from_x0_round_trips(prediction):
    d = Diffusion(prediction=prediction)
    x0, noise = data()
    t = torch.tensor([10, 200, 500, 999])
    x_t = d.add_noise(x0, noise, t)
    pred = d.prediction_from_x0(x0, x_t, t)
    assert torch.allclose(pred, d.target(x0, noise, t), atol=1e-5)  # the target that produced x_t
    assert torch.allclose(d.x0_from_prediction(pred, x_t, t), x0, atol=1e-5)
    if prediction == "x0":
        assert pred is x0


def test_t_for_noise_level():
    assert FlowMatching(shift=3.0).t_for_noise_level(0.4) == 0.4
    d = Diffusion()
    for level in (0.1, 0.5, 0.9):
        t = d.t_for_noise_level(level)
        assert isinstance(t, int)
        sigma = (1 - d.alphas_cumprod).sqrt()
        assert abs(float(sigma[t]) - level) == pytest.approx(float((sigma - level).abs().min()))
        assert abs(float(d.noise_level(torch.tensor([t]))) - level) < 2e-3
    assert d.t_for_noise_level(0.0) == 0 and d.t_for_noise_level(1.0) == 999
    with pytest.raises(NotImplementedError, match="Objective does not map noise levels to t"):
        Objective().t_for_noise_level(0.5)


def test_sampling_times():
    times = FlowMatching(shift=3.0).sampling_times(4)
    assert times.dtype == torch.float32
    assert torch.equal(times, shift_t(torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0], dtype=torch.float64), 3.0).float())
    assert times[0] == 1 and times[-1] == 0
    steps = Diffusion(num_train_timesteps=1000).sampling_times(4)
    assert steps.tolist() == [999, 666, 333, 0, -1]  # -1: the clean end
    assert steps.dtype == torch.long


def test_masked_loss_counts_only_selected_frames():
    pred = torch.zeros(2, 1, 3, 1, 1)
    target = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1, 1).expand(2, 1, 3, 1, 1)
    assert masked_mse(pred, target).item() == pytest.approx((1 + 4 + 9) / 3)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    assert masked_mse(pred, target, mask).item() == pytest.approx((4 + 9) / 2)
    assert masked_mse(pred, target, torch.tensor([0.0, 0.0, 1.0])).item() == pytest.approx(9.0)


@pytest.mark.parametrize("make, message", [
    (lambda: FlowMatching(shift=0), "shift: must be > 0, got 0"),
    (lambda: Diffusion(num_train_timesteps=1), "num_train_timesteps: must be >= 2"),
    (lambda: Diffusion(beta_start=0.1, beta_end=0.01), "need 0 < beta_start < beta_end < 1"),
])
def test_objective_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()
