"""Predicting whole clips the way a world model is asked to: from what the backbone generates from.

An evaluation compares, clip by clip, what the frozen base alone predicts, what base + adapter
predicts with the clip's own conditions, and what it predicts with someone else's. The shared
part is here, for any backbone, at the clip size its contract states
(:meth:`~workbench.core.backbone.BaseVideoModel.clip`):

* :func:`generation_request` — the raw request for a batch of clips: what the backbone generates
  from (its ``generation_inputs``: the first frame for an image-to-video mode, the clip's length
  and frame size otherwise); every
  other tensor of the clips as a condition; their text fields (e.g. a Meta-World ``task``, which a
  ``prompt_key: task`` backbone reads) as lists;
* :func:`predict_clips` — every clip predicted with the backbone's own sampler and a seeded
  generator per chunk of clips (the same noise for every variant of an evaluation), decoded to
  uint8 frames; chunks never exceed :func:`~workbench.core.backbone.max_generate_batch`.

The world-model study (``workbench.worldmodel.evaluate``) builds its three variants and its
scores on these; ``workbench.testing.check_backbone`` predicts two clips through them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from workbench.core.backbone import generation_inputs, max_generate_batch
from workbench.core.card import TEXT_MODES
from workbench.errors import DataError
from workbench.inspect.recording.settings import check_with_adapter


def _collated(clips: Sequence[Mapping[str, Any]], key: str) -> Any:
    values = [c[key] for c in clips]
    if isinstance(values[0], str):
        return values
    return torch.stack([torch.as_tensor(v) for v in values])


def generation_request(base, clips: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The raw generation request for ``clips``
    (each ``{"video": (3, T, H, W) in [-1, 1], <conditions>, <text>}``).

    What the backbone generates from, as its ``generation_inputs(video)`` says (an image-to-video mode:
    the first frames ``"image"`` ``(B, 3, H, W)``; otherwise the clips' ``"frames"`` / ``"height"`` /
    ``"width"``). Every
    other tensor of the clips goes in stacked (``action`` ``(B, T, D)``, a control video ...), and,
    for a mode that reads text, every str as a list (a prompt, or a task name a backbone's
    ``prompt_key`` reads); other plain values (episode numbers ...) are left out.
    """
    if not clips:
        raise DataError("generation_request: no clips were given.")
    first = clips[0]
    if "video" not in first:
        raise DataError(f"generation_request: clips need their 'video' (3, T, H, W), "
                        f"got keys {sorted(first)}.")
    video = torch.stack([torch.as_tensor(c["video"]) for c in clips])
    request: dict[str, Any] = dict(generation_inputs(base, video))
    reads_text = base.card.serving in TEXT_MODES  # a mode without text refuses it rather than ignore it
    for key, value in first.items():
        if key == "video":
            continue
        if ((isinstance(value, str) and reads_text)
                or (isinstance(value, torch.Tensor) and value.is_floating_point())):
            request[key] = _collated(clips, key)
    return request


def predict_clips(model, clips: Sequence[Mapping[str, Any]], *, steps: int | None = None, seed: int = 0,
                  chunk: int = 12, with_adapter: bool = True, gate: torch.Tensor | None = None,
                  on_chunk: Callable[[int], None] | None = None, offset: int = 0,
                  **sampler_kwargs: Any) -> np.ndarray:
    """Every clip of ``clips`` predicted by ``model`` (a :class:`~workbench.core.composed.ComposedModel`), as
    uint8 frames ``(N, T, H, W, 3)``.

    Clips are generated ``chunk`` at a time (at most the backbone's ``max_generate_batch``) from
    :func:`generation_request`, with the backbone's own sampler, ``steps`` (default the card's)
    and a generator seeded ``seed * 7919 + index of the chunk's first clip``, so every variant of
    an evaluation sees the same noise. ``with_adapter=False`` predicts with the frozen base alone;
    ``gate`` samples with that gate instead of the learned one (a ``GatedResidual`` composer's
    ``override_gate``). ``on_chunk(n)`` is called after each chunk of ``n`` clips; ``sampler_kwargs``
    go to ``generate`` (e.g. ``guidance_scale``). ``offset``: the index of ``clips[0]`` in a longer
    list whose chunks these are (its noise is seeded by that index), so a list's chunks can be
    predicted apart, e.g. in two processes (:meth:`workbench.train.ahead.BaseAhead.predict`).
    """
    from workbench.metrics import to_uint8_video

    check_with_adapter(with_adapter, who="predict_clips: ")
    base = model.base
    limit = max_generate_batch(base)
    chunk = max(1, min(chunk, limit) if limit else chunk)
    videos = []
    for lo in range(0, len(clips), chunk):
        part = clips[lo:lo + chunk]
        batch = base.prepare_batch(generation_request(base, part))
        generator = torch.Generator(device=base.device).manual_seed(seed * 7919 + offset + lo)
        was_enabled, model.adapter_enabled = model.adapter_enabled, with_adapter
        try:
            override = (model.composer.override_gate(gate) if with_adapter and gate is not None
                        else contextlib.nullcontext())
            with override:
                latents = model.generate(batch, steps=steps, generator=generator, **sampler_kwargs)
        finally:
            model.adapter_enabled = was_enabled
        with torch.no_grad():
            videos.append(to_uint8_video(base.decode(latents)))
        if on_chunk is not None:
            on_chunk(len(part))
    return np.concatenate(videos)


__all__ = ["generation_request", "predict_clips"]
