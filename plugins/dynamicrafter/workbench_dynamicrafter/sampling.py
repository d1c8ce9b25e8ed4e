"""DynamiCrafter's objective and its DDIM sampler (written here, step by step as the release samples).

Per step, at DDIM timestep ``t`` (training units, ``0..999``), with ``a = ᾱ_t`` and ``a' = ᾱ`` of the
next (smaller) DDIM timestep (``ᾱ_0`` after the last step):

1. the model output of each guidance branch, each through ``compose_fn`` with its own conditions:
   text CFG ``u + s (c - u)``, or the multi-condition image CFG ``u + s_img (u_img - u) + s (c - u_img)``
   (``u``: empty text and a zero image, ``u_img``: empty text and the real image), then
   ``guidance_rescale`` (the std ratio of ``c`` over the guided output, mixed in by that factor);
2. ε and x0 from it (v-prediction: ``ε = √a v + √(1-a) x``, ``x0 = √a x - √(1-a) v``);
3. dynamic rescale: ``x0 *= scale_arr[t_next] / scale_arr[t]`` (512 / 1024 models);
4. ``x' = √a' x0 + √(1 - a' - σ²) ε + σ z`` (the root's argument clamped at 0) with
   ``σ = η √((1-a')/(1-a) (1 - a/a'))``; ``z`` is drawn every step from the generator, as the
   release draws it, so seeds carry over.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workbench import Batch, Diffusion, StepRecord
from workbench_dynamicrafter.variants import Variant, betas_for, ddim_timesteps, dynamic_scales


class DynamiCrafterDiffusion(Diffusion):
    """The training objective of one variant: its betas (zero-terminal-SNR for 512 / 1024), its
    prediction (ε or v) and its dynamic rescale (the clean latents are scaled by ``scale_arr[t]``
    before noising, as the release trains; ``x0_from_prediction`` undoes it)."""

    def __init__(self, variant: Variant):
        super().__init__(prediction=variant.prediction, schedule="scaled_linear",
                         num_train_timesteps=variant.timesteps, beta_start=variant.linear_start,
                         beta_end=variant.linear_end)
        self.variant = variant
        self.alphas_cumprod = torch.cumprod(1 - betas_for(variant), 0)
        self.scale_arr = (dynamic_scales(variant.dynamic_rescale, variant.timesteps).float()
                          if variant.dynamic_rescale is not None else None)

    def _scale(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor | float:
        if self.scale_arr is None:
            return 1.0
        return self.scale_arr.to(t.device)[t.long()].to(like.dtype).view(-1, *([1] * (like.ndim - 1)))

    def add_noise(self, x0, noise, t):
        return super().add_noise(x0 * self._scale(t, x0), noise, t)

    def target(self, x0, noise, t):
        return super().target(x0 * self._scale(t, x0), noise, t)

    def x0_from_prediction(self, pred, x_t, t):
        return super().x0_from_prediction(pred, x_t, t) / self._scale(t, x_t)

    def describe(self):
        rescale = f", dynamic rescale {self.variant.dynamic_rescale}" if self.scale_arr is not None else ""
        zsnr = ", zero terminal SNR" if self.variant.zero_snr else ""
        return f"DynamiCrafterDiffusion({self.variant.prediction}{zsnr}{rescale})"


def rescale_guided(guided: torch.Tensor, cond: torch.Tensor, factor: float) -> torch.Tensor:
    """Mix ``guided`` rescaled to ``cond``'s per-sample std into ``guided`` by ``factor``."""
    dims = list(range(1, guided.ndim))
    ratio = cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True)
    return factor * (guided * ratio) + (1 - factor) * guided


class DDIMTables:
    """The per-step coefficients of a DDIM run, computed as the release's ``DDIMSampler.make_schedule`` does.

    Indexed by DDIM step ``i`` in ascending timestep order (the loop runs ``i = S-1 .. 0``):

    * ``timesteps`` ``(S,)`` long — the DDIM timesteps (training units, ``0..999``), from
      :func:`~workbench_dynamicrafter.variants.ddim_timesteps` (``uniform``: ``1, 21, ..., 981`` for 50
      steps; ``uniform_trailing``: ``19, 39, ..., 999``);
    * ``a`` ``(S,)`` — ``ᾱ`` at each DDIM timestep (the release's ``ddim_alphas``, read from the float32
      table);
    * ``a_prev`` ``(S,)`` — ``ᾱ`` of the previous DDIM timestep, ``ᾱ_0`` for the first
      (``ddim_alphas_prev``);
    * ``sigma`` ``(S,)`` — ``η √((1 - a') / (1 - a) · (1 - a / a'))`` (``ddim_sigmas``);
    * ``sqrt_a`` / ``sqrt_1ma`` ``(T,)`` — ``√ᾱ_t`` and ``√(1 - ᾱ_t)`` over the whole schedule (the training
      buffers the v-prediction conversions read);
    * ``rescale`` ``(S,)`` or ``None`` — the dynamic rescale factor ``scale_arr[t_prev] / scale_arr[t]``
      (512 / 1024 models), applied to x0 at each step.

    >>> tables = DDIMTables(get_variant("512"), 50, "uniform_trailing", 1.0, torch.device("cpu"))
    >>> tables.timesteps[-3:]                                   # tensor([959, 979, 999])
    """

    def __init__(self, variant: Variant, steps: int, spacing: str, eta: float, device: torch.device):
        abar64 = torch.cumprod(1 - betas_for(variant), 0)
        abar = abar64.float()  # the float32 table the release's DDIM steps read
        ts = ddim_timesteps(spacing, steps, variant.timesteps)
        if int(ts.max()) >= variant.timesteps:
            raise ValueError(
                f"DDIM spacing {spacing!r} with {steps} steps reaches timestep {int(ts.max())}, "
                f"past the schedule's {variant.timesteps}; "
                f"with 'uniform' spacing use a step count that divides {variant.timesteps} "
                f"(e.g. 10, 25, 50), or use 'uniform_trailing'.")
        self.timesteps = ts
        a = abar[ts].double()
        a_prev = torch.cat([abar[:1].double(), a[:-1]])
        sigma = eta * ((1 - a_prev) / (1 - a) * (1 - a / a_prev)).sqrt()
        self.a, self.a_prev, self.sigma = a.float(), a_prev.float(), sigma.float()
        # the v conversions read the training buffers, made from the float64 table
        self.sqrt_a, self.sqrt_1ma = abar64.sqrt().float(), (1 - abar64).sqrt().float()
        if variant.dynamic_rescale is not None:
            arr = dynamic_scales(variant.dynamic_rescale, variant.timesteps).float()[ts]
            self.rescale = torch.cat([arr[:1], arr[:-1]]) / arr
        else:
            self.rescale = None
        self.device = device


Branch = tuple[Batch, ...]


def ddim_loop(x: torch.Tensor, tables: DDIMTables, variant: Variant, *, cond: Batch, uncond: Batch | None,
              uncond_image: Batch | None, guidance_scale: float, image_guidance_scale: float | None,
              guidance_rescale: float, compose_fn: Callable, on_step, generator: torch.Generator | None
              ) -> torch.Tensor:
    """Run every DDIM step from ``x`` (the initial noise); returns the final latents."""
    steps = len(tables.timesteps)
    b = x.shape[0]
    view = (b,) + (1,) * (x.ndim - 1)
    for i in range(steps):
        index = steps - 1 - i
        step_t = int(tables.timesteps[index])
        t = torch.full((b,), step_t, device=x.device, dtype=torch.long)
        out = c = compose_fn(x, t, cond)
        if uncond is not None and guidance_scale != 1.0:
            u = compose_fn(x, t, uncond)
            if uncond_image is not None:
                u_img = compose_fn(x, t, uncond_image)
                out = u + image_guidance_scale * (u_img - u) + guidance_scale * (c - u_img)
            else:
                out = u + guidance_scale * (c - u)
            if guidance_rescale > 0:
                out = rescale_guided(out, c, guidance_rescale)
        a, a_prev, sigma = (v[index].to(x.device) for v in (tables.a, tables.a_prev, tables.sigma))
        if variant.prediction == "v":
            sa, s1 = tables.sqrt_a[step_t].to(x.device), tables.sqrt_1ma[step_t].to(x.device)
            eps = sa * out + s1 * x
            x0 = sa * x - s1 * out
        else:
            eps = out
            x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        if tables.rescale is not None:
            x0 = x0 * tables.rescale[index].to(x.device)
        # 1 - a' - σ² is 0 in exact arithmetic on the first zero-SNR step with eta 1: clamp the rounding
        direction = (1 - a_prev - sigma**2).clamp_min(0).sqrt() * eps
        noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        x_next = a_prev.sqrt() * x0 + direction + sigma.expand(view) * noise
        if on_step is not None:
            on_step(StepRecord(i, steps, t, x, out, x_next))
        x = x_next
    return x
