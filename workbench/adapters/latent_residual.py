"""``latent_residual``: the reference adapter — a small (2+1)-D conv net that predicts a
correction in latent space from ``x_t``, the base's prediction, the first frame and a
per-frame condition (actions by default). Its output layer starts at zero, so ``Add`` and
``GatedResidual`` start exactly at the frozen base.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from workbench.adapters.path import (
    PATH_CHANNELS,
    PATH_SIGNAL,
    ActionPath,
    PathConfig,
    sample_border,
    translated,
)
from workbench.config import check, config_from
from workbench.core.adapter import SideAdapter
from workbench.core.conditions import Condition
from workbench.errors import DataError
from workbench.layers import ResBlock, group_count, timestep_embedding, with_running_sum
from workbench.registry import register


@dataclass
class LatentResidualConfig:
    """``channels``: latent channels of the backbone. ``condition`` / ``aliases`` / ``dim`` /
    ``per_frame`` / ``dropout``: the condition it reads (``dim`` = its width). ``use_base_output``
    and ``use_first_frame``: extra inputs (the first frame is read if the backbone has it).

    ``cumulative``: also read the running sum of the condition over the *previous* frames
    (frame ``t`` sees ``sum(cond[:t])``). For delta actions this is the displacement since the
    first frame — where the arm should be now — which a few temporal convolutions cannot
    integrate over a whole clip by themselves. Needs ``per_frame: keep``.
    ``coords``: two extra input channels with each latent pixel's (x, y) position in [-1, 1],
    so the correction can depend on where in the frame it is (perspective).
    ``levels``: 1 (every block at the latent resolution) or 2 (first ``depth`` blocks at half
    resolution with twice the width, which doubles the receptive field for the cost of about
    ``depth`` more full-resolution blocks; latent height and width must be even).
    ``warps``: that many extra inputs, each the first frame's latent translated per frame by a
    displacement (in latent pixels) predicted linearly from the condition (zero at init). With
    delta actions and ``cumulative``, a translation is what moving a gripper mostly looks like
    in a small, distant view; the network learns where to use the translated copy, instead of
    having to learn shifts with its convolutions. Needs ``use_first_frame``.
    ``state`` / ``state_dim``: also read this per-frame condition at the *first* frame only (the
    robot's measured state where the clip starts, e.g. ``ee_pos``, width 3, or ``proprio``), next
    to the actions everywhere they go (FiLM and warps): where the hand starts decides where
    the same actions take it in the picture. Nothing of a later frame's state is read.
    ``path``: draw the hand's path implied by the first frame's measured position and the actions
    into every frame (two extra input maps at latent resolution, and the path's image position in
    the per-frame signal), projected with the clip's camera calibration; a mapping of
    :class:`~workbench.adapters.path.PathConfig` options (``{}``: the defaults), or null. It is
    computed from the ``action`` condition inside the forward, so editing the actions moves it.
    Needs ``per_frame: keep``, the ``ee_pos`` and ``camera`` conditions.
    """

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
    cumulative: bool = False
    coords: bool = False
    levels: Literal[1, 2] = 1
    warps: int = 0
    state: str | None = None
    state_dim: int = 3
    path: dict | None = None

    def __post_init__(self):
        check(self.channels >= 1, "channels", f"must be >= 1, got {self.channels}.")
        check(self.width >= 8 and self.width % 8 == 0, "width",
              f"must be a multiple of 8 (>= 8), got {self.width}.")
        check(self.depth >= 1, "depth", f"must be >= 1, got {self.depth}.")
        check(self.dim >= 1, "dim", f"must be >= 1, got {self.dim}.")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}.")
        check(self.condition.isidentifier(), "condition", f"must be an identifier, got {self.condition!r}.")
        check(not self.cumulative or self.per_frame == "keep", "cumulative",
              f"needs per_frame: keep (a running sum over frames), got per_frame: {self.per_frame}.")
        check(self.warps >= 0, "warps", f"must be >= 0, got {self.warps}.")
        check(not self.warps or self.use_first_frame, "warps",
              "translates the first frame, so it needs use_first_frame: true.")
        check(self.state is None or (self.state.isidentifier() and self.state != self.condition), "state",
              f"must be null or the name of another per-frame condition (e.g. ee_pos), got {self.state!r}.")
        check(self.state_dim >= 1, "state_dim", f"must be >= 1, got {self.state_dim}.")
        if self.path is not None:
            self.path = PathConfig.checked(self.path, self.dim)
            check(self.per_frame == "keep", "path", f"draws one point per frame, so it needs "
                                                    f"per_frame: keep, got per_frame: {self.per_frame}.")


@register("adapter", "latent_residual")
class LatentResidual(SideAdapter):
    """Zero-initialised latent correction conditioned on a per-frame signal."""

    config_class = LatentResidualConfig
    at_init = "zero_output"

    def __init__(self, config: LatentResidualConfig | None = None, **overrides):
        super().__init__()
        self.config = config = config_from(type(self), config, overrides)
        self.path = (ActionPath(PathConfig(**config.path), "latent_residual") if config.path is not None
                     else None)
        self._translates = bool(self.path and self.path.config.translate and config.use_first_frame)
        self.consumes = (
            Condition(config.condition, aliases=config.aliases, dim=config.dim, per_frame=config.per_frame,
                      dropout=config.dropout),
            *((Condition("first_frame", required=False),) if config.use_first_frame else ()),
            *((Condition(config.state, dim=config.state_dim, per_frame="keep"),) if config.state else ()),
            *(self.path.conditions(existing=(config.state,)) if self.path else ()),
        )
        c, w = config.channels, config.width
        inputs = c * (1 + int(config.use_base_output) + int(config.use_first_frame) + config.warps)
        inputs += 2 * int(config.coords) + (PATH_CHANNELS if self.path else 0)
        inputs += c * int(self._translates)
        signal_dim = config.dim * (1 + int(config.cumulative)) + (config.state_dim if config.state else 0)
        signal_dim += PATH_SIGNAL if self.path else 0
        self.emb_dim = 2 * w
        self.stem = nn.Conv3d(inputs, w, (1, 3, 3), padding=(0, 1, 1))
        self.time = nn.Sequential(nn.Linear(w, self.emb_dim), nn.SiLU(),
                                  nn.Linear(self.emb_dim, self.emb_dim))
        self.cond_mlp = nn.Sequential(nn.Linear(signal_dim, self.emb_dim), nn.SiLU(),
                                      nn.Linear(self.emb_dim, 2 * w))
        if config.warps:
            self.warp = nn.Linear(signal_dim, 2 * config.warps)  # (dx, dy) per warp, latent pixels
            nn.init.zeros_(self.warp.weight)
            nn.init.zeros_(self.warp.bias)
        if config.levels == 2:
            self.down = nn.Conv3d(w, 2 * w, (1, 4, 4), stride=(1, 2, 2), padding=(0, 1, 1))
            self.low_film = nn.Linear(self.emb_dim, 4 * w)
            self.low_blocks = nn.ModuleList(ResBlock(2 * w, self.emb_dim, 0.0) for _ in range(config.depth))
            self.up = nn.Conv3d(2 * w, w, (1, 3, 3), padding=(0, 1, 1))
        self.blocks = nn.ModuleList(ResBlock(w, self.emb_dim, 0.0) for _ in range(config.depth))
        self.out_norm = nn.GroupNorm(group_count(w), w)
        self.out = nn.Conv3d(w, c, (1, 3, 3), padding=(0, 1, 1))
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @classmethod
    def from_config(cls, config: LatentResidualConfig) -> LatentResidual:
        return cls(config)

    def attach_base_model(self, base) -> None:
        if self.path is not None:
            self.path.check_base(base)

    def forward(self, x_t, t, cond, base_output=None):
        b, c, frames, h, w = x_t.shape
        signal = getattr(cond, self.config.condition)  # (B, T, D) or (B, D)
        maps = None
        # drawn from the actions as given (an edit moves it) and the first frame's state
        if self.path is not None:
            maps, along = self.path.render(cond, signal, h, w)
        if self.config.cumulative:
            signal = with_running_sum(signal)  # (B, T, 2D)
        if self.config.state:
            start = getattr(cond, self.config.state)[:, :1]  # (B, 1, S): the state at the given first frame
            start = start.expand(b, signal.shape[1], -1) if signal.ndim == 3 else start[:, 0]
            signal = torch.cat([signal, start.to(signal.dtype)], dim=-1)
        if maps is not None:
            signal = torch.cat([signal, along.to(signal.dtype)], dim=-1)
        parts = [x_t]
        if self.config.use_base_output:
            parts.append(base_output if base_output is not None else torch.zeros_like(x_t))
        if self.config.use_first_frame:
            first = cond.first_frame
            parts.append(first[:, :, None].expand(b, c, frames, h, w) if first is not None
                         else torch.zeros_like(x_t))
            if self.config.warps:
                parts += self._translated(first, signal, frames) if first is not None else \
                    [torch.zeros_like(x_t)] * self.config.warps
        if self.config.coords:
            grid = dict(device=x_t.device, dtype=x_t.dtype)
            ys = torch.linspace(-1, 1, h, **grid).view(1, 1, 1, h, 1).expand(b, 1, frames, h, w)
            xs = torch.linspace(-1, 1, w, **grid).view(1, 1, 1, 1, w).expand(b, 1, frames, h, w)
            parts += [xs, ys]
        if maps is not None:
            parts.append(maps.to(x_t.dtype))
        if self._translates:
            first = cond.first_frame
            parts.append(translated(first, along).to(x_t.dtype) if first is not None
                         else torch.zeros_like(x_t))
        hidden = self.stem(torch.cat(parts, dim=1))  # (B, W, T, h, w)
        level = self.noise_level(t)
        emb = self.time(timestep_embedding(level, self.stem.out_channels).to(x_t.dtype))
        features = self.cond_mlp[:-1](signal)  # (B, T, E) or (B, E)
        if features.ndim == 2:
            features = features[:, None].expand(b, frames, -1)
        hidden = _film(hidden, self.cond_mlp[-1](features))
        if self.config.levels == 2:
            if h % 2 or w % 2:
                raise DataError(f"latent_residual with levels=2 needs an even latent height and width, got "
                                f"{h}x{w}. Use levels: 1 for this backbone.")
            low = _film(self.down(hidden), self.low_film(features))  # (B, 2W, T, h/2, w/2)
            for block in self.low_blocks:
                low = block(low, emb)
            hidden = hidden + self.up(F.interpolate(low, scale_factor=(1, 2, 2), mode="nearest"))
        for block in self.blocks:
            hidden = block(hidden, emb)
        return self.out(F.silu(self.out_norm(hidden)))  # (B, C, T, h, w)

    def _translated(self, first: torch.Tensor, signal: torch.Tensor, frames: int) -> list[torch.Tensor]:
        """``warps`` copies of ``first`` ``(B, C, h, w)``, each shifted per frame: ``(B, C, T, h, w)``
        each."""
        b, c, h, w = first.shape
        k = self.config.warps
        shift = self.warp(signal)  # (B, T, 2K) or (B, 2K)
        if shift.ndim == 2:
            shift = shift[:, None].expand(b, frames, -1)
        shift = shift.reshape(b, frames, k, 2) * shift.new_tensor([2.0 / max(w - 1, 1), 2.0 / max(h - 1, 1)])
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h, device=first.device, dtype=first.dtype),
                                torch.linspace(-1, 1, w, device=first.device, dtype=first.dtype),
                                indexing="ij")
        grid = torch.stack([xs, ys], dim=-1)  # (h, w, 2), x first as grid_sample expects
        grid = grid - shift[:, :, :, None, None, :]  # (B, T, K, h, w, 2): read from where it came from
        source = first[:, None, None].expand(b, frames, k, c, h, w).reshape(-1, c, h, w)
        moved = sample_border(source, grid.reshape(-1, h, w, 2), align_corners=True)  # (B*T*K, C, h, w)
        moved = moved.view(b, frames, k, c, h, w).permute(2, 0, 3, 1, 4, 5)  # (K, B, C, T, h, w)
        return list(moved.unbind(0))


def _film(hidden: torch.Tensor, film: torch.Tensor) -> torch.Tensor:
    """Per-frame FiLM: ``hidden`` ``(B, W, T, h, w)`` scaled and shifted by ``film`` ``(B, T, 2W)``."""
    scale, shift = film.permute(0, 2, 1)[..., None, None].chunk(2, dim=1)  # (B, W, T, 1, 1)
    return hidden * (1 + scale) + shift
