"""ComposedModel: a frozen base, a trainable adapter and a composer, under one objective.

    prediction = composer(base(x_t, t, cond), adapter(x_t, t, cond, base_output))

The base is frozen for real (no gradients, pinned to eval mode, never in the optimizer) and
its forward runs under ``no_grad`` once per step whenever the adapter can reuse its output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from workbench.core.adapter import Adapter
from workbench.core.backbone import BaseVideoModel, OnStep, constrain, freeze
from workbench.core.card import ModelCard
from workbench.core.composers import ComposeContext, Composer, Diagnostics, Replace, composition_of
from workbench.core.conditions import Batch, Conditioning
from workbench.core.objectives import Objective
from workbench.errors import CompositionError


@dataclass
class Prediction:
    """One composed evaluation: every intermediate the instruments look at."""

    x_t: torch.Tensor
    t: torch.Tensor
    base: torch.Tensor | None  # None: an inside adapter in training (the base alone was not run)
    adapter: torch.Tensor | None
    composed: torch.Tensor
    cond: Conditioning | None
    # what the composer applied: gate, mask, ...
    diagnostics: Diagnostics = field(default_factory=Diagnostics)


_UNREAD = object()


class _Context(ComposeContext):
    """The :class:`ComposeContext` of a prediction, its ``noise_level`` derived from ``t`` by the
    objective when a composer first reads it: most composers never do, and the derivation is
    tensor operations on every call (the same values as computing it up front)."""

    def __init__(self, x_t: torch.Tensor, t: torch.Tensor, step: int | None, objective: Objective):
        self.x_t, self.t, self.step = x_t, t, step
        self._objective, self._noise_level = objective, _UNREAD

    @property
    def noise_level(self) -> torch.Tensor | None:  # type: ignore[override]
        if self._noise_level is _UNREAD:
            self._noise_level = self._objective.noise_level(self.t)
        return self._noise_level

    @noise_level.setter
    def noise_level(self, value: torch.Tensor | None) -> None:
        self._noise_level = value


def _check_parts(base, adapter, composer, objective) -> None:
    wrong = []
    for name, obj, kind in (("base", base, BaseVideoModel), ("adapter", adapter, Adapter),
                            ("composer", composer, Composer), ("objective", objective, Objective)):
        if not isinstance(obj, kind):
            wrong.append(f"{name} must be a workbench.{kind.__name__}, got {type(obj).__name__}")
    if wrong:
        raise CompositionError("; ".join(wrong) + ".")
    card = base.card
    if not isinstance(card, ModelCard):
        raise CompositionError(
            f"{type(base).__name__} has no valid ModelCard (card={card!r}); set `card = ModelCard(...)` "
            f"on the backbone."
        )
    if objective.prediction_type != card.prediction_type:
        raise CompositionError(
            f"Objective {objective.describe()} trains a {objective.prediction_type!r} prediction, but "
            f"{card.model_id!r} predicts {card.prediction_type!r} (its card). Use the backbone's own "
            f"objective (base.default_objective()) or a matching prediction type."
        )
    if adapter.inside and not isinstance(composer, Replace):
        raise CompositionError(
            f"{type(adapter).__name__} works inside the base (it changes the base's own forward), "
            f"so the adapted base's prediction is the prediction; it is composed with Replace, "
            f"got {composer.describe()}. Use composer: {{type: replace}} "
            f"(gates and residual mixes are for adapters beside the base)."
        )
    if adapter.at_init == "zero_output" and composer.starves_zero_adapter:
        raise CompositionError(
            f"{composer.describe()} starts with a closed gate (0) and {type(adapter).__name__} starts with "
            f"a zero output, so neither would ever get a gradient (each one's gradient is the other's "
            f"value). Open the gate a little (e.g. GatedResidual(gate_init=0.1), still the identity at init "
            f"through the zero adapter), or wrap it in PretrainWarmup so the adapter trains first."
        )


@dataclass(frozen=True)
class BaseHalf:
    """The frozen base's half of one training evaluation, as :meth:`ComposedModel.base_half` computes it.

    Everything before the adapter: the noised latents ``x_t`` ``(B, C, T, H, W)``, their ``t``
    ``(B,)``, the loss ``target`` (shaped like ``x_t``) and the frozen base's prediction
    ``base_output`` at ``(x_t, t)``. These depend on the batch and the noise draws only, never on the
    trainable weights, so they can be computed elsewhere (in a second process, a step ahead:
    :mod:`workbench.train.ahead`) and handed to :meth:`ComposedModel.training_loss`.
    """

    x_t: torch.Tensor
    t: torch.Tensor
    target: torch.Tensor
    base_output: torch.Tensor


class ComposedModel(nn.Module):
    """Frozen ``base`` + trainable ``adapter`` + ``composer``, trained under ``objective``.

    Examples:
        >>> from workbench import FlowMatching, GatedResidual
        >>> from workbench.adapters.latent_residual import LatentResidual
        >>> from workbench.backbones.tiny_video import TinyVideo
        >>> tiny = ComposedModel(TinyVideo(image_size=16, frames=4, width=16, ae_width=8, depth=1),
        ...                      LatentResidual(width=16, depth=1), GatedResidual(), FlowMatching())
        >>> clips = {"video": torch.rand(2, 3, 4, 16, 16) * 2 - 1, "action": torch.rand(2, 4, 4)}
        >>> batch = tiny.base.prepare_batch(clips)
        >>> loss, pred = tiny.training_loss(batch, generator=torch.Generator().manual_seed(0), step=0)
        >>> loss.ndim, tuple(pred.composed.shape)
        (0, (2, 4, 4, 4, 4))
    """

    def __init__(self, base: BaseVideoModel, adapter: Adapter, composer: Composer, objective: Objective):
        super().__init__()
        _check_parts(base, adapter, composer, objective)
        adapter.bind(base)  # condition mismatches raise here, before any compute
        freeze(base)
        adapter.set_objective(objective)
        adapter.attach_base_model(base)
        self.base = base
        self.adapter = adapter
        self.composer = composer
        self.objective = objective
        self.adapter_enabled = True
        self.checkpoint_adapter = False  # training.gradient_checkpointing

    # -- modes and parameters ----------------------------------------------------------------
    def train(self, mode: bool = True) -> ComposedModel:
        self.training = mode
        self.adapter.train(mode)
        self.composer.train(mode)
        # The base is not touched: freeze() pinned every one of its modules to eval mode, and
        # walking a large frozen model here would cost on every generate() call.
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        params = [*self.adapter.parameters(), *self.composer.parameters()]
        # The base's own parameters were frozen by freeze(); an inside adapter's weights (LoRA
        # layers) live in the base's module tree too, and are the adapter's, so they stay.
        return [p for p in dict.fromkeys(params) if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Adapter and composer weights and buffers (never the base's)."""
        out = {f"adapter.{k}": v for k, v in self.adapter.state_dict().items()}
        out.update({f"composer.{k}": v for k, v in self.composer.state_dict().items()})
        return out

    def load_trainable_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True):
        adapter = {k[len("adapter."):]: v for k, v in state.items() if k.startswith("adapter.")}
        composer = {k[len("composer."):]: v for k, v in state.items() if k.startswith("composer.")}
        self.adapter.load_state_dict(adapter, strict=strict)
        self.composer.load_state_dict(composer, strict=strict)

    # -- evaluation --------------------------------------------------------------------------
    def _t_vector(self, t: torch.Tensor | float, x_t: torch.Tensor) -> torch.Tensor:
        if not (isinstance(t, torch.Tensor) and t.device == x_t.device):  # (as_tensor would return t itself)
            t = torch.as_tensor(t, device=x_t.device)
        return t.expand(x_t.shape[0]) if t.ndim == 0 else t

    def base_prediction(self, x_t: torch.Tensor, t: torch.Tensor, batch: Batch) -> torch.Tensor:
        adapter, base = self.adapter, self.base
        if adapter.inside:  # the base alone: the adapter inside it switched off exactly
            with adapter.switched_off(), torch.no_grad():
                return base.denoise(x_t, t, batch.cond)
        if adapter.reuses_base_output and torch.is_grad_enabled():  # (sampling runs without grad)
            with torch.no_grad():
                return base.denoise(x_t, t, batch.cond)
        return base.denoise(x_t, t, batch.cond)

    def predict(self, x_t: torch.Tensor, t: torch.Tensor | float, batch: Batch, *, step: int | None = None,
                with_adapter: bool | None = None, base_output: torch.Tensor | None = None,
                cond: Conditioning | None = None, reference: bool | None = None) -> Prediction:
        """Evaluate base, adapter and composer at ``x_t``.

        ``with_adapter``: ``False`` for the base alone, ``True`` for base + adapter, ``None`` (default)
        as the model is set (:attr:`adapter_enabled`). ``base_output``: a cached base prediction for
        these ``(x_t, t)`` (reused only when the adapter allows it). ``cond``: a prepared conditioning
        to use instead of the batch's (ablations).

        Inside adapters (``adapter.inside``) make one adapted base call; ``reference`` (default:
        outside training) adds a second call with the adapter switched off for ``Prediction.base``.
        """
        t = self._t_vector(t, x_t)
        # (the submodules are read once: each read of one goes through nn.Module.__getattr__)
        adapter, base = self.adapter, self.base
        if with_adapter is None:
            use_adapter = self.adapter_enabled
        elif with_adapter is True or with_adapter is False:
            use_adapter = with_adapter
        else:
            raise CompositionError(f"predict(with_adapter={with_adapter!r}) is not allowed: it takes True "
                                   f"(base + adapter), False (the frozen base alone) or None (as the model "
                                   f"is set, model.adapter_enabled).")
        if adapter.inside:  # the base alone is only the reference (or the prediction, with the adapter off)
            reference = not self.training if reference is None else reference
            if base_output is None and (reference or not use_adapter):
                base_output = self.base_prediction(x_t, t, batch)
        elif base_output is None or not adapter.reuses_base_output:
            base_output = self.base_prediction(x_t, t, batch)
        if not use_adapter:
            return Prediction(x_t, t, base_output, None, base_output, None)
        if cond is None:
            cond = adapter.conditioning(batch, x_t, step=step, training=adapter.training)
        if adapter.inside:  # the adapted base's prediction is what the composer (Replace) receives
            with adapter.engaged(cond, x_t, t):
                output = base.denoise(x_t, t, batch.cond)
        elif self.checkpoint_adapter and self.training and torch.is_grad_enabled():
            # Recompute the adapter's activations in backward instead of holding them: same values.
            output = torch.utils.checkpoint.checkpoint(adapter, x_t, t, cond, base_output,
                                                       use_reentrant=False)
        else:
            output = adapter(x_t, t, cond, base_output)
        ctx = _Context(x_t, t, step, self.objective)
        composition = composition_of(self.composer, base_output, output, ctx)
        composed = constrain(base, composition.prediction, x_t, t, batch.cond)
        return Prediction(x_t, t, base_output, output, composed, cond, composition.diagnostics)

    def evaluation_note(self) -> str:
        """How one prediction of a recording is made (the number of base calls per sampler call)."""
        if self.adapter.inside:
            return (f"{type(self.adapter).__name__} works inside the base: 2 base calls per step "
                    f"(the base with the adapter switched off, and the adapted base, at the same x_t)")
        return "1 base call per step (the adapter reads the base's output)"

    def noised(self, batch: Batch, generator: torch.Generator | None = None):
        """``(x_t, t, target)`` for the batch's clean latents, drawn from ``generator`` only."""
        x0, objective = batch.latents, self.objective
        noise, t = objective.sample_noise_and_t(x0, generator)
        return objective.add_noise(x0, noise, t), t, objective.target(x0, noise, t)

    def base_half(self, batch: Batch, generator: torch.Generator | None = None) -> BaseHalf:
        """The frozen base's half of :meth:`training_loss` for ``batch``, without grad: :meth:`noised`
        from ``generator``'s draws, then the base's prediction there. :meth:`training_loss` given it
        computes the loss it computes given ``generator``."""
        with torch.no_grad():
            x_t, t, target = self.noised(batch, generator)
            return BaseHalf(x_t, t, target, self.base_prediction(x_t, self._t_vector(t, x_t), batch))

    def training_loss(self, batch: Batch, *, generator: torch.Generator | None = None,
                      step: int | None = None,
                      base_half: BaseHalf | None = None) -> tuple[torch.Tensor, Prediction]:
        """One training evaluation: noise, base (no grad, once), adapter, composer, masked loss.

        ``base_half``: its frozen base's half, already computed for this batch by :meth:`base_half`
        (in a second process, see :mod:`workbench.train.ahead`): the loss is the one the generator it
        was computed with gives here, without running the base here (``generator`` is not used).
        """
        if base_half is None:
            x_t, t, target = self.noised(batch, generator)
            base_output = None
        else:
            x_t, t, target, base_output = base_half.x_t, base_half.t, base_half.target, base_half.base_output
        pred = self.predict(x_t, t, batch, step=step, base_output=base_output)
        return self.objective.loss(pred.composed, target, batch.loss_mask), pred

    # -- sampling ----------------------------------------------------------------------------
    def compose_step(self, x_t: torch.Tensor, t: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The ``compose_fn`` a native sampler calls instead of the bare base."""
        return self.predict(x_t, t, batch, reference=False).composed

    def generate(self, cond: Mapping[str, Any] | Batch, *, steps: int | None = None,
                 generator: torch.Generator | None = None, on_step: OnStep | None = None,
                 **kwargs) -> torch.Tensor:
        """The base's native sampler with the adapter injected; returns final latents."""
        was_training = self.training
        self.train(False)
        try:
            return self.base.generate(cond, steps=steps, generator=generator, compose_fn=self.compose_step,
                                      on_step=on_step, **kwargs)
        finally:
            self.train(was_training)
