"""Robot recordings in the LeRobot dataset format (v2.1 and v3.0) as clips: the ``lerobot`` dataset.

A LeRobot dataset directory (the layouts are in :mod:`workbench.data.lerobot_format`) holds
parquet tables of actions and states, one MP4 per camera (per episode in v2.1, concatenated in
v3.0) and JSON metadata. It is read from local disk with pyarrow and PyAV; LeRobot itself is
not needed (its pinned dependencies conflict with this stack's torch and diffusers).

Items are windows of ``window`` consecutive frames at ``fps`` (the dataset's own rate when
``null``) starting every ``stride`` frames of an episode; a window never crosses an episode
boundary::

    {"video": float32 [3, window, H, W] in [-1, 1], "action": float32 [window, A],
     "proprio": float32 [window, S] (the ``state`` feature; absent when none is served),
     "ee_pos": float32 [window, 3] (only with ``ee_pos`` set),
     "episode": int (the dataset's episode_index), "start": int (first frame, at ``fps``),
     "task": str, "prompt": str (the same task string: the text condition backbones read),
     "camera": float32 [12] (when meta/info.json records the camera's calibration; see
     :mod:`workbench.data.camera`)}

Frame ``k`` of a window is the recorded frame nearest in time to ``start_time + k / fps``, and its
action and state are the recorded ones of that frame (nearest-sample resampling; with ``fps`` equal
to the dataset's every frame is served as recorded). Only the frames of a served window are decoded:
the reader seeks to the key frame before the window. The train/validation split is by episode,
stratified by task and seeded (the same rule as the ``metaworld`` dataset).

Example::

    clips = LeRobotClips(root="robot_data/", camera="observation.images.front", window=16, size=[64, 64])
    item = clips[0]          # item["video"]: (3, 16, 64, 64), item["action"]: (16, A), item["task"]: str
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from workbench.config import check, config_from
from workbench.data.camera import CAMERA_KEY, CameraCalibration
from workbench.data.checks import check_finite
from workbench.data.control import check_control, with_control
from workbench.data.lerobot_format import Episode, LeRobotMeta, column, parquet_columns, read_parquet
from workbench.data.metaworld import split_episodes
from workbench.data.video_io import VideoReader
from workbench.errors import DataError, did_you_mean, listing
from workbench.registry import register

NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclasses.dataclass
class LeRobotConfig:
    """Config of the ``lerobot`` dataset.

    ``root``: the dataset directory (local). ``camera``: the video feature to serve (``null``: the
    only one). ``actions`` / ``state`` / ``ee_pos``: features served as ``action`` / ``proprio`` /
    ``ee_pos`` (``null`` leaves one out; ``state: auto``, the default, serves ``observation.state``
    when the dataset has it and nothing otherwise). ``fps``: the frame rate of the served clips (``null``: the
    dataset's). ``size``: ``[H, W]`` the frames are resized to (``null``: as stored).
    ``drop_short``: leave out episodes shorter than the window instead of raising.
    ``tolerance_s``: how far (seconds) a decoded frame may be from the wanted time (``null``:
    one frame period less 0.1 ms, as LeRobot). ``control``: a control video derived from each clip's
    frames, served as ``control`` ``(C, T, H, W)`` (``edges``; see :mod:`workbench.data.control`).
    ``max_abs``: a served action or state value beyond this magnitude (or NaN, or infinite) is
    refused when the tables are read, naming the file, episode and frame.
    """

    root: str
    camera: str | None = None
    window: int = 16
    stride: int = 4
    split: Literal["train", "val", "all"] = "train"
    actions: str = "action"
    state: str | None = "auto"
    ee_pos: str | None = None
    fps: float | None = None
    size: list[int] | None = None
    val_fraction: float = 0.2
    seed: int = 0
    drop_short: bool = False
    tolerance_s: float | None = None
    control: str | None = None
    max_abs: float = 1e6

    def __post_init__(self) -> None:
        check(isinstance(self.root, str) and self.root != "", "root",
              "must be the directory of a LeRobot dataset (holding meta/info.json).")
        check(self.window >= 2, "window",
              f"must be >= 2 (a clip needs a frame and its successor), got {self.window}.")
        check(self.stride >= 1, "stride", f"must be >= 1, got {self.stride}.")
        check(self.split in ("train", "val", "all"), "split",
              f"must be 'train', 'val' or 'all', got {self.split!r}.")
        check(0.0 <= self.val_fraction < 1.0, "val_fraction", f"must be in [0, 1), got {self.val_fraction}.")
        check(self.fps is None or self.fps > 0, "fps",
              f"must be > 0 or null (the dataset's), got {self.fps}.")
        check(self.size is None or (len(self.size) == 2 and all(int(s) >= 8 for s in self.size)), "size",
              f"must be [height, width] (each >= 8) or null, got {self.size}.")
        check(self.tolerance_s is None or self.tolerance_s > 0, "tolerance_s",
              f"must be > 0, got {self.tolerance_s}.")
        check_control(self.control)
        check(self.max_abs > 0, "max_abs", f"must be > 0, got {self.max_abs}.")


NON_FINITE_FIX = ("Fix those values in the dataset and re-export it (or leave the episode out of it); a real "
                  "measurement this large needs a larger `max_abs:` in the dataset config.")
#: What ``state: auto`` serves when the dataset has it.
STATE = "observation.state"


@register("dataset", "lerobot")
class LeRobotClips(Dataset):
    """Windows of LeRobot episodes: decoded frames of one camera, actions, state, task string."""

    config_class = LeRobotConfig
    requires_extras = {"data": ("pyarrow", "av")}

    def __init__(self, config: LeRobotConfig | None = None, **overrides: Any):
        self.config = config = config_from(type(self), config, overrides)
        self.meta = meta = LeRobotMeta(config.root)
        self.root = meta.root
        self.camera = self._camera()
        #: The camera's calibration from ``meta/info.json``
        #: (:class:`~workbench.data.camera.CameraCalibration`), or None when the dataset records none.
        found = meta.features[self.camera].get("calibration")
        where = f"{meta.info_path} (camera {self.camera})"
        self.calibration = CameraCalibration.from_json(found, where) if found is not None else None
        self._calibration_vector = torch.from_numpy(self.calibration.vector()) if self.calibration else None
        state = config.state
        # the usual name, when the dataset has it: an adapter that reads no state needs none
        if state == "auto":
            numeric = meta.features.get(STATE, {}).get("dtype") in NUMERIC
            state = STATE if numeric else None
        self.signals = {"action": config.actions, "proprio": state, "ee_pos": config.ee_pos}
        self.signals = {k: v for k, v in self.signals.items() if v is not None}
        for name, feature in self.signals.items():
            self._check_feature(name, feature)
        self.source_fps = meta.fps
        self.fps = float(config.fps) if config.fps else meta.fps
        self.tolerance = config.tolerance_s or (1.0 / meta.fps - 1e-4)
        self.size = tuple(int(s) for s in config.size) if config.size else None
        self._load_tables()
        # an episode's task (for the stratified split): that of its first frame, else its metadata's first
        self.task_names = [self._task(e, 0) for e in range(len(meta.episodes))]
        self.train_episodes, self.val_episodes = split_episodes(self.task_names, config.val_fraction,
                                                                config.seed)
        chosen = {"train": self.train_episodes, "val": self.val_episodes,
                  "all": list(range(len(meta.episodes)))}[config.split]
        self.episodes = self._long_enough(chosen)
        self.index: list[tuple[int, int]] = [
            (e, s) for e in self.episodes
            for s in range(0, self.served_length(e) - config.window + 1, config.stride)]
        self._video = VideoReader()

    @classmethod
    def from_config(cls, config: LeRobotConfig) -> LeRobotClips:
        return cls(config)

    # ------------------------------------------------------------------ validation
    def _camera(self) -> str:
        meta, wanted = self.meta, self.config.camera
        if wanted is None:
            if len(meta.video_keys) == 1:
                return meta.video_keys[0]
            raise DataError(f"{meta.info_path}: the dataset has {len(meta.video_keys)} cameras "
                            f"({listing(meta.video_keys)}); choose one with `camera:` in the dataset config.")
        if wanted in meta.image_keys:
            raise DataError(f"{meta.info_path}: camera {wanted!r} is stored as images "
                            f"inside the parquet tables, which this reader does not decode; "
                            f"cameras stored as video: {listing(meta.video_keys)}. "
                            f"Re-export the dataset with videos.")
        if wanted not in meta.video_keys:
            raise DataError(f"{meta.info_path}: camera {wanted!r} is not a video feature of this dataset. "
                            f"Cameras: {listing(meta.video_keys)}.{did_you_mean(wanted, meta.video_keys)} "
                            f"Fix `camera:` in the dataset config.")
        return wanted

    def _check_feature(self, name: str, key: str) -> None:
        meta = self.meta
        numeric = sorted(k for k, f in meta.features.items() if f.get("dtype") in NUMERIC)
        option = {"action": "actions", "proprio": "state", "ee_pos": "ee_pos"}[name]
        if key not in meta.features or meta.features[key].get("dtype") not in NUMERIC:
            what = "is not a feature" if key not in meta.features else \
                f"has dtype {meta.features[key].get('dtype')!r}, not a number vector"
            raise DataError(f"{meta.info_path}: {option}: {key!r} {what} of this dataset. Numeric features: "
                            f"{listing(numeric)}.{did_you_mean(key, numeric)} Fix `{option}:` in the dataset "
                            f"config{' (or set it to null)' if name != 'action' else ''}.")

    def widths(self) -> dict[str, int]:
        """Width of each per-frame signal an item carries, e.g. ``{"action": 7, "proprio": 8}``."""
        return {name: self.meta.width(key) for name, key in self.signals.items()}

    def check_conditions(self, conditions: Any, owner: str = "the adapter") -> None:
        """Raise when a declared :class:`Condition` (``dim``) disagrees with the width this data serves."""
        widths = self.widths()
        for c in conditions:
            for key in c.keys:
                if key in widths and c.dim is not None and widths[key] != c.dim:
                    feature = self.signals[key]
                    option = {"action": "actions", "proprio": "state", "ee_pos": "ee_pos"}[key]
                    numeric = sorted(k for k, f in self.meta.features.items() if f.get("dtype") in NUMERIC)
                    same = [k for k in numeric if self.meta.width(k) == c.dim]
                    other = (f"or choose a feature of width {c.dim} for `{option}:` "
                             f"(this dataset's: {listing(same)})" if same else
                             f"as no feature of this dataset has width {c.dim} (its numeric features: "
                             f"{', '.join(f'{k!r} ({self.meta.width(k)})' for k in numeric)})")
                    raise DataError(
                        f"{self.meta.info_path}: feature {feature!r} ({option}: {feature}) "
                        f"has width {widths[key]}, "
                        f"but {owner} declares Condition {c.name!r} with dim={c.dim}. Set the adapter's dim: "
                        f"{widths[key]}, {other}.")

    def _load_tables(self) -> None:
        """Per-frame timestamps, task indices and signals of every episode, from the parquet tables."""
        try:
            self._read_tables()
        except DataError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as err:
            raise DataError(f"{self.root}: a parquet table of the dataset "
                            f"does not hold what its metadata promises ({type(err).__name__}: {err}); "
                            f"the table or the metadata is damaged. "
                            f"Re-download or re-export the dataset.") from None

    def _read_tables(self) -> None:
        meta = self.meta
        columns = ["episode_index", "frame_index", "timestamp", "task_index", *self.signals.values()]
        by_file: dict[Path, list[Episode]] = {}
        for ep in meta.episodes:
            by_file.setdefault(ep.data_file, []).append(ep)
        position = {ep.index: i for i, ep in enumerate(meta.episodes)}
        self.frames_of: list[dict[str, np.ndarray]] = [{} for _ in meta.episodes]
        for path, eps in by_file.items():
            names = parquet_columns(path)
            missing = [c for c in columns if c not in names]
            if missing:
                raise DataError(f"{path}: missing column(s) {missing} "
                                f"(features in meta/info.json promise them); "
                                f"the table has {names}. Re-export the dataset.")
            table = read_parquet(path, columns=list(dict.fromkeys(columns)))  # not the image columns, if any
            data = {c: column(table, c, path) for c in columns}
            for ep in eps:
                rows = np.flatnonzero(data["episode_index"] == ep.index)
                rows = rows[np.argsort(data["frame_index"][rows], kind="stable")]
                if len(rows) != ep.length:
                    raise DataError(f"{path}: episode {ep.index} has {len(rows)} rows "
                                    f"but the episode metadata says length {ep.length}; "
                                    f"the dataset is inconsistent. Re-export it.")
                frames = {"timestamp": data["timestamp"][rows].astype(np.float64),
                          "task_index": data["task_index"][rows].astype(np.int64)}
                for name, key in self.signals.items():
                    value = data[key][rows].astype(np.float64).reshape(len(rows), -1)
                    check_finite(value, f"{path}: episode {ep.index}", f"{key!r} ({name})",
                                 limit=self.config.max_abs, fix=NON_FINITE_FIX)
                    frames[name] = value.astype(np.float32)
                self.frames_of[position[ep.index]] = frames

    def _task(self, e: int, row: int) -> str:
        indices, listed = self.frames_of[e]["task_index"], self.meta.episodes[e].tasks
        fallback = listed[0] if listed else ""
        return self.meta.tasks.get(int(indices[row]), fallback) if len(indices) else fallback

    def served_length(self, e: int) -> int:
        """Frames of episode position ``e`` at the served fps."""
        ts = self.frames_of[e]["timestamp"]
        if len(ts) == 0:
            return 0
        if self.fps == self.source_fps:
            return len(ts)
        return int(np.floor((ts[-1] - ts[0]) * self.fps + 1e-3)) + 1  # slack for float32 timestamps

    def _long_enough(self, chosen: list[int]) -> list[int]:
        window, short = self.config.window, [e for e in chosen if self.served_length(e) < self.config.window]
        if short and not self.config.drop_short:
            e = short[0]
            ep = self.meta.episodes[e]
            shortest = min(self.served_length(i) for i in range(len(self.meta.episodes)))
            raise DataError(
                f"{ep.data_file}: episode {ep.index} has {self.served_length(e)} frames at {self.fps:g} fps, "
                f"shorter than window={window} "
                f"({len(short)} of the {len(chosen)} episodes of split {self.config.split!r} are). "
                f"Use window <= {shortest} (the shortest episode), or drop_short: true to leave them out.")
        too_short = set(short)
        kept = [e for e in chosen if e not in too_short]
        if not kept:
            raise DataError(f"{self.root}: split {self.config.split!r} has no episodes "
                            f"of at least {window} frames ({len(self.meta.episodes)} episode(s), "
                            f"val_fraction={self.config.val_fraction}). "
                            f"Use split: all, a smaller window, or another val_fraction.")
        return kept

    # ------------------------------------------------------------------ access
    def rows(self, e: int, start: int, count: int | None = None) -> np.ndarray:
        """Row indices (within episode position ``e``) of the ``count`` (default: the window's) served frames
        from served frame ``start`` on."""
        k = np.arange(start, start + (self.config.window if count is None else count))
        if self.fps == self.source_fps:
            return k
        ts = self.frames_of[e]["timestamp"]
        want = ts[0] + k / self.fps
        right = np.clip(np.searchsorted(ts, want), 1, len(ts) - 1)
        return np.where(np.abs(ts[right - 1] - want) <= np.abs(ts[right] - want), right - 1, right)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self.index) <= i < len(self.index):
            raise IndexError(f"index {i} out of range for {len(self.index)} clips")
        e, start = self.index[i]
        return self._item(e, start, self.config.window)

    def episode(self, e: int, frames: int | None = None) -> dict[str, Any]:
        """Episode position ``e`` (of ``meta.episodes``) as one item: its first ``frames`` served frames
        (default: all of them, :meth:`~workbench.data.lerobot.LeRobotClips.served_length`), with the keys of
        a window (``start`` 0), e.g. to roll it out whole."""
        length = self.served_length(e)
        count = length if frames is None else int(frames)
        if not 1 <= count <= length:
            raise DataError(f"episode {self.meta.episodes[e].index} of {self.root} has {length} frames at "
                            f"{self.fps:g} fps; asked for {count}. "
                            f"Ask for 1 to {length} (or None: all of them).")
        return self._item(e, 0, count)

    def _item(self, e: int, start: int, count: int) -> dict[str, Any]:
        rows = self.rows(e, start, count)
        frames = self.frames_of[e]
        path, offset = self.meta.episodes[e].videos[self.camera]
        images = self._video.frames(path, offset + frames["timestamp"][rows], self.size, self.tolerance,
                                    what=f" (episode {self.meta.episodes[e].index}, camera {self.camera})")
        video = torch.from_numpy(images).permute(3, 0, 1, 2).float().div_(127.5).sub_(1.0)  # (3, T, H, W)
        task = self._task(e, int(rows[0]))
        item: dict[str, Any] = {"video": video.contiguous()}
        for name in self.signals:
            item[name] = torch.from_numpy(np.ascontiguousarray(frames[name][rows]))
        item.update(episode=self.meta.episodes[e].index, start=int(start), task=task, prompt=task)
        if self._calibration_vector is not None:
            item[CAMERA_KEY] = self._calibration_vector.clone()
        return with_control(item, self.config.control)

    def episode_frames(self, e: int) -> np.ndarray:
        """Every served frame of episode position ``e`` (of ``meta.episodes``), uint8 ``(T, H, W, 3)`` at the
        served size and rate: what pretraining a backbone on the dataset's video reads."""
        rows = self.rows(e, 0, self.served_length(e))
        path, offset = self.meta.episodes[e].videos[self.camera]
        return self._video.frames(path, offset + self.frames_of[e]["timestamp"][rows], self.size,
                                  self.tolerance,
                                  what=f" (episode {self.meta.episodes[e].index}, camera {self.camera})")

    def close(self) -> None:
        """Close this process's open video files (they are reopened on the next item)."""
        self._video.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"LeRobotClips({str(self.root)!r}, {self.meta.version}, camera={self.camera!r}, "
                f"split={c.split!r}, episodes={len(self.episodes)}, clips={len(self)}, window={c.window}, "
                f"stride={c.stride}, fps={self.fps:g})")


def is_lerobot_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding ``meta/info.json`` (a LeRobot dataset)."""
    return (Path(path).expanduser() / "meta" / "info.json").is_file()
