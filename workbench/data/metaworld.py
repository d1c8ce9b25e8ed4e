"""Meta-World robot-arm clips with actions: the ``metaworld`` dataset.

Files are written by :mod:`workbench.worldmodel.generate` (``workbench data metaworld``). Layout
(schema version 1; ``N`` episodes of ``T`` steps, ``H × W`` frames, ``P = 10`` proprio values):

```text
dataset  dtype    shape            meaning
frames   uint8    [N, T, H, W, 3]  RGB frame rendered *before* action t (frame t+1 shows its result)
actions  float32  [N, T, 4]        executed action t in [-1, 1]: hand dx, dy, dz (1 unit = 1 cm
                                   of mocap target motion per 80 Hz step), gripper effort
ee_pos   float32  [N, T, 3]        hand (end-effector) position at frame t, metres, world frame
proprio  float32  [N, T, P]        gripper opening in [0, 1], 7 arm joint angles (rad), 2 finger
                                   joint positions; names in the attribute ``proprio_names``
obs      float32  [N, T, 39]       the raw Meta-World goal-observable observation at frame t
reward   float32  [N, T]           Meta-World reward for action t (mean over ``action_repeat``)
expert   bool     [N, T]           True where action t came from the (noised) expert, False
                                   where a random segment replaced it
task     string   [N]              Meta-World task name of each episode, e.g. ``push-v3``
success  bool     [N]              whether the env reported success at any step of the episode
```

Every ``[N, T, ...]`` dataset is gzip-compressed with one chunk per episode (``chunks=(1, T, ...)``).
File attributes: ``schema_version`` (1), ``generator_version``, ``metaworld_version``,
``mujoco_version``, ``seed``, ``size``, ``episodes``, ``frames``, ``tasks`` (JSON list),
``camera`` (preset or model camera name), ``camera_model_name``, ``camera_pos``,
``camera_quat``, ``camera_fovy``, ``camera_lookat``, ``image_transform``, ``fps`` (frames per
second of the stored video, ``1 / (env_dt * action_repeat)``), ``env_dt`` (Meta-World's control
period, 0.0125 s = 80 Hz), ``action_repeat``, ``render_settings`` (JSON), ``action_perturbation``
(JSON), ``expert_episodes`` (JSON: the episodes the expert drove throughout), ``command`` (the
command that wrote the file), ``proprio_names`` (JSON), ``obs_layout``, ``frame_alignment``, and the
camera's calibration ``camera_intrinsics`` (3x3), ``camera_extrinsics`` (4x4, world → camera) and
``camera_image_size`` (``[width, height]``) (see :mod:`workbench.data.camera`; files made before it
was recorded get it with ``workbench data calibrate FILE``).

Only ``frames``, ``actions``, ``ee_pos``, ``proprio`` and ``task`` are needed by
:class:`MetaWorldClips`; the other datasets are for analysis.

The shipped sample (:func:`sample_path`, ``workbench/data/samples/metaworld_sample.h5``) was made with:

```bash
workbench data metaworld \\
    --tasks reach-v3,push-v3,pick-place-v3,door-open-v3,drawer-close-v3,button-press-topdown-v3 \\
    --episodes 60 --frames 48 --size 64 --seed 0 --action-repeat 2 \\
    --out workbench/data/samples/metaworld_sample.h5
```

(equivalently ``python -m workbench.worldmodel.generate`` with the same arguments): 60 episodes,
10 per task, of 48 frames at 40 fps (each action is held for two 80 Hz Meta-World steps).

Items of :class:`MetaWorldClips` are windows of ``window`` consecutive steps starting every
``stride`` steps in each episode:

```text
{"video": float32 [3, window, H, W] in [-1, 1], "action": float32 [window, 4] in [-1, 1],
 "ee_pos": float32 [window, 3], "proprio": float32 [window, P],
 "episode": int, "start": int, "task": str,
 "camera": float32 [12] (when the file records its calibration; see :mod:`workbench.data.camera`)}
```

``action[t]`` is the action applied after ``video[:, t]``; ``video[:, t + 1]`` shows its result.
The train/validation split is by episode, stratified by task and deterministic given ``seed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from workbench.config import check, config_from
from workbench.data.camera import CAMERA_KEY, CameraCalibration
from workbench.data.checks import check_finite
from workbench.data.control import check_control, with_control
from workbench.errors import DataError
from workbench.registry import register

SCHEMA_VERSION = 1
SAMPLE_NAME = "metaworld_sample.h5"
REGENERATE = ("regenerate it with `workbench data metaworld --out FILE.h5` "
              "(see `workbench data metaworld --help`)")
#: What h5py raises for a file damaged past its header: a compressed chunk that does not inflate
#: ("filter returned failure"), a broken B-tree or heap (OSError / RuntimeError / ValueError / KeyError).
READ_ERRORS = (OSError, RuntimeError, ValueError, KeyError, TypeError, IndexError)

#: name → (required dtype: "u1" = uint8, "f" = any float; trailing shape after [N, T], None = any size).
_FIELDS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "frames": ("u1", (None, None, 3)),
    "actions": ("f", (4,)),
    "ee_pos": ("f", (3,)),
    "proprio": ("f", (None,)),
}
_EXPECTED = {
    "frames": "uint8 [N, T, H, W, 3]",
    "actions": "float32 [N, T, 4]",
    "ee_pos": "float32 [N, T, 3]",
    "proprio": "float32 [N, T, P]",
    "task": "string [N]",
}


def sample_path() -> Path:
    """Path of the shipped sample file ``workbench/data/samples/metaworld_sample.h5``.

    Returns:
        The file's absolute path inside the installed package.
    """
    return Path(__file__).resolve().parent / "samples" / SAMPLE_NAME


@dataclasses.dataclass
class MetaWorldConfig:
    """Config of the ``metaworld`` dataset.

    Attributes:
        path: An HDF5 file from ``workbench data metaworld``; ``"sample"`` means the shipped sample
            (:func:`sample_path`).
        window: Frames per clip (at least 2).
        stride: Frames between the starts of consecutive clips.
        split: ``train``, ``val`` or ``all`` (see :func:`split_episodes`).
        val_fraction: The fraction of each task's episodes in the validation split, in [0, 1).
        seed: The seed of the split.
        tasks: Keep only episodes of these tasks (applied after the split, so the split does not
            depend on it); null keeps all.
        in_memory: Read the whole file once per process instead of decompressing one episode per item.
        control: Adds a control video derived from each clip's frames to its items (``"control"``,
            ``(C, T, H, W)``): ``edges`` (see :func:`workbench.data.control.edges`), for a ``controlnet``
            with ``video: true``.

    Raises:
        ConfigError: When a value is out of range; the message names the field.
    """

    path: str
    window: int = 16
    stride: int = 4
    split: Literal["train", "val", "all"] = "train"
    val_fraction: float = 0.2
    seed: int = 0
    tasks: list[str] | None = None
    in_memory: bool = False
    control: str | None = None

    def __post_init__(self) -> None:
        check(isinstance(self.path, str) and self.path != "", "path",
              "must be the path of a .h5 file from `workbench data metaworld` (or 'sample').")
        check(self.window >= 2, "window",
              f"must be >= 2 (a clip needs a frame and its successor), got {self.window}.")
        check(self.stride >= 1, "stride", f"must be >= 1, got {self.stride}.")
        check(self.split in ("train", "val", "all"), "split",
              f"must be 'train', 'val' or 'all', got {self.split!r}.")
        check(0.0 <= self.val_fraction < 1.0, "val_fraction", f"must be in [0, 1), got {self.val_fraction}.")
        check(self.tasks is None or len(self.tasks) > 0, "tasks",
              "must be null (all tasks) or a non-empty list.")
        check_control(self.control)


def _describe(ds: Any) -> str:
    return f"{ds.dtype} {list(ds.shape)}"


def _shown(values: list[int]) -> str:
    more = f", ... ({len(values)} in all)" if len(values) > 8 else ""
    return ", ".join(str(v) for v in values[:8]) + more


def split_episodes(tasks: list[str], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Split episode indices into (train, val), by episode and stratified by task, deterministically.

    Each task contributes ``round(val_fraction * n_task)`` validation episodes (never all of them
    when it has two or more); with ``val_fraction > 0`` and at least two episodes, at least one
    episode is in validation.

    Args:
        tasks: The task name of each episode, in file order.
        val_fraction: The fraction of each task's episodes to put in validation, in [0, 1).
        seed: The seed of the draw; the same seed gives the same split.

    Returns:
        ``(train, val)``: sorted episode indices, disjoint, together every episode.
    """
    n = len(tasks)
    rng = np.random.default_rng(seed)
    val: list[int] = []
    by_task: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        by_task.setdefault(task, []).append(i)
    if val_fraction > 0 and n >= 2:
        for task in sorted(by_task):
            episodes = np.array(by_task[task])
            order = rng.permutation(len(episodes))
            k = int(round(val_fraction * len(episodes)))
            k = min(k, len(episodes) - 1) if len(episodes) > 1 else k
            val.extend(int(e) for e in episodes[order[:k]])
        if not val:
            val.append(int(rng.integers(n)))
        if len(val) >= n:
            val = val[: n - 1]
    val_set = set(val)
    return [i for i in range(n) if i not in val_set], sorted(val_set)


@register("dataset", "metaworld")
class MetaWorldClips(Dataset):
    """Windows of Meta-World episodes with actions, end-effector position and proprio state.

    Args:
        config: A :class:`MetaWorldConfig`.
        **overrides: Fields of the config, given or changed by name (e.g. ``path="sample"``).

    Raises:
        ConfigError: When a field is unknown, missing or out of range.
        DataError: When the file is missing, not HDF5, or not laid out as ``workbench data metaworld``
            writes it; the message names the field at fault.
    """

    config_class = MetaWorldConfig
    requires_extras = {"data": ("h5py",)}

    def __init__(self, config: MetaWorldConfig | None = None, **overrides: Any):
        self.config = config = config_from(type(self), config, overrides)
        self.path = sample_path() if config.path == "sample" else Path(config.path).expanduser()
        info = self._validate()
        self.num_episodes, self.episode_length = info["N"], info["T"]
        self.frame_size = info["HW"]
        self.proprio_dim = info["P"]
        self.attrs = info["attrs"]
        self.task_names: list[str] = info["tasks"]
        #: The camera's calibration (:class:`~workbench.data.camera.CameraCalibration`), or None for a file
        #: made before it was recorded (``workbench data calibrate FILE`` adds it).
        self.calibration = CameraCalibration.from_attrs(self.attrs, where=str(self.path))
        self._camera = torch.from_numpy(self.calibration.vector()) if self.calibration else None
        self.train_episodes, self.val_episodes = split_episodes(
            self.task_names, config.val_fraction, config.seed)
        episodes = {"train": self.train_episodes, "val": self.val_episodes,
                    "all": list(range(self.num_episodes))}[config.split]
        if config.tasks is not None:
            unknown = sorted(set(config.tasks) - set(self.task_names))
            if unknown:
                raise DataError(f"{self.path}: tasks {unknown} are not in this file; it has "
                                f"{sorted(set(self.task_names))}. Fix `tasks` in the dataset config.")
            episodes = [e for e in episodes if self.task_names[e] in config.tasks]
        if not episodes:
            raise DataError(
                f"{self.path}: split {config.split!r} has no episodes "
                f"(file has {self.num_episodes} episode(s), "
                f"val_fraction={config.val_fraction}, tasks={config.tasks}). Use split='all', change "
                f"val_fraction, or generate more episodes with `workbench data metaworld --episodes N`."
            )
        self.episodes = episodes
        starts = range(0, self.episode_length - config.window + 1, config.stride)
        self.index: list[tuple[int, int]] = [(e, s) for e in episodes for s in starts]
        self._file: Any = None
        self._pid: int | None = None
        self._memory: dict[str, np.ndarray] | None = None

    @classmethod
    def from_config(cls, config: MetaWorldConfig) -> MetaWorldClips:
        return cls(config)

    # ------------------------------------------------------------------ validation
    def _open(self) -> Any:
        from workbench.extras import require

        require("data", what="the metaworld dataset", modules=("h5py",))
        import h5py

        if not self.path.exists():
            raise DataError(
                f"Meta-World data file not found: {self.path}. Generate it with "
                f"`workbench data metaworld --out {self.path}`, or use path: sample for the shipped sample."
            )
        if self.path.is_dir():
            raise DataError(f"{self.path} is a directory; `path` must be an .h5 file from "
                            f"`workbench data metaworld`.")
        try:
            return h5py.File(self.path, "r", rdcc_nbytes=64 * 2**20)
        except OSError as err:
            raise DataError(
                f"{self.path} is not a readable HDF5 file ({err}). It may be corrupt or truncated; "
                f"{REGENERATE}."
            ) from err

    def _validate(self) -> dict[str, Any]:
        try:
            return self._read_layout()
        except DataError:
            raise
        except READ_ERRORS as err:
            raise DataError(f"{self.path}: the file is damaged: its layout "
                            f"(dataset shapes, task names, attributes) cannot be read "
                            f"({type(err).__name__}: {err}). Copy it again from where it came from "
                            f"or {REGENERATE}.") from None

    def _damaged(self, err: Exception, what: str, episode: int | None) -> DataError:
        """The error for a read of ``what`` (e.g. ``frames``) of ``episode`` that h5py could not do."""
        which = ""
        if episode is not None:
            task = self.task_names[episode] if 0 <= episode < len(getattr(self, "task_names", ())) else "?"
            which = f" of episode {episode} (task {task})"
        return DataError(f"{self.path}: the file is damaged: dataset '{what}'{which} cannot be read "
                         f"({type(err).__name__}: {err}). Its compressed data no longer decodes, "
                         f"so the episode's values are lost; "
                         f"copy the file again from where it came from or {REGENERATE}.")

    def _read_layout(self) -> dict[str, Any]:
        with self._open() as f:
            where = str(self.path)
            version = f.attrs.get("schema_version")
            if version is not None and int(version) > SCHEMA_VERSION:
                raise DataError(f"{where}: schema_version {int(version)} is newer than this workbench reads "
                                f"({SCHEMA_VERSION}); upgrade workbench or {REGENERATE}.")
            if version is not None and int(version) < SCHEMA_VERSION:
                raise DataError(f"{where}: schema_version {int(version)} is older than this workbench reads "
                                f"({SCHEMA_VERSION}); {REGENERATE}.")
            for name in [*_FIELDS, "task"]:
                if name not in f or not hasattr(f[name], "shape"):
                    raise DataError(f"{where}: missing dataset '{name}' (expected {_EXPECTED[name]}); found "
                                    f"datasets {sorted(f.keys())}. The file is incomplete or not from "
                                    f"`workbench data metaworld`; {REGENERATE}.")
            frames = f["frames"]
            if frames.ndim != 5 or frames.shape[-1] != 3:
                raise DataError(f"{where}: dataset 'frames' has shape {list(frames.shape)}, expected "
                                f"{_EXPECTED['frames']} (RGB, channels last); {REGENERATE}.")
            n, t = int(frames.shape[0]), int(frames.shape[1])
            for name, (kind, tail) in _FIELDS.items():
                ds = f[name]
                ok_kind = ds.dtype == np.uint8 if kind == "u1" else ds.dtype.kind == "f"
                if not ok_kind:
                    raise DataError(f"{where}: dataset '{name}' has dtype {ds.dtype}, expected "
                                    f"{_EXPECTED[name]}; {REGENERATE}.")
                shape_ok = ds.ndim == 2 + len(tail) and all(
                    want is None or got == want for got, want in zip(ds.shape[2:], tail))
                if not shape_ok or tuple(ds.shape[:2]) != (n, t):
                    raise DataError(f"{where}: dataset '{name}' has shape {list(ds.shape)}, expected "
                                    f"{_EXPECTED[name]} with N={n}, T={t} as in 'frames'; {REGENERATE}.")
            task = f["task"]
            if task.shape != (n,) or task.dtype.kind not in ("O", "S", "U"):
                raise DataError(f"{where}: dataset 'task' is {_describe(task)}, expected {_EXPECTED['task']} "
                                f"with N={n}; {REGENERATE}.")
            if n < 1:
                raise DataError(f"{where}: the file has no episodes (N=0); "
                                f"{REGENERATE} with --episodes >= 1.")
            if t < self.config.window:
                raise DataError(f"{where}: episodes have T={t} frames, "
                                f"shorter than window={self.config.window}. "
                                f"Use window <= {t}, or regenerate with `workbench data metaworld --frames "
                                f"{self.config.window} ...` (or more).")
            tasks = [v.decode() if isinstance(v, bytes) else str(v) for v in task[()]]
            return {"N": n, "T": t, "HW": (int(frames.shape[2]), int(frames.shape[3])),
                    "P": int(f["proprio"].shape[2]), "tasks": tasks, "attrs": dict(f.attrs)}

    # ------------------------------------------------------------------ access
    def _handle(self) -> Any:
        pid = os.getpid()
        if self._file is None or self._pid != pid:
            self._file = self._open()
            self._pid = pid
            self._memory = None
        return self._file

    def _arrays(self) -> Any:
        if not self.config.in_memory:
            return self._handle()
        if self._memory is None or self._pid != os.getpid():
            f = self._handle()
            memory = {}
            for name in _FIELDS:
                try:
                    memory[name] = f[name][()]
                except READ_ERRORS as err:
                    raise self._damaged(err, name, self._first_bad(f[name])) from None
            self._memory = memory
        return self._memory

    def _first_bad(self, dataset: Any) -> int | None:
        """The first episode of ``dataset`` whose chunk does not read (to name it), or None."""
        for e in range(self.num_episodes):
            try:
                dataset[e]
            except READ_ERRORS:
                return e
        return None

    def __len__(self) -> int:
        return len(self.index)

    def widths(self) -> dict[str, int]:
        """Width of each per-frame signal an item carries: ``{"action": 4, "ee_pos": 3, "proprio": P}``."""
        return {"action": 4, "ee_pos": 3, "proprio": self.proprio_dim}

    def datasets(self) -> list[str]:
        """Every dataset the file holds: the schema's and any other (e.g. ``obs``, the raw observations
        ``workbench data metaworld`` records)."""
        return sorted(self._handle())

    def read(self, name: str, episodes: list[int] | None = None) -> np.ndarray:
        """Whole episodes of one dataset of the file (e.g. ``"frames"``, or another of
        :meth:`datasets`), all of them by default."""
        if name not in _EXPECTED and name not in self.datasets():
            raise DataError(f"{self.path}: no dataset {name!r} to read; the schema has {sorted(_EXPECTED)}, "
                            f"the file holds {self.datasets()}.")
        data = self._handle()[name]
        try:
            return data[()] if episodes is None else data[sorted(episodes)]
        except READ_ERRORS as err:
            raise self._damaged(err, name, self._first_bad(data)) from None

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self.index) <= i < len(self.index):
            raise IndexError(f"index {i} out of range for {len(self.index)} clips")
        episode, start = self.index[i]
        return self._window(episode, start)

    def window_at(self, episode: int, start: int) -> dict[str, Any]:
        """The window of ``window`` steps of ``episode`` from step ``start``, as an item (any start, not only
        those ``stride`` makes): what a self-forwarded training context reads its earlier window from."""
        last = self.episode_length - self.config.window
        if episode not in self.episodes or not 0 <= start <= last:
            raise DataError(f"{self.path}: no window at episode {episode}, step {start} in this split: "
                            f"episodes {_shown(self.episodes)}, starts 0 to {last}.")
        return self._window(episode, start)

    def _window(self, episode: int, start: int) -> dict[str, Any]:
        stop = start + self.config.window
        data = self._arrays()
        read: dict[str, np.ndarray] = {}
        for name in _FIELDS:
            try:
                read[name] = np.asarray(data[name][episode, start:stop])
            except READ_ERRORS as err:
                raise self._damaged(err, name, episode) from None
        # NaN and inf never reach a kernel (nor hide in the clip)
        for name in ("actions", "ee_pos", "proprio"):
            check_finite(read[name], f"{self.path}: episode {episode} (task {self.task_names[episode]})",
                         f"dataset '{name}'", first=start,
                         fix=f"Fix those values in the file or {REGENERATE}.")
        video = torch.from_numpy(read["frames"]).permute(3, 0, 1, 2).float().div_(127.5).sub_(1.0)
        action = np.clip(read["actions"].astype(np.float32), -1.0, 1.0)
        item = {
            "video": video.contiguous(),
            "action": torch.from_numpy(action),
            "ee_pos": torch.from_numpy(read["ee_pos"].astype(np.float32)),
            "proprio": torch.from_numpy(read["proprio"].astype(np.float32)),
            "episode": int(episode),
            "start": int(start),
            "task": self.task_names[episode],
        }
        if self._camera is not None:
            item[CAMERA_KEY] = self._camera.clone()
        return with_control(item, self.config.control)

    def close(self) -> None:
        """Close this process's file handle (it is reopened on the next item)."""
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None
                self._pid = None
                self._memory = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_pid"] = None
        state["_memory"] = None
        return state

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"MetaWorldClips({str(self.path)!r}, split={c.split!r}, episodes={len(self.episodes)}, "
                f"clips={len(self)}, window={c.window}, stride={c.stride})")
