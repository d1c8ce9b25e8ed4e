"""``action_modulation``: a zero-initialised per-frame scale and shift of chosen blocks of the base.

Forward hooks on the base's blocks (no copy of its forward) turn each block's hidden state
``h`` into ``h * (1 + scale) + shift``, where ``scale`` and ``shift`` are per frame, per
channel, predicted from a per-frame condition (``action`` by default) by a small MLP whose
last layers start at zero — so at init every hook returns ``h`` exactly. ``lora: {...}`` adds
peft's LoRA on the base's layers in the same adapter (the "LoRA + action embedding" recipe).

    adapter:
      type: action_modulation
      config: {dim: 4, blocks: [0, 1], lora: {rank: 4}}
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from workbench.adapters.inside import (
    InsideSpec,
    InsideSpecAdapter,
    LoraModules,
    LoraSettings,
    check_indices,
    per_frame,
)
from workbench.config import check, config_from
from workbench.core.conditions import Condition
from workbench.layers import with_running_sum
from workbench.registry import register


@dataclass
class ActionModulationConfig:
    """``condition`` / ``aliases`` / ``dim`` / ``dropout``: the per-frame condition it reads (width
    ``dim``; ``dropout`` for classifier-free guidance). ``blocks``: indices of the blocks to
    modulate (``None`` = all; tiny_video's down, mid and up blocks in order, Wan's transformer
    blocks). ``hidden``: width of the condition MLP. ``cumulative``: also read the running sum of
    the condition over the previous frames (for delta actions, the displacement since the first
    frame). ``lora``: peft LoRA settings, or ``None``."""

    condition: str = "action"
    aliases: tuple[str, ...] = ("actions",)
    dim: int = 4
    dropout: float = 0.0
    blocks: tuple[int, ...] | None = None
    hidden: int = 64
    cumulative: bool = False
    lora: LoraSettings | None = None

    def __post_init__(self):
        check(self.condition.isidentifier(), "condition", f"must be an identifier, got {self.condition!r}.")
        check(self.dim >= 1, "dim", f"must be >= 1, got {self.dim}.")
        check(self.hidden >= 1, "hidden", f"must be >= 1, got {self.hidden}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)


@register("adapter", "action_modulation")
class ActionModulation(InsideSpecAdapter):
    """Per-frame FiLM of the base's blocks from a per-frame condition, optionally with LoRA."""

    config_class = ActionModulationConfig

    def __init__(self, config: ActionModulationConfig | None = None, **overrides):
        super().__init__()
        self.config = config = config_from(type(self), config, overrides)
        self.consumes = (Condition(config.condition, aliases=config.aliases, dim=config.dim, per_frame="keep",
                                   dropout=config.dropout),)
        self.trunk = nn.Sequential(nn.Linear(config.dim * (1 + int(config.cumulative)), config.hidden),
                                   nn.SiLU())
        self.heads = nn.ModuleDict()

    @classmethod
    def from_config(cls, config: ActionModulationConfig) -> ActionModulation:
        return cls(config)

    def attach(self, spec: InsideSpec) -> None:
        chosen = check_indices(self.config.blocks, len(spec.blocks), "action_modulation blocks",
                               type(self.bound_backbone).__name__)
        for i in chosen:
            head = nn.Linear(self.config.hidden, 2 * spec.widths[i])
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            self.heads[str(i)] = head
            spec.blocks[i].register_forward_hook(self._hook(i, spec.layout))
        if self.config.lora is not None:
            self.lora = LoraModules(self.config.lora, spec, type(self.bound_backbone).__name__)
            object.__setattr__(self, "_lora_layers", self.lora.found)

    def prepare_state(self, cond, x_t, t):
        signal = getattr(cond, self.config.condition).to(x_t.dtype)  # (B, T, D)
        if self.config.cumulative:
            signal = with_running_sum(signal)  # (B, T, 2D)
        features = self.trunk(signal)  # (B, T, hidden)
        return {int(i): head(features).chunk(2, dim=-1) for i, head in self.heads.items()}  # (B, T, W) twice

    def _hook(self, index: int, layout: str):
        def hook(module, args, output):
            if not self.active:
                return None
            hidden = output[0] if isinstance(output, tuple) else output
            scale, shift = self.state[index]
            hidden = hidden * (1 + per_frame(scale, hidden, layout)) + per_frame(shift, hidden, layout)
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook


__all__ = ["ActionModulation", "ActionModulationConfig"]
