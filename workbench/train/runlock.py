"""One writer per run: a lock the operating system releases when its process ends.

A run directory holds a lock file, ``.writer.lock``. The process that writes the run — ``workbench
train``, a ``fit()`` that saves checkpoints, a ``save_checkpoint`` — takes an exclusive lock on it
first (``fcntl.flock``; ``msvcrt.locking`` on Windows) and writes into it who it is: process id,
host, command line and when it took the run. A second process that tries to write the same run is
refused with those facts before it writes anything (``workbench train``: before it reads the run). Two
writers would otherwise delete each other's temporary checkpoints and mix their histories.

The lock belongs to the open file, not to the file's contents: when the holding process ends, however
it ends (``kill -9`` included), the operating system releases it, so a run whose writer was killed
never stays blocked; the lock file left behind is only a name. (A child the holder forked, such as a
data-loading worker, keeps the lock until it exits too; those exit within seconds of their parent.)

Within one process the lock is shared: the command line holds the run for the whole command, and the
experiment it drives takes the same lock again for each save. Under ``torchrun`` only rank 0 writes,
so only rank 0 takes it; the other ranks never touch the file.

The lock is advisory: it keeps workbench processes apart, not other programs. On network file systems
it is as good as the system's ``flock`` (NFS v4 supports it).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import CheckpointError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

#: The lock file in a run directory.
LOCK_FILE = ".writer.lock"
#: Where the Windows lock sits in the file: past the holder's record, which other processes read
#: (a region locked with ``msvcrt.locking`` cannot be read by them).
_WINDOWS_OFFSET = 1 << 20

_held: dict[str, _Held] = {}
_guard = threading.Lock()


@dataclass
class _Held:
    fd: int
    count: int


def _command() -> str:
    """This process's command line, as a user would type it (``workbench train ...``)."""
    argv = list(sys.argv) or ["python"]
    first = Path(argv[0])
    if first.name == "__main__.py":  # python -m PACKAGE
        head = ["python", "-m", first.parent.name]
    elif first.name in ("", "-c"):
        head = ["python", "-c", "..."]
    else:
        head = [first.name]
    return shlex.join([*head, *argv[1:]])


def _record() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": _command(),
                       "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "since_unix": time.time()}).encode()


def _try_lock(fd: int) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    os.lseek(fd, _WINDOWS_OFFSET, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, _WINDOWS_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def _write(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)


def _holder(file: Path) -> dict | None:
    """Who holds ``file``, as it wrote it; ``None`` when it has not written it yet. A holder writes its
    record right after taking the lock, so an empty or partial record is read again for up to a second."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            found = json.loads(file.read_bytes())
            if isinstance(found, dict) and "pid" in found:
                return found
        except (OSError, ValueError):
            pass  # not written yet, or being written: read it again below
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _alive_here(holder: dict) -> bool | None:
    """Whether the holder's process still runs (``None``: this cannot tell: it is on another host, or this is
    Windows, where ``os.kill`` ends the process it is given)."""
    if holder.get("host") != socket.gethostname() or fcntl is None:
        return None
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # another user's process, or a record this check cannot read: say it runs
    return True


def _in_use_message(run_dir: Path, holder: dict | None, then: str | None = None) -> str:
    """The refusal of a second writer of ``run_dir``: the holding process and what to do."""
    file = run_dir / LOCK_FILE
    if holder is None:
        who = f"another process holds its lock ({file}) and has not yet written which one it is"
        stop = "Wait for it to finish, or stop it"
    else:
        pid, host = holder.get("pid"), holder.get("host")
        who = (f"process {pid} on host {host} (`{holder.get('command')}`) has been writing it since "
               f"{holder.get('since')} (lock file {file})")
        alive = _alive_here(holder)
        if alive is False:
            who += (f"; process {pid} has exited, but a process it started (a data-loading worker) still "
                    f"holds the lock and ends within seconds")
        where = f" on {host}" if host != socket.gethostname() else ""
        stop = (f"Wait for it to finish, or stop it (Ctrl-C in its terminal, or `kill {pid}`{where}: "
                f"a training run saves a checkpoint and exits)")
    after = then or "then try again"
    return (f"Run directory {run_dir} is in use: {who}. Two processes writing one run delete each other's "
            f"checkpoints, so this one stopped before writing anything there. {stop}, {after}; "
            f"to train beside it, write to another directory (--output NEW_DIR, or "
            f"training.output_dir).")


class RunLock:
    """This process's hold on one run directory (see the module docstring); :meth:`release` lets go.

    Holds nest within a process: the directory is unlocked when the last of them is released (or when
    the process ends).
    """

    def __init__(self, run_dir: Path, key: str):
        self.run_dir = run_dir
        self._key = key
        self._released = False

    def release(self) -> None:
        """Let go of this hold (once; later calls do nothing)."""
        with _guard:
            if self._released:
                return
            self._released = True
            held = _held[self._key]
            held.count -= 1
            if held.count:
                return
            del _held[self._key]
            try:
                _write(held.fd, b"")  # an empty record: nobody holds the run
                _unlock(held.fd)
            finally:
                os.close(held.fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _acquire(run_dir: Path, then: str | None, refuse: bool) -> RunLock | None:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    key = str(run_dir.resolve())
    with _guard:
        held = _held.get(key)
        if held is not None:
            held.count += 1
            return RunLock(run_dir, key)
        file = run_dir / LOCK_FILE
        fd = os.open(file, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
        try:
            got = _try_lock(fd)
            if got:
                _write(fd, _record())
        except BaseException:
            os.close(fd)
            raise
        if got:
            _held[key] = _Held(fd, 1)
            return RunLock(run_dir, key)
        os.close(fd)
    if not refuse:
        return None
    raise CheckpointError(_in_use_message(run_dir, _holder(file), then))  # (read outside the guard: it waits)


def hold_run(run_dir: str | Path, *, then: str | None = None) -> RunLock:
    """Hold ``run_dir`` for writing (created if missing), or raise a :class:`CheckpointError` naming
    the process that holds it (pid, host, command, since when) and what to do.

    ``then``: what to do once that process has stopped, in the refusal (the command line gives the
    command that continues the run). Release with :meth:`RunLock.release` or a ``with`` block.
    """
    return _acquire(Path(run_dir), then, refuse=True)


def try_hold_run(run_dir: str | Path) -> RunLock | None:
    """Hold ``run_dir`` if no other process does; ``None`` when another does (nothing is raised)."""
    return _acquire(Path(run_dir), None, refuse=False)


__all__ = ["LOCK_FILE", "RunLock", "hold_run", "try_hold_run"]
