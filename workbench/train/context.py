"""Training against drift: where a training window's context frames come from.

A world model rolled out chunk by chunk continues each chunk from the frames it **produced**, but an
adapter trained on recorded windows only ever saw **recorded** context frames (the image condition,
the first ``card.context_frames`` frames of a window): its errors compound over an episode (exposure
bias). ``training.context`` changes the context of some training windows before the loss:

```yaml
training:
  context: {source: self_forwarded, p: 0.5, steps: 2}
```

* ``recorded`` (the default): the windows as the data serves them; the loop is exactly the one
  without this block.
* ``self_forwarded``: with probability ``p`` a window's context frames are the model's own
  prediction of them, made from an earlier window of the same episode that starts ``stride`` frames
  before (default: the clip's frames minus the context frames, a rollout's stride), or from the
  episode's first frame when that is nearer. The earlier window is sampled with the backbone's own
  sampler in ``steps`` steps (``steps: 1`` from pure noise is the one-step x0 estimate) under
  ``no_grad``: the gradient is truncated there, as in Self Forcing. The frames go through pixels as a
  rollout hands them on (decoded, rounded to 8 bits, encoded again where the data holds latents).
  ``gate_scale`` samples them with the learned gate scaled, as a rollout sampled with a scaled gate
  does. A window at an episode's first frame keeps its recorded context.
* ``corrupted``: with probability ``p`` the context is moved towards Gaussian noise,
  ``z' = (1 - s) z + s e`` with the level ``s`` drawn uniformly in ``[0, max_level]`` (0 for the
  windows not picked), on the context as the backbone is given it (its latents when the data is a
  latent cache, else its pixels). Every window's level reaches the adapter as the per-clip condition
  :data:`CONTEXT_NOISE` ``(B,)``; an adapter reads it by declaring :data:`CONTEXT_NOISE_CONDITION`.
  At sampling time it is absent (a clean context, which an adapter reads as level 0) unless the batch
  sets it.

Self-forwarded contexts need to find the earlier window, in data whose items say their ``episode``
and ``start``: a dataset with ``window_at(episode, start)``, the window at any start of an episode
(the ``metaworld`` and ``lerobot`` datasets have it; a latent cache of one keeps it), reads the window
exactly ``stride`` frames back; else a map-style dataset whose ``index`` lists each item's
``(episode, start)`` gives the farthest window back within ``stride`` that it holds.

Measured on the Meta-World world model (12 held-out 144-frame episodes rolled out with 8 sampling
steps and the gate doubled, hand error in cm, worst of 10 chunks, the state read off the produced
frames / the recorded state): trained on recorded context 20.2 / 17.8; corrupted context (``p`` 0.5,
``max_level`` 0.3, 600 steps) 20.2; self-forwarded context from 2-step samples (``p`` 0.5, 600 steps)
18.5 / 13.2, the best of the remedies tried (the guide "Train against drift" has the table). So
``self_forwarded`` with ``steps: 2`` is the recommended setting.

Every draw (which windows, the levels, the noise, the sampler's noise) comes from a generator seeded
by the run's seed, the step and the micro-batch (:func:`~workbench.train.seeds.mix_seed`), so a
resumed run and a run on several ranks draw what one uninterrupted process draws.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from workbench.config import Problems, raise_problems
from workbench.core.backbone import latent_frames
from workbench.core.conditions import Condition
from workbench.errors import DataError
from workbench.train.seeds import mix_seed

SOURCES = ("recorded", "corrupted", "self_forwarded")

#: The per-clip condition holding each window's context corruption level ``(B,)`` in ``[0, 1]``.
CONTEXT_NOISE = "context_noise"
#: What an adapter declares to read :data:`CONTEXT_NOISE` (``None`` when the batch does not set it: a
#: clean context, level 0).
CONTEXT_NOISE_CONDITION = Condition(CONTEXT_NOISE, required=False)

# Separates the context's draws from every other stream seeded by (seed, step, micro).
_STREAM = 0xC0_17E7


@dataclass
class ContextConfig:
    """``training.context``: where training windows' context frames come from (see the module docstring).

    Attributes:
        source: ``recorded`` (the windows as served; the loop exactly as without this block),
            ``corrupted`` or ``self_forwarded``.
        p: The share of the windows given the other context, drawn per window, in [0, 1].
        max_level: ``corrupted``: the largest noise level, in (0, 1].
        steps: ``self_forwarded``: sampling steps of the earlier window (1: the one-step estimate).
        stride: ``self_forwarded``: how far back the earlier window starts (null: the clip's frames minus
            ``card.context_frames``, a rollout's stride).
        gate_scale: ``self_forwarded``: sample the earlier window with the learned gate times this (null:
            the gate as learned).

    Raises:
        ConfigError: Every value out of range at once, each with its field.

    Examples:
        >>> ContextConfig(source="self_forwarded", p=0.5).label()
        'trained on produced context p=0.5 (2-step samples)'
        >>> ContextConfig().label()
        'trained on recorded context'
    """

    source: Literal["recorded", "corrupted", "self_forwarded"] = "recorded"
    p: float = 0.5
    max_level: float = 0.3
    steps: int = 2
    stride: int | None = None
    gate_scale: float | None = None

    def __post_init__(self):
        problems = Problems()
        if self.source not in SOURCES:
            from workbench.errors import did_you_mean

            problems.add("source", f"must be one of {', '.join(SOURCES)}, got {self.source!r}."
                                   f"{did_you_mean(str(self.source), SOURCES)}")
        if not (isinstance(self.p, (int, float)) and 0.0 <= self.p <= 1.0):
            problems.add("p", f"must be in [0, 1] (the share of windows given another context), "
                              f"got {self.p!r}.")
        if not (isinstance(self.max_level, (int, float)) and 0.0 < self.max_level <= 1.0):
            problems.add("max_level", f"must be in (0, 1] (the most noise a corrupted context gets), "
                                      f"got {self.max_level!r}.")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            problems.add("steps", f"must be an int >= 1 (sampling steps of a self-forwarded context; "
                                  f"1 is the one-step estimate), got {self.steps!r}.")
        if self.stride is not None and (isinstance(self.stride, bool) or not isinstance(self.stride, int)
                                        or self.stride < 1):
            problems.add("stride", f"must be an int >= 1 or null (the clip's frames minus its context "
                                   f"frames), got {self.stride!r}.")
        if self.gate_scale is not None and not self.gate_scale > 0:
            problems.add("gate_scale", f"must be > 0 or null (the learned gate as it is), "
                                       f"got {self.gate_scale!r}.")
        raise_problems(problems, header="Invalid training.context")

    @property
    def active(self) -> bool:
        """Whether any window gets another context than the recorded one."""
        return self.source != "recorded" and self.p > 0

    def label(self) -> str:
        """A short text saying what context an adapter trained with this setting expects.

        Returns:
            E.g. ``trained on produced context p=0.5 (2-step samples)``.
        """
        if not self.active:
            return "trained on recorded context"
        if self.source == "corrupted":
            return f"trained on corrupted context p={self.p:g}, level <= {self.max_level:g}"
        what = "one-step estimates" if self.steps == 1 else f"{self.steps}-step samples"
        return f"trained on produced context p={self.p:g} ({what})"


def context_label(config: Mapping[str, Any] | None) -> str:
    """The :meth:`ContextConfig.label` of a run's resolved config.

    Args:
        config: A run's ``config.yaml`` as a mapping (``exp.resolved_config()``), or None.

    Returns:
        The label; ``trained on recorded context`` for a run that sets no ``training.context``.
    """
    block = ((config or {}).get("training") or {}).get("context") or {}
    return ContextConfig(**block).label()


def _context_key(raw: Mapping[str, Any]) -> str:
    if isinstance(raw.get("latents"), torch.Tensor):
        return "latents"
    video = raw.get("video")
    if isinstance(video, torch.Tensor) and video.ndim == 5 and video.is_floating_point():
        return "video"
    raise DataError(
        f"training.context: the batch holds no context to replace: it needs 'latents' (a latent cache's "
        f"items) or 'video' as a float tensor (B, 3, T, H, W) in [-1, 1]; got keys {sorted(raw)}. "
        f"Serve one of them, or set training.context.source: recorded."
    )


class ContextSource:
    """Gives a training micro-batch the context ``config`` says (:meth:`apply`, then :meth:`finish`).

    ``model`` is the run's :class:`~workbench.core.composed.ComposedModel`; ``seed`` the run's seed.
    """

    def __init__(self, config: ContextConfig, model: Any, seed: int):
        self.config, self.model, self.seed = config, model, seed
        base = model.base
        self.context = int(getattr(base.card, "context_frames", 1))
        self.window = base.clip().frames
        self.stride = config.stride if config.stride is not None else self.window - self.context
        self._source: Any = None
        self._window_at: Any = None
        self._where: dict[tuple[int, int], int] = {}
        #: In this process so far: the training windows seen, and how many of them were given another context.
        self.counts = {"windows": 0, "changed": 0}

    # -- the data the earlier windows come from ---------------------------------------------------------
    def bind(self, source: Any) -> None:
        """Read earlier windows from ``source`` (the dataset the loop's stream reads)."""
        if source is self._source or self.config.source != "self_forwarded":
            return
        window_at = getattr(source, "window_at", None)
        if callable(window_at):
            self._source, self._window_at, self._where = source, window_at, {}
            return
        index = getattr(source, "index", None)
        if index is None or not hasattr(source, "__getitem__"):
            raise DataError(
                f"training.context: self_forwarded needs a map-style dataset whose index lists each item's "
                f"(episode, start), to find a window's earlier window; got {type(source).__name__}"
                f"{' without an index' if index is None else ''}. Use such a dataset (metaworld, lerobot), "
                f"or source: corrupted, which needs none."
            )
        self._source, self._window_at = source, None
        self._where = {(int(e), int(s)): i for i, (e, s) in enumerate(index)}

    def _earlier(self, episode: int, start: int) -> tuple[Any, int] | None:
        """``(the earlier window's item, offset of the context in it)``, or None: the window ``stride``
        frames back (from the episode's start when it is nearer) when the data serves any start
        (``window_at``), else the farthest one back within ``stride`` that its ``index`` holds."""
        if start <= 0:
            return None
        if self._window_at is not None:
            k = min(self.stride, start)
            return (episode, start - k), k
        for k in range(min(self.stride, start), 0, -1):
            i = self._where.get((episode, start - k))
            if i is not None:
                return i, k
        return None

    def _item(self, where: Any) -> dict[str, Any]:
        return self._window_at(*where) if self._window_at is not None else self._source[where]

    # -- one micro-batch ----------------------------------------------------------------------------------
    def apply(self, raw: Mapping[str, Any], step: int, micro: int) -> tuple[dict[str, Any], torch.Tensor]:
        """``raw`` with the context of the windows picked replaced (new tensors; ``raw`` is untouched), and
        each window's corruption level ``(B,)`` (zeros unless ``source: corrupted``)."""
        c = self.config
        key = _context_key(raw)
        value = raw[key]
        b = value.shape[0]
        g = torch.Generator().manual_seed(mix_seed(self.seed, step, micro, _STREAM))
        pick = torch.rand(b, generator=g) < c.p
        level = torch.zeros(b)
        n = self.context if key == "video" else latent_frames(self.model.base, self.context)
        out = dict(raw)
        self.counts["windows"] += b
        if c.source == "corrupted":
            level = torch.where(pick, torch.rand(b, generator=g) * c.max_level, level)
            noise = torch.randn(value[:, :, :n].shape, generator=g).to(value.dtype)
            s = level.to(value.dtype).view(-1, *([1] * (value.ndim - 1)))
            changed = value.clone()
            changed[:, :, :n] = (1 - s) * value[:, :, :n] + s * noise.to(value.device)
            out[key] = changed
            self.counts["changed"] += int(pick.sum())
        elif c.source == "self_forwarded":
            chosen, plan = [], []
            if pick.any():
                episodes = torch.as_tensor(raw["episode"]).reshape(-1).tolist()
                starts = torch.as_tensor(raw["start"]).reshape(-1).tolist()
                for i in range(b):
                    found = self._earlier(int(episodes[i]), int(starts[i])) if pick[i] else None
                    if found is not None:
                        chosen.append(i)
                        plan.append(found)
            if chosen:
                seed = mix_seed(self.seed, step, micro, _STREAM, 1)
                frames = self._produced(plan, seed)                             # (N, 3, c, H, W)
                if key == "latents":
                    with torch.no_grad():
                        frames = self.model.base.encode(frames)[:, :, :n]
                changed = value.clone()
                changed[chosen, :, :n] = frames.to(device=value.device, dtype=value.dtype)
                out[key] = changed
                self.counts["changed"] += len(chosen)
        return out, level

    def _produced(self, plan: list[tuple[int, int]], seed: int) -> torch.Tensor:
        """The model's own frames at the context's place in each earlier window: pixels ``(N, 3, c, H, W)``
        in [-1, 1], on the 8-bit grid a rollout hands frames on with."""
        from torch.utils.data import default_collate

        model = self.model
        raw = default_collate([self._item(where) for where, _ in plan])
        batch = model.base.prepare_batch(raw)
        device = batch.latents.device
        generator = torch.Generator(device=device).manual_seed(seed)
        with self._gate(), torch.no_grad():
            latents = model.generate(batch, steps=self.config.steps, generator=generator)
            video = model.base.decode(latents)                                  # (N, 3, T, H, W)
        picked = torch.stack([video[j, :, k:k + self.context] for j, (_, k) in enumerate(plan)])
        return ((picked.double() + 1.0) * 127.5).round().clamp(0, 255).div(127.5).sub(1.0).float()

    @contextlib.contextmanager
    def _gate(self):
        if self.config.gate_scale is None:
            yield
            return
        from workbench.core.composers import scaled_gate

        composer = self.model.composer
        with composer.override_gate(scaled_gate(composer, self.config.gate_scale)):
            yield

    def finish(self, batch: Any, level: torch.Tensor) -> Any:
        """The prepared ``batch`` with :data:`CONTEXT_NOISE` set (``source: corrupted`` only)."""
        if self.config.source != "corrupted":
            return batch
        level = level.to(device=batch.latents.device, dtype=batch.latents.dtype)
        cond = {**batch.cond, CONTEXT_NOISE: level}
        return dataclasses.replace(batch, cond=cond)


__all__ = ["CONTEXT_NOISE", "CONTEXT_NOISE_CONDITION", "SOURCES", "ContextConfig", "ContextSource",
           "context_label"]
