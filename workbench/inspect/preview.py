"""Latent previews: a linear latent → RGB map fitted by least squares against the backbone's decoder.

Decoding every step of a trajectory through a video VAE is slow and memory-hungry, so each
backbone gets a **linear preview**: every latent pixel's ``C`` channels (plus a bias) map to the
``r × d × d × 3`` block of output pixels it covers (``d``: spatial downsample, ``r``: frames per
latent frame; a causal video VAE's first latent frame maps to one frame with its own weights).
The weights are the least-squares optimum (with a small ridge, :data:`RIDGE`) against
``base.decode`` on a handful of samples, and their quality is measured on held-out samples: ``preview.psnr`` (dB
against the full decode) next to ``preview.baseline_psnr`` (a constant predictor: the mean
decoded block), which any useful preview must beat.

Fit samples are real frames when you have them (``fit_preview(base, samples=video)`` encodes
them); otherwise data-free latents: standard normal, half white and half spatially smooth, the
scale of the sampler's own noise (and of clean latents under a normalised VAE). Data-free fits
cover noisy ``x_t`` well; pass real frames for the sharpest clean-frame previews.

A backbone whose VAE is causal in time (``T = 1 + r (T' - 1)``) says so with
``causal_latents = True``; otherwise the layout is read off the decoded length, which cannot
tell the two apart when both fit (3 latent frames decoding to 9 frames).

Data-free fits are cached per backbone identity (a hash of the decoder's weights and the config)
in ``$WORKBENCH_CACHE/previews`` (default ``~/.cache/workbench``) as safetensors + JSON, so the
second fit of the same backbone does not decode anything. A fit on your own frames is used by
this process's views but never written there, so what a preview shows never depends on which
frames some earlier process happened to fit. Pixel-space backbones (3-channel
"latents" and no VAE in the card, or ``pixel_space = True`` on the backbone) preview as the
identity. ``decode="full"`` decodes chunked along time (``chunk_frames`` latent frames per call),
exact for per-frame decoders such as tiny_video's; a backbone with ``causal_latents = True`` is
always decoded whole, since a causal video VAE carries state from frame to frame.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.core.backbone import BaseVideoModel
from workbench.core.conditions import Batch
from workbench.inspect.common import InspectError
from workbench.metrics import psnr

PREVIEW_VERSION = 1
DECODES = ("preview", "tiny", "full")
"""How latents become pictures: the linear preview, the distilled tiny preview
(:mod:`workbench.inspect.tiny_preview`), or the backbone's full decoder."""
PREVIEW_KINDS = ("linear", "tiny")
DEFAULT_CHUNK_FRAMES = 8

_IDENTITIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MEMORY: dict[str, LatentPreview] = {}


def cache_dir() -> Path:
    """Where fitted previews are kept: ``$WORKBENCH_CACHE/previews`` (default ``~/.cache/workbench``)."""
    root = os.environ.get("WORKBENCH_CACHE") or "~/.cache/workbench"
    return Path(root).expanduser() / "previews"


def clear_preview_cache(disk: bool = False) -> None:
    """Forget the previews held in memory (and, with ``disk=True``, delete the cached files)."""
    from workbench.inspect.tiny_preview import clear_tiny_cache

    _MEMORY.clear()
    _IDENTITIES.clear()
    clear_tiny_cache()
    if disk and cache_dir().exists():
        for path in cache_dir().glob("*"):
            if path.suffix in (".safetensors", ".json"):  # linear and tiny previews
                path.unlink()


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

    def _apply(self, z: torch.Tensor, weight: torch.Tensor, r: int) -> torch.Tensor:
        b, c, t, h, w = z.shape
        d = self.downsample
        key = (id(weight), z.device)
        if key not in self._on_device:  # one host-to-device copy per device, not per call
            self._on_device[key] = weight.to(z.device)
        weight = self._on_device[key]
        flat = z.permute(0, 2, 3, 4, 1).reshape(-1, c)  # (B T h w, C)
        blocks = torch.addmm(weight[c], flat, weight[:c])  # (B T h w, r 3 d d)
        blocks = blocks.view(b, t, h, w, r, 3, d, d)
        return blocks.permute(0, 5, 1, 4, 2, 6, 3, 7).reshape(b, 3, t * r, h * d, w * d)

    def meta(self) -> dict[str, Any]:
        return {"version": PREVIEW_VERSION, "identity": self.identity, "channels": self.channels,
                "downsample": self.downsample, "frames_per_latent": self.frames_per_latent,
                "causal": self.causal, "psnr": self.psnr, "baseline_psnr": self.baseline_psnr,
                "source": self.source, "n_fit": self.n_fit, "n_heldout": self.n_heldout}

    def __repr__(self) -> str:
        return (f"LatentPreview({self.source}, C={self.channels}, d={self.downsample}, r={self.frames_per_latent}"
                f"{', causal' if self.causal else ''}: {self.psnr:.1f} dB held-out vs full decode, "
                f"constant baseline {self.baseline_psnr:.1f} dB)")


# -- identity and disk cache ---------------------------------------------------------------
def backbone_identity(base: BaseVideoModel) -> str:
    """A hash of what the decoder computes: its weights, the base's own buffers, and the config.

    The decoder is the first of the submodules ``vae`` / ``autoencoder`` / ``first_stage_model``
    / ``decoder`` that exists (else the whole state dict is hashed). A backbone may define
    ``preview_identity() -> str`` instead (e.g. its VAE checkpoint's hash) to skip hashing.
    Computed once per backbone object: the base is frozen.
    """
    custom = None if base.preview_identity is None else base.preview_identity()
    if custom is not None:
        return str(custom)
    if base in _IDENTITIES:
        return _IDENTITIES[base]
    h = hashlib.sha256()
    h.update(f"{type(base).__module__}.{type(base).__qualname__}".encode())
    config = getattr(base, "config", None)
    if dataclasses.is_dataclass(config):
        # where the weights came from and where they run do not change what the decoder computes
        fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("weights", "device", "dtype")}
        h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    decoder = next((m for n in base.decoder_modules if isinstance(m := getattr(base, n, None), nn.Module)), None)
    if decoder is None:
        tensors = base.state_dict()
    else:
        tensors = dict(decoder.state_dict())
        tensors.update({f"@{k}": v for k, v in base.named_buffers(recurse=False)})
        tensors.update({f"@{k}": v for k, v in base.named_parameters(recurse=False)})
    for name in sorted(tensors):
        value = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        h.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    identity = h.hexdigest()[:24]
    _IDENTITIES[base] = identity
    return identity


def _paths(identity: str) -> tuple[Path, Path]:
    folder = cache_dir()
    return folder / f"{identity}.safetensors", folder / f"{identity}.json"


def read_files(weights: Path, meta_path: Path, what: str, refit: str) -> tuple[dict, dict] | None:
    """``(meta, tensors)`` of a cached preview's two files; ``None`` when either is missing.

    An unreadable pair is an error naming the file and the fix (``refit``: the call that remakes it).
    """
    from safetensors.torch import load_file

    if not (weights.exists() and meta_path.exists()):
        return None
    try:
        return json.loads(meta_path.read_text()), load_file(str(weights))
    except Exception as err:  # safetensors / json raise their own types for corrupt files
        raise InspectError(
            f"The cached {what} {weights} is unreadable ({err}). Delete it (and {meta_path.name}) or call {refit}."
        ) from err


def write_files(weights: Path, meta_path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write a preview's weights and metadata atomically (each file renamed into place); returns ``weights``."""
    from safetensors.torch import save_file

    weights.parent.mkdir(parents=True, exist_ok=True)
    tmp_w, tmp_m = weights.with_suffix(".safetensors.tmp"), meta_path.with_suffix(".json.tmp")
    save_file(tensors, str(tmp_w), metadata={"workbench": json.dumps(meta)})
    tmp_m.write_text(json.dumps(meta, indent=1))
    os.replace(tmp_w, weights)
    os.replace(tmp_m, meta_path)
    return weights


def load_cached(identity: str) -> LatentPreview | None:
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


def save_cached(preview: LatentPreview) -> Path:
    """Write ``preview`` to the disk cache (atomically) and return the safetensors path."""
    tensors = {"weight": preview.weight.contiguous()}
    if preview.weight_first is not None:
        tensors["weight_first"] = preview.weight_first.contiguous()
    return write_files(*_paths(preview.identity), tensors, preview.meta())


# -- fitting -------------------------------------------------------------------------------
def is_pixel_space(base: BaseVideoModel, channels: int | None = None) -> bool:
    """True when the backbone samples in pixel space (its "latents" are the video)."""
    if base.pixel_space is not None:
        return bool(base.pixel_space)
    card = getattr(base, "card", None)
    has_vae = card is not None and any(c.kind == "vae" for c in card.components.values())
    return not has_vae and channels == 3


def identity_preview(channels: int = 3) -> LatentPreview:
    """The preview of a pixel-space backbone: the latents are the frames."""
    weight = torch.cat([torch.eye(3), torch.zeros(1, 3)])
    return LatentPreview(weight=weight, channels=channels, downsample=1, frames_per_latent=1, psnr=math.inf,
                         baseline_psnr=-math.inf, identity="identity", source="identity")


def decode_chunked(base: BaseVideoModel, latents: torch.Tensor, chunk_frames: int | None = DEFAULT_CHUNK_FRAMES,
                   ) -> torch.Tensor:
    """``base.decode`` in chunks of ``chunk_frames`` latent frames (``None``: all at once), under no_grad.

    Bounds the decoder's memory by the chunk; exact for per-frame decoders. A backbone that
    declares ``causal_latents = True`` is decoded whole whatever ``chunk_frames`` says: its VAE
    carries state from frame to frame and decodes the first latent frame of every call to a
    single frame, so pieces would restart it (wrong frames, and too few of them).
    """
    if chunk_frames is not None and (isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int)
                                     or chunk_frames < 1):
        raise InspectError(f"chunk_frames must be a positive int or None, got {chunk_frames!r}.")
    t = latents.shape[2]
    step = t if chunk_frames is None or base.causal_latents else chunk_frames
    with torch.no_grad():
        parts = [base.decode(latents[:, :, s:s + step]) for s in range(0, t, step)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def latent_layout(z_shape: torch.Size, x_shape: torch.Size, causal: bool | None = None) -> tuple[int, int, bool]:
    """``(d, r, causal)`` relating latents ``(N, C, T', h, w)`` to decoded video ``(N, 3, T, H, W)``
    (``causal``: see :func:`time_layout`)."""
    _, _, lt, lh, lw = z_shape
    _, xc, xt, xh, xw = x_shape
    if xc != 3:
        raise InspectError(
            f"base.decode returned {xc} channels (shape {tuple(x_shape)}); a preview fits RGB video "
            f"(B, 3, T, H, W). Give the backbone a decoder to RGB, or set pixel_space = True if its samples are frames."
        )
    if xh % lh or xw % lw or xh // lh != xw // lw:
        raise InspectError(
            f"The linear preview needs one integer spatial downsample: latents {lh}x{lw} decode to {xh}x{xw}. "
            f"Use decode='full' for this backbone."
        )
    return (xh // lh, *time_layout(lt, xt, causal))


def time_layout(latent_frames: int, frames: int, causal: bool | None = None) -> tuple[int, bool]:
    """``(r, causal)``: ``frames`` video frames over ``latent_frames``, ``r`` per latent frame, or
    (causal VAE) frame 0 alone and then ``r`` per later latent frame.

    ``causal``: what the backbone declares (``causal_latents``); ``None`` infers it, preferring
    ``r`` frames per latent frame when both readings fit (3 latent frames → 9 frames).
    """
    if frames % latent_frames == 0 and not causal:
        return frames // latent_frames, False
    if latent_frames > 1 and (frames - 1) % (latent_frames - 1) == 0:
        return (frames - 1) // (latent_frames - 1), True
    raise InspectError(
        f"{latent_frames} latent frames decode to {frames} frames, which is neither r per latent frame nor 1 + r "
        f"per later frame (a causal VAE); the linear preview cannot lay that out. Use decode='full'."
    )


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
    penalty[channels, channels] = RIDGE * gram.diagonal()[:-1].mean().clamp_min(1e-12)  # the bias is not shrunk
    weight = torch.linalg.solve(gram + penalty, x.T @ targets)
    return weight.float(), targets.mean(dim=0).float()


def data_free_latents(channels: int, frames: int, height: int, width: int, count: int, seed: int = 0,
                      device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``count`` standard-normal latent clips ``(N, C, T', h, w)``: even ones white, odd ones smooth.

    The smooth ones are white noise on a grid 4x coarser, upsampled bilinearly and rescaled to
    unit variance per channel, so the fit sees both the frequencies of ``x_t`` and of clean latents.
    """
    g = torch.Generator().manual_seed(seed)
    white = torch.randn(count, channels, frames, height, width, generator=g)
    coarse = torch.randn(count * frames, channels, max(1, height // 4), max(1, width // 4), generator=g)
    smooth = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    smooth = smooth.view(count, frames, channels, height, width).permute(0, 2, 1, 3, 4)
    axes = (2, 3, 4)
    smooth = (smooth - smooth.mean(dim=axes, keepdim=True)) / smooth.std(dim=axes, keepdim=True).clamp_min(1e-6)
    odd = (torch.arange(count) % 2 == 1).view(-1, 1, 1, 1, 1)
    return torch.where(odd, smooth, white).to(device=device, dtype=dtype)


def latent_shape_from_card(base: BaseVideoModel) -> tuple[int, ...]:
    s = base.card.sampling
    if not (s.height and s.width):
        raise InspectError(
            f"fit_preview({type(base).__name__}) without samples needs latent_shape=(C, T, h, w): the card "
            f"gives no resolution to derive it from."
        )
    video = torch.zeros(1, 3, min(s.num_frames or 1, 5), s.height, s.width, device=base.device, dtype=base.dtype)
    with torch.no_grad():
        return tuple(base.encode(video).shape[1:])


def encode_samples(base: BaseVideoModel, samples: Any) -> torch.Tensor:
    if isinstance(samples, (Mapping, Batch)):
        return base.prepare_batch(samples).latents
    video = torch.as_tensor(samples)
    if video.dtype == torch.uint8 and video.ndim == 5 and video.shape[-1] == 3:
        video = video.permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    if video.ndim != 5 or video.shape[1] != 3:
        raise InspectError(
            f"fit_preview samples must be video (N, 3, T, H, W) in [-1, 1], uint8 (N, T, H, W, 3), or a raw batch "
            f"for prepare_batch; got shape {tuple(video.shape)} {video.dtype}."
        )
    with torch.no_grad():
        return base.encode(video.to(device=base.device, dtype=base.dtype))


def fit_preview(base: BaseVideoModel, samples: Any = None, *, kind: str = "linear",
                latent_shape: tuple[int, ...] | None = None, n_fit: int | None = None, n_heldout: int = 4,
                seed: int = 0, cache: bool = True, refit: bool = False,
                chunk_frames: int | None = DEFAULT_CHUNK_FRAMES, **distil: Any) -> LatentPreview | Any:
    """Fit (or load) the linear preview of ``base``, or with ``kind="tiny"`` distil (or load) its tiny preview.

    ``kind="tiny"``: a small convolutional decoder distilled from ``base.decode``
    (:class:`~workbench.inspect.tiny_preview.TinyPreview`, see that module); ``n_fit`` defaults to
    24 clips there, and ``distil`` takes its training settings (``steps``, ``width``, ``batch``, ``lr``).

    ``samples``: real frames to encode — video ``(N, 3, T, H, W)`` in [-1, 1], uint8
    ``(N, T, H, W, 3)`` or a raw batch; the last ``n_heldout`` clips (at least one) measure the
    fit, the rest fit it. Without samples, ``n_fit + n_heldout`` data-free latent clips of
    ``latent_shape = (C, T', h, w)`` are used (default: the card's resolution, at most 4 latent
    frames). With ``cache``, a preview already on disk for this backbone is loaded instead of
    fitted when no samples are given (``refit=True`` fits anyway), and a data-free fit is saved; a
    fit on samples is kept in memory for this process's views only.

    >>> preview = fit_preview(TinyVideo())
    >>> video = preview(latents)            # (B, 3, T, H, W) in [-1, 1]
    >>> preview.psnr, preview.baseline_psnr  # held-out dB against base.decode
    >>> tiny = fit_preview(TinyVideo(), kind="tiny")
    >>> tiny.psnr, tiny.linear_psnr          # held-out dB, distilled vs linear
    """
    if kind not in PREVIEW_KINDS:
        raise InspectError(f"fit_preview(kind={kind!r}): unknown preview kind. Allowed: {', '.join(PREVIEW_KINDS)} "
                           f"('linear': least-squares per latent pixel; 'tiny': a distilled convolutional decoder).")
    if kind == "tiny":
        from workbench.inspect.tiny_preview import fit_tiny_preview

        return fit_tiny_preview(base, samples, latent_shape=latent_shape, n_fit=24 if n_fit is None else n_fit,
                                n_heldout=n_heldout, seed=seed, cache=cache, refit=refit, chunk_frames=chunk_frames,
                                **distil)
    if distil:
        raise InspectError(f"fit_preview(kind='linear') takes no distillation settings; got {sorted(distil)}. "
                           f"They apply to kind='tiny'.")
    n_fit = 8 if n_fit is None else n_fit
    identity = backbone_identity(base)
    if samples is None and cache and not refit:
        loaded = _MEMORY.get(identity) or load_cached(identity)
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
            raise InspectError(f"fit_preview needs n_fit >= 1 and n_heldout >= 1, got {n_fit} and {n_heldout}.")
        shape = tuple(latent_shape) if latent_shape is not None else latent_shape_from_card(base)
        if len(shape) != 4:
            raise InspectError(f"latent_shape must be (C, T, h, w), got {shape!r}.")
        c, t, h, w = shape
        if is_pixel_space(base, c):
            return identity_preview(c)
        z = data_free_latents(c, min(t, 4), h, w, n_fit + n_heldout, seed, device=base.device, dtype=base.dtype)
        held = n_heldout
        source = "data-free"
    if is_pixel_space(base, z.shape[1]):
        return identity_preview(z.shape[1])
    video = torch.cat([decode_chunked(base, z[i:i + 1], chunk_frames) for i in range(z.shape[0])])
    z, video = z.detach().float().cpu(), video.detach().float().cpu()
    d, r, causal = latent_layout(z.shape, video.shape, base.causal_latents)
    fit_z, fit_x, test_z, test_x = z[:-held], video[:-held], z[-held:], video[-held:]
    if causal:
        weight_first, mean_first = solve_linear(fit_z[:, :, :1], fit_x[:, :, :1], d, 1)
        weight, mean = solve_linear(fit_z[:, :, 1:], fit_x[:, :, 1:], d, r)
    else:
        weight_first, mean_first = None, None
        weight, mean = solve_linear(fit_z, fit_x, d, r)
    preview = LatentPreview(weight=weight, weight_first=weight_first, channels=z.shape[1], downsample=d,
                            frames_per_latent=r, psnr=0.0, baseline_psnr=0.0, identity=identity, source=source,
                            n_fit=fit_z.shape[0], n_heldout=held)
    constant = LatentPreview(weight=torch.cat([torch.zeros(z.shape[1], mean.numel()), mean[None]]),
                             weight_first=None if mean_first is None else
                             torch.cat([torch.zeros(z.shape[1], mean_first.numel()), mean_first[None]]),
                             channels=z.shape[1], downsample=d, frames_per_latent=r, psnr=0.0, baseline_psnr=0.0,
                             identity="constant", source=source)
    preview.psnr = psnr(preview(test_z), test_x, data_range=255.0)
    preview.baseline_psnr = psnr(constant(test_z), test_x, data_range=255.0)
    if cache and source == "data-free":  # a fit on your frames serves this process only: not written to disk
        save_cached(preview)
    _MEMORY[identity] = preview
    return preview


def preview_for(base: BaseVideoModel, latent_shape: tuple[int, ...]) -> LatentPreview:
    """The preview to render ``base``'s latents of ``latent_shape = (C, T', h, w)`` with: memory, disk, or a fit."""
    if is_pixel_space(base, latent_shape[0]):
        return identity_preview(latent_shape[0])
    cached = _MEMORY.get(backbone_identity(base))
    if cached is not None:
        return cached
    return fit_preview(base, latent_shape=latent_shape)
