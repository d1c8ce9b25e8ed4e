"""``controlnet``: a trainable copy of the base's first blocks feeding zero-initialised residuals back.

At attach time the first ``blocks`` blocks of the base are copied (with the base's weights) into
the adapter. In each adapted forward a pre-hook on the base's first block takes that block's
inputs, adds an embedding of the per-frame condition (``action`` by default) to the hidden
state, and runs the copy; each copied block's output goes through a zero-initialised linear
projection, and a forward hook on the matching base block adds it to that block's output. At
init every projection is exactly zero, so the adapted base is the base bit for bit; gradients
reach only the copy, the embedding and the projections.

Under gradient checkpointing (``transformer.enable_gradient_checkpointing()``) the base's first
block is run unchecked while the adapter is engaged: the branch runs inside its pre-hook and
must not be recomputed by a backward. The other blocks stay checkpointed.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

from torch import nn

from workbench.adapters.inside import InsideAdapter, InsideSpec, per_frame
from workbench.config import check, config_from
from workbench.core.conditions import Condition
from workbench.errors import ConfigError
from workbench.registry import register


@dataclass
class ControlNetConfig:
    """``blocks``: how many leading blocks of the base to copy (N >= 1). ``condition`` /
    ``aliases`` / ``dim`` / ``dropout``: the per-frame condition the branch reads."""

    blocks: int = 1
    condition: str = "action"
    aliases: tuple[str, ...] = ("actions",)
    dim: int = 4
    dropout: float = 0.0

    def __post_init__(self):
        check(self.blocks >= 1, "blocks", f"must be >= 1 (how many leading blocks to copy), got {self.blocks}.")
        check(self.condition.isidentifier(), "condition", f"must be an identifier, got {self.condition!r}.")
        check(self.dim >= 1, "dim", f"must be >= 1, got {self.dim}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")


@register("adapter", "controlnet")
class ControlNet(InsideAdapter):
    """A trainable copy of the first N blocks whose outputs return through zero-initialised projections."""

    config_class = ControlNetConfig

    def __init__(self, config: ControlNetConfig | None = None, **overrides):
        super().__init__()
        self.config = config = config_from(type(self), config, overrides)
        self.consumes = (Condition(config.condition, aliases=config.aliases, dim=config.dim, per_frame="keep",
                                   dropout=config.dropout),)

    @classmethod
    def from_config(cls, config: ControlNetConfig) -> ControlNet:
        return cls(config)

    def attach(self, spec: InsideSpec) -> None:
        n = self.config.blocks
        if n > spec.branch_blocks:
            raise ConfigError(
                f"controlnet blocks: {n} is more than {type(self._bound_to).__name__} has to copy: its first "
                f"{spec.branch_blocks} blocks form the chain a copy can run ({spec.root_name}). Use blocks: "
                f"{spec.branch_blocks} or fewer."
            )
        copies = []
        for block in spec.blocks[:n]:
            twin = copy.deepcopy(block)  # before any hook is registered on the base: the copy has none
            for m in twin.modules():
                m.__dict__.pop("train", None)  # the base's modules are pinned to eval; the copy trains
            twin.requires_grad_(True)
            copies.append(twin)
        self.copies = nn.ModuleList(copies)
        width = spec.widths[0]
        self.embed = nn.Linear(self.config.dim, width)
        self.projections = nn.ModuleList(nn.Linear(w, w) for w in spec.widths[:n])
        for proj in self.projections:
            nn.init.zeros_(proj.weight)
            nn.init.zeros_(proj.bias)
        spec.blocks[0].register_forward_pre_hook(self._run_branch, with_kwargs=True)
        for i in range(n):
            spec.blocks[i].register_forward_hook(self._add_residual(i))

    def prepare_state(self, cond, x_t, t):
        signal = getattr(cond, self.config.condition).to(x_t.dtype)  # (B, T, D)
        return {"embedding": self.embed(signal), "residuals": None}  # (B, T, W)

    def _run_branch(self, module, args, kwargs):
        if not self.active:
            return None
        layout = self.spec.layout
        hidden = args[0]
        state = self.state
        h = hidden + per_frame(state["embedding"], hidden, layout)
        residuals = []
        for twin, proj in zip(self.copies, self.projections):
            h = twin(h, *args[1:], **kwargs)
            h = h[0] if isinstance(h, tuple) else h
            out = proj(h) if layout == "tokens" else proj(h.movedim(1, -1)).movedim(-1, 1)
            residuals.append(out)
        state["residuals"] = residuals
        return None

    def _add_residual(self, index: int):
        def hook(module, args, output):
            if not self.active or self.state["residuals"] is None:
                return None
            residual = self.state["residuals"][index]
            if isinstance(output, tuple):
                return (output[0] + residual.to(output[0].dtype), *output[1:])
            return output + residual.to(output.dtype)

        return hook

    @contextmanager
    def engaged(self, cond, x_t, t):
        root = self.spec.root
        native = root.__dict__.get("_gradient_checkpointing_func")
        if native is None:
            with super().engaged(cond, x_t, t):
                yield self
            return
        first = self.spec.blocks[0]

        def checkpointed(block, *args, **kwargs):
            return block(*args, **kwargs) if block is first else native(block, *args, **kwargs)

        root._gradient_checkpointing_func = checkpointed
        try:
            with super().engaged(cond, x_t, t):
                yield self
        finally:
            root._gradient_checkpointing_func = native


__all__ = ["ControlNet", "ControlNetConfig"]
