"""Policies judged in imagination: does the world model rank policies as the simulator does?

K policies act on Meta-World ``reach-v3`` and ``push-v3`` from N shared start states: the scripted
expert (``metaworld.policies``), the expert with Gaussian noise added to its actions at several
levels (:data:`NOISE_LEVELS`), and a random policy. :func:`record_policies` runs them in the
simulator and records, per episode, the actions, the rendered frames (the demo data's camera and
size) and the outcome: the final hand-to-goal distance (reach) or object-to-goal distance (push),
and success by the task's own threshold (:data:`SUCCESS_RADIUS`) on that distance.

:func:`imagine` replays each recorded action sequence as a rollout of the world model from the
shared start frame (:func:`workbench.inspect.rollout`), reads the outcome off the last predicted
frame with a probe (the hand probe for reach, the object probe for push) and
:func:`rank_agreement` reports the Spearman rank correlation between imagined and simulated
outcomes across the policies, with a bootstrap 95% interval over start states.

The shipped recording (:data:`SAMPLE_PATH`, no simulator needed to use it) was made with:

```bash
python -m workbench.worldmodel.policies --out workbench/data/samples/metaworld_policies.npz
```

(defaults: both tasks, 4 start states each, 61 frames = 4 chunks of the embedded model, seed 0).
``workbench eval RUN --policies --open-loop`` replays it (see ``docs/guides/policies.md``); without
``--open-loop`` the policies act closed loop (:mod:`workbench.worldmodel.closed_loop_eval`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.rows import DEFAULT_MICRO_BATCH
from workbench.errors import ConfigError, DataError, listing
from workbench.extras import distribution_version
from workbench.worldmodel.common import Columns

if TYPE_CHECKING:
    from workbench.core.composed import ComposedModel

SAMPLE_PATH = Path(__file__).resolve().parents[1] / "data" / "samples" / "metaworld_policies.npz"
TASKS = ("reach-v3", "push-v3")
#: The standard deviations of the Gaussian noise added to the expert's actions (actions lie in [-1, 1]).
NOISE_LEVELS = (0.1, 0.3, 0.6, 1.0)
#: Meta-World v3's success radius (metres) of each task, on the distance :data:`OUTCOME` names.
SUCCESS_RADIUS = {"reach-v3": 0.05, "push-v3": 0.05}
#: What each task's outcome measures: the distance from this body to the goal.
OUTCOME = {"reach-v3": "hand", "push-v3": "object"}
#: The decimals (of a metre: 0.01 mm) an imagined outcome is reported and ranked at. Below them a distance
#: read off a frame moves with the CPU's kernels, not with the policy: on some CPUs the probe's reading of one
#: frame changes in its last bits with the frame's row in the batch (2e-8 m seen), and a ranking that counted
#: those bits would order episodes that are the same.
DISTANCE_DECIMALS = 5
#: Frames of the recorded episodes kept in the sample file (every third and the last): the rollout needs
#: only the first; the rest let a reader see the episodes and check the probes on true frames.
FRAME_STRIDE = 3
FORMAT = 1


def policy_names(noise_levels: Sequence[float] = NOISE_LEVELS) -> list[str]:
    """``expert``, ``expert+noise0.1`` ..., ``random``: the K policies, best first by design."""
    return ["expert", *[f"expert+noise{s:g}" for s in noise_levels], "random"]


def _noise_of(name: str) -> float | None:
    """The noise std of a policy name; ``None`` for the random policy."""
    if name == "expert":
        return 0.0
    if name.startswith("expert+noise"):
        return float(name.removeprefix("expert+noise"))
    return None


# ------------------------------------------------------------------------------------------ simulator


def _reset(task_env: Any, seed: int, task_index: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Reset to start state ``start`` of the task: the env's own object/goal placement and a warm-up that
    moves the hand to a random point (as the demo data's episodes begin), both seeded. Returns the
    observation and the rng the policy noise continues from."""
    env = task_env.env
    rng = np.random.default_rng([int(seed), task_index, start])
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env.np_random = np.random.default_rng(int(rng.integers(2**63)))
    obs, _ = env.reset()
    env._freeze_rand_vec = True
    point = rng.uniform((-0.2, 0.5, 0.1), (0.2, 0.75, 0.25))
    grip = rng.uniform(-1.0, 1.0)
    for _ in range(20):
        action = np.append(np.clip(10.0 * (point - obs[:3]), -1.0, 1.0), grip).astype(np.float32)
        obs, *_ = env.step(action)
    return obs, rng


def _episode(task_env: Any, task: str, obs: np.ndarray, policy: str, rng: np.random.Generator, frames: int,
             action_repeat: int) -> dict[str, Any]:
    from workbench.worldmodel.sim import PROPRIO_NAMES

    env = task_env.env
    noise = _noise_of(policy)
    out = {"frames": np.zeros((frames, *task_env.render().shape), np.uint8),
           "actions": np.zeros((frames, 4), np.float32), "ee_pos": np.zeros((frames, 3), np.float32),
           "object_pos": np.zeros((frames, 3), np.float32), "proprio": np.zeros((frames, len(PROPRIO_NAMES)),
                                                                                np.float32)}
    success_any = False
    for t in range(frames):
        out["frames"][t] = task_env.render()
        out["ee_pos"][t] = obs[:3]
        out["object_pos"][t] = obs[4:7]
        out["proprio"][t, 0] = obs[3]
        out["proprio"][t, 1:] = env.data.qpos[task_env.qpos_index]
        if noise is None:
            action = rng.uniform(-1.0, 1.0, size=4)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                action = np.asarray(task_env.policy.get_action(obs), np.float64)
            action = action + rng.normal(0.0, noise, size=4)
        action = np.clip(action, -1.0, 1.0).astype(np.float32)
        out["actions"][t] = action
        for _ in range(action_repeat):
            obs, _, _, _, info = env.step(action)
            success_any = success_any or bool(info.get("success", False))
    out["goal"] = obs[-3:].astype(np.float32)
    out["success_any"] = success_any
    return out


def record_policies(out: str | Path, *, tasks: Sequence[str] = TASKS, starts: int = 4, frames: int = 61,
                    seed: int = 0, noise_levels: Sequence[float] = NOISE_LEVELS, action_repeat: int = 2,
                    progress: bool = True) -> Path:
    """Run the K policies from ``starts`` shared start states per task in Meta-World; write ``out`` (.npz).

    The file holds, per episode ``e`` (task-major, then start, then policy): ``actions[e]`` ``(T, 4)``,
    ``ee_pos[e]`` / ``object_pos[e]`` ``(T, 3)`` metres, ``proprio[e]``, ``frames[e]`` (the frames of
    ``frame_index``, uint8 ``(F, 64, 64, 3)``; index 0 is the shared start frame), ``goal[e]``,
    ``sim_distance[e]`` (the outcome at the last frame, metres), ``sim_success[e]`` (``sim_distance`` within
    :data:`SUCCESS_RADIUS`) and ``sim_success_any[e]`` (the env's success at any step), and ``meta`` (JSON).
    """
    from workbench.worldmodel.sim import DEFAULT_CAMERA, TaskEnv, check_args, import_simulator

    mujoco = import_simulator()
    tasks = check_args(list(tasks), starts, frames, 64, DEFAULT_CAMERA, action_repeat)
    unknown = [t for t in tasks if t not in OUTCOME]
    if unknown:
        raise ConfigError(f"tasks: {listing(unknown)} have no outcome measure here; policies are judged on "
                          f"{listing(list(OUTCOME))}.")
    names = policy_names(noise_levels)
    frame_index = np.unique(np.r_[np.arange(0, frames, FRAME_STRIDE), frames - 1])
    columns: dict[str, list[Any]] = {k: [] for k in ("actions", "ee_pos", "object_pos", "proprio", "frames",
                                                     "goal", "sim_distance", "sim_success", "sim_success_any",
                                                     "task", "start", "policy")}
    started = time.perf_counter()
    for ti, task in enumerate(tasks):
        task_env = TaskEnv(task, 64, DEFAULT_CAMERA, max_steps=(frames + 20) * action_repeat)
        try:
            for s in range(starts):
                for pi, policy in enumerate(names):
                    obs, _ = _reset(task_env, seed, ti, s)
                    noise_rng = np.random.default_rng([int(seed), ti, s, 1000 + pi])
                    ep = _episode(task_env, task, obs, policy, noise_rng, frames, action_repeat)
                    body = ep["ee_pos"] if OUTCOME[task] == "hand" else ep["object_pos"]
                    distance = float(np.linalg.norm(body[-1] - ep["goal"]))
                    for key in ("actions", "ee_pos", "object_pos", "proprio", "goal"):
                        columns[key].append(ep[key])
                    columns["frames"].append(ep["frames"][frame_index])
                    columns["sim_distance"].append(distance)
                    columns["sim_success"].append(distance <= SUCCESS_RADIUS[task])
                    columns["sim_success_any"].append(ep["success_any"])
                    columns["task"].append(task)
                    columns["start"].append(s)
                    columns["policy"].append(policy)
                    if progress:
                        print(f"{task} start {s} {policy:16} distance {100 * distance:6.1f} cm", flush=True)
        finally:
            task_env.close()
    meta = {"format": FORMAT, "generator": "workbench.worldmodel.policies", "tasks": list(tasks),
            "starts": int(starts), "frames": int(frames), "seed": int(seed), "policies": names,
            "noise_levels": [float(s) for s in noise_levels], "action_repeat": int(action_repeat),
            "camera": DEFAULT_CAMERA, "size": 64, "outcome": {t: OUTCOME[t] for t in tasks},
            "success_radius_m": {t: SUCCESS_RADIUS[t] for t in tasks}, "frame_stride": FRAME_STRIDE,
            "metaworld_version": distribution_version("metaworld"), "mujoco_version": mujoco.__version__,
            "command": f"python -m workbench.worldmodel.policies --tasks {','.join(tasks)} --starts {starts} "
                       f"--frames {frames} --seed {seed} --out {Path(out).name}"}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    arrays["task"] = arrays["task"].astype("U16")
    arrays["policy"] = arrays["policy"].astype("U32")
    np.savez_compressed(out, frame_index=frame_index, meta=np.array(json.dumps(meta, sort_keys=True)),
                        **arrays)
    if progress:
        print(f"wrote {out}: {len(arrays['task'])} episodes, {out.stat().st_size / 1e6:.2f} MB, "
              f"{time.perf_counter() - started:.0f} s")
    return out


# ------------------------------------------------------------------------------------------ the recording

ARRAYS = ("actions", "ee_pos", "object_pos", "proprio", "frames", "frame_index", "goal", "sim_distance",
          "sim_success", "sim_success_any", "task", "start", "policy", "meta")


@dataclasses.dataclass(frozen=True)
class PolicyEpisodes(Columns):
    """A recording of :func:`record_policies` (loaded by :func:`load_policies`); one row per episode."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    path: Path | None = None

    @property
    def policies(self) -> list[str]:
        return list(self.meta["policies"])

    @property
    def tasks(self) -> list[str]:
        return list(self.meta["tasks"])

    def select(self, starts: int | None = None, tasks: Sequence[str] | None = None) -> PolicyEpisodes:
        """The episodes of the first ``starts`` start states of ``tasks`` (default: all)."""
        keep = np.ones(len(self), bool)
        if starts is not None:
            if starts < 1:
                raise ConfigError(f"--episodes: the number of start states per task must be >= 1, "
                                  f"got {starts}.")
            keep &= self.start < starts
        if tasks is not None:
            unknown = [t for t in tasks if t not in self.tasks]
            if unknown:
                raise ConfigError(f"tasks: {listing(unknown)} are not in the recording, which holds "
                                  f"{listing(self.tasks)}.")
            keep &= np.isin(self.task, list(tasks))
        arrays = {k: (v[keep] if v.ndim and len(v) == len(self) and k != "frame_index" else v)
                  for k, v in self.arrays.items()}
        meta = {**self.meta, "tasks": [t for t in self.tasks if tasks is None or t in tasks],
                "starts": min(self.meta["starts"], starts or self.meta["starts"])}
        return PolicyEpisodes(arrays, meta, self.path)


def load_policies(path: str | Path | None = None) -> PolicyEpisodes:
    """The recorded policy episodes of ``path``, checked.

    Args:
        path: A policy recording (default: the shipped :data:`SAMPLE_PATH`).

    Returns:
        The episodes, one row per episode (their arrays and the recording's metadata).

    Raises:
        DataError: When the file is missing, not a policy recording, or lacks an array.
    """
    path = Path(path) if path is not None else SAMPLE_PATH
    if not path.is_file():
        raise DataError(f"Policy recording not found: {path}. Record one with "
                        f"`python -m workbench.worldmodel.policies --out {path}` (needs Meta-World), "
                        f"or leave the path out for the shipped one.")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as err:
        raise DataError(f"{path} is not a policy recording "
                        f"(an .npz of `python -m workbench.worldmodel.policies`): "
                        f"{type(err).__name__}: {err}. Record it again.") from err
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        raise DataError(f"{path} lacks {listing(missing)}; a policy recording holds {listing(list(ARRAYS))}. "
                        f"Record it again with `python -m workbench.worldmodel.policies --out {path}`.")
    meta = json.loads(str(arrays.pop("meta")))
    n = len(arrays["task"])
    bad = [k for k in ARRAYS if k not in ("meta", "frame_index") and len(arrays[k]) != n]
    if bad:
        raise DataError(f"{path}: {listing(bad)} do not hold one row per episode ({n}); the file is damaged. "
                        f"Record it again.")
    return PolicyEpisodes(arrays, meta, path)


# ------------------------------------------------------------------------------------------ statistics


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of ``x``, ties given their average rank (as ``scipy.stats.rankdata``)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks, minlength=len(values))
    counts = np.bincount(inverse, minlength=len(values))
    return (sums / counts)[inverse]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (NaN when either is constant)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise DataError(f"spearman: needs two 1-D sequences of the same length >= 2, "
                        f"got shapes {a.shape} and {b.shape}.")
    ra, rb = rankdata(a) - (len(a) + 1) / 2, rankdata(b) - (len(b) + 1) / 2
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`spearman` of each row of ``a`` with the same row of ``b`` (2-D, one row per resample), to the
    bit: a value's average rank is the count of smaller values plus half of (the count of equal ones + 1).
    Rows with a NaN go through :func:`spearman` itself, which ranks a NaN above every number."""
    def centred_ranks(x):
        less = (x[:, None, :] < x[:, :, None]).sum(-1)
        equal = (x[:, None, :] == x[:, :, None]).sum(-1)
        return less + (equal + 1) / 2 - (x.shape[1] + 1) / 2

    ra, rb = centred_ranks(a), centred_ranks(b)
    denom = np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(denom > 0, (ra * rb).sum(1) / np.where(denom > 0, denom, 1), np.nan)
    for row in np.flatnonzero(np.isnan(a).any(1) | np.isnan(b).any(1)):
        rho[row] = spearman(a[row], b[row])
    return rho


def policy_means(values: np.ndarray, groups: np.ndarray, starts: np.ndarray,
                 pick: np.ndarray | None = None) -> dict:
    """Mean of ``values`` per group (a policy of a task) over the start states ``pick`` (default all)."""
    out = {}
    for g in dict.fromkeys(groups.tolist()):
        rows = np.flatnonzero(groups == g)
        if pick is not None:
            by_start = {int(starts[r]): r for r in rows}
            rows = np.array([by_start[int(s)] for s in pick])
        out[g] = float(values[rows].mean())
    return out


def rank_agreement(imagined: np.ndarray, simulated: np.ndarray, groups: Sequence[str], starts: Sequence[int],
                   strata: Sequence[str] | None = None, *, resamples: int = 2000,
                   seed: int = 0) -> dict[str, Any]:
    """Spearman ρ between the mean imagined and mean simulated outcome of each group (a policy on a task),
    with a bootstrap 95% interval: start states are resampled with replacement (within each stratum, a
    task) and both means recomputed from the same resample.

    Args:
        imagined: The imagined outcome of each episode.
        simulated: The simulated outcome of each episode.
        groups: Each episode's group (a policy on a task).
        starts: Each episode's start state, the unit the bootstrap resamples.
        strata: Each episode's stratum (a task), within which starts are resampled (None: one stratum).
        resamples: Bootstrap resamples.
        seed: The seed of the bootstrap.

    Returns:
        ``rho``, ``low``, ``high`` (2.5 / 97.5 percentiles of the resampled ρ, NaN resamples dropped),
        ``groups`` and the means.
    """
    imagined, simulated = np.asarray(imagined, np.float64), np.asarray(simulated, np.float64)
    groups, starts = np.asarray(groups), np.asarray(starts)
    strata = np.asarray(strata) if strata is not None else np.zeros(len(groups), int)
    if not (len(imagined) == len(simulated) == len(groups) == len(starts) == len(strata)):
        raise DataError(f"rank_agreement: imagined ({len(imagined)}), simulated ({len(simulated)}), groups "
                        f"({len(groups)}), starts ({len(starts)}) and strata ({len(strata)}) "
                        f"must have one entry per episode.")
    keys = list(dict.fromkeys(groups.tolist()))
    if len(keys) < 3:
        raise DataError(f"rank_agreement: needs at least 3 policies to rank, "
                        f"got {len(keys)} ({listing(keys)}).")
    sim_m, ima_m = policy_means(simulated, groups, starts), policy_means(imagined, groups, starts)
    rho = spearman([ima_m[k] for k in keys], [sim_m[k] for k in keys])
    rng = np.random.default_rng(seed)
    by_stratum = {s: np.unique(starts[strata == s]) for s in dict.fromkeys(strata.tolist())}
    # The resamples are drawn one at a time, stratum by stratum (the generator's stream, so the same seed
    # gives the same interval as ever), then every group's means are taken for all resamples at once: row r
    # of `chosen` holds, for each start state drawn in resample r, the episode of the group from that start.
    picks = {s: np.empty((resamples, len(v)), np.int64) for s, v in by_stratum.items()}
    for i in range(resamples):
        for s, v in by_stratum.items():
            picks[s][i] = np.searchsorted(v, rng.choice(v, size=len(v), replace=True))
    ima, sim = np.empty((resamples, len(keys))), np.empty((resamples, len(keys)))
    for j, k in enumerate(keys):
        rows = np.flatnonzero(groups == k)
        s = strata[rows[0]].item()
        by_start = {int(starts[r]): r for r in rows}
        table = np.array([by_start.get(int(v), -1) for v in by_stratum[s]])
        chosen = table[picks[s]]
        if (chosen < 0).any():  # a start state of the stratum this group has no episode from
            raise DataError(f"rank_agreement: group {k!r} has no episode from start state(s) "
                            f"{by_stratum[s][table < 0].tolist()} of its stratum {s!r}; every group of a "
                            f"stratum needs one episode from each of the stratum's start states.")
        ima[:, j] = imagined[chosen].mean(axis=1)
        sim[:, j] = simulated[chosen].mean(axis=1)
    boot = _spearman_rows(ima, sim)
    finite = boot[np.isfinite(boot)]
    low, high = (np.percentile(finite, [2.5, 97.5]) if len(finite) else (np.nan, np.nan))
    return {"rho": rho, "low": float(low), "high": float(high), "resamples": int(resamples),
            "degenerate_resamples": int(len(boot) - len(finite)), "groups": keys,
            "imagined_mean": [ima_m[k] for k in keys], "simulated_mean": [sim_m[k] for k in keys]}


# ------------------------------------------------------------------------------------------ imagination

#: The variants :func:`evaluate_policies` replays the recording in, with their labels.
VARIANT_LABELS = {"base": "frozen base alone", "adapter": "base + adapter", "scratch": "from scratch",
                  "probe_on_truth": "probes on the simulator's frames (ceiling)"}
#: The demo samples the adapter with its learned gate doubled (docs/results/what-we-tried.md); so does this.
DEFAULT_GATE_SCALE = 2.0
DEFAULT_STEPS = 8


def start_clips(episodes: PolicyEpisodes) -> dict[str, Any]:
    """The collated start clips of the episodes: the shared start frame (``video`` ``(B, 3, 1, H, W)``), the
    hand position and proprioception at it, and the camera's calibration (the demo data's preset)."""
    import torch

    from workbench.data.camera import CameraCalibration
    from workbench.worldmodel.sim import CAMERAS

    camera = episodes.meta.get("camera", "corner2_close")
    if camera not in CAMERAS:
        raise DataError(f"The recording's camera {camera!r} is not a preset ({listing(list(CAMERAS))}); "
                        f"the world model was trained on {listing(list(CAMERAS))} frames. "
                        f"Record it with the default camera.")
    preset, size = CAMERAS[camera], int(episodes.meta.get("size", 64))
    vector = CameraCalibration.look_at(preset.pos, preset.lookat, preset.fovy, size, size).vector()
    first = torch.from_numpy(np.ascontiguousarray(episodes.frames[:, :1]))  # (B, 1, H, W, 3)
    return {"video": first.permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0),
            "ee_pos": torch.from_numpy(episodes.ee_pos[:, :1].astype(np.float32)),
            "proprio": torch.from_numpy(episodes.proprio[:, :1].astype(np.float32)),
            "camera": torch.from_numpy(np.asarray(vector, np.float32))[None].expand(len(episodes),
                                                                                     -1).clone()}


def outcome_distance(frames: np.ndarray, episodes: PolicyEpisodes, *, hand_probe: Any = None,
                     object_probe: Any = None, micro_batch: int | None = DEFAULT_MICRO_BATCH) -> np.ndarray:
    """Each episode's outcome read off its frame ``frames[e]`` (uint8 ``(B, H, W, 3)``): the distance (metres)
    from the goal to the hand (reach) or the object (push), as the probes read them. The probes read
    ``micro_batch`` frames per call (the last call padded), so an episode's distance does not depend on which
    other episodes are scored with it (``None``: all of a task's frames in one call)."""
    from workbench.core.rows import in_micro_batches
    from workbench.worldmodel.probe import shipped_object_probe, shipped_probe

    out = np.full(len(episodes), np.nan)
    for task in dict.fromkeys(episodes.task.tolist()):
        rows = np.flatnonzero(episodes.task == task)
        body = OUTCOME[task]
        probe = ((hand_probe or shipped_probe()) if body == "hand"
                 else (object_probe or shipped_object_probe()))
        read = in_micro_batches(probe.positions, micro_batch, len(rows), frames[rows])
        out[rows] = np.linalg.norm(read - episodes.goal[rows], axis=-1)
    return out


def imagine(model: ComposedModel, episodes: PolicyEpisodes, *, steps: int = DEFAULT_STEPS, seed: int = 0,
            with_adapter: bool = True, gate_scale: float | None = None, batch: int = 24, state: Any = "probe",
            hand_probe: Any = None, object_probe: Any = None, progress: bool = False,
            micro_batch: int | None = DEFAULT_MICRO_BATCH) -> dict[str, Any]:
    """Replay every episode's actions as a rollout of the world model ``model`` from its start frame and
    score the last predicted frame.

    The results do not depend on ``batch`` (episodes per rollout) or on which episodes are imagined together:
    episode ``e`` (its row in ``episodes``) is rolled out as episode ``e`` (its own noise), and the networks
    and the probes run ``micro_batch`` episodes per call (:func:`workbench.inspect.rollout`).

    Args:
        model: The composed model (an experiment's is ``exp.model``).
        episodes: The recorded policy episodes (:func:`load_policies`).
        steps: Sampling steps per chunk.
        seed: The seed of the rollouts.
        with_adapter: False rolls out the frozen base alone.
        gate_scale: Sample with the adapter's learned gate times this.
        batch: Episodes rolled out together (the results are the same for any).
        state: Where a chunk's state comes from, as :func:`workbench.inspect.rollout` takes it.
        hand_probe: The probe reading the hand off the last frame (default: the shipped one).
        object_probe: The probe reading the object off the last frame (default: the shipped one).
        progress: Print progress.
        micro_batch: Episodes per call of the networks and the probes, or ``None`` for one call over
            the batch (then the last bits depend on the batch).

    Returns:
        ``distance`` (metres, per episode, from the goal to the hand for reach or the object for push),
        ``success`` (within :data:`SUCCESS_RADIUS`), ``final_frames`` (uint8 ``(B, H, W, 3)``) and
        ``cpu_seconds`` (process time of the rollouts).
    """
    import torch

    from workbench.inspect.recording.rollouts import rollout

    clips = start_clips(episodes)
    actions = torch.from_numpy(np.clip(episodes.actions, -1.0, 1.0).astype(np.float32))
    finals = []
    started = time.process_time()
    for lo in range(0, len(episodes), batch):
        part = {k: v[lo:lo + batch] for k, v in clips.items()}
        n = part["video"].shape[0]
        ro = rollout(model, part, actions[lo:lo + batch], steps=steps, seed=seed, state=state,
                     gate_scale=gate_scale if with_adapter else None, store=False,
                     with_adapter=with_adapter, episodes=range(lo, lo + n), micro_batch=micro_batch)
        finals.append(ro.frame(-1))  # the outcome's frame: the only one decoded
        if progress:
            print(f"  rolled out {min(lo + batch, len(episodes))}/{len(episodes)} episodes", flush=True)
    cpu = time.process_time() - started
    final = np.concatenate(finals)
    distance = outcome_distance(final, episodes, hand_probe=hand_probe, object_probe=object_probe,
                                micro_batch=micro_batch)
    return {"distance": distance, "success": success_of(distance, episodes.task), "final_frames": final,
            "cpu_seconds": cpu}


def success_of(distance: np.ndarray, tasks: np.ndarray) -> np.ndarray:
    """``distance`` within each episode's task's :data:`SUCCESS_RADIUS`."""
    return np.array([d <= SUCCESS_RADIUS[str(t)] for d, t in zip(distance, tasks, strict=True)])


def agreement(distance: np.ndarray, episodes: PolicyEpisodes, *, resamples: int = 2000,
              seed: int = 0) -> dict[str, Any]:
    """:func:`rank_agreement` of ``distance`` with the simulated outcomes: over every (task, policy) pair
    (``all``) and within each task, plus the success rates per (task, policy). ``distance`` counts to
    :data:`DISTANCE_DECIMALS`, as reported."""
    distance = np.round(np.asarray(distance, np.float64), DISTANCE_DECIMALS)
    groups = np.array([f"{t}/{p}" for t, p in zip(episodes.task, episodes.policy, strict=True)])
    out = {"all": rank_agreement(distance, episodes.sim_distance, groups, episodes.start, episodes.task,
                                 resamples=resamples, seed=seed)}
    for task in episodes.tasks:
        rows = episodes.task == task
        out[task] = rank_agreement(distance[rows], episodes.sim_distance[rows], groups[rows],
                                   episodes.start[rows], resamples=resamples, seed=seed)
    success = success_of(distance, episodes.task)
    out["success_rate"] = {g: float(success[groups == g].mean()) for g in out["all"]["groups"]}
    out["episode_rho"] = spearman(distance, episodes.sim_distance)
    return out


def evaluate_policies(runs: dict[str, Any], episodes: PolicyEpisodes | None = None, *,
                      steps: int = DEFAULT_STEPS, seed: int = 0,
                      gate_scale: float | None = DEFAULT_GATE_SCALE, batch: int = 24,
                      resamples: int = 2000, variants: Sequence[str] | None = None,
                      progress: bool = True) -> dict[str, Any]:
    """Replay the recorded policies in each world model of ``runs`` and rank them against the simulator.

    Args:
        runs: ``{"adapter": exp}`` (its frozen base alone is evaluated too, as ``base``) and optionally
            ``"scratch"``: a from-scratch run.
        episodes: The recorded policy episodes (default: :func:`load_policies`'s shipped ones).
        steps: Sampling steps per chunk.
        seed: The seed of the rollouts and the bootstrap.
        gate_scale: Sample with the adapter's learned gate times this.
        batch: Episodes rolled out together.
        resamples: Bootstrap resamples of the rank agreement's interval.
        variants: Which of ``base``, ``adapter``, ``scratch`` to replay (default: all that ``runs``
            allows).
        progress: Print progress.

    Returns:
        A JSON-ready report: per variant the rank agreement (:func:`agreement`), the imagined distances and
        the CPU seconds; ``probe_on_truth`` scores the simulator's own last frames with the probes (the
        ceiling of the scoring).
    """
    episodes = episodes if episodes is not None else load_policies()
    if "adapter" not in runs:
        raise ConfigError(f"evaluate_policies: runs must hold 'adapter' (the run whose base and adapter are "
                          f"evaluated), got {listing(sorted(runs))}.")
    plan = [("base", runs["adapter"], False), ("adapter", runs["adapter"], True)]
    if runs.get("scratch") is not None:
        plan.append(("scratch", runs["scratch"], True))
    if variants is not None:
        known = [name for name, _, _ in plan]
        unknown = [v for v in variants if v not in known]
        if unknown:
            raise ConfigError(f"--variants: {listing(unknown)} cannot be replayed here; "
                              f"choose of {listing(known)} (scratch needs --scratch RUN_DIR).")
        plan = [p for p in plan if p[0] in variants]
    report: dict[str, Any] = {"episodes": len(episodes), "tasks": episodes.tasks,
                              "policies": episodes.policies, "starts": int(episodes.meta["starts"]),
                              "frames": int(episodes.actions.shape[1]),
                              "sampling_steps": int(steps), "seed": int(seed), "gate_scale": gate_scale,
                              "micro_batch": DEFAULT_MICRO_BATCH,
                              "recording": episodes.meta.get("command"), "variants": {}}
    truth = outcome_distance(episodes.frames[:, -1], episodes)
    report["variants"]["probe_on_truth"] = {"agreement": agreement(truth, episodes, resamples=resamples,
                                                                   seed=seed),
                                            "distance_m": truth.round(DISTANCE_DECIMALS).tolist(),
                                            "cpu_seconds": 0.0}
    for name, exp, on in plan:
        if progress:
            print(f"{VARIANT_LABELS[name]}: {len(episodes)} episodes of {episodes.actions.shape[1]} frames, "
                  f"{steps} steps", flush=True)
        got = imagine(exp.model, episodes, steps=steps, seed=seed, with_adapter=on,
                      # (the scratch run's model has no gate)
                      gate_scale=gate_scale if name == "adapter" else None, batch=batch, progress=progress)
        report["variants"][name] = {"agreement": agreement(got["distance"], episodes, resamples=resamples,
                                                           seed=seed),
                                    "distance_m": got["distance"].round(DISTANCE_DECIMALS).tolist(),
                                    "cpu_seconds": round(got["cpu_seconds"], 1)}
    report["simulated_distance_m"] = episodes.sim_distance.round(DISTANCE_DECIMALS).tolist()
    report["episode_rows"] = [{"task": str(t), "start": int(s), "policy": str(p)}
                              for t, s, p in zip(episodes.task, episodes.start, episodes.policy, strict=True)]
    return report


def format_report(report: dict[str, Any]) -> str:
    """The ranking table: ρ with its interval per variant (all pairs and per task), and the policy means."""
    tasks = report["tasks"]
    lines = [f"policy ranking in imagination: {len(report['policies'])} policies "
             f"x {report['starts']} start states x {len(tasks)} tasks "
             f"({report['episodes']} episodes of {report['frames']} frames), "
             f"{report['sampling_steps']} sampling steps",
             f"{'Spearman rho [95% bootstrap]':44}{'all (task, policy)':>24}"
             + "".join(f"{t:>22}" for t in tasks) + f"{'CPU s':>8}"]
    for name, v in report["variants"].items():
        a = v["agreement"]
        cells = [f"{a[k]['rho']:+.2f} [{a[k]['low']:+.2f}, {a[k]['high']:+.2f}]" for k in ("all", *tasks)]
        lines.append(f"{VARIANT_LABELS[name]:44}{cells[0]:>24}" + "".join(f"{c:>22}" for c in cells[1:])
                     + f"{v['cpu_seconds']:8.0f}")
    lines.append("mean final distance to the goal (cm), simulator vs imagined; success rate in brackets:")
    names = list(report["variants"])
    lines.append(f"  {'task / policy':32}{'simulator':>17}" + "".join(f"{n:>17}" for n in names))
    sim = report["variants"][names[0]]["agreement"]["all"]
    for i, g in enumerate(sim["groups"]):
        row = f"  {g:32}{100 * sim['simulated_mean'][i]:10.1f} {_sim_success(report, g)}"
        for n in names:
            a = report["variants"][n]["agreement"]
            row += f"{100 * a['all']['imagined_mean'][i]:10.1f} ({100 * a['success_rate'][g]:3.0f}%)"
        lines.append(row)
    return "\n".join(lines)


def _sim_success(report: dict[str, Any], group: str) -> str:
    rows = [i for i, r in enumerate(report["episode_rows"]) if f"{r['task']}/{r['policy']}" == group]
    d = np.asarray(report["simulated_distance_m"])[rows]
    radius = SUCCESS_RADIUS[group.split("/")[0]]
    return f"({100 * float(np.mean(d <= radius)):3.0f}%)"


def run_eval(args: Any, exp: Any) -> int:
    """``workbench eval RUN --policies --open-loop``: replay the shipped recording (or ``--policy-data``) in
    ``exp``."""
    import os

    out = getattr(args, "out", None)
    episodes = load_policies(getattr(args, "policy_data", None))
    tasks = [t for t in args.tasks.split(",") if t] if getattr(args, "tasks", None) else None
    episodes = episodes.select(starts=getattr(args, "episodes", None), tasks=tasks)
    scratch = None
    if getattr(args, "scratch", None):
        from workbench.worldmodel.common import load_run

        scratch = load_run(args.scratch)
    gate = args.gate_scale if getattr(args, "gate_scale", None) is not None else DEFAULT_GATE_SCALE
    variants = [v for v in args.variants.split(",") if v] if getattr(args, "variants", None) else None
    report = evaluate_policies({"adapter": exp, "scratch": scratch}, episodes,
                               steps=args.sampling_steps or DEFAULT_STEPS, seed=args.seed, gate_scale=gate,
                               variants=variants, progress=not args.no_progress)
    report["run"] = str(args.run_dir)
    report["torch_threads"] = int(os.environ.get("OMP_NUM_THREADS", "1"))
    print(format_report(report))
    if out:
        from workbench.worldmodel.common import json_safe

        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "policy_ranking.json").write_text(json.dumps(json_safe(report), indent=1))
        print(f"wrote {out}/policy_ranking.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.worldmodel.policies",
                                     description="Record K policies on Meta-World from shared start states.")
    parser.add_argument("--tasks", default=",".join(TASKS), help="(default: %(default)s)")
    parser.add_argument("--starts", type=int, default=4, help="start states per task (default: %(default)s)")
    parser.add_argument("--frames", type=int, default=61, help="frames per episode (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--out", default=str(SAMPLE_PATH),
                        help="the .npz to write (default: the shipped sample)")
    args = parser.parse_args(argv)
    record_policies(args.out, tasks=[t for t in args.tasks.split(",") if t], starts=args.starts,
                    frames=args.frames, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["NOISE_LEVELS", "SAMPLE_PATH", "TASKS", "PolicyEpisodes", "agreement", "evaluate_policies",
           "format_report", "imagine", "load_policies", "policy_names", "rank_agreement", "rankdata",
           "record_policies", "spearman"]
