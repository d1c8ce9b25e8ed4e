"""The demo's rollouts and policy ranking: the same numbers on one process or two."""

import numpy as np
import pytest

from workbench.worldmodel.demo import SCRATCH_MODEL, TRAINED_ADAPTER
from workbench.worldmodel.imagination import WorldSummaryConfig, jobs, world_summary


def test_the_jobs_put_the_costliest_first_and_add_the_scratch_rollout_only_when_given():
    assert jobs(False)[:2] == [("policies", "adapter"), ("policies", "base")]
    assert ("rollout", "scratch") in jobs(True) and ("rollout", "scratch") not in jobs(False)


def test_two_processes_give_the_one_process_numbers_bit_for_bit():
    cfg = WorldSummaryConfig.quick(sampling_steps=1)  # (the demo's quick test: the quick size)
    one = world_summary(TRAINED_ADAPTER, scratch_dir=SCRATCH_MODEL, cfg=cfg, processes=1)
    two = world_summary(TRAINED_ADAPTER, scratch_dir=SCRATCH_MODEL, cfg=cfg, processes=2)
    for report in (one["policies"], two["policies"]):  # (CPU seconds are timings, not results)
        for variant in report["variants"].values():
            variant.pop("cpu_seconds")
    assert one["rollout"] == two["rollout"] and one["policies"] == two["policies"]
    rollout = one["rollout"]
    assert (rollout["episodes"], rollout["frames"], len(rollout["chunks"])) == (2, 31, 2)
    row = rollout["chunks"][0]
    for variant in ("base", "adapter", "swapped", "scratch"):
        assert np.isfinite(row[f"{variant}_hand_error_cm"]) and np.isfinite(row[f"{variant}_moving_psnr"])
    report = one["policies"]
    assert report["episodes"] == 6 and report["tasks"] == ["reach-v3"] and set(report["variants"]) == {
        "base", "adapter"}
    distances = [report["variants"][v]["distance_m"] for v in ("base", "adapter")]
    assert distances[0] != distances[1]  # the adapter changes where the imagined hand ends
    assert -1.0 <= report["variants"]["adapter"]["agreement"]["all"]["rho"] <= 1.0


def _job_that_dies(job):
    """A job whose process ends without a word (as one killed for memory would)."""
    import os

    if job == "dies":
        os._exit(3)
    return {"job": job}


def test_a_pool_process_that_dies_is_reported_not_waited_on():
    from workbench.worldmodel.imagination import _run_all

    assert _run_all(["a", "b"], _job_that_dies, 2) == [{"job": "a"}, {"job": "b"}]
    with pytest.raises(RuntimeError, match=r"A process of the world summary's pool ended abruptly \(.*\); nothing "
                                           r"of its jobs \(a, dies\) was kept\. Run it on one process to see the "
                                           r"failure there: workbench demo --processes 1\."):
        _run_all(["a", "dies"], _job_that_dies, 2)
