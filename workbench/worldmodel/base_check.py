"""Does a base carry your scene? The check ``workbench pretrain`` runs before you train an adapter on it.

An action adapter can only move what the frozen base draws. A base whose autoencoder smooths a small
moving object into the table, or whose denoiser forgets the given first frame, leaves the adapter
nothing to steer: training then "works" and learns nothing. A high average reconstruction PSNR hides
this, because the background is most of the pixels. So the check scores the base where it matters,
on held-out clips of your data:

* **the first frame**: the autoencoder's reconstruction of each clip's first frame, the picture
  every prediction starts from (PSNR over all its pixels);
* **the moving pixels**: the reconstruction of the later frames on the pixels that differ from the
  clip's first frame (the eval's moving pixels, :func:`workbench.metrics.moving_mask`), beside the
  first frame held still on the same pixels (``still``): the score of a picture that shows no
  motion at all. A reconstruction close to ``still`` has lost what moves;
* **the base's own prediction** from the first frame (its sampler, no adapter): PSNR on the pixels
  that do not move (``carried``: does it keep the scene it was given?).

:func:`check_base` returns the numbers and a verdict in words (:attr:`BaseCheck.verdict`), and draws
the truth, the reconstruction and the prediction of a few clips side by side (:func:`draw_check`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The reconstruction must beat the first frame held still on the moving pixels by this many dB: below,
#: the moving parts are mostly lost (a base that draws the moving object even roughly clears it by more).
MIN_MOVING_GAIN_DB = 4.0
#: The first frame must come back at least this well (dB): below, the objects of the given frame blur away.
MIN_FIRST_FRAME_DB = 24.0
#: The base's prediction must keep the still pixels at least this well (dB).
MIN_CARRIED_DB = 20.0


@dataclasses.dataclass
class BaseCheck:
    """What :func:`check_base` measured (PSNR in dB on the uint8 scale) and what it concludes.

    ``first_frame_psnr``: the autoencoder's reconstruction of the clips' first frames.
    ``reconstruction_psnr``: the reconstruction of every frame, all pixels (the number a card reports).
    ``moving_psnr``: the reconstruction on the moving pixels of frames 1 and later; ``still_psnr``: the
    first frame held still, on the same pixels. ``carried_psnr``: the base's prediction from the first
    frame on the pixels that do not move (``None`` when not sampled). ``moving_fraction``: the share of
    pixels of frames 1 and later that move. ``carries``: every score clears its threshold
    (:data:`MIN_FIRST_FRAME_DB`, :data:`MIN_MOVING_GAIN_DB`, :data:`MIN_CARRIED_DB`); ``verdict``: that,
    in words, with what to do when it does not.
    """

    clips: int
    first_frame_psnr: float
    reconstruction_psnr: float
    moving_psnr: float
    still_psnr: float
    carried_psnr: float | None
    moving_fraction: float
    carries: bool
    verdict: str

    @property
    def moving_gain_db(self) -> float:
        """How much better the reconstruction is than a still first frame on the moving pixels."""
        return self.moving_psnr - self.still_psnr

    def summary(self) -> str:
        """The numbers on two lines and the verdict."""
        carried = "" if self.carried_psnr is None else f"; its prediction keeps the still pixels at " \
                                                       f"{self.carried_psnr:.1f} dB"
        return (f"base check on {self.clips} held-out clips: first frame {self.first_frame_psnr:.1f} dB, "
                f"all frames {self.reconstruction_psnr:.1f} dB;\n"
                f"moving pixels ({100 * self.moving_fraction:.1f}% of them) {self.moving_psnr:.1f} dB "
                f"against {self.still_psnr:.1f} dB for the first frame held still "
                f"({self.moving_gain_db:+.1f} dB){carried}.\n{self.verdict}")


def judge(first_frame: float, moving: float, still: float, carried: float | None,
          fix: str = "") -> tuple[bool, str]:
    """``(carries, verdict)`` for these scores; ``fix`` is appended to a verdict that fails (what to run)."""
    problems = []
    if first_frame < MIN_FIRST_FRAME_DB:
        problems.append(f"it redraws the given first frame at {first_frame:.1f} dB "
                        f"(below {MIN_FIRST_FRAME_DB:g} dB: its objects blur away)")
    if moving - still < MIN_MOVING_GAIN_DB:
        problems.append(f"on the moving pixels its reconstruction ({moving:.1f} dB) is hardly better than "
                        f"the first frame held still ({still:.1f} dB): it loses what moves")
    if carried is not None and carried < MIN_CARRIED_DB:
        problems.append(f"its prediction keeps the still pixels at {carried:.1f} dB only "
                        f"(below {MIN_CARRIED_DB:g} dB): it does not carry the given frame forward")
    if not problems:
        return True, ("The base carries this scene: it keeps the first frame and draws what moves, "
                      "so an action adapter trained on it has something to steer.")
    return False, ("The base cannot carry this scene: " + "; ".join(problems)
                   + ". An adapter trained on it will learn little." + (f" {fix}" if fix else ""))


def _to_uint8(x: torch.Tensor) -> np.ndarray:
    """``[..., 3, H, W]`` in [-1, 1] → uint8 ``[..., H, W, 3]``."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1).numpy()


@torch.no_grad()
def check_base(base, data: str, *, split: str = "val", clips: int = 24, sampling_steps: int = 8,
               seed: int = 0, camera: str | None = None, fix: str = "",
               keep_videos: bool = False) -> tuple[BaseCheck, dict[str, np.ndarray]]:
    """Score ``base`` (a ``tiny_video``) on up to ``clips`` held-out clips of ``data`` (the base's
    frames and size, one clip per window of each episode of ``split``, spread over the episodes).

    Returns the :class:`BaseCheck` and the uint8 videos ``[N, T, H, W, 3]`` it scored (``truth``,
    ``reconstruction``, ``prediction``) for :func:`draw_check`. ``sampling_steps`` 0 skips the
    prediction (``carried_psnr`` is then ``None``). ``fix``: what a failing verdict tells the user to run.
    """
    from workbench.metrics import moving_mask, psnr

    source = _frames_only(data, base.clip(), split, camera)
    try:
        picked = _spread(source, clips)
        video = torch.stack([source[i]["video"] for i in picked])  # (N, 3, T, H, W)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    video = video.to(base.device, base.dtype)
    was = base.training
    base.train(False)
    try:
        latents = base.encode(video)
        reconstruction = base.decode(latents)
        prediction = None
        if sampling_steps:
            generator = torch.Generator().manual_seed(seed)
            prediction = torch.cat([base.decode(base.generate({"video": video[i:i + 8]}, steps=sampling_steps,
                                                              generator=generator))
                                    for i in range(0, len(video), 8)])
    finally:
        base.train(was)
    truth, recon = _to_uint8(video.transpose(1, 2).cpu()), _to_uint8(reconstruction.transpose(1, 2).cpu())
    moving = moving_mask(truth)  # (N, T, H, W), frame 0 all False
    still = np.broadcast_to(truth[:, :1], truth.shape)
    first = psnr(recon[:, 0], truth[:, 0])
    scores = dict(first_frame=first, moving=psnr(recon, truth, mask=moving),
                  still=psnr(still, truth, mask=moving), carried=None)
    videos = {"truth": truth, "reconstruction": recon}
    if prediction is not None:
        pred = _to_uint8(prediction.transpose(1, 2).cpu())
        keep = ~moving
        keep[:, 0] = False  # frame 0 is given
        scores["carried"] = psnr(pred, truth, mask=keep)
        videos["prediction"] = pred
    carries, verdict = judge(**scores, fix=fix)
    check = BaseCheck(clips=len(picked), first_frame_psnr=first, reconstruction_psnr=psnr(recon, truth),
                      moving_psnr=scores["moving"], still_psnr=scores["still"],
                      carried_psnr=scores["carried"], moving_fraction=float(moving[:, 1:].mean()),
                      carries=carries, verdict=verdict)
    return check, videos


def _frames_only(data: str, spec: Any, split: str, camera: str | None) -> Any:
    """Clips of ``data`` as the base reads them (its frames and size, one per window), no actions or state."""
    from workbench.data.sources import data_kind, open_clips

    if data_kind(data) == "lerobot":
        from workbench.data.lerobot import LeRobotClips

        return LeRobotClips(root=data, camera=camera, window=spec.frames, stride=spec.frames, split=split,
                            size=list(spec.size), actions=None, state=None)
    return open_clips(data, window=spec.frames, stride=spec.frames, split=split, size=spec.size)


def _spread(source: Any, count: int) -> list[int]:
    """Up to ``count`` clip indices taken in turn from each episode (first windows first)."""
    episodes: dict[int, list[int]] = {}
    for i, (episode, _) in enumerate(source.index):  # (episode, start) of each clip
        episodes.setdefault(episode, []).append(i)
    order = [idx for k in range(max(len(v) for v in episodes.values()))
             for v in episodes.values() if k < len(v) for idx in [v[k]]]
    return sorted(order[:count])


def draw_check(path: str | Path, check: BaseCheck, videos: dict[str, np.ndarray], *, clips: int = 4,
               frames: int = 4, scale: int = 0) -> Path:
    """A PNG of ``clips`` clips: for each, the truth, the autoencoder's reconstruction and the base's
    prediction (rows) at ``frames`` times from the first to the last (columns), with the verdict above.
    ``scale``: pixels per frame pixel (0: enough for frames about 96 pixels wide)."""
    from PIL import Image, ImageDraw

    truth = videos["truth"]
    n, t, h, w = truth.shape[:4]
    scale = scale or max(1, round(96 / w))
    times = np.unique(np.linspace(0, t - 1, frames).round().astype(int))
    rows = [k for k in ("truth", "reconstruction", "prediction") if k in videos]
    label_w, gap, head = 104, 4, 46
    cell_h, cell_w = h * scale, w * scale
    block_h = len(rows) * (cell_h + gap) + 2 * gap
    width = label_w + len(times) * (cell_w + gap)
    picture = Image.new("RGB", (width, head + min(clips, n) * block_h), "white")
    draw = ImageDraw.Draw(picture)
    words = ("carries the scene" if check.carries else "CANNOT carry the scene")
    draw.text((4, 2), f"base {words}: first frame {check.first_frame_psnr:.1f} dB, moving pixels "
                      f"{check.moving_psnr:.1f} dB (still: {check.still_psnr:.1f} dB)", fill="black")
    draw.text((4, 16), "columns: frames " + ", ".join(str(int(k)) for k in times)
              + " (frame 0 is given)", fill="black")
    for c in range(min(clips, n)):
        top = head + c * block_h
        for r, key in enumerate(rows):
            y = top + r * (cell_h + gap)
            draw.text((4, y + cell_h // 2 - 6), key, fill="black")
            for k, f in enumerate(times):
                frame = Image.fromarray(videos[key][c, f]).resize((cell_w, cell_h), Image.NEAREST)
                picture.paste(frame, (label_w + k * (cell_w + gap), y))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path


__all__ = ["MIN_CARRIED_DB", "MIN_FIRST_FRAME_DB", "MIN_MOVING_GAIN_DB", "BaseCheck", "check_base",
           "draw_check", "judge"]
