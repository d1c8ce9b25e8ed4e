"""Rollout evaluation: ``workbench eval RUN_DIR --rollout [--data DATA --frames N --episodes E]``.

Each held-out episode is predicted whole, chunk by chunk (:func:`workbench.inspect.rollout`): from
its first frame and its actions only, every later chunk from the last frame the model produced.
Four ways, with the same noise:

* ``base``: the frozen base alone;
* ``adapter``: base + adapter with the episode's actions;
* ``swapped``: base + adapter with another episode's actions
  (:func:`~workbench.worldmodel.common.swap_partner`);
* ``scratch``: a from-scratch run (``--scratch RUN``, optional) with the episode's actions.

The episodes are the run's own held-out ones (its data's validation split) unless ``--data`` names
others; a run trained on the shipped Meta-World sample rolls out the long held-out episodes below.
Each episode is rolled out whole (``--frames N``: its first N frames); a LeRobot dataset's episodes
may differ in length.

A state the adapter reads at each chunk's first frame (``--rollout-state``, :func:`rollout_state`)
comes, by default, from the shipped hand probe (``probe``) where the adapter reads the hand position
and the probe can read the frames; from the state the episode records at its first frame, held
(``start``), where the adapter reads a recorded state such as a LeRobot ``observation.state``; and
is none where the adapter reads no state. ``recorded`` (the recorded state at each chunk's first
frame) is a ceiling that tells state estimation apart from drift.

Scored per chunk on the frames it wrote, whatever the data: moving-pixel PSNR (pixels where the true
frame differs from the true frame the chunk started at). Where the hand probe can score them (the
episodes record the hand position ``ee_pos`` and their frames are the probe's), also the hand error
(cm): the distance between the hand position the probe reads off each predicted frame and the
recorded one, with the probe's own error on the true frames as the floor. Writes
``rollout_metrics.json`` and ``drift.png``.

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
#: The values of ``--rollout-state`` (see :func:`rollout_state`).
ROLLOUT_STATES = ("auto", "probe", "start", "recorded", "none")
#: The per-frame states an episode may record (what the clip sources serve), besides its actions.
STATE_KEYS = ("ee_pos", "proprio")


def long_episodes(path: str = "long", *, frames: int | None = None, episodes: int | None = None,
                  split: str = "all", size: tuple[int, int] | None = None, exp: Any = None,
                  **options: Any) -> list[dict]:
    """Whole episodes (or their first ``frames`` frames) of a Meta-World file or a LeRobot dataset, as clip
    items ``{"video": (3, F, H, W), "action": (F, D), "task", "episode", "start": 0}`` with what the data
    records besides (``ee_pos`` ``(F, 3)``, ``proprio`` ``(F, S)``, ``camera`` ``(12,)``); ``episodes`` of
    them taken in turn from each task. ``"long"`` is :data:`LONG_PATH`. A LeRobot dataset's episodes may
    differ in length: each item is as long as its episode. ``options`` go into a LeRobot dataset's config
    (:func:`~workbench.worldmodel.common.clip_source`). ``exp``: the run that will roll them out; the signals
    its adapter reads are checked against what the data serves before any episode is read.
    """
    from workbench.data.metaworld import sample_path
    from workbench.data.sources import data_kind
    from workbench.worldmodel.common import UNSEEN_PATH, clip_source, spread_over_tasks

    path = str({"long": LONG_PATH, "unseen": UNSEEN_PATH, "sample": sample_path()}.get(path, path))
    name = Path(path).name
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, (int, np.integer))
                               or frames < 2):
        raise DataError(f"--frames {frames}: a rollout predicts the frames after the first, so it needs at "
                        f"least 2 frames of each episode. Give --frames 2 or more, "
                        f"or leave it out to roll out each episode whole.")
    lerobot = data_kind(path) == "lerobot"
    if lerobot:  # one 2-frame window per episode: the split's episodes and their tasks, nothing decoded yet
        source = clip_source(path, window=2, stride=2**31, split=split, size=size, drop_short=True, **options)
    else:  # a Meta-World file: every episode has the file's length
        import h5py

        with h5py.File(path, "r") as f:
            length = int(f["frames"].shape[1])
        if frames is not None and frames > length:
            raise DataError(f"--frames {frames}: the episodes of {name} have {length} frames. "
                            f"Roll out at most {length} (--frames {length}), "
                            f"or leave --frames out to roll out each episode whole.")
        window = length if frames is None else int(frames)
        source = clip_source(path, window=window, stride=length, split=split, size=size, **options)
    if len(source) == 0:
        raise DataError(f"{name} ({split}) has no episode to roll out. "
                        f"Choose another split (--split all) or other data (--data).")
    if exp is not None:
        from workbench.worldmodel.common import check_signals

        check_signals(exp, source, path)
    n = len(source) if episodes is None else min(int(episodes), len(source))
    chosen = spread_over_tasks(source, n) if n < len(source) else list(range(len(source)))
    if not lerobot:
        import torch

        return [{k: (torch.as_tensor(v) if isinstance(v, np.ndarray) else v) for k, v in source[i].items()}
                for i in chosen]
    positions = [source.index[i][0] for i in chosen]
    if frames is not None:
        lengths = {source.meta.episodes[e].index: source.served_length(e) for e in positions}
        short = {ep: length for ep, length in lengths.items() if length < frames}
        if short:
            ep, length = next(iter(short.items()))
            shortest = min(lengths.values())
            more = (f", and {len(short) - 1} more of its {len(lengths)} episodes have fewer than {frames}"
                    if len(short) > 1 else "")
            raise DataError(f"--frames {frames}: episode {ep} of {name} ({split}) has {length} frames{more}. "
                            f"Roll out at most {shortest} frames "
                            f"(--frames {shortest}: the shortest episode), "
                            f"or leave --frames out to roll out each episode whole.")
    return [source.episode(e, frames) for e in positions]


def rollout_state(model, items: list[dict], state: str = "auto", probe: Any = None) -> str | None:
    """The ``state=`` of :func:`workbench.inspect.rollout` that ``--rollout-state STATE`` means for rolling
    ``items`` out with ``model`` (a :class:`~workbench.ComposedModel`).

    ``auto``: ``"probe"`` (the hand probe reads the hand position off the frames the model produced) where the
    adapter reads ``ee_pos``, the episodes record it and the probe can read their frames; else ``"start"``
    (the state recorded at the episode's first frame, for every chunk) where the adapter reads a state the
    episodes record (``proprio``: a LeRobot dataset's ``observation.state``); else None. ``none`` is None;
    ``probe``, ``start`` and ``recorded`` are themselves (``probe`` needs frames the probe reads; ``none``
    an adapter that needs no state the episodes record).
    """
    from workbench.worldmodel.probe import shipped_probe

    if state not in ROLLOUT_STATES:
        raise DataError(f"--rollout-state {state!r}: choose from {', '.join(ROLLOUT_STATES)}.")
    reads = {key for c in model.adapter.consumes for key in c.keys}
    recorded = {key for key in STATE_KEYS if all(key in it for it in items)}
    if state == "none":
        needed = sorted({key for c in model.adapter.consumes if c.required for key in c.keys} & recorded)
        if needed:
            raise DataError(f"--rollout-state none: the run's adapter reads {needed[0]!r} at each chunk's "
                            f"first frame, which the episodes record, so every chunk needs one. "
                            f"Use --rollout-state start (the state recorded at each episode's first frame, "
                            f"held) or recorded (the recorded state at every chunk's first frame: "
                            f"a ceiling).")
        return None
    size = (probe or shipped_probe()).image_size
    h, w = items[0]["video"].shape[-2:]
    readable = (h, w) == (size, size)
    if state == "probe" and not readable:
        raise DataError(f"--rollout-state probe: the hand probe reads {size}x{size} frames of the Meta-World "
                        f"camera, these episodes have {h}x{w} frames. Use --rollout-state start "
                        f"(the state recorded at each episode's first frame, held) or none.")
    if state != "auto":
        return state
    if "ee_pos" in reads and "ee_pos" in recorded and readable:
        return "probe"
    return "start" if reads & recorded else None


def _held(values, frames: int):
    """Per-frame ``values`` ``(L, D)`` as ``frames`` rows: cut, or holding the last row."""
    import torch

    values = torch.as_tensor(values)
    if len(values) >= frames:
        return values[:frames]
    return torch.cat([values, values[-1:].expand(frames - len(values), *values.shape[1:])])


def _start_batch(items: list[dict], frames: int, context: int) -> dict[str, Any]:
    """What a rollout of ``items`` starts from: their first ``context`` frames, per-frame states held to
    ``frames`` rows, the camera and the task."""
    import torch

    out: dict[str, Any] = {"video": torch.stack([it["video"][:, :context] for it in items])}
    for key in STATE_KEYS:
        if key in items[0]:
            out[key] = torch.stack([_held(it[key], frames) for it in items])
    if "camera" in items[0]:
        out["camera"] = torch.stack([torch.as_tensor(it["camera"]) for it in items])
    if "task" in items[0]:
        out["task"] = [it["task"] for it in items]
    return out


def rollout_videos(model, items: list[dict], actions: list, *, with_adapter: bool, steps: int, seed: int,
                   state: str | None, gate_scale: float | None, batch: int,
                   on_batch=None) -> tuple[np.ndarray, list[range]]:
    """Roll out every episode of ``items`` with ``actions`` (one ``(F_i, D)`` each: episode ``i`` is ``F_i``
    frames), ``batch`` episodes at a time (at most the backbone's ``max_generate_batch``; the longest first,
    each batch as long as its longest episode, whose shorter ones hold their last action). Returns uint8
    ``[E, F, H, W, 3]`` (``F``: the longest episode; zero past an episode's own length) and the frames each
    chunk of the longest wrote (a shorter episode's chunk ``k`` wrote those of its frames)."""
    import torch

    from workbench.inspect import rollout

    limit = max_generate_batch(model.base)
    batch = max(1, min(batch, limit) if limit else batch)
    context = int(model.base.card.context_frames)
    lengths = [len(a) for a in actions]
    order = sorted(range(len(items)), key=lambda i: lengths[i], reverse=True)  # stable: ties keep their order
    videos: np.ndarray | None = None
    frames: list[range] = []
    for lo in range(0, len(order), batch):
        part = order[lo:lo + batch]
        n = lengths[part[0]]
        ro = rollout(model, _start_batch([items[i] for i in part], n, context),
                     torch.stack([_held(actions[i], n) for i in part]), steps=steps, seed=seed + lo,
                     state=state, gate_scale=gate_scale if with_adapter else None,
                     with_adapter=with_adapter, store=False)
        got = ro.video
        if videos is None:  # the first batch holds the longest episode
            videos = np.zeros((len(items), *got.shape[1:]), np.uint8)
            frames = [c.frames for c in ro.chunks]
        for j, i in enumerate(part):
            videos[i, :lengths[i]] = got[j, :lengths[i]]
        if on_batch is not None:
            on_batch(len(part))
    return videos, frames


def _chunk_means(values: np.ndarray, lengths: np.ndarray, chunk: range) -> np.ndarray:
    """Per episode, the mean of ``values`` ``[E, F]`` over the frames of ``chunk`` it has (NaN: none)."""
    out = np.full(len(values), np.nan)
    for i, n in enumerate(lengths):
        hi = min(chunk.stop, int(n))
        if hi > chunk.start:
            out[i] = values[i, chunk.start:hi].mean()
    return out


def evaluate_rollouts(exp, items: list[dict], *, steps: int, seed: int = 0, state: str | None = "auto",
                      gate_scale: float | None = None, scratch=None, batch: int = 12, probe: Any = None,
                      progress: bool = True, variants: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Roll out every episode of ``items`` (from :func:`long_episodes`) the four ways and score each chunk.

    ``state``: a value of ``--rollout-state`` (:func:`rollout_state`; default ``auto``) or None (no state).
    ``variants``: which of ``base``, ``adapter``, ``swapped``, ``scratch`` (default: the first three, and
    ``scratch`` when a from-scratch experiment is given). Episodes may differ in length; ``swapped`` gives
    each the actions of another, cut to its length (or holding that one's last action where it is shorter).

    Returns ``truth`` and each variant's video (uint8 ``[E, F, H, W, 3]``, ``F`` the longest episode; zero
    past an episode's length), ``lengths`` (frames per episode), ``chunks`` (each chunk's frames), ``state``
    (the rollout's ``state=``), ``metrics`` (what was scored per chunk: ``moving_psnr``, and ``hand_error_cm``
    where the hand probe scores these episodes, else ``hand_error_note`` says why not), ``per_chunk`` (per
    variant, each metric ``[E, K]``, NaN for a chunk past an episode's end; ``truth``: the probe's floor
    ``hand_error_cm``), ``hand_error`` (with the hand error: per variant and ``truth``, ``[E, F]`` cm),
    ``partner`` (with ``swapped``), ``items``, ``variants``.
    """
    import torch
    from tqdm.auto import tqdm

    from workbench.metrics import moving_mask, per_clip, to_uint8_video
    from workbench.worldmodel.common import action_error_scorable, swap_partner

    if not items:
        raise DataError("No episodes to roll out: the data has none. Choose another split, or more episodes.")
    runs = [("base", exp.model, False), ("adapter", exp.model, True), ("swapped", exp.model, True)]
    if scratch is not None:
        runs.append(("scratch", scratch.model, True))
    if variants is not None:
        unknown = [v for v in variants if v not in ROLLOUT_VARIANTS]
        if unknown or not variants:
            raise DataError(f"variants {list(variants)}: choose from {', '.join(ROLLOUT_VARIANTS)}.")
        if "scratch" in variants and scratch is None:
            raise DataError("The 'scratch' variant needs a from-scratch run: --scratch RUN_DIR.")
        runs = [r for r in runs if r[0] in variants]
    own = [it["action"] for it in items]
    lengths = np.array([len(a) for a in own])
    partner = None
    if any(name == "swapped" for name, *_ in runs):
        episodes = [int(it["episode"]) for it in items]
        if len(set(episodes)) < 2:
            raise DataError(f"The 'swapped' variant rolls each episode out with another episode's actions, "
                            f"so it needs two episodes or more, and got only episode {episodes[0]}. "
                            f"Roll out more (--split all, or more --episodes), "
                            f"or leave it out (--variants base,adapter).")
        partner = swap_partner(episodes)
    state = rollout_state(exp.model, items, state, probe) if isinstance(state, str) else state
    bar = tqdm(total=len(runs) * len(items), desc="rollouts", unit="episode", disable=not progress)
    truth = np.zeros((len(items), int(lengths.max()), *items[0]["video"].shape[-2:], 3), np.uint8)
    for i, it in enumerate(items):
        truth[i, :lengths[i]] = to_uint8_video(torch.as_tensor(it["video"])[None])[0]
    out: dict[str, Any] = {"truth": truth, "lengths": lengths.tolist(), "state": state}
    chunks: list[range] = []
    for name, model, with_adapter in runs:
        actions = own if name != "swapped" else [_held(items[p]["action"], int(n))
                                                 for p, n in zip(partner, lengths, strict=True)]
        out[name], chunks = rollout_videos(model, items, actions, with_adapter=with_adapter, steps=steps,
                                           seed=seed, state=state,
                                           gate_scale=gate_scale if name != "scratch" else None,
                                           batch=batch, on_batch=bar.update)
    bar.close()
    note = action_error_scorable(items, truth, probe)
    metrics = ["moving_psnr"] if note else ["moving_psnr", "hand_error_cm"]
    per_chunk: dict[str, dict[str, np.ndarray]] = {}
    if note is None:
        from workbench.worldmodel.probe import hand_error_cm

        ee_pos = np.full((*truth.shape[:2], 3), np.nan)
        for i, it in enumerate(items):
            ee_pos[i, :lengths[i]] = np.asarray(it["ee_pos"], np.float64)
        hand = {"truth": hand_error_cm(truth, ee_pos, probe)}
        per_chunk["truth"] = {"hand_error_cm": np.stack([_chunk_means(hand["truth"], lengths, f)
                                                         for f in chunks], axis=1)}
    within = np.arange(truth.shape[1])[None, :] < lengths[:, None]  # (E, F): the frames each episode has
    for name, *_ in runs:
        pred = out[name]
        psnr = []
        for f in chunks:
            lo, hi = f.start, f.stop
            ref = truth[:, lo - 1]  # the true frame before the chunk's first written frame
            mask = moving_mask(truth[:, lo:hi], first_frame=ref)
            mask[:, 0] = np.abs(truth[:, lo].astype(int) - ref.astype(int)).max(axis=-1) > 10.0
            mask &= within[:, lo:hi, None, None]
            psnr.append(per_clip("psnr", pred[:, lo:hi], truth[:, lo:hi], mask=mask))
        per_chunk[name] = {"moving_psnr": np.stack(psnr, axis=1)}
        if note is None:
            hand[name] = hand_error_cm(pred, ee_pos, probe)
            per_chunk[name]["hand_error_cm"] = np.stack(
                [_chunk_means(hand[name], lengths, f) for f in chunks], axis=1)
    out.update(chunks=chunks, metrics=metrics, per_chunk=per_chunk, partner=partner,
               items=[{"episode": int(it["episode"]), "task": it["task"], "frames": int(n)}
                      for it, n in zip(items, lengths, strict=True)],
               variants=[name for name, *_ in runs])
    if note is None:
        out["hand_error"] = hand
    else:
        out["hand_error_note"] = note
    return out


def _has_hand_error(result: dict[str, Any]) -> bool:
    per = result["per_chunk"]
    return all("hand_error_cm" in per.get(v, {}) for v in (*result["variants"], "truth"))


def summarise_rollouts(result: dict[str, Any]) -> dict[str, Any]:
    """Per chunk, the means over episodes (NaN-aware) of each variant's numbers, JSON-ready: moving PSNR, and
    the hand error (with the probe's floor) where it was scored."""
    chunks = result["chunks"]
    per = result["per_chunk"]
    hand = _has_hand_error(result)
    rows = []
    for k, f in enumerate(chunks):
        row: dict[str, Any] = {"chunk": k, "frames": [f.start, f.stop - 1]}
        if hand:
            row["probe_floor_cm"] = _nanmean(per["truth"]["hand_error_cm"][:, k])
        for name in result["variants"]:
            if hand:
                row[f"{name}_hand_error_cm"] = _nanmean(per[name]["hand_error_cm"][:, k])
            row[f"{name}_moving_psnr"] = _nanmean(per[name]["moving_psnr"][:, k])
        rows.append(row)
    frames = int(result["truth"].shape[1])
    out = {"episodes": len(result["items"]), "frames": frames,
           "shortest": int(min(result.get("lengths") or [frames])), "chunks": rows}
    if not hand:
        out["hand_error_note"] = result.get("hand_error_note") or "not scored"
    elif {"base", "adapter"} <= set(result["variants"]):
        first_base, last_adapter = rows[0]["base_hand_error_cm"], rows[-1]["adapter_hand_error_cm"]
        out.update(goal_last_adapter_below_first_base=bool(last_adapter < first_base),
                   last_chunk_adapter_cm=last_adapter, first_chunk_base_cm=first_base)
    return out


def _nanmean(values: np.ndarray) -> float:
    """``np.nanmean`` of ``values``, NaN where all are (a chunk without a moving pixel in any episode) without
    numpy's warning for an empty mean."""
    values = np.asarray(values, np.float64)
    known = values[~np.isnan(values)]
    return float(known.mean()) if known.size else float("nan")


def format_rollout_table(summary: dict[str, Any], variants: list[str], title: str) -> str:
    """One row per chunk: moving PSNR (dB) of each variant, and where it was scored the hand error (cm) of
    each with the probe's floor."""
    hand = "hand_error_note" not in summary
    cols = "  ".join(f"{v:>8}" for v in variants)
    n, longest, shortest = summary["episodes"], summary["frames"], summary.get("shortest", summary["frames"])
    frames = f"{longest}" if shortest == longest else f"{shortest} to {longest}"
    lines = [f"{title}: {n} episode{'s' if n != 1 else ''} of {frames} frames, per chunk",
             f"{'chunk':>5} {'frames':>9} |" + (f" hand error cm: {cols} {'probe':>6} |" if hand else "")
             + f" moving PSNR dB: {cols}"]
    for row in summary["chunks"]:
        lo, hi = row["frames"]
        line = f"{row['chunk']:>5} {f'{lo}-{hi}':>9} |"
        if hand:
            e = "  ".join(f"{row[f'{v}_hand_error_cm']:8.2f}" for v in variants)
            line += f"                {e} {row['probe_floor_cm']:6.2f} |"
        p = "  ".join(f"{row[f'{v}_moving_psnr']:8.2f}" for v in variants)
        lines.append(f"{line}                 {p}")
    if not hand:
        lines.append(f"hand error {summary['hand_error_note']}")
        return "\n".join(lines)
    if "goal_last_adapter_below_first_base" not in summary:
        return "\n".join(lines)
    ok = "below" if summary["goal_last_adapter_below_first_base"] else "NOT below"
    lines.append(f"adapter at the last chunk: {summary['last_chunk_adapter_cm']:.2f} cm, "
                 f"{ok} the frozen base at the first chunk ({summary['first_chunk_base_cm']:.2f} cm)")
    return "\n".join(lines)


def drift_plot(path: str | Path, summary: dict[str, Any], variants: list[str], title: str = "") -> Path:
    """Moving PSNR per chunk, and the hand error beside it where it was scored, one line per variant
    (matplotlib's object API, no pyplot)."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend (a notebook's) stays as it is

    rows = summary["chunks"]
    hand = "hand_error_note" not in summary
    x = [r["chunk"] for r in rows]
    fig = Figure(figsize=(9 if hand else 5, 3.4), dpi=100)
    axes = fig.subplots(1, 2) if hand else [fig.subplots(1, 1)]
    psnr = axes[-1]
    for v in variants:
        psnr.plot(x, [r[f"{v}_moving_psnr"] for r in rows], marker="o", label=ROLLOUT_LABELS[v])
    psnr.set(xlabel="chunk", ylabel="moving-pixel PSNR (dB)", title="moving-pixel PSNR per chunk")
    if hand:
        left = axes[0]
        for v in variants:
            left.plot(x, [r[f"{v}_hand_error_cm"] for r in rows], marker="o", label=ROLLOUT_LABELS[v])
        left.plot(x, [r["probe_floor_cm"] for r in rows], color="grey", linestyle=":",
                  label="probe on true frames")
        if "base" in variants:
            left.axhline(rows[0]["base_hand_error_cm"], color="grey", linewidth=0.6, linestyle="--")
        left.set(xlabel="chunk", ylabel="hand error (cm)", title="hand error per chunk")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(variants) + int(hand),
               fontsize=7, frameon=False)
    path = Path(path)
    fig.savefig(path)
    return path


def rollout_data(exp, data: str | None) -> str:
    """What ``eval --rollout`` rolls out: ``data`` (``--data``) when given, else the data the run was trained
    on (:func:`~workbench.worldmodel.common.run_data`), or the shipped long episodes (``"long"``) for a run
    trained on the shipped Meta-World sample, whose own episodes are too short to drift over."""
    from workbench.worldmodel.common import run_data

    if data:
        return data
    own = run_data(exp)
    return "long" if own == "sample" else own


def run_rollout_eval(exp, args, *, scratch=None) -> dict[str, Any]:
    """``workbench eval RUN --rollout``: roll out, print the table, write ``rollout_metrics.json`` and
    ``drift.png``."""
    from workbench.worldmodel.common import data_options, json_safe

    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = rollout_data(exp, args.data)
    base = exp.model.base
    clip = base.clip()
    split = args.split or ("all" if data == "long" else "val")
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    options = data_options(exp, data, args) if data != "long" else {}
    items = long_episodes(data, frames=args.frames, episodes=args.episodes, split=split, size=clip.size,
                          exp=exp, **({"tasks": tasks} if tasks else {}), **options)
    steps = args.sampling_steps or base.card.sampling.steps
    variants = tuple(v for v in args.variants.split(",") if v) if args.variants else None
    result = evaluate_rollouts(exp, items, steps=steps, seed=args.seed, state=args.rollout_state,
                               gate_scale=args.gate_scale, scratch=scratch, progress=not args.no_progress,
                               variants=variants)
    summary = summarise_rollouts(result)
    name = Path(str(LONG_PATH if data == "long" else data)).name
    state = result["state"] or "none"
    title = f"{name} ({split}), {steps} steps, state={state}" + (
        f", gate x{args.gate_scale:g}" if args.gate_scale else "")
    table = format_rollout_table(summary, result["variants"], title)
    drift_plot(out / "drift.png", summary, result["variants"], title)
    metrics = {"summary": summary,
               "per_episode": {f"{v}_{m}": np.round(result["per_chunk"][v][m], 4).tolist()
                               for v in result["variants"] for m in result["metrics"]},
               "items": result["items"], "swap_partner": result["partner"],
               "evaluation": {"data": name, "split": split, "episodes": len(items),
                              "frames": summary["frames"], "shortest": summary["shortest"],
                              "sampling_steps": steps, "seed": args.seed, "state": state,
                              "metrics": result["metrics"],
                              "gate_scale": args.gate_scale, "run": str(args.run_dir), "step": exp.step,
                              "scratch": str(args.scratch) if scratch is not None else None,
                              "window": clip.frames, "context_frames": base.card.context_frames},
               "seconds": round(time.perf_counter() - started, 1)}
    (out / "rollout_metrics.json").write_text(json.dumps(json_safe(metrics), indent=1))
    return {**metrics, "result": result, "table": table}


__all__ = ["LONG_PATH", "ROLLOUT_STATES", "drift_plot", "evaluate_rollouts", "format_rollout_table",
           "long_episodes", "rollout_data", "rollout_state", "rollout_videos", "run_rollout_eval",
           "summarise_rollouts"]
