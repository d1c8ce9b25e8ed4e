"""Files that can be verified: SHA-256 digests in a manifest, written atomically with the files.

Every file workbench writes for later reading (checkpoint files, latent-cache shards, exported
adapters) is listed in a manifest with its size and SHA-256 digest, so a reader can tell an
intact file from a damaged one — a flipped bit or a truncation — before it uses a single value
(``sha256sum FILE`` gives the same digest). A manifest carries a digest of its own entries, so a
damaged manifest is told apart from a damaged file.

Writes go to a temporary name, are flushed to disk and renamed into place: a reader sees the old
file or the new one, never half of one. New files get the permissions the user's umask gives
(as ``open()`` would create them), never the private ``0600`` of a temporary file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALGORITHM = "sha256"
MANIFEST_FORMAT = 1
CHUNK = 1 << 20


def digest_bytes(data: bytes | memoryview) -> str:
    """The SHA-256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def digest_file(path: str | Path) -> tuple[int, str]:
    """``(size in bytes, SHA-256 hex digest)`` of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            piece = f.read(CHUNK)
            if not piece:
                break
            size += len(piece)
            h.update(piece)
    return size, h.hexdigest()


def fsync_dir(path: str | Path) -> None:
    """Flush a directory's entries (a rename inside it) to disk, where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_mode() -> int:
    """The permissions ``open()`` gives a new file under the current umask (``0o644`` under ``022``)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes(path: str | Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` and flush it to disk (created with the umask's permissions)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: str | Path, data: bytes | memoryview) -> None:
    """Replace ``path`` by ``data`` atomically: a temporary file beside it, flushed, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_bytes(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Entry:
    """One file of a manifest: its size and SHA-256 digest."""

    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256}


def entry_of(data: bytes | memoryview) -> Entry:
    return Entry(len(data), digest_bytes(data))


def _body_digest(body: Mapping[str, Any]) -> str:
    """The digest of a manifest's every field but ``digest`` itself, in a canonical JSON form."""
    text = json.dumps({k: v for k, v in body.items() if k != "digest"}, sort_keys=True, separators=(",", ":"))
    return digest_bytes(text.encode())


def manifest_bytes(files: Mapping[str, Entry], **extra: Any) -> bytes:
    """A manifest (JSON) listing ``files`` (name → :class:`Entry`), with a digest of the manifest itself."""
    body = {"format": MANIFEST_FORMAT, "algorithm": ALGORITHM, **extra,
            "files": {k: files[k].to_dict() for k in sorted(files)}}
    return json.dumps({**body, "digest": _body_digest(body)}, indent=1).encode()


class ManifestDamaged(Exception):
    """A manifest that is not readable JSON or whose own digest does not match its entries."""


def parse_manifest(data: bytes) -> dict[str, Entry]:
    """The entries of a manifest written by :func:`manifest_bytes`; :class:`ManifestDamaged` otherwise."""
    try:
        body = json.loads(data)
        files = {str(k): Entry(int(v["bytes"]), str(v["sha256"])) for k, v in body["files"].items()}
        recorded = body["digest"]
        own = _body_digest(body)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ManifestDamaged(f"not a readable manifest ({type(err).__name__}: {err})") from None
    if recorded != own:
        raise ManifestDamaged("its own digest does not match its contents")
    if body.get("algorithm") != ALGORITHM:
        raise ManifestDamaged(f"algorithm {body.get('algorithm')!r}, expected {ALGORITHM!r}")
    return files


def mismatch(name: str, expected: Entry, data: bytes | memoryview | None) -> str | None:
    """Why ``data`` (the bytes read from file ``name``; ``None``: missing) is not the manifest's
    ``expected`` file, in words; ``None`` when it is."""
    if data is None:
        return (f"{name} is missing (the manifest lists {expected.bytes} bytes, "
                f"sha256 {expected.sha256[:16]}…)")
    if len(data) != expected.bytes:
        cut = " (truncated)" if len(data) < expected.bytes else ""
        return f"{name} is {len(data)} bytes, the manifest expects {expected.bytes}{cut}"
    found = digest_bytes(data)
    if found != expected.sha256:
        return (f"{name} has sha256 {found[:16]}…, the manifest expects {expected.sha256[:16]}… (same size: "
                f"its contents changed, e.g. flipped bits)")
    return None


MANIFEST = "manifest.json"


def publish(staging: str | Path, out: str | Path, **extra: Any) -> list[str]:
    """Move every file of the directory ``staging`` into ``out`` with a ``manifest.json`` listing them.

    The old manifest goes first and the new one last, so at no moment does a manifest describe
    files it does not match: a process killed in between leaves files without a manifest (which a
    reader reports as unlisted), never a wrong one. ``staging`` is removed. Returns the names moved.
    """
    staging, out = Path(staging), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in staging.iterdir() if p.is_file())
    files = {name: entry_of((staging / name).read_bytes()) for name in names}
    mode = file_mode()
    for name in names:  # flushed before anything moves, with the umask's permissions (not a writer's 0600)
        with open(staging / name, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(staging / name, mode)
    (out / MANIFEST).unlink(missing_ok=True)
    for name in names:
        os.replace(staging / name, out / name)
    write_atomic(out / MANIFEST, manifest_bytes(files, **extra))
    fsync_dir(out)
    for leftover in staging.iterdir():
        leftover.unlink()
    staging.rmdir()
    return names


def listed_problem(file: str | Path) -> tuple[bool, str | None]:
    """Check ``file`` against the ``manifest.json`` of its directory: ``(listed, problem)``.

    ``listed`` is False when there is no manifest there or it does not list the file (a file
    written by another tool: nothing to verify against); ``problem`` says what is wrong, in words.
    """
    file = Path(file)
    manifest = file.parent / MANIFEST
    if not manifest.is_file():
        return False, None
    try:
        entries = parse_manifest(manifest.read_bytes())
    except ManifestDamaged as err:
        return True, f"{manifest} is damaged ({err})"
    if file.name not in entries:
        return False, None
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        data = None
    return True, mismatch(file.name, entries[file.name], data)
