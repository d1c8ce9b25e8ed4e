"""The demo's look past one window: rollouts over whole episodes and the policy rankings, on both cores.

After the demo has trained and scored its adapter on 16-frame clips, :func:`world_summary` asks the
two questions a world model is built for, at a size the demo's budget affords:

* **rollouts** — a few held-out 144-frame episodes (:data:`~workbench.worldmodel.rollout_eval.LONG_PATH`)
  rolled out chunk by chunk from their first frame
  (:func:`~workbench.worldmodel.rollout_eval.evaluate_rollouts`): the hand error per chunk of the frozen
  base, the adapter, the adapter with swapped actions and the from-scratch model;
* **policies, open loop** — the shipped recording of six policies on reach and push
  (:func:`~workbench.worldmodel.policies.load_policies`) replayed in the base and in the adapter
  (:func:`~workbench.worldmodel.policies.imagine`), ranked against the simulator (Spearman ρ);
* **policies, closed loop** — the same six policies acting from the recording's start states in the base and
  in the adapter, each chunk's actions chosen from the last frame the model made
  (:func:`~workbench.worldmodel.closed_loop_eval.run_group`), ranked against the simulator twin's outcomes
  under the same decision rule. Those do not depend on the world model, so they are read from a shipped
  record (:func:`~workbench.worldmodel.simulated_record.load_simulated`), checked against the start states,
  and the demo needs no simulator.

Each (question, model) pair is one job that loads the run from its checkpoint and depends on nothing
else, so the jobs run on two processes of one thread each (this one and one started for them) with exactly
the numbers one process computes (each job draws its own seeded noise; which process runs it changes
nothing). The full
measurements are ``workbench eval RUN --rollout``, ``--policies --open-loop`` and ``--policies``
(``docs/results/rollouts.md``, ``docs/results/policy-ranking.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.rows import DEFAULT_MICRO_BATCH


@dataclasses.dataclass
class WorldSummaryConfig:
    """What :func:`world_summary` measures: ``rollout_episodes`` episodes of ``rollout_frames`` frames, and
    the six policies from the first ``policy_starts`` start states of the recording (``None``: all four) of
    ``policy_tasks`` (``None``: both), replayed (open loop) and acting (closed loop)."""

    rollout_episodes: int = 6
    rollout_frames: int = 91
    policy_starts: int | None = None
    policy_tasks: tuple[str, ...] | None = None
    sampling_steps: int = 8
    gate_scale: float | None = 2.0
    seed: int = 0

    @classmethod
    def quick(cls, **overrides: Any) -> WorldSummaryConfig:
        return cls(**{"rollout_episodes": 2, "rollout_frames": 31, "policy_starts": 1,
                      "policy_tasks": ("reach-v3",), "sampling_steps": 1, **overrides})


def jobs(scratch: bool) -> list[tuple[str, str]]:
    """The (question, model) pairs, the costliest first (so two processes finish together)."""
    out = [("closed_loop", "adapter"), ("closed_loop", "base"), ("policies", "adapter"), ("policies", "base"),
           ("rollout", "adapter"), ("rollout", "swapped"), ("rollout", "base")]
    return out + ([("rollout", "scratch")] if scratch else [])


def _policies(cfg: WorldSummaryConfig):
    from workbench.worldmodel.policies import load_policies

    return load_policies().select(starts=cfg.policy_starts, tasks=cfg.policy_tasks)


def _closed_loop(cfg: WorldSummaryConfig) -> tuple[Any, dict[str, Any]]:
    """The closed-loop jobs' plan (the run left out) and the simulator's outcomes from the shipped record,
    checked against the start states."""
    from workbench.worldmodel import closed_loop_eval as cle
    from workbench.worldmodel.policies import load_policies, policy_names
    from workbench.worldmodel.simulated_record import load_simulated

    episodes = load_policies()
    starts = cle.starts_from_recording(episodes).select(per_task=cfg.policy_starts, tasks=cfg.policy_tasks)
    names = policy_names()
    simulated = load_simulated(starts, names, frames=int(episodes.meta["frames"]), seed=cfg.seed)
    plan = cle.Plan({}, starts, {k: k for k in names}, int(episodes.meta["frames"]), cfg.sampling_steps,
                    cfg.seed, cfg.gate_scale, cle.DEFAULT_BATCH, simulated["window"], simulated["context"])
    return plan, simulated


def run_job(job: tuple[str, str], run_dir: str, scratch_dir: str | None,
            cfg: WorldSummaryConfig) -> dict[str, Any]:
    """One (question, model) pair, in whichever process: its numbers and its CPU seconds."""
    import torch

    from workbench.worldmodel.common import load_run

    torch.set_num_threads(1)
    kind, variant = job
    started = time.process_time()
    exp = load_run(run_dir)
    if kind == "policies":
        from workbench.worldmodel.policies import imagine

        on = variant == "adapter"
        got = imagine(exp.model, _policies(cfg), steps=cfg.sampling_steps, seed=cfg.seed, with_adapter=on,
                      gate_scale=cfg.gate_scale if on else None)
        return {"job": job, "distance": got["distance"], "cpu_seconds": time.process_time() - started}
    if kind == "closed_loop":
        from workbench.worldmodel import closed_loop_eval as cle
        from workbench.worldmodel.simulated_record import SIMULATED_PATH, check_rule

        plan = dataclasses.replace(_closed_loop(cfg)[0], runs={"adapter": exp})
        check_rule(exp.model, plan.window, plan.context, SIMULATED_PATH)
        done = cle.execute(cle.jobs(plan, [variant], simulator=False), plan)
        failed = [d["error"] for d in done if "error" in d]
        if failed:
            from workbench.errors import PolicyError

            raise PolicyError(failed[0])
        return {"job": job, "done": done, "cpu_seconds": time.process_time() - started}
    from workbench.worldmodel.rollout_eval import evaluate_rollouts, long_episodes

    items = long_episodes("long", frames=cfg.rollout_frames, episodes=cfg.rollout_episodes,
                          size=exp.model.base.clip().size)
    scratch = load_run(scratch_dir) if variant == "scratch" else None
    result = evaluate_rollouts(exp, items, steps=cfg.sampling_steps, seed=cfg.seed, gate_scale=cfg.gate_scale,
                               scratch=scratch, variants=(variant,), progress=False)
    return {"job": job, "per_chunk": result["per_chunk"], "chunks": result["chunks"],
            "items": result["items"], "frames": int(result["truth"].shape[1]),
            "cpu_seconds": time.process_time() - started}


def _run_all(todo: list, run: Callable[[Any], dict[str, Any]], processes: int) -> list[dict[str, Any]]:
    """``run(job)`` for every job of ``todo`` on ``processes`` processes, this one and ``processes - 1``
    others, each taking the next job in ``todo``'s order when it is free; the results in ``todo``'s order."""
    if processes == 1:
        return [run(job) for job in todo]
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    from workbench.workers import pool as worker_pool

    # workers of one thread each that have computed nothing before (workbench.workers). A process that dies
    # (killed, out of memory) breaks the pool and is reported, never waited on for ever. This process, which
    # has the libraries loaded already, runs jobs too instead of waiting.
    pool = worker_pool(processes - 1)
    waiting, running, results = list(range(len(todo))), {}, {}
    try:
        while waiting or running:
            for future in [f for f in running if f.done()]:
                results[running.pop(future)] = future.result()
            while waiting and len(running) < processes - 1:
                i = waiting.pop(0)
                running[pool.submit(run, todo[i])] = i
            if waiting:
                i = waiting.pop(0)
                results[i] = run(todo[i])
            elif running:
                wait(running, return_when=FIRST_COMPLETED)
    except BrokenProcessPool as err:
        raise RuntimeError(
            f"A process of the world summary's pool ended abruptly ({err}); nothing of its jobs "
            f"({', '.join(map(str, todo))}) was kept. Run it on one process to see the failure "
            f"there: workbench demo --processes 1.") from err
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        del pool
        gc.collect()  # its queues' semaphores are released now, not reported as leaked at exit
    return [results[i] for i in range(len(todo))]


def world_summary(run_dir: str | Path, *, scratch_dir: str | Path | None = None,
                  cfg: WorldSummaryConfig | None = None, processes: int = 1) -> dict[str, Any]:
    """Roll out and rank policies with the run of ``run_dir`` (and the from-scratch run of ``scratch_dir``).

    Returns ``rollout`` (:func:`~workbench.worldmodel.rollout_eval.summarise_rollouts`' summary),
    ``policies`` (a report as :func:`~workbench.worldmodel.policies.evaluate_policies` writes, ``variants``
    ``base`` and ``adapter``), ``closed_loop`` (a report as
    :func:`~workbench.worldmodel.closed_loop_eval.evaluate_closed_loop` writes, ``variants`` ``probe_on_sim``,
    ``base`` and ``adapter``, and ``simulated``: the record it read), ``settings`` and ``seconds`` (wall) /
    ``cpu_seconds`` (per job).

    Raises:
        DataError: Before any job, when the simulator's record does not hold the start states rolled out.
    """
    from workbench.worldmodel import closed_loop_eval as cle
    from workbench.worldmodel.policies import DISTANCE_DECIMALS, agreement
    from workbench.worldmodel.rollout_eval import summarise_rollouts

    cfg = cfg or WorldSummaryConfig()
    started = time.perf_counter()
    plan, simulated = _closed_loop(cfg)  # a record that does not fit fails here, before any compute
    scratch = None if scratch_dir is None else str(scratch_dir)
    run = functools.partial(run_job, run_dir=str(run_dir), scratch_dir=scratch, cfg=cfg)
    done = _run_all(jobs(scratch_dir is not None), run, processes)
    rolled = [d for d in done if d["job"][0] == "rollout"]
    order = {v: i for i, v in enumerate(("base", "adapter", "swapped", "scratch"))}
    rolled.sort(key=lambda d: order[d["job"][1]])
    per_chunk = {"truth": rolled[0]["per_chunk"]["truth"]}
    per_chunk.update({d["job"][1]: d["per_chunk"][d["job"][1]] for d in rolled})
    frames = rolled[0]["frames"]
    result = {"chunks": rolled[0]["chunks"], "per_chunk": per_chunk, "items": rolled[0]["items"],
              "variants": [d["job"][1] for d in rolled], "truth": np.zeros((len(rolled[0]["items"]), frames))}
    episodes = _policies(cfg)
    report: dict[str, Any] = {"episodes": len(episodes), "tasks": episodes.tasks,
                              "policies": episodes.policies, "starts": int(episodes.meta["starts"]),
                              "frames": int(episodes.actions.shape[1]),
                              "sampling_steps": cfg.sampling_steps, "micro_batch": DEFAULT_MICRO_BATCH,
                              "variants": {}}
    for name in ("base", "adapter"):
        d = next(d for d in done if d["job"] == ("policies", name))
        report["variants"][name] = {"agreement": agreement(d["distance"], episodes, seed=cfg.seed),
                                    "distance_m": np.round(d["distance"], DISTANCE_DECIMALS).tolist(),
                                    "cpu_seconds": round(d["cpu_seconds"], 1)}
    variants = ["base", "adapter"]
    acted = [d for name in variants for x in done if x["job"] == ("closed_loop", name) for d in x["done"]]
    closed = cle.assemble(plan, variants, True, simulated["jobs"] + acted, cle.jobs(plan, variants, True))
    closed["simulated"] = {k: simulated[k] for k in ("record", "command", "date")}
    return {"rollout": summarise_rollouts(result), "policies": report, "closed_loop": closed,
            "settings": dataclasses.asdict(cfg),
            "processes": processes, "seconds": round(time.perf_counter() - started, 1),
            "cpu_seconds": {f"{k}/{v}": round(d["cpu_seconds"], 1) for d in done for k, v in [d["job"]]}}


__all__ = ["WorldSummaryConfig", "jobs", "run_job", "world_summary"]
