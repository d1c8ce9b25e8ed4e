"""Checkpoints that survive anything.

A checkpoint is a directory ``step-000123/`` holding:

* ``trainable.safetensors`` — adapter and composer weights and buffers (never the base);
* ``state.pt`` — optimizer state, RNG states and data position: tensors and plain data only, read with
  ``weights_only=True`` (a file holding anything else is refused, never unpickled);
* ``config.yaml`` — the fully resolved experiment config;
* ``meta.json`` — step, metrics, loss history, versions.

Writes are atomic: everything goes to a hidden temporary directory, each file is flushed to
disk, then the directory is renamed into place and ``LATEST`` is replaced atomically. A process
killed mid-save leaves the previous checkpoint untouched and loadable.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from workbench.errors import CheckpointError

PREFIX = "step-"
FILES = ("trainable.safetensors", "state.pt", "config.yaml", "meta.json")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``run_dir``, oldest first (temporary directories are ignored)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    run_dir = Path(run_dir)
    pointer = run_dir / "LATEST"
    if pointer.exists():
        candidate = run_dir / pointer.read_text().strip()
        if (candidate / "meta.json").exists():
            return candidate
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: str | Path, step: int, *, trainable: dict[str, torch.Tensor], state: dict[str, Any],
                    config_yaml: str, meta: dict[str, Any], keep_last: int | None = None) -> Path:
    """Write one checkpoint atomically; rotate to the newest ``keep_last``. Returns its path."""
    from safetensors.torch import save as save_safetensors

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in run_dir.glob(".tmp-*"):  # left by a process killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = run_dir / checkpoint_name(step)
    tmp = run_dir / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in trainable.items()}
        _write_bytes(tmp / "trainable.safetensors", save_safetensors(tensors))
        buffer = io.BytesIO()
        torch.save(state, buffer)
        _write_bytes(tmp / "state.pt", buffer.getvalue())
        _write_bytes(tmp / "config.yaml", config_yaml.encode())
        full_meta = {**meta, "step": step, "versions": versions(), "saved_at": time.time()}
        _write_bytes(tmp / "meta.json", json.dumps(full_meta, indent=1).encode())
        _fsync_dir(tmp)
        if final.exists():
            trash = run_dir / f".tmp-old-{final.name}-{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        pointer = run_dir / f".tmp-LATEST-{os.getpid()}"
        _write_bytes(pointer, final.name.encode())
        os.replace(pointer, run_dir / "LATEST")
        _fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint directory (or a run directory: its latest checkpoint)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"No checkpoint at {path}. Pass a run directory (with step-* checkpoints) "
                              f"or one checkpoint directory.")
    if not (path / "meta.json").exists():
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"{path} holds no complete checkpoint (expected step-*/ directories with "
                                  f"{', '.join(FILES)}). Train with checkpoint_every set, or call exp.save(dir).")
        path = latest
    missing = [f for f in FILES if not (path / f).exists()]
    if missing:
        raise CheckpointError(f"Checkpoint {path} is incomplete: missing {', '.join(missing)}. Use an earlier "
                              f"checkpoint of the same run.")
    try:
        meta = json.loads((path / "meta.json").read_text())
        trainable = load_file(str(path / "trainable.safetensors"))
        state = _load_state(path / "state.pt")
        config_yaml = (path / "config.yaml").read_text()
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"Checkpoint {path} is unreadable ({type(err).__name__}: {err}). It is corrupt; "
                              f"use an earlier checkpoint of the same run.") from err
    return {"path": path, "meta": meta, "trainable": trainable, "state": state, "config_yaml": config_yaml}


STATE_KEYS = ("optimizer", "rng_cpu", "step")


def _load_state(file: Path) -> dict[str, Any]:
    """``state.pt``, read as tensors and plain data only; anything else is refused, never unpickled."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        found = _pickled_globals(file)
        what = f"references to {', '.join(found)}" if found else "Python objects other than tensors and plain data"
        raise CheckpointError(
            f"Checkpoint {file.parent}: state.pt holds {what}. workbench writes only tensors and plain data "
            f"(numbers, strings, lists, dicts) there, so this file was tampered with or not written by workbench, "
            f"and it will not be unpickled (unpickling can run code from the file). Use another checkpoint of "
            f"this run, or one saved by AdapterExperiment.save / training.checkpoint_every."
        ) from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        got = f"a dict with keys {sorted(map(str, state))[:8]}" if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"Checkpoint {file.parent}: state.pt holds {got}, not the training state workbench writes (missing "
            f"{', '.join(missing)}). It was not written by workbench; use a checkpoint saved by "
            f"AdapterExperiment.save / training.checkpoint_every."
        )
    return state


def _pickled_globals(file: Path) -> list[str]:
    """The Python names a torch-saved pickle refers to, beyond torch's own and OrderedDict (read, not run)."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(file) as archive:
            data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    except (zipfile.BadZipFile, StopIteration, OSError):
        data = file.read_bytes()
    names, strings = [], []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
            if isinstance(arg, str):
                strings.append(arg)
    except Exception:  # a truncated or garbled pickle: report what was read before the damage
        pass
    return [n for n in dict.fromkeys(names) if not n.startswith("torch.") and n != "collections.OrderedDict"]


def versions() -> dict[str, str]:
    import numpy

    from workbench._version import __version__

    return {"workbench": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}
