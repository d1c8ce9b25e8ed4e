"""``synthetic_moves``: a tiny offline world-model toy — a bright square on a dark background
that moves by the clip's actions (dx, dy per step; the other two action dims are ignored).

Items match the Meta-World dataset's layout (``video`` ``(3, T, H, W)`` in [-1, 1], ``action``
``(T, 4)`` in [-1, 1]); every item is a pure function of ``(seed, index)``. Used by tests and
by the smallest example config; it needs no data file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from workbench.config import check, config_from
from workbench.registry import register


@dataclass
class SyntheticMovesConfig:
    """``items``: clips in the dataset; ``frames`` / ``size``: clip shape; ``square``: side in pixels."""

    items: int = 64
    frames: int = 8
    size: int = 16
    square: int = 4
    seed: int = 0

    def __post_init__(self):
        check(self.items >= 1, "items", f"must be >= 1, got {self.items}.")
        check(self.frames >= 2, "frames", f"must be >= 2, got {self.frames}.")
        check(2 <= self.square < self.size, "square", f"must be in [2, size), got {self.square}.")


@register("dataset", "synthetic_moves")
class SyntheticMoves(Dataset):
    config_class = SyntheticMovesConfig

    def __init__(self, config: SyntheticMovesConfig | None = None, **overrides):
        self.config = config_from(type(self), config, overrides)

    @classmethod
    def from_config(cls, config: SyntheticMovesConfig) -> SyntheticMoves:
        return cls(config)

    def __len__(self) -> int:
        return self.config.items

    def __getitem__(self, index: int) -> dict:
        c = self.config
        if not 0 <= index < c.items:
            raise IndexError(f"index {index} out of range for {c.items} items")
        g = torch.Generator().manual_seed(c.seed * 100_003 + index)
        actions = torch.rand(c.frames, 4, generator=g) * 2 - 1
        span = c.size - c.square
        pos = torch.rand(2, generator=g) * span
        video = torch.full((3, c.frames, c.size, c.size), -1.0)
        for t in range(c.frames):
            x, y = (int(v) for v in pos.round().tolist())
            video[:, t, y:y + c.square, x:x + c.square] = 1.0
            pos = (pos + actions[t, :2] * 2.0).clamp(0, span)
        return {"video": video, "action": actions}
