"""``latent_residual``: the reference adapter — a small (2+1)-D conv net that predicts a
correction in latent space from ``x_t``, the base's prediction, the first frame and a
per-frame condition (actions by default). Its output layer starts at zero, so ``Add`` and
``GatedResidual`` start exactly at the frozen base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from workbench.config import check
from workbench.core.adapter import Adapter
from workbench.core.conditions import Condition
from workbench.layers import ResBlock, group_count, timestep_embedding
from workbench.registry import register


@dataclass
class LatentResidualConfig:
    """``channels``: latent channels of the backbone. ``condition`` / ``aliases`` / ``dim`` /
    ``per_frame`` / ``dropout``: the condition it reads (``dim`` = its width). ``use_base_output``
    and ``use_first_frame``: extra inputs (the first frame is read if the backbone has it)."""

    channels: int = 4
    width: int = 32
    depth: int = 2
    condition: str = "action"
    aliases: tuple[str, ...] = ("actions",)
    dim: int = 4
    per_frame: Literal["keep", "mean", "sum"] = "keep"
    dropout: float = 0.0
    use_base_output: bool = True
    use_first_frame: bool = True

    def __post_init__(self):
        check(self.channels >= 1, "channels", f"must be >= 1, got {self.channels}.")
        check(self.width >= 8 and self.width % 8 == 0, "width", f"must be a multiple of 8 (>= 8), got {self.width}.")
        check(self.depth >= 1, "depth", f"must be >= 1, got {self.depth}.")
        check(self.dim >= 1, "dim", f"must be >= 1, got {self.dim}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")
        check(self.condition.isidentifier(), "condition", f"must be an identifier, got {self.condition!r}.")


@register("adapter", "latent_residual")
class LatentResidual(Adapter):
    """Zero-initialised latent correction conditioned on a per-frame signal."""

    config_class = LatentResidualConfig
    zero_init_output = True

    def __init__(self, config: LatentResidualConfig | None = None, **overrides):
        super().__init__()
        config = config or LatentResidualConfig(**overrides)
        self.config = config
        self.consumes = (
            Condition(config.condition, aliases=config.aliases, dim=config.dim, per_frame=config.per_frame,
                      dropout=config.dropout),
            *((Condition("first_frame", required=False),) if config.use_first_frame else ()),
        )
        c, w = config.channels, config.width
        inputs = c * (1 + int(config.use_base_output) + int(config.use_first_frame))
        self.emb_dim = 2 * w
        self.stem = nn.Conv3d(inputs, w, (1, 3, 3), padding=(0, 1, 1))
        self.time = nn.Sequential(nn.Linear(w, self.emb_dim), nn.SiLU(), nn.Linear(self.emb_dim, self.emb_dim))
        self.cond_mlp = nn.Sequential(nn.Linear(config.dim, self.emb_dim), nn.SiLU(),
                                      nn.Linear(self.emb_dim, 2 * w))
        self.blocks = nn.ModuleList(ResBlock(w, self.emb_dim, 0.0) for _ in range(config.depth))
        self.out_norm = nn.GroupNorm(group_count(w), w)
        self.out = nn.Conv3d(w, c, (1, 3, 3), padding=(0, 1, 1))
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @classmethod
    def from_config(cls, config: LatentResidualConfig) -> LatentResidual:
        return cls(config)

    def forward(self, x_t, t, cond, base_output=None):
        b, c, frames, h, w = x_t.shape
        parts = [x_t]
        if self.config.use_base_output:
            parts.append(base_output if base_output is not None else torch.zeros_like(x_t))
        if self.config.use_first_frame:
            first = cond.first_frame
            parts.append(first[:, :, None].expand(b, c, frames, h, w) if first is not None else torch.zeros_like(x_t))
        hidden = self.stem(torch.cat(parts, dim=1))  # (B, W, T, h, w)
        level = self.noise_level(t)
        emb = self.time(timestep_embedding(level, self.stem.out_channels).to(x_t.dtype))
        signal = getattr(cond, self.config.condition)
        film = self.cond_mlp(signal)  # (B, T, 2W) or (B, 2W)
        if film.ndim == 2:
            film = film[:, None].expand(b, frames, -1)
        scale, shift = film.permute(0, 2, 1)[..., None, None].chunk(2, dim=1)  # (B, W, T, 1, 1)
        hidden = hidden * (1 + scale) + shift
        for block in self.blocks:
            hidden = block(hidden, emb)
        return self.out(torch.nn.functional.silu(self.out_norm(hidden)))  # (B, C, T, h, w)
