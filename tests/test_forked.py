"""tests/forked.py: a command run in a fork behaves as the same command in a fresh interpreter, where a test can
tell: its arguments, environment, working directory, output, exit status, and the signals that end it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import forked

SHOW = ("import atexit, os, sys\nprint(sys.argv, os.environ.get('WORKBENCH_FORKED_TEST'), os.getcwd(), flush=True)\n"
        "atexit.register(print, 'at exit')\nprint('to stderr', file=sys.stderr)\nraise SystemExit(int(sys.argv[1]))")


def test_a_forked_command_gets_what_a_fresh_interpreter_gets(tmp_path):
    env = {**os.environ, "WORKBENCH_FORKED_TEST": "yes"}
    fresh = subprocess.run([sys.executable, "-c", SHOW, "3"], env=env, cwd=tmp_path, capture_output=True, text=True)
    fork = forked.run(["-c", SHOW, "3"], env=env, cwd=tmp_path)
    assert (fork.returncode, fork.stdout, fork.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr) == (
        3, f"['-c', '3'] yes {tmp_path}\nat exit\n", "to stderr\n")
    assert "WORKBENCH_FORKED_TEST" not in os.environ and os.getcwd() != str(tmp_path)  # this process: untouched
    (tmp_path / "script.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n1 / 0\n")
    failed = forked.run([str(tmp_path / "script.py"), "a"])
    assert failed.returncode == 1 and failed.stdout == "__main__ ['a']\n"
    assert failed.stderr.startswith("Traceback") and failed.stderr.endswith("ZeroDivisionError: division by zero\n")
    doctor = forked.run(["-m", "workbench", "doctor"])
    assert doctor.returncode == 0 and doctor.stdout.startswith("workbench ")


def test_signals_end_a_forked_command_as_they_end_a_fresh_one():
    waits = ("import time\nprint('ready', flush=True)\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
             "    print('interrupted', flush=True)\n    raise SystemExit(130)")
    for signum, status, printed in ((signal.SIGINT, 130, "interrupted\n"), (signal.SIGTERM, -signal.SIGTERM, ""),
                                    (signal.SIGKILL, -signal.SIGKILL, "")):
        proc = forked.start(["-c", waits])
        assert proc.readline() == "ready\n" and proc.poll() is None
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == status and proc.readline() == printed
