"""Small building blocks shared by the embedded backbone and the reference adapters."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def group_count(channels: int) -> int:
    return math.gcd(8, channels)


def with_running_sum(signal: torch.Tensor) -> torch.Tensor:
    """A per-frame signal ``(B, T, D)`` with its running sum over the *previous* frames appended:
    ``(B, T, 2D)``.

    Frame ``t`` gets ``sum(signal[:t])``; for delta actions that is the displacement since the
    first frame — where the arm should be now.
    """
    return torch.cat([signal, torch.cumsum(signal, dim=1) - signal], dim=-1)


def timestep_embedding(level: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of a noise level in [0, 1] (scaled to [0, 1000]), ``(B, dim)``."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=level.device,
                                                         dtype=torch.float32) / half)
    args = level.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    """(2+1)-D residual block with FiLM from the time embedding."""

    def __init__(self, ch: int, emb_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(group_count(ch), ch)
        self.spatial = nn.Conv3d(ch, ch, (1, 3, 3), padding=(0, 1, 1))
        self.film = nn.Linear(emb_dim, 2 * ch)
        self.norm2 = nn.GroupNorm(group_count(ch), ch)
        self.temporal = nn.Conv3d(ch, ch, (3, 1, 1), padding=(1, 0, 0))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(emb)[:, :, None, None, None].chunk(2, dim=1)  # (B, ch, 1, 1, 1)
        y = self.spatial(F.silu(self.norm1(h)))
        y = y * (1 + scale) + shift
        y = self.temporal(self.drop(F.silu(self.norm2(y))))
        return h + y
