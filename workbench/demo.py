"""``workbench demo``: turn the frozen, pretrained ``tiny_video`` into an action-conditioned world model.

1. load the frozen base (pretrained on Meta-World clips *without* actions) and the shipped sample;
2. train an action adapter (``latent_residual`` reading the actions, their running sum and
   action-driven warps of the first frame; gated onto the base at high noise only) on the
   sample's training episodes, with the frozen encoder run once per clip (cached latents);
3. on held-out episodes, predict every clip from its first frame with the base's own sampler
   and the same noise for (a) the frozen base alone, (b) base + adapter with the true actions,
   (c) base + adapter with the actions of another clip; score PSNR / SSIM overall and on the
   pixels that move (where the true future differs from the first frame);
4. write ``OUT/side_by_side.mp4`` / ``.gif`` (truth | base | adapter | swapped actions),
   ``OUT/loss.png``, ``OUT/metrics.json`` (every number) and the adapter checkpoint;
5. print a short table.

``workbench demo --quick`` runs the same path on a reduced budget (for CI). ``workbench demo --data
PATH`` trains and evaluates on other rollouts: an HDF5 file of ``workbench data metaworld`` or a
LeRobot dataset directory (frames resized to the base's size; the adapter reads its ``action``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import DataError

#: What the demo trains, as the blocks a YAML config would hold. The adapter reads the actions and
#: their running sum (the displacement since the first frame), pixel coordinates, and two copies
#: of the first frame translated by action-driven displacements. The action decides the outcome
#: at high noise, so the adapter acts only there (NoiseGated) and training draws mostly high
#: noise levels (timestep shift 3); below a noise level of 0.3 the frozen base finishes alone.
ADAPTER = {"type": "latent_residual",
           "config": {"width": 32, "depth": 2, "cumulative": True, "coords": True, "warps": 2}}
COMPOSER = {"type": "noise_gated",
            "config": {"lo": 0.3, "hi": 1.0, "ramp": 0.1, "inner": {"type": "gated_residual",
                                                                   "config": {"gate_init": 0.1}}}}
OBJECTIVE = {"type": "flow_matching", "config": {"shift": 3.0}}

#: The adapter checkpoint `workbench demo` trained with its defaults (and its metrics.json as
#: demo_metrics.json), shipped so notebooks can show the result without the fit:
#: ``AdapterExperiment.load(TRAINED_ADAPTER)``.
TRAINED_ADAPTER = Path(__file__).resolve().parent / "adapters" / "weights" / "metaworld_action"


@dataclasses.dataclass
class DemoConfig:
    """Budget and evaluation of the demo (``--quick`` shrinks every number)."""

    output: str = "outputs/demo"
    steps: int = 900
    batch_size: int = 8
    learning_rate: float = 2e-3
    eval_clips: int = 36
    sampling_steps: int = 20
    video_clips: int = 6
    seed: int = 0
    data: str = "sample"
    camera: str | None = None
    base_weights: str = "pretrained"
    adapter: dict = dataclasses.field(default_factory=lambda: copy.deepcopy(ADAPTER))
    composer: dict = dataclasses.field(default_factory=lambda: copy.deepcopy(COMPOSER))
    objective: dict | None = dataclasses.field(default_factory=lambda: copy.deepcopy(OBJECTIVE))

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        return cls(**{"steps": 10, "eval_clips": 4, "sampling_steps": 4, "video_clips": 2, **overrides})


def _batch(items: list[dict]) -> dict[str, Any]:
    import torch

    return {"video": torch.stack([it["video"] for it in items]), "action": torch.stack([it["action"] for it in items])}


def swap_partner(episodes: list[int]) -> list[int]:
    """For each clip, the index of a clip from another episode whose actions it borrows in (c).

    The partner is the next clip (cyclically) that belongs to a different episode, so every
    clip gets real, recorded actions that belong to someone else.
    """
    n = len(episodes)
    out = []
    for i in range(n):
        j = next((k % n for k in range(i + 1, i + n) if episodes[k % n] != episodes[i]), None)
        if j is None:
            raise DataError(f"Swapping actions needs clips from at least two episodes; all {n} clips come from "
                            f"episode {episodes[i]}. Evaluate on more episodes (e.g. the whole val split).")
        out.append(j)
    return out


def evaluate_world_model(exp, clips, *, sampling_steps: int, seed: int = 0, chunk: int = 12,
                         progress: bool = True) -> dict[str, Any]:
    """Predict every clip from its first frame: base alone, adapter + true actions, adapter + swapped.

    Returns the uint8 videos ``[N, T, H, W, 3]`` of the truth and of each variant, and per-clip
    PSNR, SSIM and moving-pixel PSNR (frames after the first; the same noise for every variant).
    """
    import torch
    from tqdm.auto import tqdm

    from workbench.metrics import moving_mask, per_clip, to_uint8_video

    items = [clips[i] for i in range(len(clips))]
    partner = swap_partner([it["episode"] for it in items])
    model = exp.model
    videos: dict[str, list[np.ndarray]] = {"truth": [], "base": [], "adapter": [], "swapped": []}
    bar = tqdm(total=3 * len(items), desc="evaluate", unit="clip", disable=not progress)
    for lo in range(0, len(items), chunk):
        part = items[lo:lo + chunk]
        raw = _batch(part)
        swapped = {**raw, "action": torch.stack([items[partner[lo + k]]["action"] for k in range(len(part))])}
        first = {"image": raw["video"][:, :, 0]}
        videos["truth"].append(to_uint8_video(raw["video"]))
        for name, cond, adapter in (("base", {**first, "action": raw["action"]}, False),
                                    ("adapter", {**first, "action": raw["action"]}, True),
                                    ("swapped", {**first, "action": swapped["action"]}, True)):
            model.adapter_enabled = adapter
            try:
                gen = torch.Generator(device=exp.device).manual_seed(seed * 7919 + lo)
                latents = model.generate(exp.prepare(cond), steps=sampling_steps, generator=gen)
            finally:
                model.adapter_enabled = True
            with torch.no_grad():
                videos[name].append(to_uint8_video(model.base.decode(latents)))
            bar.update(len(part))
    bar.close()
    out: dict[str, Any] = {k: np.concatenate(v) for k, v in videos.items()}
    truth = out["truth"]
    mask = moving_mask(truth)  # (N, T, H, W); frame 0 excluded
    scored = {}
    for name in ("base", "adapter", "swapped"):
        pred = out[name]
        scored[name] = {
            "psnr": per_clip("psnr", pred[:, 1:], truth[:, 1:]),
            "ssim": per_clip("ssim", pred[:, 1:], truth[:, 1:]),
            "moving_psnr": per_clip("psnr", pred, truth, mask=mask),
        }
    out["scores"] = scored
    out["moving_fraction"] = mask[:, 1:].mean(axis=(1, 2, 3))
    out["partner"] = partner
    out["items"] = [{"episode": it["episode"], "start": it["start"], "task": it["task"]} for it in items]
    return out


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers the demo reports (and the targets), from :func:`evaluate_world_model`'s result."""
    s = result["scores"]
    mean = {name: {k: float(np.nanmean(v)) for k, v in m.items()} for name, m in s.items()}
    b, c, a = s["adapter"]["moving_psnr"], s["swapped"]["moving_psnr"], s["base"]["moving_psnr"]
    valid = ~(np.isnan(b) | np.isnan(c))
    wins = float(np.mean(b[valid] > c[valid])) if valid.any() else float("nan")
    gain = float(np.nanmean(b - a))
    return {
        "mean": mean,
        "adapter_beats_swapped_fraction": wins,
        "adapter_minus_base_moving_psnr_db": gain,
        "adapter_minus_swapped_moving_psnr_db": float(np.nanmean(b - c)),
        "targets": {
            "adapter_beats_swapped_on_75pct_of_clips": bool(wins >= 0.75),
            "adapter_beats_base_by_1db_moving": bool(gain >= 1.0),
        },
        "clips": len(b),
        "mean_moving_fraction": float(np.mean(result["moving_fraction"])),
    }


def _loss_plot(path: Path, losses: list[float], title: str) -> None:
    from workbench.media import line_chart, save_image

    series = {"per step": losses}
    if len(losses) >= 20:
        k = max(5, len(losses) // 30)
        series[f"mean of {k} steps"] = np.convolve(losses, np.ones(k) / k, mode="valid").tolist()
    save_image(path, line_chart(series, title=title, xlabel="optimizer step",
                                ylabel="flow-matching loss (masked MSE)"))


def write_videos(out: Path, result: dict[str, Any], clips: int, fps: float) -> list[Path]:
    """The side-by-side grid (rows: clips, one per task; columns: truth | base | adapter | swapped) as MP4 and GIF."""
    from workbench.media import label_grid, write_video

    s = result["scores"]
    rows, labels = [], []
    for i in _one_per_task(result["items"], clips):
        rows.append([result[k][i] for k in ("truth", "base", "adapter", "swapped")])
        it = result["items"][i]
        labels.append(f"{it['task'].removesuffix('-v3')}\nep {it['episode']} t{it['start']}\n"
                      f"moving PSNR\nb {s['base']['moving_psnr'][i]:.1f}\na {s['adapter']['moving_psnr'][i]:.1f}\n"
                      f"s {s['swapped']['moving_psnr'][i]:.1f}")
    grid = label_grid(rows, row_labels=labels,
                      col_labels=["truth", "(a) base alone", "(b) adapter,\ntrue actions", "(c) adapter,\nswapped"],
                      scale=2)
    return [write_video(out / "side_by_side.mp4", grid, fps=fps), write_video(out / "side_by_side.gif", grid, fps=fps)]


def _one_per_task(items: list[dict], count: int) -> list[int]:
    """Up to ``count`` clip indices, the first of each task before any task repeats."""
    first, rest, seen = [], [], set()
    for i, it in enumerate(items):
        (rest if it["task"] in seen else first).append(i)
        seen.add(it["task"])
    return (first + rest)[:count]


def _table(summary: dict[str, Any], steps: int, seconds: float) -> str:
    m = summary["mean"]
    lines = [f"held-out clips: {summary['clips']} (moving pixels: {100 * summary['mean_moving_fraction']:.1f}% "
             f"of predicted frames); adapter trained {steps} steps in {seconds / 60:.1f} min",
             f"{'':32}{'PSNR':>8}{'SSIM':>8}{'moving PSNR':>13}"]
    for key, label in (("base", "(a) frozen base alone"), ("adapter", "(b) base + adapter, true actions"),
                       ("swapped", "(c) base + adapter, swapped")):
        lines.append(f"{label:32}{m[key]['psnr']:8.2f}{m[key]['ssim']:8.3f}{m[key]['moving_psnr']:13.2f}")
    t = summary["targets"]
    lines.append(f"(b) beats (c) on moving PSNR on {100 * summary['adapter_beats_swapped_fraction']:.0f}% of clips "
                 f"(target >= 75%: {'met' if t['adapter_beats_swapped_on_75pct_of_clips'] else 'NOT met'})")
    lines.append(f"(b) - (a) on moving PSNR: {summary['adapter_minus_base_moving_psnr_db']:+.2f} dB "
                 f"(target >= +1 dB: {'met' if t['adapter_beats_base_by_1db_moving'] else 'NOT met'})")
    return "\n".join(lines)


def _camera(cfg: DemoConfig) -> dict[str, str]:
    """The ``camera`` option of a LeRobot dataset, when one is chosen."""
    return {"camera": cfg.camera} if cfg.camera else {}


def build_experiment(cfg: DemoConfig, run_dir: Path):
    """The frozen pretrained base + the action adapter, as an :class:`AdapterExperiment`."""
    from workbench.backbones.tiny_video import TinyVideoConfig
    from workbench.data.sources import data_block, data_kind
    from workbench.train import AdapterExperiment
    from workbench.train.config import parse_experiment

    size = TinyVideoConfig().image_size
    adapter = copy.deepcopy(cfg.adapter)
    if data_kind(cfg.data) == "lerobot":  # the adapter reads the dataset's action vector, whatever its width
        from workbench.data.lerobot_format import LeRobotMeta

        meta = LeRobotMeta(cfg.data)
        if "action" in meta.features:
            adapter.setdefault("config", {}).setdefault("dim", meta.width("action"))
    config = parse_experiment({
        "name": "demo",
        "base": {"type": "tiny_video", "config": {"weights": cfg.base_weights}},
        "adapter": adapter,
        "composer": cfg.composer,
        "training": {"steps": cfg.steps, "learning_rate": cfg.learning_rate, "batch_size": cfg.batch_size,
                     "warmup_steps": min(50, max(1, cfg.steps // 10)), "schedule": "cosine", "min_lr_ratio": 0.1,
                     "cache_latents": True, "sync_every": 10, "seed": cfg.seed, "output_dir": str(run_dir)},
        "data": data_block(cfg.data, window=16, stride=4, split="train", size=(size, size), **_camera(cfg)),
        **({"objective": cfg.objective} if cfg.objective else {}),
    })
    return AdapterExperiment.from_config(config)


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict[str, Any]:
    import torch

    from workbench.data.sources import open_clips

    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    exp = build_experiment(cfg, out / "run")
    base = exp.model.base
    exp.fit(progress=progress)
    train_seconds = time.perf_counter() - started
    checkpoint = exp.save_checkpoint()
    size = (base.config.image_size, base.config.image_size)
    held_out = open_clips(cfg.data, window=base.config.frames, stride=base.config.frames, split="val", size=size,
                          **_camera(cfg))
    clips = torch.utils.data.Subset(held_out, list(range(min(cfg.eval_clips, len(held_out)))))
    result = evaluate_world_model(exp, clips, sampling_steps=cfg.sampling_steps, seed=cfg.seed, progress=progress)
    summary = summarise(result)
    fps = float(base.card.sampling.fps or 10)
    videos = write_videos(out, result, cfg.video_clips, fps=fps / 4)
    _loss_plot(out / "loss.png", exp.loss_history, f"action adapter on frozen tiny_video ({exp.step} steps)")
    s = result["scores"]
    metrics = {
        "summary": summary,
        "per_clip": {
            "items": result["items"],
            "swap_partner": result["partner"],
            "moving_fraction": result["moving_fraction"].round(5).tolist(),
            **{f"{variant}_{metric}": np.round(values, 4).tolist()
               for variant, ms in s.items() for metric, values in ms.items()},
        },
        "training": {"steps": exp.step, "seconds": round(train_seconds, 1), "batch_size": cfg.batch_size,
                     "learning_rate": cfg.learning_rate, "loss_history": [round(v, 6) for v in exp.loss_history],
                     "checkpoint": str(checkpoint), "gates": exp.model.composer.gate_values()},
        "evaluation": {"clips": len(clips), "sampling_steps": cfg.sampling_steps, "split": "val",
                       "data": cfg.data, "window": base.config.frames, "seed": cfg.seed,
                       "moving_threshold_uint8": 10.0},
        "adapter": cfg.adapter,
        "composer": cfg.composer,
        "objective": cfg.objective,
        "base": {"model_id": base.card.model_id, "trained_on": base.card.recipe.trained_on,
                 "train_steps": base.card.recipe.train_steps, "val_loss": base.card.recipe.val_loss},
        "files": [str(p.name) for p in (*videos, out / "loss.png")],
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    metrics["table"] = _table(summary, exp.step, train_seconds)
    return metrics


def run(args) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    overrides = {"output": args.output, "data": getattr(args, "data", "sample"),
                 "camera": getattr(args, "camera", None),
                 **({"steps": args.steps} if args.steps else {})}
    cfg = DemoConfig.quick(**overrides) if args.quick else DemoConfig(**overrides)
    metrics = run_demo(cfg)
    print()
    print(metrics["table"])
    print(f"wrote {cfg.output}/: side_by_side.mp4, side_by_side.gif, loss.png, metrics.json, run/ (adapter checkpoint)")
    return 0
