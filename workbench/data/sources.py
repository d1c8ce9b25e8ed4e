"""Clips from a path, whatever it holds: a ``workbench data metaworld`` HDF5 file or a LeRobot directory.

Commands that take ``--data PATH`` (``workbench demo``, evaluation) go through here, so both
kinds serve the same items: ``video`` (3, T, H, W) in [-1, 1], ``action`` (T, A), ``episode``,
``start``, ``task`` (plus ``proprio`` / ``ee_pos`` where recorded):

```text
clips = open_clips("robot_data/", window=16, stride=16, split="val", size=(64, 64))
block = data_block("robot_data/", window=16, stride=4, split="train", size=(64, 64))  # a YAML data: block
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import DataError


def data_kind(path: str | Path) -> str:
    """``"metaworld"`` for ``sample`` or an HDF5 file, ``"lerobot"`` for a LeRobot dataset directory."""
    from workbench.data.lerobot import is_lerobot_dir

    if str(path) == "sample":
        return "metaworld"
    p = Path(path).expanduser()
    if p.is_dir():
        if is_lerobot_dir(p):
            return "lerobot"
        from workbench.data.importer import IMAGE_SUFFIXES, VIDEO_SUFFIXES

        entries = sorted(p.iterdir())
        videos = [q for q in entries if q.suffix.lower() in VIDEO_SUFFIXES] or [
            q for q in entries if q.is_dir() and any(r.suffix.lower() in IMAGE_SUFFIXES for r in q.iterdir())]
        if videos:
            out = p.with_name(f"{p.name}_dataset")
            raise DataError(f"{p} holds videos ({len(videos)}, e.g. {videos[0].name}) "
                            f"but is not a LeRobot dataset (no meta/info.json). "
                            f"Convert it first: `workbench data import {p} --out {out}` "
                            f"(each video with its actions beside it as NAME.npy, .csv or .parquet), "
                            f"then pass --data {out}.")
        raise DataError(f"{p / 'meta' / 'info.json'} is missing: {p} is not a LeRobot dataset. "
                        f"--data takes a LeRobot dataset directory, "
                        f"an .h5 file from `workbench data metaworld`, or 'sample' (a "
                        f"folder of your own videos and actions: convert it with `workbench data import`).")
    if p.is_file():
        return "metaworld"
    raise DataError(f"--data {path}: no such file or directory. Give a LeRobot dataset directory, "
                    f"an .h5 file from `workbench data metaworld`, or 'sample'.")


def data_block(path: str | Path, *, window: int, stride: int, split: str = "train",
               size: tuple[int, int] | None = None, **options: Any) -> dict[str, Any]:
    """The ``data:`` block of an experiment config that reads ``path`` (``options`` go into its config)."""
    if data_kind(path) == "lerobot":
        config = {"root": str(path), "window": window, "stride": stride, "split": split,
                  "size": list(size) if size else None, **options}
        return {"type": "lerobot", "config": config}
    return {"type": "metaworld", "config": {"path": str(path), "window": window, "stride": stride,
                                            "split": split, **options}}


def open_clips(path: str | Path, *, window: int, stride: int, split: str = "val",
               size: tuple[int, int] | None = None, **options: Any) -> Any:
    """The clip dataset of ``path`` (a ``MetaWorldClips`` or a ``LeRobotClips``) with these windows.

    Args:
        path: A LeRobot dataset directory, a Meta-World ``.h5`` file, or ``"sample"`` (the shipped
            Meta-World sample).
        window: Frames per clip.
        stride: Frames between the starts of consecutive clips.
        split: ``"train"``, ``"val"`` or ``"all"``.
        size: ``(H, W)`` to resize LeRobot frames to; an HDF5 file must already hold frames of that size.
        **options: Further fields of the dataset's config (``MetaWorldConfig`` or ``LeRobotConfig``).

    Returns:
        The dataset, a ``MetaWorldClips`` or a ``LeRobotClips``.

    Raises:
        DataError: When ``path`` is neither kind of dataset (the message says what it holds and how to
            convert it), or an HDF5 file's frames are not ``size``.
        ConfigError: When an option is unknown or out of range.
    """
    from workbench.config import build

    block = data_block(path, window=window, stride=stride, split=split, size=size, **options)
    clips = build("dataset", block["type"], block["config"], where="data")
    if block["type"] == "metaworld" and size is not None and tuple(clips.frame_size) != tuple(size):
        raise DataError(f"{clips.path} holds {clips.frame_size[0]}x{clips.frame_size[1]} frames, but "
                        f"{size[0]}x{size[1]} are needed. "
                        f"Regenerate it with `workbench data metaworld --size {size[0]}`.")
    return clips
