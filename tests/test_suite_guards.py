"""The guards `make test` runs the suite under: a crashed worker ends the run, naming its test, and a hung
test ends its worker with every thread's stack printed; neither waits for the CI's own time limit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def xdist_flags(timeout: int) -> list[str]:
    """The Makefile's XDIST options, with its variables filled in."""
    line = re.search(r"^XDIST := ((?:.*\\\n)*.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    return line.replace("\\\n", " ").replace("$(WORKERS)", "2").replace("$(TEST_TIMEOUT)", str(timeout)).split()


#: plugins the guards do not involve, left out of the inner run: each of its three processes (the controller and
#: two workers) would import them, seconds of CPU each (nbval imports nbformat and its JSON-schema checks)
UNINVOLVED = ["-p", "no:nbval", "-p", "no:hypothesispytest", "-p", "no:anyio"]


def run(tmp_path: Path, body: str, timeout: int) -> subprocess.CompletedProcess:
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text("def test_fine():\n    pass\n")
    (tmp_path / "test_bad.py").write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *UNINVOLVED,
                           *xdist_flags(timeout), str(tmp_path)], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)


def test_a_worker_that_crashes_ends_the_run_and_names_its_test(tmp_path):
    done = run(tmp_path, "import os\n\ndef test_crashes():\n    os._exit(3)\n\n\ndef test_after():\n    pass\n",
               timeout=600)
    assert done.returncode != 0
    assert re.search(r"worker 'gw\d' crashed while running 'test_bad.py::test_crashes'", done.stdout)
    # no worker replaces the crashed one: its file's next test never runs, and the crash is not run again
    # (a replacement would run test_after, or test_crashes a second time: 4 passed, or 2 failed)
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"1 failed(, [0-3] passed)? in [\d.]+s( \(.*\))?", summary), summary


def test_a_hung_test_fails_with_its_stack(tmp_path):
    done = run(tmp_path, "import threading\n\ndef test_hangs():\n    threading.Event().wait()\n", timeout=3)
    assert done.returncode != 0
    assert re.search(r"worker 'gw\d' crashed while running 'test_bad.py::test_hangs'", done.stdout)
    # the stack of every thread, the hung test's among them, on the worker's stderr
    assert "Timeout (0:00:03)!" in done.stderr and "in test_hangs" in done.stderr
