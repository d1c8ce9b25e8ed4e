"""Checkpoints that survive anything, and that say when they did not.

A checkpoint is a directory ``step-0000123/`` holding:

* ``trainable.safetensors`` — adapter and composer weights and buffers (never the base);
* ``state.pt`` — optimizer state, RNG states and data position: tensors and plain data only, read with
  ``weights_only=True`` (a file holding anything else is refused, never unpickled);
* ``config.yaml`` — the fully resolved experiment config;
* ``meta.json`` — step, metrics, loss history, the config changes made on resumes, versions, and the
  digest of the base the run was trained on (:mod:`workbench.train.provenance`);
* ``manifest.json`` — the size and SHA-256 digest of each of the four files above (see
  :mod:`workbench.integrity`).

Writes are atomic: everything goes to a hidden temporary directory, each file is flushed to
disk, then the directory is renamed into place and ``LATEST`` is replaced atomically. A process
killed mid-save leaves the previous checkpoint untouched and loadable. One process writes a run at a
time: it holds the run directory's lock (:mod:`workbench.train.runlock`) while it writes.

Reads are verified: every file is checked against the manifest before a value is used, and the
weights and optimizer state must be finite. A damaged checkpoint is refused with the file, what
was expected, and the newest checkpoint of the run that verifies. A checkpoint without digests
(no ``manifest.json``, no integrity record) loads, with a note that it could not be verified.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import platform
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.errors import CheckpointError
from workbench.integrity import (
    ManifestDamaged,
    entry_of,
    fsync_dir,
    manifest_bytes,
    mismatch,
    parse_manifest,
    write_atomic,
    write_bytes,
)
from workbench.train.runlock import hold_run, try_hold_run

PREFIX = "step-"
FILES = ("trainable.safetensors", "state.pt", "config.yaml", "meta.json")
MANIFEST = "manifest.json"
#: Where checkpoints past the one a run was resumed ``--from`` are moved (kept, never deleted).
SUPERSEDED = "superseded"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``run_dir``, oldest first (temporary directories are ignored)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint ``LATEST`` names, or a newer complete one: a save renames its checkpoint into place,
    then points ``LATEST`` at it, and a process killed between the two leaves a complete checkpoint that
    ``LATEST`` does not name yet (a resume from an earlier one sets the newer ones aside,
    :func:`set_aside_after`, so none is newer otherwise). Without a usable ``LATEST``, the newest complete
    one."""
    run_dir = Path(run_dir)
    found = list_checkpoints(run_dir)
    pointer = run_dir / "LATEST"
    if pointer.exists():
        try:
            candidate = run_dir / pointer.read_text().strip()
        except (OSError, UnicodeDecodeError, ValueError):
            candidate = None
        if candidate is not None and candidate.name.startswith(PREFIX) and (candidate / "meta.json").exists():
            newer = [p for p in found if p.name > candidate.name]
            return newer[-1] if newer else candidate
    return found[-1] if found else None


def step_of(path: Path) -> int | None:
    """The step in a checkpoint directory's name (``step-0000020`` → 20)."""
    match = re.fullmatch(rf"{PREFIX}(\d+)", path.name)
    return int(match.group(1)) if match else None


def save_checkpoint(run_dir: str | Path, step: int, *, trainable: dict[str, torch.Tensor],
                    state: dict[str, Any],
                    config_yaml: str, meta: dict[str, Any], keep_last: int | None = None) -> Path:
    """Write one checkpoint atomically, with its manifest; rotate to the newest ``keep_last``.
    Returns its path.

    The run directory is held for the write (:func:`~workbench.train.runlock.hold_run`): a save into a run
    another process is writing is refused, naming that process."""
    with hold_run(run_dir):  # the one writer of the run (see workbench.train.runlock)
        return _save(Path(run_dir), step, trainable=trainable, state=state, config_yaml=config_yaml,
                     meta=meta, keep_last=keep_last)


def _save(run_dir: Path, step: int, *, trainable: dict[str, torch.Tensor], state: dict[str, Any],
          config_yaml: str, meta: dict[str, Any], keep_last: int | None) -> Path:
    from safetensors.torch import save as save_safetensors

    recover(run_dir)
    # left by a process killed mid-save (no other process writes this run: this one holds it)
    for stale in [*run_dir.glob(".tmp-*"), *run_dir.glob(".LATEST.tmp-*")]:
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    final = run_dir / checkpoint_name(step)
    tmp = run_dir / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in trainable.items()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        full_meta = {**meta, "step": step, "versions": versions(), "saved_at": time.time(),
                     "integrity": {"manifest": MANIFEST, "algorithm": "sha256"}}
        contents = {"trainable.safetensors": save_safetensors(tensors), "state.pt": buffer.getbuffer(),
                    "config.yaml": config_yaml.encode(),
                    "meta.json": json.dumps(full_meta, indent=1).encode()}
        for name, data in contents.items():
            write_bytes(tmp / name, data)
        write_bytes(tmp / MANIFEST, manifest_bytes({k: entry_of(v) for k, v in contents.items()}, step=step))
        fsync_dir(tmp)
        if final.exists():
            trash = run_dir / f".tmp-old-{final.name}-{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        write_atomic(run_dir / "LATEST", final.name.encode())
        fsync_dir(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            # renamed away first (atomic), then deleted: a process killed while deleting leaves a hidden
            # directory the next save clears, never a listed checkpoint with half its files
            trash = run_dir / f".tmp-rotated-{old.name}-{os.getpid()}"
            os.replace(old, trash)
            shutil.rmtree(trash, ignore_errors=True)
    return final


def recover(run_dir: Path) -> None:
    """Put back a checkpoint that a save of the same step had moved aside when the process died
    before the new one took its place (``.tmp-old-step-N-PID`` without ``step-N``).

    Only where no other process writes the run: a writer's own save moves a checkpoint aside for a moment,
    and puts the new one in its place itself."""
    found = [aside for aside in run_dir.glob(".tmp-old-*")
             if re.fullmatch(rf"\.tmp-old-{PREFIX}\d+-\d+", aside.name) and aside.is_dir()]
    if not found:
        return
    held = try_hold_run(run_dir)
    if held is None:
        return
    with held:
        for aside in found:
            name = re.fullmatch(rf"\.tmp-old-({PREFIX}\d+)-\d+", aside.name).group(1)
            if aside.is_dir() and not (run_dir / name).exists():
                os.replace(aside, run_dir / name)


@dataclass
class LoadedCheckpoint:
    """A checkpoint as read by :func:`load_checkpoint`: every file verified against its manifest.

    ``verified`` is False for a checkpoint without digests (no manifest to check its files against).
    """

    path: Path
    meta: dict[str, Any]
    trainable: dict[str, torch.Tensor]
    state: dict[str, Any]
    config_yaml: str
    verified: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.meta["step"])


def _checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory: ``path`` itself, or the latest checkpoint of the run directory ``path``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"No checkpoint at {path}. Pass a run directory (with step-* checkpoints) "
                              f"or one checkpoint directory.")
    if (path / "meta.json").exists() or (path / MANIFEST).exists():
        return path
    recover(path)
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(f"{path} holds no complete checkpoint (expected step-*/ directories with "
                              f"{', '.join(FILES)}). Train with checkpoint_every set, or call exp.save(dir).")
    return latest


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(f"Checkpoint {path.parent}: {path.name} cannot be read ({err}).") from err


def _raw_files(path: Path) -> tuple[dict[str, bytes], bool, str | None]:
    """The bytes of a checkpoint's files, ``verified`` (it has a manifest and every file matches
    it), and the first problem found (``None`` when there is none)."""
    data = {name: _read(path / name) for name in FILES}
    manifest = _read(path / MANIFEST)
    if manifest is None:
        if data["meta.json"] is not None and b'"integrity"' in data["meta.json"]:
            return data, False, f"{MANIFEST} is missing (this checkpoint was written with one)"
        missing = [name for name in FILES if data[name] is None]
        if missing:
            return data, False, f"incomplete: missing {', '.join(missing)}"
        return data, False, None  # no digests at all: nothing to verify against
    try:
        entries = parse_manifest(manifest)
    except ManifestDamaged as err:
        return data, False, f"{MANIFEST} is damaged ({err})"
    for name in FILES:
        if name not in entries:
            return data, False, f"{MANIFEST} does not list {name}"
        problem = mismatch(name, entries[name], data[name])
        if problem:
            return data, False, problem
    return data, True, None


def checkpoint_problem(path: str | Path) -> str | None:
    """Why the checkpoint directory ``path`` cannot be trusted, in words; ``None`` when every file
    matches its manifest and the weights are finite (a checkpoint without a manifest is judged on
    whether it reads and is finite: there is nothing to verify it against)."""
    path = Path(path)
    try:
        data, _, problem = _raw_files(path)
        if problem:
            return problem
        _parse(path, data, verified=False)
    except CheckpointError as err:
        return str(err)
    return None


def intact_checkpoints(run_dir: str | Path) -> list[Path]:
    """The checkpoints of ``run_dir`` that verify (see :func:`checkpoint_problem`), oldest first."""
    return [p for p in list_checkpoints(run_dir) if checkpoint_problem(p) is None]


def newest_intact(run_dir: str | Path, before: Path | None = None) -> Path | None:
    """The newest checkpoint of ``run_dir`` that verifies (older than ``before`` when given)."""
    for candidate in reversed(list_checkpoints(run_dir)):
        if before is not None and candidate.name >= before.name:
            continue
        if checkpoint_problem(candidate) is None:
            return candidate
    return None


def fallback_hint(damaged: Path, use: str | None = None) -> str:
    """What to do about the damaged checkpoint ``damaged``: the newest one of its run that verifies.

    ``use`` says what to do with that one instead of continuing the run, as a format string of
    ``{checkpoint}`` (e.g. ``workbench eval``'s: evaluate it)."""
    good = newest_intact(damaged.parent, before=damaged)
    if good is None:
        if use is not None:
            return ("No earlier checkpoint of this run verifies either, so none of it can be used; "
                    "train the run again into a new directory (`workbench train CONFIG --output NEW_DIR`).")
        return ("No earlier checkpoint of this run verifies either; start the run again into a new directory "
                "(`workbench train CONFIG --output NEW_DIR`).")
    if use is not None:
        return (f"The newest checkpoint of this run that verifies is {good.name}: "
                f"{use.format(checkpoint=good)}.")
    return (f"The newest checkpoint of this run that verifies is {good.name}: continue from it with "
            f"`workbench train CONFIG --output {damaged.parent} --resume --from {good.name}` (in Python: "
            f"AdapterExperiment.load({str(good)!r})).")


def load_checkpoint(path: str | Path, *, use: str | None = None) -> LoadedCheckpoint:
    """Read and verify a checkpoint directory (or a run directory: its latest checkpoint).

    Every file is checked against ``manifest.json`` before it is parsed; a mismatch, a missing
    file, or non-finite weights raise a :class:`CheckpointError` naming the file, what was expected
    and the newest checkpoint of the run that verifies (with ``use``, what to do with that one; see
    :func:`fallback_hint`). A checkpoint without digests (no manifest, no integrity record) loads
    with ``verified=False`` and a note.
    """
    path = _checkpoint_dir(path)
    data, verified, problem = _raw_files(path)
    if problem:
        raise CheckpointError(f"Checkpoint {path} is damaged: {problem}. Nothing was loaded. "
                              f"{fallback_hint(path, use)}")
    ckpt = _parse(path, data, verified=verified, use=use)
    if not verified:
        ckpt.notes.append(f"note: checkpoint {path} has no {MANIFEST} "
                          f"(written by a workbench before checkpoints carried digests): "
                          f"its files were read but cannot be verified. "
                          f"The next checkpoint this run saves will carry them.")
    return ckpt


def _parse(path: Path, data: dict[str, bytes | None], verified: bool,
           use: str | None = None) -> LoadedCheckpoint:
    from safetensors.torch import load as load_safetensors

    missing = [name for name in FILES if data[name] is None]
    if missing:
        raise CheckpointError(f"Checkpoint {path} is incomplete: missing {', '.join(missing)}. "
                              f"Use an earlier checkpoint of the same run.")
    damage = "its files match their digests, so it was written this way" if verified else \
        "it has no digests to tell damage from a bad save"
    try:
        meta = json.loads(data["meta.json"])
        if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
            raise ValueError("meta.json holds no step")
        trainable = load_safetensors(data["trainable.safetensors"])
        config_yaml = data["config.yaml"].decode()
    except Exception as err:  # safetensors, json and unicode errors alike: the file is not what was written
        raise CheckpointError(f"Checkpoint {path} is unreadable ({type(err).__name__}: {err}); {damage}. "
                              f"It is corrupt; use an earlier checkpoint of the same run.") from None
    state = _load_state(path / "state.pt", data["state.pt"])
    bad = (non_finite(trainable, "trainable.safetensors")
           + non_finite(state.get("optimizer"), "state.pt optimizer"))
    if bad:
        raise CheckpointError(
            f"Checkpoint {path} holds non-finite values (nan or inf) in {len(bad)} tensor(s): "
            f"{'; '.join(bad[:3])}. Training cannot continue from it; {damage}"
            f"{' (the run had already diverged when it was saved)' if verified else ''}. "
            f"{fallback_hint(path, use)}")
    return LoadedCheckpoint(path=path, meta=meta, trainable=trainable, state=state, config_yaml=config_yaml,
                      verified=verified)


def non_finite(tree: Any, where: str) -> list[str]:
    """``"<where> <key>: k of n values"`` for each floating tensor in ``tree`` holding nan or inf."""
    out: list[str] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, torch.Tensor):
            # A sum is finite only if every value is (nan and inf propagate): one pass, no mask. Only a
            # sum that is not (or one that overflowed) is looked at value by value.
            if (value.is_floating_point() and value.numel()
                    and not torch.isfinite(value.sum(dtype=torch.float32))):
                finite = torch.isfinite(value)
                if not bool(finite.all()):
                    out.append(f"{where} {key}: {int((~finite).sum())} of {value.numel()} values")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    walk(tree, "")
    return out


def print_notes(ckpt: LoadedCheckpoint) -> None:
    """The checkpoint's notes (e.g. a legacy checkpoint that could not be verified), on stderr."""
    for note in ckpt.notes:
        print(note, file=sys.stderr)


def set_aside_after(run_dir: str | Path, keep: Path) -> list[Path]:
    """Move the checkpoints of ``run_dir`` newer than ``keep`` into ``run_dir/superseded/`` (kept, not
    deleted) and point ``LATEST`` at ``keep``: a run resumed from an earlier checkpoint continues
    from there without the newer ones mixing into its history. Returns where they went."""
    run_dir = Path(run_dir)
    with hold_run(run_dir):
        return _set_aside(run_dir, keep)


def _set_aside(run_dir: Path, keep: Path) -> list[Path]:
    moved = []
    for path in list_checkpoints(run_dir):
        if path.name <= keep.name:
            continue
        target_dir = run_dir / SUPERSEDED
        target_dir.mkdir(exist_ok=True)
        target = target_dir / path.name
        n = 1
        while target.exists():
            target, n = target_dir / f"{path.name}.{n}", n + 1
        os.replace(path, target)
        moved.append(target)
    write_atomic(run_dir / "LATEST", keep.name.encode())
    fsync_dir(run_dir)
    return moved


STATE_KEYS = ("optimizer", "rng_cpu", "step")


def _load_state(file: Path, data: bytes) -> dict[str, Any]:
    """``state.pt``, read as tensors and plain data only; anything else is refused, never unpickled."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        found = _pickled_globals(data)
        what = (f"references to {', '.join(found)}" if found
                else "Python objects other than tensors and plain data")
        raise CheckpointError(
            f"Checkpoint {file.parent}: state.pt holds {what}. workbench writes only tensors and plain data "
            f"(numbers, strings, lists, dicts) there, so this file was tampered with "
            f"or not written by workbench, and it will not be unpickled "
            f"(unpickling can run code from the file). Use another checkpoint of this run, "
            f"or one saved by AdapterExperiment.save / training.checkpoint_every."
        ) from None
    except Exception as err:  # a torch archive that does not open: zip, pickle or storage damage
        raise CheckpointError(f"Checkpoint {file.parent}: state.pt is unreadable ({type(err).__name__}: "
                              f"{str(err)[:200]}). "
                              f"It is corrupt; use an earlier checkpoint of the same run.") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        got = (f"a dict with keys {sorted(map(str, state))[:8]}" if isinstance(state, dict)
               else type(state).__name__)
        raise CheckpointError(
            f"Checkpoint {file.parent}: state.pt holds {got}, not the training state workbench writes "
            f"(missing {', '.join(missing)}). It was not written by workbench; use a checkpoint saved by "
            f"AdapterExperiment.save / training.checkpoint_every."
        )
    return state


def _pickled_globals(data: bytes) -> list[str]:
    """The Python names a torch-saved pickle refers to, beyond torch's own and OrderedDict (read, not run)."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    except (zipfile.BadZipFile, StopIteration, OSError):
        pass
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
    """The versions a checkpoint was written with
    (workbench's from its version module, not the package root)."""
    import numpy

    from workbench._version import __version__

    return {"workbench": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version()}
