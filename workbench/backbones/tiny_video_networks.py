"""The networks of ``tiny_video`` (:mod:`workbench.backbones.tiny_video`): a per-frame convolutional
autoencoder and a (2+1)-D U-Net denoiser over latent clips, with the CPU fast paths they run through
(:func:`per_frame`, :class:`Upsample2x`), each bit-identical to the plain call."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench.layers import ResBlock, group_count, timestep_embedding


class Upsample2x(nn.Module):
    """Nearest-neighbour 2× upsampling of ``(N, C, H, W)``: the values of ``nn.Upsample(scale_factor=2,
    mode="nearest")``, bit for bit (each is a copy of one input value), made by one broadcast copy, which
    is about 3× faster on a CPU. Under autograd it is ``F.interpolate`` itself, so gradients sum in
    its order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            return F.interpolate(x, scale_factor=2, mode="nearest")
        n, c, h, w = x.shape
        return x[:, :, :, None, :, None].expand(n, c, h, 2, w, 2).reshape(n, c, 2 * h, 2 * w)


#: The most frames one autoencoder call takes on a CPU. Its activations then stay in the caches: decoding
#: 192 frames in slices of 16 takes about half the time of one call, and each frame's output is the same,
#: bit for bit (tests/test_tiny_video_autoencoder.py; benchmarks/autoencoder_speed.py
#: measures it). GPUs take every frame at once.
CPU_FRAME_SLICE = 16


def per_frame(module: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """``module`` (a per-frame network) over ``frames`` ``(N, ...)``: in slices of at most
    :data:`CPU_FRAME_SLICE` frames on a CPU, all at once on a GPU or while its parameters train (their
    gradients then sum as one call sums them). Slices are near-equal, so none is a single frame."""
    n = frames.shape[0]
    if (frames.device.type != "cpu" or n <= CPU_FRAME_SLICE
            or (torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()))):
        return module(frames)
    return torch.cat([module(part) for part in frames.tensor_split(-(-n // CPU_FRAME_SLICE))])


class FrameAutoencoder(nn.Module):
    """Per-frame conv autoencoder: ``(N, 3, H, W)`` ↔ ``(N, C, H/d, W/d)``.

    No normalisation layers: every output pixel depends on a local patch only, so training on
    crops teaches exactly what full frames need.
    """

    def __init__(self, latent_channels: int, width: int, downsample: int):
        super().__init__()
        levels = int(math.log2(downsample))
        enc: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.SiLU()]
        ch = width
        for _ in range(levels):
            enc += [nn.Conv2d(ch, ch * 2, 4, stride=2, padding=1), nn.SiLU(),
                    nn.Conv2d(ch * 2, ch * 2, 3, padding=1), nn.SiLU()]
            ch *= 2
        enc += [nn.Conv2d(ch, latent_channels, 3, padding=1)]
        dec: list[nn.Module] = [nn.Conv2d(latent_channels, ch, 3, padding=1), nn.SiLU()]
        for _ in range(levels):
            dec += [Upsample2x(), nn.Conv2d(ch, ch // 2, 3, padding=1), nn.SiLU(),
                    nn.Conv2d(ch // 2, ch // 2, 3, padding=1), nn.SiLU()]
            ch //= 2
        dec += [nn.Conv2d(ch, 3, 3, padding=1)]
        self.encoder = nn.Sequential(*enc)
        self.decoder = nn.Sequential(*dec)


class Denoiser(nn.Module):
    """Two-level (2+1)-D U-Net over latent clips."""

    def __init__(self, latent_channels: int, width: int, depth: int, dropout: float):
        super().__init__()
        c = latent_channels
        self.emb_dim = width * 2
        self.time = nn.Sequential(nn.Linear(width, self.emb_dim), nn.SiLU(),
                                  nn.Linear(self.emb_dim, self.emb_dim))
        self.stem = nn.Conv3d(2 * c + 1, width, (1, 3, 3), padding=(0, 1, 1))
        self.down_blocks = nn.ModuleList(ResBlock(width, self.emb_dim, dropout) for _ in range(depth))
        self.down = nn.Conv3d(width, 2 * width, (1, 4, 4), stride=(1, 2, 2), padding=(0, 1, 1))
        self.mid_blocks = nn.ModuleList(ResBlock(2 * width, self.emb_dim, dropout) for _ in range(2 * depth))
        self.up = nn.Conv3d(2 * width, width, (1, 3, 3), padding=(0, 1, 1))
        self.merge = nn.Conv3d(2 * width, width, 1)
        self.up_blocks = nn.ModuleList(ResBlock(width, self.emb_dim, dropout) for _ in range(depth))
        self.out_norm = nn.GroupNorm(group_count(width), width)
        self.out = nn.Conv3d(width, c, (1, 3, 3), padding=(0, 1, 1))

    def forward(self, x_t: torch.Tensor, level: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x_t.shape
        frame0 = torch.zeros(b, 1, t, h, w, device=x_t.device, dtype=x_t.dtype)
        frame0[:, :, 0] = 1
        cond = first[:, :, None].expand(b, c, t, h, w)
        hidden = self.stem(torch.cat([x_t, cond, frame0], dim=1))  # (B, W, T, h, w)
        emb = self.time(timestep_embedding(level, self.stem.out_channels).to(x_t.dtype))
        for block in self.down_blocks:
            hidden = block(hidden, emb)
        skip = hidden
        hidden = self.down(hidden)  # (B, 2W, T, h/2, w/2)
        for block in self.mid_blocks:
            hidden = block(hidden, emb)
        hidden = F.interpolate(hidden, scale_factor=(1, 2, 2), mode="nearest")
        hidden = self.merge(torch.cat([self.up(hidden), skip], dim=1))
        for block in self.up_blocks:
            hidden = block(hidden, emb)
        return self.out(F.silu(self.out_norm(hidden)))  # (B, C, T, h, w)
