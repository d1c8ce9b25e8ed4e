"""Policies judged in imagination: the rank statistics, the shipped recording, the replay as rollouts and
the errors (workbench.worldmodel.policies)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import nonzero_model

from workbench.errors import ConfigError, DataError
from workbench.inspect import rollout
from workbench.worldmodel.policies import (
    SAMPLE_PATH,
    SUCCESS_RADIUS,
    PolicyEpisodes,
    agreement,
    imagine,
    load_policies,
    policy_names,
    rank_agreement,
    rankdata,
    spearman,
    start_clips,
)

torch.set_num_threads(1)


# -- rank statistics ------------------------------------------------------------------------------
def test_ranks_average_ties_as_scipy_does():
    assert rankdata([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert rankdata([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=40).astype(float)  # many ties
    stats = pytest.importorskip("scipy.stats")
    np.testing.assert_array_equal(rankdata(x), stats.rankdata(x))


def test_spearman_on_known_values():
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)  # by hand: ties at 7
    assert spearman([1, 2, 3], [30, 20, 10]) == -1.0
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # 1 - 6 * 2 / (4 * 15)
    assert np.isnan(spearman([1, 2, 3], [4, 4, 4]))  # a constant side has no ranking
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=30), rng.integers(0, 6, size=30)
    stats = pytest.importorskip("scipy.stats")
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)


def _grid(policies: int = 4, starts: int = 5, noise: float = 0.0, seed: int = 0):
    """Episodes of ``policies`` policies from ``starts`` start states; policy p's outcome is p + noise."""
    rng = np.random.default_rng(seed)
    groups = np.repeat([f"p{i}" for i in range(policies)], starts)
    starts_ = np.tile(np.arange(starts), policies)
    sim = np.repeat(np.arange(policies, dtype=float), starts) + rng.normal(0, 0.1, policies * starts)
    return groups, starts_, sim, rng


def test_rank_agreement_bootstraps_start_states():
    groups, starts, sim, rng = _grid()
    same = rank_agreement(sim * 3 + 1, sim, groups, starts, resamples=200)
    assert (same["rho"], same["low"], same["high"]) == (1.0, 1.0, 1.0)
    reverse = rank_agreement(-sim, sim, groups, starts, resamples=200)
    assert (reverse["rho"], reverse["low"], reverse["high"]) == (-1.0, -1.0, -1.0)
    noisy = sim + rng.normal(0, 1.5, sim.shape)
    a = rank_agreement(noisy, sim, groups, starts, resamples=500, seed=3)
    means = [noisy[groups == g].mean() for g in ("p0", "p1", "p2", "p3")]
    assert a["rho"] == spearman(means, [0, 1, 2, 3])   # ρ of the policy means
    assert a["low"] <= a["rho"] <= a["high"] and a["low"] < a["high"]
    assert a == rank_agreement(noisy, sim, groups, starts, resamples=500, seed=3)  # seeded
    assert a["imagined_mean"] == pytest.approx(means)
    # by hand: the bootstrap draws whole start states, the same for every policy
    rng = np.random.default_rng(3)
    boot = []
    for _ in range(500):
        pick = rng.choice(np.arange(5), size=5, replace=True)
        boot.append(spearman([noisy[(groups == g)][pick].mean() for g in ("p0", "p1", "p2", "p3")],
                             [sim[(groups == g)][pick].mean() for g in ("p0", "p1", "p2", "p3")]))
    assert (a["low"], a["high"]) == tuple(np.percentile(np.array(boot)[np.isfinite(boot)], [2.5, 97.5]))


def test_rank_agreement_with_ties_and_strata_equals_the_bootstrap_by_hand():
    """Outcomes with many ties (success counts), resampled within two tasks: every resampled ρ, NaN ones
    (a constant resample) included, equals the loop over resamples with :func:`spearman` to the bit."""
    rng = np.random.default_rng(7)
    tasks, policies, n_starts = ("reach", "push"), ("a", "b", "c", "d"), 5
    rows = [(t, p, 10 * i + s) for i, t in enumerate(tasks) for p in policies for s in range(n_starts)]
    task = np.array([t for t, _, _ in rows])
    groups, starts = np.array([f"{t}/{p}" for t, p, _ in rows]), np.array([s for _, _, s in rows])
    sim = rng.integers(0, 3, len(rows)).astype(float)
    ima = ((starts % 10 == 0) & np.isin(groups, ["reach/c", "push/d"])).astype(float)  # constant without start 0
    got = rank_agreement(ima, sim, groups, starts, task, resamples=300, seed=5)
    rng, boot = np.random.default_rng(5), []
    for _ in range(300):
        picks = {t: rng.choice(np.unique(starts[task == t]), size=n_starts, replace=True) for t in tasks}
        means = [[x[(groups == g) & (starts == s)][0] for s in picks[g.split("/")[0]]]
                 for g in dict.fromkeys(groups.tolist()) for x in (ima, sim)]
        boot.append(spearman([np.mean(m) for m in means[0::2]], [np.mean(m) for m in means[1::2]]))
    boot = np.array(boot)
    assert np.isnan(boot).any() and got["degenerate_resamples"] == np.isnan(boot).sum()
    assert (got["low"], got["high"]) == tuple(np.percentile(boot[np.isfinite(boot)], [2.5, 97.5]))


def test_rank_agreement_with_a_missing_outcome_ranks_it_as_spearman_does():
    """A NaN outcome (an episode that produced none) is ranked above every number, as :func:`spearman` ranks
    it, in every resample: the interval equals the loop over resamples by hand."""
    groups, starts, sim, rng = _grid(seed=2)
    imagined = sim + rng.normal(0, 1.0, sim.shape)
    imagined[[3, 12]] = np.nan
    got = rank_agreement(imagined, sim, groups, starts, resamples=200, seed=4)
    rng, boot = np.random.default_rng(4), []
    for _ in range(200):
        pick = rng.choice(np.arange(5), size=5, replace=True)
        boot.append(spearman([imagined[groups == g][pick].mean() for g in ("p0", "p1", "p2", "p3")],
                             [sim[groups == g][pick].mean() for g in ("p0", "p1", "p2", "p3")]))
    assert (got["low"], got["high"]) == tuple(np.percentile(np.array(boot)[np.isfinite(boot)], [2.5, 97.5]))


def test_rank_agreement_errors_say_what_was_wrong():
    groups, starts, sim, _ = _grid(policies=2)
    with pytest.raises(DataError, match=r"needs at least 3 policies to rank, got 2 \('p0', 'p1'\)"):
        rank_agreement(sim, sim, groups, starts)
    with pytest.raises(DataError, match=r"imagined \(3\), simulated \(10\), groups \(10\).*one entry per episode"):
        rank_agreement(sim[:3], sim, groups, starts)
    with pytest.raises(DataError, match=r"two 1-D sequences of the same length >= 2, got shapes \(3,\) and \(2,\)"):
        spearman([1, 2, 3], [1, 2])
    groups, starts, sim, _ = _grid(policies=3)
    keep = ~((groups == "p1") & (starts == 4))  # p1 has no episode from start state 4
    with pytest.raises(DataError, match=r"group 'p1' has no episode from start state\(s\) \[4\] of its stratum 0; "
                                        r"every group of a stratum needs one episode from each"):
        rank_agreement(sim[keep], sim[keep], groups[keep], starts[keep])


# -- the shipped recording -------------------------------------------------------------------------
def test_the_shipped_recording_is_whole_and_consistent():
    assert SAMPLE_PATH.stat().st_size <= 2_000_000
    ep = load_policies()
    meta = ep.meta
    assert meta["policies"] == policy_names() == ["expert", "expert+noise0.1", "expert+noise0.3", "expert+noise0.6",
                                                  "expert+noise1", "random"]
    assert meta["tasks"] == ["reach-v3", "push-v3"] and meta["starts"] == 4 and meta["frames"] == 61
    assert meta["command"] == ("python -m workbench.worldmodel.policies --tasks reach-v3,push-v3 --starts 4 --frames "
                               "61 --seed 0 --out metaworld_policies.npz")
    n = 6 * 4 * 2
    assert len(ep) == n and ep.actions.shape == (n, 61, 4) and ep.frames.shape[2:] == (64, 64, 3)
    assert ep.frame_index[0] == 0 and ep.frame_index[-1] == 60 and ep.frames.shape[1] == len(ep.frame_index)
    assert np.abs(ep.actions).max() <= 1.0
    # every policy of a (task, start) starts from the same state: same frame, hand and goal
    for task in ep.tasks:
        for s in range(4):
            rows = np.flatnonzero((ep.task == task) & (ep.start == s))
            assert ep.policy[rows].tolist() == ep.policies
            assert all(np.array_equal(ep.frames[rows[0], 0], ep.frames[r, 0]) for r in rows)
            assert np.ptp(ep.ee_pos[rows, 0], axis=0).max() == 0 and np.ptp(ep.goal[rows], axis=0).max() == 0
    # the outcome is the recorded distance at the last frame, success its threshold
    body = np.where((ep.task == "reach-v3")[:, None], ep.ee_pos[:, -1], ep.object_pos[:, -1])
    np.testing.assert_allclose(ep.sim_distance, np.linalg.norm(body - ep.goal, axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(ep.sim_success, ep.sim_distance <= 0.05)
    assert SUCCESS_RADIUS == {"reach-v3": 0.05, "push-v3": 0.05}
    # the policies differ: the expert succeeds everywhere, the random policy nowhere
    assert ep.sim_success[ep.policy == "expert"].all() and not ep.sim_success[ep.policy == "random"].any()


def test_select_and_load_errors(tmp_path):
    ep = load_policies()
    one = ep.select(starts=1, tasks=["push-v3"])
    assert len(one) == 6 and set(one.task) == {"push-v3"} and one.meta["tasks"] == ["push-v3"]
    assert one.frame_index.tolist() == ep.frame_index.tolist()
    with pytest.raises(ConfigError, match=r"--episodes: the number of start states per task must be >= 1, got 0"):
        ep.select(starts=0)
    with pytest.raises(ConfigError, match=r"tasks: 'pick-v3' are not in the recording, which holds "
                                          r"'push-v3', 'reach-v3'"):
        ep.select(tasks=["pick-v3"])
    with pytest.raises(DataError, match=r"Policy recording not found: .*missing.npz. Record one with `python -m "
                                        r"workbench.worldmodel.policies --out"):
        load_policies(tmp_path / "missing.npz")
    np.savez(tmp_path / "part.npz", actions=np.zeros((2, 3, 4)))
    with pytest.raises(DataError, match=r"part.npz lacks 'ee_pos', 'frame_index', .* Record it again"):
        load_policies(tmp_path / "part.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(DataError, match=r"junk.npz is not a policy recording"):
        load_policies(tmp_path / "junk.npz")


# -- the replay in a world model -------------------------------------------------------------------
class Brightness:
    """A stand-in probe for 16x16 frames: the 'position' is the mean colour of the frame (deterministic)."""

    def positions(self, frames):
        return np.asarray(frames, np.float64).reshape(len(frames), -1, 3).mean(axis=1) / 255.0


def tiny_episodes(frames: int = 10) -> PolicyEpisodes:
    """The shipped recording's first start state of each task, cut to ``frames`` frames of 16x16 (every 4th pixel)
    for the tiny model."""
    ep = load_policies().select(starts=1)
    arrays = dict(ep.arrays)
    arrays["frames"] = np.ascontiguousarray(arrays["frames"][:, :, ::4, ::4])
    for key in ("actions", "ee_pos", "object_pos", "proprio"):
        arrays[key] = arrays[key][:, :frames]
    return PolicyEpisodes(arrays, ep.meta, ep.path)


@pytest.fixture(scope="module")
def tiny():
    return nonzero_model()


def test_imagine_scores_the_last_frame_of_each_rollout(tiny):
    ep = tiny_episodes()
    probe = Brightness()
    got = imagine(tiny, ep, steps=2, seed=1, batch=len(ep), hand_probe=probe, object_probe=probe, state=None)
    assert got["final_frames"].shape == (12, 16, 16, 3) and got["cpu_seconds"] > 0
    # the same rollout by hand: start frame and actions of each episode, batched
    video = torch.from_numpy(ep.frames[:, :1]).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)
    start = {"video": video, "ee_pos": torch.from_numpy(ep.ee_pos[:, :1]), "camera": start_clips(ep)["camera"]}
    ro = rollout(tiny, start, torch.from_numpy(ep.actions), steps=2, seed=1, state=None, store=False)
    assert ro.frame_count == 10 and len(ro.chunks) == 3  # 4-frame windows continuing from 1 frame: 4 + 3 + 3
    np.testing.assert_array_equal(got["final_frames"], ro.video[:, -1])
    want = np.linalg.norm(probe.positions(ro.video[:, -1]) - ep.goal, axis=-1)
    np.testing.assert_array_equal(got["distance"], want)
    np.testing.assert_array_equal(got["success"], want <= 0.05)
    # batches of any size give the same frames and distances, bit for bit: one episode per rollout, five (the last
    # rollout holding two), and all twelve; episode e draws its own noise wherever it sits
    for batch in (1, 5, len(ep)):
        again = imagine(tiny, ep, steps=2, seed=1, batch=batch, hand_probe=probe, object_probe=probe, state=None)
        assert np.array_equal(again["final_frames"], got["final_frames"]), batch
        assert np.array_equal(again["distance"], got["distance"]), batch
    # it takes the episode numbers: rows 5..9 rolled out as episodes 0..4 (a batch's own rows) are other samples
    rows = {k: v[5:10] for k, v in start.items()}
    plain = rollout(tiny, rows, torch.from_numpy(ep.actions[5:10]), steps=2, seed=1, state=None, store=False)
    assert not np.array_equal(plain.frame(-1), got["final_frames"][5:10])
    told = rollout(tiny, rows, torch.from_numpy(ep.actions[5:10]), steps=2, seed=1, state=None, store=False,
                   episodes=range(5, 10))
    assert np.array_equal(told.frame(-1), got["final_frames"][5:10])
    base = imagine(tiny, ep, steps=2, seed=1, batch=len(ep), with_adapter=False, hand_probe=probe, object_probe=probe,
                   state=None)
    assert not np.array_equal(base["final_frames"], got["final_frames"])  # the adapter changes the prediction
    report = agreement(got["distance"], ep, resamples=20)
    assert set(report) == {"all", "reach-v3", "push-v3", "success_rate", "episode_rho"}
    assert len(report["all"]["groups"]) == 12 and report["all"]["groups"][0] == "reach-v3/expert"
    assert report["all"]["simulated_mean"] == pytest.approx(ep.sim_distance.tolist())  # one start: the episodes
    # a distance ranks as reported, to 0.01 mm: episodes apart by less (a kernel's last bits) are ties, not an order
    same = np.full(len(ep), 0.3671)
    assert np.isnan(agreement(same + np.arange(len(ep)) * 2e-8, ep, resamples=20)["all"]["rho"])
    assert agreement(same - np.arange(len(ep)) * 2e-5, ep, resamples=20)["episode_rho"] == pytest.approx(
        spearman(-np.arange(len(ep)), ep.sim_distance))


def test_the_cli_runs_without_out_only_with_policies(tmp_path):
    import argparse

    from workbench.worldmodel.evaluate import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([str(tmp_path), "--policies", "--episodes", "1", "--steps", "1"])
    assert args.policies and args.episodes == 1 and args.sampling_steps == 1 and args.out is None
    with pytest.raises(DataError, match=r"workbench eval needs --out DIR .*only --policies runs without it"):
        run(parser.parse_args([str(tmp_path)]))
    from workbench.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"holds no adapter checkpoint"):
        run(args)


def test_the_probe_trains_to_read_the_object():
    from workbench.worldmodel.probe import ProbeTrainConfig

    with pytest.raises(ConfigError, match=r"target.*must be one of hand, object \(what the probe reads.*got 'puck'"):
        ProbeTrainConfig(data="x.h5", target="puck")
    assert ProbeTrainConfig(data="x.h5", target="object").target == "object"


def test_the_report_is_json_ready():
    ep = tiny_episodes()
    rep = agreement(ep.sim_distance + 0.01, ep, resamples=10)
    json.dumps(rep)
    assert rep["all"]["rho"] == 1.0 and rep["episode_rho"] == 1.0


def test_the_shipped_object_probe_reads_the_puck_where_the_expert_pushed_it():
    from workbench.worldmodel.probe import OBJECT_WEIGHTS, shipped_object_probe

    probe = shipped_object_probe()
    assert OBJECT_WEIGHTS.stat().st_size < 1_000_000
    p = probe.provenance
    assert p["target"].startswith("object position") and "push-v3" in p["trained_on"]
    assert p["train_config"]["target"] == "object" and p["held_out_error_cm"]["mean"] < 2.5
    # trained on push episodes half of which the expert drives, so that pushed pucks and the goal region are seen
    assert "--tasks push-v3 " in p["data_command"] and "--expert-share 0.5" in p["data_command"]
    # on the recording's push episodes (another seed than its training data): the last frames' puck, in cm
    ep = load_policies().select(tasks=["push-v3"])
    err = 100 * np.linalg.norm(probe.positions(ep.frames[:, -1]) - ep.object_pos[:, -1], axis=-1)
    assert np.median(err) < 1.5
    at_goal = ep.sim_distance <= 0.05  # the pucks pushed to the goal: each read within 3 cm
    assert at_goal.sum() >= 8 and err[at_goal].max() < 3.0


def test_evaluate_policies_names_the_variants_it_can_replay(tiny):
    from workbench.worldmodel.policies import evaluate_policies

    with pytest.raises(ConfigError, match=r"--variants: 'scratch' cannot be replayed here; choose of 'adapter', "
                                          r"'base' \(scratch needs --scratch RUN_DIR\)"):
        evaluate_policies({"adapter": tiny}, tiny_episodes(), variants=["scratch"], progress=False)
    with pytest.raises(ConfigError, match=r"runs must hold 'adapter'.*got 'scratch'"):
        evaluate_policies({"scratch": tiny}, tiny_episodes(), progress=False)
