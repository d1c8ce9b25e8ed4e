"""A hand-position probe: a small CNN that reads the robot's end-effector position off one frame.

It turns a predicted video into a trajectory, so a world model can be scored on whether the arm
goes where the actions say (:func:`action_error`), not only on pixels.

The shipped probe (``workbench/worldmodel/weights/hand_probe/hand_probe.safetensors``, with its provenance
in ``hand_probe.json``) was trained on real frames of pretraining-style data — the generator's
seed 1, the seed ``workbench pretrain``'s data used, which shares no episode with the shipped
sample (seed 0) the demo evaluates on:

```bash
workbench data metaworld --tasks reach-v3,push-v3,pick-place-v3,door-open-v3,drawer-close-v3,\\
    button-press-topdown-v3 --episodes 96 --frames 64 --size 64 --seed 1 --action-repeat 2 \\
    --out data/probe_train.h5
workbench probe train --data data/probe_train.h5 --out hand_probe.safetensors
```

Training holds out whole episodes (``val_fraction`` of each task's) and reports the mean distance
between predicted and recorded positions on their frames, in centimetres. Frames are blurred at
random during training (a Gaussian of random width on half of each batch) so that the probe also
reads the softer frames a small video model predicts.

Example:
    ```python
    from workbench.worldmodel.probe import HandProbe
    probe = HandProbe.from_pretrained()
    xyz = probe.positions(frames)      # uint8 [..., H, W, 3] → metres [..., 3]
    hand = probe.readout()             # for the instruments: frames → cm (AblationSliders(..., readout=hand))
    ```
"""

from __future__ import annotations

import dataclasses
import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import check
from workbench.errors import CheckpointError, DataError
from workbench.layers import group_count
from workbench.loop import LRSchedule, TrainingLoop, then

WEIGHTS = Path(__file__).resolve().parent / "weights" / "hand_probe" / "hand_probe.safetensors"
#: The shipped object probe (``workbench probe train --target object``): the position of the task's object
#: (the puck of push-v3), read off a frame as the hand probe reads the hand.
OBJECT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "object_probe" / "object_probe.safetensors"
#: What a probe can be trained to read: the recorded position it regresses, as columns of a Meta-World file.
TARGETS = {"hand": "ee_pos", "object": "obs[..., 4:7]"}


class HandProbe(nn.Module):
    """Frames ``[N, 3, 64, 64]`` in [-1, 1] → hand positions ``[N, 3]`` in metres (world frame).

    Args:
        width: The base channel count of its convolutions (they use half, once and twice it).
        image_size: The side of the square frames it reads, in pixels.
    """

    def __init__(self, width: int = 32, image_size: int = 64):
        super().__init__()
        w = width
        self.image_size = image_size

        def conv(cin: int, cout: int, stride: int) -> list[nn.Module]:
            k = 4 if stride == 2 else 3  # even kernels for strided layers: every input pixel counts equally
            return [nn.Conv2d(cin, cout, k, stride, 1), nn.GroupNorm(group_count(cout), cout), nn.SiLU()]

        # two coordinate channels: a position is easier to read when every pixel knows where it is
        self.features = nn.Sequential(*conv(5, w // 2, 2),                          # 32×32
                                      *conv(w // 2, w, 2), *conv(w, w, 1),          # 16×16
                                      *conv(w, 2 * w, 2), *conv(2 * w, 2 * w, 1),   # 8×8
                                      nn.Conv2d(2 * w, 16, 1), nn.SiLU())           # 16 maps, 8×8
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 64, 64), nn.SiLU(), nn.Linear(64, 3))
        # positions are regressed standardised; the statistics of the training data travel with the weights
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("std", torch.ones(3))
        self.provenance: dict[str, Any] = {}

    def standardised(self, frames: torch.Tensor) -> torch.Tensor:
        """Positions in units of the training data's per-axis std around its mean, ``(N, 3)``."""
        n, _, h, w = frames.shape
        ys = torch.linspace(-1, 1, h, dtype=frames.dtype).view(1, 1, h, 1).expand(n, 1, h, w)
        xs = torch.linspace(-1, 1, w, dtype=frames.dtype).view(1, 1, 1, w).expand(n, 1, h, w)
        return self.head(self.features(torch.cat([frames, xs, ys], dim=1)))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.standardised(frames) * self.std + self.mean  # (N, 3) metres

    @torch.no_grad()
    def positions(self, frames: Any, batch_size: int = 256) -> np.ndarray:
        """Hand positions (metres, float64 ``[..., 3]``) of frames.

        ``frames``: uint8 channel-last ``[..., H, W, 3]``, or a float video channel-first in [-1, 1]
        (``[..., 3, T, H, W]``, converted with :func:`workbench.metrics.to_uint8_video`).
        """
        from workbench.metrics import to_uint8_video

        a = frames if isinstance(frames, np.ndarray) and frames.dtype == np.uint8 else to_uint8_video(frames)
        if a.ndim < 3 or a.shape[-3:] != (self.image_size, self.image_size, 3):
            raise DataError(f"HandProbe: frames must be uint8 [..., {self.image_size}, {self.image_size}, 3] "
                            f"(channel-last), got shape {tuple(a.shape)}. The probe reads "
                            f"{self.image_size}x{self.image_size} frames of the corner2_close camera.")
        flat = a.reshape(-1, *a.shape[-3:])
        was = self.training
        self.train(False)
        try:
            out = [self(_to_input(flat[i:i + batch_size])) for i in range(0, len(flat), batch_size)]
        finally:
            self.train(was)
        return torch.cat(out).double().numpy().reshape(*a.shape[:-3], 3)

    def readout(self):
        """This probe as a readout the library's instruments take: frames → hand positions in cm.

        Examples:
            >>> hand = HandProbe.from_pretrained().readout()
            >>> hand(traj.frames("final", decode="full")).shape       # (T, 3): x, y, z in cm per frame
            (16, 3)
        """
        from workbench.inspect.probes.readout import Readout

        return Readout(self.positions, name="hand", unit="cm", scale=100.0, axes=("x", "y", "z"))

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None) -> HandProbe:
        """The shipped probe (default) or one written by ``workbench probe train``."""
        from safetensors.torch import load_file

        path = Path(path) if path is not None else WEIGHTS
        if not path.is_file():
            raise CheckpointError(f"Probe weights not found: {path}. Train them with `workbench probe "
                                  f"train --data FILE.h5 --out {path}` (add --target object for an object "
                                  f"probe), or omit the path for the shipped hand probe.")
        meta_path = path.with_suffix(".json")
        provenance = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        probe = cls(**provenance.get("architecture", {}))
        probe.load_state_dict(load_file(str(path)))
        probe.provenance = provenance
        return probe.eval()


@lru_cache(maxsize=1)
def shipped_probe() -> HandProbe:
    """The shipped probe, loaded once per process."""
    return HandProbe.from_pretrained()


@lru_cache(maxsize=1)
def shipped_object_probe() -> HandProbe:
    """The shipped object probe (the push-v3 puck's position, metres), loaded once per process."""
    return HandProbe.from_pretrained(OBJECT_WEIGHTS)


def _to_input(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` → float ``[N, 3, H, W]`` in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def _random_blur(x: torch.Tensor, gen: torch.Generator, max_sigma: float) -> torch.Tensor:
    """Blur each frame of ``x`` ``(N, 3, H, W)`` with a Gaussian of width uniform in [0, max_sigma] px."""
    out = x.clone()
    radius = 4
    offsets = torch.arange(-radius, radius + 1, dtype=x.dtype)
    sigmas = torch.rand(len(x), generator=gen) * max_sigma
    for i, sigma in enumerate(sigmas.tolist()):
        if sigma < 0.2:
            continue
        k = torch.exp(-0.5 * (offsets / sigma) ** 2)
        k = (k / k.sum()).view(1, 1, 1, -1).expand(3, 1, 1, -1)
        y = F.conv2d(F.pad(x[i:i + 1], (radius, radius, 0, 0), mode="replicate"), k, groups=3)
        out[i:i + 1] = F.conv2d(F.pad(y, (0, 0, radius, radius), mode="replicate"), k.transpose(2, 3),
                                groups=3)
    return out


FLOOR = 0.05
"""The probe's learning rate ends its cosine at this fraction of the peak
(:class:`~workbench.loop.LRSchedule`)."""


@dataclasses.dataclass
class ProbeTrainConfig:
    """Settings of ``workbench probe train`` (each is a flag)."""

    data: str
    out: str = "outputs/hand_probe/hand_probe.safetensors"
    steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 2e-3
    width: int = 32
    val_fraction: float = 0.15
    max_blur: float = 1.5
    seed: int = 0
    target: str = "hand"

    def __post_init__(self):
        check(self.target in TARGETS, "target", f"must be one of {', '.join(TARGETS)} (what the probe reads: "
                                                f"{'; '.join(f'{k} = {v}' for k, v in TARGETS.items())}), "
                                                f"got {self.target!r}.")
        check(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}.")
        check(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}.")
        check(self.width >= 8 and self.width % 8 == 0, "width",
              f"must be a multiple of 8 (>= 8), got {self.width}.")
        check(0.0 < self.val_fraction < 1.0, "val_fraction", f"must be in (0, 1), got {self.val_fraction}.")
        check(self.max_blur >= 0, "max_blur", f"must be >= 0, got {self.max_blur}.")


def hand_error_cm(video: Any, ee_pos: Any, probe: HandProbe | None = None) -> np.ndarray:
    """Per-frame distance (cm) between the hand position ``probe`` reads off ``video`` and ``ee_pos``.

    Args:
        video: Uint8 ``[..., T, H, W, 3]`` or float ``[..., 3, T, H, W]`` (the conventions of
            :mod:`workbench.metrics`).
        ee_pos: Recorded positions in metres, ``[..., T, 3]``.
        probe: A :class:`HandProbe` (default: the shipped one).

    Returns:
        The distances in cm, float64 ``[..., T]``.
    """
    from workbench.metrics import to_uint8_video

    frames = to_uint8_video(video)
    target = np.asarray(ee_pos.detach().cpu() if isinstance(ee_pos, torch.Tensor) else ee_pos, np.float64)
    if target.shape != (*frames.shape[:-3], 3):
        raise DataError(
            f"hand_error_cm: ee_pos has shape {tuple(target.shape)}, expected {(*frames.shape[:-3], 3)}: "
            f"one (x, y, z) position in metres per frame of the video "
            f"(video shape {tuple(frames.shape)} channel-last)."
        )
    found = (probe or shipped_probe()).positions(frames)
    return 100.0 * np.linalg.norm(found - target, axis=-1)


def action_error(pred: Any, ee_pos: Any, probe: HandProbe | None = None) -> float:
    """Mean :func:`hand_error_cm` over the predicted frames (frame 0, which is given, is skipped), in cm.

    The **action error** asks whether the arm goes where the actions say: the probe reads the hand
    position off every predicted frame, and the error is its distance to the recorded end-effector
    position. The probe's own error on the true frames is the floor; ``workbench eval`` reports
    ratios to it.

    Args:
        pred: The predicted clips, as :func:`hand_error_cm` takes them.
        ee_pos: The recorded end-effector positions in metres, ``[..., T, 3]``.
        probe: A :class:`HandProbe` (default: the shipped one).

    Returns:
        The mean distance in cm.
    """
    return float(hand_error_cm(pred, ee_pos, probe)[..., 1:].mean())


def train_probe(cfg: ProbeTrainConfig, progress: bool = True) -> HandProbe:
    """Train a probe on ``cfg.data`` and write ``cfg.out`` (safetensors) and its provenance JSON.

    A Ctrl-C stops training cleanly between two steps and raises :class:`~workbench.loop.Interrupted`,
    whose ``resume()`` finishes it (and writes the files).
    """
    from workbench.data.metaworld import MetaWorldClips, split_episodes

    started = time.perf_counter()
    clips = MetaWorldClips(path=cfg.data, window=2, split="all")  # validates the file
    frames = clips.read("frames")
    if cfg.target == "object":
        if "obs" not in clips.datasets():
            clips.close()
            raise DataError(f"{cfg.data}: --target object reads the object's position "
                            f"from the raw observation ('obs', columns 4:7), which this file does not hold. "
                            f"Use a file of `workbench data metaworld`, which records it.")
        # (named as the hand's: the same regression)
        ee_pos = clips.read("obs")[..., 4:7].astype(np.float32)
    else:
        ee_pos = clips.read("ee_pos").astype(np.float32)
    tasks, attrs = list(clips.task_names), clips.attrs
    clips.close()
    n, t, h = frames.shape[:3]
    if n < 2:
        raise DataError(f"{cfg.data}: {n} episode(s); the probe needs at least 2 "
                        f"(one is held out to measure its error). "
                        f"Generate more episodes with `workbench data metaworld --episodes N`.")
    held = np.zeros(n, dtype=bool)
    held[split_episodes(tasks, cfg.val_fraction, cfg.seed)[1]] = True  # whole episodes, stratified by task
    x_train, y_train = frames[~held].reshape(-1, h, h, 3), ee_pos[~held].reshape(-1, 3)
    torch.manual_seed(cfg.seed)
    probe = HandProbe(width=cfg.width, image_size=h)
    probe.mean.copy_(torch.from_numpy(y_train.mean(0)))
    probe.std.copy_(torch.from_numpy(y_train.std(0)))
    opt = torch.optim.AdamW(probe.parameters(), lr=cfg.learning_rate, weight_decay=1e-4)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    probe.train()

    def loss_fn(step: int) -> torch.Tensor:
        idx = rng.integers(len(x_train), size=cfg.batch_size)
        x = _to_input(x_train[idx])
        half = cfg.batch_size // 2
        x[:half] = _random_blur(x[:half], gen, cfg.max_blur)
        target = (torch.from_numpy(y_train[idx]) - probe.mean) / probe.std
        return F.smooth_l1_loss(probe.standardised(x), target, beta=0.1)

    loop = TrainingLoop(opt, LRSchedule(cfg.learning_rate, cfg.steps, floor=FLOOR), randomness=[rng, gen],
                        name=f"{cfg.target} probe", progress=progress)
    return then(lambda: loop.run(loss_fn),
                lambda losses: _finish(cfg, probe, losses, frames, ee_pos, held, tasks, attrs, clips.path,
                                       started))


def _finish(cfg: ProbeTrainConfig, probe: HandProbe, losses: list[float], frames: np.ndarray,
            ee_pos: np.ndarray, held: np.ndarray, tasks: list[str], attrs: dict[str, Any], path: Path,
            started: float) -> HandProbe:
    """Measure the trained probe on the held-out episodes; write its weights and provenance."""
    from safetensors.torch import save_file

    _, t, h = frames.shape[:3]
    probe.eval()
    err = hand_error_cm(frames[held], ee_pos[held], probe)
    name = Path(path).name
    from workbench.worldmodel.generate import recorded_command

    defaults = ProbeTrainConfig(data="")
    flags = [f"--{f.name.replace('_', '-')} {getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)
             if f.name not in ("data", "out") and getattr(cfg, f.name) != getattr(defaults, f.name)]
    provenance = {
        "target": f"{cfg.target} position ({TARGETS[cfg.target]}), metres",
        "command": " ".join(["workbench probe train", f"--data {name}", *flags,
                             f"--out {Path(cfg.out).name}"]),
        "data_command": recorded_command(attrs, name),
        "architecture": {"width": cfg.width, "image_size": int(h)},
        "trained_on": (f"Meta-World {', '.join(sorted(set(tasks)))}: "
                       f"{int((~held).sum())} episodes x {t} frames "
                       f"({name}, generator seed {int(attrs.get('seed', -1))}, "
                       f"camera {attrs.get('camera', '?')})"),
        "held_out": (f"{int(held.sum())} episodes ({cfg.val_fraction:.0%} of each task) x {t} frames "
                     f"of the same file"),
        "held_out_error_cm": {"mean": round(float(err.mean()), 3), "median": round(float(np.median(err)), 3),
                              "p90": round(float(np.percentile(err, 90)), 3)},
        "train_config": {**dataclasses.asdict(cfg), "data": name, "out": Path(cfg.out).name},
        "train_loss_final": round(float(np.mean(losses[-100:])), 6),
        "train_seconds": round(time.perf_counter() - started, 1),
        "parameters": sum(p.numel() for p in probe.parameters()),
        "torch": torch.__version__,
    }
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in probe.state_dict().items()}, str(out))
    out.with_suffix(".json").write_text(json.dumps(provenance, indent=1))
    probe.provenance = provenance
    return probe


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="probe_command", required=True)
    train = sub.add_parser("train", help="train the hand-position probe on a Meta-World file")
    d = ProbeTrainConfig(data="")
    train.add_argument("--data", required=True, help="HDF5 file from `workbench data metaworld`")
    train.add_argument("--out", default=d.out, help="output .safetensors (default: %(default)s)")
    train.add_argument("--target", choices=tuple(TARGETS), default=d.target,
                       help="what the probe reads off a frame: the hand (ee_pos) or the task's object (the "
                            "observation's object position) (default: %(default)s)")
    for flag in ("steps", "batch_size", "learning_rate", "width", "val_fraction", "max_blur", "seed"):
        default = getattr(d, flag)
        train.add_argument(f"--{flag.replace('_', '-')}", type=type(default), default=default,
                           help=f"(default: {default})")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args) -> int:
    fields = {f.name for f in dataclasses.fields(ProbeTrainConfig)}
    cfg = ProbeTrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    probe = train_probe(cfg, progress=not args.no_progress)
    e = probe.provenance["held_out_error_cm"]
    print(f"wrote {cfg.out}: held-out error {e['mean']:.2f} cm mean, {e['median']:.2f} cm median "
          f"({probe.provenance['held_out']}), {probe.provenance['train_seconds'] / 60:.1f} min")
    return 0
