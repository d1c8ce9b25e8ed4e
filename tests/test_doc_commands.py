"""The shell commands in the README and the documentation run as written.

Every ```bash / ```sh / ```shell block of README.md and docs/**/*.md is read; its command lines
(continuation lines joined, comments dropped) run in order, in a scratch directory that holds the
repository's examples/, with this environment's `workbench` first on PATH. A command that cannot run
in seconds here is skipped by SKIP below, which says why for each pattern; every other command must
exit 0 without a traceback. A new command in the docs is therefore run unless it is added to SKIP.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.M | re.S)

# Commands that are not run, by a pattern their text matches, and why.
SKIP: dict[str, str] = {
    # minutes, or the whole suite
    r"^make (demo|test)\b": "sets up .venv and runs the demo (10 min) or this very suite",
    r"^make (lab|notebooks)\b": "starts JupyterLab / re-executes every notebook (minutes)",
    r"^make docs\b": "builds this documentation site (tests/test_docs_site.py builds it with --strict)",
    r"^make bench\b": "runs every benchmark to the end (minutes; tests/test_benchmarks.py runs each with --quick)",
    r"^workbench data metaworld\b": "renders MuJoCo rollouts of 12 to 480 episodes (minutes)",
    r"^workbench (pretrain|probe train)\b": "trains for 8 to 70 minutes",
    r"^workbench demo\b": "trains and evaluates the demo (minutes)",
    r"^workbench eval\b": "needs the run a `workbench demo` trains (minutes)",
    r"compare_adapters\.py": "7 to 12 minutes per adapter (--table prints what those runs stored)",
    r"lerobot_world_model\.yaml": "trains on the LeRobot dataset the `data metaworld` line before generates",
    r"\bmy_(videos|dataset)\b|own_videos": "the walk-through of Your own data: tests/test_own_data.py runs it as "
                                            "written, with its Python view, in one folder and one process",
    r"examples/configs/(wan22|easyanimate|dynamicrafter)": "imports diffusers and a backbone plugin (a minute or more)",
    r"\bbenchmarks\b": "a benchmark: it measures for a minute or more",
    # placeholders for the reader's own files and machines
    r"\b(my_)?run\.yaml\b|RUN_DIR|FILE\.h5|LEROBOT_DIR|HOST0|/models/": "placeholder: the reader's files, machines",
    r"--nproc_per_node=8\b": "needs 8 GPUs",
    r"^pip install\b": "installs from the package index (tests/test_install.py installs the built wheel)",
}


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if (ROOT / "docs").is_dir() else \
        [ROOT / "README.md"]


def without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a shell comment (at the start or after a blank, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(text: str) -> list[list[str]]:
    """The command lines of each shell block (continuations joined, comments and blank lines dropped)."""
    blocks = []
    for match in SHELL.finditer(text):
        joined = match.group(1).replace("\\\n", " ")
        lines = [" ".join(without_comment(line).split()) for line in joined.splitlines()]
        blocks.append([line for line in lines if line])
    return blocks


def cases() -> list:
    out = []
    for doc in documents():
        for b, block in enumerate(commands(doc.read_text())):
            if block:
                out.append(pytest.param(doc, block, id=f"{doc.relative_to(ROOT)}:{b}"))
    return out


def reason_to_skip(command: str) -> str | None:
    for pattern, reason in SKIP.items():
        if re.search(pattern, command):
            return reason
    return None


def test_every_skip_pattern_still_matches_a_command():
    """A pattern that matches no command any more is stale: remove it."""
    every = [c for doc in documents() for block in commands(doc.read_text()) for c in block]
    stale = [p for p in SKIP if not any(re.search(p, c) for c in every)]
    assert stale == []


@pytest.mark.parametrize("doc, block", cases())
def test_shell_commands_run_as_written(tmp_path, doc, block):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    if (ROOT / ".venv").exists():
        (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ran = []
    for command in block:
        if reason_to_skip(command):
            continue
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{doc.name}: `{command}` exited {done.returncode}:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        ran.append(command)
    if not ran:
        pytest.skip("every command of this block is in SKIP: " + "; ".join(
            f"`{c}`: {reason_to_skip(c)}" for c in block))
