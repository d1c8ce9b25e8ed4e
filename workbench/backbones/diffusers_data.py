"""The data side of a diffusers-native backbone: per-frame signals, prompts, video sizes, the unconditional
batch.

No diffusers import here; :mod:`workbench.backbones.diffusers_bridge` builds on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from workbench.core import Batch
from workbench.core.backbone import CONTROL_KEY, control_video
from workbench.errors import DataError

SIGNAL_KEYS = ("action", "proprio", "ee_pos")  # per-frame signals passed through to adapters
# what prepare_batch supplies: each signal on latent frames and at full rate, and a control video
SIGNAL_CONDITIONS = (*(k for key in SIGNAL_KEYS for k in (key, f"{key}_frames")), CONTROL_KEY)
RAW_ALIASES = {"action": "actions"}  # a raw batch may name a signal so (Meta-World files say "actions")


def raw_signal(raw: Mapping[str, Any], key: str) -> Any:
    """The raw batch's ``key`` signal (or its :data:`RAW_ALIASES` spelling), ``None`` when absent."""
    value = raw.get(key)
    return raw.get(RAW_ALIASES[key]) if value is None and key in RAW_ALIASES else value


def pool_to_latent_frames(signal: torch.Tensor, ratio: int) -> torch.Tensor:
    """Per-frame ``(B, T, D)`` → per-latent-frame ``(B, 1 + (T - 1) / r, D)``: the causal VAE's first
    latent frame covers frame 0, each later one the next ``r`` frames; each gets its frames' mean."""
    first = signal[:, :1]
    rest = signal[:, 1:].unflatten(1, (-1, ratio)).mean(dim=2)  # (B, T' - 1, D)
    return torch.cat([first, rest], dim=1)


def check_video_size(shape: Sequence[int], key: str, *, plugin: str, model: str, temporal: int, spatial: int,
                     patch: int, max_frames: int, example: str) -> None:
    """``(T, H, W)`` of ``key`` fits a causal video VAE (``1 + temporal k`` frames) and the patching, or a
    DataError.

    ``model``: the model's name in the message; ``example``: a size that works for the real model.
    """
    frames, height, width = shape
    multiple = spatial * patch
    problems = []
    if (frames - 1) % temporal:
        sizes = ", ".join(str(1 + k * temporal) for k in range(4))
        problems.append(f"{frames} frames (allowed: 1 + {temporal}k: {sizes}, ..., {max_frames})")
    if height % multiple or width % multiple:
        problems.append(f"{height}x{width} pixels (height and width must be multiples of {multiple})")
    if problems:
        raise DataError(
            f"{plugin}: '{key}' has {' and '.join(problems)}; received shape (T, H, W) = {tuple(shape)}. "
            f"{model}'s VAE compresses {temporal}x in time after the first frame and {spatial}x in space, "
            f"with {patch}x{patch} transformer patches. Crop or resize the clips, e.g. a Meta-World window "
            f"of 9 frames at 64x64, or {example} for the real model."
        )


def requested_frames(raw: Mapping[str, Any], default: int) -> int:
    """How many frames a generation request without video asks for: its signals' length, else ``frames``."""
    for key in SIGNAL_KEYS:
        if (value := raw_signal(raw, key)) is not None:
            return int(torch.as_tensor(value).shape[1])
    if raw.get(CONTROL_KEY) is not None:
        return int(torch.as_tensor(raw[CONTROL_KEY]).shape[2])
    return int(raw.get("frames", default))


def add_signals(cond: dict[str, Any], raw: Mapping[str, Any], *, batch_size: int, frames: int, ratio: int,
                device: torch.device, plugin: str) -> set[str]:
    """Put the raw per-frame signals into ``cond``; returns their (per-frame) keys.

    Each of ``action`` (or ``actions``), ``proprio``, ``ee_pos`` ``(B, T, D)`` is supplied pooled
    onto latent frames (``action``, see :func:`pool_to_latent_frames`) and at full rate
    (``action_frames``). A control video ``control`` ``(B, C, T, H, W)`` is supplied as it is
    (not per-frame: see :func:`~workbench.core.backbone.control_video`).
    """
    keys = set()
    for key in SIGNAL_KEYS:
        value = raw_signal(raw, key)
        if value is None:
            continue
        value = torch.as_tensor(value, device=device).float()
        if value.ndim != 3 or value.shape[0] != batch_size or value.shape[1] != frames:
            raise DataError(f"{plugin}: '{key}' must be (B, T, D) with B={batch_size} and T={frames} frames, "
                            f"got {tuple(value.shape)}.")
        cond[key] = pool_to_latent_frames(value, ratio)
        cond[f"{key}_frames"] = value
        keys |= {key, f"{key}_frames"}
    control = control_video(raw, batch_size=batch_size, frames=frames, device=device, backbone=plugin)
    if control is not None:
        cond[CONTROL_KEY] = control
    return keys


def prompts_from(raw: Mapping[str, Any], key: str, default: str | None, template: str, batch_size: int,
                 plugin: str) -> list[str]:
    """One prompt per clip: ``raw[key]`` (a str, or one str per clip) put into ``template``, else
    ``default``."""
    value = raw.get(key)
    if value is None:
        if default is None:
            raise DataError(
                f"{plugin}.prepare_batch needs the text condition: a '{key}' entry "
                f"(a str, or a list of {batch_size} str), precomputed 'prompt_embeds' (B, L, D), "
                f"or a default prompt in the backbone config "
                f"(prompt: '...'). The batch has keys {sorted(raw)}. Add one of these (for Meta-World clips, "
                f"prompt_key: task reads the task name)."
            )
        return [default] * batch_size
    if isinstance(value, str):
        return [template.format(value)] * batch_size
    if (not (isinstance(value, Sequence) and all(isinstance(v, str) for v in value))
            or len(value) != batch_size):
        raise DataError(f"{plugin}: '{key}' must be a str or a list of {batch_size} str (one per clip), got "
                        f"{type(value).__name__} {value!r:.80}.")
    return [template.format(v) for v in value]


def batch_size_of(raw: Mapping[str, Any], prompt_key: str) -> int:
    """How many clips a generation request without video asks for (signals, embeddings or prompts; else 1)."""
    if raw.get("prompt_embeds") is not None:
        return int(torch.as_tensor(raw["prompt_embeds"]).shape[0])
    for key in (*SIGNAL_KEYS, CONTROL_KEY):
        if (value := raw_signal(raw, key)) is not None:
            return int(torch.as_tensor(value).shape[0])
    prompts = raw.get(prompt_key)
    if isinstance(prompts, Sequence) and not isinstance(prompts, str):
        return len(prompts)
    return int(raw.get("batch_size", 1))


def uncond_batch(batch: Batch, negative: torch.Tensor, **extra: torch.Tensor) -> Batch:
    """The batch the unconditional branch is composed with: the negative prompt, the signals dropped.

    Dropped means zeros, exactly what a condition's dropout feeds the adapter in training, so an
    adapter trained with condition dropout has learned what "unconditional" looks like.
    """
    cond = dict(batch.cond)
    cond["prompt_embeds"] = negative
    cond.update(extra)
    for key in [k for k in cond if k.removesuffix("_frames") in SIGNAL_KEYS]:
        if isinstance(cond[key], torch.Tensor):
            cond[key] = torch.zeros_like(cond[key])
    return Batch(latents=batch.latents, cond=cond, loss_mask=batch.loss_mask, per_frame=batch.per_frame,
                 meta={**batch.meta, "branch": "uncond"})


__all__ = ["CONTROL_KEY", "RAW_ALIASES", "SIGNAL_CONDITIONS", "SIGNAL_KEYS", "add_signals", "batch_size_of",
           "check_video_size", "pool_to_latent_frames", "prompts_from", "raw_signal", "requested_frames",
           "uncond_batch"]
