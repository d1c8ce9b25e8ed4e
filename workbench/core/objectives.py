"""Objectives: what the loss means, and how a prediction becomes an x0 estimate.

Time conventions (the ``t`` every backbone's ``denoise`` receives):

* :class:`FlowMatching` — ``t`` in [0, 1] is the noise level: ``x_t = (1 - t) x0 + t ε``, the
  model predicts the velocity ``ε - x0``.
* :class:`Diffusion` — ``t`` is a training timestep in ``[0, num_train_timesteps)``:
  ``x_t = sqrt(ᾱ_t) x0 + sqrt(1 - ᾱ_t) ε``, the model predicts ε, v or x0.

``noise_level(t)`` maps either to [0, 1] (1 = pure noise) for noise-aware composers, and
``t_for_noise_level(level)`` back; ``x0_from_prediction`` turns a prediction into a clean-sample
estimate and ``prediction_from_x0`` is its inverse (the prediction that estimates a given x0);
``sampling_times(steps)`` is the schedule a plain sampler visits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from workbench.config import check, config_from
from workbench.registry import register


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error over ``(B, C, T, H, W)``; ``mask`` ``(B, T)`` or ``(T,)`` selects frames.

    The mean is over the selected elements only, so masking frames does not shrink the loss.
    """
    # In float32 whatever the model's dtype (a cast a float32 tensor would not need is skipped: same values).
    if pred.dtype != torch.float32:
        pred = pred.float()
    if target.dtype != torch.float32:
        target = target.float()
    err = (pred - target).square()
    if mask is None:
        return err.mean()
    m = (mask if mask.dtype == err.dtype and mask.device == err.device
         else mask.to(device=err.device, dtype=err.dtype))
    if m.ndim == 1:
        m = m.unsqueeze(0).expand(err.shape[0], -1)
    m = m.view(err.shape[0], 1, err.shape[2], *([1] * (err.ndim - 3)))  # (B, 1, T, 1, 1)
    per_frame = err.shape[1] * math.prod(err.shape[3:])
    return (err * m).sum() / (m.sum() * per_frame).clamp_min(1.0)


class Objective:
    """Base class for training objectives.

    Construction (the convention every component follows): an objective with settings has a
    ``config_class`` dataclass that validates itself, takes ``__init__(config=None, **overrides)``
    (a config or its fields by name, never both: see :func:`workbench.config.config_from`), keeps
    the validated config as ``self.config``, and ``build(kind, name, to_dict(self.config))`` rebuilds it.
    """

    prediction_type: str = ""
    config_class: type | None = None

    def sample_t(self, batch_size: int, generator: torch.Generator | None, device) -> torch.Tensor:
        raise NotImplementedError

    def noise_level(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def target(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def x0_from_prediction(self, pred: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The clean-sample estimate ``(B, C, T, H, W)`` the prediction ``pred`` at ``x_t`` implies."""
        raise NotImplementedError

    def prediction_from_x0(self, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The prediction at ``x_t`` whose x0 estimate is ``x0``: the inverse of :meth:`x0_from_prediction`.

        Where ``x_t`` carries (almost) no signal of the prediction (noise level near 0) the
        divisor is clamped at ``1e-4``, so the result stays finite.
        """
        raise NotImplementedError

    def t_for_noise_level(self, level: float) -> float | int:
        """The ``t`` (this objective's units) whose noise level is ``level`` in [0, 1]."""
        raise NotImplementedError(f"{self.describe()} does not map noise levels to t; "
                                  f"define t_for_noise_level.")

    def sampling_times(self, steps: int) -> torch.Tensor:
        """The ``steps + 1`` times a sampler visits from pure noise to clean (this objective's units)."""
        raise NotImplementedError(f"{self.describe()} has no sampling schedule; define sampling_times.")

    def loss(self, pred: torch.Tensor, target: torch.Tensor,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        return masked_mse(pred, target, mask)

    def sample_noise_and_t(self, x0: torch.Tensor, generator: torch.Generator | None = None):
        """Draw ``(noise, t)`` for a training step from ``generator`` only (resumable)."""
        noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        t = self.sample_t(x0.shape[0], generator, x0.device)
        return noise, t

    def callbacks(self) -> tuple:
        return ()

    def describe(self) -> str:
        return type(self).__name__


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.to(like.dtype).view(-1, *([1] * (like.ndim - 1)))  # (B, 1, 1, 1, 1)


@dataclass
class FlowMatchingConfig:
    """``shift``: timestep shift s (t' = s t / (1 + (s - 1) t); 1 = none).
    ``t_sampling``: ``uniform`` or ``logit_normal`` (t = sigmoid(N(logit_mean, logit_std)))."""

    shift: float = 1.0
    t_sampling: Literal["uniform", "logit_normal"] = "uniform"
    logit_mean: float = 0.0
    logit_std: float = 1.0

    def __post_init__(self):
        check(self.shift > 0, "shift", f"must be > 0, got {self.shift}.")
        check(self.logit_std > 0, "logit_std", f"must be > 0, got {self.logit_std}.")


def shift_t(t: torch.Tensor, shift: float) -> torch.Tensor:
    if shift == 1.0:
        return t
    return shift * t / (1 + (shift - 1) * t)


@register("objective", "flow_matching")
class FlowMatching(Objective):
    """Rectified-flow matching with a velocity target ``ε - x0``.

    Args:
        config: A :class:`FlowMatchingConfig`; None takes its defaults.
        **overrides: Fields of the config to change, e.g. ``shift=3.0``.

    Raises:
        ConfigError: When a field is unknown or its value is out of range.
    """

    prediction_type = "velocity"
    config_class = FlowMatchingConfig

    def __init__(self, config: FlowMatchingConfig | None = None, **overrides: Any):
        self.config = config_from(type(self), config, overrides)

    def sample_t(self, batch_size, generator, device):
        c = self.config
        if c.t_sampling == "uniform":
            t = torch.rand(batch_size, generator=generator, device=device)
        else:
            z = torch.randn(batch_size, generator=generator, device=device)
            t = torch.sigmoid(c.logit_mean + c.logit_std * z)
        return shift_t(t, c.shift)

    def noise_level(self, t):
        # (float() of a float32 tensor is the tensor itself)
        return t if t.dtype == torch.float32 else t.float()

    def add_noise(self, x0, noise, t):
        s = _bcast(t, x0)
        return (1 - s) * x0 + s * noise

    def target(self, x0, noise, t):
        return noise - x0

    def x0_from_prediction(self, pred, x_t, t):
        return x_t - _bcast(t, x_t) * pred

    def prediction_from_x0(self, x0, x_t, t):
        return (x_t - x0) / _bcast(t, x_t).clamp_min(1e-4)

    def t_for_noise_level(self, level):
        """``t`` is the noise level."""
        return float(level)

    def sampling_times(self, steps):
        """``steps + 1`` times from 1 to 0, evenly spaced before the shift, float32."""
        return shift_t(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64), self.config.shift).float()

    def describe(self):
        return f"FlowMatching(shift={self.config.shift:g}, t={self.config.t_sampling})"


@dataclass
class DiffusionConfig:
    """``prediction``: eps | v | x0. ``schedule``: linear | scaled_linear | cosine (ᾱ schedule).
    ``beta_start`` / ``beta_end`` apply to the linear schedules."""

    prediction: Literal["eps", "v", "x0"] = "eps"
    schedule: Literal["linear", "scaled_linear", "cosine"] = "linear"
    num_train_timesteps: int = 1000
    beta_start: float = 1e-4
    beta_end: float = 0.02

    def __post_init__(self):
        check(self.num_train_timesteps >= 2, "num_train_timesteps",
              f"must be >= 2, got {self.num_train_timesteps}.")
        check(0 < self.beta_start < self.beta_end < 1, "beta_start",
              f"need 0 < beta_start < beta_end < 1, got {self.beta_start}, {self.beta_end}.")


def alphas_cumprod(schedule: str, n: int, beta_start: float = 1e-4, beta_end: float = 0.02) -> torch.Tensor:
    """ᾱ_t for t = 0..n-1 (float64)."""
    if schedule == "linear":
        betas = torch.linspace(beta_start, beta_end, n, dtype=torch.float64)
    elif schedule == "scaled_linear":
        betas = torch.linspace(beta_start**0.5, beta_end**0.5, n, dtype=torch.float64) ** 2
    elif schedule == "cosine":
        s = 0.008
        steps = torch.arange(n + 1, dtype=torch.float64) / n
        f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
        betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return torch.cumprod(1 - betas, dim=0)


@register("objective", "diffusion")
class Diffusion(Objective):
    """DDPM-style diffusion with ε, v or x0 prediction.

    Args:
        config: A :class:`DiffusionConfig`; None takes its defaults.
        **overrides: Fields of the config to change, e.g. ``prediction="v"``.

    Raises:
        ConfigError: When a field is unknown or its value is out of range.
    """

    config_class = DiffusionConfig

    def __init__(self, config: DiffusionConfig | None = None, **overrides: Any):
        self.config = c = config_from(type(self), config, overrides)
        self.prediction_type = c.prediction
        self.alphas_cumprod = alphas_cumprod(c.schedule, c.num_train_timesteps, c.beta_start, c.beta_end)
        self._tables: dict[torch.device, torch.Tensor] = {}

    def _abar(self, t: torch.Tensor) -> torch.Tensor:
        table = self._tables.get(t.device)
        if table is None:  # one copy per device, not one transfer per call
            table = self._tables[t.device] = self.alphas_cumprod.to(t.device)
        return table[t.long().clamp(0, len(table) - 1)]

    def coefficients(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(alpha_t, sigma_t) = (sqrt(ᾱ_t), sqrt(1 - ᾱ_t))``, each ``(B,)`` float32."""
        abar = self._abar(t)  # float64: 1 - ᾱ near t = 0 needs the precision
        return abar.sqrt().float(), (1 - abar).sqrt().float()

    def sample_t(self, batch_size, generator, device):
        return torch.randint(0, self.config.num_train_timesteps, (batch_size,), generator=generator,
                             device=device)

    def noise_level(self, t):
        return self.coefficients(t)[1]

    def add_noise(self, x0, noise, t):
        a, s = self.coefficients(t)
        return _bcast(a, x0) * x0 + _bcast(s, x0) * noise

    def target(self, x0, noise, t):
        if self.prediction_type == "eps":
            return noise
        if self.prediction_type == "x0":
            return x0
        a, s = self.coefficients(t)
        return _bcast(a, x0) * noise - _bcast(s, x0) * x0

    def x0_from_prediction(self, pred, x_t, t):
        if self.prediction_type == "x0":
            return pred
        a, s = (_bcast(c, x_t) for c in self.coefficients(t))
        if self.prediction_type == "eps":
            return (x_t - s * pred) / a
        return a * x_t - s * pred

    def prediction_from_x0(self, x0, x_t, t):
        if self.prediction_type == "x0":
            return x0
        a, s = (_bcast(c, x_t) for c in self.coefficients(t))
        eps = (x_t - a * x0) / s.clamp_min(1e-4)
        return eps if self.prediction_type == "eps" else a * eps - s * x0

    def t_for_noise_level(self, level):
        """The training timestep whose ``sqrt(1 - ᾱ_t)`` is closest to ``level``."""
        sigma = (1 - self.alphas_cumprod).sqrt()  # increasing in t
        return int((sigma - float(level)).abs().argmin())

    def sampling_times(self, steps):
        """``steps`` timesteps from ``num_train_timesteps - 1`` down to 0 (rounded, long), then ``-1``:
        clean."""
        n = self.config.num_train_timesteps
        ts = torch.linspace(n - 1, 0, steps, dtype=torch.float64).round().long()
        return torch.cat([ts, torch.tensor([-1])])

    def describe(self):
        c = self.config
        return f"Diffusion({c.prediction}, {c.schedule}, T={c.num_train_timesteps})"
