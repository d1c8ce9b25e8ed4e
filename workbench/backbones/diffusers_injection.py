"""The composition injected into a diffusers pipeline's own loop (no diffusers import at module level).

* :class:`Injection` wraps the pipeline's transformer forward for the length of one ``generate``:
  each call the pipeline makes is handed to the composition (``compose_fn``), one batch half at a
  time with that half's own conditions, and re-joined in the pipeline's order. The scheduler's
  ``step`` is observed (never changed) for the step record; steps reach ``on_step`` from the
  pipeline's ``callback_on_step_end``.
* :class:`PipelineCall` makes the frozen base's prediction inside ``generate`` *the pipeline's own
  transformer call*, made once and only if the composition asks for it: a zero adapter then
  reproduces the pipeline bit for bit, and a replayed step (a fork's prefix) costs no call at all.
  The injection hands it to the backbone through the backbone's :class:`NativeCallHandoff`, which the
  backbone's ``denoise`` asks first.

The backbone is whatever has what :class:`InjectedBackbone` names (the bridge's ``DiffusersBackbone``
does): this module imports nothing of the bridge, which builds on it. Plugins reach these through
:mod:`workbench.backbones.diffusers_bridge`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn

from workbench.core import Batch, StepRecord
from workbench.errors import CompositionError


class InjectedBackbone(Protocol):
    """What an :class:`Injection` and a :class:`PipelineCall` read of the backbone they work for."""

    transformer: nn.Module
    """The pipeline's transformer (the injection reads its dtype once)."""

    forward_version: int
    """Bumped by whatever changes what the transformer computes without touching its weights (an inside
    adapter's switches): a pipeline call cached at another version is made again."""

    native_call: NativeCallHandoff
    """Where the injection hands the pipeline's transformer call to the backbone."""


class PipelineCall:
    """One transformer call made by the pipeline, evaluated at most once and only if asked for.

    ``pieces`` are the tensors handed to the composition (one per batch half) with their rows of
    the call (``None``: all of them); ``denoise`` called on one of them returns its rows of this
    single call, made with the pipeline's own arguments.
    """

    def __init__(self, run: Callable[[], torch.Tensor], pieces: Sequence[tuple[torch.Tensor, slice | None]],
                 backbone: InjectedBackbone):
        self.run, self.pieces, self.output, self.backbone, self.version = (
            run, list(pieces), None, backbone, None)

    def output_for(self, x: torch.Tensor) -> torch.Tensor | None:
        for piece, rows in self.pieces:
            if piece is x:
                # an inside adapter switched: the cached call is stale
                version = self.backbone.forward_version
                if self.output is None or version != self.version:
                    self.output, self.version = self.run(), version
                out = self.output if rows is None else self.output[rows]
                return out if out.dtype == x.dtype else out.to(x.dtype)
        return None


class NativeCallHandoff:
    """The hand-off between an :class:`Injection` and its backbone: the pipeline's transformer call being
    composed right now (:attr:`call`, set by the injection around each composition and ``None`` outside),
    which the backbone's ``denoise`` answers with (:meth:`output_for`) instead of calling the transformer
    itself."""

    def __init__(self) -> None:
        self.call: PipelineCall | None = None

    def output_for(self, x: torch.Tensor) -> torch.Tensor | None:
        """The pending call's output for ``x`` when ``x`` is what the injected call handed out, else
        ``None``."""
        call = self.call
        return None if call is None else call.output_for(x)


class Injection:
    """The composition wrapped around a pipeline's transformer and scheduler for one ``generate``.

    Installed with ``with injection.installed(pipe):``; everything is restored when the block ends.
    The transformer's forward is replaced by :meth:`forward` (compose instead of predict); the
    scheduler's ``step`` is only observed: it counts steps, and keeps the guided prediction and the
    sample it updates, which the step record needs and diffusers' step callback does not carry.
    Pass :attr:`callback` to the pipeline: with an ``on_step`` it reports each step from the
    pipeline's ``callback_on_step_end``; without one the pipeline runs with no callback at all.
    """

    def __init__(self, backbone: InjectedBackbone, batch: Batch, uncond: Batch | None, compose_fn, on_step,
                 steps: int):
        self.backbone, self.batch, self.uncond, self.compose_fn = backbone, batch, uncond, compose_fn
        self.handoff = backbone.native_call
        self.on_step, self.steps = on_step, steps
        self.step, self.calls_in_step = 0, 0
        self.sigmas: torch.Tensor | None = None
        self.sigma_rows: dict[tuple, torch.Tensor] = {}  # (step, rows, device) -> (rows,), made once
        self.output_dtype = backbone.transformer.dtype  # read once: diffusers walks the parameters for it
        self.observed: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.native_forward = None

    @contextmanager
    def installed(self, pipe):
        transformer, scheduler = pipe.transformer, pipe.scheduler
        self.pipe = pipe
        saved = {(transformer, "forward"): transformer.__dict__.get("forward"),
                 (scheduler, "step"): scheduler.__dict__.get("step")}
        self.native_forward, native_step = transformer.forward, scheduler.step

        def observed_step(model_output, timestep, sample, *args, **kwargs):
            result = native_step(model_output, timestep, sample, *args, **kwargs)
            self.observed = (self.step, sample, model_output)
            self.step, self.calls_in_step = self.step + 1, 0
            return result

        transformer.forward = self.forward
        scheduler.step = observed_step
        try:
            yield self
        finally:
            self.handoff.call = None
            for (obj, name), value in saved.items():
                if value is None:
                    obj.__dict__.pop(name, None)
                else:
                    setattr(obj, name, value)

    def sigma(self, like: torch.Tensor, rows: int, step: int | None = None) -> torch.Tensor:
        """Step ``step``'s (default: the current one's) noise level σ as ``(rows,)`` float32 (objective
        units)."""
        key = (self.step if step is None else step, rows, like.device)
        sigma = self.sigma_rows.get(key)
        if sigma is None:
            if self.sigmas is None or self.sigmas.device != like.device:
                self.sigmas = self.pipe.scheduler.sigmas.to(device=like.device, dtype=torch.float32)
            self.sigma_rows[key] = sigma = self.sigmas[key[0]].expand(rows)
        return sigma

    @property
    def callback(self) -> dict:
        """The pipeline's step-callback arguments: only a recording (an ``on_step``) needs them."""
        if self.on_step is None:
            return {}
        return dict(callback_on_step_end=self.on_step_end, callback_on_step_end_tensor_inputs=["latents"])

    def compose(self, call: Callable[[], torch.Tensor], hidden: torch.Tensor,
                halves: Sequence[tuple[slice, Batch]]) -> torch.Tensor:
        """Compose each half of one transformer call with its own batch; re-join them in call order.

        ``halves``: ``(rows, batch)`` in the order the composition sees them (the conditional half
        first, so a recording keeps the conditional prediction of each step: the step's ``composed``
        and ``x0``; the guided prediction the scheduler steps with gives the live step's ``guided_x0``).
        """
        x = hidden.to(self.batch.latents.dtype)
        whole = len(halves) == 1 and halves[0][0] == slice(0, x.shape[0])
        pieces = [(x, None)] if whole else [(x[rows], rows) for rows, _ in halves]
        self.handoff.call = PipelineCall(call, pieces, self.backbone)
        outputs: dict[int, torch.Tensor] = {}
        try:
            for (piece, _), (rows, batch) in zip(pieces, halves):
                outputs[rows.start or 0] = self.compose_fn(piece, self.sigma(piece, piece.shape[0]), batch)
        finally:
            self.handoff.call = None
        joined = [outputs[k] for k in sorted(outputs)]
        out = joined[0] if len(joined) == 1 else torch.cat(joined)
        return out if out.dtype == self.output_dtype else out.to(self.output_dtype)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def on_step_end(self, pipe, index: int, timestep, callback_kwargs: dict) -> dict:
        """diffusers' ``callback_on_step_end``: report step ``index`` to ``on_step`` as a
        :class:`StepRecord`."""
        if self.observed is None or self.observed[0] != index:
            raise CompositionError(
                f"{type(self.backbone).__name__}: the pipeline reported step {index} without a scheduler "
                f"step for it (expected step {self.step - 1}); this diffusers version calls the scheduler "
                f"or the step callback differently from the one the plugin was written for. "
                f"Pin the diffusers version in constraints.txt."
            )
        _, sample, prediction = self.observed
        self.observed = None
        self.on_step(StepRecord(index, self.steps, self.sigma(sample, sample.shape[0], index), sample,
                                prediction, callback_kwargs["latents"]))
        return {}


def transformer_output(sample: torch.Tensor):
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)


__all__ = ["InjectedBackbone", "Injection", "NativeCallHandoff", "PipelineCall", "transformer_output"]
