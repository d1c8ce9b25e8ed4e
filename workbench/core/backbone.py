"""The backbone contract: a frozen pretrained video model the adapters sit on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.core.card import ModelCard
from workbench.core.conditions import Batch
from workbench.errors import CompositionError, DataError

ComposeFn = Callable[[torch.Tensor, torch.Tensor, Batch], torch.Tensor]


@dataclass
class StepRecord:
    """What every native sampler reports after each step (one shape for all samplers).

    ``t`` is in the objective's units (``(B,)``); ``x_t`` entered the step, ``prediction`` is
    what the sampler used (composed when an adapter is injected), ``x_next`` left it.
    """

    index: int
    steps: int
    t: torch.Tensor
    x_t: torch.Tensor
    prediction: torch.Tensor
    x_next: torch.Tensor


OnStep = Callable[[StepRecord], None]


def as_video(value: Any, key: str = "video") -> torch.Tensor:
    """A raw video as float ``(B, 3, T, H, W)`` in [-1, 1], from that or from uint8 ``(B, T, H, W, 3)``."""
    video = torch.as_tensor(value)
    if video.dtype == torch.uint8:
        if video.ndim != 5 or video.shape[-1] != 3:
            raise DataError(f"'{key}' as uint8 must be (B, T, H, W, 3), got {tuple(video.shape)}.")
        return video.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    if video.ndim != 5 or video.shape[1] != 3:
        raise DataError(f"'{key}' must be (B, 3, T, H, W) float in [-1, 1] or uint8 (B, T, H, W, 3), got "
                        f"{tuple(video.shape)} {video.dtype}.")
    return video.float()


class BaseVideoModel(nn.Module):
    """A frozen video diffusion / flow model.

    Subclasses set ``card`` (a :class:`ModelCard`) and implement ``provides``,
    ``prepare_batch``, ``encode``, ``decode``, ``denoise`` and ``_generate`` (the native
    sampler). :meth:`generate` fills the request from the card and checks it first.
    """

    card: ModelCard
    config_class: type | None = None
    causal_latents: bool | None = None
    pixel_space: bool | None = None
    decoder_modules: tuple[str, ...] = ("vae", "autoencoder", "first_stage_model", "decoder")
    preview_identity: Callable[[], str] | None = None

    @classmethod
    def config_from(cls, config: Any | None, overrides: Mapping[str, Any]) -> Any:
        """For ``__init__(config=None, **overrides)``: ``config``, or ``config_class(**overrides)``.

        Both at once is a TypeError.
        """
        if config is None:
            return cls.config_class(**overrides)
        if overrides:
            raise TypeError(f"pass either a config ({cls.config_class.__name__}) or keyword overrides, not both")
        return config

    def provides(self) -> tuple[str, ...]:
        """Names of the conditions ``prepare_batch`` supplies."""
        raise NotImplementedError

    def prepare_batch(self, raw: Mapping[str, Any] | Batch) -> Batch:
        """Raw data (video, actions, ...) → :class:`Batch` of clean latents and conditions."""
        raise NotImplementedError

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] → latents ``(B, C, T', H', W')``."""
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents → video ``(B, 3, T, H, W)`` in [-1, 1]."""
        raise NotImplementedError

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: Mapping[str, Any]) -> torch.Tensor:
        """The frozen model's prediction at ``x_t`` (``t`` in the objective's units, ``(B,)``)."""
        raise NotImplementedError

    def constrain(self, prediction: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                  cond: Mapping[str, Any]) -> torch.Tensor:
        """``prediction`` with what the backbone fixes by construction enforced; the identity by default.

        E.g. an image-to-video model whose first frame is given makes every prediction map that
        frame onto its conditioning latent. :class:`ComposedModel` applies it to the composed
        prediction, so what is recorded, recomposed and sampled with is the same tensor.
        """
        return prediction

    def encode_item(self, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """One raw dataset item with the frozen base's work done ahead, or ``None`` if there is none.

        Returns the item with its heavy, frozen part replaced by what :meth:`prepare_batch`
        accepts instead after collation (e.g. ``"video"`` → ``"latents"``, on the CPU).
        ``training.cache_latents`` calls it once per item and reuses the result.
        """
        return None

    def default_objective(self):
        """The objective this backbone was trained with (used when a config names none)."""
        raise NotImplementedError

    def _generate(self, batch: Batch, *, steps: int, sampler: str, generator: torch.Generator | None,
                  compose_fn: ComposeFn, on_step: OnStep | None, **kwargs) -> torch.Tensor:
        raise NotImplementedError

    def generate(self, cond: Mapping[str, Any] | Batch, *, steps: int | None = None,
                 generator: torch.Generator | None = None, compose_fn: ComposeFn | None = None,
                 on_step: OnStep | None = None, sampler: str | None = None, **kwargs) -> torch.Tensor:
        """Run the backbone's own sampler; returns final latents.

        ``compose_fn(x_t, t, batch)`` replaces the base prediction at every step (this is how
        an adapter is injected); ``on_step`` receives a :class:`StepRecord` after each step.
        ``steps`` / ``sampler`` default to the card's and are checked against its recipe.
        """
        steps, sampler = self.card.resolve_steps(steps, sampler)
        batch = cond if isinstance(cond, Batch) else self.prepare_batch(cond)
        fn = compose_fn if compose_fn is not None else (lambda x, t, b: self.denoise(x, t, b.cond))
        with torch.no_grad():
            return self._generate(batch, steps=steps, sampler=sampler, generator=generator,
                                  compose_fn=fn, on_step=on_step, **kwargs)

    def callbacks(self) -> tuple:
        return ()

    @property
    def device(self) -> torch.device:
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        p = next(self.parameters(), None)
        return p.dtype if p is not None else torch.float32


def _eval_only(module: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(module, False)


def freeze(base: nn.Module) -> None:
    """Freeze for real: no gradients, eval mode, and eval mode that ``.train()`` cannot undo.

    Every submodule's ``train`` is pinned to eval, so a parent calling ``.train()`` (an
    experiment, a wrapper, the user's ``model.train()``) cannot silently switch the frozen
    base's dropout or batch norm back to training behaviour.
    """
    if not isinstance(base, nn.Module):
        raise CompositionError(f"The base must be an nn.Module (a BaseVideoModel), got {type(base).__name__}.")
    base.requires_grad_(False)
    for m in base.modules():
        m.train = _eval_only.__get__(m)  # type: ignore[method-assign]
    nn.Module.train(base, False)
