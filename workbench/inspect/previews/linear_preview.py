"""The linear preview: a latent → RGB map fitted by least squares against the backbone's decoder.

Decoding every step of a trajectory through a video VAE is slow and memory-hungry, so each
backbone gets a **linear preview**: every latent pixel's ``C`` channels (plus a bias) map to the
``r × d × d × 3`` block of output pixels it covers (``d``: spatial downsample, ``r``: frames per
latent frame; a causal video VAE's first latent frame maps to one frame with its own weights, see
:mod:`~workbench.inspect.previews.latent_space`). The weights are the least-squares optimum (with a small
ridge, :data:`RIDGE`) against ``base.decode`` on a handful of samples, and their quality is
measured on held-out samples: ``preview.psnr`` (dB against the full decode) next to
``preview.baseline_psnr`` (a constant predictor: the mean decoded block), which any useful
preview must beat.

Fit samples are real frames when you have them (``fit_preview(base, samples=video)`` encodes
them); otherwise data-free latents: standard normal, half white and half spatially smooth, the
scale of the sampler's own noise (and of clean latents under a normalised VAE). Data-free fits
cover noisy ``x_t`` well; pass real frames for the sharpest clean-frame previews.

Data-free fits are cached per backbone identity (:mod:`~workbench.inspect.previews.preview_cache`), so
the second fit of the same backbone does not decode anything. A fit on your own frames is used by
this process's views but never written there, so what a preview shows never depends on which
frames some earlier process happened to fit. Pixel-space backbones (3-channel "latents" and no
VAE in the card, or ``pixel_space = True`` on a backbone declaring
:class:`~workbench.core.capabilities.Previews`) preview as the identity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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
from workbench.inspect.previews.preview_cache import backbone_identity, cache_dir, read_files, write_files
from workbench.metrics import psnr, unit_to_uint8

PREVIEW_VERSION = 1

_MEMORY: dict[str, LatentPreview] = {}


def clear_linear_cache() -> None:
    """Forget the linear previews held in memory."""
    _MEMORY.clear()


@dataclass
class LatentPreview:
    """A fitted linear latent → RGB map; call it on latents ``(B, C, T', h, w)``.

    ``weight``: ``(C + 1, r * 3 * d * d)`` float32 (last row: the bias); ``weight_first``: the
    first latent frame's map ``(C + 1, 3 * d * d)`` for causal video VAEs (``T = 1 + r (T' - 1)``),
    else ``None``. ``psnr`` / ``baseline_psnr``: held-out fit quality in dB (see the module doc).
    ``source``: ``"samples"`` (encoded real frames), ``"data-free"`` or ``"identity"``.
    """

    weight: torch.Tensor
    channels: int
    downsample: int
    frames_per_latent: int
    psnr: float
    baseline_psnr: float
    identity: str
    source: str
    weight_first: torch.Tensor | None = None
    n_fit: int = 0
    n_heldout: int = 0
    _on_device: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def causal(self) -> bool:
        return self.weight_first is not None

    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``(B, C, T', h, w)`` → video ``(B, 3, T, h d, w d)`` in [-1, 1], on the latents' device."""
        if latents.ndim != 5 or latents.shape[1] != self.channels:
            raise InspectError(
                f"This preview maps {self.channels}-channel latents (B, C, T, h, w); got shape "
                f"{tuple(latents.shape)}. Fit one for this backbone with fit_preview(base)."
            )
        z = latents.float()
        if self.weight_first is None:
            video = self._apply(z, self.weight, self.frames_per_latent)
        else:
            first = self._apply(z[:, :, :1], self.weight_first, 1)
            rest = self._apply(z[:, :, 1:], self.weight, self.frames_per_latent)
            video = torch.cat([first, rest], dim=2)
        return video.clamp(-1, 1)

    def uint8_frames(self, latents: torch.Tensor) -> torch.Tensor | None:
        """Latents ``(B, C, T', h, w)`` → uint8 frames ``(B, T, H, W, 3)``, exactly
        ``to_uint8_video(self(latents))`` (on the latents' device), or ``None`` where that would raise
        (a non-finite value: the caller's conversion says which).

        What a live view draws at every step: the pixels are made on the preview's blocks as the
        matrix product lays them out, so the one reordering copy moves bytes, not floats.
        """
        if latents.ndim != 5 or latents.shape[1] != self.channels:
            return None
        z = latents.float()
        if self.weight_first is None:
            return self._pixels(z, self.weight, self.frames_per_latent)
        first = self._pixels(z[:, :, :1], self.weight_first, 1)
        rest = self._pixels(z[:, :, 1:], self.weight, self.frames_per_latent)
        return None if first is None or rest is None else torch.cat([first, rest], dim=1)

    def _pixels(self, z: torch.Tensor, weight: torch.Tensor, r: int) -> torch.Tensor | None:
        b, c, t, h, w = z.shape
        d = self.downsample
        key = (id(weight), "rgb last")
        if key not in self._on_device:  # the same columns, each block's pixels in (r, d, d, 3) order
            self._on_device[key] = weight.view(c + 1, r, 3, d, d).permute(0, 1, 3, 4, 2).reshape(c + 1, -1)
        blocks = self._blocks(z, self._on_device[key]).clamp_(-1, 1)  # (B T h w, r d d 3), as __call__ clamps
        if not bool(torch.isfinite(blocks.sum())):
            return None
        pixels = unit_to_uint8(blocks)  # to_uint8_video's arithmetic, element by element (so in any layout)
        # (B, T', r, h, d, w, d, 3)
        pixels = pixels.view(b, t, h, w, r, d, d, 3).permute(0, 1, 4, 2, 5, 3, 6, 7)
        return pixels.reshape(b, t * r, h * d, w * d, 3)  # (the copy moves runs of d * 3 bytes)

    def linear(self, latents: torch.Tensor) -> torch.Tensor:
        """The linear part alone (no bias, no clipping): latents ``(B, C, T', h, w)`` → ``(B, 3, T, H, W)``.

        What a latent *difference* or correction looks like in pixels: ``preview(a) - preview(b)
        == preview.linear(a - b)`` wherever neither side is clipped.
        """
        if latents.ndim != 5 or latents.shape[1] != self.channels:
            raise InspectError(
                f"This preview maps {self.channels}-channel latents (B, C, T, h, w); got shape "
                f"{tuple(latents.shape)}. Fit one for this backbone with fit_preview(base)."
            )
        if "linear" not in self._on_device:  # the weights with a zero bias row, built once
            def unbiased(w: torch.Tensor) -> torch.Tensor:
                return torch.cat([w[:-1], torch.zeros_like(w[-1:])])

            self._on_device["linear"] = (unbiased(self.weight),
                                         None if self.weight_first is None else unbiased(self.weight_first))
        weight, weight_first = self._on_device["linear"]
        z = latents.float()
        if weight_first is None:
            return self._apply(z, weight, self.frames_per_latent)
        first = self._apply(z[:, :, :1], weight_first, 1)
        return torch.cat([first, self._apply(z[:, :, 1:], weight, self.frames_per_latent)], dim=2)

    def _blocks(self, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Each latent pixel's block of output pixels: ``(B T h w, r 3 d d)``."""
        c = z.shape[1]
        key = (id(weight), z.device)
        if key not in self._on_device:  # one host-to-device copy per device, not per call
            self._on_device[key] = weight.to(z.device)
        weight = self._on_device[key]
        flat = z.permute(0, 2, 3, 4, 1).reshape(-1, c)  # (B T h w, C)
        return torch.addmm(weight[c], flat, weight[:c])

    def _apply(self, z: torch.Tensor, weight: torch.Tensor, r: int) -> torch.Tensor:
        b, c, t, h, w = z.shape
        d = self.downsample
        blocks = self._blocks(z, weight).view(b, t, h, w, r, 3, d, d)
        return blocks.permute(0, 5, 1, 4, 2, 6, 3, 7).reshape(b, 3, t * r, h * d, w * d)

    def meta(self) -> dict[str, Any]:
        return {"version": PREVIEW_VERSION, "identity": self.identity, "channels": self.channels,
                "downsample": self.downsample, "frames_per_latent": self.frames_per_latent,
                "causal": self.causal, "psnr": self.psnr, "baseline_psnr": self.baseline_psnr,
                "source": self.source, "n_fit": self.n_fit, "n_heldout": self.n_heldout}

    def __repr__(self) -> str:
        return (f"LatentPreview({self.source}, C={self.channels}, d={self.downsample}, "
                f"r={self.frames_per_latent}"
                f"{', causal' if self.causal else ''}: {self.psnr:.1f} dB held-out vs full decode, "
                f"constant baseline {self.baseline_psnr:.1f} dB)")


# -- disk cache ----------------------------------------------------------------------------
def _paths(identity: str) -> tuple[Path, Path]:
    folder = cache_dir()
    return folder / f"{identity}.safetensors", folder / f"{identity}.json"


def load_cached_linear(identity: str) -> LatentPreview | None:
    """The preview cached on disk for ``identity``, or ``None`` when there is none."""
    found = read_files(*_paths(identity), "preview", "fit_preview(base, refit=True) to fit it again")
    if found is None:
        return None
    meta, tensors = found
    if meta.get("version") != PREVIEW_VERSION:
        return None
    return LatentPreview(weight=tensors["weight"], weight_first=tensors.get("weight_first"),
                         channels=meta["channels"], downsample=meta["downsample"],
                         frames_per_latent=meta["frames_per_latent"], psnr=float(meta["psnr"]),
                         baseline_psnr=float(meta["baseline_psnr"]), identity=identity, source=meta["source"],
                         n_fit=meta.get("n_fit", 0), n_heldout=meta.get("n_heldout", 0))


def save_cached_linear(preview: LatentPreview) -> Path:
    """Write ``preview`` to the disk cache (atomically) and return the safetensors path."""
    tensors = {"weight": preview.weight.contiguous()}
    if preview.weight_first is not None:
        tensors["weight_first"] = preview.weight_first.contiguous()
    return write_files(*_paths(preview.identity), tensors, preview.meta())


# -- fitting -------------------------------------------------------------------------------
def identity_preview(channels: int = 3) -> LatentPreview:
    """The preview of a pixel-space backbone: the latents are the frames."""
    weight = torch.cat([torch.eye(3), torch.zeros(1, 3)])
    return LatentPreview(weight=weight, channels=channels, downsample=1, frames_per_latent=1, psnr=math.inf,
                         baseline_psnr=-math.inf, identity="identity", source="identity")


def _blocks(video: torch.Tensor, d: int, r: int) -> torch.Tensor:
    """Video ``(N, 3, T' r, h d, w d)`` → per-latent-pixel blocks ``(N T' h w, r 3 d d)``."""
    n, _, t, hh, ww = video.shape
    lt, h, w = t // r, hh // d, ww // d
    v = video.reshape(n, 3, lt, r, h, d, w, d).permute(0, 2, 4, 6, 3, 1, 5, 7)
    return v.reshape(n * lt * h * w, r * 3 * d * d)


def _design(z: torch.Tensor) -> torch.Tensor:
    flat = z.permute(0, 2, 3, 4, 1).reshape(-1, z.shape[1]).double()
    return torch.cat([flat, torch.ones(flat.shape[0], 1, dtype=flat.dtype)], dim=1)  # (M, C + 1)


RIDGE = 1e-4
"""Ridge on the channel weights, relative to the mean latent energy: keeps a fit on few, similar
samples (e.g. a first frame seen in six clips, for 49 unknowns) from blowing its weights up to
fit the noise, and changes a well-posed fit by a negligible amount."""


def solve_linear(z: torch.Tensor, video: torch.Tensor, d: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge least-squares weights ``(C + 1, r 3 d d)`` and the mean block (the constant baseline)."""
    targets = _blocks(video.double(), d, r)
    x = _design(z)  # (M, C + 1), the last column the bias
    gram = x.T @ x
    penalty = torch.zeros_like(gram)
    channels = torch.arange(x.shape[1] - 1)
    # the bias is not shrunk
    penalty[channels, channels] = RIDGE * gram.diagonal()[:-1].mean().clamp_min(1e-12)
    weight = torch.linalg.solve(gram + penalty, x.T @ targets)
    return weight.float(), targets.mean(dim=0).float()


def fit_linear_preview(base: BaseVideoModel, samples: Any = None, *,
                       latent_shape: tuple[int, ...] | None = None, n_fit: int = 8, n_heldout: int = 4,
                       seed: int = 0, cache: bool = True, refit: bool = False,
                       chunk_frames: int | None = DEFAULT_CHUNK_FRAMES) -> LatentPreview:
    """Fit (or load) the linear preview of ``base``; :func:`~workbench.inspect.fit_preview` with
    ``kind="linear"`` (the default) calls this, and documents the arguments."""
    identity = backbone_identity(base)
    if samples is None and cache and not refit:
        loaded = _MEMORY.get(identity) or load_cached_linear(identity)
        if loaded is not None:
            _MEMORY[identity] = loaded
            return loaded
    if samples is not None:
        z = encode_samples(base, samples)
        if z.shape[0] < 2:
            raise InspectError(f"fit_preview needs at least 2 sample clips (one held out), got {z.shape[0]}.")
        held = min(max(1, n_heldout), z.shape[0] - 1)
        source = "samples"
    else:
        if n_fit < 1 or n_heldout < 1:
            raise InspectError(f"fit_preview needs n_fit >= 1 and n_heldout >= 1, "
                               f"got {n_fit} and {n_heldout}.")
        shape = tuple(latent_shape) if latent_shape is not None else latent_shape_from_card(base)
        if len(shape) != 4:
            raise InspectError(f"latent_shape must be (C, T, h, w), got {shape!r}.")
        c, t, h, w = shape
        if is_pixel_space(base, c):
            return identity_preview(c)
        z = data_free_latents(c, min(t, 4), h, w, n_fit + n_heldout, seed, device=base.device,
                              dtype=base.dtype)
        held = n_heldout
        source = "data-free"
    if is_pixel_space(base, z.shape[1]):
        return identity_preview(z.shape[1])
    video = torch.cat([decode_chunked(base, z[i:i + 1], chunk_frames) for i in range(z.shape[0])])
    z, video = z.detach().float().cpu(), video.detach().float().cpu()
    d, r, causal = latent_layout(z.shape, video.shape, causal_latents(base))
    fit_z, fit_x, test_z, test_x = z[:-held], video[:-held], z[-held:], video[-held:]
    if causal:
        weight_first, mean_first = solve_linear(fit_z[:, :, :1], fit_x[:, :, :1], d, 1)
        weight, mean = solve_linear(fit_z[:, :, 1:], fit_x[:, :, 1:], d, r)
    else:
        weight_first, mean_first = None, None
        weight, mean = solve_linear(fit_z, fit_x, d, r)
    preview = LatentPreview(weight=weight, weight_first=weight_first, channels=z.shape[1], downsample=d,
                            frames_per_latent=r, psnr=0.0, baseline_psnr=0.0, identity=identity,
                            source=source, n_fit=fit_z.shape[0], n_heldout=held)
    constant = LatentPreview(weight=torch.cat([torch.zeros(z.shape[1], mean.numel()), mean[None]]),
                             weight_first=None if mean_first is None else
                             torch.cat([torch.zeros(z.shape[1], mean_first.numel()), mean_first[None]]),
                             channels=z.shape[1], downsample=d, frames_per_latent=r, psnr=0.0,
                             baseline_psnr=0.0, identity="constant", source=source)
    preview.psnr = psnr(preview(test_z), test_x, data_range=255.0)
    preview.baseline_psnr = psnr(constant(test_z), test_x, data_range=255.0)
    if cache and source == "data-free":  # a fit on your frames serves this process only: not written to disk
        save_cached_linear(preview)
    _MEMORY[identity] = preview
    return preview


def preview_for(base: BaseVideoModel, latent_shape: tuple[int, ...]) -> LatentPreview:
    """The preview to render ``base``'s latents of ``latent_shape = (C, T', h, w)`` with: memory, disk, or
    a fit."""
    if is_pixel_space(base, latent_shape[0]):
        return identity_preview(latent_shape[0])
    cached = _MEMORY.get(backbone_identity(base))
    if cached is not None:
        return cached
    return fit_linear_preview(base, latent_shape=latent_shape)
