"""Generate robot-arm video with actions from Meta-World v3 (``workbench data metaworld``).

Each episode is one Meta-World v3 task (goal-observable variant) with freshly randomised object
and goal positions, driven for exactly ``frames`` control steps by the package's scripted expert
policy (``metaworld.policies``) **perturbed so that the actions are diverse**. The frame stored at
step ``t`` is rendered *before* action ``t`` is applied, so frame ``t + 1`` is the result of action
``t`` (the result of the last action is not stored). The file layout is documented in
:mod:`workbench.data.metaworld`.

Action perturbation (recorded as JSON in the file attribute ``action_perturbation``):

* **Random start.** After the reset, the hand is driven for ``start_steps`` unrecorded steps
  towards a point drawn uniformly in the box ``target_low``..``target_high`` (gripper command
  uniform in [-1, 1]), so episodes do not all start from Meta-World's fixed home pose.
* **Random segments.** Every episode alternates between *expert* stretches and *random*
  stretches. Stretch lengths are drawn uniformly: random segments last ``segment_min`` to
  ``segment_max`` steps, and the expert gaps between them are drawn so that on average a fraction
  ``segment_fraction`` of the steps is random (an episode may start in either mode). During a
  random segment the expert is replaced by a smooth random action: a target point is drawn
  uniformly in the box ``target_low``..``target_high`` (the part of the workspace the camera sees
  well) and the arm is driven towards it by a proportional controller,
  ``clip(gain * (target - hand), -speed, speed)``, with ``gain`` and ``speed`` drawn per segment
  from ``gain_range`` and ``speed_range``; the gripper command is drawn once per segment, uniform
  in [-1, 1]. The motion is therefore smooth but its direction, speed and gripper state are
  unrelated to the task, so what the arm does next depends on the actions, not on the task alone.
* **Gaussian noise** with standard deviation ``noise_std`` (xyz) and ``grip_noise_std``
  (gripper) is added to every action, expert or random.
* The result is clipped to [-1, 1] and cast to float32, and that exact float32 action is what the
  environment executes and what is stored: stored actions are the executed actions.
* With ``action_repeat = k`` each stored action is applied for ``k`` simulator control steps and
  one frame is stored per ``k`` steps (``fps = 1 / (env.dt * k)``; Meta-World's own rate is 80 Hz).

Rendering is offscreen MuJoCo (``MUJOCO_GL=egl`` unless the variable is already set, set before
MuJoCo is imported) with shadows, reflections and multisampling off (about 8–20 ms per 64×64
frame on a CPU instead of ~200 ms). The default camera ``corner2_close`` is Meta-World's
``corner2`` viewpoint (behind and to the right of the robot, looking over its shoulder at the
table) moved closer and re-aimed with an upright orientation, so the arm fills most of the frame
and no flip is needed. Meta-World's own ``corner*`` cameras are rolled by ~180°: when one of them
is chosen by name the image is rotated by 180° (a vertical flip alone would mirror the scene); the
applied transform is recorded in the attribute ``image_transform``.

Generation is deterministic: the same arguments and seed give identical arrays. Episode ``i``
uses task ``tasks[i % len(tasks)]`` and its own random stream seeded by ``(seed, i)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import ConfigError, DataError, did_you_mean, listing

# MuJoCo reads MUJOCO_GL when it is first imported; choose headless EGL unless told otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")

GENERATOR_VERSION = "1.0.0"
SCHEMA_VERSION = 1

DEFAULT_TASKS: tuple[str, ...] = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
)

#: Names of the columns of ``proprio``.
PROPRIO_NAMES: tuple[str, ...] = (
    "gripper_opening",
    "right_j0", "right_j1", "right_j2", "right_j3", "right_j4", "right_j5", "right_j6",
    "r_close", "l_close",
)

APT_HINT = (
    "For MUJOCO_GL=egl install the EGL runtime (Debian/Ubuntu: `apt-get install libegl1 libegl-mesa0 "
    "libgl1-mesa-dri libopengl0`); for MUJOCO_GL=osmesa install libosmesa6. Set MUJOCO_GL before "
    "starting Python."
)


class RenderingUnavailable(DataError):
    """MuJoCo cannot render offscreen in this environment (missing EGL/OSMesa libraries)."""


@dataclasses.dataclass(frozen=True)
class CameraPreset:
    """A model camera (``base``) moved to ``pos`` and aimed at ``lookat``, upright, ``fovy`` degrees."""

    base: str
    pos: tuple[float, float, float]
    lookat: tuple[float, float, float]
    fovy: float = 45.0


CAMERAS: dict[str, CameraPreset] = {
    "corner2_close": CameraPreset(base="corner2", pos=(0.695, 0.173, 1.049), lookat=(0.0, 0.66, 0.2)),
}
DEFAULT_CAMERA = "corner2_close"
MODEL_CAMERAS = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """How expert actions are perturbed; see the module docstring."""

    noise_std: float = 0.15
    grip_noise_std: float = 0.3
    segment_fraction: float = 0.4
    segment_min: int = 6
    segment_max: int = 16
    target_low: tuple[float, float, float] = (-0.25, 0.45, 0.05)
    target_high: tuple[float, float, float] = (0.25, 0.85, 0.3)
    gain_range: tuple[float, float] = (5.0, 15.0)
    speed_range: tuple[float, float] = (0.3, 1.0)
    start_steps: int = 20

    def __post_init__(self) -> None:
        problems = []
        if self.noise_std < 0 or self.grip_noise_std < 0:
            problems.append("noise_std and grip_noise_std must be >= 0")
        if not 0.0 <= self.segment_fraction < 1.0:
            problems.append(f"segment_fraction must be in [0, 1), got {self.segment_fraction}")
        if not 1 <= self.segment_min <= self.segment_max:
            problems.append(f"need 1 <= segment_min <= segment_max, "
                            f"got {self.segment_min}, {self.segment_max}")
        if self.start_steps < 0:
            problems.append(f"start_steps must be >= 0, got {self.start_steps}")
        if problems:
            raise ConfigError("Invalid action perturbation: " + "; ".join(problems) + ".")

    @classmethod
    def coerce(cls, noise: Perturbation | Mapping[str, Any] | float | None) -> Perturbation:
        """``None`` → defaults; a number → the xyz noise std; a mapping → field overrides."""
        if noise is None:
            return cls()
        if isinstance(noise, Perturbation):
            return noise
        if isinstance(noise, (int, float)) and not isinstance(noise, bool):
            return cls(noise_std=float(noise))
        if isinstance(noise, Mapping):
            names = [f.name for f in dataclasses.fields(cls)]
            unknown = [k for k in noise if k not in names]
            if unknown:
                raise ConfigError(
                    f"Unknown action perturbation field(s) {listing(unknown)}. Allowed: {listing(names)}."
                    f"{did_you_mean(unknown[0], names)}"
                )
            values = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in noise.items()}
            return cls(**values)
        raise ConfigError(f"noise must be a number, a mapping or a Perturbation, got {type(noise).__name__}.")

    def to_json(self) -> str:
        return json.dumps({"scheme": "expert+gaussian+random_target_segments", **dataclasses.asdict(self)},
                          sort_keys=True)


def _look_quat(pos: Sequence[float], target: Sequence[float]) -> np.ndarray:
    """Quaternion of an upright MuJoCo camera at ``pos`` looking at ``target`` (world z up)."""
    import mujoco

    pos_a, target_a = np.asarray(pos, np.float64), np.asarray(target, np.float64)
    fwd = target_a - pos_a
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, fwd)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.stack([right, up, -fwd], axis=1).reshape(-1))
    return quat


def _import_simulator() -> Any:
    """Import MuJoCo and Meta-World; turn a missing package or a broken GL setup into a DataError."""
    try:
        import metaworld  # noqa: F401
        import mujoco
    except ModuleNotFoundError as err:
        raise DataError(
            f"Generating Meta-World data needs the package {err.name!r}, which is not installed: "
            f"`pip install 'grafted-workbench[data]'` (metaworld, mujoco, h5py)."
        ) from err
    except Exception as err:  # mujoco sets up its GL backend (MUJOCO_GL) at import time
        raise RenderingUnavailable(
            f"MuJoCo cannot render offscreen here: importing mujoco with MUJOCO_GL="
            f"{os.environ.get('MUJOCO_GL')!r} failed with {type(err).__name__}: {err}. {APT_HINT}"
        ) from err
    return mujoco


def known_tasks() -> list[str]:
    """Meta-World v3 task names that have a scripted expert policy."""
    _import_simulator()
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP

    return sorted(set(ALL_V3_ENVIRONMENTS) & set(ENV_POLICY_MAP))


def _check_args(tasks: Sequence[str], episodes: int, frames: int, size: int, camera: str,
                action_repeat: int) -> list[str]:
    tasks = [t.strip() for t in tasks if t.strip()]
    if not tasks:
        raise ConfigError("tasks: give at least one Meta-World v3 task, e.g. --tasks reach-v3,push-v3.")
    available = known_tasks()
    for task in tasks:
        if task not in available:
            raise ConfigError(f"tasks: unknown Meta-World task {task!r}.{did_you_mean(task, available)} "
                              f"Tasks with an expert policy: {listing(available)}.")
    if episodes < 1:
        raise ConfigError(f"episodes: must be >= 1, got {episodes}.")
    if frames < 2:
        raise ConfigError(f"frames: must be >= 2 (frame t+1 shows the result of action t), got {frames}.")
    if not 8 <= size <= 1024:
        raise ConfigError(f"size: must be between 8 and 1024 pixels, got {size}.")
    if action_repeat < 1:
        raise ConfigError(f"action_repeat: must be >= 1, got {action_repeat}.")
    cameras = [*CAMERAS, *MODEL_CAMERAS]
    if camera not in cameras:
        raise ConfigError(f"camera: unknown camera {camera!r}.{did_you_mean(camera, cameras)} "
                          f"Choose one of {listing(cameras)}.")
    return tasks


class _TaskEnv:
    """One Meta-World env + expert policy + offscreen renderer, reused across episodes of a task."""

    def __init__(self, task: str, size: int, camera: str, max_steps: int):
        import mujoco
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
        from metaworld.policies import ENV_POLICY_MAP

        self.task = task
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.env = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{task}-goal-observable"](seed=0)
        self.env.max_path_length = max(int(self.env.max_path_length), max_steps + 1)
        self.policy = ENV_POLICY_MAP[task]()
        model = self.env.model
        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), size)
        model.vis.global_.offheight = max(int(model.vis.global_.offheight), size)
        preset = CAMERAS.get(camera)
        self.camera_name = preset.base if preset else camera
        cam_id = model.camera(self.camera_name).id
        if preset:
            model.cam_pos[cam_id] = preset.pos
            model.cam_quat[cam_id] = _look_quat(preset.pos, preset.lookat)
            model.cam_fovy[cam_id] = preset.fovy
        mujoco.mj_forward(model, self.env.data)
        up_z = float(self.env.data.cam_xmat[cam_id].reshape(3, 3)[2, 1])
        self.image_transform = "rot180" if (preset is None and up_z < 0) else "none"
        self.camera_pos = [float(v) for v in model.cam_pos[cam_id]]
        self.camera_quat = [float(v) for v in model.cam_quat[cam_id]]
        self.camera_fovy = float(model.cam_fovy[cam_id])
        joints = ["right_j0", "right_j1", "right_j2", "right_j3", "right_j4", "right_j5", "right_j6",
                  "r_close", "l_close"]
        self.qpos_index = np.array([model.jnt_qposadr[model.joint(j).id] for j in joints])
        try:
            self.renderer = mujoco.Renderer(model, height=size, width=size)
            flags = self.renderer.scene.flags
            flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            self.render()
        except Exception as err:  # EGL/OSMesa missing or no display: one clear error.
            self.env.close()
            raise RenderingUnavailable(
                f"MuJoCo cannot render offscreen here (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}): "
                f"{type(err).__name__}: {err}. {APT_HINT}"
            ) from err

    def render(self) -> np.ndarray:
        self.renderer.update_scene(self.env.data, camera=self.camera_name)
        image = self.renderer.render()
        if self.image_transform == "rot180":
            image = image[::-1, ::-1]
        return np.ascontiguousarray(image)

    def close(self) -> None:
        renderer = getattr(self, "renderer", None)
        if renderer is not None:
            renderer.close()
            self.renderer = None
        self.env.close()


def _segment_schedule(rng: np.random.Generator, steps: int, p: Perturbation) -> np.ndarray:
    """Boolean mask over ``steps``: True where a random segment replaces the expert."""
    mask = np.zeros(steps, dtype=bool)
    if p.segment_fraction <= 0:
        return mask
    mean_seg = 0.5 * (p.segment_min + p.segment_max)
    mean_gap = mean_seg * (1.0 - p.segment_fraction) / p.segment_fraction
    # An episode starts inside a random segment with probability segment_fraction.
    t = 0 if rng.random() < p.segment_fraction else int(rng.integers(1, int(2 * mean_gap) + 2))
    while t < steps:
        length = int(rng.integers(p.segment_min, p.segment_max + 1))
        mask[t:t + length] = True
        t += length + int(rng.integers(1, int(2 * mean_gap) + 2))
    return mask


def _rollout(task_env: _TaskEnv, rng: np.random.Generator, frames: int, p: Perturbation,
             action_repeat: int) -> dict[str, Any]:
    env = task_env.env
    # Object/goal placement: the env samples it (with its own rejection rules) from a generator
    # seeded from this episode's stream.
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env.np_random = np.random.default_rng(int(rng.integers(2**63)))
    obs, _ = env.reset()
    env._freeze_rand_vec = True
    if p.start_steps:  # unrecorded warm-up: move the hand to a random start point
        start = rng.uniform(p.target_low, p.target_high)
        grip = rng.uniform(-1.0, 1.0)
        for _ in range(p.start_steps):
            action = np.append(np.clip(10.0 * (start - obs[:3]), -1.0, 1.0), grip).astype(np.float32)
            obs, *_ = env.step(action)
    random_mask = _segment_schedule(rng, frames, p)
    out = {
        "frames": [],
        "actions": np.zeros((frames, 4), np.float32),
        "ee_pos": np.zeros((frames, 3), np.float32),
        "proprio": np.zeros((frames, len(PROPRIO_NAMES)), np.float32),
        "obs": np.zeros((frames, obs.shape[0]), np.float32),
        "reward": np.zeros(frames, np.float32),
        "expert": ~random_mask,
    }
    success = False
    target = gain = speed = grip = None
    for t in range(frames):
        out["frames"].append(task_env.render())
        out["ee_pos"][t] = obs[:3]
        out["obs"][t] = obs
        out["proprio"][t, 0] = obs[3]
        out["proprio"][t, 1:] = env.data.qpos[task_env.qpos_index]
        if random_mask[t]:
            if t == 0 or not random_mask[t - 1]:  # new segment: new target, gain, speed, gripper
                target = rng.uniform(p.target_low, p.target_high)
                gain = rng.uniform(*p.gain_range)
                speed = rng.uniform(*p.speed_range)
                grip = rng.uniform(-1.0, 1.0)
            action = np.empty(4)
            action[:3] = np.clip(gain * (target - obs[:3]), -speed, speed)
            action[3] = grip
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                action = np.asarray(task_env.policy.get_action(obs), np.float64)
        noise = rng.normal(0.0, 1.0, size=4) * np.array([p.noise_std] * 3 + [p.grip_noise_std])
        action = np.clip(action + noise, -1.0, 1.0).astype(np.float32)
        out["actions"][t] = action
        reward = 0.0
        for _ in range(action_repeat):
            obs, r, _, _, info = env.step(action)
            reward += float(r)
            success = success or bool(info.get("success", False))
        out["reward"][t] = reward / action_repeat
    out["frames"] = np.stack(out["frames"])
    out["success"] = success
    return out


def generate(
    out: str | os.PathLike,
    tasks: Sequence[str] | str = DEFAULT_TASKS,
    episodes: int = 48,
    frames: int = 40,
    size: int = 64,
    seed: int = 0,
    camera: str = DEFAULT_CAMERA,
    noise: Perturbation | Mapping[str, Any] | float | None = None,
    progress: bool = True,
    action_repeat: int = 1,
    compression: int = 9,
) -> Path:
    """Roll out ``episodes`` perturbed expert episodes of ``frames`` steps and write an HDF5 file.

    ``tasks`` is a sequence or a comma-separated string of Meta-World v3 task names; episodes cycle
    through them. ``noise`` is a :class:`Perturbation`, a mapping of its fields, or a number (the
    xyz Gaussian noise std). Returns the path written. Raises :class:`ConfigError` for bad
    arguments and :class:`RenderingUnavailable` (a :class:`DataError`) when MuJoCo cannot render.
    """
    mujoco = _import_simulator()
    import h5py
    from tqdm.auto import tqdm

    if isinstance(tasks, str):
        tasks = tasks.split(",")
    tasks = _check_args(tasks, int(episodes), int(frames), int(size), camera, int(action_repeat))
    perturbation = Perturbation.coerce(noise)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    envs: dict[str, _TaskEnv] = {}
    max_steps = frames * action_repeat + perturbation.start_steps
    start = time.perf_counter()
    tmp: Path | None = None
    try:
        first = _TaskEnv(tasks[0], size, camera, max_steps)
        envs[tasks[0]] = first
        tmp = out.with_name(out.name + ".partial")
        with h5py.File(tmp, "w") as f:
            n, T = int(episodes), int(frames)
            obs_dim = int(first.env.observation_space.shape[0])

            def make(name: str, shape: tuple, dtype: Any, **kw: Any) -> h5py.Dataset:
                chunks = (1, *shape[1:]) if len(shape) > 1 else None
                return f.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks,
                                        compression="gzip" if chunks else None,
                                        compression_opts=compression if chunks else None, **kw)

            d_frames = make("frames", (n, T, size, size, 3), np.uint8)
            d_actions = make("actions", (n, T, 4), np.float32)
            d_ee = make("ee_pos", (n, T, 3), np.float32)
            d_prop = make("proprio", (n, T, len(PROPRIO_NAMES)), np.float32)
            d_obs = make("obs", (n, T, obs_dim), np.float32)
            d_reward = make("reward", (n, T), np.float32)
            d_expert = make("expert", (n, T), np.bool_)
            task_names, success = [], np.zeros(n, dtype=bool)
            bar = tqdm(range(n), desc=f"metaworld → {out.name}", unit="ep", disable=not progress)
            for i in bar:
                task = tasks[i % len(tasks)]
                if task not in envs:
                    envs[task] = _TaskEnv(task, size, camera, max_steps)
                rng = np.random.default_rng([int(seed), i])
                ep = _rollout(envs[task], rng, T, perturbation, int(action_repeat))
                d_frames[i] = ep["frames"]
                d_actions[i] = ep["actions"]
                d_ee[i] = ep["ee_pos"]
                d_prop[i] = ep["proprio"]
                d_obs[i] = ep["obs"]
                d_reward[i] = ep["reward"]
                d_expert[i] = ep["expert"]
                task_names.append(task)
                success[i] = ep["success"]
                bar.set_postfix(task=task)
            f.create_dataset("task", data=np.array(task_names, dtype=object), dtype=h5py.string_dtype())
            f.create_dataset("success", data=success)
            dt = float(first.env.dt) * int(action_repeat)
            attrs = {
                "schema_version": SCHEMA_VERSION,
                "generator": "workbench.data.metaworld_gen",
                "generator_version": GENERATOR_VERSION,
                "metaworld_version": _version("metaworld"),
                "mujoco_version": mujoco.__version__,
                "tasks": json.dumps(list(tasks)),
                "episodes": n,
                "frames": T,
                "seed": int(seed),
                "size": int(size),
                "camera": camera,
                "camera_model_name": first.camera_name,
                "camera_pos": np.asarray(first.camera_pos, np.float64),
                "camera_quat": np.asarray(first.camera_quat, np.float64),
                "camera_fovy": first.camera_fovy,
                "camera_lookat": np.asarray(CAMERAS[camera].lookat if camera in CAMERAS else [np.nan] * 3),
                "image_transform": first.image_transform,
                "fps": 1.0 / dt,
                "env_dt": float(first.env.dt),
                "action_repeat": int(action_repeat),
                "action_space": "[-1, 1]^4: delta xyz of the mocap hand target (1 unit = 0.01 m "
                                "per 80 Hz step), gripper effort",
                "render_settings": json.dumps({
                    "MUJOCO_GL": os.environ.get("MUJOCO_GL", ""), "renderer": "mujoco.Renderer",
                    "shadowsize": 0, "offsamples": 0, "shadows": False, "reflections": False,
                    "width": int(size), "height": int(size),
                }, sort_keys=True),
                "action_perturbation": perturbation.to_json(),
                "proprio_names": json.dumps(list(PROPRIO_NAMES)),
                "obs_layout": "Meta-World v3 goal-observable observation (39): hand xyz, gripper, "
                              "object poses (14), previous step's 18, goal xyz",
                "frame_alignment": "frames[:, t] is rendered before actions[:, t]; "
                                   "frames[:, t+1] shows its result",
            }
            for key, value in attrs.items():
                f.attrs[key] = value
        tmp.replace(out)
    finally:
        for task_env in envs.values():
            task_env.close()
        if tmp is not None and tmp.exists():
            tmp.unlink()
    if progress:
        print(_summary(out, time.perf_counter() - start))
    return out


def _summary(out: Path, elapsed: float | None = None) -> str:
    import h5py

    with h5py.File(out, "r") as f:
        n, t = f["frames"].shape[:2]
        success = float(np.mean(f["success"][()])) if n else 0.0
    timing = f", {elapsed / max(n, 1):.2f} s/episode" if elapsed is not None else ""
    return (f"wrote {out}: {n} episodes × {t} frames, {out.stat().st_size / 1e6:.1f} MB, "
            f"success rate {success:.0%}{timing}")


def _version(dist: str) -> str:
    import importlib.metadata as metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``workbench data metaworld``."""
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                        help="comma-separated Meta-World v3 tasks; episodes cycle through them "
                             "(default: %(default)s)")
    parser.add_argument("--episodes", type=int, default=48, help="number of episodes (default: %(default)s)")
    parser.add_argument("--frames", type=int, default=40,
                        help="frames (= actions) per episode (default: %(default)s)")
    parser.add_argument("--size", type=int, default=64,
                        help="frame height and width in pixels (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--camera", default=DEFAULT_CAMERA,
                        help=f"camera preset or Meta-World camera name: "
                             f"{', '.join([*CAMERAS, *MODEL_CAMERAS])} (default: %(default)s)")
    parser.add_argument("--noise", type=float, default=Perturbation.noise_std,
                        help="std of the Gaussian noise added to the xyz actions (default: %(default)s)")
    parser.add_argument("--segment-fraction", type=float, default=Perturbation.segment_fraction,
                        help="average fraction of steps where a random smooth action replaces the expert "
                             "(default: %(default)s)")
    parser.add_argument("--action-repeat", type=int, default=1,
                        help="simulator steps per stored frame/action (default: %(default)s = 80 fps)")
    parser.add_argument("--format", choices=("hdf5", "lerobot"), default="hdf5",
                        help="hdf5: one .h5 file (the metaworld dataset); lerobot: a LeRobot v3.0 dataset "
                             "directory (the lerobot dataset) (default: %(default)s)")
    parser.add_argument("--out", required=True, help="output .h5 file (--format hdf5) or new directory (lerobot)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    """Run ``workbench data metaworld`` from parsed arguments; returns the exit status."""
    noise = {"noise_std": args.noise, "segment_fraction": args.segment_fraction}
    start = time.perf_counter()
    if getattr(args, "format", "hdf5") == "lerobot":
        from workbench.data.lerobot_write import generate_lerobot

        generate_lerobot(args.out, tasks=args.tasks, episodes=args.episodes, frames=args.frames, size=args.size,
                         seed=args.seed, camera=args.camera, noise=noise, progress=not args.no_progress,
                         action_repeat=args.action_repeat)
        return 0
    out = generate(args.out, tasks=args.tasks, episodes=args.episodes, frames=args.frames, size=args.size,
                   seed=args.seed, camera=args.camera, noise=noise, progress=not args.no_progress,
                   action_repeat=args.action_repeat)
    if args.no_progress:  # generate() prints the summary itself when showing progress
        print(_summary(out, time.perf_counter() - start))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.data.metaworld_gen",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
