"""Python commands of the suite run in a fork of a process that has imported torch already.

A test that needs a process of its own (to kill it with SIGKILL or SIGINT mid-save, to read what it prints, to
keep a patch or a crash out of the test's process) used to start ``python -c CODE`` or ``python -m workbench
...``: a fresh interpreter importing torch each time, about two CPU seconds before the first line of the test's
code. :func:`start` runs the same command line in a fork of the workers' fork server
(:func:`workbench.workers.worker_context`, which has imported torch and the library's heavy modules once):
the command runs as ``__main__``, with its own ``sys.argv``, working directory and environment, its output in
files and its own exit handlers run at its end, and it is a process like any other to signal, kill and wait
for.

What a fork does not give: a fresh ``sys.modules`` (a command that checks what an import loads needs its own
interpreter) or another interpreter (a virtual environment's ``python``). Those still use ``subprocess``.
"""

from __future__ import annotations

import atexit
import io
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from workbench.workers import worker_context

__all__ = ["Forked", "run", "start"]


def _main(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the fork: the command line ``argv`` (after ``python``) as a fresh interpreter would run it."""
    from workbench.workers import adopt_environment

    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    # line-buffered text on the new descriptors, as a `python -u` child writes (a test reads lines as they come)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
    os.chdir(cwd)
    adopt_environment(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    atexit._clear()  # the server's exit handlers are not the command's; the command's own run at its end
    code: int | str | None = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it, then exit status 1
        traceback.print_exc()
        code = 1
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)  # no interpreter teardown: the fork's parent is the server, which only reaps it


class Forked:
    """A running command (see :func:`start`): ``pid``, ``poll()``, ``wait()``, ``send_signal()``, ``kill()``,
    ``returncode`` as :class:`subprocess.Popen` has them, and what it printed (``stdout``, ``stderr``,
    ``readline()``)."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]):
        self._folder = tempfile.TemporaryDirectory(prefix="workbench-forked-")
        self._out = Path(self._folder.name) / "stdout"
        self._err = Path(self._folder.name) / "stderr"
        self._out.touch()
        self._err.touch()
        self._process = worker_context().Process(
            target=_main, args=(list(argv), cwd, dict(env), str(self._out), str(self._err)), daemon=False)
        self._process.start()
        self.pid = self._process.pid
        self._read = 0

    @property
    def returncode(self) -> int | None:
        """The exit status; minus the signal's number for a process a signal ended, as ``Popen`` gives."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.returncode is None:
            import subprocess

            raise subprocess.TimeoutExpired(["forked", str(self.pid)], timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def readline(self, timeout: float = 300.0) -> str:
        """The next whole line the command printed, waiting up to ``timeout`` seconds for it; ``""`` once the
        command has ended and printed no further line."""
        deadline = time.monotonic() + timeout
        while True:
            text = self._out.read_bytes()[self._read:]
            end = text.find(b"\n")
            if end >= 0:
                self._read += end + 1
                return text[:end + 1].decode()
            if self.returncode is not None or time.monotonic() > deadline:
                return ""
            time.sleep(0.02)

    @property
    def stdout(self) -> str:
        return self._out.read_text()

    @property
    def stderr(self) -> str:
        return self._err.read_text()

    def __del__(self):
        if getattr(self, "_process", None) is not None and self.returncode is None:
            self.kill()
            self._process.join(30)


def start(argv: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None) -> Forked:
    """Start ``python ARGV`` (``["-c", CODE, ...]``, ``["-m", MODULE, ...]`` or ``[SCRIPT, ...]``) in a fork.

    Args:
        argv: The command line after ``python``.
        cwd: Its working directory (default: this process's).
        env: Its whole environment (default: this process's).

    Returns:
        The running command.
    """
    return Forked(argv, str(cwd or os.getcwd()), dict(os.environ if env is None else env))


def run(argv: list[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300.0) -> Forked:
    """:func:`start`, then wait for the command's end (``returncode``, ``stdout``, ``stderr``)."""
    forked = start(argv, cwd=cwd, env=env)
    try:
        forked.wait(timeout)
    except BaseException:
        forked.kill()
        raise
    return forked
