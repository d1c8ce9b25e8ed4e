"""Closed-loop evaluation: a policy chooses each chunk's actions from the frames the model produced; the result is
the open-loop rollout of the actions it chose, bit for bit; a policy that misbehaves is named and stopped, and the
chunks done are kept."""

from __future__ import annotations

import functools
import re
import sys

import numpy as np
import pytest
import torch
from conftest import nonzero_model

from workbench.errors import InspectError, PolicyError
from workbench.inspect import StateReader, closed_loop, rollout
from workbench.inspect.recording.closed_loop import (
    ClosedLoop,
    Observation,
    Policy,
    act,
    chunk_schedule,
    describe_policy,
    load_policy,
)

STEPS = 2  # the tiny model's clip: 4 frames of 16x16, continuing from 1: chunks add 3 frames each


@pytest.fixture(scope="module")
def model():
    return nonzero_model()


def start(b: int | None = None, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = b or 1
    clip = {"video": torch.rand(n, 3, 1, 16, 16, generator=g) * 2 - 1, "camera": torch.rand(n, 12, generator=g)}
    return clip if b else {k: v[0] for k, v in clip.items()}


def light(frames: np.ndarray) -> np.ndarray:
    """A stand-in state reader: the last frame's mean colour in [0, 1], [B, 3]."""
    return frames[:, -1].reshape(len(frames), -1, 3).mean(axis=1) / 255.0


LIGHT = StateReader(light, keys=("light",))


class Steer:
    """A policy whose actions depend on what it sees (the light reading and the frame itself), so that a closed loop
    differs from any fixed action sequence; it records every observation it is given."""

    name = "steer"

    def __init__(self, fail_at: int | None = None, returns=None):
        self.seen: list[Observation] = []
        self.fail_at, self.returns = fail_at, returns

    def __call__(self, obs: Observation):
        self.seen.append(obs)
        if obs.chunk == self.fail_at:
            if self.returns is None:
                raise ValueError("the gripper is lost")
            return self.returns(obs)
        light_ = np.atleast_2d(obs.state["light"])                       # [B, 3]
        frame_mean = np.atleast_2d(obs.image.mean(dim=(-1, -2)).numpy())  # [B, 3]
        row = np.concatenate([light_[:, :2] * 2 - 1, frame_mean[:, :1], np.full((len(light_), 1), obs.chunk)], 1)
        out = np.repeat(row[:, None], len(obs.frames), axis=1) * np.linspace(0.5, 1, len(obs.frames))[None, :, None]
        return out if obs.batched else out[0]


def test_chunk_schedule_asks_for_the_frames_each_chunk_adds():
    # worked by hand: 4-frame windows continuing from 1 frame; chunk 0 takes frames 0..3, then 3 new frames each
    assert chunk_schedule(4, 1, 10) == [(0, range(0, 4)), (3, range(4, 7)), (6, range(7, 10))]
    assert chunk_schedule(4, 1, 8) == [(0, range(0, 4)), (3, range(4, 7)), (6, range(7, 8))]
    assert chunk_schedule(5, 2, 9) == [(1, range(0, 5)), (4, range(5, 8)), (7, range(8, 9))]
    with pytest.raises(InspectError, match=r"needs 1 <= context < window and frames >= context \+ 1"):
        chunk_schedule(4, 1, 1)


@pytest.mark.parametrize("b", [None, 2])
def test_a_closed_loop_is_the_open_loop_rollout_of_the_actions_it_chose(model, b):
    clip = start(b)
    policy = Steer()
    run = closed_loop(model, clip, policy, frames=10, steps=STEPS, seed=3, observe=LIGHT)
    assert isinstance(run, ClosedLoop) and run.policy.startswith("'steer' (test_closed_loop.Steer, ")
    ro = run.rollout
    assert ro.frame_count == 10 and [c.start for c in ro.chunks] == [0, 3, 6]
    # the policy was asked at the frames the schedule gives, and saw the frames the model had produced there
    assert [(o.chunk, o.frame_index, o.frames) for o in policy.seen] == [
        (k, seen, asked) for k, (seen, asked) in enumerate(chunk_schedule(4, 1, 10))]
    assert run.observations == policy.seen
    video = ro.video if b else ro.video[None]
    for obs in policy.seen:
        frame = obs.frame if b else obs.frame[None]
        assert np.array_equal(frame, video[:, obs.frame_index])
        np.testing.assert_array_equal(np.atleast_2d(obs.state["light"]), light(video[:, obs.frame_index][:, None]))
        assert obs.batched == (b is not None) and obs.action_dim == 4 and obs.goal is None
    # the actions it returned are the episode's actions at the frames it was asked for
    actions = run.actions if b else run.actions[None]
    assert actions.shape == (b or 1, 10, 4)
    for obs in policy.seen:
        chose = np.asarray(Steer()(obs), np.float32)
        np.testing.assert_array_equal(actions[:, obs.frames.start:obs.frames.stop].numpy(), chose if b else chose[None])
    assert len({tuple(np.round(actions[0, f].numpy(), 6)) for f in (1, 5, 8)}) == 3  # it steered: not one action
    # the same actions, open loop: the same rollout, bit for bit
    again = rollout(model, clip, run.actions, steps=STEPS, seed=3)
    assert np.array_equal(again.video, ro.video)
    assert all(torch.equal(a.trajectory.final, c.trajectory.final) for a, c in zip(again.chunks, ro.chunks))


def test_chunks_and_frames_give_the_episode_length(model):
    by_chunks = closed_loop(model, start(), Steer(), chunks=3, steps=STEPS, observe=LIGHT)
    by_frames = closed_loop(model, start(), Steer(), frames=10, steps=STEPS, observe=LIGHT)
    assert by_chunks.rollout.frame_count == 10 and np.array_equal(by_chunks.rollout.video, by_frames.rollout.video)
    # the frozen base alone, closed loop: the base's open-loop rollout of the actions it chose, not the adapter's
    alone = closed_loop(model, start(), Steer(), chunks=3, steps=STEPS, observe=LIGHT, with_adapter=False)
    assert np.array_equal(rollout(model, start(), alone.actions, steps=STEPS, with_adapter=False).video,
                          alone.rollout.video)
    assert not np.array_equal(rollout(model, start(), alone.actions, steps=STEPS).video, alone.rollout.video)
    for kwargs, message in [({}, r"give the episode's length as frames= or as chunks=, one of the two"),
                            ({"frames": 10, "chunks": 3}, r"one of the two \(got frames=10, chunks=3\)"),
                            ({"chunks": 0}, r"chunks must be an int >= 1, got 0"),
                            ({"frames": 1}, r"frames must be an int >= 2 .*got 1"),
                            ({"chunks": 2, "with_adapter": "off"},
                             r"^closed_loop: with_adapter='off' is not allowed: it takes True \(base \+ adapter\) or "
                             r"False \(the frozen base alone\)\.$")]:
        with pytest.raises(InspectError, match=message):
            closed_loop(model, start(), Steer(), steps=STEPS, **kwargs)
    with pytest.raises(InspectError, match=r"observe='recorded' is not a reading"):
        closed_loop(model, start(), Steer(), chunks=1, observe="recorded")
    with pytest.raises(InspectError, match=r"observe= gives 'light' from two readers"):
        closed_loop(model, start(), Steer(), chunks=1, observe=[LIGHT, StateReader(light, keys=("light",))])
    with pytest.raises(InspectError, match=r"policy must be a callable of an Observation, got str"):
        closed_loop(model, start(), "expert", chunks=1)


def test_the_goal_is_the_policys_alone_and_rows_split_a_batch(model):
    clip = {**start(2), "goal": {"position": np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]), "task": ["a", "b"]}}
    seen = []

    def per_episode(obs):
        seen.append(obs)
        return np.stack([np.full((len(o.frames), 4), o.goal["position"][0]) for o in obs.rows()])

    run = closed_loop(model, clip, per_episode, chunks=2, steps=STEPS, observe=LIGHT)
    plain = rollout(model, {k: v for k, v in clip.items() if k != "goal"}, run.actions, steps=STEPS)
    assert np.array_equal(plain.video, run.rollout.video)  # the goal never reached the model
    rows = seen[1].rows()
    assert [r.goal["task"] for r in rows] == ["a", "b"] and rows[1].goal["position"].tolist() == [0.4, 0.5, 0.6]
    assert rows[1].frame.shape == (16, 16, 3) and rows[1].state["light"].shape == (3,)
    assert rows[1].image.shape == (3, 16, 16) and seen[1].image.shape == (2, 3, 16, 16)
    assert seen[1].action_shape == (2, 3, 4) and rows[0].action_shape == (3, 4) and seen[1].episodes == 2
    assert torch.equal(run.actions[:, :, 0], torch.tensor([0.1, 0.4])[:, None].expand(2, 7))


# -- a policy that misbehaves ----------------------------------------------------------------------------------
def _at(chunk: int, seen: int, frames: str) -> str:
    return re.escape(f"at chunk {chunk} (it saw frame {seen} and was asked for the actions at {frames})")


@pytest.mark.parametrize("returns, what, allowed", [
    (None, r"raised ValueError: the gripper is lost", r"Fix the policy and run again\."),
    (lambda o: np.zeros((3,)), re.escape("returned a ndarray of shape (3,) and dtype float64"),
     re.escape("it must return an array of shape (3, 4): one row of 4 finite numbers per frame asked for")),
    (lambda o: None, re.escape("returned NoneType None"), re.escape("an array of shape (3, 4)")),
    (lambda o: [[0.0] * 4] * 2, re.escape("returned a list of shape (2, 4)"), re.escape("shape (3, 4)")),
    (lambda o: np.full((3, 4), "up"), re.escape("returned a ndarray of shape (3, 4) and dtype <U2"),
     re.escape("shape (3, 4)")),
    (lambda o: np.array([[0, 0, 0, 0], [np.nan, 0, 0, 0], [0, np.inf, -np.inf, 0]]),
     re.escape("returned 3 non-finite value(s) (NaN or inf)") + ".*" + re.escape(": frame 8; frame 9."),
     re.escape("Actions must be finite numbers: an array of shape (3, 4)")),
])
def test_a_policy_that_misbehaves_is_named_and_the_chunks_done_are_kept(model, returns, what, allowed):
    policy = Steer(fail_at=2, returns=returns)
    with pytest.raises(PolicyError) as caught:
        closed_loop(model, start(), policy, frames=10, steps=STEPS, observe=LIGHT)
    message = str(caught.value)
    assert re.search(r"^The policy 'steer' \(test_closed_loop\.Steer, .*test_closed_loop\.py:\d+\) ", message), message
    assert re.search(what, message) and re.search(allowed, message), message
    assert re.search(_at(2, 6, "frames 7..9"), message), message
    # the two chunks done before it are kept, bit for bit those of a closed loop that stopped there
    kept = caught.value.result
    assert isinstance(kept, ClosedLoop) and len(kept.rollout.chunks) == 2 and len(kept.observations) == 2
    two = closed_loop(model, start(), Steer(), chunks=2, steps=STEPS, observe=LIGHT)
    assert np.array_equal(kept.rollout.video, two.rollout.video) and torch.equal(kept.actions, two.actions)
    assert caught.value.observation.chunk == 2 and caught.value.observation is policy.seen[-1]
    if returns is None:
        assert isinstance(caught.value.__cause__, ValueError)


def test_a_batched_policy_is_told_the_batched_shape_and_which_episode_went_wrong(model):
    def half_nan(obs):
        out = np.zeros((2, len(obs.frames), 4))
        if obs.chunk == 1:
            out[1, 0, 2] = np.nan
        return out

    with pytest.raises(PolicyError, match=re.escape("1 non-finite value(s) (NaN or inf) ") + _at(1, 3, "frames 4..6")
                       + re.escape(": episode 1, frame 4. Actions must be finite numbers: an array of shape "
                                   "(2, 3, 4): for each of the 2 episodes of the observation")):
        closed_loop(model, start(2), half_nan, chunks=3, steps=STEPS)
    with pytest.raises(PolicyError, match=re.escape("returned a ndarray of shape (4, 4) and dtype float64 ")
                       + _at(0, 0, "frames 0..3") + re.escape("; it must return an array of shape (2, 4, 4)")) as c:
        closed_loop(model, start(2), lambda obs: np.zeros((4, 4)), chunks=3, steps=STEPS)
    assert c.value.result is None  # it failed at chunk 0: nothing was computed


def test_a_policy_is_described_by_its_name_and_where_it_was_defined():
    def reach_it(obs):
        return obs

    here = r"test_closed_loop\.py:\d+\)$"
    assert re.match(r"^'reach_it' \(test_closed_loop\.test_a_policy_is_described_by_its_name_and_where_it_was_"
                    r"defined\.<locals>\.reach_it, .*" + here, describe_policy(reach_it))
    assert re.match(r"^'reach_it' \(.*\.reach_it, .*" + here, describe_policy(functools.partial(reach_it)))
    assert re.match(r"^'steer' \(test_closed_loop\.Steer, .*" + here, describe_policy(Steer()))
    assert isinstance(Steer(), Policy) and isinstance(reach_it, Policy) and not isinstance("x", Policy)
    obs = Observation(frame=np.zeros((8, 8, 3), np.uint8), state={}, goal=None, chunk=0, frame_index=0,
                      frames=range(0, 3), action_dim=None, batched=False)
    assert act(lambda o: np.ones((3, 7), np.int64), obs).dtype == np.float32  # any width when the model says none
    assert obs.action_shape == (3, -1)


POLICY_FILE = '''
import sys

import numpy as np

def forward(obs):
    return np.tile([0.0, 1.0, 0.0, 0.0], (len(obs.frames), 1))

class Family:
    @staticmethod
    def still(obs):
        return np.zeros((len(obs.frames), 4))

NOT_A_POLICY = 3
'''


def test_a_policy_loads_from_a_module_or_a_file(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "my_policies.py").write_text(POLICY_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    forward = load_policy("pkg.my_policies:forward")
    assert forward.__module__ == "pkg.my_policies" and describe_policy(forward).startswith(
        "'forward' (pkg.my_policies.forward, ")
    by_file = load_policy(f"{tmp_path / 'pkg' / 'my_policies.py'}:Family.still")
    assert by_file.__qualname__ == "Family.still" and str(tmp_path) in describe_policy(by_file)
    monkeypatch.chdir(tmp_path)
    assert load_policy("pkg/my_policies.py:forward").__name__ == "forward"
    cases = [
        ("forward", r"policy 'forward': give MODULE:NAME .* or FILE\.py:NAME"),
        ("pkg.my_policies:", r"give MODULE:NAME"),
        ("pkg.nowhere:forward", r"no module 'pkg\.nowhere' on the path \(from .*\)\. Run from the folder that holds "
                                r"it, add that folder to PYTHONPATH, or give the file: pkg/nowhere\.py:forward\."),
        ("missing.py:forward", r"no file 'missing\.py' \(from .*\)\. Give the path of a \.py file that defines "
                               r"'forward'\."),
        ("pkg.my_policies:forwrd", r"pkg\.my_policies has no 'forwrd'\. Its callables: 'Family', 'forward'\. Did you "
                                   r"mean 'forward'\?"),
        ("pkg.my_policies:Family.stil", r"pkg\.my_policies\.Family has no 'stil'.*'still'"),
        ("pkg/my_policies.py:NOT_A_POLICY", r"names a int, which is not callable"),
    ]
    for spec, message in cases:
        with pytest.raises(PolicyError, match=message):
            load_policy(spec)
    (tmp_path / "broken.py").write_text("raise RuntimeError('no gripper')\n")
    with pytest.raises(PolicyError, match=r"running 'broken\.py' raised RuntimeError: no gripper\. Fix the file"):
        load_policy("broken.py:forward")


def test_a_policy_file_runs_once_under_one_name(tmp_path, monkeypatch):
    """A file already imported by its own name is that module, not a second copy; a file loaded twice runs once;
    two files of one stem in two folders keep a module each."""
    (tmp_path / "once").mkdir()
    (tmp_path / "once" / "__init__.py").write_text("")
    (tmp_path / "once" / "my_policies.py").write_text(POLICY_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    imported = load_policy("once.my_policies:forward")
    assert load_policy(f"{tmp_path / 'once' / 'my_policies.py'}:forward") is imported
    for folder, value in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.py").write_text(f"RUNS = []\nRUNS.append(1)\ndef act(obs):\n    return {value}\n")
    a, b = (load_policy(f"{tmp_path / folder / 'same.py'}:act") for folder in ("a", "b"))
    assert (a(None), b(None)) == (1, 2) and a.__module__ != b.__module__
    assert load_policy(f"{tmp_path / 'a' / 'same.py'}:act") is a
    assert sys.modules[a.__module__].RUNS == [1]  # run once
    for module in (a.__module__, b.__module__, "once.my_policies", "once"):
        monkeypatch.delitem(sys.modules, module)


def test_a_policy_file_on_the_path_is_loaded_by_its_own_name(tmp_path, monkeypatch):
    """One import path per module: a file that ``sys.path`` reaches, loaded by its path first, is the module its
    own name imports (run once), not a copy under another name."""
    import importlib

    (tmp_path / "own_policies.py").write_text("RUNS = []\nRUNS.append(1)\ndef act(obs):\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    act = load_policy(f"{tmp_path / 'own_policies.py'}:act")
    assert act.__module__ == "own_policies" and act(None) == 3
    module = importlib.import_module("own_policies")
    assert module.act is act and module.RUNS == [1]
    monkeypatch.delitem(sys.modules, "own_policies")


def test_a_batch_of_episodes_gives_each_the_frames_it_gets_alone(model):
    clip = start(3)
    together = closed_loop(model, clip, Steer(), chunks=3, steps=STEPS, observe=LIGHT)
    for i in range(3):
        alone = closed_loop(model, {k: v[i:i + 1] for k, v in clip.items()}, Steer(), chunks=3, steps=STEPS,
                            observe=LIGHT, episodes=[i])
        assert np.array_equal(alone.rollout.video[0], together.rollout.video[i]), i


def test_an_episode_gets_the_frames_of_its_place_in_a_batch_whatever_the_other_episodes(model):
    """What holds today, batch size fixed: an episode's frames depend on its place in a batch of that size, not on
    which episodes sit beside it (so a fixed evaluation batch gives every episode the same frames in any company)."""
    clip, other = start(3), start(3, seed=1)
    beside = {k: torch.cat([clip[k][:1], other[k][1:]]) for k in clip}    # episode 0 with two other neighbours
    first = closed_loop(model, clip, Steer(), chunks=3, steps=STEPS, observe=LIGHT)
    second = closed_loop(model, beside, Steer(), chunks=3, steps=STEPS, observe=LIGHT)
    assert np.array_equal(first.rollout.video[0], second.rollout.video[0])
    assert torch.equal(first.actions[0], second.actions[0])
    assert not np.array_equal(first.rollout.video[1], second.rollout.video[1])  # the neighbours did change
