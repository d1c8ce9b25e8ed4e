"""A memory plan for a config on a device: weights, training state, activations, a recording.

    plan = memory_plan("examples/configs/wan22.yaml", device="cuda", memory="80GiB")
    print(plan.table())                      # what `workbench plan CONFIG` prints

Every number is computed on the **meta device**: the backbone is built with ``random_weights``
inside :func:`~workbench.backbones.random_weights.weights_on_meta` (its real architecture, no
storage), so a plan for a 5-billion-parameter model costs seconds and no memory.

* **weights**: the bytes of every parameter and buffer of the backbone in the dtype it loads in on
  the device (its float32 exceptions included), plus the frozen encoders that load on first use
  (a text encoder, DynamiCrafter's CLIP towers), counted from the card or built on meta.
* **trainable**: an inside adapter's share — LoRA of ``rank`` on every projection the backbone
  names (:meth:`~workbench.core.capabilities.InsideAccess.inside_spec`), float32 parameters, their gradients
  and AdamW's two moments (16 bytes per parameter).
* **activations**: what one training step keeps for its backward through the frozen denoiser at
  the model's native resolution (the card's height, width and frames; batch 1), **traced**: the
  denoiser is called on meta tensors with the latents and the LoRA targets requiring gradients,
  and every tensor autograd saves is counted once (by its storage; the weights excluded). Attention
  is counted as a fused kernel keeps it (query, key, value, output and the row log-sum-exp), not as
  the full attention matrix the reference implementation would save on meta. **With gradient
  checkpointing** only each block's input is kept, and one block's activations at a time are
  recomputed in the backward: total − Σ blocks + Σ block inputs + max block. A tracer is exact about
  what autograd saves; it does not see allocator slack, the transient peak inside one operation, or
  kernels that save differently on a given device (the rehearsal at real size compares it with a
  measured peak: ``docs/results/real-size.md``). Adapters outside the base (``latent_residual``)
  keep none of the base's activations (the base runs without gradients).
* **recording**: :func:`~workbench.inspect.estimate_memory` of a recording of the card's sampling
  steps under the default :class:`~workbench.inspect.StoragePolicy` (on the host: stored steps go
  to the CPU).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.core.backbone import predictions_per_step
from workbench.core.capabilities import InsideAccess, MemoryPlanning
from workbench.errors import ConfigError

GIB = 2**30
UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": GIB, "gb": 10**9, "gib": GIB, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str | int | float) -> int:
    """``"80GiB"`` / ``"24 GB"`` / ``"512MiB"`` / a number of bytes → bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in UNITS:
        raise ConfigError(f"memory {text!r}: expected a size such as 80GiB, 24GB or 512MiB.")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def size(n: int | float) -> str:
    """Bytes in the largest binary unit that keeps a number >= 1 (``11.96 GiB``, ``3.2 MiB``)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


# -- tracing what a backward keeps ---------------------------------------------------------------
class _FusedAttention(torch.autograd.Function):
    """Scaled dot-product attention as a fused kernel saves it: q, k, v, the output and the row
    log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, *args):
        run, kwargs = args[-2], args[-1]
        with torch.no_grad():
            out = run(q, k, v, *args[:-2], **kwargs)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # never run: the trace only counts what is saved
        raise RuntimeError("the memory trace's attention has no backward")


@contextmanager
def fused_attention() -> Iterable[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` counted as a fused kernel while tracing."""
    original = torch.nn.functional.scaled_dot_product_attention

    def traced(*args, **kwargs):
        names = ("query", "key", "value")
        qkv = list(args[:3]) + [kwargs.pop(n) for n in names[len(args[:3]):]]
        return _FusedAttention.apply(*qkv, *args[3:], original, kwargs)

    torch.nn.functional.scaled_dot_product_attention = traced
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass
class ActivationTrace:
    """What one forward keeps for its backward (bytes): ``total``, the part inside each block
    (``blocks``), and each block's input (``block_inputs``, what gradient checkpointing keeps)."""

    total: int
    blocks: list[int] = field(default_factory=list)
    block_inputs: list[int] = field(default_factory=list)

    @property
    def checkpointed(self) -> int:
        """Bytes kept with each block checkpointed: the rest, every block's input, one block recomputed."""
        if not self.blocks:
            return self.total
        return self.total - sum(self.blocks) + sum(self.block_inputs) + max(self.blocks)


def trace_saved(fn: Callable[[], Any], *, blocks: Iterable[nn.Module] = (),
                exclude: Iterable[torch.Tensor] = ()) -> ActivationTrace:
    """Run ``fn`` and count every tensor autograd saves for the backward (once per storage), the tensors
    in ``exclude`` (the weights) left out; split by the ``blocks`` they were saved in."""
    excluded = {_key(t) for t in exclude}
    seen: set[int] = set()
    blocks = list(blocks)
    inside: list[int | None] = [None]
    per_block = [0] * len(blocks)
    inputs = [0] * len(blocks)
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        k = _key(t)
        if k not in excluded and k not in seen:
            seen.add(k)
            n = t.untyped_storage().nbytes()
            total[0] += n
            if inside[0] is not None:
                per_block[inside[0]] += n
        return t

    handles = []
    for i, block in enumerate(blocks):
        def pre(module, args, kwargs, i=i):
            first = args[0] if args else next((v for v in kwargs.values()
                                               if isinstance(v, torch.Tensor)), None)
            if isinstance(first, torch.Tensor):
                inputs[i] += first.numel() * first.element_size()
            inside[0] = i

        def post(module, args, output):
            inside[0] = None

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), fused_attention():
            fn()
    finally:
        for h in handles:
            h.remove()
    return ActivationTrace(total[0], per_block, inputs)


def lora_targets(base) -> list[tuple[str, nn.Linear]]:
    """The ``(name, module)`` of every linear layer an inside adapter's LoRA wraps in ``base``: the modules
    under ``inside_spec().root`` whose name ends with one of its ``lora_targets``."""
    spec = base.inside_spec()
    suffixes = tuple(spec.lora_targets)
    return [(name, m) for name, m in spec.root.named_modules()
            if isinstance(m, nn.Linear) and any(name == s or name.endswith("." + s) for s in suffixes)]


def trace_training_step(base, latents: torch.Tensor, t: torch.Tensor,
                        cond: Mapping[str, Any]) -> ActivationTrace:
    """What one training step of an inside LoRA keeps through ``base``'s denoiser on ``latents``: the trace of
    ``base.denoise(latents, t, cond)`` with ``latents`` and the LoRA targets' weights requiring gradients (a
    LoRA saves each target's input); split by the blocks of its ``inside_spec()``."""
    spec = base.inside_spec()
    targets = [m for _, m in lora_targets(base)]
    weights = [*base.parameters(), *base.buffers()]
    flags = [(p, p.requires_grad) for p in base.parameters()]
    try:
        for m in targets:
            m.weight.requires_grad_(True)
        x = latents.detach().requires_grad_(True)
        with torch.enable_grad():
            return trace_saved(lambda: base.denoise(x, t, cond), blocks=spec.blocks, exclude=weights)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


# -- the plan ------------------------------------------------------------------------------------
@dataclass
class MemoryPlan:
    """A model's memory on a device at its native resolution (bytes); :meth:`table` prints it."""

    model: str
    device: str
    dtype: str
    resolution: str
    latent_shape: tuple[int, ...]
    weights: int
    encoders: int
    trainable_parameters: int
    trainable: int
    activations: int
    activations_checkpointed: int
    recording: int
    recording_steps: int
    memory: int | None = None
    # compose_fn calls a sampling step makes (guidance branches), each kept for forks
    recording_calls: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        """A training step with an inside adapter, without gradient checkpointing: weights, training state,
        activations (the frozen encoders are not needed when the data is a latent cache)."""
        return self.weights + self.trainable + self.activations

    @property
    def step_checkpointed(self) -> int:
        return self.weights + self.trainable + self.activations_checkpointed

    def rows(self) -> list[tuple[str, int, str]]:
        return [
            ("weights (denoiser + VAE)", self.weights, f"{self.dtype} on {self.device}"),
            ("frozen encoders (loaded on first use)", self.encoders, "not needed with a latent cache"),
            ("LoRA rank 16 + gradients + AdamW", self.trainable,
             f"{self.trainable_parameters / 1e6:.1f} M params"),
            ("activations per step", self.activations, "traced at the native resolution"),
            ("activations, gradient checkpointing", self.activations_checkpointed,
             "block inputs + one block"),
            ("training step (weights+state+act.)", self.step, "inside adapter"),
            ("training step, checkpointing", self.step_checkpointed, "inside adapter"),
            ("recording (default StoragePolicy)", self.recording, f"{self.recording_steps} steps, on the host"
             + (f"; {self.recording_calls} predictions a step (guidance)"
                if self.recording_calls > 1 else "")),
        ]

    def table(self) -> str:
        lines = [f"memory plan: {self.model} on {self.device} ({self.dtype}), {self.resolution}, latents "
                 f"{tuple(self.latent_shape)}, batch 1",
                 f"{'':<40} {'bytes':>11}  notes", "-" * 80]
        lines += [f"{name:<40} {size(n):>11}  {note}" for name, n, note in self.rows()]
        if self.memory is not None:
            verdict = lambda need: "fits" if need <= self.memory else "does NOT fit"  # noqa: E731
            lines.append(f"on {gib(self.memory)}: a step {verdict(self.step)} without checkpointing, "
                         f"{verdict(self.step_checkpointed)} with it")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device, "dtype": self.dtype,
                "resolution": self.resolution, "latent_shape": list(self.latent_shape), "memory": self.memory,
                **{name: n for name, n, _ in self.rows()},
                "recording_predictions_per_step": self.recording_calls, "notes": self.notes}


def _base_block(config: Any) -> tuple[str, dict]:
    if isinstance(config, (str, Path)):
        from workbench.train.config import load_yaml

        experiment = load_yaml(config)
        return experiment.base["type"], dict(experiment.base.get("config") or {})
    if isinstance(config, Mapping) and "type" in config:
        return config["type"], dict(config.get("config") or {})
    raise ConfigError("memory_plan takes an experiment YAML (a path) or a backbone block {type, config}.")


def _dtype_for(device: str, name: str, precision: Mapping[str, Any]) -> torch.dtype:
    from workbench.core import platform

    return platform.resolve_dtype(name, torch.device(device), precision=precision)


def meta_backbone(kind: str, config: Mapping[str, Any], dtype: torch.dtype):
    """The backbone of a config built on meta with random weights in ``dtype`` (no storage)."""
    from dataclasses import fields

    from workbench.backbones.random_weights import weights_on_meta
    from workbench.config import build
    from workbench.registry import resolve

    # a random init of the real architecture: a diffusers backbone says so with random_weights, one that
    # loads a weights file (tiny_video) with no file
    settings = {f.name for f in fields(resolve("backbone", kind).config_class)}
    random = {"random_weights": True} if "random_weights" in settings else {"weights": None}
    config = {**config, **random, "device": "cpu", "dtype": str(dtype).replace("torch.", "")}
    with weights_on_meta():
        return build("backbone", kind, config)


def memory_plan(config: Any, device: str = "cuda", memory: str | int | None = None, *, rank: int = 16,
                steps: int | None = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of an experiment config's backbone (a YAML path, or a ``{type, config}``
    block) on ``device`` (``cuda`` / ``cpu``; the dtype its card's precision gives there, or the config's
    ``dtype``), at its native resolution; ``memory``: the device's memory (``"80GiB"``) to judge the fit."""
    from workbench.backbones.random_weights import parameter_bytes, weights_on_meta

    kind, block = _base_block(config)
    name = block.get("dtype", "auto")
    dtype = _dtype_for(device, name, {"cpu": "float32", "cuda": "bfloat16"})  # what the shipped cards say
    base = meta_backbone(kind, block, dtype)  # on meta: seconds, no memory
    if name == "auto" and base.card is not None and base.card.precision:
        carded = _dtype_for(device, "auto", base.card.precision)
        if carded != dtype:  # a card with another precision on this device: build in that one
            dtype, base = carded, meta_backbone(kind, block, carded)
    missing = [c.__name__ for c in (MemoryPlanning, InsideAccess) if not isinstance(base, c)]
    if missing:
        raise ConfigError(
            f"backbone {kind!r}: {type(base).__name__} does not declare {' or '.join(missing)}, so no memory "
            f"plan can be traced for it: a plan traces denoise on the inputs MemoryPlanning.planning_inputs "
            f"gives, split by the blocks InsideAccess.inside_spec() names. Declare "
            f"{' and '.join(missing)} on the backbone (workbench.core.capabilities)."
        )
    notes: list[str] = list(base.planning_notes())
    weights = parameter_bytes(base)
    with weights_on_meta():
        encoders = sum(parameter_bytes(m) for m in base.frozen_encoders())
    text = base.card.components.get("text_encoder")
    if not encoders and text is not None and text.parameters and not notes:
        encoders += text.parameters * torch.empty((), dtype=dtype).element_size()
    clip = base.clip()
    height, width, frames = clip.height, clip.width, clip.frames
    shape = (1, *base.latent_shape(clip))
    latents = torch.zeros(shape, device="meta")
    try:
        t, cond = base.planning_inputs(latents)
    except NotImplementedError as error:  # declared, not written: the stub says what to write
        raise ConfigError(f"backbone {kind!r}: {error}") from None
    trace = trace_training_step(base, latents, t, cond)
    lora_params = sum(rank * (m.in_features + m.out_features) for _, m in lora_targets(base))
    if not hasattr(base.inside_spec().root, "enable_gradient_checkpointing"):
        notes.append(f"{kind}'s denoiser has no gradient checkpointing of its own: "
                     f"the checkpointed figure is what checkpointing its blocks would keep, "
                     f"not what it keeps today")
    recording_steps = steps or base.card.sampling.steps or 50
    recording, calls = _recording(base, shape, recording_steps)
    return MemoryPlan(model=f"{kind} ({base.card.model_id})", device=device,
                      dtype=str(dtype).replace("torch.", ""), resolution=f"{width}x{height}, {frames} frames",
                      latent_shape=shape[1:], weights=weights, encoders=encoders,
                      trainable_parameters=lora_params, trainable=16 * lora_params,
                      activations=trace.total, activations_checkpointed=trace.checkpointed,
                      recording=recording, recording_steps=recording_steps, recording_calls=calls,
                      memory=None if memory is None else parse_bytes(memory),
                      notes=notes)


def _recording(base, shape: tuple[int, ...], steps: int) -> tuple[int, int]:
    """A recording's bytes under the default StoragePolicy and the predictions each step keeps for forks."""
    from workbench.core.adapter import SideAdapter
    from workbench.core.composed import ComposedModel
    from workbench.core.composers import GatedResidual
    from workbench.core.conditions import Batch
    from workbench.inspect.recording.storage import StoragePolicy, estimate_memory

    class Zero(SideAdapter):
        at_init = "zero_output"

        def forward(self, x_t, t, cond, base_output=None):
            return torch.zeros_like(x_t)

    model = ComposedModel(base, Zero(), GatedResidual(), base.default_objective())
    batch = Batch(latents=torch.zeros(shape), cond={}, loss_mask=None)
    return (estimate_memory(model, batch, steps=steps, storage=StoragePolicy()),
            predictions_per_step(base, batch))


__all__ = ["ActivationTrace", "MemoryPlan", "fused_attention", "lora_targets", "memory_plan", "meta_backbone",
           "parse_bytes", "trace_saved", "trace_training_step"]
