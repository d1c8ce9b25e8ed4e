"""Policies judged closed loop, in the world model and in the simulator, under one decision rule.

Each policy (the shipped family of :mod:`~workbench.worldmodel.scripted`, and any policy of your own) acts
from the same start states in two worlds:

* **in imagination**: :func:`workbench.inspect.closed_loop` alternates it with the world model's rollout.
  Before each chunk it sees the last frame the model produced, the hand and the object the probes read off
  it (the state readers ``"probe"`` and ``"object_probe"``) and the goal of the start state;
* **in the simulator twin** (:mod:`~workbench.worldmodel.simulator_twin`): Meta-World runs the same policy
  and asks it at the same chunk boundaries (:func:`workbench.inspect.recording.closed_loop.chunk_schedule`),
  showing it the frame the simulator rendered there, as the training data were rendered (camera, size),
  read by the same probes. So the two worlds differ in the world model only, not in what the policy sees or
  when. (The simulator's true state would give the policy better readings than imagination can, and the
  comparison would mix the probes' errors into the world model's.)

The outcome is the distance to the goal at the last frame: the hand's for reach, the object's for push.
Imagined, it is read off the last predicted frame by the probes; simulated, it is the simulator's own. The
report gives, per policy, the success rate (within :data:`~workbench.worldmodel.policies.SUCCESS_RADIUS`) and
the mean final distance, imagined against simulated, and Spearman ρ across the (task, policy) pairs, overall
and within each task, with a bootstrap interval over start states
(:func:`~workbench.worldmodel.policies.agreement`).

Start states come from a recording (the shipped one has four per task) or fresh from a seed
(:func:`fresh_starts`, by default :data:`DEFAULT_STARTS` per task from seed :data:`DEFAULT_START_SEED`: start
states no training data and no recording used). Episodes are rolled out :data:`DEFAULT_BATCH` at a time; the
jobs (a batch of one policy's episodes in one model, or one policy in the simulator) spread over ``processes``
processes or the ranks of ``torchrun``, each job computing the same numbers wherever it runs. Where a batch
holds few start states, the jobs of several policies share one rollout (:func:`groups`), with the numbers
they get alone.

    workbench eval RUN --policies                                   # the family, fresh start states
    workbench eval RUN --policies --policy my_policies:reach_it     # and yours, from a module
    workbench eval RUN --policies --policy path/to/mine.py:act --processes 2 --out outputs/closed_loop
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import ConfigError, PolicyError, listing
from workbench.worldmodel.common import Columns

#: Frames per episode: four chunks of the embedded model (16 + 3 x 15), as the shipped recording.
DEFAULT_FRAMES = 61
#: Fresh start states per task (see docs/guides/policies.md for what this costs).
DEFAULT_STARTS = 8
#: The seed of fresh start states: the shipped recording's are seed 0, training data another stream.
DEFAULT_START_SEED = 1
#: Episodes per closed-loop rollout call.
DEFAULT_BATCH = 16
#: How each variant is labelled in the table (the imagined ones as the open-loop report labels them).
LABELS = {"probe_on_sim": "probes on the simulator's frames (ceiling)", "base": "frozen base alone",
          "adapter": "base + adapter", "scratch": "from scratch"}
STATE_FIELDS = ("task", "index", "task_index", "frame", "ee_pos", "proprio", "object_pos", "goal")


# ------------------------------------------------------------------------------------------ start states
@dataclasses.dataclass(frozen=True)
class StartStates(Columns):
    """Where episodes start, one row each.

    Attributes:
        arrays: One array per field, a row per start state: ``task``, ``index`` (its number within the
            task), ``task_index`` (the task's place in the simulator's reset seed), ``frame`` (uint8
            ``(H, W, 3)``, rendered as the data were), ``ee_pos``, ``proprio``, ``object_pos``, ``goal``
            (metres).
        meta: ``seed`` (the simulator resets row ``i`` from ``(seed, task_index[i], index[i])``),
            ``source``, ``camera``, ``size``, ``action_repeat``.
    """

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(self.arrays["task"].tolist()))

    @property
    def per_task(self) -> int:
        return max(int((self.task == t).sum()) for t in self.tasks)

    def rows(self, rows: Sequence[int] | np.ndarray) -> StartStates:
        rows = np.asarray(rows, int)
        return StartStates({k: v[rows] for k, v in self.arrays.items()}, dict(self.meta))

    def select(self, per_task: int | None = None, tasks: Sequence[str] | None = None) -> StartStates:
        """The first ``per_task`` start states of each of ``tasks`` (default: all)."""
        if per_task is not None and per_task < 1:
            raise ConfigError(f"--episodes: the number of start states per task must be >= 1, "
                              f"got {per_task}.")
        unknown = [t for t in tasks or () if t not in self.tasks]
        if unknown:
            raise ConfigError(f"tasks: {listing(unknown)} have no start states here; these do: "
                              f"{listing(self.tasks)}.")
        keep = (np.ones(len(self), bool) if tasks is None else np.isin(self.task, list(tasks)))
        if per_task is not None:
            keep &= self.index < per_task
        return self.rows(np.flatnonzero(keep))

    def clips(self) -> dict[str, Any]:
        """The batch of start clips a rollout starts from (the start frame, the hand and proprioception at it,
        the camera's calibration) and ``goal``: ``{"task": (B,), "position": (B, 3)}``, the policy's."""
        from workbench.worldmodel.policies import PolicyEpisodes, start_clips

        frames = PolicyEpisodes({"frames": self.frame[:, None], "ee_pos": self.ee_pos[:, None],
                                 "proprio": self.proprio[:, None], "task": self.task}, self.meta)
        clips = start_clips(frames)
        clips["goal"] = {"task": self.task.copy(), "position": self.goal.astype(np.float32)}
        return clips

    def describe(self) -> str:
        n = self.per_task
        return f"{self.meta['source']}: {n} start state{'s' if n != 1 else ''} per task"


def starts_from_recording(episodes: Any) -> StartStates:
    """The start states of a policy recording (:func:`~workbench.worldmodel.policies.load_policies`): one row
    per (task, start), which every policy of the recording shared."""
    first = episodes.policies[0]
    rows = np.flatnonzero(episodes.policy == first)
    tasks = list(episodes.meta["tasks"])
    arrays = {"task": episodes.task[rows].astype("U16"), "index": episodes.start[rows].astype(np.int64),
              "task_index": np.array([tasks.index(t) for t in episodes.task[rows]], np.int64),
              "frame": np.ascontiguousarray(episodes.frames[rows, 0]),
              "ee_pos": episodes.ee_pos[rows, 0].astype(np.float32),
              "proprio": episodes.proprio[rows, 0].astype(np.float32),
              "object_pos": episodes.object_pos[rows, 0].astype(np.float32),
              "goal": episodes.goal[rows].astype(np.float32)}
    source = f"recorded start states ({episodes.path.name if episodes.path else 'a recording'})"
    meta = {"seed": int(episodes.meta["seed"]), "source": source, "camera": episodes.meta["camera"],
            "size": int(episodes.meta["size"]), "action_repeat": int(episodes.meta["action_repeat"])}
    return StartStates(arrays, meta)


def fresh_starts(tasks: Sequence[str], per_task: int, *, seed: int = DEFAULT_START_SEED,
                 action_repeat: int = 2) -> StartStates:
    """Start states made by the simulator as the shipped recording's were (the env's own object and goal
    placement, then a seeded move of the hand to a random point), rendered as the data were. The same
    arguments give the same start states; the recording used seed 0.

    Args:
        tasks: Meta-World tasks with an outcome measure (reach-v3, push-v3).
        per_task: Start states per task.
        seed: The seed of the simulator's resets.
        action_repeat: Simulator steps per frame, as the data were recorded.

    Returns:
        The :class:`StartStates`, ``per_task`` rows per task.

    Raises:
        ConfigError: When a task has no outcome measure or an argument is out of range.
    """
    from workbench.worldmodel.policies import OUTCOME, TASKS, _reset
    from workbench.worldmodel.sim import DEFAULT_CAMERA, PROPRIO_NAMES, check_args, import_simulator
    from workbench.worldmodel.simulator_twin import environment

    import_simulator()
    tasks = check_args(list(tasks), per_task, DEFAULT_FRAMES, 64, DEFAULT_CAMERA, action_repeat)
    unknown = [t for t in tasks if t not in OUTCOME]
    if unknown:
        raise ConfigError(f"tasks: {listing(unknown)} have no outcome measure here; policies are judged on "
                          f"{listing(list(OUTCOME))}.")
    columns: dict[str, list[Any]] = {k: [] for k in STATE_FIELDS}
    for task in tasks:
        env = environment(task, 64, DEFAULT_CAMERA, 100)
        for s in range(per_task):
            obs, _ = _reset(env, seed, TASKS.index(task), s)
            proprio = np.zeros(len(PROPRIO_NAMES), np.float32)
            proprio[0], proprio[1:] = obs[3], env.env.data.qpos[env.qpos_index]
            for key, value in (("task", task), ("index", s), ("task_index", TASKS.index(task)),
                               ("frame", env.render()), ("ee_pos", obs[:3]), ("proprio", proprio),
                               ("object_pos", obs[4:7]), ("goal", obs[-3:])):
                columns[key].append(value)
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    for key in ("ee_pos", "proprio", "object_pos", "goal"):
        arrays[key] = arrays[key].astype(np.float32)
    arrays["task"] = arrays["task"].astype("U16")
    meta = {"seed": int(seed), "source": f"fresh start states (seed {seed})", "camera": DEFAULT_CAMERA,
            "size": 64, "action_repeat": int(action_repeat)}
    return StartStates(arrays, meta)


# ------------------------------------------------------------------------------------------ the two worlds
def imagine_closed_loop(model: Any, starts: StartStates, policy: Callable[[Any], Any], *, frames: int,
                        steps: int, seed: int = 0, with_adapter: bool = True,
                        gate_scale: float | None = None,
                        episodes: Sequence[int] | None = None) -> dict[str, Any]:
    """Run ``policy`` closed loop in the world model ``model`` from every start state, in one batch (the one
    place where episodes are batched: :func:`evaluate_closed_loop` cuts the start states into batches).
    ``episodes``: each start state's index in the whole set (default ``0 .. S-1``), so that an episode
    gets the same noise, and the same frames, in any batch.
    Returns ``final_frames`` (uint8 ``(S, H, W, 3)``: the last predicted frames), ``distance`` (metres, read
    off them by the probes) and ``actions`` (``(S, frames, 4)``)."""
    from workbench.inspect import closed_loop
    from workbench.worldmodel.policies import PolicyEpisodes, outcome_distance
    from workbench.worldmodel.scripted import READERS

    run = closed_loop(model, starts.clips(), policy, frames=frames, steps=steps, seed=seed,
                      state="probe", observe=READERS, gate_scale=gate_scale if with_adapter else None,
                      store=False, with_adapter=with_adapter, episodes=episodes)
    final = run.rollout.frame(-1)
    where = PolicyEpisodes({"task": starts.task, "goal": starts.goal}, {})
    return {"final_frames": final, "distance": outcome_distance(final, where),
            "actions": run.actions.numpy()}


# ------------------------------------------------------------------------------------------ the jobs
@dataclasses.dataclass
class Plan:
    """Everything a job needs, picklable when the runs are directories and the policies are specs (the
    processes and ranks rebuild the models and policies from them)."""

    runs: dict[str, Any]                 # variant -> run directory, or an experiment / ComposedModel
    starts: StartStates
    policies: dict[str, Any]             # key -> a spec (family name, MODULE:NAME, FILE.py:NAME), a callable
    frames: int
    steps: int
    seed: int
    gate_scale: float | None
    batch: int
    window: int
    context: int


_LOADED: dict[str, Any] = {}  # run directory -> experiment, once per process


def _model(plan: Plan, variant: str) -> Any:
    ref = plan.runs["scratch" if variant == "scratch" else "adapter"]
    if isinstance(ref, (str, Path)):
        if str(ref) not in _LOADED:
            from workbench.worldmodel.common import load_run

            _LOADED[str(ref)] = load_run(ref)
        ref = _LOADED[str(ref)]
    return getattr(ref, "model", ref)


def resolve_policy(spec: Any, *, seed: int = 0) -> Callable[[Any], Any]:
    """A policy by spec: a family member's name (``expert``, ``expert+noise0.3``, ``random``), ``MODULE:NAME``
    or ``FILE.py:NAME`` (:func:`~workbench.inspect.recording.closed_loop.load_policy`), or a callable
    (returned as is)."""
    if callable(spec):
        return spec
    from workbench.inspect.recording.closed_loop import load_policy
    from workbench.worldmodel.scripted import ScriptedPolicy

    if spec == "random":
        return ScriptedPolicy(None, seed=seed)
    if spec == "expert" or (isinstance(spec, str) and spec.startswith("expert+noise")):
        try:
            noise = 0.0 if spec == "expert" else float(spec.removeprefix("expert+noise"))
        except ValueError as err:
            raise PolicyError(f"policy {spec!r}: a family member is expert, expert+noiseSIGMA (e.g. "
                              f"expert+noise0.3) or random.") from err
        return ScriptedPolicy(noise, seed=seed)
    return load_policy(spec)


class _Together:
    """Several policies acting in one closed-loop rollout: the rows of each observation are theirs in turn,
    ``rows`` each (policy ``i`` sees rows ``i * rows .. (i + 1) * rows - 1``, exactly the observation it sees
    alone), and their actions are stacked in that order."""

    name = "the policies of one job"

    def __init__(self, policies: Sequence[Callable[[Any], Any]], rows: int):
        self.policies, self.rows = list(policies), rows

    def __call__(self, obs: Any) -> np.ndarray:
        import torch

        from workbench.core.rows import take_rows
        from workbench.inspect.recording.closed_loop import act

        n, out = obs.episodes, []
        for i, policy in enumerate(self.policies):
            index = np.arange(i * self.rows, (i + 1) * self.rows)
            mine = dataclasses.replace(obs, frame=obs.frame[index],
                                       state={k: v[index] for k, v in obs.state.items()},
                                       goal=take_rows(obs.goal, torch.from_numpy(index), n))
            out.append(act(policy, mine))
        if len({a.shape for a in out}) > 1:
            raise PolicyError(f"The policies of one job returned actions of shapes "
                              f"{[a.shape for a in out]}; each is run alone to say which.")
        return np.concatenate(out)


def jobs(plan: Plan, variants: Sequence[str], simulator: bool) -> list[tuple]:
    """The jobs, policy by policy (the family first, as given): its simulator run, then each batch of its
    start states in each variant. ``("sim", policy)``, ``("imagine", variant, policy, first_row)``."""
    out: list[tuple] = []
    for key in plan.policies:
        if simulator:
            out.append(("sim", key))
        for variant in variants:
            out += [("imagine", variant, key, lo) for lo in range(0, len(plan.starts), plan.batch)]
    return out


def _rows(plan: Plan, lo: int) -> range:
    return range(lo, min(lo + plan.batch, len(plan.starts)))


def groups(todo: list[tuple], plan: Plan) -> list[list[tuple]]:
    """The jobs of ``todo`` as they run: a simulator job alone; the imagined jobs of one variant and one batch
    of start states together, as many policies as fill ``plan.batch`` episodes (so that a few start states
    fill the rollout's micro-batches instead of each policy's few being padded to one). Each group stands
    where its first job stands. The numbers are those of the jobs run alone: an episode's frames do not
    depend on its batch (fixed micro-batches, its own noise)."""
    out: list[list[tuple]] = []
    open_: dict[tuple, list[tuple]] = {}
    for job in todo:
        if job[0] != "imagine":
            out.append([job])
            continue
        _, variant, _, lo = job
        room = max(1, plan.batch // len(_rows(plan, lo)))
        group = open_.get((variant, lo))
        if group is None or len(group) >= room:
            group = open_[(variant, lo)] = []
            out.append(group)
        group.append(job)
    return out


def run_group(group: list[tuple], plan: Plan) -> list[dict[str, Any]]:
    """The jobs of one group (:func:`groups`), in whichever process: each job's numbers as :func:`run_job`
    gives them, from one rollout of all their episodes. When a policy fails, the jobs run again one by one,
    so that the error names its policy and the others keep their numbers."""
    if len(group) == 1:
        return [run_job(group[0], plan)]
    import torch

    torch.set_num_threads(1)
    started = time.process_time()
    _, variant, _, lo = group[0]
    rows = list(_rows(plan, lo))
    keys = [job[2] for job in group]
    policies = [resolve_policy(plan.policies[k], seed=plan.seed) for k in keys]
    together = _Together(policies, len(rows))
    try:
        got = imagine_closed_loop(_model(plan, variant), plan.starts.rows(rows * len(keys)), together,
                                  frames=plan.frames, steps=plan.steps, seed=plan.seed,
                                  with_adapter=variant != "base", episodes=rows * len(keys),
                                  gate_scale=plan.gate_scale if variant == "adapter" else None)
    except PolicyError:
        return [run_job(job, plan) for job in group]
    cpu = (time.process_time() - started) / len(group)
    return [{"job": job, "distance": got["distance"][i * len(rows):(i + 1) * len(rows)], "cpu_seconds": cpu,
             "process": os.getpid()} for i, job in enumerate(group)]


def run_job(job: tuple, plan: Plan) -> dict[str, Any]:
    """One job, in whichever process: its numbers and its CPU seconds, or the policy's error (as a message, so
    that it crosses processes; the caller raises it)."""
    import torch

    torch.set_num_threads(1)
    started = time.process_time()
    key = job[1] if job[0] == "sim" else job[2]
    policy = resolve_policy(plan.policies[key], seed=plan.seed)
    try:
        if job[0] == "sim":
            from workbench.worldmodel.policies import PolicyEpisodes, outcome_distance
            from workbench.worldmodel.simulator_twin import simulate

            got = simulate(policy, plan.starts, frames=plan.frames, window=plan.window, context=plan.context)
            where = PolicyEpisodes({"task": plan.starts.task, "goal": plan.starts.goal}, {})
            return {"job": job, "distance": got["distance"],
                    "probed": outcome_distance(got["final_frames"], where),  # the probes' ceiling
                    "cpu_seconds": time.process_time() - started, "process": os.getpid()}
        _, variant, _, lo = job
        rows = range(lo, min(lo + plan.batch, len(plan.starts)))
        got = imagine_closed_loop(_model(plan, variant), plan.starts.rows(rows), policy, frames=plan.frames,
                                  steps=plan.steps, seed=plan.seed, with_adapter=variant != "base",
                                  episodes=rows,
                                  gate_scale=plan.gate_scale if variant == "adapter" else None)
        return {"job": job, "distance": got["distance"], "cpu_seconds": time.process_time() - started,
                "process": os.getpid()}
    except PolicyError as err:
        return {"job": job, "error": str(err), "cpu_seconds": time.process_time() - started}


def _policy_of(job: tuple) -> Any:
    return job[1] if job[0] == "sim" else job[2]


def _stopped(group: list[tuple], plan: Plan, done: list[dict[str, Any]]) -> bool:
    """Whether ``group`` is not to run: a policy failed (in ``done``), and the group's policies are all that
    one or later ones (the policies before the first that failed finish; see :func:`execute`)."""
    place = {key: i for i, key in enumerate(plan.policies)}
    failed = [place[_policy_of(d["job"])] for d in done if "error" in d]
    return bool(failed) and all(place[_policy_of(job)] >= min(failed) for job in group)


def _run_local(todo: list[tuple], plan: Plan, progress: bool) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    try:
        for group in groups(todo, plan):
            if _stopped(group, plan, done):
                continue
            for d in run_group(group, plan):
                done.append(d)
                if progress:
                    print(f"  {len(done)}/{len(todo)} {_job_text(d['job'], plan)}: "
                          f"{d['cpu_seconds']:.0f} CPU s", flush=True)
    finally:
        from workbench.worldmodel.simulator_twin import close_envs

        close_envs()
    return done


def _job_text(job: tuple, plan: Plan) -> str:
    if job[0] == "sim":
        return f"{job[1]} in the simulator"
    lo = job[3]
    return f"{job[2]} in {LABELS[job[1]]} (episodes {lo}..{min(lo + plan.batch, len(plan.starts)) - 1})"


def _run_pool(todo: list[tuple], plan: Plan, processes: int, progress: bool) -> list[dict[str, Any]]:
    import functools
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    from workbench.workers import pool as worker_pool

    # workers of one thread each (workbench.workers); the jobs are sent as specs and run folders
    pool = worker_pool(processes)
    done: list[dict[str, Any]] = []
    try:
        pending = {pool.submit(functools.partial(run_group, plan=plan), group): group
                   for group in groups(todo, plan)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                pending.pop(future)
                if future.cancelled():
                    continue
                for d in future.result():
                    done.append(d)
                    if progress:
                        print(f"  {len(done)}/{len(todo)} {_job_text(d['job'], plan)}: "
                              f"{d['cpu_seconds']:.0f} CPU s", flush=True)
                for other, group in pending.items():  # (the running ones finish: their numbers are kept)
                    if _stopped(group, plan, done):
                        other.cancel()
    except BrokenProcessPool as err:
        raise RuntimeError(f"A process of the evaluation's pool ended abruptly ({err}); the {len(done)} jobs "
                           f"finished before are lost with it. Run it on one process to see the failure "
                           f"there: --processes 1.") from err
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return done


def _run_ranks(todo: list[tuple], plan: Plan, progress: bool) -> list[dict[str, Any]]:
    """Under torchrun: this rank's share of the jobs (every ``world``-th group), then everyone's, gathered."""
    from datetime import timedelta

    import torch.distributed as dist

    from workbench.train.distributed import init_process_group

    init_process_group("gloo", timeout=timedelta(seconds=3600))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        share = [job for group in groups(todo, plan)[rank::world] for job in group]
        mine = _run_local(share, plan, progress and rank == 0)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
    finally:
        dist.destroy_process_group()
    return [d for part in gathered for d in part]


def execute(todo: list[tuple], plan: Plan, *, processes: int = 1, world_size: int = 1,
            progress: bool = False) -> list[dict[str, Any]]:
    """Run the jobs on one process, on a pool of ``processes``, or over the ``world_size`` ranks of a torchrun
    launch; returns what each job computed. When a policy fails, the jobs of the policies before it (in
    ``plan.policies``' order) still run, and those of the failing policy and the ones after it start no more:
    they are missing, unless they shared a rollout with an earlier policy's (:func:`groups`)."""
    if world_size > 1:
        if processes > 1:
            raise ConfigError(f"--processes {processes} under torchrun ({world_size} ranks): the ranks "
                              f"already spread the episodes; drop --processes (or run without torchrun).")
        return _run_ranks(todo, plan, progress)
    if processes > 1:
        bad = [f"the policy {k!r}" for k, v in plan.policies.items() if callable(v)] + [
            f"the {k} run (a {type(v).__name__})" for k, v in plan.runs.items()
            if v is not None and not isinstance(v, (str, Path))]
        if bad:
            raise ConfigError(f"processes={processes}: each process loads the runs from their directories "
                              f"and the policies from their specs (MODULE:NAME, FILE.py:NAME, a family "
                              f"name), "
                              f"but {', '.join(bad)} {'is an object' if len(bad) == 1 else 'are objects'}. "
                              f"Pass directories and specs, or processes=1.")
        return _run_pool(todo, plan, processes, progress)
    return _run_local(todo, plan, progress)


# ------------------------------------------------------------------------------------------ the report
def evaluate_closed_loop(runs: Mapping[str, Any], starts: StartStates,
                         policies: Mapping[str, Any] | Sequence[str], *, frames: int = DEFAULT_FRAMES,
                         steps: int = 8, seed: int = 0,
                         gate_scale: float | None = 2.0, batch: int = DEFAULT_BATCH,
                         variants: Sequence[str] | None = None, simulator: bool = True, processes: int = 1,
                         world_size: int = 1, resamples: int = 2000, progress: bool = True) -> dict[str, Any]:
    """Run each policy closed loop in the world models of ``runs`` and (``simulator``) in Meta-World, from
    every start state; rank them (see the module docstring).

    Args:
        runs: ``{"adapter": RUN}`` (its frozen base alone is the variant ``base``) and optionally
            ``"scratch"``: run directories (needed for ``processes > 1``), experiments or models.
        starts: Where the episodes start (:func:`fresh_starts`, or the recording's).
        policies: Specs (:func:`resolve_policy`), or ``{name: spec or callable}``.
        frames: The episodes' length in frames.
        steps: Sampling steps per chunk.
        seed: The seed of the rollouts (each episode draws its own noise from it).
        gate_scale: The adapter's learned gate times this, for the ``adapter`` variant.
        batch: Episodes per rollout call (the numbers are the same for any).
        variants: Of ``base``, ``adapter``, ``scratch`` (default: those ``runs`` allow).
        simulator: Also run every policy in Meta-World (the simulator twin).
        processes: Processes the jobs are spread over (the numbers are the same for any).
        world_size: torchrun ranks the jobs are spread over.
        resamples: Bootstrap resamples of the start states for ρ's interval.
        progress: Print each job as it finishes.

    Returns:
        A JSON-ready report: per variant the distances, successes and agreement (ρ) with the simulator.

    Raises:
        PolicyError: When a policy fails; its ``result`` is the report of everything finished before
            (``incomplete`` says what is missing).
        ConfigError: When ``runs`` lacks the adapter or a variant cannot run.
    """
    if "adapter" not in runs or runs["adapter"] is None:
        raise ConfigError(f"evaluate_closed_loop: runs must hold 'adapter' (the run whose base and adapter "
                          f"are evaluated), got {listing(sorted(runs))}.")
    known = ["base", "adapter"] + (["scratch"] if runs.get("scratch") is not None else [])
    variants = list(known if variants is None else variants)
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise ConfigError(f"--variants: {listing(unknown)} cannot be run here; choose of {listing(known)} "
                          f"(scratch needs --scratch RUN_DIR).")
    if isinstance(policies, Mapping):
        named = dict(policies)
    else:
        named = {}
        for spec in policies:
            if spec in named:
                raise ConfigError(f"policy {spec!r} is given twice; give each policy once.")
            named[spec] = spec
    if not named:
        raise ConfigError("evaluate_closed_loop: no policy to evaluate; give the family or --policy SPEC.")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--batch must be an int >= 1 (episodes per rollout call), got {batch!r}.")
    for spec in named.values():  # a policy that does not load fails here, before any compute
        resolve_policy(spec, seed=seed)
    model = _model(Plan(dict(runs), starts, named, frames, steps, seed, gate_scale, batch, 0, 0), "adapter")
    card = model.base.card
    window, context = int(model.base.clip().frames), int(getattr(card, "context_frames", 1))
    plan = Plan({k: v for k, v in runs.items() if v is not None}, starts, named, int(frames), int(steps),
                int(seed), gate_scale, int(batch), window, context)
    todo = jobs(plan, variants, simulator)
    if progress:
        print(f"closed loop: {len(named)} policies x {len(starts)} start states ({starts.describe()}), "
              f"{frames} frames, {steps} sampling steps; {len(todo)} jobs", flush=True)
    started = time.perf_counter()
    done = execute(todo, plan, processes=processes, world_size=world_size, progress=progress)
    report = assemble(plan, variants, simulator, done, todo, resamples=resamples)
    report.update({"processes": int(processes), "world_size": int(world_size),
                   "seconds": round(time.perf_counter() - started, 1)})
    errors = [d["error"] for d in done if "error" in d]
    if errors:
        raise PolicyError(errors[0], result=report)
    return report


def assemble(plan: Plan, variants: Sequence[str], simulator: bool, done: list[dict[str, Any]],
             todo: list[tuple], *, resamples: int = 2000) -> dict[str, Any]:
    """The report of the jobs ``done`` (of ``todo``): per episode the simulated and imagined distances, per
    variant the rank agreement (where every episode is done), per (task, policy) the means and successes."""
    from workbench.worldmodel.policies import PolicyEpisodes, agreement, success_of

    starts, keys = plan.starts, list(plan.policies)
    order = [(t, k, int(r)) for t in starts.tasks for k in keys for r in np.flatnonzero(starts.task == t)]
    n = len(order)
    row_of = {(k, r): i for i, (_, k, r) in enumerate(order)}
    sim = np.full(n, np.nan)
    ceiling = np.full(n, np.nan)
    imagined = {v: np.full(n, np.nan) for v in variants}
    cpu: dict[str, float] = {v: 0.0 for v in ("simulator", *variants)}
    for d in done:
        if "error" in d:
            continue
        job = d["job"]
        if job[0] == "sim":
            for r in range(len(starts)):
                sim[row_of[(job[1], r)]] = d["distance"][r]
                ceiling[row_of[(job[1], r)]] = d["probed"][r]
            cpu["simulator"] += d["cpu_seconds"]
        else:
            _, variant, key, lo = job
            for j, value in enumerate(d["distance"]):
                imagined[variant][row_of[(key, lo + j)]] = value
            cpu[variant] += d["cpu_seconds"]
    episodes = PolicyEpisodes({"task": np.array([t for t, _, _ in order]),
                               "policy": np.array([k for _, k, _ in order]),
                               "start": np.array([int(starts.index[r]) for _, _, r in order]),
                               "sim_distance": sim}, {"tasks": starts.tasks, "policies": keys})
    report: dict[str, Any] = {
        "kind": "closed loop", "tasks": starts.tasks, "policies": keys,
        "policy_specs": {k: (v if isinstance(v, str) else repr(v)) for k, v in plan.policies.items()},
        "start_states": {"source": starts.meta["source"], "per_task": starts.per_task,
                         "seed": starts.meta["seed"]},
        "episodes": n, "frames": plan.frames,
        "chunks": len(_schedule(plan)), "sampling_steps": plan.steps, "seed": plan.seed,
        "gate_scale": plan.gate_scale, "batch": plan.batch, "variants": {},
        "decision_rule": ("each chunk's actions chosen at the chunk boundary from the last frame "
                          "(imagined: produced by the model; simulated: rendered as the data were), the "
                          "probes' readings of it and the start state's goal"),
    }
    ranked = simulator and len(keys) >= 3 and not np.isnan(sim).any()
    columns = ({"probe_on_sim": ceiling} if simulator else {}) | imagined
    for name, values in columns.items():
        entry: dict[str, Any] = {"distance_m": _rounded(values),
                                 "cpu_seconds": round(cpu.get(name, 0.0), 1)}
        complete = not np.isnan(values).any()
        if complete:
            entry["success"] = success_of(values, episodes.task).tolist()
        if ranked and complete:
            entry["agreement"] = agreement(values, episodes, resamples=resamples, seed=plan.seed)
        report["variants"][name] = entry
    report["simulated_distance_m"] = _rounded(sim) if simulator else None
    report["simulator_cpu_seconds"] = round(cpu["simulator"], 1)
    report["episode_rows"] = [{"task": t, "start": int(starts.index[r]), "policy": k} for t, k, r in order]
    report["per_policy"] = _per_policy(report, episodes, columns, sim if simulator else None)
    if not ranked:
        report["ranking"] = ("not computed: " + ("no simulator run" if not simulator else
                                                 "fewer than 3 policies" if len(keys) < 3 else
                                                 "some simulated episodes are missing"))
    finished = {tuple(d["job"]) for d in done if "error" not in d}
    missing = [_job_text(j, plan) for j in todo if j not in finished]
    failed = [d["error"] for d in done if "error" in d]
    report["incomplete"] = ({"error": failed[0] if failed else None, "jobs_not_done": missing}
                            if missing else None)
    return report


def _schedule(plan: Plan) -> list:
    from workbench.inspect.recording.closed_loop import chunk_schedule

    return chunk_schedule(plan.window, plan.context, plan.frames)


def _rounded(values: np.ndarray) -> list:
    from workbench.worldmodel.policies import DISTANCE_DECIMALS

    return [None if np.isnan(v) else round(float(v), DISTANCE_DECIMALS) for v in values]


def _per_policy(report: dict[str, Any], episodes: Any, columns: dict[str, np.ndarray],
                sim: np.ndarray | None) -> list[dict[str, Any]]:
    from workbench.worldmodel.policies import SUCCESS_RADIUS

    out = []
    for task in report["tasks"]:
        for key in report["policies"]:
            rows = (episodes.task == task) & (episodes.policy == key)
            radius = SUCCESS_RADIUS[task]
            entry: dict[str, Any] = {"task": task, "policy": key}
            for name, values in [("simulator", sim), *columns.items()]:
                if values is None:
                    continue
                v = values[rows]
                entry[name] = (None if np.isnan(v).any() else
                               {"mean_distance_m": round(float(v.mean()), 5),
                                "success_rate": round(float(np.mean(v <= radius)), 4)})
            out.append(entry)
    return out


def format_closed_loop(report: dict[str, Any]) -> str:
    """The printed table: ρ per variant (all pairs and per task, with its interval) and, per (task, policy),
    the mean final distance and success rate, simulated against imagined."""
    tasks = report["tasks"]
    lines = [f"policies closed loop: {len(report['policies'])} policies x "
             f"{report['start_states']['per_task']} start states x {len(tasks)} tasks "
             f"({report['episodes']} episodes of {report['frames']} frames, "
             f"{report['chunks']} chunks), {report['sampling_steps']} sampling steps; "
             f"{report['start_states']['source']}"]
    if report.get("ranking"):
        lines.append(f"Spearman rho {report['ranking']}")
    else:
        lines.append(f"{'Spearman rho [95% bootstrap]':44}{'all (task, policy)':>24}"
                     + "".join(f"{t:>22}" for t in tasks) + f"{'CPU s':>8}")
        for name, v in report["variants"].items():
            a = v.get("agreement")
            if a is None:
                lines.append(f"{LABELS[name]:44}{'(incomplete)':>24}")
                continue
            cells = [_rho(a[k]) for k in ("all", *tasks)]
            lines.append(f"{LABELS[name]:44}{cells[0]:>24}" + "".join(f"{c:>22}" for c in cells[1:])
                         + f"{v['cpu_seconds']:8.0f}")
    names = (["simulator"] if report["simulated_distance_m"] is not None else []) + list(report["variants"])
    lines.append("mean final distance to the goal (cm), success rate in brackets, simulated and imagined:")
    width = max(32, *(len(e["task"] + e["policy"]) + 5 for e in report["per_policy"]))
    lines.append(f"  {'task / policy':{width}}" + "".join(f"{_short(n):>17}" for n in names))
    for entry in report["per_policy"]:
        row = f"  {entry['task'] + ' / ' + entry['policy']:{width}}"
        for n in names:
            cell = entry.get(n)
            row += (f"{'-':>17}" if cell is None else
                    f"{100 * cell['mean_distance_m']:10.1f} ({100 * cell['success_rate']:3.0f}%)")
        lines.append(row)
    if report.get("incomplete"):
        lines.append(f"incomplete: {len(report['incomplete']['jobs_not_done'])} jobs not done")
    return "\n".join(lines)


def _rho(a: dict[str, Any]) -> str:
    """ρ and its interval; a constant ranking (every policy imagined alike) has none."""
    values = [a.get(k) for k in ("rho", "low", "high")]
    if any(v is None or not np.isfinite(v) for v in values):
        return "n/a (ties)" if values[0] is None or not np.isfinite(values[0]) else f"{values[0]:+.2f} [n/a]"
    return f"{values[0]:+.2f} [{values[1]:+.2f}, {values[2]:+.2f}]"


def _short(name: str) -> str:
    return {"probe_on_sim": "sim. probes", "adapter": "base + adapter", "base": "base alone",
            "scratch": "from scratch"}.get(name, name)


# ------------------------------------------------------------------------------------------ the command
def run_closed_loop_eval(args: Any) -> int:
    """``workbench eval RUN --policies`` (closed loop): see the module docstring."""
    from workbench.train.distributed import launched_world_size
    from workbench.worldmodel.common import json_safe, load_run
    from workbench.worldmodel.policies import DEFAULT_GATE_SCALE, DEFAULT_STEPS, TASKS, load_policies

    world = launched_world_size()
    rank = int(os.environ.get("RANK", "0"))
    policies = ([] if args.no_family else _family_names()) + list(args.policy or [])
    for spec in policies:  # a policy that does not load fails now, before the runs and the start states
        resolve_policy(spec, seed=args.seed)
    if args.processes < 1:
        raise ConfigError(f"--processes must be >= 1, got {args.processes}.")
    loaded = {"adapter": load_run(args.run_dir), "scratch": load_run(args.scratch) if args.scratch else None}
    tasks = [t for t in args.tasks.split(",") if t] if getattr(args, "tasks", None) else list(TASKS)
    source = getattr(args, "start_states", None) or "fresh"
    if source == "fresh":
        per_task = args.episodes or DEFAULT_STARTS
        starts = fresh_starts(tasks, per_task, seed=args.start_seed)
    else:
        recording = load_policies(None if source == "recording" else source)
        starts = starts_from_recording(recording).select(per_task=args.episodes, tasks=tasks)
    # one process uses the runs loaded here; processes and ranks load them from their directories
    one = args.processes == 1 and world == 1
    runs = loaded if one else {"adapter": str(args.run_dir), "scratch": args.scratch or None}
    _LOADED.update({str(v): loaded[k] for k, v in runs.items() if isinstance(v, str)})
    variants = [v for v in args.variants.split(",") if v] if getattr(args, "variants", None) else None
    gate = args.gate_scale if args.gate_scale is not None else DEFAULT_GATE_SCALE
    frames = args.frames or DEFAULT_FRAMES
    out = Path(args.out) if args.out else None
    if out is None and rank == 0:
        print("(no --out: the numbers are printed only)")
    try:
        report = evaluate_closed_loop(runs, starts, policies, frames=frames, seed=args.seed, gate_scale=gate,
                                      steps=args.sampling_steps or DEFAULT_STEPS,
                                      batch=args.batch, variants=variants, simulator=not args.no_sim,
                                      processes=args.processes, world_size=world,
                                      progress=not args.no_progress and rank == 0)
    except PolicyError as err:
        if rank == 0 and err.result is not None:
            err.result["run"] = str(args.run_dir)
            print(format_closed_loop(err.result))
            _write(out, err.result, json_safe)
            err.args = (f"{err.args[0]} What was finished before it failed is kept"
                        f"{f' in {out}/metrics.json' if out else ' (printed above)'}.",)
        raise
    if rank != 0:
        return 0
    report["run"] = str(args.run_dir)
    report["torch_threads"] = int(os.environ.get("OMP_NUM_THREADS", "1"))
    print(format_closed_loop(report))
    _write(out, report, json_safe)
    return 0


def _family_names() -> list[str]:
    from workbench.worldmodel.policies import policy_names

    return policy_names()


def _write(out: Path | None, report: dict[str, Any], json_safe: Callable[[Any], Any]) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(json_safe(report), indent=1))
    print(f"wrote {out}/metrics.json")


__all__ = ["DEFAULT_BATCH", "DEFAULT_FRAMES", "DEFAULT_STARTS", "DEFAULT_START_SEED", "Plan", "StartStates",
           "assemble", "evaluate_closed_loop", "execute", "format_closed_loop", "fresh_starts",
           "groups", "imagine_closed_loop", "jobs", "resolve_policy", "run_closed_loop_eval", "run_group",
           "run_job", "starts_from_recording"]
