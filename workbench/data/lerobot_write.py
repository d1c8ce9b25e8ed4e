"""Write LeRobot v3.0 datasets.

:class:`LeRobotWriter` takes whole episodes (per-camera uint8 frames, per-frame feature arrays,
a task string) and writes the v3.0 layout (see :mod:`workbench.data.lerobot_format`): one parquet
table ``data/chunk-000/file-000.parquet``, one H.264 MP4 per camera
``videos/{camera}/chunk-000/file-000.mp4`` with the episodes one after another, the episode index
``meta/episodes/chunk-000/file-000.parquet`` (with each episode's ``from_timestamp`` /
``to_timestamp`` in the videos and its statistics), ``meta/tasks.parquet``, ``meta/info.json`` and
``meta/stats.json``, the statistics with the quantiles LeRobot's normalisation reads (see
:mod:`workbench.data.lerobot_stats`). Everything goes into file 000 of chunk 000 (the layout allows
splitting files at 100 MB of data or 200 MB of video; the datasets written here stay far below that).

``meta/episodes`` holds exactly the columns LeRobot writes, so that LeRobot can append episodes to the
dataset and still open it (it refuses episode files whose columns differ). What else a writer records
about an episode (``add_episode``'s keywords: the file it was imported from, a success flag) and about
the dataset (``metadata=``) goes into ``meta/workbench.json``, a file LeRobot leaves alone.

Each episode is checked before anything of it is written (every camera and feature present, as many
rows as frames, the widths and picture size of the first episode, finite values) and a problem is a
:class:`~workbench.errors.DataError` naming the episode, the frame and the fix. The dataset is written
into ``ROOT.partial`` and renamed to ``ROOT`` by :meth:`LeRobotWriter.close`, so ``ROOT`` never holds
half a dataset: used as a context manager, a writer that fails removes its partial directory, and a
new writer removes one a killed process left behind.

The world-model wing converts Meta-World rollouts with it
(:func:`workbench.worldmodel.generate.metaworld_to_lerobot`, ``workbench data metaworld --format lerobot``);
:func:`workbench.data.importer.import_folder` writes a folder of videos and action files with it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from workbench.data import lerobot_stats
from workbench.data.lerobot_format import EXTRA_META, V3_DATA, V3_EPISODES, V3_VIDEO
from workbench.data.video_io import H264Writer, video_info
from workbench.errors import DataError

CODEBASE_VERSION = "v3.0"
#: The file that marks a directory as a writer's unfinished output (so only such a directory is removed).
PARTIAL_MARK = ".workbench-partial"
NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
_DEFAULTS = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
             "task_index": "int64"}


class LeRobotWriter:
    """Collects episodes and writes a LeRobot v3.0 dataset into ``root`` (which must not exist or be empty).

    Args:
        root: The dataset directory to write; it must not exist yet or be empty.
        fps: Frames per second of every episode.
        features: Name → ``(dtype, names)`` of each per-frame numeric feature (``names`` gives the
            width; None for a scalar).
        cameras: The video feature names, e.g. ``["observation.images.front"]``.
        robot_type: The robot's type, recorded in ``meta/info.json`` (None: not stated).
        crf: The H.264 quality of the videos (lower is better and larger; 18 is visually lossless).
        calibration: Camera name → its :class:`~workbench.data.camera.CameraCalibration`, written under
            that video feature in ``meta/info.json`` (``"calibration"``).
        feature_notes: Feature name → keys added to its entry in ``meta/info.json`` (LeRobot keeps
            them), e.g. where its names came from.
        metadata: What ``meta/workbench.json`` records about the whole dataset, beside each episode's
            keywords.

    Raises:
        DataError: When ``root`` exists and is not empty, or a feature or camera is described wrongly;
            nothing is written.
    """

    def __init__(self, root: str | Path, fps: float, features: dict[str, tuple[str, list[str] | None]],
                 cameras: list[str], robot_type: str | None = None, crf: int = 18,
                 calibration: dict[str, Any] | None = None,
                 feature_notes: dict[str, dict[str, Any]] | None = None,
                 metadata: dict[str, Any] | None = None):
        self.root = Path(root).expanduser()
        if self.root.exists() and (not self.root.is_dir() or any(self.root.iterdir())):
            raise DataError(f"{self.root} exists and is not empty; LeRobotWriter writes a new dataset there. "
                            f"Pass a root that does not exist yet (or an empty directory); "
                            f"nothing was written.")
        problems = []
        if not (isinstance(fps, (int, float)) and np.isfinite(fps) and fps > 0):
            problems.append(f"fps must be a positive number, got {fps!r}")
        if not cameras or not all(isinstance(c, str) and c for c in cameras):
            problems.append(f"cameras must be a non-empty list of video feature names, got {cameras!r}")
        for name, spec in features.items():
            if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] in NUMERIC):
                problems.append(f"feature {name!r} must be (dtype, names) "
                                f"with dtype one of {', '.join(NUMERIC)}, got {spec!r}")
        unknown = sorted(set(calibration or {}) - set(cameras or ()))
        if unknown:
            problems.append(f"calibration names camera(s) {unknown} that are not in cameras {cameras}")
        undeclared = sorted(set(feature_notes or {}) - set(features) - set(cameras or ()))
        if undeclared:
            problems.append(f"feature_notes names {undeclared}, which are neither features nor cameras")
        if problems:
            raise DataError("LeRobotWriter: " + "; ".join(problems) + ". Nothing was written.")
        self.partial = self.root.with_name(self.root.name + ".partial")
        if self.partial.exists():
            if not (self.partial / PARTIAL_MARK).is_file():
                raise DataError(f"{self.partial} exists and is not a LeRobotWriter's unfinished output; "
                                f"move it away "
                                f"(the dataset is written there before it is renamed to {self.root.name}).")
            shutil.rmtree(self.partial)  # what a writer that was killed, or not closed, left behind
        self.partial.mkdir(parents=True)
        (self.partial / PARTIAL_MARK).write_text("an unfinished LeRobotWriter output; safe to delete\n")
        self.fps, self.features, self.cameras, self.robot_type, self.crf = (
            fps, features, cameras, robot_type, crf)
        self.calibration = dict(calibration or {})
        self.feature_notes = dict(feature_notes or {})
        self.metadata = dict(metadata or {})
        self.columns: dict[str, list[np.ndarray]] = {k: [] for k in [*_DEFAULTS, *features]}
        self.videos: dict[str, H264Writer] = {}
        self.episodes: list[dict[str, Any]] = []
        self.extras: list[dict[str, Any]] = []  # each episode's keywords, for meta/workbench.json
        self.stats: list[dict[str, dict[str, np.ndarray]]] = []  # each episode's statistics, by feature
        self.tasks: dict[str, int] = {}
        self.frames = 0
        self.shape: tuple[int, int] | None = None
        self.closed = False

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None:
            self.abort()
        elif not self.closed:
            self.close()

    def _check_episode(self, images: dict[str, Any], data: dict[str, Any],
                       task: Any) -> tuple[int, dict, dict]:
        """The episode's frame count, its frames and its features as arrays;
        every problem raised before a write."""
        from workbench.data.checks import check_finite

        where = f"{self.root}: episode {len(self.episodes)}"
        missing = [c for c in self.cameras if c not in images]
        extra = sorted(set(images) - set(self.cameras))
        if missing or extra:
            raise DataError(f"{where}: images must hold exactly the cameras {self.cameras}; "
                            f"missing {missing}, not declared {extra}. "
                            f"Nothing of this episode was written.")
        frames: dict[str, np.ndarray] = {}
        count = None
        for camera in self.cameras:
            value = np.asarray(images[camera])
            if value.dtype != np.uint8:
                hint = ""
                if value.dtype.kind in "fc":
                    check_finite(value, f"{where}, camera {camera!r}", "the picture", limit=np.inf)
                    hint = " (floats in [0, 1]: (x * 255).round().astype(np.uint8))"
                raise DataError(f"{where}: camera {camera!r} has {value.dtype} pictures; "
                                f"they must be uint8 (T, H, W, 3) RGB in 0..255{hint}. "
                                f"Nothing of this episode was written.")
            if value.ndim != 4 or value.shape[-1] != 3 or len(value) == 0:
                raise DataError(f"{where}: camera {camera!r} pictures have shape {list(value.shape)}; "
                                f"expected (T, H, W, 3) RGB with T >= 1. "
                                f"Nothing of this episode was written.")
            height, width = value.shape[1:3]
            if height % 2 or width % 2:
                raise DataError(f"{where}: camera {camera!r} pictures are {width}x{height} pixels; "
                                f"H.264 stores even sizes only. "
                                f"Crop or resize them to an even height and width.")
            if camera in self.videos and (height, width) != tuple(self.shape or ()):
                raise DataError(f"{where}: camera {camera!r} pictures are {width}x{height} pixels, "
                                f"the earlier episodes' {self.shape[1]}x{self.shape[0]}; "
                                f"one video holds one size. Resize them to {self.shape[1]}x{self.shape[0]}.")
            if count is not None and len(value) != count:
                raise DataError(f"{where}: camera {camera!r} has {len(value)} frames, "
                                f"camera {self.cameras[0]!r} {count}; "
                                f"every camera records every frame of an episode.")
            count = len(value)
            frames[camera] = value
        unknown = sorted(set(data) - set(self.features))
        absent = [name for name in self.features if name not in data]
        if unknown or absent:
            raise DataError(f"{where}: data must hold exactly the features {list(self.features)}; "
                            f"missing {absent}, not declared {unknown} (declare them in features=...). "
                            f"Nothing of this episode was written.")
        values: dict[str, np.ndarray] = {}
        for name, (_, names) in self.features.items():
            value = np.asarray(data[name])
            if value.dtype.kind not in "biuf":
                raise DataError(f"{where}: feature {name!r} holds {value.dtype} values, not numbers.")
            width = len(names) if names else 1
            rows = len(value) if value.ndim else 0
            if rows != count:
                raise DataError(f"{where}: feature {name!r} has {rows} rows "
                                f"but the episode has {count} frames (camera {self.cameras[0]!r}). "
                                f"Row t is the value at frame t, so every feature has one row per frame: "
                                f"drop the extra frames or rows, or repeat the last row. "
                                f"Nothing of this episode was written.")
            value = value.reshape(count, -1)
            if value.shape[1] != width:
                raise DataError(f"{where}: feature {name!r} has {value.shape[1]} values a frame, "
                                f"but it was declared with {width} names ({names}). "
                                f"Declare its names to match, or fix the values.")
            check_finite(value, where, f"feature {name!r}", limit=np.inf)
            values[name] = value
        if not isinstance(task, str):
            raise DataError(f"{where}: task must be a string, got {type(task).__name__}.")
        return count, frames, values

    def add_episode(self, images: dict[str, np.ndarray], data: dict[str, np.ndarray], task: str,
                    **extra: Any) -> None:
        """One episode: ``images[camera]`` uint8 ``(T, H, W, 3)``, ``data[feature]`` ``(T, D)`` or ``(T,)``;
        ``extra`` keywords (JSON values, e.g. ``source="pick_01"``) are recorded for it in
        ``meta/workbench.json``.

        Everything is checked before any of it is written; a problem is a DataError naming the
        episode (its position, from 0) and the fix.
        """
        if self.closed:
            raise DataError(f"{self.root}: the writer is closed; "
                            f"start a new LeRobotWriter for another dataset.")
        n, frames_of, values = self._check_episode(images, data, task)
        index = len(self.episodes)
        task_index = self.tasks.setdefault(task, len(self.tasks))
        start = self.frames
        # the columns LeRobot writes, in its order (data, videos, statistics, then where the row is kept)
        row = {"episode_index": index, "tasks": [task], "length": n, "data/chunk_index": 0,
               "data/file_index": 0, "dataset_from_index": start, "dataset_to_index": start + n}
        for camera in self.cameras:
            frames = frames_of[camera]
            if camera not in self.videos:
                self.shape = frames.shape[1:3]
                path = self.partial / V3_VIDEO.format(video_key=camera, chunk_index=0, file_index=0)
                self.videos[camera] = H264Writer(path, self.fps, frames.shape[1], frames.shape[2],
                                                 crf=self.crf)
            row.update({f"videos/{camera}/chunk_index": 0, f"videos/{camera}/file_index": 0,
                        f"videos/{camera}/from_timestamp": start / self.fps,
                        f"videos/{camera}/to_timestamp": (start + n) / self.fps})
            self.videos[camera].write(frames)
        frame = np.arange(n)
        self.columns["timestamp"].append((frame / self.fps).astype(np.float32))
        self.columns["frame_index"].append(frame)
        self.columns["episode_index"].append(np.full(n, index))
        self.columns["index"].append(start + frame)
        self.columns["task_index"].append(np.full(n, task_index))
        for name, (dtype, _) in self.features.items():
            self.columns[name].append(values[name].astype(dtype))
        stats = {camera: lerobot_stats.image_stats(frames_of[camera]) for camera in self.cameras}
        for name in [*self.features, *_DEFAULTS]:  # the order of the features in meta/info.json
            dtype = _DEFAULTS.get(name) or self.features[name][0]
            stats[name] = lerobot_stats.vector_stats(self.columns[name][-1].astype(dtype).reshape(n, -1))
        row.update(lerobot_stats.episode_columns(stats))
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        self.episodes.append(row)
        self.stats.append(stats)
        self.extras.append({"episode_index": index, **extra})
        self.frames += n

    def abort(self) -> None:
        """Stop writing and remove the partial directory (``root`` is left as it was)."""
        for video in self.videos.values():
            with contextlib.suppress(Exception):  # a half-written container may fail to close; it goes next
                video.container.close()
        self.videos = {}
        self.closed = True
        shutil.rmtree(self.partial, ignore_errors=True)

    def close(self) -> Path:
        """Finish the videos and write the tables and metadata; returns the dataset directory."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.closed:
            raise DataError(f"{self.root}: the writer is already closed.")
        if not self.episodes:
            self.abort()
            raise DataError(f"{self.root}: no episodes were added; nothing was written.")
        for writer in self.videos.values():
            writer.close()
        table: dict[str, Any] = {}
        for name, parts in self.columns.items():
            values = np.concatenate(parts)
            dtype = _DEFAULTS.get(name) or self.features[name][0]
            values = values.reshape(len(values), -1).astype(dtype)
            if values.shape[1] == 1:  # a feature of shape [1] is a scalar column, as LeRobot reads it
                table[name] = pa.array(values.reshape(-1))
            else:
                table[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        path = self.partial / V3_DATA.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(table), path)
        episodes = self.partial / V3_EPISODES.format(chunk_index=0, file_index=0)
        episodes.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), episodes)
        self._write_tasks()
        features: dict[str, Any] = {}
        for camera in self.cameras:
            h, w = self.shape or (0, 0)
            info = video_info(self.partial / V3_VIDEO.format(video_key=camera, chunk_index=0, file_index=0))
            features[camera] = {"dtype": "video", "shape": [h, w, 3],
                                "names": ["height", "width", "channels"], "info": info}
            if camera in self.calibration:
                features[camera]["calibration"] = self.calibration[camera].to_json()
        for name, (dtype, names) in self.features.items():
            features[name] = {"dtype": dtype, "shape": [len(names) if names else 1], "names": names}
        for name, dtype in _DEFAULTS.items():
            features[name] = {"dtype": dtype, "shape": [1], "names": None}
        for name, notes in self.feature_notes.items():
            features[name].update(notes)
        stats = {name: lerobot_stats.as_lists(lerobot_stats.aggregate([s[name] for s in self.stats]))
                 for name in features}
        fps = int(self.fps) if float(self.fps).is_integer() else self.fps
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
                "total_episodes": len(self.episodes), "total_frames": self.frames,
                "total_tasks": len(self.tasks),
                "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": fps,
                "splits": {"train": f"0:{len(self.episodes)}"}, "data_path": V3_DATA, "video_path": V3_VIDEO,
                "features": features}
        (self.partial / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        (self.partial / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
        if self.metadata or any(len(extra) > 1 for extra in self.extras):
            extra = {**self.metadata, "episodes": self.extras}
            (self.partial / EXTRA_META).write_text(json.dumps(extra, indent=1) + "\n")
        (self.partial / PARTIAL_MARK).unlink()
        if self.root.exists():  # an empty directory given as the root
            self.root.rmdir()
        self.partial.rename(self.root)
        self.closed = True
        return self.root

    def _write_tasks(self) -> None:
        """``meta/tasks.parquet`` as LeRobot writes it:
        ``task_index`` with the task string as the pandas index."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = sorted(self.tasks, key=self.tasks.get)
        pandas = {"index_columns": ["task"], "column_indexes": [],
                  "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                               "numpy_type": "int64", "metadata": None},
                              {"name": "task", "field_name": "task", "pandas_type": "unicode",
                               "numpy_type": "object", "metadata": None}],
                  "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0"}
        table = pa.table({"task_index": pa.array([self.tasks[t] for t in names], pa.int64()),
                          "task": pa.array(names, pa.string())})
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
        pq.write_table(table, self.partial / "meta" / "tasks.parquet")
