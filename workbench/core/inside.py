"""Where an adapter inside the frozen base reaches: the contract's :class:`InsideSpec`.

A backbone that lets adapters work *inside* it (``lora``, ``action_modulation``, ``controlnet``)
says where from its :meth:`~workbench.core.capabilities.InsideAccess.inside_spec`: the network
every prediction runs through, the layers LoRA targets by default, the blocks hooks sit on and
how their hidden state is laid out. The adapters read nothing else of the backbone, so a new
backbone gains every inside adapter by declaring this one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from workbench.errors import CompositionError, listing

LAYOUTS = ("channels", "frames", "tokens")


@dataclass(frozen=True)
class InsideSpec:
    """Where inside adapters reach into a backbone.

    ``root``: the network every prediction runs through (tiny_video's denoiser, a DiT's
    transformer, a U-Net); ``root_name``: its attribute path on the backbone (the prefix of
    exported LoRA keys). ``lora_targets``: the default LoRA target module names (peft's suffix
    matching). ``blocks``: the blocks hooks may sit on, in forward order, with ``widths`` their
    hidden widths. ``branch_blocks``: how many leading blocks are a chain a ControlNet-style copy
    can run (each called with the previous one's hidden state first and the same other
    arguments; a block returning a tuple hands its other outputs on as the next block's
    following arguments). ``layout``: how a block's hidden state is laid out — ``channels``
    ``(B, W, T, h, w)``, ``frames`` ``(B * T, W, h, w)`` (frames folded into the batch,
    batch-major) or ``tokens`` ``(B, T * h * w, W)`` (frame-major).

    Examples:
        >>> spec = model.base.inside_spec()              # tiny_video's: its denoiser's blocks
        >>> spec.root_name, spec.layout, len(spec.blocks) == len(spec.widths)
        ('denoiser', 'channels', True)
    """

    root: nn.Module
    root_name: str
    lora_targets: tuple[str, ...]
    blocks: tuple[nn.Module, ...]
    widths: tuple[int, ...]
    branch_blocks: int
    layout: Literal["channels", "frames", "tokens"]

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.root, nn.Module):
            problems.append(f"root must be an nn.Module, got {type(self.root).__name__}")
        if not self.blocks or not all(isinstance(b, nn.Module) for b in self.blocks):
            problems.append("blocks must be a non-empty tuple of nn.Modules "
                            "(the blocks hooks sit on, in order)")
        if len(self.widths) != len(self.blocks):
            problems.append(f"widths has {len(self.widths)} entries for {len(self.blocks)} blocks; "
                            f"give one per block")
        if not 0 <= self.branch_blocks <= len(self.blocks):
            problems.append(f"branch_blocks={self.branch_blocks} is not in 0..{len(self.blocks)}")
        if self.layout not in LAYOUTS:
            problems.append(f"layout={self.layout!r}; allowed: {listing(LAYOUTS)}")
        if not self.lora_targets:
            problems.append("lora_targets is empty; name the layers LoRA adapts by default (e.g. to_q, to_v)")
        if problems:
            raise CompositionError("InsideSpec is invalid: " + "; ".join(problems) + ".")


__all__ = ["LAYOUTS", "InsideSpec"]
