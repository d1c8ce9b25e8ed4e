"""Plain files in: a folder of videos with per-episode actions, written as a LeRobot dataset.

``workbench data import SRC --out DIR`` (the wing's ``data`` command) and :func:`import_folder`
read a folder where each episode's files share a name:

```text
my_videos/
    pick_01.mp4           the episode's video: any file FFmpeg reads (.mp4, .mov, .avi, .mkv, .webm)
    pick_01.npy           its actions, one row per frame, (T, A) -- or pick_01.csv / pick_01.parquet
    pick_01.state.npy     optional: its state, (T, S) -- .csv / .parquet too (served as `proprio`)
    pick_01.txt           optional: its task, one line of text (default: the task given, or the
                          folder's name)
    place_02/             an episode stored as pictures: 000.png, 001.png, ... (.png / .jpg, in name
                          order)
    place_02.npy
    session_2/            a sub-folder in the same layout: its episodes are session_2/pick_01, ...
        pick_01.mp4
        pick_01.npy
```

Sub-folders are searched too (hidden ones and LeRobot datasets, such as the import's output, aside): an
episode's files sit together in one folder, and the episode is named by its path from the folder imported.

Row ``t`` of the actions is the action taken at frame ``t`` (its result shows in frame ``t + 1``), so an
episode has as many rows as frames. A ``.csv`` holds numbers, one row per frame, with or without a
header line (its names become the feature's names); a ``.parquet`` holds numeric columns (scalars or
fixed-size lists). Where the tables name their columns, they are matched by name: every episode's
table names the same columns, in any order. Everything is checked before a frame is decoded -- every
file found and matched, every table's values finite and not absurdly large, rows equal to frames, the
same columns, frame rates and picture sizes everywhere (or ``fps`` / ``size`` given to resample and
resize them), every episode at least ``window`` frames long -- and each problem is an error naming the
file and the fix. The dataset is written by :class:`~workbench.data.lerobot_write.LeRobotWriter` (v3.0):
``action``, ``observation.state`` (when given), the video as ``observation.images.<camera>``; read it
back with the ``lerobot`` dataset (``data: {type: lerobot, config: {root: DIR}}``) or any ``--data DIR``.

:func:`write_example_folder` writes such a folder (a square moved by 2-D actions) to try it on.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from workbench.data.checks import MAX_ABS, check_finite
from workbench.errors import DataError

#: Video files the importer reads (anything FFmpeg decodes; these are the names it looks for).
VIDEO_SUFFIXES = (".mp4", ".mov", ".avi", ".mkv", ".webm", ".m4v")
#: Pictures of an episode stored as a folder of frames.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Tables of per-frame values, in the order they are looked for.
TABLE_SUFFIXES = (".npy", ".csv", ".parquet")
LAYOUT = ("each episode is a video (NAME.mp4, or a folder NAME/ of .png / .jpg frames) with its actions "
          "beside it as NAME.npy, NAME.csv or NAME.parquet (one row per frame), optionally NAME.state.npy "
          "(or .csv / .parquet) and a task in NAME.txt")


def natural_key(name: str) -> list:
    """Sort key that puts ``frame_2`` before ``frame_10``."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name)]


# -- per-frame tables ----------------------------------------------------------------------------------------
def read_table(path: Path, what: str, max_abs: float = MAX_ABS) -> tuple[np.ndarray, list[str] | None]:
    """A per-frame table as float32 ``(T, D)`` and its column names (``None`` when the file has none); a value
    that is NaN, infinite or beyond ``max_abs`` is refused, naming the frame and column."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            values, names = np.load(path, allow_pickle=False), None
        elif suffix == ".csv":
            values, names = _read_csv(path)
        elif suffix == ".parquet":
            values, names = _read_parquet(path)
        else:
            raise DataError(f"{path}: {what} must be a .npy, .csv or .parquet file, "
                            f"got {suffix or 'no suffix'}.")
    except DataError:
        raise
    except Exception as err:
        # numpy's ValueError / OSError, pyarrow's ArrowInvalid: a file that does not parse
        raise DataError(f"{path}: cannot read the {what} ({type(err).__name__}: {err}). "
                        f"Save them as a 2-D array of numbers, one row per frame "
                        f"(np.save(path, array) or a .csv of numbers).") from None
    values = np.asarray(values)
    if values.dtype.kind not in "biuf":
        raise DataError(f"{path}: the {what} are {values.dtype} values, not numbers. "
                        f"Save them as a 2-D array of numbers, one row per frame.")
    if values.ndim == 1:
        values = values[:, None]
    if values.ndim != 2:
        raise DataError(f"{path}: the {what} have shape {list(values.shape)}; "
                        f"expected (frames, width): one row per frame. Reshape them to 2-D before saving.")
    if len(values) == 0:
        raise DataError(f"{path}: the {what} table is empty (0 rows); an episode needs one row per frame.")
    check_finite(values, str(path), what, limit=max_abs,
                 fix="Fix or drop that frame (or the episode) in the source file, then run this again "
                     "(a real measurement that large needs a larger --max-abs).")
    return values.astype(np.float32), names


def _read_csv(path: Path) -> tuple[np.ndarray, list[str] | None]:
    with open(path, newline="") as f:
        rows = [row for row in csv.reader(f) if row and any(cell.strip() for cell in row)]
    if not rows:
        return np.zeros((0, 0), np.float32), None
    names = None
    try:
        float(rows[0][0])
    except ValueError:
        names, rows = [cell.strip() for cell in rows[0]], rows[1:]
    width = len(names) if names else len(rows[0]) if rows else 0
    out = np.empty((len(rows), width), np.float64)
    for r, row in enumerate(rows):
        if len(row) != width:
            line = r + 1 + (names is not None)
            raise DataError(f"{path}: line {line} has {len(row)} values, the table {width}. "
                            f"Every line holds one frame's values, the same number on each line.")
        for c, cell in enumerate(row):
            try:
                out[r, c] = float(cell)
            except ValueError:
                line = r + 1 + (names is not None)
                raise DataError(f"{path}: line {line}, column {c} is {cell!r}, not a number. "
                                f"A .csv of actions holds numbers only "
                                f"(an optional first line of names aside).") from None
    return out, names


def _read_parquet(path: Path) -> tuple[np.ndarray, list[str] | None]:
    import pyarrow.parquet as pq

    from workbench.data.lerobot_format import column

    table = pq.read_table(path)
    parts, names = [], []
    for name in table.column_names:
        values = column(table, name, path)
        if values.dtype.kind not in "biuf":
            continue  # a text or timestamp column (e.g. a task name) is not a per-frame number
        values = values.reshape(len(values), -1)
        parts.append(values.astype(np.float64))
        names += [name] if values.shape[1] == 1 else [f"{name}_{i}" for i in range(values.shape[1])]
    if not parts:
        raise DataError(f"{path}: no numeric column (columns: {table.column_names}). "
                        f"Store one row per frame with the values as numeric columns.")
    return np.concatenate(parts, axis=1), names


# -- finding the episodes ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Source:
    """One episode's files and what probing them found (nothing decoded yet)."""

    name: str
    video: Path
    actions: Path
    state: Path | None = None
    task: str = ""
    fps: float | None = None  # the video's own rate (None: a folder of frames)
    frames: int = 0  # pictures in the video or folder
    size: tuple[int, int] = (0, 0)  # (H, W) as stored
    action_values: np.ndarray | None = None
    state_values: np.ndarray | None = None
    action_names: list[str] | None = None
    state_names: list[str] | None = None


def _table_for(folder: Path, stem: str) -> list[Path]:
    return [folder / f"{stem}{s}" for s in TABLE_SUFFIXES if (folder / f"{stem}{s}").is_file()]


def _is_frames(path: Path) -> bool:
    return path.is_dir() and any(q.suffix.lower() in IMAGE_SUFFIXES for q in path.iterdir())


def _folders(root: Path, skip: set[Path]) -> list[Path]:
    """``root`` and every folder below it that may hold episodes: not a folder of frames (an episode itself),
    not hidden, not a LeRobot dataset (an earlier import's output), not one of ``skip`` (this one's)."""
    out, pending = [], [root]
    while pending:
        folder = pending.pop(0)
        out.append(folder)
        pending += [p for p in sorted(folder.iterdir(), key=lambda p: natural_key(p.name))
                    if p.is_dir() and not p.name.startswith(".") and p.resolve() not in skip
                    and not (p / "meta" / "info.json").is_file() and not _is_frames(p)]
    return out


def find_sources(folder: str | Path, task: str | None = None, skip: tuple[Path, ...] = ()) -> list[Source]:
    """The episodes of ``folder`` and of every folder below it, each a video (or frames folder) matched with
    its tables by name in its own folder. An episode is named by its path from ``folder`` without the suffix
    (``session_2/pick_01``). Hidden folders, LeRobot datasets and the folders ``skip`` are left out."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: no such folder. `workbench data import` reads a folder where {LAYOUT}.")
    skipped = {Path(p).expanduser().resolve() for p in skip}
    sources, missing, orphans, seen = [], [], [], []

    def relative(path: Path) -> str:
        return path.relative_to(root).as_posix()

    for where in _folders(root, skipped):
        entries = sorted(where.iterdir(), key=lambda p: natural_key(p.name))
        seen += entries
        episodes = [p for p in entries if (p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
                    or (p.is_dir() and not p.name.startswith(".") and _is_frames(p))]
        stems = [p.stem if p.is_file() else p.name for p in episodes]
        duplicate = sorted({n for n in stems if stems.count(n) > 1})
        if duplicate:
            name = relative(where / duplicate[0])
            raise DataError(f"{root}: two videos are called {name!r} "
                            f"(e.g. {name}.mp4 and a folder or another format). "
                            f"Each episode's files share one name; rename one of them.")
        found = []
        for video, stem in zip(episodes, stems):
            name = relative(where / stem)
            tables, states = _table_for(where, stem), _table_for(where, f"{stem}.state")
            if not tables:
                missing.append(name)
                continue
            if len(tables) > 1 or len(states) > 1:
                both = tables if len(tables) > 1 else states
                raise DataError(f"{root}: episode {name!r} has {len(both)} tables of the same values: "
                                f"{', '.join(relative(p) for p in both)}. Keep one of them.")
            text = where / f"{stem}.txt"
            episode_task = (text.read_text().strip() if text.is_file()
                            else (task if task is not None else root.name))
            found.append(Source(name, video, tables[0], states[0] if states else None, episode_task))
        matched = {s.actions for s in found} | {s.state for s in found if s.state}
        orphans += [relative(p) for p in entries if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES
                    and p not in matched and p.name.split(".")[0] not in stems]
        sources += found
    if not sources and not missing:
        found = ", ".join(sorted({p.suffix or p.name for p in seen})[:8]) or "nothing"
        raise DataError(f"{root}: no videos found in it or its sub-folders (it holds {found}). "
                        f"Expected {LAYOUT}.")
    if missing:
        first = missing[0]
        examples = ", ".join(f"{n}.npy" for n in missing[:3])
        raise DataError(f"{root}: {len(missing)} of {len(missing) + len(sources)} videos "
                        f"have no actions beside them (first: {first!r}; "
                        f"looked for {first}.npy, {first}.csv, {first}.parquet). "
                        f"Add them ({examples}), or move those videos out of the folder.")
    if orphans:
        stem = orphans[0].split(".")[0]
        raise DataError(f"{root}: {orphans[0]} has no video of the same name "
                        f"({len(orphans)} table(s) without one). Each table goes with a video called like it "
                        f"({stem}.mp4 or a folder of frames, in the same folder); "
                        f"add it, rename the table, or move it out of the folder.")
    return sorted(sources, key=lambda s: natural_key(s.name))


def probe_video(source: Source) -> None:
    """Fill in the frame rate, picture size and picture count of ``source`` without decoding pictures."""
    if source.video.is_dir():
        from PIL import Image

        pictures = sorted((p for p in source.video.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES),
                          key=lambda p: natural_key(p.name))
        try:
            with Image.open(pictures[0]) as first:
                source.size = (first.height, first.width)
        except Exception as err:  # PIL's UnidentifiedImageError, OSError: a damaged picture
            raise DataError(f"{pictures[0]}: not a readable picture ({type(err).__name__}: {err}). "
                            f"Replace or remove it.") from None
        source.frames, source.fps = len(pictures), None
        return
    import av

    try:
        with av.open(str(source.video)) as container:
            if not container.streams.video:
                raise DataError(f"{source.video}: holds no video stream. "
                                f"Give each episode a video file, or a folder of its frames.")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            source.fps = float(rate) if rate else None
            source.size = (int(stream.codec_context.height), int(stream.codec_context.width))
            listed = int(stream.frames or 0)  # what the container's index promises (0: it does not say)
            # one picture a packet
            source.frames = sum(1 for packet in container.demux(stream) if packet.size)
    except DataError:
        raise
    except Exception as err:  # PyAV's FFmpeg errors: a file that is not a readable video
        raise DataError(f"{source.video}: not a readable video ({type(err).__name__}: {err}). "
                        f"Re-export it, or store the episode as a folder of .png frames.") from None
    if listed > source.frames:
        # a file whose index sits at its start (MP4 "faststart") still opens when its end is cut off; the
        # frames it lists beyond the end are missing, and the last one there may be incomplete
        raise DataError(f"{source.video}: the video is cut short: its index lists {listed} frames but the "
                        f"file holds {source.frames} (a copy or a recording that stopped early). "
                        f"Copy or export the video again from its source; or move {source.video.name} and "
                        f"{source.actions.name} out of the folder to import the other episodes without it.")
    if not source.fps or not np.isfinite(source.fps) or source.fps <= 0:
        raise DataError(f"{source.video}: the video records no frame rate. "
                        f"Pass --fps (the rate it was recorded at).")


# -- the plan: every check before any picture is decoded -----------------------------------------------------
@dataclasses.dataclass
class Plan:
    """What :func:`import_folder` will write: the episodes, the rate, the size and the widths, all checked."""

    sources: list[Source]
    fps: float
    size: tuple[int, int]
    action_dim: int
    state_dim: int | None
    lengths: list[int]  # frames of each episode at ``fps``
    notes: list[str]
    #: The column names every episode's table gave (each table reordered to them), or None where the tables
    #: name no columns (.npy, a .csv without a header line) and columns go by position.
    action_names: list[str] | None = None
    state_names: list[str] | None = None


def _shown(names: list[str]) -> str:
    return "[" + ", ".join(names) + "]"


def match_columns(sources: list[Source], what: str) -> list[str] | None:
    """Put every episode's ``what`` table (``"actions"`` or ``"state"``) in one column order and return the
    column names, or None when no table names its columns (then columns go by position).

    Tables that name their columns (a .csv header line, a .parquet's columns) are matched by name: a table
    whose columns come in another order is reordered to the first episode's; renamed, missing, extra or
    repeated names are refused, and so is a table without names among named ones (its order cannot be
    checked). Tables without names must have the same width."""
    key = "action" if what == "actions" else "state"
    tables = [(getattr(s, "actions" if key == "action" else "state"), getattr(s, f"{key}_values"),
               getattr(s, f"{key}_names"), s) for s in sources if getattr(s, f"{key}_values") is not None]
    if not tables:
        return None
    for path, _, names, _ in tables:
        repeated = sorted({n for n in names or [] if names.count(n) > 1})
        if repeated:
            raise DataError(f"{path}: the {what} name the column {repeated[0]!r} twice "
                            f"(columns {_shown(names)}). Columns are matched by name across episodes, "
                            f"so each name appears once: rename one of them.")
    named = [t for t in tables if t[2] is not None]
    if not named:
        first_path, first_values = tables[0][0], tables[0][1]
        for path, values, _, _ in tables:
            if values.shape[1] != first_values.shape[1]:
                raise DataError(f"{path}: the {what} have {values.shape[1]} values a frame, but "
                                f"{first_path.name} has {first_values.shape[1]}. "
                                f"Every episode's {what} have the same width (the adapter's dim); "
                                f"fix that file.")
        return None
    ref_path, _, ref_names, _ = named[0]
    if len(named) < len(tables):
        path = next(t[0] for t in tables if t[2] is None)
        raise DataError(
            f"{path}: the {what} name no columns (a .npy file, or a .csv without a header line), but "
            f"{ref_path.name} names them {_shown(ref_names)}. Columns are matched by name across episodes, "
            f"so a table without names cannot be checked against the others: save it with the same names "
            f"(a .csv whose first line is {','.join(ref_names)}, or a .parquet), "
            f"or save every episode's {what} without names.")
    for path, values, names, source in tables:
        if names == ref_names:
            continue
        missing = [n for n in ref_names if n not in names]
        extra = [n for n in names if n not in ref_names]
        if missing or extra:
            raise DataError(
                f"{path}: the {what} columns are {_shown(names)}, but {ref_path.name}'s are "
                f"{_shown(ref_names)} (missing here: {_shown(missing)}; "
                f"not in {ref_path.name}: {_shown(extra)}). "
                f"Every episode's {what} name the same columns (in any order: they are matched by name). "
                f"Rename or drop the columns of one of the two files so that both name the same ones.")
        setattr(source, f"{key}_values", values[:, [names.index(n) for n in ref_names]])
        setattr(source, f"{key}_names", list(ref_names))
    return list(ref_names)


def _served(source: Source, fps: float) -> np.ndarray:
    """Indices into the recorded frames of the frames served at ``fps`` (nearest in time)."""
    if source.fps is None or abs(source.fps - fps) < 1e-6:
        return np.arange(source.frames)
    count = int(np.floor((source.frames - 1) / source.fps * fps + 1e-6)) + 1
    return np.minimum(np.round(np.arange(count) * source.fps / fps).astype(np.int64), source.frames - 1)


def plan_import(folder: str | Path, *, fps: float | None = None, size: tuple[int, int] | None = None,
                window: int = 2, trim: bool = False, task: str | None = None,
                max_abs: float = MAX_ABS, skip: tuple[Path, ...] = ()) -> Plan:
    """Find, read and check everything :func:`import_folder` needs;
    raise the first problem, naming the file. ``skip``: folders under ``folder`` left out."""
    if fps is not None and not (np.isfinite(fps) and fps > 0):
        raise DataError(f"--fps must be a positive number of frames per second, got {fps}.")
    if size is not None and (len(size) != 2 or any(int(s) < 8 or int(s) % 2 for s in size)):
        raise DataError(f"--size must be an even height and width of at least 8 pixels "
                        f"(H.264 stores even sizes), got {list(size)}; e.g. --size 64 64.")
    if window < 2:
        raise DataError(f"--window must be >= 2 (a clip needs a frame and its successor), got {window}.")
    sources = find_sources(folder, task, skip)
    notes: list[str] = []
    for s in sources:
        s.action_values, s.action_names = read_table(s.actions, "actions", max_abs)
        if s.state is not None:
            s.state_values, s.state_names = read_table(s.state, "state", max_abs)
    with_state = [s for s in sources if s.state is not None]
    if with_state and len(with_state) != len(sources):
        lacking = next(s for s in sources if s.state is None)
        raise DataError(f"{lacking.actions.parent}: {len(with_state)} of {len(sources)} episodes "
                        f"have a state table but {lacking.name!r} has none "
                        f"(looked for {lacking.name}.state.npy / .csv / .parquet). "
                        f"Give every episode one, or none.")
    action_names = match_columns(sources, "actions")
    state_names = match_columns(sources, "state") if with_state else None
    for s in sources:
        probe_video(s)
    rates = sorted({round(s.fps, 3) for s in sources if s.fps is not None})
    if fps is None:
        if not rates:
            raise DataError(f"{sources[0].video}: an episode stored as frames has no frame rate. "
                            f"Pass --fps (the rate its frames were recorded at).")
        if len(rates) > 1:
            odd = next(s for s in sources if s.fps is not None and round(s.fps, 3) != rates[0])
            raise DataError(f"{odd.video} runs at {odd.fps:g} fps, but other videos run at {rates[0]:g} fps. "
                            f"Pass --fps F: every episode is resampled to F frames per second "
                            f"(nearest frame, with its action and state).")
        if any(s.fps is None for s in sources):
            frames_only = next(s for s in sources if s.fps is None)
            raise DataError(f"{frames_only.video}: an episode stored as frames has no frame rate. "
                            f"Pass --fps (the rate its frames were recorded at).")
        fps = rates[0]
    else:
        for s in sources:
            if s.fps is None:
                s.fps = float(fps)  # frames folders are taken as recorded at --fps
        resampled = [s for s in sources if abs(s.fps - fps) > 1e-6]
        if resampled:
            notes.append(f"{len(resampled)} episode(s) resampled from {resampled[0].fps:g} to {fps:g} fps "
                         f"(nearest frame, with its action and state)")
    sizes = sorted({s.size for s in sources})
    if size is None:
        if len(sizes) > 1:
            odd = next(s for s in sources if s.size != sources[0].size)
            raise DataError(f"{odd.video} is {odd.size[1]}x{odd.size[0]} pixels, "
                            f"but {sources[0].video.name} is {sources[0].size[1]}x{sources[0].size[0]}. "
                            f"Pass --size H W: every episode is resized to it "
                            f"(e.g. --size 64 64 for the embedded tiny_video).")
        size = sources[0].size
        if size[0] % 2 or size[1] % 2:
            raise DataError(f"{sources[0].video} is {size[1]}x{size[0]} pixels, "
                            f"an odd size H.264 cannot store. "
                            f"Pass --size H W with even numbers (e.g. --size {size[0] + size[0] % 2} "
                            f"{size[1] + size[1] % 2}).")
    size = (int(size[0]), int(size[1]))
    lengths = []
    for s in sources:
        rows = {"actions": len(s.action_values)}
        if s.state_values is not None:
            rows["state"] = len(s.state_values)
        differ = {k: n for k, n in rows.items() if n != s.frames}
        if differ:
            if not trim:
                what, n = next(iter(differ.items()))
                path = s.actions if what == "actions" else s.state
                raise DataError(
                    f"{path}: {n} rows of {what}, but {s.video.name} has {s.frames} frames. "
                    f"Row t holds the {what} at frame t, so an episode has one row per frame. "
                    f"Fix the file (e.g. repeat the last row for a final frame), "
                    f"or pass --trim to cut every episode to the shorter of its frames and its rows.")
            shortest = min(s.frames, *rows.values())
            notes.append(f"{s.name}: cut to {shortest} frames (--trim)")
            s.frames = shortest
            s.action_values = s.action_values[:shortest]
            if s.state_values is not None:
                s.state_values = s.state_values[:shortest]
        lengths.append(len(_served(s, fps)))
    short = [(s, n) for s, n in zip(sources, lengths) if n < window]
    if short:
        s, n = short[0]
        raise DataError(f"{s.video}: {n} frames at {fps:g} fps, fewer than --window {window} "
                        f"({len(short)} of {len(sources)} episodes are). "
                        f"A training clip spans --window frames (tiny_video: 16); "
                        f"use --window {min(lengths)} or less (the shortest episode), "
                        f"record longer episodes, or move the short ones out of the folder.")
    state_dim = sources[0].state_values.shape[1] if sources[0].state_values is not None else None
    return Plan(sources, float(fps), size, int(sources[0].action_values.shape[1]), state_dim, lengths, notes,
                action_names, state_names)


# -- decoding and writing ------------------------------------------------------------------------------------
def decode(source: Source, size: tuple[int, int], indices: np.ndarray) -> np.ndarray:
    """The pictures ``indices`` of ``source`` as uint8 ``(len(indices), H, W, 3)`` at ``size``
    (area averaging)."""
    height, width = size
    if source.video.is_dir():
        from PIL import Image

        pictures = sorted((p for p in source.video.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES),
                          key=lambda p: natural_key(p.name))
        out = []
        for i in indices:
            try:
                with Image.open(pictures[int(i)]) as image:
                    image = image.convert("RGB")
                    if image.size != (width, height):
                        image = image.resize((width, height), Image.Resampling.BOX)
                    out.append(np.asarray(image, dtype=np.uint8))
            except Exception as err:  # a damaged picture
                raise DataError(f"{pictures[int(i)]}: not a readable picture ({type(err).__name__}: {err}). "
                                f"Replace or remove it.") from None
        return np.stack(out)
    import av

    wanted = set(int(i) for i in indices)
    found: dict[int, np.ndarray] = {}
    try:
        with av.open(str(source.video)) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            for k, frame in enumerate(container.decode(stream)):
                if k in wanted:
                    found[k] = frame.to_ndarray(format="rgb24", height=height, width=width,
                                                interpolation="AREA")
                if k >= max(wanted):
                    break
    except Exception as err:  # PyAV's FFmpeg errors: damaged data
        raise DataError(f"{source.video}: decoding failed ({type(err).__name__}: {err}). "
                        f"The video is damaged; re-export it.") from None
    if len(found) < len(wanted):
        raise DataError(f"{source.video}: {len(found)} of {source.frames} frames decoded "
                        f"(it ends early or is damaged). Re-export the video.")
    return np.stack([found[int(i)] for i in indices])


@dataclasses.dataclass
class ImportReport:
    """What :func:`import_folder` wrote."""

    root: Path
    episodes: int
    frames: int
    fps: float
    size: tuple[int, int]
    action_dim: int
    state_dim: int | None
    camera: str
    shortest: int
    notes: list[str]

    def summary(self) -> str:
        state = f", state ({self.state_dim}) as observation.state" if self.state_dim else ""
        lines = [f"wrote {self.root}: {self.episodes} episodes, {self.frames} frames at {self.fps:g} fps, "
                 f"{self.size[1]}x{self.size[0]} pixels as {self.camera}, action ({self.action_dim}){state}; "
                 f"the shortest episode has {self.shortest} frames"]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def import_folder(folder: str | Path, out: str | Path, *, fps: float | None = None,
                  size: tuple[int, int] | None = None, window: int | None = None, trim: bool = False,
                  task: str | None = None, camera: str = "main", crf: int = 18, progress: bool = False,
                  max_abs: float = MAX_ABS, on_episode: Callable[[int], None] | None = None) -> ImportReport:
    """Write the episodes of ``folder`` (see the module's layout) as a LeRobot v3.0 dataset in ``out``.

    ``fps``: resample every episode to this rate (default: the videos' own, which must agree);
    ``size``: ``(H, W)`` to resize to (default: as recorded, which must agree); ``window``: the clip
    length you will train on, so the shortest episode allowed, in frames at ``fps`` (recorded in
    ``meta/workbench.json``, where ``workbench init --data`` reads it; None: any of 2 frames or more);
    ``trim``: cut each episode to the shorter of its
    frames and rows instead of refusing; ``task``: the task string of episodes without a ``NAME.txt``
    (default: the folder's name); ``camera``: the video feature is ``observation.images.<camera>``;
    ``max_abs``: an action or state value beyond this magnitude is refused (as NaN and infinities are).
    Every check runs before a picture is decoded (:func:`plan_import`); ``out`` appears only once
    the dataset is complete (see :class:`~workbench.data.lerobot_write.LeRobotWriter`).

    Examples:
        A folder of two short clips of a moving square (:func:`write_example_folder`), imported:

        >>> folder = write_example_folder("my_videos", episodes=2, frames=8)
        >>> report = import_folder(folder, "my_dataset", window=8)
        >>> print(report.summary())
        wrote my_dataset: 2 episodes, 16 frames at 10 fps, 32x32 pixels as observation.images.main,
        action (2); the shortest episode has 8 frames
    """
    from workbench.data.lerobot_write import LeRobotWriter

    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} exists and is not empty: the import writes a new dataset directory. "
                        f"Choose another output, or delete {out} first (nothing was written).")
    plan = plan_import(folder, fps=fps, size=size, window=window or 2, trim=trim, task=task, max_abs=max_abs,
                       skip=(out, out.with_name(out.name + ".partial")))
    feature = f"observation.images.{camera}"
    features: dict[str, tuple[str, list[str] | None]] = {
        "action": ("float32", plan.action_names or [f"a{i}" for i in range(plan.action_dim)])}
    notes = {"action": {"names_from": _names_from(plan.action_names, "a")}}
    if plan.state_dim is not None:
        state_names = plan.state_names or [f"s{i}" for i in range(plan.state_dim)]
        features["observation.state"] = ("float32", state_names)
        notes["observation.state"] = {"names_from": _names_from(plan.state_names, "s")}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(plan.sources), desc="import", unit="episode")
    metadata = {"imported_from": str(Path(folder).expanduser()), **({"window": window} if window else {})}
    with LeRobotWriter(out, plan.fps, features, [feature], crf=crf, feature_notes=notes,
                       metadata=metadata) as writer:
        for k, s in enumerate(plan.sources):
            indices = _served(s, plan.fps)
            frames = decode(s, plan.size, indices)
            data = {"action": s.action_values[indices]}
            if s.state_values is not None:
                data["observation.state"] = s.state_values[indices]
            writer.add_episode({feature: frames}, data, s.task, source=s.name)
            if bar is not None:
                bar.update(1)
            if on_episode is not None:
                on_episode(k)
    if bar is not None:
        bar.close()
    return ImportReport(out, len(plan.sources), int(sum(plan.lengths)), plan.fps, plan.size, plan.action_dim,
                        plan.state_dim, feature, min(plan.lengths), plan.notes)


def _names_from(names: list[str] | None, prefix: str) -> str:
    """What ``meta/info.json`` says about where a feature's names came from."""
    if names is None:
        return (f"position: the source tables (.npy, or .csv without a header line) name no columns, "
                f"so {prefix}0, {prefix}1, ... are their columns in stored order")
    return "column names: every episode's table named these columns (matched by name, in any order)"


# -- a folder to try it on -----------------------------------------------------------------------------------
def write_example_folder(out: str | Path, *, episodes: int = 12, frames: int = 24, size: int = 32,
                         fps: int = 10, seed: int = 0) -> Path:
    """A folder in the layout :func:`import_folder` reads: ``episodes`` MP4 clips of a bright square that
    2-D actions move (``dx, dy`` in [-1, 1], up to 2 pixels a frame, its result in the next frame), each
    with its actions as ``.npy``. Deterministic given ``seed``."""
    from workbench.data.video_io import H264Writer

    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} exists and is not empty; the example is written into a new folder. "
                        f"Choose another one (nothing was written).")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    square = max(2, size // 6)
    span = size - square
    for e in range(episodes):
        actions = np.clip(rng.normal(0.0, 0.6, size=(frames, 2)), -1, 1).astype(np.float32)
        pos = rng.uniform(0, span, size=2)
        video = np.full((frames, size, size, 3), 24, np.uint8)
        for t in range(frames):
            x, y = (int(round(v)) for v in pos)
            video[t, y:y + square, x:x + square] = (240, 200, 60)
            pos = np.clip(pos + actions[t] * 2.0, 0, span)
        name = f"episode_{e:03d}"
        writer = H264Writer(out / f"{name}.mp4", fps, size, size, crf=12)
        writer.write(video)
        writer.close()
        np.save(out / f"{name}.npy", actions)
    return out


__all__ = ["ImportReport", "Plan", "find_sources", "import_folder", "plan_import", "read_table",
           "write_example_folder"]
