"""Small LeRobot datasets written from scratch for the tests, in the v2.1 and the v3.0 layout.

Written with pyarrow and PyAV directly (not with workbench's writer), so the reader is checked
against the layouts themselves. Every frame is a flat colour that says where it came from:
red = 8 * frame_index, green = 40 * episode + 20, blue = 100 + 80 * camera; flat frames survive
H.264 within a few levels. Actions are ``[episode, frame_index, frame_index / 2, -1, 0.25]``
(width 5) and the state ``[frame_index] * 6`` plus the episode, so every value is traceable.
"""

from __future__ import annotations

import fractions
import json
from pathlib import Path

import numpy as np

CAMERAS = ("observation.images.front", "observation.images.wrist")
TASKS = ("pick up the red block", "open the drawer")
LENGTHS = (12, 9, 15)
FPS = 10
HW = (24, 32)


def frame_codes(episode: int, frame: np.ndarray, camera: int) -> np.ndarray:
    """The (R, G, B) of each frame, (len(frame), 3)."""
    return np.stack([8 * frame, np.full_like(frame, 40 * episode + 20), np.full_like(frame, 100 + 80 * camera)], 1)


def episode_arrays(e: int, n: int) -> dict[str, np.ndarray]:
    i = np.arange(n)
    action = np.stack([np.full(n, e), i, i / 2, np.full(n, -1.0), np.full(n, 0.25)], 1).astype(np.float32)
    state = np.concatenate([np.repeat(i[:, None], 6, 1), np.full((n, 1), e)], 1).astype(np.float32)
    return {"action": action, "observation.state": state}


def write_mp4(path: Path, frames: np.ndarray, fps: int = FPS) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = 4
        stream.options = {"crf": "10"}
        for k, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = k, fractions.Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def images(e: int, n: int, camera: int) -> np.ndarray:
    codes = frame_codes(e, np.arange(n), camera).astype(np.uint8)
    return np.broadcast_to(codes[:, None, None, :], (n, *HW, 3)).copy()


def _features(action_width: int = 5) -> dict:
    out = {cam: {"dtype": "video", "shape": [*HW, 3], "names": ["height", "width", "channels"]} for cam in CAMERAS}
    out["action"] = {"dtype": "float32", "shape": [action_width], "names": None}
    out["observation.state"] = {"dtype": "float32", "shape": [7], "names": None}
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                        ("index", "int64"), ("task_index", "int64")):
        out[name] = {"dtype": dtype, "shape": [1], "names": None}
    return out


def _table(episodes: list[int], lengths, start: int):
    import pyarrow as pa

    cols: dict[str, list] = {k: [] for k in ("action", "observation.state", "timestamp", "frame_index",
                                             "episode_index", "index", "task_index")}
    index = start
    for e in episodes:
        n = lengths[e]
        arrays = episode_arrays(e, n)
        for i in range(n):
            cols["action"].append(arrays["action"][i].tolist())
            cols["observation.state"].append(arrays["observation.state"][i].tolist())
            cols["timestamp"].append(i / FPS)
            cols["frame_index"].append(i)
            cols["episode_index"].append(e)
            cols["index"].append(index)
            cols["task_index"].append(e % len(TASKS))
            index += 1
    return pa.table({"action": pa.array(cols["action"], pa.list_(pa.float32())),
                     "observation.state": pa.array(cols["observation.state"], pa.list_(pa.float32(), 7)),
                     "timestamp": pa.array(cols["timestamp"], pa.float32()),
                     "frame_index": pa.array(cols["frame_index"], pa.int64()),
                     "episode_index": pa.array(cols["episode_index"], pa.int64()),
                     "index": pa.array(cols["index"], pa.int64()),
                     "task_index": pa.array(cols["task_index"], pa.int64())})


def _info(version: str, lengths, data_path: str, video_path: str) -> dict:
    return {"codebase_version": version, "robot_type": "test_arm", "total_episodes": len(lengths),
            "total_frames": int(sum(lengths)), "total_tasks": len(TASKS), "chunks_size": 1000, "fps": FPS,
            "splits": {"train": f"0:{len(lengths)}"}, "data_path": data_path, "video_path": video_path,
            "features": _features()}


def write_v21(root: Path, lengths=LENGTHS) -> Path:
    """The per-episode layout: data/chunk-000/episode_000000.parquet, videos/chunk-000/CAM/episode_000000.mp4."""
    import pyarrow.parquet as pq

    root = Path(root)
    (root / "meta").mkdir(parents=True)
    info = _info("v2.1", lengths, "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                 "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4")
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    start = 0
    episodes, stats = [], []
    for e, n in enumerate(lengths):
        path = root / f"data/chunk-000/episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table([e], lengths, start), path)
        for c, cam in enumerate(CAMERAS):
            write_mp4(root / f"videos/chunk-000/{cam}/episode_{e:06d}.mp4", images(e, n, c))
        episodes.append({"episode_index": e, "tasks": [TASKS[e % len(TASKS)]], "length": n})
        stats.append({"episode_index": e, "stats": {"action": {"min": [0.0] * 5, "max": [1.0] * 5}}})
        start += n
    (root / "meta" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in episodes))
    (root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS)))
    (root / "meta" / "episodes_stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stats))
    return root


def write_v30(root: Path, lengths=LENGTHS, files=((0, 1), (2,))) -> Path:
    """The concatenated layout; episodes grouped into files as ``files`` says (data and videos alike)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    info = _info("v3.0", lengths, "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                 "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    rows, start = [], 0
    for f, group in enumerate(files):
        path = root / f"data/chunk-000/file-{f:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(list(group), lengths, start), path)
        for c, cam in enumerate(CAMERAS):
            write_mp4(root / f"videos/{cam}/chunk-000/file-{f:03d}.mp4",
                      np.concatenate([images(e, lengths[e], c) for e in group]))
        offset = 0.0
        for e in group:
            n = lengths[e]
            row = {"episode_index": e, "tasks": [TASKS[e % len(TASKS)]], "length": n, "data/chunk_index": 0,
                   "data/file_index": f, "dataset_from_index": start, "dataset_to_index": start + n,
                   "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0, "stats/action/min": [0.0] * 5}
            for cam in CAMERAS:
                row.update({f"videos/{cam}/chunk_index": 0, f"videos/{cam}/file_index": f,
                            f"videos/{cam}/from_timestamp": offset, f"videos/{cam}/to_timestamp": offset + n / FPS})
            rows.append(row)
            offset += n / FPS
            start += n
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    # tasks as pandas writes a frame indexed by the task string (what LeRobot does)
    pandas_meta = {"index_columns": ["__index_level_0__"], "column_indexes": [], "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
         "metadata": None},
        {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
         "metadata": None}]}
    tasks = pa.table({"task_index": pa.array(range(len(TASKS)), pa.int64()),
                      "__index_level_0__": pa.array(list(TASKS))})
    pq.write_table(tasks.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()}),
                   root / "meta" / "tasks.parquet")
    (root / "meta" / "stats.json").write_text(json.dumps({"action": {"min": [0.0] * 5, "max": [1.0] * 5}}))
    return root


def write(root: Path, version: str, **kw) -> Path:
    return write_v21(root, **kw) if version == "v2.1" else write_v30(root, **kw)


# -- what LeRobot does to a v3.0 dataset when it appends an episode ------------------------------------------------
RULES = json.loads((Path(__file__).parent / "fixtures" / "lerobot_v30_rules.json").read_text())


def arrow_type(t) -> str:
    """A pyarrow type in the rules' notation: ``int64``, ``double``, ``list<list<double>>``."""
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"list<{arrow_type(t.value_type)}>"
    return {"float": "float32", "halffloat": "float16"}.get(str(t), str(t))


def expected_episode_columns(info: dict) -> dict[str, str]:
    """The columns LeRobot writes in ``meta/episodes`` for a dataset of these ``info.json`` features, with types."""
    videos = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    others = [k for k, f in info["features"].items() if f["dtype"] not in ("video", "image", "string")]
    out: dict[str, str] = {}
    for template, kind in RULES["episode_columns"]:
        names = [{}]
        if "{video}" in template:
            names = [{"video": v} for v in videos]
        elif "{feature}" in template:
            names = [{"feature": f} for f in others]
        for fill in names:
            stats = [s for s in RULES["statistics"] if s != "count"] if "{statistic}" in template else [None]
            for statistic in stats:
                out.setdefault(template.format(**fill, statistic=statistic), kind)
    return out


def lerobot_stats_problems(stats: dict, info: dict) -> list[str]:
    """What LeRobot's checks of ``meta/stats.json`` would refuse (type and shape of every statistic, the
    quantiles its normalisation needs), for every numeric feature and camera of ``info.json``."""
    problems = []
    for name, feature in info["features"].items():
        if feature["dtype"] in ("string",):
            continue
        got = stats.get(name)
        if got is None:
            problems.append(f"{name}: no statistics")
            continue
        missing = [k for k in RULES["statistics"] if k not in got]
        if missing:
            problems.append(f"{name}: lacks {missing}")
        for key, value in got.items():
            shape = list(np.atleast_1d(np.asarray(value)).shape)
            if key == "count" and shape != RULES["stats_shapes"]["count"]:
                problems.append(f"{name}/{key}: shape {shape}")
            if RULES["stats_shapes"]["image_key_marker"] in name and key != "count" \
                    and shape not in RULES["stats_shapes"]["image_keys"]:
                problems.append(f"{name}/{key}: shape {shape}")
    return problems


def _plain_stats(values: np.ndarray, count: int) -> dict[str, list]:
    v = values.reshape(len(values), -1).astype(np.float64)
    out = {"min": v.min(0), "max": v.max(0), "mean": v.mean(0), "std": v.std(0), "count": np.array([count])}
    out.update({f"q{round(q * 100):02d}": np.quantile(v, q, axis=0) for q in (0.01, 0.10, 0.50, 0.90, 0.99)})
    return {k: x.tolist() for k, x in out.items()}


def append_episode(root: Path, images: dict[str, np.ndarray], data: dict[str, np.ndarray], task: str) -> Path:
    """Append one episode to the v3.0 dataset ``root`` the way LeRobot's ``LeRobotDataset.resume`` →
    ``save_episode`` → ``finalize`` does (``RULES["on_resume"]``): new data, video and episode files, the
    row of ``RULES["episode_columns"]``, the counts of info.json, the task and the statistics. Returns the new
    episode file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    episodes = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    last = pq.read_table(episodes[-1]).to_pylist()[-1]
    index, start, n = info["total_episodes"], last["dataset_to_index"], len(next(iter(images.values())))
    tasks_table = pq.read_table(root / "meta" / "tasks.parquet")
    tasks = dict(zip(tasks_table.column("task").to_pylist(), tasks_table.column("task_index").to_pylist()))
    if task not in tasks:
        tasks[task] = len(tasks)
        table = pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()),
                          "task": pa.array(list(tasks), pa.string())})
        pq.write_table(table.replace_schema_metadata(tasks_table.schema.metadata), root / "meta" / "tasks.parquet")
    frame = np.arange(n)
    columns = {"timestamp": (frame / info["fps"]).astype(np.float32), "frame_index": frame,
               "episode_index": np.full(n, index), "index": start + frame, "task_index": np.full(n, tasks[task]),
               **data}
    hf = {}  # the data table in the order and types of the features (videos aside), as LeRobot builds it
    for name, feature in info["features"].items():
        if feature["dtype"] == "video":
            continue
        values = np.asarray(columns[name]).astype(feature["dtype"])
        hf[name] = (pa.array(values.reshape(-1)) if list(feature["shape"]) == [1]
                    else pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), feature["shape"][0]))
    row = {"episode_index": index, "tasks": [task], "length": n, "data/chunk_index": last["data/chunk_index"],
           "data/file_index": last["data/file_index"] + 1, "dataset_from_index": start, "dataset_to_index": start + n}
    data_file = root / info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
    pq.write_table(pa.table(hf), data_file)
    stats = {}
    for name, feature in info["features"].items():
        if feature["dtype"] == "video":
            chunk, file = last[f"videos/{name}/chunk_index"], last[f"videos/{name}/file_index"] + 1
            path = root / info["video_path"].format(video_key=name, chunk_index=chunk, file_index=file)
            write_mp4(path, images[name], fps=info["fps"])
            row.update({f"videos/{name}/chunk_index": chunk, f"videos/{name}/file_index": file,
                        f"videos/{name}/from_timestamp": 0.0, f"videos/{name}/to_timestamp": n / info["fps"]})
            plain = _plain_stats(images[name].reshape(-1, 3) / 255.0, n)
            stats[name] = {k: v if k == "count" else [[[x]] for x in v] for k, v in plain.items()}
        else:
            stats[name] = _plain_stats(np.asarray(columns[name]), n)
    row.update({f"stats/{name}/{k}": v for name, s in stats.items() for k, v in s.items()})
    row.update({"meta/episodes/chunk_index": last["meta/episodes/chunk_index"],
                "meta/episodes/file_index": last["meta/episodes/file_index"] + 1})
    path = root / f"meta/episodes/chunk-{row['meta/episodes/chunk_index']:03d}/" \
                  f"file-{row['meta/episodes/file_index']:03d}.parquet"
    pq.write_table(pa.Table.from_pydict({k: [v] for k, v in row.items()}), path)
    info.update(total_episodes=index + 1, total_frames=info["total_frames"] + n, total_tasks=len(tasks),
                splits={"train": f"0:{index + 1}"})
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    old = json.loads((root / "meta" / "stats.json").read_text())
    for name, new in stats.items():  # count-weighted, as LeRobot aggregates (only what the reader needs here)
        a, b = old[name], new
        total = a["count"][0] + b["count"][0]
        merged = {"min": np.minimum(a["min"], b["min"]).tolist(), "max": np.maximum(a["max"], b["max"]).tolist(),
                  "count": [total]}
        for k in ("mean", "std", *[q for q in RULES["statistics"] if q.startswith("q")]):
            merged[k] = ((np.asarray(a[k]) * a["count"][0] + np.asarray(b[k]) * b["count"][0]) / total).tolist()
        old[name] = {k: merged[k] for k in RULES["statistics"]}
    (root / "meta" / "stats.json").write_text(json.dumps(old, indent=4))
    return path
