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
* **Expert episodes.** A share ``expert_share`` of each task's episodes has no random segments: the
  expert drives the arm from the warm-up's start point to the end, with Gaussian noise of std
  ``expert_noise_std`` on every action component. These are the episodes where the arm reaches the
  object and moves it (a pushed puck, an opened door). They are evenly spread over each task's
  episodes (:func:`~workbench.worldmodel.sim.expert_episodes`), among all of them or, with
  ``expert_split = "train"``, only among those the ``metaworld`` dataset trains on with its default
  split, so that its held-out episodes are perturbed as the rest. The choice depends on the tasks only:
  every other episode is the one a file without expert episodes holds. The attribute
  ``expert_episodes`` lists them (JSON), and the dataset ``expert`` is True at each of their steps.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.data.camera import CameraCalibration, missing_calibration, quat_to_mat
from workbench.data.lerobot_write import LeRobotWriter
from workbench.errors import ConfigError
from workbench.extras import distribution_version
from workbench.worldmodel.sim import (
    CAMERAS,
    DEFAULT_CAMERA,
    MODEL_CAMERAS,
    PROPRIO_NAMES,
    Perturbation,
    TaskEnv,
    check_args,
    expert_episodes,
    import_simulator,
    rollout,
)

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
    summary: bool = True,
) -> Path:
    """Roll out ``episodes`` perturbed expert episodes of ``frames`` steps and write an HDF5 file.

    ``tasks`` is a sequence or a comma-separated string of Meta-World v3 task names; episodes cycle
    through them. ``noise`` is a :class:`Perturbation`, a mapping of its fields, or a number (the
    xyz Gaussian noise std). Returns the path written. Raises :class:`ConfigError` for bad
    arguments and :class:`RenderingUnavailable` (a :class:`DataError`) when MuJoCo cannot render.
    With ``progress`` and ``summary``, a line says what was written.
    """
    mujoco = import_simulator()
    import h5py
    from tqdm.auto import tqdm

    if isinstance(tasks, str):
        tasks = tasks.split(",")
    tasks = check_args(tasks, int(episodes), int(frames), int(size), camera, int(action_repeat))
    perturbation = Perturbation.coerce(noise)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    n_tasks = [tasks[i % len(tasks)] for i in range(int(episodes))]
    experts = set(expert_episodes(n_tasks, perturbation))
    envs: dict[str, TaskEnv] = {}
    max_steps = frames * action_repeat + perturbation.start_steps
    start = time.perf_counter()
    tmp: Path | None = None
    try:
        first = TaskEnv(tasks[0], size, camera, max_steps)
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
                    envs[task] = TaskEnv(task, size, camera, max_steps)
                rng = np.random.default_rng([int(seed), i])
                ep = rollout(envs[task], rng, T, perturbation.expert() if i in experts else perturbation,
                             int(action_repeat))
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
                "generator": "workbench.worldmodel.generate",
                "generator_version": GENERATOR_VERSION,
                "metaworld_version": distribution_version("metaworld"),
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
                "expert_episodes": json.dumps(sorted(experts)),
                "command": command_line(out.name, tasks, n, T, int(size), int(seed), camera, perturbation,
                                        int(action_repeat)),
                "proprio_names": json.dumps(list(PROPRIO_NAMES)),
                "obs_layout": "Meta-World v3 goal-observable observation (39): hand xyz, gripper, "
                              "object poses (14), previous step's 18, goal xyz",
                "frame_alignment": "frames[:, t] is rendered before actions[:, t]; "
                                   "frames[:, t+1] shows its result",
            }
            if first.calibration is not None:  # (none for a camera riding on the gripper)
                attrs.update(first.calibration.to_attrs())
            for key, value in attrs.items():
                f.attrs[key] = value
        tmp.replace(out)
    finally:
        for task_env in envs.values():
            task_env.close()
        if tmp is not None and tmp.exists():
            tmp.unlink()
    if progress and summary:
        print(_summary(out, time.perf_counter() - start))
    return out


def command_line(out: str, tasks: Sequence[str], episodes: int, frames: int, size: int, seed: int,
                 camera: str, perturbation: Perturbation, action_repeat: int) -> str:
    """The ``workbench data metaworld`` command that writes these rollouts to ``out`` (the file attribute
    ``command``). Settings at their defaults are left out; a perturbation field the command line has no
    flag for, set away from its default, is named after the command (the attribute
    ``action_perturbation`` holds them all)."""
    flags = {"--noise": ("noise_std", perturbation.noise_std),
             "--segment-fraction": ("segment_fraction", perturbation.segment_fraction),
             "--expert-share": ("expert_share", perturbation.expert_share),
             "--expert-noise": ("expert_noise_std", perturbation.expert_noise_std),
             "--expert-split": ("expert_split", perturbation.expert_split)}
    parts = ["workbench data metaworld", f"--tasks {','.join(tasks)}", f"--episodes {episodes}",
             f"--frames {frames}", f"--size {size}", f"--seed {seed}"]
    if camera != DEFAULT_CAMERA:
        parts.append(f"--camera {camera}")
    if action_repeat != 1:
        parts.append(f"--action-repeat {action_repeat}")
    defaults = Perturbation()
    for flag, (field, value) in flags.items():
        if value != getattr(defaults, field):
            parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    parts.append(f"--out {out}")
    named = {field for field, _ in flags.values()}
    other = [f.name for f in dataclasses.fields(Perturbation)
             if f.name not in named and getattr(perturbation, f.name) != getattr(defaults, f.name)]
    return " ".join(parts) + (f" (and, in Python, noise fields {', '.join(other)}: see action_perturbation)"
                              if other else "")


def recorded_command(attrs: Mapping[str, Any], out: str) -> str | None:
    """The command that wrote a file of ``workbench data metaworld`` with these attributes: its ``command``
    attribute, or for a file written before it was recorded, the command rebuilt from its other
    attributes (``None`` when they do not say)."""
    if "command" in attrs:
        return str(attrs["command"])
    try:
        fields = {k: v for k, v in json.loads(attrs["action_perturbation"]).items() if k != "scheme"}
        return command_line(out, json.loads(attrs["tasks"]), int(attrs["episodes"]), int(attrs["frames"]),
                            int(attrs["size"]), int(attrs["seed"]), str(attrs.get("camera", DEFAULT_CAMERA)),
                            Perturbation.coerce(fields), int(attrs.get("action_repeat", 1)))
    except (KeyError, ValueError, TypeError, ConfigError):
        return None


def metaworld_to_lerobot(h5_path: str | Path, out: str | Path, episodes: list[int] | None = None,
                         crf: int = 18) -> Path:
    """Write the rollouts of a ``workbench data metaworld`` HDF5 file as a LeRobot v3.0 dataset.

    Args:
        h5_path: The HDF5 file (``"sample"``: the shipped one).
        out: The dataset directory to write (must not exist or be empty).
        episodes: The episodes to write, by index (in file order); None writes all.
        crf: The H.264 quality of the videos (lower is better and larger; 18 is visually lossless).

    Returns:
        ``out``.
    """
    import h5py

    from workbench.data.metaworld import MetaWorldClips

    source = MetaWorldClips(path=str(h5_path), window=2, split="all")  # validates the file
    path = source.path
    source.close()
    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
        camera = f"observation.images.{attrs.get('camera', 'front')}"
        proprio_names = json.loads(attrs.get("proprio_names", "null")) or [f"p{i}" for i in
                                                                           range(f["proprio"].shape[2])]
        features = {"action": ("float32", ["dx", "dy", "dz", "gripper"]),
                    "observation.state": ("float32", list(proprio_names)),
                    "observation.ee_pos": ("float32", ["x", "y", "z"]),
                    "next.reward": ("float32", None), "next.success": ("bool", None)}
        calibration = CameraCalibration.from_attrs(attrs, where=str(path))
        calibration = {camera: calibration} if calibration else None
        with LeRobotWriter(out, float(attrs.get("fps", 80.0)), features, [camera], robot_type="sawyer",
                           crf=crf, calibration=calibration) as writer:
            n, t = f["frames"].shape[:2]
            success = f["success"][()] if "success" in f else np.zeros(n, bool)
            reward = f.get("reward")
            for i in (range(n) if episodes is None else episodes):
                task = f["task"][i]
                task = task.decode() if isinstance(task, bytes) else str(task)
                writer.add_episode(
                    {camera: f["frames"][i]},
                    {"action": np.clip(f["actions"][i], -1.0, 1.0), "observation.state": f["proprio"][i],
                     "observation.ee_pos": f["ee_pos"][i],
                     "next.reward": reward[i] if reward is not None else np.zeros(t, np.float32),
                     "next.success": np.full(t, bool(success[i]))},
                    task, success=bool(success[i]), source_episode=int(i))
            return writer.close()


def generate_lerobot(out: str | Path, **generate_args: Any) -> Path:
    """Meta-World rollouts as a LeRobot v3.0 dataset (``workbench data metaworld --format lerobot``).

    Generates with :func:`generate` (same arguments, same rollouts) into a
    temporary HDF5 file beside ``out``, converts it with :func:`metaworld_to_lerobot`, and removes it.

    Args:
        out: The dataset directory to write (must not exist or be empty).
        **generate_args: The arguments of :func:`generate` other than its output path (``tasks``,
            ``episodes``, ``frames``, ...).

    Returns:
        ``out``.
    """
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty directory; --format lerobot writes a new "
                          f"dataset directory. Choose another --out.")
    tmp = out.with_name(out.name + ".rollouts.h5")
    try:
        generate(tmp, **generate_args,
                 summary=False)  # (a temporary file: the line below says what is written)
        metaworld_to_lerobot(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    if generate_args.get("progress", True):
        print(f"wrote {out}: LeRobot v3.0 dataset "
              f"(H.264 video, {len(list(out.rglob('*.mp4')))} video file(s))")
    return out


#: Cameras of Meta-World's model that ride on the gripper: they have no fixed calibration.
MOVING_CAMERAS = ("behindGripper", "gripperPOV")


def calibration_from_attrs(attrs: Any, where: str) -> CameraCalibration:
    """The camera calibration of a file of ``workbench data metaworld`` that predates it, from the camera it
    recorded (``camera_pos``, ``camera_quat``, ``camera_fovy``, ``size``, ``image_transform``)."""
    stored = CameraCalibration.from_attrs(attrs, where=where)
    if stored is not None:
        return stored
    needed = ("camera_pos", "camera_quat", "camera_fovy", "size")
    missing = [k for k in needed if k not in attrs]
    if missing:
        raise missing_calibration(where, sorted(attrs),
                                  fix=f"it lacks {missing}, so the camera cannot be reconstructed; "
                                      f"regenerate it with `workbench data metaworld --out FILE.h5`.")
    model_name = str(attrs.get("camera_model_name", attrs.get("camera", "")))
    if model_name in MOVING_CAMERAS:
        raise missing_calibration(where, sorted(attrs),
                                  fix=f"its camera {model_name!r} rides on the gripper, "
                                      f"so it has no fixed calibration; "
                                      f"regenerate it with a fixed camera (--camera {DEFAULT_CAMERA}).")
    size = int(attrs["size"])
    return CameraCalibration.from_mujoco(np.asarray(attrs["camera_pos"]), quat_to_mat(attrs["camera_quat"]),
                                         float(attrs["camera_fovy"]), size, size,
                                         str(attrs.get("image_transform", "none")))


def calibrate(path: str | Path, like: str | Path | None = None) -> CameraCalibration:
    """Add the camera calibration to a data set made by the project before it was recorded: an HDF5 file of
    ``workbench data metaworld`` (from its camera attributes) or a LeRobot dataset of ``--format lerobot``
    (from its camera preset's name, or from the HDF5 file ``like`` it was converted from). Returns it."""
    import h5py

    from workbench.data.lerobot import is_lerobot_dir
    from workbench.data.lerobot_format import LeRobotMeta

    path = Path(path).expanduser()
    if like is not None:
        with h5py.File(Path(like).expanduser(), "r") as f:
            calibration = calibration_from_attrs(dict(f.attrs), str(like))
    else:
        calibration = None
    if is_lerobot_dir(path):
        meta = LeRobotMeta(path)
        info = json.loads(meta.info_path.read_text())
        for key in meta.video_keys:
            preset = key.rsplit(".", 1)[-1]
            found = calibration
            if found is None and preset in CAMERAS:
                h, w = info["features"][key]["shape"][:2]
                p = CAMERAS[preset]
                found = CameraCalibration.look_at(p.pos, p.lookat, p.fovy, int(w), int(h))
            if found is None:
                raise missing_calibration(str(meta.info_path), [key],
                                          fix=f"its camera {key!r} is not a preset ({', '.join(CAMERAS)}); "
                                              f"give the HDF5 file it was converted from: "
                                              f"`workbench data calibrate {path} --like FILE.h5`.")
            info["features"][key]["calibration"] = found.to_json()
            calibration = calibration or found
        meta.info_path.write_text(json.dumps(info, indent=4))
        return calibration
    if not path.is_file():
        raise ConfigError(f"{path}: no such file or LeRobot dataset directory; "
                          f"give an .h5 file of `workbench data metaworld` "
                          f"or a LeRobot dataset of `--format lerobot`.")
    with h5py.File(path, "r+") as f:
        calibration = calibration or calibration_from_attrs(dict(f.attrs), str(path))
        for key, value in calibration.to_attrs().items():
            f.attrs[key] = value
    return calibration


def _summary(out: Path, elapsed: float | None = None) -> str:
    import h5py

    with h5py.File(out, "r") as f:
        n, t = f["frames"].shape[:2]
        success = float(np.mean(f["success"][()])) if n else 0.0
    timing = f", {elapsed / max(n, 1):.2f} s/episode" if elapsed is not None else ""
    return (f"wrote {out}: {n} episodes × {t} frames, {out.stat().st_size / 1e6:.1f} MB, "
            f"success rate {success:.0%}{timing}")


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
    parser.add_argument("--expert-share", type=float, default=Perturbation.expert_share,
                        help="share of each task's episodes the expert drives from start to end, with no "
                             "random segments: episodes where the arm moves the object "
                             "(default: %(default)s)")
    parser.add_argument("--expert-noise", type=float, default=Perturbation.expert_noise_std,
                        help="std of the Gaussian noise added to every action of an expert episode "
                             "(default: %(default)s)")
    parser.add_argument("--expert-split", choices=("all", "train"), default=Perturbation.expert_split,
                        help="choose the expert episodes among all episodes, or only among those the "
                             "metaworld dataset trains on with its default split, so that its held-out "
                             "episodes stay perturbed (default: %(default)s)")
    parser.add_argument("--action-repeat", type=int, default=1,
                        help="simulator steps per stored frame/action (default: %(default)s = 80 fps)")
    parser.add_argument("--format", choices=("hdf5", "lerobot"), default="hdf5",
                        help="hdf5: one .h5 file (the metaworld dataset); lerobot: a LeRobot v3.0 dataset "
                             "directory (the lerobot dataset) (default: %(default)s)")
    parser.add_argument("--out", required=True,
                        help="output .h5 file (--format hdf5) or new directory (lerobot)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    """Run ``workbench data metaworld`` from parsed arguments; returns the exit status."""
    noise = {"noise_std": args.noise, "segment_fraction": args.segment_fraction,
             "expert_share": args.expert_share, "expert_noise_std": args.expert_noise,
             "expert_split": args.expert_split}
    start = time.perf_counter()
    if getattr(args, "format", "hdf5") == "lerobot":
        generate_lerobot(args.out, tasks=args.tasks, episodes=args.episodes, frames=args.frames,
                         size=args.size, seed=args.seed, camera=args.camera, noise=noise,
                         progress=not args.no_progress, action_repeat=args.action_repeat)
        return 0
    out = generate(args.out, tasks=args.tasks, episodes=args.episodes, frames=args.frames, size=args.size,
                   seed=args.seed, camera=args.camera, noise=noise, progress=not args.no_progress,
                   action_repeat=args.action_repeat)
    if args.no_progress:  # generate() prints the summary itself when showing progress
        print(_summary(out, time.perf_counter() - start))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.worldmodel.generate",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
