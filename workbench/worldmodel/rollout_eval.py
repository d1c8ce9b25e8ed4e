"""Rollout evaluation: ``workbench eval RUN_DIR --rollout [--data long --frames 144 --episodes 12]``.

Each held-out episode is predicted whole, chunk by chunk (:func:`workbench.inspect.rollout`): from
its first frame and its actions only, every later chunk from the last frame the model produced,
and the hand position the adapter's action path starts from read off that frame by the shipped
hand probe (``--rollout-state probe``) — or, as a ceiling that tells state estimation apart from drift,
the recorded position (``--rollout-state recorded``). Four ways, with the same noise:

* ``base``: the frozen base alone;
* ``adapter``: base + adapter with the episode's actions;
* ``swapped``: base + adapter with another episode's actions
  (:func:`~workbench.worldmodel.common.swap_partner`);
* ``scratch``: a from-scratch run (``--scratch RUN``, optional) with the episode's actions.

Scored per chunk on the frames it wrote: moving-pixel PSNR (pixels where the true frame differs
from the true frame the chunk started at) and the hand error (cm): the distance between the
hand position the probe reads off each predicted frame and the recorded one. The probe's own
error on the true frames is the floor. Writes ``rollout_metrics.json`` and ``drift.png``.

The long held-out episodes ship as ``workbench/data/samples/metaworld_long.h5`` (:data:`LONG_PATH`,
``--data long``), made with::

    workbench data metaworld \\
        --tasks reach-v3,push-v3,pick-place-v3,door-open-v3,drawer-close-v3,button-press-topdown-v3 \\
        --episodes 12 --frames 144 --size 64 --seed 3 --action-repeat 2 \\
        --out workbench/data/samples/metaworld_long.h5

the tasks, camera, size and frame rate of the shipped sample (seed 0), with a seed of its own (the
sample is seed 0, the probe's data seed 1, the unseen tasks seed 2), so no episode is one the
adapter or the probe was trained on: every episode is held out (``--split all``, the default here).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.backbone import max_generate_batch
from workbench.errors import DataError

#: Twelve 144-frame episodes of the six training tasks, their own seed (see the module docstring).
LONG_PATH = Path(__file__).resolve().parents[1] / "data" / "samples" / "metaworld_long.h5"
ROLLOUT_VARIANTS = ("base", "adapter", "swapped", "scratch")
ROLLOUT_LABELS = {"base": "frozen base alone", "adapter": "base + adapter",
                  "swapped": "adapter, swapped actions", "scratch": "from scratch"}


def long_episodes(path: str = "long", *, frames: int | None = None, episodes: int | None = None,
                  split: str = "all", size: tuple[int, int] | None = None, **options: Any) -> list[dict]:
    """Whole episodes (their first ``frames`` frames) of a Meta-World file or LeRobot dataset, as clip items
    ``{"video": (3, F, H, W), "action": (F, D), "ee_pos": (F, 3), "camera": (12,), "task", "episode"}``;
    ``episodes`` of them taken in turn from each task. ``"long"`` is :data:`LONG_PATH`."""
    import torch

    from workbench.worldmodel.common import clip_source, spread_over_tasks

    path = str(LONG_PATH) if path == "long" else path
    if frames is None:
        from workbench.data.sources import data_kind

        if data_kind(path) != "metaworld":
            raise DataError(f"--frames is needed for {path}: "
                            f"the number of frames of each episode to roll out.")
        import h5py

        with h5py.File(path, "r") as f:
            frames = int(f["frames"].shape[1])
    source = clip_source(path, window=int(frames), stride=int(frames), split=split, size=size, **options)
    if len(source) == 0:
        raise DataError(f"{path} ({split}) has no episode of {frames} frames. "
                        f"Roll out fewer frames (--frames), or choose another split (--split all).")
    n = len(source) if episodes is None else min(int(episodes), len(source))
    chosen = spread_over_tasks(source, n) if n < len(source) else list(range(len(source)))
    items = [source[i] for i in chosen]
    return [{k: (torch.as_tensor(v) if isinstance(v, np.ndarray) else v) for k, v in it.items()}
            for it in items]


def _batched(items: list[dict], keys: tuple[str, ...]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for key in keys:
        if key in items[0]:
            value = items[0][key]
            out[key] = [it[key] for it in items] if isinstance(value, str) else torch.stack(
                [torch.as_tensor(it[key]) for it in items])
    return out


def rollout_videos(model, items: list[dict], actions: list, *, with_adapter: bool, steps: int, seed: int,
                   state: str, gate_scale: float | None, batch: int,
                   on_batch=None) -> tuple[np.ndarray, list[list[range]]]:
    """Roll out every episode of ``items`` with ``actions`` (one ``(F, D)`` each), ``batch`` episodes at a
    time (at most the backbone's ``max_generate_batch``): uint8 ``[E, F, H, W, 3]`` and each chunk's
    frames."""
    import torch

    from workbench.inspect import rollout

    limit = max_generate_batch(model.base)
    batch = max(1, min(batch, limit) if limit else batch)
    videos, frames = [], None
    for lo in range(0, len(items), batch):
        part = items[lo:lo + batch]
        start = _batched(part, ("video", "ee_pos", "proprio", "camera", "task"))
        ro = rollout(model, start, torch.stack(actions[lo:lo + batch]), steps=steps, seed=seed + lo,
                     state=state, gate_scale=gate_scale if with_adapter else None,
                     with_adapter=with_adapter, store=False)
        videos.append(ro.video)
        frames = [c.frames for c in ro.chunks]
        if on_batch is not None:
            on_batch(len(part))
    return np.concatenate(videos), frames


def evaluate_rollouts(exp, items: list[dict], *, steps: int, seed: int = 0, state: str = "probe",
                      gate_scale: float | None = None, scratch=None, batch: int = 12, probe: Any = None,
                      progress: bool = True, variants: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Roll out every episode of ``items`` (from :func:`long_episodes`) the four ways and score each chunk.

    ``variants``: which of ``base``, ``adapter``, ``swapped``, ``scratch`` (default: the first three, and
    ``scratch`` when a from-scratch experiment is given).

    Returns ``truth`` and each variant's video (uint8 ``[E, F, H, W, 3]``), ``chunks`` (each chunk's frames),
    ``hand_error`` (per variant and ``truth``: ``[E, F]`` cm), ``per_chunk`` (per variant: ``moving_psnr`` and
    ``hand_error_cm``, ``[E, K]``; ``truth``: the probe's floor), ``partner``, ``items``.
    """
    from tqdm.auto import tqdm

    from workbench.metrics import moving_mask, per_clip, to_uint8_video
    from workbench.worldmodel.common import swap_partner
    from workbench.worldmodel.probe import hand_error_cm

    if not items:
        raise DataError("No episodes to roll out: the data has none. Choose another split, or more episodes.")
    if not all("ee_pos" in it for it in items):
        raise DataError("The rollout evaluation scores the hand error, "
                        "which needs the recorded hand position (ee_pos) of every episode; "
                        "these episodes carry none.")
    partner = swap_partner([int(it["episode"]) for it in items])
    own = [it["action"] for it in items]
    swapped = [items[p]["action"] for p in partner]
    runs = [("base", exp.model, False, own), ("adapter", exp.model, True, own),
            ("swapped", exp.model, True, swapped)]
    if scratch is not None:
        runs.append(("scratch", scratch.model, True, own))
    if variants is not None:
        unknown = [v for v in variants if v not in ROLLOUT_VARIANTS]
        if unknown or not variants:
            raise DataError(f"variants {list(variants)}: choose from {', '.join(ROLLOUT_VARIANTS)}.")
        if "scratch" in variants and scratch is None:
            raise DataError("The 'scratch' variant needs a from-scratch run: --scratch RUN_DIR.")
        runs = [r for r in runs if r[0] in variants]
    bar = tqdm(total=len(runs) * len(items), desc="rollouts", unit="episode", disable=not progress)
    import torch

    truth = to_uint8_video(torch.stack([it["video"] for it in items]))
    out: dict[str, Any] = {"truth": truth}
    chunks = None
    for name, model, with_adapter, actions in runs:
        out[name], chunks = rollout_videos(model, items, actions, with_adapter=with_adapter, steps=steps,
                                           seed=seed, state=state,
                                           gate_scale=gate_scale if name != "scratch" else None,
                                           batch=batch, on_batch=bar.update)
    bar.close()
    ee_pos = np.stack([np.asarray(it["ee_pos"], np.float64) for it in items])
    hand = {"truth": hand_error_cm(truth, ee_pos, probe)}
    per_chunk: dict[str, dict[str, np.ndarray]] = {"truth": {"hand_error_cm": np.stack(
        [hand["truth"][:, list(f)].mean(axis=1) for f in chunks], axis=1)}}
    for name, *_ in runs:
        pred = out[name]
        hand[name] = hand_error_cm(pred, ee_pos, probe)
        psnr, err = [], []
        for f in chunks:
            lo, hi = f.start, f.stop
            ref = truth[:, lo - 1]  # the true frame before the chunk's first written frame
            mask = moving_mask(truth[:, lo:hi], first_frame=ref)
            mask[:, 0] = np.abs(truth[:, lo].astype(int) - ref.astype(int)).max(axis=-1) > 10.0
            psnr.append(per_clip("psnr", pred[:, lo:hi], truth[:, lo:hi], mask=mask))
            err.append(hand[name][:, lo:hi].mean(axis=1))
        per_chunk[name] = {"moving_psnr": np.stack(psnr, axis=1), "hand_error_cm": np.stack(err, axis=1)}
    out.update(chunks=chunks, hand_error=hand, per_chunk=per_chunk, partner=partner,
               items=[{"episode": int(it["episode"]), "task": it["task"]} for it in items],
               variants=[name for name, *_ in runs])
    return out


def summarise_rollouts(result: dict[str, Any]) -> dict[str, Any]:
    """Per chunk, the means over episodes (NaN-aware) of each variant's numbers, JSON-ready."""
    chunks = result["chunks"]
    per = result["per_chunk"]
    rows = []
    with np.errstate(all="ignore"):
        for k, f in enumerate(chunks):
            row: dict[str, Any] = {"chunk": k, "frames": [f.start, f.stop - 1],
                                   "probe_floor_cm": float(np.nanmean(per["truth"]["hand_error_cm"][:, k]))}
            for name in result["variants"]:
                row[f"{name}_hand_error_cm"] = float(np.nanmean(per[name]["hand_error_cm"][:, k]))
                row[f"{name}_moving_psnr"] = float(np.nanmean(per[name]["moving_psnr"][:, k]))
            rows.append(row)
    out = {"episodes": len(result["items"]), "frames": int(result["truth"].shape[1]), "chunks": rows}
    if {"base", "adapter"} <= set(result["variants"]):
        first_base, last_adapter = rows[0]["base_hand_error_cm"], rows[-1]["adapter_hand_error_cm"]
        out.update(goal_last_adapter_below_first_base=bool(last_adapter < first_base),
                   last_chunk_adapter_cm=last_adapter, first_chunk_base_cm=first_base)
    return out


def format_rollout_table(summary: dict[str, Any], variants: list[str], title: str) -> str:
    """One row per chunk: hand error (cm) and moving PSNR (dB) of each variant, and the probe's floor."""
    short = {"base": "base", "adapter": "adapter", "swapped": "swapped", "scratch": "scratch"}
    err = "  ".join(f"{short[v]:>8}" for v in variants)
    lines = [f"{title}: {summary['episodes']} episodes of {summary['frames']} frames, per chunk",
             f"{'chunk':>5} {'frames':>9} | hand error cm: {err} {'probe':>6} | moving PSNR dB: {err}"]
    for row in summary["chunks"]:
        e = "  ".join(f"{row[f'{v}_hand_error_cm']:8.2f}" for v in variants)
        p = "  ".join(f"{row[f'{v}_moving_psnr']:8.2f}" for v in variants)
        lo, hi = row["frames"]
        lines.append(f"{row['chunk']:>5} {f'{lo}-{hi}':>9} |                "
                     f"{e} {row['probe_floor_cm']:6.2f} |"
                     f"                 {p}")
    if "goal_last_adapter_below_first_base" not in summary:
        return "\n".join(lines)
    ok = "below" if summary["goal_last_adapter_below_first_base"] else "NOT below"
    lines.append(f"adapter at the last chunk: {summary['last_chunk_adapter_cm']:.2f} cm, "
                 f"{ok} the frozen base at the first chunk ({summary['first_chunk_base_cm']:.2f} cm)")
    return "\n".join(lines)


def drift_plot(path: str | Path, summary: dict[str, Any], variants: list[str], title: str = "") -> Path:
    """Hand error and moving PSNR per chunk, one line per variant (matplotlib's object API, no pyplot)."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's) stays as it is

    rows = summary["chunks"]
    x = [r["chunk"] for r in rows]
    fig = Figure(figsize=(9, 3.4), dpi=100)
    left, right = fig.subplots(1, 2)
    for v in variants:
        left.plot(x, [r[f"{v}_hand_error_cm"] for r in rows], marker="o", label=ROLLOUT_LABELS[v])
        right.plot(x, [r[f"{v}_moving_psnr"] for r in rows], marker="o", label=ROLLOUT_LABELS[v])
    left.plot(x, [r["probe_floor_cm"] for r in rows], color="grey", linestyle=":",
              label="probe on true frames")
    if "base" in variants:
        left.axhline(rows[0]["base_hand_error_cm"], color="grey", linewidth=0.6, linestyle="--")
    left.set(xlabel="chunk", ylabel="hand error (cm)", title="hand error per chunk")
    right.set(xlabel="chunk", ylabel="moving-pixel PSNR (dB)", title="moving-pixel PSNR per chunk")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(*left.get_legend_handles_labels(), loc="lower center", ncol=len(variants) + 1, fontsize=7,
               frameon=False)
    path = Path(path)
    fig.savefig(path)
    return path


def run_rollout_eval(exp, args, *, scratch=None) -> dict[str, Any]:
    """``workbench eval RUN --rollout``: roll out, print the table, write ``rollout_metrics.json`` and
    ``drift.png``."""
    from workbench.worldmodel.common import data_options, json_safe

    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = args.data or "long"
    base = exp.model.base
    clip = base.clip()
    split = args.split or ("all" if data == "long" else "val")
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    options = data_options(exp, data, args) if data != "long" else {}
    items = long_episodes(data, frames=args.frames, episodes=args.episodes, split=split, size=clip.size,
                          **({"tasks": tasks} if tasks else {}),
                          **options)
    steps = args.sampling_steps or base.card.sampling.steps
    variants = tuple(v for v in args.variants.split(",") if v) if args.variants else None
    result = evaluate_rollouts(exp, items, steps=steps, seed=args.seed, state=args.rollout_state,
                               gate_scale=args.gate_scale, scratch=scratch, progress=not args.no_progress,
                               variants=variants)
    summary = summarise_rollouts(result)
    name = Path(str(LONG_PATH if data == "long" else data)).name
    title = f"{name} ({split}), {steps} steps, state={args.rollout_state}" + (
        f", gate x{args.gate_scale:g}" if args.gate_scale else "")
    table = format_rollout_table(summary, result["variants"], title)
    drift_plot(out / "drift.png", summary, result["variants"], title)
    metrics = {"summary": summary,
               "per_episode": {f"{v}_{m}": np.round(result["per_chunk"][v][m], 4).tolist()
                               for v in result["variants"] for m in ("hand_error_cm", "moving_psnr")},
               "items": result["items"], "swap_partner": result["partner"],
               "evaluation": {"data": name, "split": split, "episodes": len(items),
                              "frames": summary["frames"],
                              "sampling_steps": steps, "seed": args.seed, "state": args.rollout_state,
                              "gate_scale": args.gate_scale, "run": str(args.run_dir), "step": exp.step,
                              "scratch": str(args.scratch) if scratch is not None else None,
                              "window": clip.frames, "context_frames": base.card.context_frames},
               "seconds": round(time.perf_counter() - started, 1)}
    (out / "rollout_metrics.json").write_text(json.dumps(json_safe(metrics), indent=1))
    return {**metrics, "result": result, "table": table}


__all__ = ["LONG_PATH", "drift_plot", "evaluate_rollouts", "format_rollout_table", "long_episodes",
           "rollout_videos", "run_rollout_eval", "summarise_rollouts"]
