"""The tiny preview: a small convolutional latent → RGB decoder distilled from the backbone's own.

The linear preview (:mod:`workbench.inspect.previews.linear_preview`) maps each latent pixel to its block of
output pixels on its own, so its pictures are blocky and miss what a decoder does across
neighbouring latents. The tiny preview keeps that linear map as a skip path and adds a small
convolutional body that reads a 7×7 latent neighbourhood (three 3×3 convolutions), then lays
each latent pixel's block out with a pixel shuffle:

    video = shuffle(linear(z) + body(z))                    # per latent frame

It is trained (distilled) to reproduce ``base.decode`` and starts exactly at the linear
preview (the body's last layer is zero at init). Its cost is a few percent of a full decode on
the embedded model (``benchmarks/preview_overhead.py`` measures both), and its held-out quality
is measured against the full decode: ``preview.psnr`` next to ``preview.linear_psnr`` (the linear
preview's on the same held-out latents).

Training latents are data-free unless you pass frames: standard-normal clips (white and
spatially smooth, as for the linear fit), the same clips sent once and twice through
``decode`` → ``encode`` (latents the VAE itself produces, i.e. clean-looking frames) and those
mixed with fresh noise (what ``x_t`` looks like mid-run). A backbone without ``encode`` trains on
the random clips alone. Data-free previews are cached per backbone identity like the linear one
(``tiny-<identity>`` in :func:`~workbench.inspect.previews.preview_cache.cache_dir`, safetensors + JSON); the
embedded ``tiny_video`` model ships its distilled preview next to its weights.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.backbone import BaseVideoModel, causal_latents
from workbench.inspect.common import InspectError
from workbench.inspect.previews.latent_space import (
    DEFAULT_CHUNK_FRAMES,
    data_free_latents,
    decode_chunked,
    encode_samples,
    is_pixel_space,
    latent_layout,
    latent_shape_from_card,
)
from workbench.inspect.previews.linear_preview import solve_linear
from workbench.inspect.previews.preview_cache import backbone_identity, cache_dir, read_files, write_files
from workbench.loop import LRSchedule, TrainingLoop, then
from workbench.metrics import psnr

TINY_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "backbones" / "weights"
MAX_PARAMETERS = 1_000_000

_MEMORY: dict[str, TinyPreview] = {}


class TinyDecoder(nn.Module):
    """Latents ``(B, C, T', h, w)`` → video ``(B, 3, T, h d, w d)``, one latent frame at a time.

    ``r`` frames per latent frame; ``causal``: latent frame 0 decodes to one frame through its own
    heads (``T = 1 + r (T' - 1)``), as in causal video VAEs.
    """

    def __init__(self, channels: int, downsample: int, frames_per_latent: int = 1, causal: bool = False,
                 width: int = 64):
        super().__init__()
        self.channels, self.d, self.r, self.causal, self.width = (channels, downsample, frames_per_latent,
                                                                  causal, width)
        block = frames_per_latent * 3 * downsample * downsample
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.SiLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.SiLU(),
        )
        self.skip = nn.Conv2d(channels, block, 1)  # the linear preview
        self.head = nn.Conv2d(width, block, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        if causal:
            self.skip_first = nn.Conv2d(channels, 3 * downsample * downsample, 1)
            self.head_first = nn.Conv2d(width, 3 * downsample * downsample, 1)
            nn.init.zeros_(self.head_first.weight)
            nn.init.zeros_(self.head_first.bias)

    def _frames(self, z: torch.Tensor, skip: nn.Conv2d, head: nn.Conv2d, r: int) -> torch.Tensor:
        b, c, t, h, w = z.shape
        flat = z.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        blocks = skip(flat) + head(self.body(flat))  # (B T', r 3 d d, h, w)
        pictures = F.pixel_shuffle(blocks.reshape(b * t * r, 3 * self.d * self.d, h, w), self.d)
        return pictures.view(b, t * r, 3, h * self.d, w * self.d).transpose(1, 2)  # (B, 3, T' r, H, W)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if not self.causal:
            return self._frames(z, self.skip, self.head, self.r)
        first = self._frames(z[:, :, :1], self.skip_first, self.head_first, 1)
        if z.shape[2] == 1:
            return first
        return torch.cat([first, self._frames(z[:, :, 1:], self.skip, self.head, self.r)], dim=2)

    def init_linear(self, weight: torch.Tensor, weight_first: torch.Tensor | None = None) -> None:
        """Set the skip path to a linear preview's weights ``(C + 1, r 3 d d)`` (last row: bias)."""
        c = self.channels
        with torch.no_grad():
            self.skip.weight.copy_(weight[:c].T.reshape(-1, c, 1, 1))
            self.skip.bias.copy_(weight[c])
            if self.causal and weight_first is not None:
                self.skip_first.weight.copy_(weight_first[:c].T.reshape(-1, c, 1, 1))
                self.skip_first.bias.copy_(weight_first[c])


@dataclass
class TinyPreview:
    """A distilled :class:`TinyDecoder`; call it on latents ``(B, C, T', h, w)``.

    ``psnr``: held-out dB against the full decode; ``linear_psnr``: the linear preview's on the
    same held-out latents (so ``psnr - linear_psnr`` is what distilling bought). ``source``:
    ``"samples"`` or ``"data-free"``; ``steps``: optimiser steps of the distillation.
    """

    net: TinyDecoder
    identity: str
    psnr: float
    linear_psnr: float
    source: str
    steps: int = 0
    n_fit: int = 0
    n_heldout: int = 0
    _on_device: dict = field(default_factory=dict, repr=False, compare=False)

    kind = "tiny"

    @property
    def channels(self) -> int:
        return self.net.channels

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.net.parameters())

    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``(B, C, T', h, w)`` → video ``(B, 3, T, H, W)`` in [-1, 1], on the latents' device."""
        if latents.ndim != 5 or latents.shape[1] != self.channels:
            raise InspectError(
                f"This tiny preview decodes {self.channels}-channel latents (B, C, T, h, w); got shape "
                f"{tuple(latents.shape)}. Distil one for this backbone with fit_preview(base, kind='tiny')."
            )
        device = latents.device
        if device not in self._on_device:  # one copy per device, not per call
            self._on_device[device] = self.net if device.type == "cpu" else copy.deepcopy(self.net).to(device)
            self._on_device[device].eval()
        with torch.no_grad():
            return self._on_device[device](latents.float()).clamp(-1, 1)

    def meta(self) -> dict[str, Any]:
        n = self.net
        return {"version": TINY_VERSION, "kind": "tiny", "identity": self.identity, "channels": n.channels,
                "downsample": n.d, "frames_per_latent": n.r, "causal": n.causal, "width": n.width,
                "psnr": self.psnr, "linear_psnr": self.linear_psnr, "source": self.source,
                "steps": self.steps, "n_fit": self.n_fit, "n_heldout": self.n_heldout}

    def __repr__(self) -> str:
        return (f"TinyPreview({self.source}, C={self.channels}, d={self.net.d}, r={self.net.r}"
                f"{', causal' if self.net.causal else ''}, {self.parameters:,} parameters: "
                f"{self.psnr:.1f} dB held-out vs full decode, linear preview {self.linear_psnr:.1f} dB)")


# -- cache ---------------------------------------------------------------------------------
def _paths(folder: Path, identity: str) -> tuple[Path, Path]:
    return folder / f"tiny-{identity}.safetensors", folder / f"tiny-{identity}.json"


def _shipped(identity: str) -> tuple[Path, Path] | None:
    for meta_path in sorted(SHIPPED_DIR.glob("*.tiny_preview.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("identity") == identity:
            return meta_path.with_suffix(".safetensors"), meta_path
    return None


def load_cached_tiny(identity: str) -> TinyPreview | None:
    """The tiny preview cached on disk (or shipped with workbench) for ``identity``, or ``None``."""
    refit = "fit_preview(base, kind='tiny', refit=True) to distil it again"
    found = read_files(*_paths(cache_dir(), identity), "tiny preview", refit)
    if found is None:
        shipped = _shipped(identity)
        found = None if shipped is None else read_files(*shipped, "tiny preview", refit)
    if found is None:
        return None
    meta, tensors = found
    if meta.get("version") != TINY_VERSION:
        return None
    net = TinyDecoder(meta["channels"], meta["downsample"], meta["frames_per_latent"], meta["causal"],
                      meta["width"])
    net.load_state_dict(tensors)
    net.eval()
    return TinyPreview(net=net, identity=identity, psnr=float(meta["psnr"]),
                       linear_psnr=float(meta["linear_psnr"]),
                       source=meta["source"], steps=meta.get("steps", 0), n_fit=meta.get("n_fit", 0),
                       n_heldout=meta.get("n_heldout", 0))


def save_cached_tiny(preview: TinyPreview, folder: Path | None = None, stem: str | None = None) -> Path:
    """Write ``preview`` (atomically) to the disk cache, or to ``folder/stem.*``; returns the safetensors
    path."""
    folder = folder or cache_dir()
    paths = _paths(folder, preview.identity) if stem is None else (folder / f"{stem}.safetensors",
                                                                      folder / f"{stem}.json")
    tensors = {k: v.detach().cpu().contiguous() for k, v in preview.net.state_dict().items()}
    return write_files(*paths, tensors, preview.meta())


def clear_tiny_cache() -> None:
    """Forget the tiny previews held in memory."""
    _MEMORY.clear()


# -- distilling ----------------------------------------------------------------------------
def _decode_all(base: BaseVideoModel, z: torch.Tensor, chunk_frames: int | None) -> torch.Tensor:
    return torch.cat([decode_chunked(base, z[i:i + 1], chunk_frames) for i in range(z.shape[0])])


def _training_latents(base: BaseVideoModel, shape: tuple[int, ...], count: int, seed: int,
                      chunk_frames: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-free latents (see the module doc) and their full decodes, on the CPU in float32."""
    c, t, h, w = shape
    z = data_free_latents(c, t, h, w, count, seed, device=base.device, dtype=base.dtype)
    sets, videos = [z], [_decode_all(base, z, chunk_frames)]
    try:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            once = base.encode(videos[0].to(dtype=base.dtype))
            once_video = _decode_all(base, once, chunk_frames)
            twice = base.encode(once_video.to(dtype=base.dtype))
            twice_video = _decode_all(base, twice, chunk_frames)
            sigma = torch.rand(count, 1, 1, 1, 1, generator=g) * 0.6 + 0.2
            noise = torch.randn(twice.shape, generator=g)
            mixed = ((1 - sigma) * twice.float().cpu() + sigma * noise).to(device=base.device,
                                                                            dtype=base.dtype)
        if once.shape[1:] == z.shape[1:]:
            sets += [once, twice, mixed]
            videos += [once_video, twice_video, _decode_all(base, mixed, chunk_frames)]
    except NotImplementedError:
        pass
    return (torch.cat([s.detach().float().cpu() for s in sets]),
            torch.cat([v.detach().float().cpu() for v in videos]))


def distil_tiny_preview(base: BaseVideoModel, samples: Any = None, *,
                        latent_shape: tuple[int, ...] | None = None, n_fit: int = 24, n_heldout: int = 4,
                        steps: int = 800, width: int = 64, batch: int = 8,
                        lr: float = 3e-3, seed: int = 0, chunk_frames: int | None = DEFAULT_CHUNK_FRAMES,
                        progress: bool = False) -> TinyPreview:
    """Distil a :class:`TinyPreview` of ``base`` (no cache; :func:`fit_preview` with ``kind="tiny"`` caches).

    Data-free: ``n_fit`` random clips of ``latent_shape = (C, T', h, w)`` (default: from the
    card, at most 4 latent frames) and their re-encoded and noised versions (4 ``n_fit`` clips),
    plus ``n_heldout`` held-out clips made the same way. With ``samples`` (frames, as for
    :func:`~workbench.inspect.fit_preview`), the encoded samples join the training set and the
    last ``n_heldout`` of them (at least one) measure the fit instead. ``steps`` Adam steps of
    ``batch`` clips each, under the one-cycle schedule (:meth:`~workbench.loop.LRSchedule.one_cycle`);
    ``progress`` shows a bar. A Ctrl-C stops the distillation cleanly between two steps and raises
    :class:`~workbench.loop.Interrupted`, whose ``resume()`` finishes it and returns the preview.
    """
    identity = backbone_identity(base)
    if samples is not None:
        real = encode_samples(base, samples)
        if real.shape[0] < 2:
            raise InspectError(f"fit_preview(kind='tiny') needs at least 2 sample clips (one held out), got "
                               f"{real.shape[0]}.")
        held = min(max(1, n_heldout), real.shape[0] - 1)
        shape = tuple(real.shape[1:])
    else:
        if n_fit < 1 or n_heldout < 1:
            raise InspectError(f"fit_preview(kind='tiny') needs n_fit >= 1 and n_heldout >= 1, "
                               f"got {n_fit} and {n_heldout}.")
        shape = tuple(latent_shape) if latent_shape is not None else latent_shape_from_card(base)
        if len(shape) != 4:
            raise InspectError(f"latent_shape must be (C, T, h, w), got {shape!r}.")
    if is_pixel_space(base, shape[0]):
        raise InspectError("This backbone samples in pixel space: its latents are the frames, so there is no "
                           "decoder to distil. Use the linear preview (it is the identity here).")
    c, t, h, w = shape
    fit_z, fit_x = _training_latents(base, (c, min(t, 4), h, w), n_fit, seed, chunk_frames)
    if samples is not None:
        real_x = _decode_all(base, real, chunk_frames).float().cpu()
        real = real.detach().float().cpu()
        test_z, test_x = real[-held:], real_x[-held:]
        if real.shape[2:] == fit_z.shape[2:]:
            fit_z, fit_x = torch.cat([fit_z, real[:-held]]), torch.cat([fit_x, real_x[:-held]])
        else:
            fit_z, fit_x = real[:-held], real_x[:-held]
        source = "samples"
    else:
        test_z, test_x = _training_latents(base, (c, min(t, 4), h, w), n_heldout, seed + 1000, chunk_frames)
        source = "data-free"
    d, r, causal = latent_layout(fit_z.shape, fit_x.shape, causal_latents(base))

    # the linear preview on the same training set: the skip path, and what the distillation must beat
    if causal:
        weight_first, _ = solve_linear(fit_z[:, :, :1], fit_x[:, :, :1], d, 1)
        weight, _ = solve_linear(fit_z[:, :, 1:], fit_x[:, :, 1:], d, r)
    else:
        weight_first, (weight, _) = None, solve_linear(fit_z, fit_x, d, r)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = TinyDecoder(c, d, r, causal, width)
    count = sum(p.numel() for p in net.parameters())
    if count > MAX_PARAMETERS:
        raise InspectError(f"A tiny preview of width={width} for {c}-channel latents "
                           f"with {r * 3 * d * d}-value blocks has {count:,} parameters, "
                           f"over the {MAX_PARAMETERS:,} allowed. "
                           f"Pass a smaller width (e.g. width={max(8, width // 2)}).")
    net.init_linear(weight, weight_first)
    with torch.no_grad():
        linear_psnr = psnr(net(test_z).clamp(-1, 1), test_x, data_range=255.0)

    g = torch.Generator().manual_seed(seed)

    def loss_fn(step: int) -> torch.Tensor:
        pick = torch.randint(0, fit_z.shape[0], (min(batch, fit_z.shape[0]),), generator=g)
        return F.mse_loss(net(fit_z[pick]), fit_x[pick])

    net.train()
    loop = TrainingLoop(torch.optim.Adam(net.parameters(), lr=lr), LRSchedule.one_cycle(lr, max(1, steps)),
                        randomness=[g], name="tiny preview", progress=progress)

    def finish(losses: list[float]) -> TinyPreview:
        net.eval()
        with torch.no_grad():
            tiny_psnr = psnr(net(test_z).clamp(-1, 1), test_x, data_range=255.0)
        return TinyPreview(net=net, identity=identity, psnr=float(tiny_psnr), linear_psnr=float(linear_psnr),
                           source=source, steps=steps, n_fit=fit_z.shape[0], n_heldout=test_z.shape[0])

    return then(lambda: loop.run(loss_fn, until=steps), finish)


def fit_tiny_preview(base: BaseVideoModel, samples: Any = None, *, cache: bool = True, refit: bool = False,
                     **kwargs: Any) -> TinyPreview:
    """The tiny preview of ``base``: from memory, the disk cache, the previews shipped with workbench, or
    distilled (:func:`distil_tiny_preview`, ``kwargs`` go there). A data-free distillation is cached on disk;
    one on your frames serves this process only."""
    identity = backbone_identity(base)
    if samples is None and not refit:
        loaded = _MEMORY.get(identity) or (load_cached_tiny(identity) if cache else None)
        if loaded is not None:
            _MEMORY[identity] = loaded
            return loaded

    def remember(preview: TinyPreview) -> TinyPreview:
        if cache and preview.source == "data-free":
            save_cached_tiny(preview)
        _MEMORY[identity] = preview
        return preview

    return then(lambda: distil_tiny_preview(base, samples, **kwargs), remember)


def cached_tiny_preview(base: BaseVideoModel) -> TinyPreview | None:
    """The tiny preview of ``base`` if one is at hand (memory, disk cache, shipped); never distils."""
    identity = backbone_identity(base)
    if identity not in _MEMORY:
        loaded = load_cached_tiny(identity)
        if loaded is None:
            return None
        _MEMORY[identity] = loaded
    return _MEMORY[identity]


def tiny_preview_for(base: BaseVideoModel, latent_shape: tuple[int, ...]) -> TinyPreview:
    """The tiny preview to render ``base``'s latents of ``latent_shape = (C, T', h, w)`` with (distilled on
    first use when nothing is cached)."""
    cached = _MEMORY.get(backbone_identity(base))
    if cached is not None:
        return cached
    return fit_tiny_preview(base, latent_shape=latent_shape)


__all__ = ["TinyDecoder", "TinyPreview", "cached_tiny_preview", "clear_tiny_cache", "distil_tiny_preview",
           "fit_tiny_preview", "load_cached_tiny", "save_cached_tiny", "tiny_preview_for"]
