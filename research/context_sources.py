"""Rollout-aware training: where a training window's context frame comes from.

A world model rolled out chunk by chunk continues each chunk from the last frame it *produced*,
but an adapter trained on recorded windows only ever saw *recorded* first frames: exposure bias.
This module changes the context of the training windows, some of the time, before the loss:

* **context corruption** (``corrupt_prob``, ``corrupt_max``): the context latent moved along the
  objective's own noising path, ``z' = (1 - s) z + s e`` with ``s ~ U(0, corrupt_max)``; the level
  ``s`` is given to the adapter as the per-clip condition ``context_noise`` (``(B,)``, 0 for a
  clean context), which it reads through :class:`ContextLevelResidual`. At sampling time the level
  is chosen (:func:`sample_with_context_level`; level 0 needs nothing: a missing ``context_noise``
  reads as 0).
* **self-forwarded context** (``self_prob``, ``self_mode``): the context frame ``s`` of a window of
  an episode replaced by the model's own prediction of frame ``s`` from the earlier window that
  starts at ``s - k`` (``k = 15``, the rollout's stride, where the episode allows it, else ``k = s``;
  a window at frame 0 keeps its recorded context). The prediction goes through pixels as a
  rollout's does (decoded, rounded to uint8, encoded again), and no gradient flows through it.
  Three ways to make it:

  - ``x0``: a one-step estimate, ``x0 = x_t - t v`` at ``t = x0_t`` from the recorded window
    noised to ``t`` (``x0_t = 1``: from pure noise, the model's conditional mean);
  - ``sample``: the backbone's own sampler, ``self_steps`` steps from noise (``self_steps = 8``
    is what the rollout evaluation samples);
  - ``cache``: every ``cache_every`` optimizer steps, every context the training windows can need
    is sampled anew with ``self_steps`` steps and kept (a DAgger-style cache of produced frames);
    the windows read it in between.

  ``gate_scale`` is the learned gate's factor the self-forwarding samples with (2: as the rollouts
  sample). ``state``: which hand position accompanies a self-forwarded context, the recorded one
  at frame ``s`` (``recorded``), or the hand probe's reading of the produced frame (``probe``,
  what a rollout gives the next chunk).

Everything is drawn from generators seeded by ``(seed, step)``, so a run is reproducible and a
resumed run draws what the uninterrupted run drew (the cache is rebuilt from the weights at its
refresh step; a resume between refreshes must rebuild it from the refresh step's weights, which
this prototype does not store).

Mechanism in the loop: one hook between ``prepare(raw)`` and ``training_loss(batch)`` that gets
the prepared batch, the raw batch's ``episode`` / ``start`` and the step, and returns the batch
with ``latents[:, :, :c]`` and the backbone's context condition replaced (for ``tiny_video``:
``cond["first_frame"]`` and frame 0 of the latents, so that ``x_t`` and the first-frame pin agree)
and ``cond["context_noise"]`` added. :func:`install` puts it on an
:class:`~workbench.train.AdapterExperiment` by wrapping ``exp.prepare`` (training steps only).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from workbench.adapters.latent_residual import LatentResidual, LatentResidualConfig
from workbench.core.conditions import Batch
from workbench.errors import ConfigError
from workbench.layers import timestep_embedding
from workbench.registry import register

#: The per-clip condition holding a window's context corruption level, ``(B,)`` in [0, 1].
LEVEL_KEY = "context_noise"
#: The per-clip condition saying where a window's context frame comes from, ``(B,)``: 0 recorded, 1 the model's
#: own output (self-forwarded in training; every chunk after the first in a rollout).
SOURCE_KEY = "context_produced"


@dataclasses.dataclass
class ContextConfig:
    """Where training windows' context frames come from (see the module docstring)."""

    corrupt_prob: float = 0.0
    corrupt_max: float = 0.3
    self_prob: float = 0.0
    self_mode: Literal["x0", "sample", "cache"] = "sample"
    self_steps: int = 8
    x0_t: float = 1.0
    cache_every: int = 100
    gate_scale: float | None = 2.0
    state: Literal["recorded", "probe"] = "recorded"
    stride: int = 15
    seed: int = 0
    source_flag: bool = False

    def __post_init__(self):
        problems = []
        for name in ("corrupt_prob", "self_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if not 0.0 <= self.corrupt_max <= 1.0:
            problems.append(f"corrupt_max must be in [0, 1], got {self.corrupt_max!r}")
        if self.self_mode not in ("x0", "sample", "cache"):
            problems.append(f"self_mode must be x0, sample or cache, got {self.self_mode!r}")
        if self.self_steps < 1:
            problems.append(f"self_steps must be >= 1, got {self.self_steps!r}")
        if not 0.0 < self.x0_t <= 1.0:
            problems.append(f"x0_t must be in (0, 1], got {self.x0_t!r}")
        if self.cache_every < 1:
            problems.append(f"cache_every must be >= 1, got {self.cache_every!r}")
        if self.state not in ("recorded", "probe"):
            problems.append(f"state must be recorded or probe, got {self.state!r}")
        if problems:
            raise ConfigError("context training: " + "; ".join(problems) + ".")

    @property
    def active(self) -> bool:
        return self.corrupt_prob > 0 or self.self_prob > 0


def _generator(seed: int, step: int, what: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}/{step}/{what}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class EpisodeBank:
    """Whole training episodes as latents and signals, so that any window of them can be predicted:
    ``latent(row)`` ``[C, F, h, w]`` (an episode encoded frame by frame, as the clips' latents are, when a
    window of it is first asked for: a short run encodes only the episodes it draws), ``action``
    ``[E, F, D]``, ``ee_pos`` ``[E, F, 3]``, ``camera`` ``[12]``; ``row[episode]`` its index."""

    def __init__(self, dataset: Any, base: Any):
        episodes = sorted(set(int(e) for e, _ in dataset.index))
        self.row = {e: i for i, e in enumerate(episodes)}
        self._dataset, self._episodes, self._base, self._latents = dataset, episodes, base, {}
        self.action = torch.from_numpy(np.clip(dataset.read("actions", episodes).astype(np.float32), -1, 1))
        self.ee_pos = torch.from_numpy(dataset.read("ee_pos", episodes).astype(np.float32))
        self.camera = dataset[0].get("camera")
        self.frames = self.action.shape[1]

    def latent(self, row: int) -> torch.Tensor:
        """Episode ``row``'s latents ``[C, F, h, w]``, read and encoded on first use."""
        if row not in self._latents:
            pixels = self._dataset.read("frames", [self._episodes[row]])[0]  # uint8 [F, H, W, 3]
            video = torch.from_numpy(pixels).permute(3, 0, 1, 2)[None].float().div(127.5).sub(1.0)
            with torch.no_grad():
                self._latents[row] = self._base.encode(video)[0]
        return self._latents[row]

    def window(self, episodes: list[int], starts: list[int], length: int) -> dict[str, torch.Tensor]:
        """The raw request of windows ``[start, start + length)`` of ``episodes``."""
        rows = [self.row[e] for e in episodes]
        lat = torch.stack([self.latent(r)[:, s:s + length] for r, s in zip(rows, starts, strict=True)])
        act = torch.stack([self.action[r, s:s + length] for r, s in zip(rows, starts, strict=True)])
        ee = torch.stack([self.ee_pos[r, s:s + length] for r, s in zip(rows, starts, strict=True)])
        out = {"latents": lat, "action": act, "ee_pos": ee}
        if self.camera is not None:
            out["camera"] = torch.as_tensor(self.camera)[None].expand(len(rows), -1).float()
        return out


def through_pixels(base: Any, latents: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """Latent frames ``(N, C, h, w)`` as a rollout hands them on: decoded, rounded to uint8 and
    encoded again. Returns the new latents and the uint8 frames ``[N, H, W, 3]``."""
    with torch.no_grad():
        pixels = base.decode(latents[:, :, None])                      # (N, 3, 1, H, W)
        uint8 = ((pixels.double() + 1.0) * 127.5).round().clamp(0, 255)
        again = base.encode((uint8 / 127.5 - 1.0).float())[:, :, 0]    # (N, C, h, w)
    frames = uint8[:, :, 0].permute(0, 2, 3, 1).to(torch.uint8).numpy()
    return again, frames


class ContextSource:
    """The training hook (see the module docstring): ``apply(batch, raw, step) -> batch``."""

    def __init__(self, config: ContextConfig, model: Any, dataset: Any = None):
        self.config = config
        self.model = model
        self.base = model.base
        self.window = self.base.clip().frames
        self.bank = EpisodeBank(dataset, self.base) if config.self_prob > 0 else None
        self._probe = None
        self._cache: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = {}
        self._cache_step: int | None = None
        #: Per step: how many clips got a self-forwarded / corrupted context (for the run's record).
        self.counts = {"self": 0, "corrupt": 0, "clips": 0}
        self.seconds_in_hook = 0.0

    # -- the earlier window ---------------------------------------------------------------------
    def earlier(self, start: int) -> tuple[int, int] | None:
        """``(earlier start, position of frame start in it)``, or None for a window at frame 0."""
        if start <= 0:
            return None
        k = min(self.config.stride, start)
        return start - k, k

    def _predict(self, episodes: list[int], starts: list[int], step: int) -> tuple[torch.Tensor, np.ndarray]:
        """The model's own prediction of frame ``start`` of each episode, through pixels."""
        c = self.config
        plan = [self.earlier(s) for s in starts]
        raw = self.bank.window(episodes, [p for p, _ in plan], self.window)
        batch = self.base.prepare_batch(raw)
        model = self.model
        was = model.training
        model.train(False)
        try:
            with self._gate(), torch.no_grad():
                if c.self_mode == "x0":
                    g = _generator(c.seed, step, "x0")
                    x0 = batch.latents
                    t = torch.full((x0.shape[0],), c.x0_t)
                    noise = torch.randn(x0.shape, generator=g)
                    x_t = model.objective.add_noise(x0, noise, t)
                    pred = model.predict(x_t, t, batch).composed
                    out = model.objective.x0_from_prediction(pred, x_t, t)
                else:
                    g = _generator(c.seed, step, "sample")
                    out = model.generate(batch, steps=c.self_steps, generator=g)
        finally:
            model.train(was)
        picked = torch.stack([out[i, :, k] for i, (_, k) in enumerate(plan)])
        return through_pixels(self.base, picked)

    @contextlib.contextmanager
    def _gate(self):
        if self.config.gate_scale is None:
            yield
            return
        from workbench.core.composers import scaled_gate

        composer = self.model.composer
        with composer.override_gate(scaled_gate(composer, self.config.gate_scale)):
            yield

    def _refresh_cache(self, step: int, batch_size: int = 24) -> None:
        """Every context the training windows can need, sampled with the current weights."""
        wanted = sorted({(e, s) for e, s in self._dataset_index() if s > 0})
        self._cache = {}
        for lo in range(0, len(wanted), batch_size):
            part = wanted[lo:lo + batch_size]
            lat, frames = self._predict([e for e, _ in part], [s for _, s in part], step * 100_003 + lo)
            for i, key in enumerate(part):
                self._cache[key] = (lat[i], frames[i])
        self._cache_step = step

    def _dataset_index(self):
        return self._index

    def bind_dataset(self, dataset: Any) -> None:
        self._index = [(int(e), int(s)) for e, s in dataset.index]

    def _probe_positions(self, frames: np.ndarray) -> torch.Tensor:
        if self._probe is None:
            from workbench.worldmodel.probe import shipped_probe

            self._probe = shipped_probe()
        return torch.as_tensor(self._probe.positions(frames), dtype=torch.float32)

    # -- the hook -------------------------------------------------------------------------------
    def apply(self, batch: Batch, raw: Any, step: int) -> Batch:
        import time

        c = self.config
        if not c.active:
            return batch
        began = time.process_time()
        b = batch.latents.shape[0]
        latents = batch.latents.clone()
        cond = dict(batch.cond)
        context = latents[:, :, 0].clone()                              # (B, C, h, w)
        self.counts["clips"] += b
        chosen: list[int] = []
        if c.self_prob > 0:
            episodes = torch.as_tensor(raw["episode"]).reshape(-1).tolist()
            starts = torch.as_tensor(raw["start"]).reshape(-1).tolist()
            pick = torch.rand(b, generator=_generator(c.seed, step, "self")) < c.self_prob
            chosen = [i for i in range(b) if pick[i] and starts[i] > 0]
            if chosen:
                if c.self_mode == "cache":
                    if self._cache_step is None or step - self._cache_step >= c.cache_every:
                        self._refresh_cache(step)
                    got = [self._cache[(episodes[i], starts[i])] for i in chosen]
                    lat = torch.stack([g[0] for g in got])
                    frames = np.stack([g[1] for g in got])
                else:
                    lat, frames = self._predict([episodes[i] for i in chosen], [starts[i] for i in chosen], step)
                context[chosen] = lat.to(context.dtype)
                if c.state == "probe" and "ee_pos" in cond:
                    ee = cond["ee_pos"].clone()
                    ee[chosen] = self._probe_positions(frames)[:, None].expand(-1, ee.shape[1], -1).to(ee.dtype)
                    cond["ee_pos"] = ee
                self.counts["self"] += len(chosen)
        produced = torch.zeros(b)
        if c.self_prob > 0 and chosen:
            produced[chosen] = 1.0
        level = torch.zeros(b)
        if c.corrupt_prob > 0:
            g = _generator(c.seed, step, "corrupt")
            pick = torch.rand(b, generator=g) < c.corrupt_prob
            draw = torch.rand(b, generator=g) * c.corrupt_max
            level = torch.where(pick, draw, level)
            noise = torch.randn(context.shape, generator=g)
            s = level.view(-1, 1, 1, 1).to(context.dtype)
            context = (1 - s) * context + s * noise
            self.counts["corrupt"] += int(pick.sum())
        latents[:, :, 0] = context
        cond["first_frame"] = context
        cond[LEVEL_KEY] = level.to(latents.dtype)
        if c.source_flag:
            cond[SOURCE_KEY] = produced.to(latents.dtype)
        self.seconds_in_hook += time.process_time() - began
        return dataclasses.replace(batch, latents=latents, cond=cond)


def install(exp: Any, config: ContextConfig) -> ContextSource | None:
    """Give ``exp``'s training steps the context source ``config`` (nothing when it is inactive).

    It wraps ``exp.prepare``: on training steps (the model in train mode, a raw batch that says
    its clips' ``episode`` and ``start``) the prepared batch goes through :meth:`ContextSource.apply`
    with the step being run; sampling and evaluation are untouched."""
    if not config.active:
        return None
    data = exp.default_data()
    source = ContextSource(config, exp.model, data)
    source.bind_dataset(data)
    plain = exp.prepare

    def prepare(raw):
        batch = plain(raw)
        if exp.model.training and isinstance(raw, dict) and raw.get("episode") is not None:
            batch = source.apply(batch, raw, exp.step)
        return batch

    exp.prepare = prepare
    return source


# -- the adapter that reads the level -------------------------------------------------------------
@dataclasses.dataclass
class ContextLevelResidualConfig(LatentResidualConfig):
    """``latent_residual`` that also reads ``context_noise`` (the context's corruption level) and, with
    ``reads_source``, ``context_produced`` (whether the context is the model's own frame)."""

    reads_source: bool = False


@register("adapter", "latent_residual_context")
class ContextLevelResidual(LatentResidual):
    """:class:`~workbench.adapters.latent_residual.LatentResidual` that also reads how its context was made:
    the corruption level ``context_noise`` (its sinusoidal embedding) and the source ``context_produced``
    (0 recorded, 1 the model's own frame), through a small MLP (last layer zero at init, so the adapter
    starts exactly as ``latent_residual`` does) whose output is added to the noise-level embedding every
    block's FiLM reads. A batch without them reads 0 (a clean, recorded context)."""

    config_class = ContextLevelResidualConfig

    def __init__(self, config: ContextLevelResidualConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        w = self.config.width
        self.context_level = nn.Sequential(nn.Linear(w + int(self.config.reads_source), self.emb_dim), nn.SiLU(),
                                           nn.Linear(self.emb_dim, self.emb_dim))
        nn.init.zeros_(self.context_level[-1].weight)
        nn.init.zeros_(self.context_level[-1].bias)
        self._level: torch.Tensor | None = None
        self.time.register_forward_hook(self._with_level)

    @classmethod
    def from_config(cls, config):
        return cls(config)

    def _with_level(self, module, inputs, out):
        if self._level is None:
            return out
        level, produced = self._level
        described = timestep_embedding(level, self.config.width)
        if self.config.reads_source:
            described = torch.cat([described, produced[:, None].float()], dim=-1)
        return out + self.context_level(described.to(out.dtype))

    def forward(self, x_t, t, cond, base_output=None):
        b = x_t.shape[0]

        def read(key):
            value = cond.get(key)
            if value is None:
                return torch.zeros(b, device=x_t.device)
            value = value.to(x_t.device).reshape(-1)
            return value.expand(b) if value.numel() == 1 else value

        self._level = (read(LEVEL_KEY), read(SOURCE_KEY))
        try:
            return super().forward(x_t, t, cond, base_output)
        finally:
            self._level = None


_CHUNK: contextvars.ContextVar[int | None] = contextvars.ContextVar("rollout_chunk", default=None)


def rollouts_declare_produced() -> None:
    """From here on, every rollout chunk after the first carries ``context_produced = 1`` (the first, from the
    recorded start frame, 0), so an adapter trained with ``source_flag`` is told which context it is given:
    wraps the rollout module's chunk sampler (to know the chunk) and its ``prepare``."""
    import workbench.inspect.recording.rollouts as rollouts

    if getattr(rollouts, "_declares_produced", False):
        return
    plain_chunk, plain_prepare = rollouts._sample_chunk, rollouts.prepare

    def sample_chunk(plan, k, *args, **kwargs):
        token = _CHUNK.set(k)
        try:
            return plain_chunk(plan, k, *args, **kwargs)
        finally:
            _CHUNK.reset(token)

    def prepare(model, request):
        batch = plain_prepare(model, request)
        k = _CHUNK.get()
        if k is not None:
            batch.cond[SOURCE_KEY] = torch.full((batch.latents.shape[0],), float(k > 0),
                                                device=batch.latents.device)
        return batch

    rollouts._sample_chunk, rollouts.prepare, rollouts._declares_produced = sample_chunk, prepare, True


def sample_with_context_level(level: float, seed: int = 1234) -> None:
    """From here on, every ``tiny_video`` backbone built samples with its context corrupted to ``level``
    and the adapter told so (``context_noise``), for the rest of the process: ``prepare_batch`` of a raw
    request moves ``first_frame`` and frame 0 of the latents along the noising path, with noise drawn
    from a generator of the backbone's own, seeded by ``seed``, in call order. Level 0 changes nothing
    (a request without ``context_noise`` reads as level 0)."""
    from workbench.backbones.tiny_video import TinyVideo

    if level <= 0:
        return
    plain_prepare, plain_init = TinyVideo.prepare_batch, TinyVideo.__init__

    def init(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        self._context_level_generator = torch.Generator().manual_seed(seed)

    def prepare(self, raw):
        batch = plain_prepare(self, raw)
        if isinstance(raw, Batch):
            return batch
        z = batch.cond["first_frame"]
        noise = torch.randn(z.shape, generator=self._context_level_generator).to(z.dtype)
        noisy = (1 - level) * z + level * noise
        latents = batch.latents.clone()
        latents[:, :, 0] = noisy
        cond = {**batch.cond, "first_frame": noisy,
                LEVEL_KEY: torch.full((z.shape[0],), float(level), dtype=z.dtype)}
        return dataclasses.replace(batch, latents=latents, cond=cond)

    TinyVideo.__init__, TinyVideo.prepare_batch = init, prepare


__all__ = ["LEVEL_KEY", "SOURCE_KEY", "ContextConfig", "ContextLevelResidual", "ContextSource", "EpisodeBank",
           "install", "rollouts_declare_produced", "sample_with_context_level", "through_pixels"]
