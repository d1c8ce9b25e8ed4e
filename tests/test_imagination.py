"""The world summary's jobs and its pool (the same numbers on one process or two: tests/test_ahead.py)."""

import pytest

# Nothing of workbench at module level: the pool's spawned processes import this module to find
# _job_that_dies, and each would import torch for it.


def test_the_jobs_put_the_costliest_first_and_add_the_scratch_rollout_only_when_given():
    from workbench.worldmodel.imagination import jobs

    assert jobs(False)[:4] == [("closed_loop", "adapter"), ("closed_loop", "base"), ("policies", "adapter"),
                               ("policies", "base")]
    assert ("rollout", "scratch") in jobs(True) and ("rollout", "scratch") not in jobs(False)


def _job_that_dies(job):
    """A job whose pool process ends without a word (as one killed for memory would); run in the calling
    process (which takes jobs too), it says so instead of ending the test's own process."""
    import multiprocessing
    import os

    here = multiprocessing.parent_process() is None
    if job == "dies" and not here:
        os._exit(3)
    return {"job": job, "here": here}


def test_a_pool_process_that_dies_is_reported_not_waited_on():
    from workbench.worldmodel.imagination import _run_all

    # two processes: the first job goes to the pool's process, the next to this one, which has the libraries
    assert _run_all(["a", "b"], _job_that_dies, 2) == [{"job": "a", "here": False}, {"job": "b", "here": True}]
    with pytest.raises(RuntimeError, match=r"A process of the world summary's pool ended abruptly \(.*\); nothing "
                                           r"of its jobs \(dies, a\) was kept\. Run it on one process to see the "
                                           r"failure there: workbench demo --processes 1\."):
        _run_all(["dies", "a"], _job_that_dies, 2)
