"""Composers: how the adapter's output folds onto the frozen base's prediction.

Composers are modules and stack::

    NoiseGated(PretrainWarmup(GatedResidual(), steps=500), lo=0.3, hi=1.0)

Each says whether it is the identity at init (``identity_at_init``) and whether that needs a
zero-output adapter (``needs_zero_adapter``); the test suite proves every claim bit-exactly.
``compose`` returns a :class:`Composition`: the prediction, and the gate, mask and noise weight it
applied as named fields, which the inspection layer reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.config import block_of, build, check, component_field, config_from
from workbench.core.callbacks import GateStatistics
from workbench.errors import CompositionError
from workbench.registry import register


@dataclass
class ComposeContext:
    """What a composer may look at besides the two predictions.

    ``noise_level``: ``(B,)`` in [0, 1] (1 = pure noise), or ``None`` when unknown.
    ``step``: the training step (``None`` outside training).
    """

    x_t: torch.Tensor | None = None
    t: torch.Tensor | None = None
    noise_level: torch.Tensor | None = None
    step: int | None = None


DIAGNOSTIC_FIELDS = ("gate", "mask", "noise_weight")


@dataclass
class Diagnostics:
    """What a composer applied besides its prediction, as named fields (``None``: not applied).

    ``gate``: the effective gate, a scalar or ``(1, C, 1, 1, 1)``; ``mask``: a spatial mix weight
    ``(B, 1, T, h, w)`` in [0, 1]; ``noise_weight``: ``(B,)``, the weight of the inner composition
    at each sample's noise level; ``extra``: anything else, by name (e.g. ``warmup``). Every field
    is given by name: ``Diagnostics(gate=g)``.
    """

    gate: torch.Tensor | None = field(default=None, kw_only=True)
    mask: torch.Tensor | None = field(default=None, kw_only=True)
    noise_weight: torch.Tensor | None = field(default=None, kw_only=True)
    extra: dict[str, torch.Tensor] = field(default_factory=dict, kw_only=True)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The tensors that are set, by name: the named fields first, then :attr:`extra`."""
        out = {k: getattr(self, k) for k in DIAGNOSTIC_FIELDS if getattr(self, k) is not None}
        return {**out, **self.extra}

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Diagnostics:
        """Every tensor through ``fn`` (e.g. moved to storage)."""
        return Diagnostics(**{k: None if getattr(self, k) is None else fn(getattr(self, k))
                              for k in DIAGNOSTIC_FIELDS},
                           extra={k: fn(v) for k, v in self.extra.items()})


@dataclass
class Composition(Diagnostics):
    """What :meth:`Composer.compose` returns: the composed ``prediction`` and what it applied, the
    fields of :class:`Diagnostics` (detached: they are read, never trained through).

    Examples:
        >>> base, correction = torch.zeros(1, 4, 2, 8, 8), torch.ones(1, 4, 2, 8, 8)
        >>> g = torch.tensor(0.5)
        >>> out = Composition(base + g * correction, gate=g)
        >>> float(out.prediction.mean()), float(out.diagnostics.gate)
        (0.5, 0.5)
    """

    prediction: torch.Tensor

    @property
    def diagnostics(self) -> Diagnostics:
        """What it applied, without the prediction (the same tensors)."""
        return Diagnostics(gate=self.gate, mask=self.mask, noise_weight=self.noise_weight,
                           extra=dict(self.extra))

    def replace(self, **changes) -> Composition:
        return dataclasses.replace(self, **changes)


def composition_of(composer: Composer, base: torch.Tensor, adapter: torch.Tensor,
                   ctx: ComposeContext) -> Composition:
    """``composer.compose(base, adapter, ctx)``, checked to be a :class:`Composition` (a composer of
    one's own that returns anything else gets a CompositionError saying what to return)."""
    out = composer.compose(base, adapter, ctx)
    if not isinstance(out, Composition):
        raise CompositionError(
            f"{composer.describe()}.compose returned a {type(out).__name__}, not a workbench.Composition. "
            f"Return Composition(prediction, gate=..., mask=..., noise_weight=...), naming only what the "
            f"composer applied (e.g. Composition(base + g * adapter, gate=g.detach())).")
    return out


class Composer(nn.Module):
    """Base class. Subclasses implement :meth:`compose`.

    Construction follows the components' one convention: a composer with settings has a
    ``config_class`` dataclass, is built as ``Composer(config=None, **overrides)`` (a config, or
    its fields by name; not both), keeps the validated config as ``self.config``, and
    ``build("composer", name, to_dict(self.config))`` rebuilds it (see :func:`workbench.config.config_from`).
    """

    # The claims, proved bit-exactly by the test suite: the class says them, or __init__ when settings decide.
    identity_at_init: bool = False
    """The composition is exactly the base's prediction at init (see :attr:`needs_zero_adapter`)."""
    needs_zero_adapter: bool = False
    """:attr:`identity_at_init` holds only through an adapter whose output starts at zero."""
    starves_zero_adapter: bool = False
    """A zero-output adapter would never get a gradient through this composer (a gate starting at 0)."""
    config_class: type | None = None

    def compose(self, base: torch.Tensor, adapter: torch.Tensor, ctx: ComposeContext) -> Composition:
        raise NotImplementedError

    def forward(self, base: torch.Tensor, adapter: torch.Tensor,
                ctx: ComposeContext | None = None) -> torch.Tensor:
        return composition_of(self, base, adapter, ctx or ComposeContext()).prediction

    def gate_values(self) -> dict[str, float]:
        """Scalar summaries of the learned gates (read off the logging cadence, not per step)."""
        return {}

    gate_override: torch.Tensor | None = None
    """The value the gate reads instead of its learned one, set only inside :meth:`override_gate`
    (``None`` otherwise). A composer with a gate reads it where it computes its gate."""

    @contextmanager
    def override_gate(self, value: float | torch.Tensor) -> Iterator[Composer]:
        """Inside the ``with`` block the gate reads ``value`` instead of its learned value.

        For ablations and the step-through view (``traj.fork(gate_override=...)``): nothing is
        trained, and the learned gate is back when the block ends. ``GatedResidual``: ``value``
        is the effective gate ``g`` (a scalar, or one per channel; not capped by ``max_gate``);
        ``MaskMix``: a constant mask in [0, 1]; wrappers pass it to their inner composer (a
        ``NoiseGated`` band still applies; a ``PretrainWarmup`` in warmup bypasses the gate).
        A composer of your own with a gate implements :meth:`check_gate_override` and reads
        :attr:`gate_override`.

        Examples:
            >>> with model.composer.override_gate(0.0):          # the adapter switched off
            ...     pred = traj.recompose(8)
            >>> torch.equal(pred.composed, pred.base)
            True
        """
        previous = self.gate_override
        self.gate_override = self.check_gate_override(value)
        try:
            yield self
        finally:
            self.gate_override = previous

    def check_gate_override(self, value: float | torch.Tensor) -> torch.Tensor:
        """``value`` checked and converted to what the gate reads (:attr:`gate_override`); the hook a
        composer with a gate implements. By default there is no gate, and this raises saying so."""
        raise CompositionError(
            f"{self.describe()} has no gate to override (gate_override={value!r}). Gates live in "
            f"GatedResidual and MaskMix (alone or inside NoiseGated / PretrainWarmup); leave "
            f"gate_override unset for this composer."
        )

    def callbacks(self) -> tuple:
        """Callbacks this composer brings to any training run it is part of."""
        return ()

    def describe(self) -> str:
        return type(self).__name__


@register("composer", "add")
class Add(Composer):
    """``base + adapter``. The identity at init when the adapter's output starts at zero."""

    identity_at_init = True
    needs_zero_adapter = True

    def compose(self, base, adapter, ctx):
        return Composition(base + adapter)


@register("composer", "replace")
class Replace(Composer):
    """The adapter's output replaces the base's (the base output is still given to the adapter)."""

    identity_at_init = False

    def compose(self, base, adapter, ctx):
        return Composition(adapter)


@dataclass
class GatedResidualConfig:
    """``gate_init``: initial gate. ``max_gate``: cap on |gate|, or None. ``per_channel``: one
    gate per channel (needs ``channels``) instead of one scalar.

    With ``gate_init=0`` the composition is the identity for any adapter, but a zero-initialised
    adapter then never trains (its gradient is the gate, the gate's is its output: both 0), so
    the default is a small open gate, which is the identity through a zero-output adapter."""

    gate_init: float = 0.1
    max_gate: float | None = None
    per_channel: bool = False
    channels: int | None = None

    def __post_init__(self):
        check(not self.per_channel or (self.channels or 0) >= 1, "channels",
              f"per_channel=True needs channels >= 1, got {self.channels!r}.")
        if self.max_gate is not None:
            check(self.max_gate > abs(self.gate_init), "max_gate",
                  f"max_gate={self.max_gate} is at or below |gate_init|={abs(self.gate_init)}: the gate "
                  f"would start clamped at its cap and never receive a gradient (a freeze). "
                  f"Use max_gate > {abs(self.gate_init)} or max_gate=None.")


@register("composer", "gated_residual")
class GatedResidual(Composer):
    """``base + g * adapter`` with a learned gate ``g`` (scalar or per channel).

    The identity at init through a zero-output adapter (the default ``gate_init=0.1``), or for
    *any* adapter with ``gate_init=0`` — which suits adapters that do not start at zero (the
    gate's gradient is the adapter's output). ``max_gate`` bounds the gate smoothly as
    ``max_gate * tanh(p / max_gate)``.
    """

    config_class = GatedResidualConfig

    def __init__(self, config: GatedResidualConfig | None = None, **overrides):
        super().__init__()
        self.config = c = config_from(type(self), config, overrides)
        gate_init, max_gate = c.gate_init, c.max_gate
        shape = (c.channels,) if c.per_channel else ()
        if max_gate is None:
            p0 = gate_init
        else:
            p0 = max_gate * math.atanh(gate_init / max_gate)
        self.gate = nn.Parameter(torch.full(shape, float(p0)))
        self.max_gate = max_gate
        # the identity for any adapter when the gate starts closed, else through a zero adapter
        self.identity_at_init = True
        self.needs_zero_adapter = c.gate_init != 0.0
        self.starves_zero_adapter = c.gate_init == 0.0

    def effective_gate(self) -> torch.Tensor:
        if self.gate_override is not None:
            return self.gate_override
        if self.max_gate is None:
            return self.gate
        return self.max_gate * torch.tanh(self.gate / self.max_gate)

    def check_gate_override(self, value):
        g = torch.as_tensor(value, dtype=self.gate.dtype, device=self.gate.device)
        if g.shape not in (torch.Size(()), self.gate.shape):
            raise CompositionError(
                f"gate_override for {self.describe()} must be a scalar or shaped like its gate "
                f"{tuple(self.gate.shape)}, got shape {tuple(g.shape)}."
            )
        return g

    def compose(self, base, adapter, ctx):
        g = self.effective_gate()
        if g.ndim == 1:
            g = g.view(1, -1, *([1] * (adapter.ndim - 2)))  # (1, C, 1, 1, 1)
        if g.dtype != adapter.dtype:  # (a cast to its own dtype is a no-op that still costs a call)
            g = g.to(adapter.dtype)
        return Composition(base + g * adapter, gate=g.detach())

    def gate_values(self):
        g = self.effective_gate().detach()
        if g.ndim == 0:  # one read from the device: the scalar is its own mean, its magnitude its max
            value = float(g)
            return {"gate_mean": value, "gate_abs_max": abs(value)}
        mean, abs_max = torch.stack([g.mean(), g.abs().max()]).tolist()  # (one read, not two)
        return {"gate_mean": mean, "gate_abs_max": abs_max}

    def callbacks(self):
        return (GateStatistics(self),)


@dataclass
class MaskMixConfig:
    """Spatial mask ``m`` in [0, max_gate]: ``base + m * (adapter - base)``.

    ``channels``: channels of the predictions (the mask net reads both).
    ``gate_init``: initial mask value where ``identity_init`` is False.
    ``identity_init``: start at m = 0 exactly through a zero-init scale ``s`` on the mask,
    which keeps a live gradient (d/ds = mask * (adapter - base)).
    """

    channels: int
    gate_init: float = 0.5
    max_gate: float = 1.0
    identity_init: bool = True

    def __post_init__(self):
        check(self.channels >= 1, "channels", f"must be >= 1, got {self.channels}.")
        check(0.0 < self.gate_init < 1.0 or self.identity_init, "gate_init",
              f"must be in (0, 1) (got {self.gate_init}); use identity_init=True to start at 0.")
        check(self.max_gate > self.gate_init, "max_gate",
              f"max_gate={self.max_gate} is at or below the gate's init value gate_init="
              f"{self.gate_init}: the mask would start at its cap and never receive a gradient (a "
              f"freeze). Use max_gate > {self.gate_init}.")
        check(self.max_gate <= 1.0, "max_gate", f"must be <= 1 (a mix weight), got {self.max_gate}.")


@register("composer", "mask_mix")
class MaskMix(Composer):
    """Mix base and adapter predictions with a learned per-position mask.

    The mask is ``max_gate * sigmoid(conv(base, adapter) + bias)`` with a zero-init 1×1×1 conv,
    so it starts at ``gate_init`` everywhere. With ``identity_init`` the mask is multiplied by a
    zero-init scale, so the composition is exactly the base at init while the scale still
    learns — unlike a mask pushed to a saturated sigmoid, whose gradient vanishes.
    """

    config_class = MaskMixConfig
    needs_zero_adapter = False

    def __init__(self, config: MaskMixConfig | None = None, **overrides):
        super().__init__()
        self.config = c = config_from(type(self), config, overrides)
        self.mask_net = nn.Conv3d(2 * c.channels, 1, kernel_size=1)
        nn.init.zeros_(self.mask_net.weight)
        ratio = c.gate_init / c.max_gate
        nn.init.constant_(self.mask_net.bias, math.log(ratio / (1 - ratio)))
        self.scale = nn.Parameter(torch.zeros(())) if c.identity_init else None
        self.identity_at_init = c.identity_init

    def check_gate_override(self, value):
        m = torch.as_tensor(value, dtype=self.mask_net.weight.dtype, device=self.mask_net.weight.device)
        if m.ndim != 0 or not 0.0 <= float(m) <= 1.0:
            raise CompositionError(
                f"gate_override for MaskMix is a constant mask: a scalar in [0, 1], got {value!r}."
            )
        return m

    def mask(self, base: torch.Tensor, adapter: torch.Tensor) -> torch.Tensor:
        if self.gate_override is not None:
            return self.gate_override.to(base.dtype).expand(base.shape[0], 1, *base.shape[2:])
        logits = self.mask_net(torch.cat([base, adapter], dim=1).to(self.mask_net.weight.dtype))
        m = self.config.max_gate * torch.sigmoid(logits)  # (B, 1, T, H, W)
        if self.scale is not None:
            m = self.scale * m
        return m.to(base.dtype)

    def compose(self, base, adapter, ctx):
        m = self.mask(base, adapter)
        return Composition(base + m * (adapter - base), mask=m.detach())

    def gate_values(self):
        out = {"mask_bias_gate": float(self.config.max_gate
                                       * torch.sigmoid(self.mask_net.bias.detach()).mean())}
        if self.scale is not None:
            out["mask_scale"] = float(self.scale.detach())
        return out

    def callbacks(self):
        return (GateStatistics(self),)


class Wrapper(Composer):
    """A composer that modifies another one: ``Wrapper(inner=None, config=None, **overrides)``.

    ``inner``: the wrapped composer; without one it is built from ``config.inner``. Either way
    ``self.config.inner`` is the inner composer's ``{type, config}`` block, so the wrapper's
    config alone rebuilds the whole stack.
    """

    def __init__(self, inner: Composer | None = None, config=None, **overrides):
        super().__init__()
        config = config_from(type(self), config, overrides)
        if inner is None:
            inner = build("composer", config.inner["type"], config.inner.get("config"),
                          where="composer.inner")
        if not isinstance(inner, Composer):
            raise CompositionError(f"{type(self).__name__} wraps a Composer, got {type(inner).__name__}.")
        self.inner = inner
        self.config = dataclasses.replace(config, inner=block_of(inner, "composer"))
        self.identity_at_init = inner.identity_at_init
        self.needs_zero_adapter = inner.needs_zero_adapter
        self.starves_zero_adapter = inner.starves_zero_adapter

    @classmethod
    def from_config(cls, config):
        return cls(config=config)

    def gate_values(self):
        return self.inner.gate_values()

    def override_gate(self, value):
        return self.inner.override_gate(value)

    def callbacks(self):
        return self.inner.callbacks()

    def describe(self) -> str:
        return f"{type(self).__name__}({self.inner.describe()})"


@dataclass
class NoiseGatedConfig:
    """``inner``: the wrapped composer block. ``lo``/``hi``: the noise-level band in [0, 1]
    where the adapter acts. ``ramp``: width of a linear fade at each edge (0 = hard band)."""

    inner: dict = component_field("composer", {"type": "gated_residual"})
    lo: float = 0.0
    hi: float = 1.0
    ramp: float = 0.0

    def __post_init__(self):
        check(0.0 <= self.lo < self.hi <= 1.0, "lo",
              f"need 0 <= lo < hi <= 1, got lo={self.lo}, hi={self.hi}.")
        check(self.ramp >= 0.0, "ramp", f"must be >= 0, got {self.ramp}.")


@register("composer", "noise_gated")
class NoiseGated(Wrapper):
    """Let the inner composer act only where the noise level is in ``[lo, hi]``.

    Outside the band the prediction is exactly the base's; inside (past any ramp) exactly the
    inner composer's. The adapter acts only where the outcome is still undecided. Refuses to
    run without a noise level.
    """

    config_class = NoiseGatedConfig

    def __init__(self, inner: Composer | None = None, config: NoiseGatedConfig | None = None, **overrides):
        super().__init__(inner, config, **overrides)
        self.lo, self.hi, self.ramp = float(self.config.lo), float(self.config.hi), float(self.config.ramp)

    def weight(self, noise_level: torch.Tensor) -> torch.Tensor:
        """``(B,)`` weight in [0, 1] of the inner composition at each noise level."""
        s = noise_level.float()
        if self.ramp == 0:
            return ((s >= self.lo) & (s <= self.hi)).float()
        up = ((s - self.lo) / self.ramp + 1.0).clamp(0, 1) if self.lo > 0 else torch.ones_like(s)
        down = ((self.hi - s) / self.ramp + 1.0).clamp(0, 1) if self.hi < 1 else torch.ones_like(s)
        return torch.minimum(up, down)

    def compose(self, base, adapter, ctx):
        if ctx.noise_level is None:
            raise CompositionError(
                "NoiseGated needs the noise level of x_t, but none was given. Call it through "
                "ComposedModel (which derives it from t with the objective), or pass "
                "ComposeContext(noise_level=...) with values in [0, 1]."
            )
        composition = composition_of(self.inner, base, adapter, ctx)
        inner = composition.prediction
        w = self.weight(ctx.noise_level).to(base.device)
        view = (-1, *([1] * (base.ndim - 1)))
        full, none = (w == 1).view(view), (w == 0).view(view)
        blended = base + w.view(view).to(base.dtype) * (inner - base)
        out = torch.where(full, inner, torch.where(none, base, blended))
        return composition.replace(prediction=out, noise_weight=w.detach())

    def describe(self) -> str:
        return f"NoiseGated({self.inner.describe()}, lo={self.lo:g}, hi={self.hi:g})"



@dataclass
class PretrainWarmupConfig:
    """``inner``: the wrapped composer block. ``steps``: training steps of adapter-only warmup."""

    inner: dict = component_field("composer", {"type": "gated_residual"})
    steps: int = 500

    def __post_init__(self):
        check(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}.")


@register("composer", "pretrain_warmup")
class PretrainWarmup(Wrapper):
    """Train the adapter branch alone for the first ``steps`` steps, then hand over to ``inner``.

    During warmup the prediction is ``base + adapter`` (the inner gate is bypassed and gets
    no gradient), so by the time the gate opens the adapter has something worth choosing.
    The step count lives in a buffer, so it is saved and restored with checkpoints. Outside
    training (``ctx.step is None``) the last training step seen decides.
    """

    config_class = PretrainWarmupConfig

    def __init__(self, inner: Composer | None = None, config: PretrainWarmupConfig | None = None,
                 **overrides):
        super().__init__(inner, config, **overrides)
        self.steps = int(self.config.steps)
        self.register_buffer("seen_step", torch.zeros((), dtype=torch.long))
        if self.steps > 0:  # base + adapter during warmup: the identity only through a zero-output adapter
            self.identity_at_init, self.needs_zero_adapter, self.starves_zero_adapter = True, True, False

    def in_warmup(self, step: int | None) -> bool:
        current = int(self.seen_step) if step is None else step
        return current < self.steps

    def compose(self, base, adapter, ctx):
        if ctx.step is not None and self.training:
            self.seen_step.fill_(ctx.step)
        if self.in_warmup(ctx.step):
            return Composition(base + adapter, extra={"warmup": torch.ones(())})
        return composition_of(self.inner, base, adapter, ctx)

    def describe(self) -> str:
        return f"PretrainWarmup({self.inner.describe()}, steps={self.steps})"



def composer_tree(composer: Composer) -> list[Composer]:
    """The composer and everything it wraps, outermost first."""
    out = [composer]
    while isinstance(out[-1], Wrapper):
        out.append(out[-1].inner)
    return out


def scaled_gate(composer: Composer, scale: float) -> torch.Tensor:
    """The learned gate of ``composer`` (a ``GatedResidual``, possibly wrapped) times ``scale``.

    Sampling with ``composer.override_gate(scaled_gate(composer, 2.0))`` doubles the adapter's
    correction at every step where it acts, a guidance-like knob that trains nothing.
    """
    inner = composer
    while hasattr(inner, "inner"):
        inner = inner.inner
    if not hasattr(inner, "effective_gate"):
        raise CompositionError(f"gate_scale={scale} needs a learned gate (gated_residual, alone or inside "
                               f"noise_gated), but the composer is {composer.describe()}. "
                               f"Leave gate_scale unset.")
    return inner.effective_gate().detach() * float(scale)
