"""The LeRobot dataset layouts, read from local disk with pyarrow: codebase versions v2.1 and v3.0.

Both layouts keep ``meta/info.json`` with ``codebase_version``, ``fps``, ``features`` (name →
``{"dtype", "shape", "names"}``; cameras have ``dtype: video``), ``chunks_size``,
``total_episodes`` and the path templates ``data_path`` / ``video_path``. Every frame is one row
of a parquet table with the columns ``timestamp`` (seconds from the episode's start),
``frame_index``, ``episode_index``, ``index`` (global) and ``task_index``, plus one column per
non-video feature (a vector feature is a list column, a ``shape: [1]`` feature a scalar column).

**v2.1** (also v2.0) — one file per episode:

```text
data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet
videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4
meta/episodes.jsonl        {"episode_index": 0, "tasks": ["..."], "length": 123} per line
meta/tasks.jsonl           {"task_index": 0, "task": "..."} per line
meta/episodes_stats.jsonl  per-episode feature statistics (v2.1)
```

``episode_chunk = episode_index // chunks_size``; a video starts at time 0 with its episode.

**v3.0** — many episodes concatenated per file:

```text
data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet
videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4
meta/episodes/chunk-000/file-000.parquet   one row per episode: episode_index, tasks, length,
    data/chunk_index, data/file_index, dataset_from_index, dataset_to_index, and per camera
    videos/{key}/chunk_index, videos/{key}/file_index, videos/{key}/from_timestamp, .../to_timestamp
meta/tasks.parquet   task_index, and the task string (as the pandas index or a ``task`` column)
meta/stats.json      statistics of every feature over the dataset (min, max, mean, std, count and the
    quantiles q01, q10, q50, q90, q99); meta/episodes holds each episode's as stats/{feature}/{statistic}
```

An episode's frame at ``timestamp`` t is at ``from_timestamp + t`` in its camera's video file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import DataError

VERSIONS = ("v2.0", "v2.1", "v3.0")
V2_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V2_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V3_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V3_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V3_EPISODES = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
#: What workbench records beside the layout (per episode: the file it was imported from, a success flag; the
#: dataset's import options). LeRobot reads nothing of it; appending episodes with LeRobot leaves it alone.
EXTRA_META = "meta/workbench.json"


FIX = "re-download or re-export the dataset"


@dataclasses.dataclass
class Episode:
    """One episode: its recorded length, tasks, parquet file and, per camera, video file and start time."""

    index: int
    length: int
    tasks: list[str]
    data_file: Path
    videos: dict[str, tuple[Path, float]]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not readable JSON ({err}). The dataset's metadata is damaged; "
                        f"re-download or re-export it.") from err


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise DataError(f"{path} is missing: a LeRobot v2.x dataset keeps one JSON object per line there. "
                        f"The dataset is incomplete; re-download or re-export it.")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError as err:
        raise DataError(f"{path}: a line is not valid JSON ({err}); "
                        f"re-download or re-export the dataset.") from err


def _parquet_exists(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"{path} is missing (expected a parquet file of the LeRobot layout). The dataset is "
                        f"incomplete; re-download or re-export it.")


def read_parquet(path: Path, columns: list[str] | None = None) -> Any:
    """A pyarrow table of ``path`` (only ``columns``), with a DataError naming the file when it fails."""
    import pyarrow.parquet as pq

    _parquet_exists(path)
    try:
        return pq.read_table(path, columns=columns)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError / KeyError for bad files or columns
        raise DataError(f"{path}: cannot read the parquet table"
                        f"{' columns ' + str(columns) if columns else ''} "
                        f"({type(err).__name__}: {err}).") from err


def parquet_columns(path: Path) -> list[str]:
    """Column names of a parquet file (its schema only), with a DataError naming the file when it fails."""
    import pyarrow.parquet as pq

    _parquet_exists(path)
    try:
        return list(pq.read_schema(path).names)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err}); re-download or "
                        f"re-export the dataset.") from err


def column(table: Any, name: str, where: Path) -> np.ndarray:
    """A column as numpy: scalars → (N,), list / fixed-size-list columns → (N, D)."""
    import pyarrow as pa

    if name not in table.column_names:
        raise DataError(f"{where}: no column {name!r}; the table has {table.column_names}.")
    col = table.column(name).combine_chunks()
    if (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
            or pa.types.is_fixed_size_list(col.type)):
        flat = col.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)
    return col.to_numpy(zero_copy_only=False)


class LeRobotMeta:
    """What ``meta/`` says about a LeRobot dataset directory: version, fps, features, episodes, tasks."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        info_path = self.root / "meta" / "info.json"
        if not self.root.is_dir():
            raise DataError(f"LeRobot dataset directory not found: {self.root}. "
                            f"`root` must be a local directory holding meta/info.json, data/ and videos/ "
                            f"(hub datasets must be downloaded first; "
                            f"`workbench data metaworld --format lerobot --out DIR` writes one).")
        if not info_path.is_file():
            raise DataError(f"{info_path} is missing: {self.root} is not a LeRobot dataset "
                            f"(expected meta/info.json with codebase_version, fps and features). "
                            f"Point `root` at the dataset's top directory.")
        info = _json(info_path)
        if not isinstance(info, dict):
            raise DataError(f"{info_path}: expected a JSON object with codebase_version, fps and features, "
                            f"got {type(info).__name__}. The dataset's metadata is damaged; {FIX}.")
        self.info_path = info_path
        self.info: dict[str, Any] = info
        try:
            self._read_info(info)
        except DataError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as err:
            raise DataError(f"{self.root}: the dataset's metadata (meta/) is damaged or inconsistent "
                            f"({type(err).__name__}: {err}); {FIX}.") from None

    def _read_info(self, info: dict[str, Any]) -> None:
        info_path = self.info_path
        version = info.get("codebase_version")
        if version not in VERSIONS:
            raise DataError(f"{info_path}: codebase_version {version!r} is not a LeRobot layout "
                            f"this workbench reads; supported: {', '.join(VERSIONS)}. "
                            f"Convert the dataset with LeRobot's own converter (v2.1 → v3.0) "
                            f"or re-export it.")
        self.version: str = version
        missing = [k for k in ("fps", "features") if k not in info]
        if missing:
            raise DataError(f"{info_path}: missing field(s) {missing}; a LeRobot info.json has "
                            f"codebase_version, fps, features, data_path, video_path. Re-export the dataset.")
        self.fps = float(info["fps"])
        if not (self.fps > 0 and np.isfinite(self.fps)):
            raise DataError(f"{info_path}: fps is {info['fps']!r}; a LeRobot dataset records frames "
                            f"at a positive rate. The metadata is damaged; {FIX}.")
        self.features: dict[str, dict] = info["features"]
        if (not isinstance(self.features, dict)
                or not all(isinstance(f, dict) for f in self.features.values())):
            raise DataError(f"{info_path}: features must map names to {{dtype, shape, names}} objects. "
                            f"The metadata is damaged; {FIX}.")
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        self.image_keys = [k for k, f in self.features.items() if f.get("dtype") == "image"]
        self.chunks_size = int(info.get("chunks_size", 1000))
        self.v3 = version.startswith("v3")
        self.data_path = info.get("data_path") or (V3_DATA if self.v3 else V2_DATA)
        self.video_path = info.get("video_path") or (V3_VIDEO if self.v3 else V2_VIDEO)
        self.tasks = self._tasks()
        self.episodes = self._episodes_v3() if self.v3 else self._episodes_v2()
        total = info.get("total_episodes")
        if total is not None and int(total) != len(self.episodes):
            raise DataError(f"{info_path}: total_episodes is {total} but the episode metadata lists "
                            f"{len(self.episodes)} episodes; the dataset is incomplete. "
                            f"Re-download or re-export it.")

    def width(self, key: str) -> int:
        shape = self.features[key].get("shape") or [1]
        return int(np.prod(shape))

    # ------------------------------------------------------------------ tasks
    def _tasks(self) -> dict[int, str]:
        if not self.v3:
            path = self.root / "meta" / "tasks.jsonl"
            try:
                return {int(r["task_index"]): str(r["task"]) for r in _jsonl(path)}
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
                raise DataError(f"{path}: a task's line is damaged or incomplete "
                                f"({type(err).__name__}: {err}); "
                                f"each line holds task_index and task. {FIX[0].upper() + FIX[1:]}.") from None
        path = self.root / "meta" / "tasks.parquet"
        table = read_parquet(path)
        names = table.column_names
        text = "task" if "task" in names else None
        if text is None:  # written from a pandas frame indexed by the task string
            pandas = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
            text = next((c for c in pandas.get("index_columns", [])
                         if isinstance(c, str) and c in names), None)
        if text is None or "task_index" not in names:
            raise DataError(f"{path}: expected a task_index column and the task strings "
                            f"(a 'task' column or the pandas index); found columns {names}.")
        return dict(zip(column(table, "task_index", path).astype(int).tolist(),
                        [str(t) for t in column(table, text, path)]))

    # ------------------------------------------------------------------ episodes
    def _episodes_v2(self) -> list[Episode]:
        out = []
        path = self.root / "meta" / "episodes.jsonl"
        try:
            for row in sorted(_jsonl(path), key=lambda r: int(r["episode_index"])):
                i = int(row["episode_index"])
                fmt = {"episode_chunk": i // self.chunks_size, "episode_index": i}
                videos = {k: (self.root / self.video_path.format(video_key=k, **fmt), 0.0)
                          for k in self.video_keys}
                out.append(Episode(i, int(row["length"]), [str(t) for t in row.get("tasks", [])],
                                   self.root / self.data_path.format(**fmt), videos))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as err:
            raise DataError(f"{path}: an episode's line is damaged or incomplete "
                            f"({type(err).__name__}: {err}); "
                            f"each line holds episode_index, length and tasks. "
                            f"{FIX[0].upper() + FIX[1:]}.") from None
        return out

    def _episodes_v3(self) -> list[Episode]:
        files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
        if not files:
            raise DataError(f"{self.root / 'meta' / 'episodes'}: no episode metadata (expected "
                            f"{V3_EPISODES.format(chunk_index=0, file_index=0)}) in this v3.0 dataset; "
                            f"re-download or re-export it.")
        out = []
        for path in files:
            table = read_parquet(path)
            rows = table.select([c for c in table.column_names if not c.startswith("stats/")]).to_pylist()
            for row in rows:
                try:
                    data = self.root / self.data_path.format(chunk_index=int(row["data/chunk_index"]),
                                                             file_index=int(row["data/file_index"]))
                    videos = {}
                    for k in self.video_keys:
                        f = self.video_path.format(video_key=k,
                                                   chunk_index=int(row[f"videos/{k}/chunk_index"]),
                                                   file_index=int(row[f"videos/{k}/file_index"]))
                        videos[k] = (self.root / f, float(row[f"videos/{k}/from_timestamp"]))
                    out.append(Episode(int(row["episode_index"]), int(row["length"]),
                                       [str(t) for t in row.get("tasks") or []], data, videos))
                except KeyError as err:
                    raise DataError(f"{path}: episode metadata lacks the column {err.args[0]!r} (columns: "
                                    f"{sorted(row)}); re-export the dataset.") from err
                except (TypeError, ValueError, OverflowError) as err:
                    raise DataError(f"{path}: an episode's metadata is damaged "
                                    f"({type(err).__name__}: {err}); {FIX}.") from None
        return sorted(out, key=lambda e: e.index)
