"""World-model evaluation: ``workbench eval RUN_DIR --data FILE.h5|sample --out DIR``.

Every clip is predicted from its first frame with the base's own sampler and the same noise for

* (a) the frozen base alone,
* (b) base + adapter with the clip's own actions,
* (c) base + adapter with the actions of a clip from another episode
  (:func:`~workbench.worldmodel.common.swap_partner`) —
  or, for an adapter that reads a control video (``condition="control"``, ``--control edges``),
  with that clip's control video instead,

and scored on the predicted frames (frame 0 is given): PSNR, SSIM, PSNR on the moving pixels
(where the true future differs from the first frame), and the **action error** — the distance
between the hand position a probe reads off each predicted frame and the recorded one, in cm
(:func:`workbench.worldmodel.probe.hand_error_cm`), also as a ratio to the probe's own error on the true
frames. Results come overall and per task.

Clips come from a **clip source**: any map-style dataset (``len`` and ``[i]``) whose items are:

```text
{"video": float [3, T, H, W] in [-1, 1], "action": float [T, A],
 "episode": int, "start": int, "task": str, "ee_pos": float [T, 3] (optional, metres)}
```

:class:`~workbench.data.metaworld.MetaWorldClips` is one
(:func:`~workbench.worldmodel.common.clip_source` builds it with the checks ``eval`` needs);
another reader that yields the same items plugs into :func:`evaluate_world_model` /
:func:`evaluate_run` unchanged. Without ``ee_pos`` the action error is reported as missing (NaN).

Example:
    ```python
    from workbench import AdapterExperiment
    from workbench.worldmodel.common import clip_source
    from workbench.worldmodel.evaluate import evaluate_run
    exp = AdapterExperiment.load("outputs/demo/run")
    report = evaluate_run(exp, clip_source("sample", window=16, split="val"), out="outputs/eval", clips=12)
    print(report["table"])
    ```
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.composers import scaled_gate
from workbench.errors import DataError
from workbench.worldmodel.common import (
    action_error_scorable,
    check_signals,
    clip_source,
    data_options,
    json_safe,
    load_run,
    run_data,
    spread_over_tasks,
    swap_partner,
)

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from workbench.train.experiment import AdapterExperiment

VARIANTS = ("base", "adapter", "swapped")
LABELS = {"base": "(a) frozen base alone", "adapter": "(b) base + adapter, true actions",
          "swapped": "(c) base + adapter, swapped"}
#: The conditions a clip may carry that the predictions are made with (the swapped one is ``condition``).
CONDITION_KEYS = ("action", "control", "ee_pos", "proprio", "camera")
#: Of those, the robot's measured state: a prediction knows it at the given first frame only, so every
#: frame of it carries the first frame's value (nothing of the future leaks into a prediction).
STATE_KEYS = ("ee_pos", "proprio")


def labels_for(condition: str) -> dict[str, str]:
    """The variant labels when ``condition`` is the one swapped in (c)."""
    if condition == "action":
        return dict(LABELS)
    return {**LABELS, "adapter": f"(b) base + adapter, true {condition}",
            "swapped": f"(c) adapter, swapped {condition}"}


#: What `workbench demo` aims for on held-out episodes of the training tasks, and on unseen tasks.
TARGETS = {"seen": {"gain_db": 2.5, "wins": 0.95, "action_ratio": 0.36, "action_cm": 3.5},
           "unseen": {"gain_db": 2.0, "wins": 0.90, "action_ratio": None}}


def from_first_frame(raw: dict[str, Any]) -> dict[str, Any]:
    """What a prediction of the collated clips ``raw`` is made from: the first frame (``image``), the actions,
    and what is known at the first frame of the rest — the robot's measured state (every frame holding the
    first frame's value) and the camera's calibration. Nothing of a later frame goes in."""
    import torch

    request = {"image": raw["video"][:, :, 0], "action": raw["action"]}
    for key in STATE_KEYS:
        if key in raw:
            value = torch.as_tensor(raw[key])
            request[key] = value[:, :1].expand_as(value).contiguous()
    if "camera" in raw:
        request["camera"] = raw["camera"]
    return request


def check_clip_size(base, shape: tuple[int, ...]) -> None:
    """Clips of ``shape`` ``(T, H, W)`` are the clip the backbone predicts (its ``clip()``),
    or a DataError."""
    clip = base.clip()
    want = (clip.frames, clip.height, clip.width)
    if tuple(shape) != want:
        raise DataError(f"Clips have {shape[0]} frames of {shape[1]}x{shape[2]}, "
                        f"but {type(base).__name__} predicts clips of {clip.frames} frames "
                        f"of {clip.height}x{clip.width} (its clip(), from its card's sampling defaults); "
                        f"build the clip source with window={clip.frames} and size=({clip.height}, "
                        f"{clip.width}), or build the backbone for clips of that size.")


def _stack(items: list[dict], key: str):
    import torch

    return torch.stack([it[key] for it in items])


def evaluate_world_model(exp: AdapterExperiment, clips: Dataset, *, sampling_steps: int, seed: int = 0,
                         chunk: int = 12, progress: bool = True, probe: Any = None,
                         gate_scale: float | None = None, condition: str = "action",
                         predict: Any = None) -> dict[str, Any]:
    """Predict every clip of ``clips`` (a clip source) three ways and score them.

    Args:
        exp: The :class:`~workbench.AdapterExperiment` to evaluate.
        clips: The clip source.
        sampling_steps: Sampling steps.
        seed: The seed the predictions' noise derives from.
        chunk: Clips per ``generate`` call.
        progress: Show a progress bar.
        probe: The hand probe scoring the action error (default: the shipped one).
        gate_scale: Sample (b) and (c) with the adapter's learned gate times this (:func:`scaled_gate`).
        condition: The clip key swapped in (c) (``action``, or ``control`` for a control video); every
            key of :data:`CONDITION_KEYS` the clips carry is given to all three, true except that one
            (the state keys as measured at the first frame, see :data:`STATE_KEYS`).
        predict: What predicts the three variants' clips instead of one
            :func:`~workbench.inspect.recording.clips.predict_clips` call each, given
            ``(model, {name: (clips, with_adapter)}, steps=, seed=, chunk=, gate=, on_chunk=)``
            (:meth:`workbench.train.ahead.BaseAhead.predict`: the chunks shared by two processes, the
            same videos).

    Returns:
        Uint8 videos ``[N, T, H, W, 3]`` (``truth`` and each variant), ``scores`` (per clip and variant:
        ``psnr``, ``ssim``, ``moving_psnr``, ``action_error`` in cm), ``hand_error`` (per variant and for
        ``truth``: the probe's distance to the recorded position per frame, ``[N, T]`` cm),
        ``moving_fraction``, ``partner`` and the clips' ``items``.
    """
    import torch
    from tqdm.auto import tqdm

    from workbench.inspect.recording.clips import predict_clips
    from workbench.metrics import moving_mask, per_clip, to_uint8_video
    from workbench.worldmodel.probe import hand_error_cm

    items = [clips[i] for i in range(len(clips))]
    if not items:
        raise DataError("No clips to evaluate: the clip source is empty. "
                        "Choose another split, more tasks, or --clips >= 1.")
    check_clip_size(exp.model.base, tuple(items[0]["video"].shape[1:]))
    if condition not in items[0]:
        raise DataError(f"The clips carry no {condition!r} to swap in (c); they hold {sorted(items[0])}. "
                        f"Evaluate an adapter that reads {condition!r} on clips that carry it "
                        f"(a control video: --control edges), or swap the actions.")
    given = [k for k in CONDITION_KEYS if k in items[0]]
    partner = swap_partner([it["episode"] for it in items])
    model = exp.model
    gate = None if gate_scale is None else scaled_gate(model.composer, gate_scale)

    def clip(it: dict, conditions_from: dict) -> dict:
        """What clip ``it`` is predicted from: its video, the conditions (state keys at the first frame),
        its text."""
        out = {"video": it["video"], **{k: v for k, v in it.items() if isinstance(v, str)}}
        for key in given:
            value = torch.as_tensor(conditions_from[key])
            out[key] = value[:1].expand_as(value).contiguous() if key in STATE_KEYS else value
        return out

    true = [clip(it, it) for it in items]
    swapped = [{**clip(it, it), condition: clip(items[partner[i]], items[partner[i]])[condition]}
               for i, it in enumerate(items)]
    bar = tqdm(total=3 * len(items), desc="evaluate", unit="clip", disable=not progress)
    out: dict[str, Any] = {"truth": np.concatenate([to_uint8_video(_stack(items[lo:lo + chunk], "video"))
                                                    for lo in range(0, len(items), chunk)])}
    requests = {"base": (true, False), "adapter": (true, True), "swapped": (swapped, True)}
    if predict is not None:
        out.update(predict(model, requests, steps=sampling_steps, seed=seed, chunk=chunk, gate=gate,
                           on_chunk=bar.update))
    for name, (clips_of, with_adapter) in requests.items():
        if name not in out:
            out[name] = predict_clips(model, clips_of, steps=sampling_steps, seed=seed, chunk=chunk,
                                      with_adapter=with_adapter, gate=gate, on_chunk=bar.update)
    bar.close()
    truth = out["truth"]
    mask = moving_mask(truth)  # (N, T, H, W); frame 0 excluded
    scorable = action_error_scorable(items, truth, probe)
    has_pos = scorable is None
    ee_pos = np.stack([np.asarray(it["ee_pos"], np.float64) for it in items]) if has_pos else None
    nan = np.full(truth.shape[:2], np.nan)
    out["action_error_note"] = scorable
    out["hand_error"] = {"truth": hand_error_cm(truth, ee_pos, probe) if has_pos else nan}
    scored = {}
    for name in VARIANTS:
        pred = out[name]
        out["hand_error"][name] = hand_error_cm(pred, ee_pos, probe) if has_pos else nan
        scored[name] = {
            "psnr": per_clip("psnr", pred[:, 1:], truth[:, 1:]),
            "ssim": per_clip("ssim", pred[:, 1:], truth[:, 1:]),
            "moving_psnr": per_clip("psnr", pred, truth, mask=mask),
            "action_error": out["hand_error"][name][:, 1:].mean(axis=1),
        }
    out["scores"] = scored
    out["probe_error"] = out["hand_error"]["truth"][:, 1:].mean(axis=1)
    out["moving_fraction"] = mask[:, 1:].mean(axis=(1, 2, 3))
    out["partner"] = partner
    out["items"] = [{"episode": it["episode"], "start": it["start"], "task": it["task"]} for it in items]
    return out


def _aggregate(scores: dict[str, dict[str, np.ndarray]], probe_error: np.ndarray, idx: np.ndarray,
               targets: dict[str, Any] | None) -> dict[str, Any]:
    """Means, wins and gains over the clips ``idx``."""
    with np.errstate(all="ignore"):
        mean = {v: {k: float(np.nanmean(m[k][idx])) if np.isfinite(m[k][idx]).any() else float("nan")
                    for k in m} for v, m in scores.items()}
        b, c, a = (scores[v]["moving_psnr"][idx] for v in ("adapter", "swapped", "base"))
        valid = ~(np.isnan(b) | np.isnan(c))
        wins = float(np.mean(b[valid] > c[valid])) if valid.any() else float("nan")
        gain = float(np.nanmean(b - a)) if np.isfinite(b - a).any() else float("nan")
        floor = float(np.nanmean(probe_error[idx])) if np.isfinite(probe_error[idx]).any() else float("nan")
    errs = {v: mean[v]["action_error"] for v in VARIANTS}
    out = {
        "clips": int(len(idx)),
        "mean": mean,
        "adapter_beats_swapped_fraction": wins,
        "adapter_minus_base_moving_psnr_db": gain,
        "adapter_minus_swapped_moving_psnr_db": float(np.nanmean(b - c)) if valid.any() else float("nan"),
        "probe_error_on_truth_cm": floor,
        "action_error_ratio_to_probe": {v: errs[v] / floor for v in VARIANTS},
        "action_error_adapter_over_base": errs["adapter"] / errs["base"],
    }
    if targets is not None:
        out["targets"] = {
            f"adapter_beats_base_by_{targets['gain_db']:g}db_moving": bool(gain >= targets["gain_db"]),
            f"adapter_beats_swapped_on_{100 * targets['wins']:.0f}pct_of_clips":
                bool(wins >= targets["wins"]),
            **({f"action_error_at_most_{targets['action_ratio']:g}x_base":
                bool(out["action_error_adapter_over_base"] <= targets["action_ratio"])}
               if targets.get("action_ratio") is not None else {}),
            **({f"action_error_at_most_{targets['action_cm']:g}cm":
                bool(errs["adapter"] <= targets["action_cm"])}
               if targets.get("action_cm") is not None else {}),
        }
    return out


def summarise(result: dict[str, Any], targets: dict[str, Any] | None = None) -> dict[str, Any]:
    """The numbers the table reports, overall (top level) and per task (``per_task``)."""
    s = result["scores"]
    n = len(s["base"]["moving_psnr"])
    floor = result.get("probe_error", np.full(n, np.nan))
    for m in s.values():  # a result may lack the action error (a hand-built one): NaN, not a KeyError
        m.setdefault("action_error", np.full(n, np.nan))
    summary = _aggregate(s, floor, np.arange(n), targets)
    summary["mean_moving_fraction"] = float(np.mean(result["moving_fraction"]))
    tasks = [it["task"] for it in result.get("items", [])]
    summary["per_task"] = {task: _aggregate(s, floor, np.flatnonzero(np.array(tasks) == task), None)
                           for task in sorted(set(tasks))}
    if result.get("action_error_note"):
        summary["action_error_note"] = result["action_error_note"]
    return summary


def format_table(summary: dict[str, Any], title: str, labels: dict[str, str] | None = None) -> str:
    """The overall table (one row per variant) and one line per task."""
    labels = labels or LABELS
    m = summary["mean"]
    ratio = summary["action_error_ratio_to_probe"]
    lines = [f"{title}: {summary['clips']} clips "
             f"(moving pixels: {100 * summary['mean_moving_fraction']:.1f}% of predicted frames)",
             f"{'':34}{'PSNR':>7}{'SSIM':>7}{'moving PSNR':>13}{'action err cm':>15}{'/ probe':>9}"]
    for key in VARIANTS:
        lines.append(f"{labels[key]:34}{m[key]['psnr']:7.2f}{m[key]['ssim']:7.3f}"
                     f"{m[key]['moving_psnr']:13.2f}{m[key]['action_error']:15.2f}{ratio[key]:9.2f}")
    lines.append(f"{'    probe on the true frames':34}{'':27}"
                 f"{summary['probe_error_on_truth_cm']:15.2f}{1:9.2f}")
    if summary.get("action_error_note"):
        lines.append(f"action error {summary['action_error_note']} (the columns above show nan)")
    lines.append(f"(b) beats (c) on moving PSNR on "
                 f"{100 * summary['adapter_beats_swapped_fraction']:.0f}% of clips; "
                 f"(b) - (a): {summary['adapter_minus_base_moving_psnr_db']:+.2f} dB moving PSNR; "
                 f"action error (b)/(a) = {summary['action_error_adapter_over_base']:.2f}")
    for name, ok in summary.get("targets", {}).items():
        lines.append(f"  target {name}: {'met' if ok else 'NOT met'}")
    if len(summary["per_task"]) > 1:
        lines.append(f"{'per task':26}{'clips':>6}{'moving PSNR a / b / c':>24}"
                     f"{'action err cm a / b / c':>26}{'(b)>(c)':>9}")
        for task, t in summary["per_task"].items():
            mp = " / ".join(f"{t['mean'][v]['moving_psnr']:.1f}" for v in VARIANTS)
            ae = " / ".join(f"{t['mean'][v]['action_error']:.1f}" for v in VARIANTS)
            lines.append(f"  {task:24}{t['clips']:6}{mp:>24}{ae:>26}"
                         f"{100 * t['adapter_beats_swapped_fraction']:8.0f}%")
    return "\n".join(lines)


def _one_per_task(items: list[dict], count: int) -> list[int]:
    """Up to ``count`` clip indices, the first of each task before any task repeats."""
    first, rest, seen = [], [], set()
    for i, it in enumerate(items):
        (rest if it["task"] in seen else first).append(i)
        seen.add(it["task"])
    return (first + rest)[:count]


def write_videos(out: Path, result: dict[str, Any], clips: int, fps: float, name: str = "side_by_side",
                 condition: str = "action") -> list[Path]:
    """The side-by-side grid (rows: clips, one per task; columns: truth | base | adapter | swapped)
    as MP4 and GIF."""
    from workbench.media import label_grid, write_video

    s = result["scores"]
    rows, labels = [], []
    for i in _one_per_task(result["items"], clips):
        rows.append([result[k][i] for k in ("truth", *VARIANTS)])
        it = result["items"][i]
        labels.append(f"{it['task'].removesuffix('-v3')}\nep {it['episode']} t{it['start']}\n"
                      f"moving PSNR\na {s['base']['moving_psnr'][i]:.1f}\n"
                      f"b {s['adapter']['moving_psnr'][i]:.1f}\n"
                      f"c {s['swapped']['moving_psnr'][i]:.1f}")
    true = "actions" if condition == "action" else condition
    grid = label_grid(rows, row_labels=labels,
                      col_labels=["truth", "(a) base alone", f"(b) adapter,\ntrue {true}",
                                  "(c) adapter,\nswapped"],
                      scale=2)
    return [write_video(out / f"{name}.mp4", grid, fps=fps), write_video(out / f"{name}.gif", grid, fps=fps)]


def per_clip_record(result: dict[str, Any]) -> dict[str, Any]:
    """Every per-clip number of a result, JSON-ready."""
    return {
        "items": result["items"],
        "swap_partner": result["partner"],
        "moving_fraction": np.round(result["moving_fraction"], 5).tolist(),
        "probe_error_on_truth_cm": np.round(result["probe_error"], 4).tolist(),
        **{f"{variant}_{metric}": np.round(values, 4).tolist()
           for variant, ms in result["scores"].items() for metric, values in ms.items()},
    }


def evaluate_run(exp: AdapterExperiment, source: Dataset, *, out: str | Path, clips: int | None = None,
                 sampling_steps: int | None = None, seed: int = 0, video_clips: int = 6,
                 progress: bool = True, title: str = "evaluation",
                 targets: dict[str, Any] | None = None, describe: dict[str, Any] | None = None,
                 labels: dict[str, str] | None = None, gate_scale: float | None = None,
                 condition: str = "action", predict: Any = None) -> dict[str, Any]:
    """Evaluate ``exp`` on ``clips`` clips of ``source`` (all by default) spread over its tasks (see
    :func:`~workbench.worldmodel.common.spread_over_tasks`); write ``metrics.json`` and the videos.

    Args:
        exp: The :class:`~workbench.AdapterExperiment` to evaluate.
        source: The clip source (:func:`~workbench.worldmodel.common.clip_source`).
        out: The directory ``metrics.json`` and the videos are written to (made if missing).
        clips: How many clips to evaluate (default: all).
        sampling_steps: Sampling steps (default: the card's).
        seed: The seed the predictions' noise derives from.
        video_clips: How many clips get a side-by-side video.
        progress: Show a progress bar.
        title: The table's title.
        targets: The targets the summary is judged against (``gain_db``, ``wins``, ``action_ratio``), or
            None to judge nothing.
        describe: Entries added to ``metrics.json``'s ``evaluation`` record.
        labels: The table's row labels (default: those for ``condition``).
        gate_scale: Sample with the adapter's learned gate times this.
        condition: What (c) swaps: ``action``, or ``control`` for a control video.
        predict: Who predicts the clips (see :func:`evaluate_world_model`).

    Returns:
        What ``metrics.json`` holds (``summary``, ``per_clip``, ``evaluation``, ``files``, ``seconds``),
        plus the full ``result`` of :func:`evaluate_world_model` and the printed ``table``.
    """
    import torch

    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = len(source) if clips is None else min(int(clips), len(source))
    subset = torch.utils.data.Subset(source, spread_over_tasks(source, n)) if n < len(source) else source
    base = exp.model.base
    steps = sampling_steps or base.card.sampling.steps
    result = evaluate_world_model(exp, subset, sampling_steps=steps, seed=seed, progress=progress,
                                  gate_scale=gate_scale, condition=condition, predict=predict)
    summary = summarise(result, targets)
    fps = float(base.clip().fps or 10)
    videos = write_videos(out, result, video_clips, fps=fps / 4, condition=condition)
    metrics = {"summary": summary, "per_clip": per_clip_record(result),
               "evaluation": {"clips": n, "sampling_steps": steps, "seed": seed,
                              "moving_threshold_uint8": 10.0, "gate_scale": gate_scale, "swapped": condition,
                              "probe": "workbench.worldmodel.probe (shipped)", **(describe or {})},
               "files": [p.name for p in videos], "seconds": round(time.perf_counter() - started, 1)}
    (out / "metrics.json").write_text(json.dumps(json_safe(metrics), indent=1))
    return {**metrics, "result": result,
            "table": format_table(summary, title, labels or labels_for(condition))}


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="a run directory with adapter checkpoints (or one step-* checkpoint)")
    parser.add_argument("--data",
                        help="a LeRobot dataset directory (v2.1 / v3.0), a Meta-World .h5 file, 'sample' "
                             "(the shipped sample) or 'unseen' (the shipped unseen-task file); "
                             "default: the data the run was trained on")
    parser.add_argument("--split", choices=("val", "train", "all"),
                        help="episodes to evaluate (default: val; with --rollout on the long sample: all, "
                             "every episode of it is held out)")
    parser.add_argument("--tasks", help="comma-separated task names (default: every task in the file)")
    parser.add_argument("--clips", type=int,
                        help="evaluate N clips, taken in turn from each task (default: all)")
    parser.add_argument("--stride", type=int, help="frames between clip starts in an episode (default: the "
                                                   "model's window: non-overlapping clips)")
    parser.add_argument("--sampling-steps", "--steps", type=int,
                        help="sampler steps (default: the base's card; 8 with --policies)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (default: %(default)s)")
    parser.add_argument("--gate-scale", type=float, help="sample with the adapter's learned gate times this "
                                                         "(default: the learned gate)")
    parser.add_argument("--control",
                        help="give each clip a control video derived from its frames (edges) and swap "
                             "it, not the actions, in (c): for an adapter that reads one")
    parser.add_argument("--rollout", action="store_true",
                        help="roll whole episodes out chunk by chunk "
                             "(each chunk from the last frame the model produced) "
                             "and report per chunk for the base, the adapter, swapped actions "
                             "(and --scratch): moving PSNR, and the hand error where the hand probe "
                             "reads the episodes (Meta-World's); writes rollout_metrics.json and drift.png. "
                             "--data defaults to the run's own data (its val split), or for a run trained on "
                             "the shipped sample to the shipped long episodes ('long')")
    parser.add_argument("--frames", type=int,
                        help="--rollout: frames of each episode to roll out (default: all of them); "
                             "--policies: frames of each episode (default: 61, four chunks)")
    parser.add_argument("--episodes", type=int,
                        help="--rollout: episodes to roll out, taken in turn from each task (default: all); "
                             "--policies: start states per task (default: 8 fresh ones, or all recorded)")
    from workbench.worldmodel.rollout_eval import ROLLOUT_STATES

    parser.add_argument("--rollout-state", default="auto", choices=ROLLOUT_STATES,
                        help="--rollout: the state an adapter reads at each chunk's first frame: probe (the "
                             "hand probe reads it off the last produced frame), start (the state recorded at "
                             "the episode's first frame, held), recorded (the recorded one at each chunk: a "
                             "ceiling, not a world model) or none; auto: probe for an adapter that reads the "
                             "hand position of Meta-World frames, start for one that reads a recorded state "
                             "(observation.state), else none (default: %(default)s)")
    parser.add_argument("--scratch",
                        help="--rollout, --policies: a from-scratch run directory to evaluate as well")
    parser.add_argument("--variants",
                        help="--rollout: comma-separated, of base, adapter, swapped, scratch "
                             "(default: base,adapter,swapped, and scratch with --scratch); "
                             "--policies: of base, adapter, scratch")
    parser.add_argument("--out", help="output directory (metrics.json, side_by_side.mp4/.gif; "
                                      "with --rollout: rollout_metrics.json, drift.png; "
                                      "with --policies: policy_ranking.json, optional)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    from workbench.train.options import add_data_arguments

    add_data_arguments(parser, dim=False)
    policies = parser.add_argument_group(
        "policies (--policies; see workbench.worldmodel.closed_loop_eval and workbench.worldmodel.policies)")
    policies.add_argument("--policies", action="store_true",
                          help="run policies closed loop in the world model (base alone, base + adapter) "
                               "and in the simulator, from the same start states under the same decision "
                               "rule; report success rate and final distance per policy, imagined against "
                               "simulated, and the Spearman rank correlation across them")
    policies.add_argument("--policy", action="append", metavar="SPEC",
                          help="--policies: a policy of your own, MODULE:NAME or FILE.py:NAME (a callable "
                               "of a workbench.inspect.recording.closed_loop.Observation), evaluated "
                               "beside the shipped family; repeat for several")
    policies.add_argument("--no-family", action="store_true",
                          help="--policies: leave out the shipped family (expert, expert+noise, random)")
    policies.add_argument("--start-states", metavar="SOURCE",
                          help="--policies: 'fresh' (default: made by the simulator from --start-seed), "
                               "'recording' (the shipped recording's) or a recording .npz")
    policies.add_argument("--start-seed", type=int, default=1,
                          help="--policies: the seed of fresh start states (default: %(default)s; the "
                               "shipped recording's are seed 0)")
    policies.add_argument("--batch", type=int, default=16,
                          help="--policies: episodes per rollout call (default: %(default)s)")
    policies.add_argument("--processes", type=int, default=1,
                          help="--policies: spread the episodes over N processes of one thread each, with "
                               "the numbers of one process (default: %(default)s; under torchrun the ranks "
                               "spread them)")
    policies.add_argument("--no-sim", action="store_true",
                          help="--policies: imagination only (no simulator run: no ranking)")
    policies.add_argument("--open-loop", action="store_true",
                          help="--policies: replay the recorded policies' actions open loop instead "
                               "(--policy-data), as rollouts from the recording's start states")
    policies.add_argument("--policy-data", help="--open-loop: a recording of `python -m "
                                                "workbench.worldmodel.policies` (default: the shipped one)")


def _again(args) -> str:
    """The eval command line after the run directory (for advice that repeats it)."""
    import shlex

    from workbench.train.options import DataOptions

    parts = [*(["--data", str(args.data)] if args.data else []),
             *(["--out", str(args.out)] if args.out else [])]
    for flag in ("split", "tasks", "clips", "stride", "sampling_steps", "seed", "gate_scale", "control"):
        value = getattr(args, flag, None)
        if (value is not None and not (flag == "split" and value == "val")
                and not (flag == "seed" and value == 0)):
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    parts += DataOptions.from_args(args).flags()
    return " ".join(shlex.quote(p) for p in parts)


def run(args) -> int:
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if getattr(args, "policies", False):
        if getattr(args, "open_loop", False):
            if args.policy:
                raise DataError(f"--open-loop replays recorded actions, and your policy {args.policy[0]!r} "
                                f"has none; drop --open-loop to run it closed loop.")
            from workbench.worldmodel.policies import run_eval

            return run_eval(args, load_run(args.run_dir))
        from workbench.worldmodel.closed_loop_eval import run_closed_loop_eval

        return run_closed_loop_eval(args)
    if not args.out:
        raise DataError("workbench eval needs --out DIR (where metrics.json and the videos go), e.g. "
                        f"`workbench eval {args.run_dir} --out outputs/eval`; "
                        f"only --policies runs without it.")
    exp = load_run(args.run_dir, again=_again(args))
    if getattr(args, "rollout", False):
        from workbench.worldmodel.rollout_eval import run_rollout_eval

        scratch = load_run(args.scratch) if args.scratch else None
        report = run_rollout_eval(exp, args, scratch=scratch)
        print(report["table"])
        print(f"wrote {args.out}/: rollout_metrics.json, drift.png")
        return 0
    args.split = args.split or "val"
    data = args.data or run_data(exp)
    base = exp.model.base
    clip = base.clip()  # the clip the backbone predicts: its frames and size
    window = clip.frames
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    source = clip_source(data, window=window, split=args.split, tasks=tasks, stride=args.stride,
                         size=clip.size, control=getattr(args, "control", None),
                         **data_options(exp, data, args))
    check_signals(exp, source, data)
    name = Path(str(getattr(source, "path", None) or source.root)).name
    report = evaluate_run(exp, source, out=args.out, clips=args.clips, sampling_steps=args.sampling_steps,
                          seed=args.seed, progress=not args.no_progress, gate_scale=args.gate_scale,
                          condition="control" if getattr(args, "control", None) else "action",
                          title=f"{name} ({args.split})",
                          describe={"data": name, "split": args.split, "tasks": tasks,
                                    "window": window, "stride": source.config.stride,
                                    "run": str(args.run_dir), "step": exp.step})
    print(report["table"])
    print(f"wrote {args.out}/: metrics.json, side_by_side.mp4, side_by_side.gif")
    return 0
