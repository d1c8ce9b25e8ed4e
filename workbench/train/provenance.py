"""What a run records of the base it was trained on, and the check that a checkpoint meets the same base.

An adapter's weights are fitted to one frozen base: loaded onto another (a base file written again by a
second ``workbench pretrain``, another download of a release), they compute something else, with no
error. So every checkpoint's ``meta.json`` records a SHA-256 digest of the base (``"base": {"sha256":
..., "covers": ...}``), and restoring a checkpoint into an experiment (``workbench train --resume``,
``workbench eval``, :meth:`AdapterExperiment.load <workbench.train.experiment.AdapterExperiment.load>`)
refuses a base whose digest differs, naming both digests and the base's file.

What the digest covers (:func:`base_digest`), from what the backbone reports in
:meth:`~workbench.core.backbone.BaseVideoModel.weight_files`:

* **one file** (``tiny_video`` loaded from a ``.safetensors`` file, a DynamiCrafter checkpoint): the
  SHA-256 of the file's bytes, the digest ``sha256sum FILE`` prints;
* **several files** (a diffusers pipeline directory: every file in it that is not hidden): the SHA-256
  of the list of each file's SHA-256 and its path in the directory, one per line, sorted by path;
* **no file** (a random init, as in the tests and the tiny configs): the SHA-256 of the backbone's
  state dict, every tensor's name, dtype, shape and bytes in name order, the adapter's own tensors (a
  LoRA inside the base) left out. Tensors a backbone holds outside its state dict (a text encoder or
  conditioning towers built on first use from the same seed) are not in it; the config that builds
  them is compared on resume anyway.

Hashing reads each file once when an experiment is built: about 2 ms per MB on a 2-core development
machine (the shipped ``tiny_video``, 3.4 MB, in under 20 ms). A file of 64 MiB or more is hashed once
per contents: its digest is kept, in memory and in ``$WORKBENCH_CACHE/digests`` (default
``~/.cache/workbench``), against the file's device, inode, size and modification and change times; any
write to the file changes one of those and it is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.errors import CheckpointError
from workbench.integrity import digest_file, write_atomic

#: Files at least this large have their digest kept (see the module docstring). Smaller ones are hashed
#: every time: cheap, and a small file can be written again within one tick of the file system's clock,
#: leaving the times a kept digest is checked against unchanged.
CACHE_FROM_BYTES = 64 << 20

_memo: dict[tuple, str] = {}


@dataclass(frozen=True)
class BaseDigest:
    """A base's digest: ``sha256`` (hex), what it ``covers`` in words that hold on any machine (file
    names, not paths), and ``where`` the weights are on this one (a file, a directory, or the state dict)."""

    sha256: str
    covers: str
    where: str
    kind: str  # "file", "directory" or "state dict"

    def record(self) -> dict[str, str]:
        """What ``meta.json`` keeps under ``"base"``."""
        return {"sha256": self.sha256, "covers": self.covers}


def _cache_root() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE") or "~/.cache/workbench").expanduser() / "digests"


def _identity(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (what ``sha256sum`` prints); kept for large files (see the module
    docstring)."""
    path = Path(path)
    if path.stat().st_size < CACHE_FROM_BYTES:
        return digest_file(path)[1]
    key = _identity(path)
    if key in _memo:
        return _memo[key]
    record = _cache_root() / f"{hashlib.sha256(key[0].encode()).hexdigest()[:32]}.json"
    try:
        saved = json.loads(record.read_text())
        if isinstance(saved, dict) and saved.get("key") == list(key) and isinstance(saved.get("sha256"), str):
            _memo[key] = saved["sha256"]
            return saved["sha256"]
    except (OSError, ValueError):
        pass  # no record yet, or one that does not read: the file is hashed below
    digest = digest_file(path)[1]
    if _identity(path) == key:  # (a file written while it was read gets no record)
        _memo[key] = digest
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(record, json.dumps({"key": list(key), "sha256": digest}).encode())
        except OSError:
            pass  # a cache that cannot be written (read-only home) costs the next run a rehash, nothing more
    return digest


def _files_digest(files: list[Path]) -> BaseDigest:
    if len(files) == 1:
        file = files[0]
        return BaseDigest(file_sha256(file), f"the file {file.name}", str(file), "file")
    root = Path(os.path.commonpath([str(f.parent) for f in files]))
    entries = sorted((f.relative_to(root).as_posix(), f) for f in files)
    listing = "".join(f"{file_sha256(f)}  {relative}\n" for relative, f in entries)
    digest = hashlib.sha256(listing.encode()).hexdigest()
    return BaseDigest(digest, f"the {len(files)} files of the directory {root.name}/", str(root), "directory")


def _state_digest(base: torch.nn.Module, skip: set[int]) -> BaseDigest:
    h = hashlib.sha256()
    count = 0
    for name, tensor in sorted(base.state_dict(keep_vars=True).items()):
        if id(tensor) in skip:
            continue
        t = tensor.detach()
        h.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{tuple(t.shape)}\n".encode())
        h.update(t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
        count += 1
    name = type(base).__name__
    covers = f"the state dict of {name} ({count} tensors: names, dtypes, shapes, values)"
    return BaseDigest(h.hexdigest(), covers,
                      f"the weights {name} holds in memory (no file: a random init)", "state dict")


def base_digest(base: Any, exclude: Iterable[torch.Tensor] = ()) -> BaseDigest:
    """The digest of the frozen ``base`` (a :class:`~workbench.core.backbone.BaseVideoModel`): of its
    :meth:`weight_files`, or of its state dict where it names none, leaving out the tensors ``exclude``
    (an inside adapter's weights, which live in the base's modules)."""
    files = [Path(f) for f in base.weight_files()]
    gone = [str(f) for f in files if not f.is_file()]
    if gone:
        raise CheckpointError(
            f"{type(base).__name__}.weight_files() names {len(gone)} file(s) that cannot be read: "
            f"{', '.join(gone[:3])}. It must list the files its frozen weights were read from (or none, for "
            f"weights no file holds); the run's base is recorded by their digest. Put the files back, or fix "
            f"the backbone's weight_files().")
    if files:
        return _files_digest(files)
    return _state_digest(base, {id(t) for t in exclude})


def check_base(checkpoint: Path, meta: Mapping[str, Any], current: BaseDigest) -> str | None:
    """Refuse a checkpoint whose recorded base differs from ``current`` (a :class:`CheckpointError`
    naming both digests, the base's file and the fix); a note when the checkpoint records no base
    (written before runs recorded it), ``None`` when the digests match."""
    recorded = meta.get("base")
    if recorded is None:
        return (f"note: checkpoint {checkpoint} records no digest of the base it was trained on "
                f"(written by a workbench before runs recorded their base), so the base cannot be checked; "
                f"the next checkpoint this run saves records this one's (sha256 {current.sha256}).")
    if not (isinstance(recorded, Mapping) and isinstance(recorded.get("sha256"), str)):
        raise CheckpointError(f"Checkpoint {checkpoint}: meta.json's \"base\" is {recorded!r}, "
                              f"not the record workbench writes ({{\"sha256\": ..., \"covers\": ...}}). "
                              f"Use a checkpoint AdapterExperiment.save or training.checkpoint_every saved.")
    saved = recorded["sha256"]
    if saved == current.sha256:
        return None
    if current.kind == "state dict":
        fix = ("This base is a random init built from the run's config, and here it came out with other "
               "values (another torch version, device or precision draws other numbers). Continue the run "
               "where it was trained, or train a new run here (`workbench train CONFIG --output NEW_DIR`).")
    elif current.kind == "file":
        fix = (f"If the file {current.where} was written again since the run was trained (a second "
               f"`workbench pretrain` into the same path, another download), put back the file whose sha256 "
               f"is {saved} (`sha256sum FILE` prints a file's) at that path; to use the base as it is now, "
               f"train a new run on it (`workbench train CONFIG --output NEW_DIR`).")
    else:
        fix = (f"If the files of {current.where} changed since the run was trained (another release or "
               f"revision downloaded into it), put back the ones the run was trained on; to use the base as "
               f"it is now, train a new run on it (`workbench train CONFIG --output NEW_DIR`).")
    raise CheckpointError(
        f"Checkpoint {checkpoint} was trained on another base: it records base sha256 {saved} "
        f"({recorded.get('covers') or 'the base it was trained on'}), and this base, {current.where}, has "
        f"sha256 {current.sha256} ({current.covers}). An adapter is fitted to the base it was trained on, "
        f"so nothing was loaded onto this one. {fix}")


__all__ = ["BaseDigest", "base_digest", "check_base", "file_sha256"]
