"""The Meta-World side of ``workbench data metaworld``: cameras, the action perturbation, one task's
environment and one perturbed expert rollout (see :mod:`workbench.worldmodel.generate`).

MuJoCo and Meta-World are imported when an environment is built, never at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.data.camera import CameraCalibration, look_at_matrix
from workbench.errors import ConfigError, DataError, did_you_mean, listing
from workbench.extras import install_hint

# MuJoCo reads MUJOCO_GL when it is first imported; choose headless EGL unless told otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")

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


#: The episodes ``expert_split`` may choose the expert episodes from: every one, or only those the
#: ``metaworld`` dataset trains on with its default split (so that its held-out episodes stay perturbed).
EXPERT_SPLITS = ("all", "train")


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """How expert actions are perturbed (:mod:`workbench.worldmodel.generate` says how each part acts).

    Attributes:
        noise_std: The standard deviation of the Gaussian noise added to the xyz of every action.
        grip_noise_std: The standard deviation of the Gaussian noise added to the gripper command.
        segment_fraction: The fraction of steps, on average, in random segments, in [0, 1).
        segment_min: The shortest random segment, in steps.
        segment_max: The longest random segment, in steps.
        target_low: The low corner (x, y, z, metres) of the box random targets are drawn in.
        target_high: The high corner of that box.
        gain_range: The range a random segment's controller gain is drawn from.
        speed_range: The range a random segment's speed limit is drawn from (action units).
        start_steps: Unrecorded steps driving the hand to a random start before recording.
        expert_share: The share of each task's episodes (chosen among ``expert_split``'s, evenly spread
            in index order; :func:`expert_episodes`) driven by the expert from start to end instead, with
            no random segments: episodes where the arm reaches the object and moves it. Every other
            episode is perturbed as the other fields say.
        expert_noise_std: The standard deviation of the Gaussian noise on every action component of an
            expert episode.
        expert_split: Which episodes the expert ones are chosen among (one of :data:`EXPERT_SPLITS`).

    Raises:
        ConfigError: When a value is out of range; the message lists every problem.
    """

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
    expert_share: float = 0.0
    expert_noise_std: float = 0.1
    expert_split: str = "all"

    def __post_init__(self) -> None:
        problems = []
        if self.noise_std < 0 or self.grip_noise_std < 0 or self.expert_noise_std < 0:
            problems.append("noise_std, grip_noise_std and expert_noise_std must be >= 0")
        if not 0.0 <= self.expert_share <= 1.0:
            problems.append(f"expert_share must be in [0, 1], got {self.expert_share}")
        if self.expert_split not in EXPERT_SPLITS:
            problems.append(f"expert_split must be one of {listing(list(EXPERT_SPLITS))}, "
                            f"got {self.expert_split!r}")
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

    def expert(self) -> Perturbation:
        """The perturbation of an expert episode: no random segments, ``expert_noise_std`` on every action
        component (the warm-up to a random start point is kept)."""
        return dataclasses.replace(self, segment_fraction=0.0, noise_std=self.expert_noise_std,
                                   grip_noise_std=self.expert_noise_std)


def expert_episodes(tasks: Sequence[str], p: Perturbation) -> list[int]:
    """The indices of the episodes of a file whose episodes have ``tasks`` that ``p`` gives to the expert.

    Per task, among its episodes (``expert_split="all"``) or among those the ``metaworld`` dataset trains
    on with its default split (``"train"``: ``val_fraction`` 0.2, ``seed`` 0, see
    :func:`workbench.data.metaworld.split_episodes`), a share ``p.expert_share`` is taken, evenly spread
    in index order: candidate ``j`` (0-based) is taken when ``floor((j + 1) * share)`` exceeds
    ``floor(j * share)``. The choice depends on the tasks only, never on the episodes' random streams,
    so every other episode is the one a file without expert episodes holds.
    """
    if p.expert_share <= 0:
        return []
    candidates = list(range(len(tasks)))
    if p.expert_split == "train":
        from workbench.data.metaworld import MetaWorldConfig, split_episodes

        defaults = {f.name: f.default for f in dataclasses.fields(MetaWorldConfig)}
        candidates = split_episodes(list(tasks), defaults["val_fraction"], defaults["seed"])[0]
    chosen = []
    for task in dict.fromkeys(tasks):
        own = [i for i in candidates if tasks[i] == task]
        chosen += [i for j, i in enumerate(own)
                   if np.floor((j + 1) * p.expert_share + 1e-9) > np.floor(j * p.expert_share + 1e-9)]
    return sorted(chosen)


def look_quat(pos: Sequence[float], target: Sequence[float]) -> np.ndarray:
    """Quaternion of an upright MuJoCo camera at ``pos`` looking at ``target`` (world z up)."""
    import mujoco

    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, look_at_matrix(pos, target).reshape(-1))
    return quat


def import_simulator() -> Any:
    """Import MuJoCo and Meta-World; turn a missing package or a broken GL setup into a DataError."""
    try:
        import metaworld  # noqa: F401
        import mujoco
    except ModuleNotFoundError as err:
        raise DataError(
            f"Generating Meta-World data needs the package {err.name!r}, which is not installed: "
            f"{install_hint(['data'])} (metaworld, mujoco, h5py)."
        ) from err
    except Exception as err:  # mujoco sets up its GL backend (MUJOCO_GL) at import time
        raise RenderingUnavailable(
            f"MuJoCo cannot render offscreen here: importing mujoco with MUJOCO_GL="
            f"{os.environ.get('MUJOCO_GL')!r} failed with {type(err).__name__}: {err}. {APT_HINT}"
        ) from err
    return mujoco


def known_tasks() -> list[str]:
    """Meta-World v3 task names that have a scripted expert policy."""
    import_simulator()
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP

    return sorted(set(ALL_V3_ENVIRONMENTS) & set(ENV_POLICY_MAP))


def check_args(tasks: Sequence[str], episodes: int, frames: int, size: int, camera: str,
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


class TaskEnv:
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
            model.cam_quat[cam_id] = look_quat(preset.pos, preset.lookat)
            model.cam_fovy[cam_id] = preset.fovy
        mujoco.mj_forward(model, self.env.data)
        up_z = float(self.env.data.cam_xmat[cam_id].reshape(3, 3)[2, 1])
        self.image_transform = "rot180" if (preset is None and up_z < 0) else "none"
        self.camera_pos = [float(v) for v in model.cam_pos[cam_id]]
        self.camera_quat = [float(v) for v in model.cam_quat[cam_id]]
        self.camera_fovy = float(model.cam_fovy[cam_id])
        # where the camera is in the world after mj_forward; a camera riding on a moving body (the
        # gripper's) has no fixed calibration, so none is recorded for it
        self.calibration = CameraCalibration.from_mujoco(
            self.env.data.cam_xpos[cam_id], self.env.data.cam_xmat[cam_id], self.camera_fovy, size, size,
            self.image_transform) if int(model.cam_bodyid[cam_id]) == 0 else None
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


def segment_schedule(rng: np.random.Generator, steps: int, p: Perturbation) -> np.ndarray:
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


def rollout(task_env: TaskEnv, rng: np.random.Generator, frames: int, p: Perturbation,
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
    random_mask = segment_schedule(rng, frames, p)
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
