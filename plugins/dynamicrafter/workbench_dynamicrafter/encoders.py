"""The conditioning towers and the autoencoder around the U-Net.

* Text: OpenCLIP ViT-H-14's text transformer as transformers' ``CLIPTextModel``. DynamiCrafter
  reads the penultimate layer through ``ln_final`` (all 77 positions), so the tower is built with
  one layer fewer than the checkpoint holds; the last layer's weights are checked and dropped.
* Image: OpenCLIP ViT-H-14's vision transformer as transformers' ``CLIPVisionModel``; its output
  is every token (class + 256 patches) of the last layer, without ``ln_post`` or the projection.
  Frames are resized to the tower's input size the way the release does (Gaussian pre-blur when
  shrinking, then bicubic with aligned corners) and normalised with CLIP's mean and std.
* :class:`Resampler`: the perceiver that turns the image tokens into ``queries`` tokens per frame.
* The KL-f8 VAE as diffusers' ``AutoencoderKL``, used one frame at a time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench_dynamicrafter.variants import Sizes

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def text_tower(s: Sizes):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(vocab_size=s.text_vocab, hidden_size=s.text_width,
                            intermediate_size=4 * s.text_width,
                            num_hidden_layers=s.text_layers - 1, num_attention_heads=s.text_heads,
                            max_position_embeddings=s.text_length, hidden_act="gelu", layer_norm_eps=1e-5,
                            bos_token_id=min(49406, s.text_vocab - 2),
                            eos_token_id=min(49407, s.text_vocab - 1),
                            pad_token_id=0, attn_implementation="sdpa")
    return CLIPTextModel(config)


def vision_tower(s: Sizes):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(hidden_size=s.vision_width, intermediate_size=4 * s.vision_width,
                              num_hidden_layers=s.vision_layers, num_attention_heads=s.vision_heads,
                              image_size=s.vision_image_size, patch_size=s.vision_patch, hidden_act="gelu",
                              layer_norm_eps=1e-5, attn_implementation="sdpa")
    return CLIPVisionModel(config)


def autoencoder(s: Sizes):
    from diffusers import AutoencoderKL

    levels = len(s.vae_channels)
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * levels,
                         up_block_types=("UpDecoderBlock2D",) * levels,
                         block_out_channels=tuple(s.vae_channels), layers_per_block=s.vae_res_blocks,
                         latent_channels=s.latent_channels, norm_num_groups=32, scaling_factor=0.18215)


def _gaussian_taps(size: int, sigma: float, like: torch.Tensor) -> torch.Tensor:
    x = torch.arange(size, dtype=like.dtype, device=like.device) - size // 2
    taps = torch.exp(-x.pow(2) / (2 * sigma**2))
    return taps / taps.sum()


def resize_like_release(image: torch.Tensor, size: int) -> torch.Tensor:
    """``(N, 3, H, W)`` → ``(N, 3, size, size)``: Gaussian blur when shrinking, then bicubic (aligned
    corners).

    The blur's sigma is ``(factor - 1) / 2`` per axis (at least 0.001), its width the odd number
    at or above ``max(4 sigma, 3)``, with reflected borders: the release's preprocessing.
    """
    h, w = image.shape[-2:]
    factors = (h / size, w / size)
    if max(factors) > 1:
        sigmas = [max((f - 1.0) / 2.0, 0.001) for f in factors]
        sizes = [int(max(4.0 * sg, 3)) for sg in sigmas]
        sizes = [k if k % 2 else k + 1 for k in sizes]
        c = image.shape[1]
        ky, kx = (_gaussian_taps(k, sg, image) for k, sg in zip(sizes, sigmas))
        padded = F.pad(image, (sizes[1] // 2, sizes[1] // 2, sizes[0] // 2, sizes[0] // 2), mode="reflect")
        padded = F.conv2d(padded, kx.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
        image = F.conv2d(padded, ky.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return F.interpolate(image, size=(size, size), mode="bicubic", align_corners=True)


class PerceiverAttention(nn.Module):
    """Latents attend to (image tokens, latents); q and k each scaled by ``head_dim ** -1/4``."""

    def __init__(self, dim: int, head_dim: int, heads: int):
        super().__init__()
        inner = head_dim * heads
        self.heads, self.head_dim = heads, head_dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        x, latents = self.norm1(x), self.norm2(latents)
        b, n, _ = latents.shape
        q = self.to_q(latents)
        k, v = self.to_kv(torch.cat([x, latents], dim=1)).chunk(2, dim=-1)
        q, k, v = (t.view(b, t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scale = 1 / math.sqrt(math.sqrt(self.head_dim))
        weight = torch.softmax(((q * scale) @ (k * scale).transpose(-2, -1)).float(), dim=-1).to(q.dtype)
        return self.to_out((weight @ v).transpose(1, 2).reshape(b, n, -1))


class Resampler(nn.Module):
    """Image tokens ``(B, N, embedding_dim)`` → ``(B, frames * queries, output_dim)`` (learned queries)."""

    def __init__(self, s: Sizes):
        super().__init__()
        dim = s.resampler_dim
        self.latents = nn.Parameter(torch.zeros(1, s.resampler_queries * s.frames, dim))
        self.proj_in = nn.Linear(s.vision_width, dim)
        self.proj_out = nn.Linear(dim, s.context_dim)
        self.norm_out = nn.LayerNorm(s.context_dim)
        inner = dim * s.resampler_ff_mult
        self.layers = nn.ModuleList(
            nn.ModuleList([PerceiverAttention(dim, s.resampler_head_dim, s.resampler_heads),
                           nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, inner, bias=False), nn.GELU(),
                                         nn.Linear(inner, dim, bias=False))])
            for _ in range(s.resampler_depth))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        latents = self.latents.expand(tokens.shape[0], -1, -1)
        x = self.proj_in(tokens)
        for attention, ff in self.layers:
            latents = attention(x, latents) + latents
            latents = ff(latents) + latents
        return self.norm_out(self.proj_out(latents))


#: open_clip's pre-tokenizer (OpenAI CLIP's): its two special tokens, contractions, letter runs, single
#: digits, runs of other non-space characters; matched ignoring case, as open_clip compiles it.
PRETOKENS = r"""<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def clean_text(text: str) -> str:
    """open_clip's text cleaning: ``ftfy.fix_text``, HTML entities unescaped twice, runs of whitespace made
    one space, stripped, lowercased (``whitespace_clean(basic_clean(text)).lower()``)."""
    import html

    import ftfy
    import regex

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return regex.sub(r"\s+", " ", text).strip().lower()


def _byte_symbols() -> dict[int, str]:
    """OpenAI CLIP's byte → printable character table (``bytes_to_unicode``): the BPE's alphabet."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_SYMBOLS = _byte_symbols()


def bpe_ids(text: str, tokenizer) -> list[int]:
    """The ids open_clip's ``SimpleTokenizer.encode`` gives ``text``, with ``tokenizer``'s vocabulary and
    merges.

    open_clip's steps, written here: :func:`clean_text`, the :data:`PRETOKENS` pieces (its special
    tokens ``<start_of_text>`` / ``<end_of_text>`` become the start / end ids), each piece's UTF-8
    bytes as :data:`BYTE_SYMBOLS`, then the BPE — the tokenizer's own model (a transformers
    ``CLIPTokenizer``, fast or slow), which holds OpenAI CLIP's merges as open_clip does. transformers'
    own text handling is not used: it skips ftfy and the HTML unescaping, and treats
    ``<|startoftext|>`` rather than ``<start_of_text>`` as special.
    """
    import regex

    specials = {"<start_of_text>": tokenizer.bos_token_id, "<end_of_text>": tokenizer.eos_token_id}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    ids: list[int] = []
    for piece in regex.findall(PRETOKENS, clean_text(text), regex.IGNORECASE):
        if piece in specials:
            ids.append(specials[piece])
            continue
        symbols = "".join(BYTE_SYMBOLS[b] for b in piece.encode("utf-8"))
        if backend is not None:
            ids += [t.id for t in backend.model.tokenize(symbols)]
        else:  # a slow tokenizer: its own BPE and vocabulary
            ids += [tokenizer.encoder[t] for t in tokenizer.bpe(symbols).split(" ")]
    return ids


def tokenize(prompts: list[str], tokenizer, s: Sizes) -> torch.Tensor:
    """Prompts → ``(B, text_length)`` ids as open_clip's ``tokenize`` makes them: start token, the text's
    tokens (:func:`bpe_ids`; cut to fit), end token, zeros. ``tokenizer``: a transformers ``CLIPTokenizer``
    (OpenAI CLIP's BPE, the vocabulary open_clip ships), or ``None`` for the tiny towers' character tokens.
    The plugin's tests check the ids against open_clip's own on a corpus of prompts (unicode, punctuation,
    casing, whitespace, HTML entities, over-long text)."""
    if tokenizer is None:
        start, end = s.text_vocab - 2, s.text_vocab - 1
        rows = [[1 + ord(ch) % (s.text_vocab - 3) for ch in " ".join(p.lower().split())] for p in prompts]
    else:
        start, end = tokenizer.bos_token_id, tokenizer.eos_token_id
        rows = [bpe_ids(p, tokenizer) for p in prompts]
    out = torch.zeros(len(prompts), s.text_length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids = [start, *row[:s.text_length - 2], end]
        out[i, :len(ids)] = torch.tensor(ids)
    return out
