"""Local Jupyter servers for the browser checks: a notebook written from cells, JupyterLab or Voilà on 127.0.0.1.

The browser tests (``tests/test_widgets_lab.py``, ``tests/test_widgets_browser.py``) and the latency
benchmark (``benchmarks/widget_latency.py``) start their servers through this one module.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

#: JupyterLab settings every check wants: no autosave (the notebook on disk stays as written), no news pop-up.
QUIET_LAB = {"@jupyterlab/docmanager-extension/plugin": {"autosave": False},
             "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}


class ServerDidNotStart(RuntimeError):
    """The server exited, or did not answer in time; the message holds its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path: Path, cells: Sequence[str]) -> Path:
    """A Python 3 notebook of these code cells at ``path``."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code) for code in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def lab_command(folder: Path, port: int, token: str, settings: dict[str, dict]) -> tuple[list[str], dict[str, str]]:
    """The command and the environment additions of a JupyterLab on ``folder``, its ``settings`` (by plugin) written
    to ``folder/lab-settings``; saving a notebook keeps its views as pictures, as ``make lab`` does."""
    directory = folder / "lab-settings"
    for plugin, values in settings.items():
        path = directory / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={folder}",
               # as `make lab`: a saved notebook keeps each view as its picture (workbench.widgets.static)
               "--ContentsManager.pre_save_hook=workbench.widgets.static.keep_static_on_save"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    return command, {"JUPYTERLAB_SETTINGS_DIR": str(directory), "JUPYTER_RUNTIME_DIR": str(folder / "runtime-lab")}


@contextlib.contextmanager
def serving(command: list[str], folder: Path, env: dict[str, str], ready: str, log: Path,
            timeout: float = 90.0) -> Iterator[None]:
    """Run ``command`` in ``folder`` (output to ``log``) until the block ends; enter once ``ready`` answers.

    Any HTTP answer counts (the server is up). Raises :class:`ServerDidNotStart` with the log when the
    process exits or ``timeout`` seconds pass first.
    """
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=folder, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                                  stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    urllib.request.urlopen(ready, timeout=2)  # noqa: S310 - our own local server
                    break
                except urllib.error.HTTPError:  # any answer means the server is up
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise ServerDidNotStart(f"{command[2]} did not start:\n{log.read_text()}") from None
                    time.sleep(0.5)
            yield
        finally:
            server.terminate()
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
