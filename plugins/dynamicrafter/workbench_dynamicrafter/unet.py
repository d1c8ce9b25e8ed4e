"""DynamiCrafter's 3-D U-Net denoiser, written for the official checkpoints' parameter layout.

Frames are folded into the batch for the 2-D parts (``(B T) C H W``); the temporal parts see
``B C T H W``. Per resolution level: ResBlocks (each followed by a temporal convolution block),
spatial transformers (self-attention, then cross-attention to the text tokens and, through their
own key/value projections, to the image tokens) and temporal transformers (two self-attentions
over frames). An extra temporal transformer (``init_attn``) follows the stem. The timestep and
the frame stride / fps share the sinusoidal embedding; their MLP outputs are added.

Module names follow the checkpoints (``input_blocks.N.M``, ``to_k_ip``, ...), so loading is a
prefix change; the one renamed key is upstream's ``temopral_conv`` (stored as ``temporal_conv``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench_dynamicrafter.variants import Sizes


def sinusoid(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """``[cos | sin]`` embedding of (possibly fractional) timesteps ``(N,)`` → ``(N, dim)`` float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class Float32GroupNorm(nn.GroupNorm):
    """GroupNorm computed in float32 whatever the input dtype (the ResBlocks' and the output's).

    Its weights belong in float32 too: the backbone lists every one in ``keep_in_float32()``, so
    moving it to bf16 leaves them float32 (a copy elsewhere in another dtype is upcast here).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.group_norm(x.float(), self.num_groups, weight, bias, self.eps).to(x.dtype)


def heads_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Multi-head softmax attention on ``(N, L, heads * d)`` projections."""
    n, lq, inner = q.shape
    d = inner // heads
    q, k, v = (x.view(n, -1, heads, d).transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(n, lq, inner)


class Attention(nn.Module):
    """Softmax attention; with ``image_tokens`` the context splits into text (first ``text_length``
    tokens) and image tokens, each with its own key/value projections, sharing the query."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int | None = None,
                 image_tokens: bool = False, learnable_scale: bool = False, text_length: int = 77):
        super().__init__()
        inner, context_dim = heads * head_dim, context_dim or dim
        self.heads, self.text_length = heads, text_length
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0))
        self.image_tokens = image_tokens
        if image_tokens:
            self.to_k_ip = nn.Linear(context_dim, inner, bias=False)
            self.to_v_ip = nn.Linear(context_dim, inner, bias=False)
            if learnable_scale:
                self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        q = self.to_q(x)
        if context is None:
            return self.to_out(heads_attention(q, self.to_k(x), self.to_v(x), self.heads))
        text = context[:, :self.text_length]
        out = heads_attention(q, self.to_k(text), self.to_v(text), self.heads)
        if self.image_tokens:
            image = context[:, self.text_length:]
            out_image = heads_attention(q, self.to_k_ip(image), self.to_v_ip(image), self.heads)
            if hasattr(self, "alpha"):
                out_image = out_image * (torch.tanh(self.alpha) + 1)
            out = out + out_image
        return self.to_out(out)


class GEGLU(nn.Module):
    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(x).chunk(2, dim=-1)
        return value * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.Sequential(GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    """Self-attention, attention to the context (self-attention again without one), GEGLU MLP."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int | None,
                 image_tokens: bool = False, learnable_scale: bool = False, text_length: int = 77):
        super().__init__()
        self.attn1 = Attention(dim, heads, head_dim)
        self.ff = FeedForward(dim)
        self.attn2 = Attention(dim, heads, head_dim, context_dim, image_tokens, learnable_scale, text_length)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    """Attention within each frame, ``(B T) C H W`` → same; zero-initialised output projection."""

    def __init__(self, channels: int, heads: int, head_dim: int, context_dim: int, learnable_scale: bool,
                 text_length: int):
        super().__init__()
        inner = heads * head_dim
        self.norm = nn.GroupNorm(32, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, inner)
        self.transformer_blocks = nn.ModuleList([TransformerBlock(inner, heads, head_dim, context_dim, True,
                                                                  learnable_scale, text_length)])
        self.proj_out = nn.Linear(inner, channels)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        tokens = self.proj_in(self.norm(x).flatten(2).transpose(1, 2))
        for block in self.transformer_blocks:
            tokens = block(tokens, context)
        return self.proj_out(tokens).transpose(1, 2).reshape(n, c, h, w) + x


class TemporalTransformer(nn.Module):
    """Self-attention across frames at each pixel, ``B C T H W`` → same. ``conv`` projections are
    the 1x1 ``Conv1d`` ones of ``init_attn``; the others are ``Linear``."""

    def __init__(self, channels: int, heads: int, head_dim: int, conv: bool = False):
        super().__init__()
        inner = heads * head_dim
        self.conv = conv
        self.norm = nn.GroupNorm(32, channels, eps=1e-6)
        self.proj_in = nn.Conv1d(channels, inner, 1) if conv else nn.Linear(channels, inner)
        self.transformer_blocks = nn.ModuleList([TransformerBlock(inner, heads, head_dim, None)])
        self.proj_out = nn.Conv1d(inner, channels, 1) if conv else nn.Linear(inner, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        seq = self.norm(x).permute(0, 3, 4, 1, 2).reshape(b * h * w, c, t)  # (B H W) C T
        seq = self.proj_in(seq).transpose(1, 2) if self.conv else self.proj_in(seq.transpose(1, 2))
        for block in self.transformer_blocks:
            seq = block(seq)
        seq = self.proj_out(seq.transpose(1, 2)) if self.conv else self.proj_out(seq).transpose(1, 2)
        return seq.reshape(b, h, w, c, t).permute(0, 3, 4, 1, 2) + x


class TemporalConv(nn.Module):
    """Four (GroupNorm, SiLU, Conv3d k=(3,1,1)) stages added to the input; the last starts at zero."""

    def __init__(self, channels: int):
        super().__init__()

        def stage(dropout: bool) -> nn.Sequential:
            layers = [nn.GroupNorm(32, channels), nn.SiLU()] + ([nn.Dropout(0.0)] if dropout else [])
            return nn.Sequential(*layers, nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0)))

        self.conv1, self.conv2, self.conv3, self.conv4 = stage(False), stage(True), stage(True), stage(True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv4(self.conv3(self.conv2(self.conv1(x))))


class ResBlock(nn.Module):
    """Per-frame residual block with the timestep embedding added, then a temporal convolution block."""

    def __init__(self, channels: int, emb_dim: int, out_channels: int):
        super().__init__()
        self.in_layers = nn.Sequential(Float32GroupNorm(32, channels), nn.SiLU(),
                                       nn.Conv2d(channels, out_channels, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, out_channels))
        self.out_layers = nn.Sequential(Float32GroupNorm(32, out_channels), nn.SiLU(), nn.Dropout(0.0),
                                        nn.Conv2d(out_channels, out_channels, 3, padding=1))
        self.skip_connection = (nn.Identity() if out_channels == channels
                                else nn.Conv2d(channels, out_channels, 1))
        self.temporal_conv = TemporalConv(out_channels)

    def forward(self, x: torch.Tensor, emb: torch.Tensor, batch: int) -> torch.Tensor:
        h = self.in_layers(x)
        h = h + self.emb_layers(emb).to(h.dtype)[:, :, None, None]
        h = self.skip_connection(x) + self.out_layers(h)
        video = h.unflatten(0, (batch, -1)).transpose(1, 2)  # B C T H W
        return self.temporal_conv(video).transpose(1, 2).flatten(0, 1)


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class Stage(nn.ModuleList):
    """One entry of ``input_blocks`` / ``output_blocks`` / ``middle_block``: its layers in order."""

    def forward(self, h: torch.Tensor, emb: torch.Tensor, context: torch.Tensor, batch: int) -> torch.Tensor:
        for layer in self:
            if isinstance(layer, ResBlock):
                h = layer(h, emb, batch)
            elif isinstance(layer, SpatialTransformer):
                h = layer(h, context)
            elif isinstance(layer, TemporalTransformer):
                h = layer(h.unflatten(0, (batch, -1)).transpose(1, 2)).transpose(1, 2).flatten(0, 1)
            else:
                h = layer(h)
        return h


def stage_width(stage: Stage) -> int:
    """The channels a stage hands on: those of its last layer that sets them."""
    for layer in reversed(list(stage)):
        if isinstance(layer, ResBlock):
            return layer.emb_layers[-1].out_features
        if isinstance(layer, Downsample):
            return layer.op.out_channels
        if isinstance(layer, Upsample):
            return layer.conv.out_channels
        if isinstance(layer, nn.Conv2d):
            return layer.out_channels
    raise ValueError(f"no layer of this stage sets its width: {stage!r}")


class UNet3D(nn.Module):
    """The denoiser: ``unet(x, t, context=..., fs=...)`` on ``x`` ``(B, in_channels, T, H, W)``.

    ``context`` ``(B, L, context_dim)``: 77 text tokens then the image tokens — ``queries`` per
    frame for a per-frame context (``L = 77 + T * queries``), otherwise shared by every frame.
    ``fs`` ``(B,)``: frame stride / fps (default ``default_fs``).

    :meth:`enable_gradient_checkpointing` (diffusers' switch, by the same name): each stage's
    activations are recomputed in the backward instead of kept, through
    ``_gradient_checkpointing_func`` as diffusers models call it (so an adapter may wrap it).
    """

    gradient_checkpointing = False

    def __init__(self, sizes: Sizes, in_channels: int = 8, out_channels: int = 4, default_fs: int = 3,
                 learnable_image_scale: bool = False):
        super().__init__()
        s = sizes
        mc, emb_dim = s.model_channels, s.model_channels * 4
        self.model_channels, self.default_fs = mc, default_fs
        self.text_length, self.queries = s.text_length, s.resampler_queries
        self.time_embed = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.fps_embedding = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))

        def attention(ch: int) -> list[nn.Module]:
            heads = ch // s.head_channels
            return [SpatialTransformer(ch, heads, s.head_channels, s.context_dim, learnable_image_scale,
                                       s.text_length),
                    TemporalTransformer(ch, heads, s.head_channels)]

        self.input_blocks = nn.ModuleList([Stage([nn.Conv2d(in_channels, mc, 3, padding=1)])])
        self.init_attn = Stage([TemporalTransformer(mc, s.init_attn_heads, s.head_channels, conv=True)])
        skips, ch, rate = [mc], mc, 1
        for level, mult in enumerate(s.channel_mult):
            for _ in range(s.num_res_blocks):
                layers: list[nn.Module] = [ResBlock(ch, emb_dim, mult * mc)]
                ch = mult * mc
                if rate in s.attention_resolutions:
                    layers += attention(ch)
                self.input_blocks.append(Stage(layers))
                skips.append(ch)
            if level != len(s.channel_mult) - 1:
                self.input_blocks.append(Stage([Downsample(ch)]))
                skips.append(ch)
                rate *= 2
        self.middle_block = Stage([ResBlock(ch, emb_dim, ch), *attention(ch), ResBlock(ch, emb_dim, ch)])
        self.output_blocks = nn.ModuleList()
        for level, mult in reversed(list(enumerate(s.channel_mult))):
            for i in range(s.num_res_blocks + 1):
                layers = [ResBlock(ch + skips.pop(), emb_dim, mult * mc)]
                ch = mult * mc
                if rate in s.attention_resolutions:
                    layers += attention(ch)
                if level and i == s.num_res_blocks:
                    layers.append(Upsample(ch))
                    rate //= 2
                self.output_blocks.append(Stage(layers))
        self.out = nn.Sequential(Float32GroupNorm(32, ch), nn.SiLU(),
                                 nn.Conv2d(mc, out_channels, 3, padding=1))

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each stage's activations in the backward (same values, less memory) while gradients
        are enabled."""
        from functools import partial

        from torch.utils.checkpoint import checkpoint

        self.gradient_checkpointing = True
        self._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)

    def disable_gradient_checkpointing(self) -> None:
        self.gradient_checkpointing = False

    def _run(self, stage: nn.Module, *args) -> torch.Tensor:
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(stage, *args)
        return stage(*args)

    def frame_context(self, context: torch.Tensor, frames: int) -> torch.Tensor:
        """``(B, L, D)`` → ``(B T, L', D)``: text shared by all frames, image tokens split per frame."""
        n_text = self.text_length
        if context.shape[1] == n_text + frames * self.queries:
            text = context[:, :n_text].repeat_interleave(frames, dim=0)
            image = context[:, n_text:].reshape(context.shape[0] * frames, self.queries, context.shape[2])
            return torch.cat([text, image], dim=1)
        return context.repeat_interleave(frames, dim=0)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                fs: torch.Tensor | None = None) -> torch.Tensor:
        b, _, frames = x.shape[:3]
        t = torch.as_tensor(t, device=x.device)
        t = t.expand(b) if t.ndim == 0 else t
        if fs is None:
            fs = torch.full((b,), self.default_fs, dtype=torch.long, device=x.device)
        fs = torch.as_tensor(fs, device=x.device)
        fs = fs.expand(b) if fs.ndim == 0 else fs
        emb = self.time_embed(sinusoid(t, self.model_channels).to(x.dtype))
        context = self.frame_context(context.to(x.dtype), frames)
        emb = emb.repeat_interleave(frames, dim=0)
        emb = emb + self.fps_embedding(
            sinusoid(fs, self.model_channels).to(x.dtype)).repeat_interleave(frames, 0)
        h = x.transpose(1, 2).flatten(0, 1)  # (B T) C H W
        hs = []
        for index, stage in enumerate(self.input_blocks):
            h = self._run(stage, h, emb, context, b)
            if index == 0:
                h = self._run(self.init_attn, h, emb, context, b)
            hs.append(h)
        h = self._run(self.middle_block, h, emb, context, b)
        for stage in self.output_blocks:
            h = self._run(stage, torch.cat([h, hs.pop()], dim=1), emb, context, b)
        return self.out(h).unflatten(0, (b, frames)).transpose(1, 2)
