"""Write LeRobot v3.0 datasets.

:class:`LeRobotWriter` takes whole episodes (per-camera uint8 frames, per-frame feature arrays,
a task string) and writes the v3.0 layout (see :mod:`workbench.data.lerobot_format`): one parquet
table ``data/chunk-000/file-000.parquet``, one H.264 MP4 per camera
``videos/{camera}/chunk-000/file-000.mp4`` with the episodes one after another, the episode index
``meta/episodes/chunk-000/file-000.parquet`` (with each episode's ``from_timestamp`` /
``to_timestamp`` in the videos), ``meta/tasks.parquet``, ``meta/info.json`` and ``meta/stats.json``.
Everything goes into file 000 of chunk 000 (the layout allows splitting files at 100 MB of data or
200 MB of video; the datasets written here stay far below that).

The world-model wing converts Meta-World rollouts with it
(:func:`workbench.worldmodel.generate.metaworld_to_lerobot`, ``workbench data metaworld --format lerobot``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from workbench.data.lerobot_format import V3_DATA, V3_EPISODES, V3_VIDEO
from workbench.data.video_io import H264Writer, video_info
from workbench.errors import DataError

CODEBASE_VERSION = "v3.0"
_DEFAULTS = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
             "task_index": "int64"}


def _stats(values: np.ndarray) -> dict[str, list]:
    v = values.astype(np.float64)
    return {"min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(),
            "std": v.std(0).tolist(), "count": [int(len(v))]}


class LeRobotWriter:
    """Collects episodes and writes a LeRobot v3.0 dataset into ``root`` (which must not exist or be empty).

    ``features``: name → ``(dtype, names)`` of each per-frame numeric feature (``names`` gives the
    width; ``None`` for a scalar). ``cameras``: the video feature names, e.g.
    ``["observation.images.front"]``. ``calibration``: camera name → its
    :class:`~workbench.data.camera.CameraCalibration`, written under that video feature in
    ``meta/info.json`` (``"calibration"``).
    """

    def __init__(self, root: str | Path, fps: float, features: dict[str, tuple[str, list[str] | None]],
                 cameras: list[str], robot_type: str | None = None, crf: int = 18,
                 calibration: dict[str, Any] | None = None):
        self.root = Path(root).expanduser()
        if self.root.exists() and any(self.root.iterdir()):
            raise DataError(f"{self.root} exists and is not empty; give --out a new directory (nothing was written).")
        self.fps, self.features, self.cameras, self.robot_type, self.crf = fps, features, cameras, robot_type, crf
        self.calibration = dict(calibration or {})
        self.columns: dict[str, list[np.ndarray]] = {k: [] for k in [*_DEFAULTS, *features]}
        self.images: dict[str, list[np.ndarray]] = {k: [] for k in cameras}
        self.videos: dict[str, H264Writer] = {}
        self.episodes: list[dict[str, Any]] = []
        self.tasks: dict[str, int] = {}
        self.frames = 0
        self.shape: tuple[int, int] | None = None

    def add_episode(self, images: dict[str, np.ndarray], data: dict[str, np.ndarray], task: str,
                    **extra: Any) -> None:
        """One episode: ``images[camera]`` uint8 ``(T, H, W, 3)``, ``data[feature]`` ``(T, D)`` or ``(T,)``."""
        n = len(next(iter(images.values())))
        index = len(self.episodes)
        task_index = self.tasks.setdefault(task, len(self.tasks))
        start = self.frames
        row = {"episode_index": index, "tasks": [task], "length": n, "data/chunk_index": 0, "data/file_index": 0,
               "dataset_from_index": start, "dataset_to_index": start + n,
               "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, **extra}
        for camera in self.cameras:
            frames = np.asarray(images[camera], dtype=np.uint8)
            if camera not in self.videos:
                self.shape = frames.shape[1:3]
                path = self.root / V3_VIDEO.format(video_key=camera, chunk_index=0, file_index=0)
                self.videos[camera] = H264Writer(path, self.fps, frames.shape[1], frames.shape[2], crf=self.crf)
            row.update({f"videos/{camera}/chunk_index": 0, f"videos/{camera}/file_index": 0,
                        f"videos/{camera}/from_timestamp": start / self.fps,
                        f"videos/{camera}/to_timestamp": (start + n) / self.fps})
            self.videos[camera].write(frames)
            self.images[camera].append(frames[:: max(1, n // 8)])  # a subsample for the pixel statistics
        frame = np.arange(n)
        self.columns["timestamp"].append((frame / self.fps).astype(np.float32))
        self.columns["frame_index"].append(frame)
        self.columns["episode_index"].append(np.full(n, index))
        self.columns["index"].append(start + frame)
        self.columns["task_index"].append(np.full(n, task_index))
        for name, (dtype, _) in self.features.items():
            self.columns[name].append(np.asarray(data[name]).astype(dtype).reshape(n, -1))
        self.episodes.append(row)
        self.frames += n

    def close(self) -> Path:
        """Finish the videos and write the tables and metadata; returns the dataset directory."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.episodes:
            raise DataError(f"{self.root}: no episodes were added; nothing to write.")
        for writer in self.videos.values():
            writer.close()
        table: dict[str, Any] = {}
        stats: dict[str, Any] = {}
        for name, parts in self.columns.items():
            values = np.concatenate(parts)
            dtype = _DEFAULTS.get(name) or self.features[name][0]
            values = values.astype(dtype)
            stats[name] = _stats(values.reshape(len(values), -1))
            if name in _DEFAULTS or self.features[name][1] is None:
                table[name] = pa.array(values.reshape(-1))
            else:
                width = values.shape[1]
                table[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)
        path = self.root / V3_DATA.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(table), path)
        episodes = self.root / V3_EPISODES.format(chunk_index=0, file_index=0)
        episodes.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), episodes)
        self._write_tasks()
        features: dict[str, Any] = {}
        for camera in self.cameras:
            h, w = self.shape or (0, 0)
            pixels = np.concatenate(self.images[camera]).reshape(-1, 3) / 255.0
            stats[camera] = {k: [[[v]] for v in vs] if k != "count" else vs
                             for k, vs in _stats(pixels).items()}
            info = video_info(self.root / V3_VIDEO.format(video_key=camera, chunk_index=0, file_index=0))
            features[camera] = {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                                "info": info}
            if camera in self.calibration:
                features[camera]["calibration"] = self.calibration[camera].to_json()
        for name, (dtype, names) in self.features.items():
            features[name] = {"dtype": dtype, "shape": [len(names) if names else 1], "names": names}
        for name, dtype in _DEFAULTS.items():
            features[name] = {"dtype": dtype, "shape": [1], "names": None}
        fps = int(self.fps) if float(self.fps).is_integer() else self.fps
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
                "total_episodes": len(self.episodes), "total_frames": self.frames, "total_tasks": len(self.tasks),
                "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200, "fps": fps,
                "splits": {"train": f"0:{len(self.episodes)}"}, "data_path": V3_DATA, "video_path": V3_VIDEO,
                "features": features}
        (self.root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        (self.root / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
        return self.root

    def _write_tasks(self) -> None:
        """``meta/tasks.parquet`` as LeRobot writes it: ``task_index`` with the task string as the pandas index."""
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
        pq.write_table(table, self.root / "meta" / "tasks.parquet")
