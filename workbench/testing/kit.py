"""The conformance kit's pieces, shared by :func:`~workbench.testing.check_backbone` and
:func:`~workbench.testing.check_inside_adapter`: what a check may conclude (:class:`Broken`,
:class:`Skipped`), the :class:`Subject` a backbone check examines, :class:`Finding` and
:class:`ConformanceReport`, and the tensor helpers the checks compare with."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.core.adapter import Adapter, SideAdapter
from workbench.core.backbone import BaseVideoModel
from workbench.core.conditions import Batch


class Broken(Exception):  # noqa: N818 - a finding, raised inside a promise's check
    """Raised by a promise's check: the promise does not hold (the message says how)."""


class Skipped(Exception):  # noqa: N818
    """Raised by a promise's check: the promise cannot be checked with what was given (the message says
    why)."""


class Blocked(Exception):  # noqa: N818
    """A check needs something an earlier step failed to make (``prepare_batch(raw)``, the recording)."""


class ProbeAdapter(SideAdapter):
    """The kit's default adapter: ``scale * x_t`` with a scalar ``scale`` that starts at 0.

    It consumes no condition, so it binds to any backbone; it is exactly zero at init and
    trains (its gradient is the loss's correlation with ``x_t``).
    """

    at_init = "zero_output"

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(()))

    def forward(self, x_t, t, cond, base_output=None):
        return self.scale.to(x_t.dtype) * x_t


@dataclass
class Finding:
    """One promise and what the check found: ``status`` is kept / broken / skipped / not checked."""

    promise: str
    statement: str
    status: str
    detail: str = ""

    def line(self) -> str:
        mark = {"kept": "ok  ", "broken": "FAIL", "skipped": "skip", "not checked": "----"}[self.status]
        tail = f"\n         {self.detail}" if self.detail else ""
        return f"  {mark} {self.promise}: {self.statement}{tail}"


@dataclass
class ConformanceReport:
    """What :func:`check_backbone` found, one :class:`Finding` per promise, in checking order.

    ``declared``: the optional capabilities the backbone declares
    (:mod:`workbench.core.capabilities`), whose promises were checked beside the required ones.
    """

    backbone: str
    setting: str
    findings: list[Finding] = field(default_factory=list)
    declared: tuple[str, ...] = ()

    @property
    def broken(self) -> list[Finding]:
        return [f for f in self.findings if f.status in ("broken", "not checked")]

    @property
    def ok(self) -> bool:
        return not self.broken

    def __getitem__(self, promise: str) -> Finding:
        for finding in self.findings:
            if finding.promise == promise:
                return finding
        raise KeyError(promise)

    def __str__(self) -> str:
        n = len(self.broken)
        head = (f"{self.backbone} on {self.setting}: " +
                (f"{n} of {len(self.findings)} promises broken" if n
                 else f"all {len(self.findings)} promises kept"))
        declares = (f"declares {', '.join(self.declared)}" if self.declared
                    else "declares no optional capability")
        return "\n".join([f"{head}; {declares}", *(f.line() for f in self.findings)])


class Subject:
    """The backbone under check and what the checks share (built lazily, each at most once)."""

    def __init__(self, base: BaseVideoModel, *, raw: Mapping[str, Any],
                 generate_raw: Mapping[str, Any] | None,
                 adapter_factory: Callable[[], Adapter], steps: int | None, fork_at: int | None,
                 sampler_kwargs: Mapping[str, Any], device: torch.device, dtype: torch.dtype | None,
                 seed: int):
        self.base, self.raw, self.generate_raw = base, raw, generate_raw
        self.adapter_factory, self.sampler_kwargs = adapter_factory, dict(sampler_kwargs)
        self.requested_steps, self.fork_at = steps, fork_at
        self.device, self.dtype, self.seed = device, dtype, seed
        self._made: dict[str, Any] = {}
        self.failed: dict[str, str] = {}

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        if name in self.failed:
            raise Blocked(self.failed[name])
        if name not in self._made:
            try:
                self._made[name] = make()
            except Exception as err:
                self.failed[name] = f"{name} failed: {type(err).__name__}: {err}"
                raise
        return self._made[name]

    def keep(self, name: str, value: Any) -> None:
        self._made[name] = value

    def need(self, name: str) -> Any:
        if name not in self._made:
            raise Blocked(self.failed.get(name, f"needs {name}, which an earlier promise did not produce"))
        return self._made[name]

    @property
    def batch(self) -> Batch:
        """``prepare_batch(raw)`` (a training batch)."""
        return self._once("prepare_batch(raw)", lambda: self.base.prepare_batch(self.raw))

    @property
    def generation_batch(self) -> Batch:
        """The batch sampled from: ``prepare_batch(generate_raw)``, else the first clip of :attr:`batch`."""
        def make():
            if self.generate_raw is not None:
                return self.base.prepare_batch(self.generate_raw)
            return self.batch.select([0])
        return self._once("prepare_batch(generate_raw)", make)

    @property
    def steps(self) -> int:
        return self._once("card.resolve_steps", lambda: self.base.card.resolve_steps(self.requested_steps)[0])

    def generator(self, seed: int | None = None) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(self.seed if seed is None else seed)

    def model(self, composer=None, *, perturbed: bool = False):
        """A fresh :class:`ComposedModel` over the base with a fresh adapter (``perturbed``: made nonzero)."""
        from workbench.core.composed import ComposedModel
        from workbench.core.composers import GatedResidual

        adapter = self.adapter_factory()
        if not isinstance(adapter, Adapter):
            raise Broken(f"adapter_factory() returned {type(adapter).__name__}, not a workbench Adapter.")
        if perturbed:
            g = torch.Generator().manual_seed(1234)
            with torch.no_grad():
                for p in adapter.parameters():
                    p.add_(torch.randn(p.shape, generator=g).to(p) * 0.1)
        composer = composer if composer is not None else GatedResidual(gate_init=0.5 if perturbed else 0.1)
        # the adapter and composer are placed, never the composed model: that would move the base as well
        return ComposedModel(self.base, self.place(adapter), self.place(composer),
                             self.base.default_objective())

    @property
    def adapter_dtype(self) -> torch.dtype | None:
        """What the adapter runs in under ``dtype``: the dtype of the latents it corrects (a backbone in
        bf16 may keep its latents and its sampler's arithmetic in float32, as the plugins do)."""
        return None if self.dtype is None else self.batch.latents.dtype

    def place(self, module: nn.Module) -> nn.Module:
        """``module`` (an adapter or a composer) on the device, in :attr:`adapter_dtype`."""
        dtype = self.adapter_dtype
        return module.to(self.device) if dtype is None else module.to(self.device, dtype)


@contextlib.contextmanager
def counting_base_calls(base: BaseVideoModel) -> Iterator[list[int]]:
    """Counts ``base.denoise`` calls (every prediction of the frozen base) inside the block."""
    calls = [0]
    own = vars(base).get("denoise")  # an instance attribute (someone else's counter) is put back after
    inner = base.denoise

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    base.denoise = counted
    try:
        yield calls
    finally:
        if own is None:
            del base.denoise
        else:
            base.denoise = own


def tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, non-persistent buffers included."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, cloned (where it is)."""
    return {k: v.detach().clone() for k, v in tensors(module).items()}


def differing(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ (or appear in one state only)."""
    names = sorted(set(before) | set(after))
    return [n for n in names if n not in before or n not in after or before[n].dtype != after[n].dtype
            or before[n].shape != after[n].shape or not torch.equal(before[n].cpu(), after[n].cpu())]


def few(names: Sequence[str], n: int = 4) -> str:
    shown = ", ".join(names[:n])
    return shown + (f" (+{len(names) - n} more)" if len(names) > n else "")


def max_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    return ("max |difference| "
            f"{float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max()):.3g}")
