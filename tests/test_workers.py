"""The processes workbench starts (workbench.workers): forks of a server that imported torch once, in the
environment of the process that starts them, and counted in the suite's CPU budget.

Nothing of workbench or torch at module level: the workers import this module to find the jobs below.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import pytest

linux_only = pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(),
                                reason="a fork server is a POSIX start method; elsewhere workers are spawned")


def _what_the_worker_has(names):
    """In a worker: which of ``names`` it had imported before it ran this job, its variables, its parent."""
    return {"loaded": [name for name in names if name in sys.modules],
            "variables": {name: os.environ.get(name) for name in ("WORKBENCH_TEST_SET", "WORKBENCH_TEST_GONE")},
            "parent": os.getppid(), "pid": os.getpid()}


def _burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return os.getpid()


@linux_only
def test_workers_are_forks_of_a_server_that_imported_torch_and_the_jobs_modules(monkeypatch):
    from concurrent.futures import ProcessPoolExecutor

    from workbench.workers import PRELOAD, adopt_environment, worker_context

    context = worker_context()
    assert context.get_start_method() == "forkserver"
    monkeypatch.setenv("WORKBENCH_TEST_GONE", "here when the pool starts")
    # the server may be running already, started by an earlier test in another environment
    with ProcessPoolExecutor(1, mp_context=context, initializer=adopt_environment,
                             initargs=({**os.environ, "WORKBENCH_TEST_SET": "set after"},)) as pool:
        got = pool.submit(_what_the_worker_has, PRELOAD).result()
        again = pool.submit(_what_the_worker_has, PRELOAD).result()
    # this module imports neither torch nor workbench: a spawned worker would have loaded none of them
    assert got["loaded"] == list(PRELOAD)
    assert {"torch", "workbench.train.ahead", "workbench.worldmodel.imagination",
            "workbench.worldmodel.closed_loop_eval"} <= set(got["loaded"])  # what the three workers run
    from multiprocessing import forkserver

    assert got["parent"] == forkserver._forkserver._forkserver_pid != os.getpid()
    assert got["pid"] == again["pid"]  # one worker, both jobs
    assert got["variables"] == {"WORKBENCH_TEST_SET": "set after", "WORKBENCH_TEST_GONE": "here when the pool starts"}


@linux_only
def test_a_worker_takes_the_environment_of_the_process_that_starts_it(monkeypatch):
    from concurrent.futures import ProcessPoolExecutor

    from workbench.workers import pool, worker_context

    monkeypatch.setenv("WORKBENCH_TEST_GONE", "set before the server starts")
    with ProcessPoolExecutor(1, mp_context=worker_context()) as bare:  # (starts the server if it is not running)
        bare.submit(_what_the_worker_has, ()).result()
    monkeypatch.delenv("WORKBENCH_TEST_GONE")
    monkeypatch.setenv("WORKBENCH_TEST_SET", "set since")
    with pool(1) as workers:  # the pools of the evaluations
        got = workers.submit(_what_the_worker_has, ()).result()
    assert got["variables"] == {"WORKBENCH_TEST_SET": "set since", "WORKBENCH_TEST_GONE": None}


@linux_only
def test_the_cpu_of_the_servers_workers_is_counted_in_the_budget():
    from concurrent.futures import ProcessPoolExecutor

    import cpu_budget

    from workbench.workers import worker_context

    before = cpu_budget._cpu_now()
    with ProcessPoolExecutor(1, mp_context=worker_context()) as pool:
        pool.submit(_burn, 0.5).result()
    counted = 0.0
    for _ in range(100):  # the server reaps its worker when the worker's exit reaches it
        counted = cpu_budget._cpu_now() - before
        if counted >= 0.5:
            break
        time.sleep(0.05)
    assert counted >= 0.5, f"a worker's 0.5 CPU s counted as {counted:.2f}"
