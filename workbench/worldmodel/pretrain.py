"""``workbench pretrain``: train the embedded ``tiny_video`` backbone on videos: Meta-World clips, or yours.

The backbone is pretrained as an **image-to-video** model *without actions*: from the first
frame it must predict a plausible future, but it cannot know which way the arm will go. That
is exactly the gap an action adapter closes (``workbench demo``). The shipped weights know
Meta-World only; ``workbench pretrain --data DIR`` pretrains one on a LeRobot dataset (e.g. your
videos, written by ``workbench data import``), whose episodes may differ in length.

Two stages, like the real latent video models:

1. the per-frame autoencoder (64×64×3 ↔ 16×16×4) learns to reconstruct single frames
   (random crops: it is fully convolutional, so crops cost a quarter of a frame and teach it
   the same thing); the latent normalisation (per-channel mean / std) is measured afterwards;
2. every episode is encoded once, and the (2+1)-D U-Net denoiser learns flow matching on
   random windows of those latents, conditioned on the window's first frame, with an
   exponential moving average (EMA) of its weights that is what ships.

The validation loss on the card is :func:`validation_loss` on the shipped sample's
validation episodes: a fixed noise draw and a fixed noise level per clip, so anyone can
recompute it from the weights alone:

```python
from workbench.worldmodel.pretrain import validation_loss
from workbench.backbones.tiny_video import TinyVideo
base = TinyVideo.from_pretrained()
validation_loss(base, **base.provenance["validation"])   # == base.card.recipe.val_loss
```

Reproduce the shipped weights (about 50 minutes on 2 CPU cores):

```bash
workbench data metaworld --tasks reach-v3,push-v3,pick-place-v3,door-open-v3,drawer-close-v3,\\
    button-press-topdown-v3 --episodes 480 --frames 64 --size 64 --seed 1 --action-repeat 2 \\
    --out data/metaworld_pretrain.h5
workbench pretrain --data data/metaworld_pretrain.h5 --out tiny_video.safetensors
```
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.config import check
from workbench.core.objectives import masked_mse
from workbench.errors import DataError
from workbench.loop import LRSchedule, TrainingLoop, then


@dataclasses.dataclass
class PretrainConfig:
    """Settings of a pretraining run (``workbench pretrain --help`` lists them as flags).

    Attributes:
        data: An HDF5 file from ``workbench data metaworld`` (or ``"sample"``) or a LeRobot dataset
            directory, all of whose episodes are used for training.
        out: The weights file written (safetensors).
        val_data: The data whose ``val`` split gives the card's validation loss (default: the shipped
            sample for a Meta-World file, so the number is reproducible anywhere; the data itself for a
            LeRobot dataset).
        size: The frames' side in pixels (a LeRobot dataset's frames are resized to it; default: as
            stored, which must be square).
        camera: A LeRobot dataset's video feature (needed when it has several).
        window: Frames per training clip.
        ae_steps: Optimizer steps of the first stage, the autoencoder.
        ae_batch_size: Frames per autoencoder step.
        ae_crop: The side of the random crops the autoencoder trains on, a multiple of 8.
        ae_learning_rate: The autoencoder's learning rate.
        steps: Optimizer steps of the second stage, the denoiser.
        batch_size: Clips per denoiser step.
        learning_rate: The denoiser's learning rate.
        warmup: Learning-rate warmup steps of each stage.
        ema: The decay of the denoiser's weight average, in [0, 1) (the saved weights are the average).
        seed: The seed of the run.
        arch: Overrides of :class:`TinyVideoConfig` (whose defaults are the shipped architecture).

    Raises:
        ConfigError: When a value is out of range; the message names the field.
    """

    data: str
    out: str = "outputs/pretrain/tiny_video.safetensors"
    val_data: str | None = None
    size: int | None = None
    camera: str | None = None
    window: int = 16
    ae_steps: int = 2500
    ae_batch_size: int = 32
    ae_crop: int = 32
    ae_learning_rate: float = 1e-3
    steps: int = 2500
    batch_size: int = 16
    learning_rate: float = 5e-4
    warmup: int = 100
    ema: float = 0.998
    seed: int = 0
    arch: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check(self.window >= 2, "window", f"must be >= 2, got {self.window}.")
        check(self.ae_steps >= 0, "ae_steps", f"must be >= 0, got {self.ae_steps}.")
        check(self.steps >= 0, "steps", f"must be >= 0, got {self.steps}.")
        check(self.batch_size >= 1 and self.ae_batch_size >= 1, "batch_size", "batch sizes must be >= 1.")
        check(0.0 <= self.ema < 1.0, "ema", f"must be in [0, 1), got {self.ema}.")
        check(self.ae_crop % 8 == 0 and self.ae_crop >= 8, "ae_crop",
              f"must be a multiple of 8 (>= 8), got {self.ae_crop}.")
        check(self.size is None or self.size >= 8, "size", f"must be >= 8 pixels, got {self.size}.")
        if self.val_data is None:
            from workbench.data.sources import data_kind

            self.val_data = "sample" if data_kind(self.data) == "metaworld" else self.data


def _is_lerobot(path: str) -> bool:
    from workbench.data.sources import data_kind

    return data_kind(path) == "lerobot"


def _lerobot(path: str, size: int | tuple[int, int] | None, split: str = "all", window: int = 2,
             stride: int = 4, camera: str | None = None):
    """The LeRobot dataset at ``path`` as clips of frames alone (no actions or state are read), resized to
    ``size`` (N for N x N, or the backbone's ``(height, width)``)."""
    from workbench.data.lerobot import LeRobotClips

    size = [size, size] if isinstance(size, int) else (list(size) if size else None)
    return LeRobotClips(root=path, camera=camera, window=window, stride=stride, split=split, size=size,
                        actions=None, state=None)


def _load_frames(path: str, size: int | tuple[int, int] | None = None, split: str = "all",
                 camera: str | None = None) -> tuple[Any, dict[str, Any]]:
    """Every frame of ``split``'s episodes, validated by the dataset reader: uint8 ``[N, T, H, W, 3]`` for a
    Meta-World file, a list of uint8 ``(T_e, H, W, 3)`` (one per episode, lengths may differ) for a LeRobot
    dataset (resized to ``size`` x ``size``)."""
    if _is_lerobot(path):
        clips = _lerobot(path, size, split, camera=camera)
        frames = [clips.episode_frames(e) for e in clips.episodes]
        clips.close()
        height, width = frames[0].shape[1:3]
        if height != width:
            raise DataError(f"{path}: frames of {width}x{height} pixels; tiny_video reads square frames. "
                            f"Pass --size N (e.g. --size 64) to resize them.")
        return frames, {"path": str(clips.root), "episodes": len(frames),
                        "frames": min(len(f) for f in frames),
                        "tasks": sorted(set(clips.task_names)), "attrs": {}, "kind": "lerobot"}
    from workbench.data.metaworld import MetaWorldClips

    clips = MetaWorldClips(path=path, window=2, split=split)  # validates the file
    frames = clips.read("frames", None if split == "all" else clips.episodes)
    clips.close()
    if size is not None and frames.shape[2] != size:
        raise DataError(f"{clips.path} holds {frames.shape[2]}x{frames.shape[3]} frames, not --size {size}. "
                        f"Leave --size out, or render the file at that size "
                        f"(`workbench data metaworld --size {size}`).")
    return frames, {"path": str(clips.path), "episodes": clips.num_episodes, "frames": clips.episode_length,
                    "tasks": sorted(set(clips.task_names)), "attrs": clips.attrs, "kind": "metaworld"}


def _flat(frames: Any) -> tuple[np.ndarray, np.ndarray]:
    """All frames one after another ``(sum T_e, H, W, 3)`` and each episode's length."""
    if isinstance(frames, np.ndarray):
        n, t = frames.shape[:2]
        return frames.reshape(n * t, *frames.shape[2:]), np.full(n, t)
    return np.concatenate(frames), np.array([len(f) for f in frames])


def _to_float(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[..., H, W, 3]`` → float ``[..., 3, H, W]`` in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).float().div_(127.5).sub_(1.0)
    return x.movedim(-1, -3)


FLOOR = 0.1
"""Both stages' learning rate ends its cosine at this fraction of the peak
(:class:`~workbench.loop.LRSchedule`)."""


def train_autoencoder(base: TinyVideo, frames: np.ndarray, cfg: PretrainConfig,
                      progress: bool = True) -> list[float]:
    """Stage 1: reconstruct random crops of single frames (MSE + L1); sets the latent normalisation.

    Returns the loss of every step. A Ctrl-C stops it cleanly between two steps and raises
    :class:`~workbench.loop.Interrupted`, whose ``resume()`` finishes the stage.
    """
    ae = base.autoencoder
    ae.train()
    opt = torch.optim.AdamW(ae.parameters(), lr=cfg.ae_learning_rate, weight_decay=0.0)
    rng = np.random.default_rng(cfg.seed)
    flat, lengths = _flat(frames)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    n, t = len(lengths), int(lengths[0])
    equal = bool((lengths == t).all())
    h, w = flat.shape[1:3]
    crop, d = min(cfg.ae_crop, h), base.config.downsample
    gen = torch.Generator().manual_seed(cfg.seed)

    def loss_fn(step: int) -> torch.Tensor:
        ep = rng.integers(n, size=cfg.ae_batch_size)
        # (episodes of one length: the draws the shipped weights were made with)
        fr = rng.integers(t, size=cfg.ae_batch_size) if equal else \
            (rng.random(cfg.ae_batch_size) * lengths[ep]).astype(np.int64)
        # crops on the latent grid, so a crop's latents are the full frame's latents
        ys = rng.integers(0, (h - crop) // d + 1, size=cfg.ae_batch_size) * d
        xs = rng.integers(0, (w - crop) // d + 1, size=cfg.ae_batch_size) * d
        batch = np.stack([flat[offsets[e] + f, y:y + crop, x:x + crop] for e, f, y, x in zip(ep, fr, ys, xs)])
        x = _to_float(batch)  # (B, 3, crop, crop)
        z = ae.encoder(x)
        # a little latent noise makes the decoder forgiving of a denoiser's imperfect latents
        z = z + 0.05 * z.detach().std() * torch.randn(z.shape, generator=gen)
        y = ae.decoder(z)
        return F.mse_loss(y, x) + 0.5 * F.l1_loss(y, x)

    loop = TrainingLoop(opt, LRSchedule(cfg.ae_learning_rate, cfg.ae_steps, cfg.warmup, floor=FLOOR),
                        clip_grad_norm=1.0, randomness=[rng, gen], name="autoencoder", progress=progress)

    def finish(losses: list[float]) -> list[float]:
        ae.eval()
        _set_latent_stats(base, flat, rng)
        return losses

    return then(lambda: loop.run(loss_fn), finish)


@torch.no_grad()
def _set_latent_stats(base: TinyVideo, flat: np.ndarray, rng: np.random.Generator, count: int = 512) -> None:
    total = len(flat)  # every frame, one after another
    idx = rng.choice(total, size=min(count, total), replace=False)
    x = _to_float(flat[np.sort(idx)])
    z = torch.cat([base.autoencoder.encoder(chunk) for chunk in x.split(64)])  # (N, C, h, w)
    base.latent_mean.copy_(z.mean(dim=(0, 2, 3)))
    base.latent_std.copy_(z.std(dim=(0, 2, 3)).clamp_min(1e-4))


@torch.no_grad()
def encode_episodes(base: TinyVideo, frames: Any, progress: bool = True) -> torch.Tensor | list[torch.Tensor]:
    """Normalised latents of every frame, ``(N, C, T, h, w)`` (each episode encoded once); a list of
    ``(C, T_e, h, w)`` when the episodes differ in length."""
    from tqdm.auto import tqdm

    out = []
    for episode in tqdm(frames, desc="encode", disable=not progress, unit="episode"):
        x = _to_float(episode)  # (T, 3, H, W)
        out.append(torch.cat([base.encode_frames(chunk) for chunk in x.split(64)]).transpose(0, 1))
    return torch.stack(out) if len({z.shape[1] for z in out}) == 1 else out


def _flow_loss(base: TinyVideo, z: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Flow-matching loss of the base denoiser on latent clips ``z`` (frame 0 is given, not scored)."""
    x_t = base.default_objective().add_noise(z, noise, t)
    pred = base.denoise(x_t, t, {"first_frame": z[:, :, 0]})
    mask = torch.ones(z.shape[0], z.shape[2], device=z.device)
    mask[:, 0] = 0
    return masked_mse(pred, noise - z, mask)


def train_denoiser(base: TinyVideo, latents: torch.Tensor, cfg: PretrainConfig,
                   progress: bool = True) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Stage 2: flow matching on random windows; returns the loss curve and the EMA weights.

    A Ctrl-C stops it cleanly between two steps (the EMA updated with the last completed one)
    and raises :class:`~workbench.loop.Interrupted`, whose ``resume()`` finishes the stage.
    """
    den = base.denoiser
    den.train()
    opt = torch.optim.AdamW(den.parameters(), lr=cfg.learning_rate, weight_decay=0.01)
    ema = {k: v.detach().clone() for k, v in den.state_dict().items()}
    equal = isinstance(latents, torch.Tensor)
    if not equal:  # episodes of several lengths: those that hold a window
        latents = [z for z in latents if z.shape[1] >= cfg.window]
        if not latents:
            raise DataError(f"No episode has window={cfg.window} frames. Use a smaller --window.")
    lengths = np.array([z.shape[1] for z in latents])
    n, t_len = len(latents), int(lengths.min())
    if t_len < cfg.window:
        raise DataError(f"Episodes have {t_len} frames, shorter than window={cfg.window}. "
                        f"Use --window <= {t_len}.")
    rng = np.random.default_rng(cfg.seed + 1)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    objective = base.default_objective()

    def loss_fn(step: int) -> torch.Tensor:
        ep = rng.integers(n, size=cfg.batch_size)
        # (episodes of one length: the draws the shipped weights were made with)
        start = rng.integers(t_len - cfg.window + 1, size=cfg.batch_size) if equal else \
            (rng.random(cfg.batch_size) * (lengths[ep] - cfg.window + 1)).astype(np.int64)
        z = torch.stack([latents[e][:, s:s + cfg.window] for e, s in zip(ep, start)])  # (B, C, T, h, w)
        noise = torch.randn(z.shape, generator=gen)
        t = objective.sample_t(z.shape[0], gen, z.device)
        return _flow_loss(base, z, noise, t)

    @torch.no_grad()
    def update_ema(step: int) -> None:
        decay = min(cfg.ema, (1 + step) / (10 + step))  # a short memory early, when the weights move most
        for k, v in den.state_dict().items():
            if v.dtype.is_floating_point:
                ema[k].lerp_(v, 1 - decay)
            else:
                ema[k].copy_(v)

    loop = TrainingLoop(opt, LRSchedule(cfg.learning_rate, cfg.steps, cfg.warmup, floor=FLOOR),
                        clip_grad_norm=1.0,
                        after_update=update_ema, randomness=[rng, gen], name="denoiser", progress=progress)

    def finish(losses: list[float]) -> tuple[list[float], dict[str, torch.Tensor]]:
        den.eval()
        return losses, ema

    return then(lambda: loop.run(loss_fn), finish)


@torch.no_grad()
def validation_loss(base: TinyVideo, data: str = "sample", split: str = "val",
                    window: int = 16, stride: int = 8,
                    seed: int = 0, levels: int = 8, batch_size: int = 16, camera: str | None = None) -> float:
    """Mean flow-matching loss on every ``window`` of ``data``'s ``split``, deterministically.

    Clip ``i`` gets noise from ``torch.Generator().manual_seed(seed * 100003 + i)`` and the noise
    level ``t = (i mod levels + 0.5) / levels``, so the number depends on the weights alone.
    The first frame (given, not predicted) is not scored.
    """
    from workbench.data.metaworld import MetaWorldClips

    clips = _lerobot(data, base.clip().size, split, window, stride, camera) if _is_lerobot(data) else \
        MetaWorldClips(path=data, window=window, stride=stride, split=split)
    was = base.training
    base.train(False)
    total, count = 0.0, 0
    try:
        for lo in range(0, len(clips), batch_size):
            items = [clips[i] for i in range(lo, min(lo + batch_size, len(clips)))]
            z = base.encode(torch.stack([it["video"] for it in items]).to(base.device))
            noise = torch.stack([torch.randn(z.shape[1:],
                                             generator=torch.Generator().manual_seed(seed * 100003 + i))
                                 for i in range(lo, lo + len(items))]).to(z)
            t = torch.tensor([(i % levels + 0.5) / levels for i in range(lo, lo + len(items))],
                             device=z.device)
            # per clip, so the mean does not depend on batch_size
            for k in range(len(items)):
                total += float(_flow_loss(base, z[k:k + 1], noise[k:k + 1], t[k:k + 1]))
                count += 1
    finally:
        base.train(was)
    return total / count


@torch.no_grad()
def reconstruction_psnr(base: TinyVideo, data: str = "sample", split: str = "val",
                        camera: str | None = None) -> float:
    """PSNR (dB, uint8 range) of autoencoder reconstructions of every frame of ``split``."""
    from workbench.metrics import psnr

    frames, _ = _load_frames(data, base.clip().size if _is_lerobot(data) else None, split, camera)
    x = _to_float(_flat(frames)[0])
    y = torch.cat([base.decode_frames(base.encode_frames(chunk)) for chunk in x.split(64)])
    to_u8 = lambda v: (  # noqa: E731
        ((v.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1).numpy())
    return psnr(to_u8(y), to_u8(x))


def pretrain(cfg: PretrainConfig, progress: bool = True) -> TinyVideo:
    """Run both stages and write the weights (safetensors) with their provenance and a card JSON.

    A Ctrl-C in either stage stops it cleanly between two steps and raises
    :class:`~workbench.loop.Interrupted`; its ``resume()`` finishes the whole run (the weights come
    out as if it had never stopped; the recorded seconds include the pause).
    """
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    frames, info = _load_frames(cfg.data, cfg.size, camera=cfg.camera)
    longest = max(len(f) for f in frames)
    if longest < cfg.window if info["kind"] == "lerobot" else info["frames"] < cfg.window:
        have = longest if info["kind"] == "lerobot" else info["frames"]
        raise DataError(f"{info['path']}: episodes have {have} frames at most, "
                        f"shorter than window={cfg.window}. Use --window <= {have}.")
    arch = {**cfg.arch, "frames": cfg.window, "image_size": int(frames[0].shape[1])}
    base = TinyVideo(TinyVideoConfig(**arch, device="cpu"))  # the pretraining loops below run on the CPU
    validation = {"data": cfg.val_data, "split": "val", "window": cfg.window, "stride": 8, "seed": 0,
                  "levels": 8,
                  **({"camera": cfg.camera} if cfg.camera and _is_lerobot(cfg.val_data) else {})}
    held = {"frames": frames}  # let go once encoded: the denoiser trains on latents
    del frames

    def after_autoencoder(ae_losses: list[float]) -> TinyVideo:
        ae_seconds = time.perf_counter() - started
        untrained = validation_loss(base, **validation)  # the trained autoencoder, the denoiser still at init
        latents = encode_episodes(base, held.pop("frames"), progress)
        return then(lambda: train_denoiser(base, latents, cfg, progress),
                    lambda result: _write(cfg, base, info, validation, started, ae_losses, ae_seconds,
                                          untrained, *result))

    return then(lambda: train_autoencoder(base, held["frames"], cfg, progress), after_autoencoder)


def _write(cfg: PretrainConfig, base: TinyVideo, info: dict[str, Any],
           validation: dict[str, Any], started: float,
           ae_losses: list[float], ae_seconds: float, untrained: float, den_losses: list[float],
           ema: dict[str, torch.Tensor]) -> TinyVideo:
    """Load the EMA weights, score them, and write the weights, the card and the loss curves."""
    base.denoiser.load_state_dict(ema)
    seconds = time.perf_counter() - started
    val = validation_loss(base, **validation)
    ae_psnr = reconstruction_psnr(base, cfg.val_data, camera=validation.get("camera"))
    name = Path(info["path"]).name
    if info["kind"] == "lerobot":
        trained_on = (f"{name} (a LeRobot dataset; tasks: {', '.join(info['tasks'])}): "
                      f"{info['episodes']} episodes of at least {info['frames']} frames, no actions")
    else:
        trained_on = (f"Meta-World {', '.join(info['tasks'])}: "
                      f"{info['episodes']} episodes x {info['frames']} frames "
                      f"({name}, generator seed {int(info['attrs'].get('seed', -1))}, camera "
                      f"{info['attrs'].get('camera', '?')}), no actions")
    provenance = {
        "model_id": "tiny_video-metaworld-i2v",
        "trained_on": trained_on,
        "train_steps": cfg.steps,
        "autoencoder_steps": cfg.ae_steps,
        "val_loss": round(val, 6),
        "validation": validation,
        "validation_loss_untrained": round(untrained, 6),
        "autoencoder_val_psnr": round(ae_psnr, 3),
        "train_loss_final": round(float(np.mean(den_losses[-100:])), 6) if den_losses else None,
        "autoencoder_loss_final": round(float(np.mean(ae_losses[-100:])), 6) if ae_losses else None,
        "train_seconds": round(seconds, 1),
        "autoencoder_seconds": round(ae_seconds, 1),
        # file names only: the provenance travels with the weights, the paths of this machine do not
        "pretrain_config": {**{k: v for k, v in dataclasses.asdict(cfg).items() if k != "out"},
                            "data": Path(cfg.data).name, "val_data": Path(cfg.val_data).name},
        "torch": torch.__version__,
    }
    base.provenance = {**provenance, "source": "pretrained"}
    out = Path(cfg.out)
    base.save_pretrained(out, **provenance)
    curves = {"autoencoder_loss": [round(v, 6) for v in ae_losses],
              "denoiser_loss": [round(v, 6) for v in den_losses]}
    card = dataclasses.asdict(base.make_card())
    out.with_suffix(".json").write_text(json.dumps({"card": card, "provenance": provenance},
                                                   indent=1, default=str))
    out.with_suffix(".curves.json").write_text(json.dumps(curves))
    return TinyVideo.from_pretrained(out)


def add_arguments(parser) -> None:
    d = PretrainConfig(data="sample")
    parser.add_argument("--data", required=True,
                        help="a LeRobot dataset directory (e.g. your videos, from `workbench data import`) "
                             "or an HDF5 file from `workbench data metaworld` (or 'sample')")
    parser.add_argument("--out", default=d.out, help="output .safetensors file (default: %(default)s)")
    parser.add_argument("--val-data", help="data whose val split scores the card "
                                           "(default: the shipped sample for a Meta-World file, "
                                           "the data itself for a LeRobot dataset)")
    parser.add_argument("--size", type=int, help="frame side in pixels "
                                                 "(a LeRobot dataset is resized to it; default: as stored)")
    parser.add_argument("--camera", help="a LeRobot dataset's video feature (when it has several)")
    for flag, typ in (("window", int), ("ae_steps", int), ("ae_batch_size", int), ("steps", int),
                      ("batch_size", int), ("learning_rate", float), ("ae_learning_rate", float),
                      ("seed", int), ("width", int), ("depth", int), ("ae_width", int)):
        default = getattr(d, flag) if hasattr(d, flag) else getattr(TinyVideoConfig, flag)
        parser.add_argument(f"--{flag.replace('_', '-')}", type=typ, default=default,
                            help=f"(default: {default})")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run(args) -> int:
    fields = {f.name for f in dataclasses.fields(PretrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    arch = {k: getattr(args, k) for k in ("width", "depth", "ae_width") if getattr(args, k, None) is not None}
    cfg = PretrainConfig(**values, arch=arch)
    base = pretrain(cfg, progress=not args.no_progress)
    r = base.card.recipe
    p = base.provenance
    print(f"wrote {cfg.out}: {r.train_steps} denoiser steps, validation loss {r.val_loss:.5f} "
          f"({p['validation']['data']} {p['validation']['split']}), autoencoder PSNR "
          f"{p['autoencoder_val_psnr']:.2f} dB, {p['train_seconds'] / 60:.1f} min")
    return 0
