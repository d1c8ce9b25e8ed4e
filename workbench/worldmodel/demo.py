"""``workbench demo``: turn the frozen, pretrained ``tiny_video`` into an action-conditioned world model.

1. load the frozen base (pretrained on Meta-World clips *without* actions) and the shipped sample;
2. train an action adapter (``latent_residual`` reading the actions, their running sum,
   action-driven warps of the first frame and the **action path**: where the actions take the
   hand from its measured position at the first frame, drawn into every frame with the camera's
   calibration; gated onto the base at high noise only) on the sample's training episodes, with
   the frozen encoder run once per clip (cached latents);
3. on held-out episodes, predict every clip from its first frame with the base's own sampler
   and the same noise for (a) the frozen base alone, (b) base + adapter with the true actions,
   (c) base + adapter with the actions of another clip; score PSNR / SSIM overall and on the
   pixels that move (where the true future differs from the first frame), and the action error
   (where a hand-position probe finds the arm in the predicted frames vs where it was);
4. the same on clips of six tasks never seen in pretraining or training (``unseen/``);
5. write ``OUT/side_by_side.mp4`` / ``.gif`` (truth | base | adapter | swapped actions),
   ``OUT/loss.png``, ``OUT/metrics.json`` (every number) and the adapter checkpoint;
6. print the tables (:mod:`workbench.worldmodel.evaluate` does steps 3-5 for any checkpoint), and the
   targets' table with the previous, actions-only adapter's stored numbers beside this run's.

``workbench demo --quick`` runs the same path on a reduced budget (for CI);
``workbench demo --from-scratch`` trains the baseline at equal compute instead of the adapter.
``workbench demo --data PATH`` trains and evaluates on other rollouts: an HDF5 file of ``workbench
data metaworld`` or a LeRobot dataset directory (frames resized to the base's size; the adapter
reads its ``action``; without a camera calibration or the hand position ``observation.ee_pos`` it reads
the actions without the path); the unseen-task step runs for Meta-World data only.
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

from workbench.worldmodel.common import json_safe

#: What the demo trains, as the blocks a YAML config would hold. The adapter reads the actions and
#: their running sum (the displacement since the first frame), pixel coordinates, two copies of
#: the first frame translated by action-driven displacements, and the action path (the hand's path
#: the actions imply from its measured position at the first frame, projected with the camera's
#: calibration; see :mod:`workbench.adapters.path`). The action decides the outcome at high noise,
#: so the adapter acts only there (NoiseGated) and training draws mostly high noise levels (timestep
#: shift 3); below a noise level of 0.3 the frozen base finishes alone.
ADAPTER = {"type": "latent_residual",
           "config": {"width": 32, "depth": 2, "cumulative": True, "coords": True, "warps": 2,
                      "path": {"scale": 0.02, "response": 0.25, "sigma": 1.0}}}
#: The actions-only adapter (``ADAPTER`` without ``path``), the baseline the action path is compared with.
ACTIONS_ONLY_ADAPTER = {"type": "latent_residual",
                        "config": {"width": 32, "depth": 2, "cumulative": True, "coords": True, "warps": 2}}
COMPOSER = {"type": "noise_gated",
            "config": {"lo": 0.3, "hi": 1.0, "ramp": 0.1, "inner": {"type": "gated_residual",
                                                                   "config": {"gate_init": 0.1}}}}
OBJECTIVE = {"type": "flow_matching", "config": {"shift": 3.0}}

#: The from-scratch baseline (``workbench demo --from-scratch``): the actions-only network replaces
#: the base's prediction instead of correcting it, so the frozen pretrained denoiser plays no part
#: (the frozen autoencoder still maps frames to latents and back). Its input of the base's output is
#: swapped for a third warp of the first frame, which keeps the trainable parameter count equal to
#: the actions-only adapter's (+ its composer's gate) within 17 parameters; it reads no action path.
SCRATCH_ADAPTER = {"type": "latent_residual",
                   "config": {**ACTIONS_ONLY_ADAPTER["config"], "use_base_output": False, "warps": 3}}
SCRATCH_COMPOSER = {"type": "replace", "config": {}}
SCRATCH_LABELS = {"base": "(a) frozen base alone", "adapter": "(d) from scratch, true actions",
                  "swapped": "(e) from scratch, swapped"}
UNSEEN_NAME = "metaworld_unseen.h5"
#: What the world summary's closed loops import beyond the demo's command (the ``data`` extra's modules): the
#: scripted experts of Meta-World (and what its MuJoCo environments import). Nothing is simulated or rendered:
#: the simulator's outcomes are a shipped record.
WORLD_NEEDS = ("metaworld", "mujoco", "packaging")

#: The adapter checkpoint `workbench demo` trained with its defaults (and its metrics.json as
#: demo_metrics.json), shipped so notebooks can show the result without the fit:
#: ``AdapterExperiment.load(TRAINED_ADAPTER)``.
TRAINED_ADAPTER = Path(__file__).resolve().parent / "weights" / "metaworld_action"
#: The same adapter trained against drift (``workbench train examples/configs/metaworld_drift.yaml``:
#: the shipped adapter's run with ``training.context: {source: self_forwarded, p: 0.5, steps: 2}``), the
#: world model notebook 9 drives; docs/results/training-against-drift.md compares the two.
DRIFT_ADAPTER = Path(__file__).resolve().parent / "weights" / "metaworld_drift"
#: The from-scratch baseline ``workbench demo --from-scratch`` trained at the shipped adapter's budget
#: (600 steps, learning rate 4e-3, the same clips and seed), shipped so rollouts and the policy ranking
#: can compare with it; its metrics.json is demo_metrics.json there.
SCRATCH_MODEL = TRAINED_ADAPTER.parent / "metaworld_scratch"
#: What that run measured: the demo prints its rows for reference instead of spending another training
#: run on it.
SCRATCH_REFERENCE = SCRATCH_MODEL / "demo_metrics.json"
#: What the demo measured with ``ACTIONS_ONLY_ADAPTER`` (900 steps at learning rate 2e-3): the
#: metrics.json of that run, kept for the comparison.
ACTIONS_ONLY_REFERENCE = TRAINED_ADAPTER / "actions_only_metrics.json"


def scratch_reference_rows(cfg: DemoConfig) -> str:
    """The stored from-scratch rows for the demo's table, when they were evaluated on ``cfg``'s clips."""
    if cfg.from_scratch or not SCRATCH_REFERENCE.is_file():
        return ""
    ref = json.loads(SCRATCH_REFERENCE.read_text())
    if ref["evaluation"]["clips"] != cfg.eval_clips:
        return ""
    s = ref["summary"]
    rows = [f"from scratch, {ref['training']['steps']} steps "
            f"(the parameter count of the actions-only adapter; no pretrained denoiser), "
            f"stored, not rerun: `{ref['command']}`"]
    for key, label in (("adapter", "(d) from scratch, true actions"),
                       ("swapped", "(e) from scratch, swapped")):
        m = s["mean"][key]
        rows.append(f"{label:34}{m['psnr']:7.2f}{m['ssim']:7.3f}{m['moving_psnr']:13.2f}"
                    f"{m['action_error']:15.2f}{s['action_error_ratio_to_probe'][key]:9.2f}")
    rows.append(f"(d) - (a): {s['adapter_minus_base_moving_psnr_db']:+.2f} dB moving PSNR; (d) beats (e) on "
                f"{100 * s['adapter_beats_swapped_fraction']:.0f}% of clips; action error (d)/(a) = "
                f"{s['action_error_adapter_over_base']:.2f}")
    return "\n".join(rows)


@dataclasses.dataclass
class DemoConfig:
    """Budget and evaluation of the demo (``--quick`` shrinks every number).

    Attributes:
        output: The directory the run, the evaluation and the chart are written to.
        steps: Training steps.
        batch_size: Clips per training step.
        learning_rate: The adapter's learning rate.
        eval_clips: Held-out clips of the training tasks evaluated.
        sampling_steps: Sampling steps of the evaluation.
        video_clips: Clips that get a side-by-side video.
        unseen_clips: Clips of the tasks never seen in pretraining or training evaluated (Meta-World
            data only; 0 skips them).
        gate_scale: (b) and (c) are sampled with the adapter's learned gate times this (None: as learned);
            it trains nothing (:func:`workbench.core.composers.scaled_gate`).
        seed: The seed of training and evaluation.
        data: The data: ``"sample"`` (the shipped Meta-World sample), a Meta-World ``.h5`` file or a
            LeRobot dataset directory.
        camera: A LeRobot dataset's video feature.
        actions: A LeRobot dataset's feature served as the actions.
        state: A LeRobot dataset's feature served as the proprio state.
        action_dim: The adapter's action width, for data whose actions are not Meta-World's 4.
        from_scratch: Train the from-scratch baseline (same parameters, clips, steps; no pretrained
            denoiser).
        base_weights: The tiny_video backbone's ``weights`` (``"pretrained"``: the shipped ones).
        adapter: The adapter's ``{type, config}`` block.
        composer: The composer's ``{type, config}`` block.
        objective: The objective's ``{type, config}`` block (None: the backbone's default).
        control: Every clip also carries a control video derived from its frames (``edges``), and (c)
            swaps it instead of the actions, for an adapter that reads it (a ``controlnet`` with
            ``video: true``).
        processes: 2 trains and evaluates on two processes of one thread each (``workbench demo``'s
            default), with the same results as 1: the second runs the frozen base's half of every
            training step ahead and predicts half the evaluation's chunks (:mod:`workbench.train.ahead`).
        world: Then roll the trained world model out over a few whole held-out episodes and rank the
            recorded policies in it (:func:`workbench.worldmodel.imagination.world_summary`; on the
            shipped sample only), and end with the first table
            (:func:`workbench.worldmodel.summary.first_table`).
        world_quick: Run that at the reduced size of :meth:`WorldSummaryConfig.quick
            <workbench.worldmodel.imagination.WorldSummaryConfig.quick>`.
    """

    output: str = "outputs/demo"
    steps: int = 600
    batch_size: int = 8
    learning_rate: float = 4e-3
    eval_clips: int = 36
    sampling_steps: int = 20
    video_clips: int = 6
    unseen_clips: int = 12
    gate_scale: float | None = 2.0
    seed: int = 0
    data: str = "sample"
    camera: str | None = None
    actions: str | None = None
    state: str | None = None
    action_dim: int | None = None
    from_scratch: bool = False
    base_weights: str = "pretrained"
    adapter: dict = dataclasses.field(default_factory=lambda: copy.deepcopy(ADAPTER))
    composer: dict = dataclasses.field(default_factory=lambda: copy.deepcopy(COMPOSER))
    objective: dict | None = dataclasses.field(default_factory=lambda: copy.deepcopy(OBJECTIVE))
    control: str | None = None
    processes: int = 1
    world: bool = True
    world_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        return cls(**{"steps": 10, "batch_size": 2, "eval_clips": 4, "unseen_clips": 4, "sampling_steps": 2,
                      "video_clips": 2, "world_quick": True, **overrides})

    def __post_init__(self):
        if self.processes not in (1, 2):
            from workbench.errors import ConfigError

            raise ConfigError(f"processes must be 1 or 2 (one trains the adapter; a second runs the frozen "
                              f"base a step ahead and predicts half the clips), got {self.processes!r}. "
                              f"Use --processes 2 on a machine with two cores or more, 1 otherwise.")
        if self.from_scratch:  # the same-size model alone, at every noise level, no pretrained denoiser
            self.adapter = copy.deepcopy(SCRATCH_ADAPTER)
            self.composer = copy.deepcopy(SCRATCH_COMPOSER)
            self.gate_scale = None  # no gate to scale


def loss_plot(path: Path, losses: list[float], title: str) -> Path:
    """The training loss per step and its running mean, drawn with matplotlib, as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's) stays as it is

    fig = Figure(figsize=(7.2, 4.0), dpi=100)
    ax = fig.subplots()
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, color="#9ecae1", linewidth=0.8, label="per step")
    if len(losses) >= 20:
        k = max(5, len(losses) // 30)
        ax.plot(steps[k - 1:], np.convolve(losses, np.ones(k) / k, mode="valid"), color="#d62728",
                linewidth=1.8, label=f"mean of {k} steps")
    ax.set(title=title, xlabel="optimizer step", ylabel="flow-matching loss (masked MSE)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    return path


def _camera(cfg: DemoConfig) -> dict[str, str]:
    """The options of a LeRobot dataset chosen on the command line (camera, actions, state)."""
    from workbench.train.options import DataOptions

    return DataOptions(camera=cfg.camera, actions=cfg.actions, state=cfg.state).dataset()


def build_experiment(cfg: DemoConfig, run_dir: Path):
    """The frozen pretrained base + the action adapter, as an :class:`AdapterExperiment`."""
    import torch

    from workbench.config import build
    from workbench.data.sources import data_block, data_kind
    from workbench.train import AdapterExperiment
    from workbench.train.config import parse_experiment

    base = {"type": "tiny_video", "config": {"weights": cfg.base_weights}}
    with torch.random.fork_rng(devices=[]):  # (its random init draws nothing from the run's generator)
        # the clip it predicts
        clip = build("backbone", base["type"], {**base["config"], "device": "cpu"}).clip()
    adapter = copy.deepcopy(cfg.adapter)
    options = {}
    if cfg.action_dim is not None:
        adapter.setdefault("config", {})["dim"] = cfg.action_dim
    if _camera(cfg) and data_kind(cfg.data) != "lerobot":
        from workbench.errors import DataError

        raise DataError(f"{', '.join('--' + k for k in _camera(cfg))}: {cfg.data} is a Meta-World file, "
                        f"whose actions and state its schema fixes; "
                        f"these options choose the features of a LeRobot dataset. Leave them out.")
    if data_kind(cfg.data) == "lerobot":  # the adapter reads the dataset's action vector, whatever its width
        from workbench.data.lerobot import LeRobotClips

        clips = LeRobotClips(root=cfg.data, window=2, split="all", **_camera(cfg))
        meta = clips.meta
        if "action" in clips.signals:  # the adapter reads the chosen action feature, at its width
            adapter.setdefault("config", {}).setdefault("dim", clips.widths()["action"])
        if "observation.ee_pos" in meta.features:  # the Meta-World writer's hand position
            options["ee_pos"] = "observation.ee_pos"
        config = adapter.setdefault("config", {})
        if config.get("path") is not None and (clips.calibration is None or "ee_pos" not in options):
            missing = ("camera calibration" if clips.calibration is None
                       else "hand position (observation.ee_pos)")
            print(f"{cfg.data} records no {missing}, "
                  f"so the adapter reads the actions without the action path")
            config.pop("path")
    config = parse_experiment({
        "name": "demo",
        "base": base,
        "adapter": adapter,
        "composer": cfg.composer,
        "training": {"steps": cfg.steps, "learning_rate": cfg.learning_rate, "batch_size": cfg.batch_size,
                     "warmup_steps": min(50, max(1, cfg.steps // 10)), "schedule": "cosine",
                     "min_lr_ratio": 0.1, "cache_latents": True, "sync_every": 10, "seed": cfg.seed,
                     "output_dir": str(run_dir)},
        "data": data_block(cfg.data, window=clip.frames, stride=4, split="train", size=clip.size,
                           **_camera(cfg), **options,
                           **({"control": cfg.control} if cfg.control else {})),
        **({"objective": cfg.objective} if cfg.objective else {}),
    })
    return AdapterExperiment.from_config(config)


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict[str, Any]:
    """Train the demo's adapter, evaluate it and write everything under ``cfg.output`` (``workbench demo``).

    Args:
        cfg: The demo's budget and evaluation.
        progress: Show progress bars.

    Returns:
        The run's metrics: the held-out evaluation's (and ``unseen`` when it ran), with what the world
        summary added.

    Raises:
        MissingExtraError: Before any work, when the ``data`` or ``widgets`` extra the demo needs is missing
            (Meta-World too, for the world summary's closed loops).
    """
    from workbench.extras import require_all

    # before any work: the chart at the end needs matplotlib, the videos imageio, the world summary's closed
    # loops the scripted experts of Meta-World
    world = WORLD_NEEDS if _looks_past_one_window(cfg) else ()
    require_all({"data": ("imageio", "imageio_ffmpeg", "PIL", *world), "widgets": ("matplotlib",)},
                what="the demo")
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    exp = build_experiment(cfg, out / "run")
    ahead = None
    if cfg.processes == 2:  # the frozen base's half of each step in a second process, a step ahead
        from workbench.train.ahead import BaseAhead

        ahead = BaseAhead(exp.resolved_config(), steps=max(0, exp.training.steps - exp.step), start=exp.step)
    try:
        metrics = _train_and_evaluate(cfg, exp, ahead, out, started, progress)
    finally:
        if ahead is not None:
            ahead.close()
    if _looks_past_one_window(cfg) and not exp.interrupted:
        _look_past_one_window(cfg, metrics, out, started, progress)
    return metrics


def _looks_past_one_window(cfg: DemoConfig) -> bool:
    """Whether the demo ends with the world summary: on the shipped sample, for the adapter."""
    return cfg.world and cfg.data == "sample" and not cfg.from_scratch


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies inside it (a clone's), else as it is."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _look_past_one_window(cfg: DemoConfig, metrics: dict[str, Any], out: Path, started: float,
                          progress: bool) -> None:
    """Rollouts and the policy ranking with the trained run, then the first table (in ``metrics``)."""
    from workbench.worldmodel.common import json_safe
    from workbench.worldmodel.imagination import WorldSummaryConfig, world_summary
    from workbench.worldmodel.summary import first_table

    settings = WorldSummaryConfig.quick() if cfg.world_quick else WorldSummaryConfig()
    if progress:
        print(f"rolling out {settings.rollout_episodes} held-out episodes "
              f"of {settings.rollout_frames} frames and ranking the recorded policies "
              f"in the world model ({cfg.processes} process"
              f"{'es' if cfg.processes > 1 else ''})", flush=True)
    world = world_summary(metrics["training"]["checkpoint"],
                          scratch_dir=SCRATCH_MODEL if SCRATCH_MODEL.is_dir() else None, cfg=settings,
                          processes=cfg.processes)
    scratch = json.loads(SCRATCH_REFERENCE.read_text()) if SCRATCH_REFERENCE.is_file() else None
    if scratch is not None and scratch["evaluation"]["clips"] != cfg.eval_clips:
        scratch = None  # scored on other clips: nothing to compare with
    ceiling = TRAINED_ADAPTER / "measured_path_metrics.json"
    ceiling = json.loads(ceiling.read_text()) if ceiling.is_file() and scratch is not None else None
    r, p, c = world["rollout"], world["policies"], world["closed_loop"]
    notes = [f"rollout: {r['episodes']} held-out episodes of {r['frames']} frames, "
             f"{settings.sampling_steps} sampling steps, each chunk from the last frame the model made; "
             f"the whole study: workbench eval {out / 'run'} --rollout",
             f"policy ranking, open loop: {len(p['policies'])} policies x {p['starts']} start states "
             f"x {len(p['tasks'])} tasks, recorded actions replayed, imagined vs simulated outcome; "
             f"with the from-scratch run: workbench eval {out / 'run'} --policies --open-loop "
             f"--scratch {_shown(SCRATCH_MODEL)}",
             f"policy ranking, closed loop: the same {len(c['policies'])} policies x "
             f"{c['start_states']['per_task']} start states x {len(c['tasks'])} tasks, each chunk's actions "
             f"chosen from the last frame the model made, against the simulator's record "
             f"({c['simulated']['record']}); the whole study, from fresh start states: "
             f"workbench eval {out / 'run'} --policies --scratch {_shown(SCRATCH_MODEL)}"]
    if scratch is not None:
        notes.append(f"from scratch and measured path: stored runs, not rerun ({SCRATCH_MODEL.name}, "
                     f"{ceiling and 'measured_path_metrics.json'}); "
                     f"the rollout's from-scratch column is rerun")
    metrics["world"] = world
    metrics["seconds"] = round(time.perf_counter() - started, 1)
    table = first_table(metrics, scratch=scratch, ceiling=ceiling, rollout=r, policies=p, closed_loop=c,
                        notes=notes)
    metrics["first_table"] = table
    metrics["table"] = metrics["table"] + "\n\n" + table
    (out / "metrics.json").write_text(json.dumps(json_safe({k: v for k, v in metrics.items()
                                                            if k != "table"}),
                                                indent=1))


def _train_and_evaluate(cfg: DemoConfig, exp, ahead, out: Path, started: float,
                        progress: bool) -> dict[str, Any]:
    from workbench.data.sources import data_kind
    from workbench.worldmodel.common import clip_source
    from workbench.worldmodel.evaluate import TARGETS, evaluate_run

    base = exp.model.base
    t = exp.training
    exp.fit(ahead.stream(batch_size=t.batch_size, seed=t.seed) if ahead is not None else None,
            progress=progress)
    train_seconds = time.perf_counter() - started
    checkpoint = exp.save_checkpoint()
    predict = None
    if ahead is not None and not exp.interrupted:  # (an interrupted fit leaves batches computed ahead unread)
        ahead.load_weights(exp.model.trainable_state_dict())
        predict = ahead.predict
    elif ahead is not None:
        ahead.close()
    clip = base.clip()  # the clip the backbone predicts: its frames and size
    window = clip.frames
    labels = SCRATCH_LABELS if cfg.from_scratch else None
    common = dict(sampling_steps=cfg.sampling_steps, seed=cfg.seed, video_clips=cfg.video_clips,
                  progress=progress, labels=labels, gate_scale=cfg.gate_scale,
                  condition="control" if cfg.control else "action", predict=predict)
    held_out = clip_source(cfg.data, window=window, split="val", size=clip.size, control=cfg.control,
                           **_camera(cfg))
    shipped = cfg.data == "sample"  # the targets are set for the shipped sample
    seen = evaluate_run(exp, held_out, out=out, clips=cfg.eval_clips,
                        title="held-out episodes, training tasks",
                        targets=TARGETS["seen"] if shipped else None,
                        describe={"data": cfg.data, "split": "val", "window": window}, **common)
    unseen = None
    if cfg.unseen_clips and data_kind(cfg.data) == "metaworld":  # Meta-World's action space
        # the first window of each of its 12 episodes (two per task)
        source = clip_source("unseen", window=window, split="all", stride=10**6, control=cfg.control)
        unseen = evaluate_run(exp, source, out=out / "unseen", clips=cfg.unseen_clips,
                              targets=TARGETS["unseen"], title="tasks never seen in pretraining or training",
                              describe={"data": UNSEEN_NAME, "split": "all", "window": window,
                                        "clips_per_episode": 1}, **common)
    loss_plot(out / "loss.png", exp.loss_history, f"action adapter on frozen tiny_video ({exp.step} steps)")
    trainable = sum(p.numel() for p in exp.model.parameters() if p.requires_grad)
    metrics = {
        "summary": seen["summary"],
        "per_clip": seen["per_clip"],
        **({"unseen": {k: unseen[k] for k in ("summary", "per_clip", "evaluation")}} if unseen else {}),
        "training": {"steps": exp.step, "seconds": round(train_seconds, 1), "batch_size": cfg.batch_size,
                     "learning_rate": cfg.learning_rate,
                     "loss_history": [round(v, 6) for v in exp.loss_history],
                     "checkpoint": str(checkpoint), "gates": exp.model.composer.gate_values(),
                     "trainable_parameters": trainable, "from_scratch": cfg.from_scratch,
                     "gate_scale_at_sampling": cfg.gate_scale, "processes": cfg.processes},
        "evaluation": seen["evaluation"],
        "adapter": cfg.adapter,
        "composer": cfg.composer,
        "objective": cfg.objective,
        "base": {"model_id": base.card.model_id, "trained_on": base.card.recipe.trained_on,
                 "train_steps": base.card.recipe.train_steps, "val_loss": base.card.recipe.val_loss},
        "files": [*seen["files"], *(f"unseen/{f}" for f in (unseen["files"] if unseen else [])), "loss.png"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out / "metrics.json").write_text(json.dumps(json_safe(metrics), indent=1))
    head = (f"{'from-scratch model' if cfg.from_scratch else 'action adapter'} "
            f"({trainable} trainable parameters) trained {exp.step} steps in {train_seconds / 60:.1f} min; "
            f"total {metrics['seconds'] / 60:.1f} min"
            + (f"; (b) and (c) sampled with the learned gate x{cfg.gate_scale:g}" if cfg.gate_scale else ""))
    reference = scratch_reference_rows(cfg)
    metrics["table"] = "\n\n".join([head, seen["table"] + ("\n" + reference if reference else ""),
                                     *([unseen["table"]] if unseen else [])])
    return metrics


def wrote(output: str, metrics: dict[str, Any]) -> str:
    """The line saying what a demo run wrote: its files as listed in ``metrics`` (``unseen/`` only when
    the unseen-task step ran)."""
    written = dict.fromkeys(f.split("/")[0] + ("/" if "/" in f else "") for f in metrics["files"])
    return f"wrote {output}/: {', '.join([*written, 'metrics.json', 'run/ (checkpoint)'])}"


def run(args) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    overrides = {"output": args.output, "data": getattr(args, "data", "sample"),
                 **{k: getattr(args, k, None) for k in ("camera", "actions", "state", "action_dim")},
                 **({"steps": args.steps} if args.steps else {}),
                 "from_scratch": bool(getattr(args, "from_scratch", False)),
                 "processes": getattr(args, "processes", 1)}
    cfg = DemoConfig.quick(**overrides) if args.quick else DemoConfig(**overrides)
    metrics = run_demo(cfg)
    print()
    print(metrics["table"])
    print(wrote(cfg.output, metrics))
    return 0
