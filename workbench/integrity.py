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


def _entries_digest(files: Mapping[str, Entry]) -> str:
    text = json.dumps({k: files[k].to_dict() for k in sorted(files)}, sort_keys=True, separators=(",", ":"))
    return digest_bytes(text.encode())


def manifest_bytes(files: Mapping[str, Entry], **extra: Any) -> bytes:
    """A manifest (JSON) listing ``files`` (name → :class:`Entry`), with a digest of the listing itself."""
    body = {"format": MANIFEST_FORMAT, "algorithm": ALGORITHM, **extra,
            "files": {k: files[k].to_dict() for k in sorted(files)}, "digest": _entries_digest(files)}
    return json.dumps(body, indent=1).encode()


class ManifestDamaged(Exception):
    """A manifest that is not readable JSON or whose own digest does not match its entries."""


def parse_manifest(data: bytes) -> dict[str, Entry]:
    """The entries of a manifest written by :func:`manifest_bytes`; :class:`ManifestDamaged` otherwise."""
    try:
        body = json.loads(data)
        files = {str(k): Entry(int(v["bytes"]), str(v["sha256"])) for k, v in body["files"].items()}
        recorded = body["digest"]
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ManifestDamaged(f"not a readable manifest ({type(err).__name__}: {err})") from None
    if body.get("algorithm") != ALGORITHM:
        raise ManifestDamaged(f"algorithm {body.get('algorithm')!r}, expected {ALGORITHM!r}")
    if recorded != _entries_digest(files):
        raise ManifestDamaged("its own digest does not match its entries")
    return files


def mismatch(name: str, expected: Entry, data: bytes | memoryview | None) -> str | None:
    """Why ``data`` (the bytes read from file ``name``; ``None``: missing) is not the manifest's
    ``expected`` file, in words; ``None`` when it is."""
    if data is None:
        return f"{name} is missing (the manifest lists {expected.bytes} bytes, sha256 {expected.sha256[:16]}…)"
    if len(data) != expected.bytes:
        cut = " (truncated)" if len(data) < expected.bytes else ""
        return f"{name} is {len(data)} bytes, the manifest expects {expected.bytes}{cut}"
    found = digest_bytes(data)
    if found != expected.sha256:
        return (f"{name} has sha256 {found[:16]}…, the manifest expects {expected.sha256[:16]}… (same size: "
                f"its contents changed, e.g. flipped bits)")
    return None
