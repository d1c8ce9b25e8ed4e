"""The processes workbench starts to share its work: the second process of a training step
(:mod:`workbench.train.ahead`) and the pools of the world model's evaluations
(:mod:`workbench.worldmodel.imagination`, :mod:`workbench.worldmodel.closed_loop_eval`).

Each runs one thread and has computed nothing before its first job: never a fork of a process that has run
torch's thread pool. Where the platform has a fork server (Linux, macOS), they come from one: a process,
started on first use, imports torch and the modules the jobs run, once, and every worker is a fork of it. A
spawned worker imports torch again each time (about 1.5 CPU seconds, more than many jobs take). Elsewhere
(Windows) they are spawned.

A fork server keeps the environment it started with. The workers take the environment of the process that
starts them (:func:`adopt_environment`, the initializer of each :func:`pool`), as a spawned one would; a
variable read while the server imported torch (``ATEN_CPU_CAPABILITY``) keeps the value it had then.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

__all__ = ["PRELOAD", "adopt_environment", "pool", "worker_context"]

#: What the fork server imports before it forks a worker: torch and the modules the workers run.
PRELOAD = ("torch", "workbench.train.ahead", "workbench.worldmodel.imagination",
           "workbench.worldmodel.closed_loop_eval", "workbench.inspect.recording.rollouts",
           "workbench.backbones.tiny_video")


def worker_context() -> BaseContext:
    """The multiprocessing context of workbench's workers: ``forkserver`` (preloading :data:`PRELOAD`) where
    the platform offers it, else ``spawn``.

    Returns:
        A context whose ``Process``, ``Queue`` and ``ProcessPoolExecutor(mp_context=...)`` give fresh
        workers.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # (no effect once the server runs: it keeps its first list)
    return context


def pool(processes: int) -> ProcessPoolExecutor:
    """A pool of ``processes`` workers (:func:`worker_context`), each in the environment of this process.

    Args:
        processes: How many workers.

    Returns:
        The pool; ``shutdown`` (or a ``with`` block) ends its workers.
    """
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(processes, mp_context=worker_context(), initializer=adopt_environment,
                               initargs=(dict(os.environ),))


def adopt_environment(environment: Mapping[str, str]) -> None:
    """Make this worker's environment ``environment`` (the starting process's ``os.environ``).

    Args:
        environment: the variables, names to values.
    """
    for name in set(os.environ) - set(environment):
        del os.environ[name]
    os.environ.update(environment)
