"""Policies judged closed loop: the shipped family reads the probes and the goal; the simulator twin asks a policy at
the chunk boundaries with the frames it renders as the data were; `workbench eval --policies` ranks imagined against
simulated outcomes, keeps what was done when a policy fails, and gives the same numbers on any number of processes."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from workbench.errors import ConfigError, PolicyError
from workbench.inspect import closed_loop
from workbench.inspect.recording.closed_loop import Observation
from workbench.worldmodel.policies import load_policies

pytest.importorskip("metaworld")
from workbench.worldmodel import closed_loop_eval as cle  # noqa: E402
from workbench.worldmodel import simulated_record as rec  # noqa: E402
from workbench.worldmodel import simulator_twin as twin  # noqa: E402
from workbench.worldmodel.scripted import HAND_STEP, ScriptedPolicy, family  # noqa: E402
from workbench.worldmodel.sim import RenderingUnavailable  # noqa: E402

FRAMES = 31  # two chunks of the embedded model: frames 0..15, then 16..30 from frame 15


@pytest.fixture(scope="module")
def exp():
    from workbench import AdapterExperiment
    from workbench.worldmodel.demo import TRAINED_ADAPTER

    torch.set_num_threads(1)
    return AdapterExperiment.load(TRAINED_ADAPTER)


@pytest.fixture(scope="module")
def recorded():
    """The shipped recording's start states: reach start 0 and push start 0."""
    return cle.starts_from_recording(load_policies()).select(per_task=1)


def observation(task: str, hand, thing, goal, frames: range, chunk: int = 0, rows: int | None = None) -> Observation:
    state = {"ee_pos": np.asarray(hand, float), "object_pos": np.asarray(thing, float)}
    goal_ = {"task": task, "position": np.asarray(goal, np.float32)}
    if rows is None:
        return Observation(frame=np.zeros((64, 64, 3), np.uint8), state=state, goal=goal_, chunk=chunk, frame_index=0,
                           frames=frames, action_dim=4, batched=False)
    return Observation(frame=np.zeros((rows, 64, 64, 3), np.uint8), state={k: v[None].repeat(rows, 0) for k, v in
                                                                               state.items()},
                       goal={"task": np.array([task] * rows), "position": goal_["position"][None].repeat(rows, 0)},
                       chunk=chunk, frame_index=0, frames=frames, action_dim=4, batched=True)


def test_the_expert_reads_the_probes_and_the_goal_and_plans_a_chunk_by_dead_reckoning():
    hand, goal = np.array([0.0, 0.6, 0.15]), np.array([0.1, 0.7, 0.2], np.float32)
    got = ScriptedPolicy(0.0)(observation("reach-v3", hand, np.zeros(3), goal, range(0, 5)))
    # Meta-World's reach expert moves at 5 x (goal - hand); the plan moves the hand by HAND_STEP per unit of action
    want, h = [], hand.copy()
    for _ in range(5):
        a = np.clip(np.append(5.0 * (goal - h), 0.0), -1, 1)
        want.append(a)
        h = h + HAND_STEP * a[:3]
    np.testing.assert_allclose(got, np.array(want), rtol=0, atol=1e-6)
    # push: once the hand is at the puck, the puck is planned to move with it, so the whole chunk pushes at the goal
    # (were it left behind, the expert would go back up above it after a frame or two)
    puck = np.array([0.0, 0.6, 0.02])
    push = ScriptedPolicy(0.0)(observation("push-v3", puck + [0.005, 0, 0.01], puck, [0.1, 0.8, 0.02], range(0, 10)))
    towards = (np.array([0.1, 0.8]) - puck[:2]) / np.linalg.norm([0.1, 0.2])
    assert (push[:, :2] @ towards > 0.4).all() and (push[:, 2] <= 0).all() and (push[:, 3] == 0.6).all(), push


def test_the_familys_draws_depend_on_the_episode_and_chunk_never_on_the_batch():
    assert list(family()) == ["expert", "expert+noise0.1", "expert+noise0.3", "expert+noise0.6", "expert+noise1",
                              "random"]
    noisy, rnd = ScriptedPolicy(0.3), ScriptedPolicy(None)
    one = observation("reach-v3", [0.0, 0.6, 0.15], np.zeros(3), [0.1, 0.7, 0.2], range(16, 31), chunk=1)
    three = observation("reach-v3", [0.0, 0.6, 0.15], np.zeros(3), [0.1, 0.7, 0.2], range(16, 31), chunk=1, rows=3)
    for policy in (noisy, rnd):
        alone = policy(one)
        batched = policy(three)
        assert batched.shape == (3, 15, 4) and all(np.array_equal(b, alone) for b in batched)
        other_chunk = policy(observation("reach-v3", [0.0, 0.6, 0.15], np.zeros(3), [0.1, 0.7, 0.2], range(16, 31),
                                         chunk=2))
        assert not np.array_equal(other_chunk, alone)
    # the random policy ignores what it sees: the same goal and chunk give the same actions wherever the hand is
    moved = observation("reach-v3", [0.2, 0.5, 0.3], np.ones(3), [0.1, 0.7, 0.2], range(16, 31), chunk=1)
    assert np.array_equal(rnd(moved), rnd(one)) and not np.array_equal(noisy(moved), noisy(one))
    assert (np.abs(rnd(one)) <= 1).all() and np.abs(noisy(one) - ScriptedPolicy(0.0)(one)).max() > 0.1
    with pytest.raises(ConfigError, match=r"expert: the observation holds no 'object_pos'; read them with the state "
                                          r"readers 'object_probe', 'probe'"):
        ScriptedPolicy(0.0)(Observation(frame=np.zeros((64, 64, 3), np.uint8), state={"ee_pos": np.zeros(3)},
                                        goal=one.goal, chunk=0, frame_index=0, frames=range(0, 2), action_dim=4,
                                        batched=False))


def test_fresh_start_states_are_made_as_the_recordings_were(recorded):
    try:
        same = cle.fresh_starts(["reach-v3"], 1, seed=0)  # the recording's seed: its start state, bit for bit
    except RenderingUnavailable as err:
        pytest.skip(str(err))
    reach = recorded.select(tasks=["reach-v3"])
    for key in ("frame", "ee_pos", "goal", "object_pos", "task_index", "index"):
        np.testing.assert_array_equal(getattr(same, key), getattr(reach, key), err_msg=key)
    fresh = cle.fresh_starts(["reach-v3", "push-v3"], 2, seed=1)
    assert fresh.tasks == ["reach-v3", "push-v3"] and fresh.per_task == 2 and fresh.meta["seed"] == 1
    assert not np.array_equal(fresh.frame[0], same.frame[0]) and len({tuple(g) for g in fresh.goal}) == 4
    clips = fresh.clips()
    assert clips["video"].shape == (4, 3, 1, 64, 64) and clips["goal"]["task"].tolist() == fresh.task.tolist()


class Recorder:
    """Wraps a policy and keeps every observation it is given."""

    def __init__(self, policy):
        self.policy, self.name, self.seen = policy, getattr(policy, "name", "recorder"), []

    def __call__(self, obs):
        self.seen.append(obs)
        return self.policy(obs)


def test_the_simulator_asks_the_policy_at_the_chunk_boundaries_with_the_frames_it_renders(recorded):
    from workbench.worldmodel.policies import _reset
    from workbench.worldmodel.probe import shipped_probe
    from workbench.worldmodel.sim import DEFAULT_CAMERA, TaskEnv

    reach = recorded.select(tasks=["reach-v3"])
    policy = Recorder(ScriptedPolicy(0.0))
    try:
        got = twin.simulate(policy, reach, frames=FRAMES, window=16, context=1)
    except RenderingUnavailable as err:
        pytest.skip(str(err))
    finally:
        twin.close_envs()
    assert [(o.chunk, o.frame_index, o.frames) for o in policy.seen] == [(0, 0, range(0, 16)), (1, 15, range(16, 31))]
    first = policy.seen[0]
    assert np.array_equal(first.frame[0], reach.frame[0])  # the start frame, rendered as the recording's was
    np.testing.assert_array_equal(first.state["ee_pos"], shipped_probe().positions(reach.frame[:1]))
    assert first.goal["position"].tolist() == reach.goal.tolist()
    # the same actions replayed open loop in a fresh simulator: frame 15 is what the policy saw, the end the outcome
    env = TaskEnv("reach-v3", 64, DEFAULT_CAMERA, max_steps=200)
    try:
        state, _ = _reset(env, reach.meta["seed"], int(reach.task_index[0]), int(reach.index[0]))
        for t in range(FRAMES - 1):
            if t == 15:
                assert np.array_equal(env.render(), policy.seen[1].frame[0])
            for _ in range(2):
                state, *_ = env.env.step(got["actions"][0, t])
        assert np.array_equal(env.render(), got["final_frames"][0])
    finally:
        env.close()
    assert got["distance"][0] == pytest.approx(np.linalg.norm(state[:3] - state[-3:]), abs=1e-12)
    assert got["distance"][0] < 0.06  # the expert nears the goal within two chunks


POLICY_FILE = """
import numpy as np


def straight(obs):
    rows = []
    for o in obs.rows():
        rows.append(np.tile(np.append(np.clip(8 * (o.goal["position"] - o.state["ee_pos"]), -1, 1), 0.0),
                            (len(o.frames), 1)))
    return np.stack(rows)


def lost(obs):
    if obs.chunk == 1:
        raise RuntimeError("the arm is out of view")
    return np.zeros((obs.episodes, len(obs.frames), 4))
"""


def test_eval_ranks_closed_loop_and_keeps_what_was_done_when_a_policy_fails(tmp_path, capsys, exp, recorded):
    from workbench.cli import main
    from workbench.worldmodel.demo import TRAINED_ADAPTER

    (tmp_path / "mine.py").write_text(POLICY_FILE)
    out = tmp_path / "closed"
    args = ["eval", str(TRAINED_ADAPTER), "--policies", "--no-family", "--policy", "expert", "--policy", "random",
            "--policy", f"{tmp_path / 'mine.py'}:straight", "--policy", f"{tmp_path / 'mine.py'}:lost",
            "--start-states", "recording", "--episodes", "1", "--tasks", "reach-v3", "--frames", str(FRAMES),
            "--steps", "1", "--variants", "adapter", "--out", str(out), "--no-progress"]
    try:
        assert main(args) == 2
    finally:
        twin.close_envs()
    printed = capsys.readouterr()
    assert ("error: The policy 'lost' (workbench_policy_mine.lost, " in printed.err and
            "mine.py:13) raised RuntimeError: the arm is out of view at chunk 1 (it saw frame 15 and was asked for "
            f"the actions at frames 16..30). Fix the policy and run again. What was finished before it failed is kept "
            f"in {out}/metrics.json." in printed.err), printed.err
    report = json.loads((out / "metrics.json").read_text())
    assert report["policies"][:3] == ["expert", "random", f"{tmp_path / 'mine.py'}:straight"]
    assert report["incomplete"]["error"].startswith("The policy 'lost'")
    lost = f"{tmp_path / 'mine.py'}:lost"
    assert report["incomplete"]["jobs_not_done"] == [f"{lost} in the simulator",
                                                     f"{lost} in base + adapter (episodes 0..0)"]
    # the three policies done: the simulator's and the imagined outcomes, as computed directly
    reach = recorded.select(tasks=["reach-v3"])
    rows = {r["policy"]: i for i, r in enumerate(report["episode_rows"])}
    for key, policy in [("expert", ScriptedPolicy(0.0)), ("random", ScriptedPolicy(None))]:
        sim = twin.simulate(policy, reach, frames=FRAMES, window=16, context=1)
        imagined = cle.imagine_closed_loop(exp.model, reach, policy, frames=FRAMES, steps=1, gate_scale=2.0)
        assert report["simulated_distance_m"][rows[key]] == pytest.approx(sim["distance"][0], abs=1e-5)
        assert report["variants"]["adapter"]["distance_m"][rows[key]] == pytest.approx(imagined["distance"][0],
                                                                                        abs=1e-5)
    twin.close_envs()
    assert report["variants"]["adapter"]["distance_m"][rows[lost]] is None
    assert report["simulated_distance_m"][rows[lost]] is None
    entry = next(e for e in report["per_policy"] if e["policy"] == "expert")
    assert set(entry) == {"task", "policy", "simulator", "probe_on_sim", "adapter"}
    assert entry["simulator"]["mean_distance_m"] == pytest.approx(report["simulated_distance_m"][rows["expert"]])
    assert "reach-v3 / expert" in printed.out and "incomplete: 2 jobs not done" in printed.out


def test_the_numbers_do_not_depend_on_the_process_count(tmp_path, recorded):
    """Two processes, each running jobs (a batch of episodes of a policy in the world model), give the numbers one
    process gives. (A simulator job runs its episodes one by one, the same in any process.)"""
    from workbench.worldmodel.demo import TRAINED_ADAPTER

    (tmp_path / "mine.py").write_text(POLICY_FILE)
    policies = {"random": "random", "straight": f"{tmp_path / 'mine.py'}:straight"}
    plan = cle.Plan({"adapter": str(TRAINED_ADAPTER)}, recorded, policies, FRAMES, 1, 0, 2.0, 1, 16, 1)
    assert cle.jobs(plan, ["adapter"], simulator=True)[:3] == [
        ("sim", "random"), ("imagine", "adapter", "random", 0), ("imagine", "adapter", "random", 1)]
    todo = cle.jobs(plan, ["adapter"], simulator=False)
    try:
        one = cle.execute(todo, plan)
        two = cle.execute(todo, plan, processes=2)
    finally:
        twin.close_envs()
    by_job = {d["job"]: d for d in one}
    assert len(two) == len(todo) and len({d["process"] for d in two} - {os.getpid()}) == 2  # both processes worked
    for d in two:
        np.testing.assert_array_equal(d["distance"], by_job[d["job"]]["distance"], err_msg=str(d["job"]))
    # in batches of 4, each model's two policies share one rollout of both start states, in the pool's processes
    wide = dataclasses.replace(plan, batch=4)
    both = cle.jobs(wide, ["base", "adapter"], simulator=False)
    assert [len(group) for group in cle.groups(both, wide)] == [2, 2]
    try:
        shared = cle.execute(both, wide, processes=2)
    finally:
        twin.close_envs()
    assert len(shared) == 4 and os.getpid() not in {d["process"] for d in shared}
    for d in shared:
        if d["job"][1] == "adapter":
            alone = np.concatenate([by_job[("imagine", "adapter", d["job"][2], lo)]["distance"] for lo in (0, 1)])
            np.testing.assert_array_equal(d["distance"], alone, err_msg=str(d["job"]))
    with pytest.raises(ConfigError, match=r"processes=2: each process loads the runs from their directories .*, "
                                          r"but the policy 'f' is an object\. Pass directories and specs, or "
                                          r"processes=1\."):
        cle.execute(todo, cle.Plan(plan.runs, recorded, {"f": lambda o: o}, FRAMES, 1, 0, 2.0, 1, 16, 1),
                    processes=2)


def test_policies_that_share_a_rollout_get_the_numbers_they_get_alone(exp, recorded):
    """Two start states fill few rows of a batch of 16: the three policies' imagined jobs run as one rollout of six
    episodes (each start state's noise shared by its policies), with each job's numbers bit for bit as alone."""
    policies = {"expert": "expert", "random": "random", "noisy": "expert+noise0.3"}
    plan = cle.Plan({"adapter": exp}, recorded, policies, FRAMES, 1, 0, 2.0, 16, 16, 1)
    todo = cle.jobs(plan, ["adapter"], simulator=True)
    grouped = cle.groups(todo, plan)
    assert grouped == [[("sim", "expert")], [("imagine", "adapter", k, 0) for k in policies], [("sim", "random")],
                       [("sim", "noisy")]]
    together = cle.run_group(grouped[1], plan)
    assert [d["job"] for d in together] == grouped[1]
    for d in together:
        alone = cle.run_job(d["job"], plan)
        assert d["distance"].shape == (2,) and np.array_equal(d["distance"], alone["distance"]), d["job"]
    assert len({tuple(d["distance"]) for d in together}) == 3  # three policies, three outcomes
    # a batch of one start state holds one policy's job: nothing to share
    assert cle.groups(todo, cle.Plan({}, recorded, policies, FRAMES, 1, 0, 2.0, 2, 16, 1)) == [[job] for job in todo]


def test_the_numbers_do_not_depend_on_the_batch_size(exp, recorded):
    one = cle.evaluate_closed_loop({"adapter": exp}, recorded, ["expert"], frames=FRAMES, steps=1, batch=1,
                                   variants=["adapter"], simulator=False, progress=False)
    two = cle.evaluate_closed_loop({"adapter": exp}, recorded, ["expert"], frames=FRAMES, steps=1, batch=2,
                                   variants=["adapter"], simulator=False, progress=False)
    assert one["batch"] == 1 and two["batch"] == 2
    assert one["variants"]["adapter"]["distance_m"] == two["variants"]["adapter"]["distance_m"]


def test_closed_loop_errors_say_what_was_wrong(exp, recorded):
    run = {"adapter": exp}
    with pytest.raises(ConfigError, match=r"--variants: 'scratch' cannot be run here; choose of 'adapter', 'base' "
                                          r"\(scratch needs --scratch RUN_DIR\)"):
        cle.evaluate_closed_loop(run, recorded, ["expert"], variants=["scratch"], progress=False)
    with pytest.raises(ConfigError, match=r"policy 'expert' is given twice"):
        cle.evaluate_closed_loop(run, recorded, ["expert", "expert"], progress=False)
    with pytest.raises(ConfigError, match=r"--batch must be an int >= 1 \(episodes per rollout call\), got 0"):
        cle.evaluate_closed_loop(run, recorded, ["expert"], batch=0, progress=False)
    with pytest.raises(PolicyError, match=r"policy 'nowhere:act': no module 'nowhere' on the path"):
        cle.evaluate_closed_loop(run, recorded, ["expert", "nowhere:act"], progress=False)
    with pytest.raises(ConfigError, match=r"tasks: 'pick-place-v3' have no start states here; these do: 'push-v3', "
                                          r"'reach-v3'"):
        recorded.select(tasks=["pick-place-v3"])
    # a policy of your own, closed loop on the shipped world model, straight from the library
    clips = recorded.clips()
    run_ = closed_loop(exp.model, clips, ScriptedPolicy(0.0), frames=FRAMES, steps=1, state="probe",
                       observe=("probe", "object_probe"), gate_scale=2.0, store=False)
    assert run_.actions.shape == (2, FRAMES, 4) and sorted(run_.observations[1].state) == ["ee_pos", "object_pos"]


# One policy from reach start 0 and push start 0 in the simulator twin, under the kernels the record names (the push
# outcome follows the probes' last digits through contact), in a process of its own: what it printed.
AGAIN = """
import json, torch
from workbench.worldmodel import closed_loop_eval as cle
from workbench.worldmodel import simulator_twin as twin
from workbench.worldmodel.policies import load_policies
from workbench.worldmodel.scripted import ScriptedPolicy
starts = cle.starts_from_recording(load_policies()).select(per_task=1)
got = twin.simulate(ScriptedPolicy(0.3), starts, frames=61, window=16, context=1)
print(json.dumps({"kernels": torch.backends.cpu.get_cpu_capability(), "distance": got["distance"].tolist()}))
"""


def test_the_shipped_record_of_simulated_outcomes_is_what_the_simulator_gives(recorded):
    """The demo ranks its closed loops against a shipped record of the simulator twin's outcomes: made by the command
    it names, from the recording's start states (their fingerprints), and the simulator gives the same outcomes again
    (one policy from reach start 0 and push start 0, here)."""
    import subprocess
    import sys
    from importlib.metadata import version

    record = json.loads(rec.SIMULATED_PATH.read_text())
    assert record["command"] == rec.RECORD_COMMAND and record["command"].startswith(
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m workbench.worldmodel.simulated_record --out ")
    assert record["kernels"] == {"torch": "AVX2", "onednn_max_cpu_isa": "AVX2", "cpu_vendor": "AuthenticAMD"}
    assert len(record["date"]) == 10 and record["date"][:2] == "20" and record["versions"]["metaworld"] == version(
        "metaworld")
    assert record["decision_rule"] == {"frames": 61, "window": 16, "context": 1, "seed": 0}
    everything = cle.starts_from_recording(load_policies())
    assert [(r["task"], r["index"], r["sha256"]) for r in record["start_states"]["rows"]] == list(
        zip(everything.task.tolist(), everything.index.tolist(), rec.start_digests(everything), strict=True))
    assert len(everything) == 8 and record["policies"] == list(family())
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", AGAIN], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode and "RenderingUnavailable" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout.strip().splitlines()[-1])
    assert again["kernels"] == "AVX2"
    rows = [0, 4]  # reach start 0 and push start 0 in the record's order
    assert recorded.task.tolist() == ["reach-v3", "push-v3"]
    # The push outcome follows the probes' last bits through contact, and those follow the CPU's maker even with
    # the same AVX2 kernels (the module's RECORD_COMMAND): on another maker's CPU only the reach row is checked.
    same = slice(None) if rec.cpu_vendor() == record["kernels"]["cpu_vendor"] else slice(0, 1)
    np.testing.assert_allclose(again["distance"][same],
                               [record["simulated_distance_m"]["expert+noise0.3"][r] for r in rows][same],
                               rtol=0, atol=2e-5)
    # what the demo reads for them: the same numbers, in its start states' order
    sims = rec.load_simulated(recorded, ["expert+noise0.3", "random"], frames=61)
    assert (sims["window"], sims["context"], sims["record"]) == (16, 1, rec.SIMULATED_PATH.name)
    assert [d["job"] for d in sims["jobs"]] == [("sim", "expert+noise0.3"), ("sim", "random")]
    np.testing.assert_allclose(sims["jobs"][0]["distance"][same], again["distance"][same], rtol=0, atol=2e-5)
    assert sims["jobs"][1]["distance"].tolist() == [record["simulated_distance_m"]["random"][r] for r in rows]


def test_a_record_that_does_not_fit_is_refused_with_the_command_that_makes_it(tmp_path, recorded, exp):
    from workbench.errors import DataError

    again = (r"Make it again with `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m "
             r"workbench\.worldmodel\.simulated_record --out .*` \(needs Meta-World\)")
    with pytest.raises(DataError, match=r"record of closed-loop outcomes is missing: .*nowhere\.json\. " + again):
        rec.load_simulated(recorded, ["expert"], frames=61, path=tmp_path / "nowhere.json")
    with pytest.raises(DataError, match=r"holds episodes of 61 frames with policy seed 0, but these are 31 frames "
                                        r"with seed 0\. " + again):
        rec.load_simulated(recorded, ["expert"], frames=31)
    with pytest.raises(DataError, match=r"holds no outcomes of 'mine.py:act'; it holds 'expert', "):
        rec.load_simulated(recorded, ["expert", "mine.py:act"], frames=61)
    moved = cle.StartStates({**recorded.arrays, "frame": recorded.frame.copy()}, dict(recorded.meta))
    moved.frame[1, 0, 0, 0] ^= 1  # one grey level of one pixel of push start 0
    with pytest.raises(DataError, match=r"was made from another start state push-v3 #0 \(recorded start states "
                                        r"\(metaworld_policies\.npz\)\): its outcomes belong to the start states of "
                                        r"metaworld_policies\.npz\. " + again):
        rec.load_simulated(moved, ["expert"], frames=61)
    (tmp_path / "old.json").write_text(json.dumps({"format": 0}))
    with pytest.raises(DataError, match=r"old\.json: format 0, but this version reads format 1\. " + again):
        rec.load_simulated(recorded, ["expert"], frames=61, path=tmp_path / "old.json")
    rec.check_rule(exp.model, 16, 1)  # the embedded model's chunks: the record's
    with pytest.raises(DataError, match=r"was made for a world model of 8-frame chunks continuing from 1 frame\(s\), "
                                        r"where the policies choose their actions; this model's chunks are 16 frames "
                                        r"from 1\. Judge it against the simulator itself: workbench eval RUN "
                                        r"--policies"):
        rec.check_rule(exp.model, 8, 1)
