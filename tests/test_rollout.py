"""Rollouts: chunks chained through the frames the model produced, never a recorded frame after the
start; recorded == unrecorded; forks within a rollout replay their prefix; head / extend equal a
one-shot rollout; state read off the produced frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import BaseCalls, nonzero_model, tiny_base

from workbench import ComposedModel, GatedResidual
from workbench.adapters.latent_residual import LatentResidual
from workbench.core.rows import DEFAULT_MICRO_BATCH
from workbench.core.seeds import chunk_seed
from workbench.errors import InspectError, UnknownComponentError
from workbench.inspect import Rollout, StateReader, StoragePolicy, record, rollout
from workbench.metrics import to_uint8_video

STEPS = 3
W = 4  # the tiny model's clip: 4 frames, 16x16


def episode(frames: int = 10, b: int | None = None, seed: int = 0) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = b or 1
    clip = {"video": torch.rand(n, 3, frames, 16, 16, generator=g) * 2 - 1,
            "ee_pos": torch.rand(n, frames, 3, generator=g) * 0.2,
            "camera": torch.rand(n, 12, generator=g)}
    actions = torch.rand(n, frames, 4, generator=g) * 2 - 1
    if b is None:
        clip = {k: v[0] for k, v in clip.items()}
        actions = actions[0]
    return clip, actions


@pytest.fixture(scope="module")
def model() -> ComposedModel:
    return nonzero_model()


@pytest.fixture(scope="module")
def path_model() -> ComposedModel:
    """An adapter that reads the hand's state (ee_pos) and the camera: the action path."""
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1, per_frame="keep", path={})
    with torch.no_grad():
        g = torch.Generator().manual_seed(5)
        for p in adapter.out.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective())


def test_chunks_chain_through_the_frames_the_model_produced(model):
    clip, actions = episode(10)
    ro = rollout(model, clip, actions, steps=STEPS, state=None)
    assert isinstance(ro, Rollout) and ro.video.shape == (10, 16, 16, 3) and ro.frame_count == 10
    assert [c.start for c in ro.chunks] == [0, 3, 6]
    assert [list(c.frames) for c in ro.chunks] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    # frame 0 is the given frame; chunk k+1 continues from chunk k's last produced frame, bit for bit
    assert np.array_equal(ro.video[0], to_uint8_video(clip["video"][:, :1])[0])
    for prev, nxt in zip(ro.chunks, ro.chunks[1:], strict=False):
        last = prev.produced[0, -1]
        assert np.array_equal(to_uint8_video(nxt.conditions["image"][:, :, None])[0, 0], last)
        assert torch.equal(nxt.conditions["image"][0], torch.from_numpy(last).permute(2, 0, 1).float() / 127.5 - 1)
        assert np.array_equal(ro.video[nxt.start], last)
    # every chunk is a recorded trajectory with its own seed; an episode 0 draws chunk 0's noise from the rollout's
    # seed: with one call per network (micro_batch=None), chunk 0 is record() with that seed, bit for bit
    assert [c.seed for c in ro.chunks] == [chunk_seed(0, k) for k in range(3)]
    assert len(ro.chunks[1].trajectory) == STEPS and ro.chunks[1].trajectory[0].x0 is not None
    first = record(model, ro.chunks[0].conditions, steps=STEPS, seed=0)
    whole = rollout(model, clip, actions, steps=STEPS, state=None, micro_batch=None)
    assert torch.equal(first.final, whole.chunks[0].trajectory.final)
    assert torch.allclose(first.final, ro.chunks[0].trajectory.final, atol=1e-4)  # micro-batches: last bits only
    assert (ro.micro_batch, whole.micro_batch, ro.episodes, ro.batch_invariant, whole.batch_invariant) == (
        DEFAULT_MICRO_BATCH, None, (0,), True, False)
    assert [ro.chunk_of(f) for f in (0, 1, 3, 4, 9, -1)] == [0, 0, 0, 1, 2, 2]
    assert (ro.steps, ro.seed, ro.state_mode, ro.model, ro.window, ro.stride, ro.context_frames) == (
        STEPS, 0, "none", model, W, W - 1, 1)


def mean_colour(frames: np.ndarray) -> np.ndarray:
    """A stand-in state reader: the last frame's mean colour, scaled like a hand position in metres."""
    return frames[:, -1].reshape(frames.shape[0], -1, 3).mean(axis=1) / 1000.0


MEAN_COLOUR = StateReader(mean_colour, keys=("ee_pos",))


@pytest.mark.parametrize("b", [None, 2])
def test_a_rollout_decodes_only_the_frames_it_reads_the_same_bit_for_bit(model, monkeypatch, b):
    """tiny_video decodes frames alone: chaining chunks decodes one context frame each, ``frame(-1)`` one more,
    and every frame equals a whole decode's (one clip's single frame is decoded beside a neighbour)."""
    clip, actions = episode(10, b=b)
    decode, frames_decoded = type(model.base).decode, []

    def counting(self, latents):
        frames_decoded.append(latents.shape[0] * latents.shape[2])
        return decode(self, latents)

    monkeypatch.setattr(type(model.base), "decode", counting)
    ro = rollout(model, clip, actions, steps=STEPS, state=None)
    last = ro.frame(-1)
    assert sum(frames_decoded) == 6  # frames 3, 6 (the next chunks' context) and 9, for each of 2 clips or
    # beside a neighbour for one: against 3 chunks x 4 frames x 2 decoded whole
    picked = [rollout(model, clip, actions, steps=STEPS, state=None).frame(i) for i in (9, 4, 0)]
    monkeypatch.setattr(type(model.base), "decodes_frames_alone", False)
    whole = rollout(model, clip, actions, steps=STEPS, state=None)
    assert all(torch.equal(a.trajectory.final, w.trajectory.final) for a, w in zip(ro.chunks, whole.chunks))
    video = whole.video if b else whole.video[None]
    assert np.array_equal(last, whole.video[..., -1, :, :, :]) and np.array_equal(ro.video, whole.video)
    for got, i in zip(picked, (9, 4, 0), strict=True):
        assert np.array_equal(got if b else got[None], video[:, i]), i


def test_a_rollout_never_reads_a_recorded_frame_after_the_first(model, path_model):
    for m in (model, path_model):
        clip, actions = episode(10)
        ro = rollout(m, clip, actions, steps=STEPS, state=MEAN_COLOUR)
        poisoned = {**clip, "video": clip["video"].clone(), "ee_pos": clip["ee_pos"].clone()}
        poisoned["video"][:, 1:] = float("nan")
        poisoned["ee_pos"][1:] = float("nan")
        again = rollout(m, poisoned, actions, steps=STEPS, state=MEAN_COLOUR)
        assert np.array_equal(again.video, ro.video)
    assert ro.states[1] is not None and torch.isfinite(ro.states[1]).all()


def test_recorded_equals_unrecorded_bit_exact(model):
    clip, actions = episode(10, b=2)
    ro = rollout(model, clip, actions, steps=STEPS, state=None)
    bare = rollout(model, clip, actions, steps=STEPS, state=None, store=False)
    thin = rollout(model, clip, actions, steps=STEPS, state=None, store=StoragePolicy(every=2))
    assert ro.video.shape == (2, 10, 16, 16, 3)
    assert np.array_equal(ro.video, bare.video) and np.array_equal(ro.video, thin.video)
    assert all(torch.equal(a.trajectory.final, b.trajectory.final) for a, b in zip(ro.chunks, bare.chunks, strict=True))
    # the batch is the episodes side by side: each equals its own rollout, told its episode number, bit for bit
    one = rollout(model, {k: v[1] for k, v in clip.items()}, actions[1], steps=STEPS, state=None, episodes=[1])
    assert np.array_equal(one.video, ro.video[1])


def test_an_episode_gets_the_same_frames_in_a_batch_of_one_two_or_three(path_model):
    """Episodes rolled out three at a time, two at a time and one at a time (each told its episode number) give the
    same frames bit for bit, with a state read off the produced frames: each episode draws its own noise, and every
    call of the base, the adapter and the reader holds DEFAULT_MICRO_BATCH rows."""
    clip, actions = episode(10, b=3, seed=2)

    def rows(lo, hi):
        return {k: v[lo:hi] for k, v in clip.items()}, actions[lo:hi]

    three = rollout(path_model, clip, actions, steps=STEPS, state=MEAN_COLOUR)
    assert three.episodes == (0, 1, 2) and three.batch_invariant and len(three.chunks) == 3
    for e in range(3):
        alone = rollout(path_model, *rows(e, e + 1), steps=STEPS, state=MEAN_COLOUR, episodes=[e])
        assert np.array_equal(alone.video[0], three.video[e])
        assert all(torch.equal(a.trajectory.final[0], b.trajectory.final[e])
                   for a, b in zip(alone.chunks, three.chunks, strict=True))
        assert all(torch.equal(a.state[0], b.state[e]) for a, b in zip(alone.chunks, three.chunks, strict=True))
    two = rollout(path_model, *rows(1, 3), steps=STEPS, state=MEAN_COLOUR, episodes=range(1, 3))
    assert np.array_equal(two.video, three.video[1:])
    # the episode number decides the noise: episode 2's start rolled out as episode 0 is another sample
    other = rollout(path_model, *rows(2, 3), steps=STEPS, state=MEAN_COLOUR)
    assert other.episodes == (0,) and not np.array_equal(other.video[0], three.video[2])
    # rows that share a number share their noise: episode 2's start, twice as episode 2, is episode 2 twice (the
    # closed-loop evaluation rolls one start state out under several policies so)
    start, acts = rows(2, 3)
    twice = rollout(path_model, {k: torch.cat([v, v]) for k, v in start.items()}, torch.cat([acts, acts]), steps=STEPS,
                    state=MEAN_COLOUR, episodes=[2, 2])
    assert np.array_equal(twice.video[0], three.video[2]) and np.array_equal(twice.video[1], three.video[2])
    with pytest.raises(InspectError, match=r"rollout: episodes=\[0, 1\]; give one episode number \(an int >= 0\) per "
                                           r"start clip: 3 for 3 start clips, e\.g\. episodes=range\(3\)"):
        rollout(path_model, clip, actions, steps=STEPS, episodes=[0, 1])
    with pytest.raises(InspectError, match=r"episodes=\[-1\]; .* 1 for 1 start clip,"):
        rollout(path_model, *rows(0, 1), steps=STEPS, episodes=[-1])
    with pytest.raises(InspectError, match=r"rollout: micro_batch=0 is not allowed: it takes an int >= 1 .* or None"):
        rollout(path_model, clip, actions, steps=STEPS, micro_batch=0)
    with pytest.raises(InspectError, match=r"initial_noise is not a sampler option here.*seed= and episodes="):
        rollout(path_model, clip, actions, steps=STEPS, initial_noise=torch.zeros(3))


def test_state_comes_from_the_produced_frames(path_model):
    clip, actions = episode(10)
    seen = []

    def reader(frames):
        seen.append(frames.copy())
        return np.full((frames.shape[0], 3), 0.05 * len(seen))

    ro = rollout(path_model, clip, actions, steps=STEPS, state=StateReader(reader, keys=("ee_pos",)))
    # chunk 0 knows the recorded state at frame 0; later chunks get the reader's reading of their context frame
    assert torch.equal(ro.states[0], clip["ee_pos"][0].float())
    assert [float(s[0]) for s in ro.states[1:]] == pytest.approx([0.05, 0.10])
    # the reader reads in the rollout's micro-batches: the episode, padded with copies of it
    assert [f.shape for f in seen] == [(DEFAULT_MICRO_BATCH, 1, 16, 16, 3)] * 2
    assert all(np.array_equal(f[0], f[-1]) for f in seen)
    assert np.array_equal(seen[0][0, 0], ro.video[3]) and np.array_equal(seen[1][0, 0], ro.video[6])
    assert torch.equal(ro.chunks[1].conditions["ee_pos"], torch.full((1, W, 3), 0.05))
    # the recorded ceiling reads the recorded state at each chunk's first frame, and changes the frames
    ceiling = rollout(path_model, clip, actions, steps=STEPS, state="recorded")
    assert [s.tolist() for s in ceiling.states] == [clip["ee_pos"][f].tolist() for f in (0, 3, 6)]
    assert not np.array_equal(ceiling.video, ro.video)
    # state="start": every chunk is given the state recorded at frame 0, and nothing recorded later is read
    poisoned = {**clip, "ee_pos": clip["ee_pos"].clone()}
    poisoned["ee_pos"][1:] = float("nan")
    held = rollout(path_model, poisoned, actions, steps=STEPS, state="start")
    assert held.state_mode == "start" and [s.tolist() for s in held.states] == [clip["ee_pos"][0].tolist()] * 3
    assert torch.equal(held.chunks[2].conditions["ee_pos"], clip["ee_pos"][0].expand(1, W, 3))
    assert np.array_equal(held.video[:4], ceiling.video[:4])  # chunk 0: the same recorded frame-0 state
    assert not np.array_equal(held.video, ceiling.video)
    # the world-model wing's hand probe, found by name through the registry
    with pytest.raises(Exception, match="64x64|64, 64"):  # the probe reads 64x64 frames only
        rollout(path_model, clip, actions, steps=STEPS, state="probe")


def test_fork_keeps_earlier_chunks_and_replays_the_prefix(model):
    clip, actions = episode(13)
    ro = rollout(model, clip, actions, steps=STEPS, state=None)
    assert len(ro.chunks) == 4
    k, at = 2, 2
    other = torch.rand(W, 4, generator=torch.Generator().manual_seed(9)) * 2 - 1
    calls = BaseCalls(model)
    try:
        alt = ro.fork(chunk=k, at=at, cond={"action": other})
        assert calls.count == (STEPS - at) + STEPS  # chunk 2's live steps, then chunk 3 sampled again
    finally:
        del model.base.denoise
    for a, b in zip(ro.chunks[:k], alt.chunks[:k], strict=True):
        assert a.trajectory is b.trajectory and np.array_equal(a.produced, b.produced)
    assert np.array_equal(alt.video[:ro.chunks[k].frames.start], ro.video[:ro.chunks[k].frames.start])
    forked = alt.chunks[k].trajectory
    assert forked.fork_step == at and forked.replayed(at - 1) and not forked.replayed(at)
    assert torch.equal(forked[at - 1].x_t, ro.chunks[k].trajectory[at - 1].x_t)
    assert torch.equal(forked.final, ro.chunks[k].trajectory.fork(at, cond={"action": other[None]}).final)
    assert torch.equal(alt.actions[6:10], other) and torch.equal(alt.actions[:6], actions[:6])
    assert not np.array_equal(alt.video[7:], ro.video[7:])
    # chunk 3 continues from the fork's last frame, with the edited actions, as a fresh rollout would
    assert np.array_equal(to_uint8_video(alt.chunks[3].conditions["image"][:, :, None])[:, 0],
                          alt.chunks[2].produced[:, -1])


def test_a_fork_at_zero_equals_a_fresh_rollout_with_the_edited_actions(model):
    clip, actions = episode(13)
    ro = rollout(model, clip, actions, steps=STEPS, state=None)
    edited = actions.clone()
    edited[4:7] = -edited[4:7]  # frames 4..6 of chunk 1's window (3..6); frame 3 (chunk 0's last) kept
    alt = ro.fork(chunk=1, at=0, cond={"action": edited[3:7]})
    fresh = rollout(model, clip, edited, steps=STEPS, state=None)
    assert np.array_equal(alt.video, fresh.video)
    assert torch.equal(alt.actions, edited)


def test_head_and_extend_equal_a_one_shot_rollout(model):
    clip, actions = episode(13)
    full = rollout(model, clip, actions, steps=STEPS, state=None)
    part = rollout(model, clip, actions[:7], steps=STEPS, state=None)
    grown = part.extend(actions[7:])
    assert np.array_equal(grown.video, full.video) and len(grown.chunks) == len(full.chunks) == 4
    assert grown.chunks[1].trajectory is part.chunks[1].trajectory  # kept, not sampled again
    # a padded last chunk (frames 11, 12 of its 4-frame window from 9 lie past frame 10) is sampled again later
    short = rollout(model, clip, actions[:11], steps=STEPS, state=None)
    assert short.chunks[-1].padded == 2 and short.video.shape[0] == 11
    assert np.array_equal(short.extend(actions[11:]).video, full.video)
    head = full.head(2)
    assert head.frame_count == 7 and len(head.chunks) == 2
    assert np.array_equal(head.video, full.video[:7]) and np.array_equal(head.extend(actions[7:]).video, full.video)
    with pytest.raises(InspectError, match=r"head\(5\): n_chunks must be an int in 1..4"):
        full.head(5)


def test_batched_rollouts_with_a_gate_scale_and_the_base_alone(model):
    clip, actions = episode(7, b=2)
    on = rollout(model, clip, actions, steps=STEPS, state=None)
    off = rollout(model, clip, actions, steps=STEPS, state=None, with_adapter=False)
    doubled = rollout(model, clip, actions, steps=STEPS, state=None, gate_scale=2.0)
    assert not np.array_equal(on.video, off.video) and not np.array_equal(on.video, doubled.video)
    assert doubled.chunks[0].trajectory.settings.gate_override is not None
    assert [c.trajectory.settings.with_adapter for c in off.chunks] == [False] * len(off.chunks)
    with pytest.raises(InspectError, match=r"^rollout: with_adapter='off' is not allowed: it takes True \(base \+ "
                                           r"adapter\) or False \(the frozen base alone\)\.$"):
        rollout(model, clip, actions, steps=STEPS, state=None, with_adapter="off")
    with pytest.raises(InspectError, match=r"^rollout needs a workbench\.ComposedModel \(base \+ adapter \+ composer "
                                           r"\+ objective\), got TinyVideo\..*for the frozen "
                                           r"base alone pass that model with with_adapter=False\."):
        rollout(model.base, clip, actions, steps=STEPS, state=None)


def test_errors_say_what_was_wrong(model):
    clip, actions = episode(10)
    with pytest.raises(InspectError, match=r"actions have width 3, but the adapter reads 4-D actions.*\(N, 4\)"):
        rollout(model, clip, actions[:, :3], steps=STEPS, state=None)
    with pytest.raises(InspectError, match=r"too few actions: got 1 frames of actions, at least 2 are needed"):
        rollout(model, clip, actions[:1], steps=STEPS, state=None)
    with pytest.raises(InspectError, match=r"actions must be a float tensor \(N, D\) for one start clip.*\(2, 10, 4\)"):
        rollout(model, clip, actions[None].expand(2, -1, -1), steps=STEPS, state=None)
    with pytest.raises(InspectError, match=r"stride=4; chunks of 4 frames continuing from 1 frame\(s\) need a stride "
                                           r"in 1..3"):
        rollout(model, clip, actions, steps=STEPS, state=None, stride=4)
    with pytest.raises(InspectError, match="start must be a clip dict with 'video'"):
        rollout(model, {"image": clip["video"][:, 0]}, actions, steps=STEPS)
    with pytest.raises(UnknownComponentError, match=r"state='prob' names no state reader\. Registered: 'object_probe', "
                                                    r"'probe'\. Did you mean 'probe'\? Pass state=None"):
        rollout(path_model_for_errors(), clip, actions, steps=STEPS, state="prob")
    ro = rollout(model, clip, actions, steps=STEPS, state=None)
    with pytest.raises(InspectError, match=r"chunk 1's window takes actions of shape \(4, 4\).*got \(3, 4\)"):
        ro.fork(chunk=1, at=1, cond={"action": actions[:3]})
    with pytest.raises(InspectError, match=r"fork\(chunk=3\): chunk must be an int in 0..2"):
        ro.fork(chunk=3, at=0)
    with pytest.raises(InspectError, match=r"extend: too few actions: got 0"):
        ro.extend(actions[:0])
    with pytest.raises(InspectError, match="recorded 'ee_pos' at every chunk's first frame.*carries 1\\. "
                                           "Pass the whole episode as start, or a state reader"):
        rollout(path_model_for_errors(), {**clip, "ee_pos": clip["ee_pos"][:1]}, actions, steps=STEPS,
                state="recorded")


def test_an_experiment_is_refused_with_the_model_to_pass_instead():
    """rollout takes a ComposedModel, as record does: an experiment's is exp.model."""
    from workbench import AdapterExperiment, TrainingConfig

    clip, actions = episode(10)
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False))
    with pytest.raises(InspectError, match=r"rollout needs a workbench.ComposedModel .*got AdapterExperiment\. "
                                           r"Pass exp.model"):
        rollout(exp, clip, actions, steps=STEPS, state=None)
    assert rollout(exp.model, clip, actions[:4], steps=1, state=None).frame_count == 4


def path_model_for_errors() -> ComposedModel:
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1, per_frame="keep", path={})
    return ComposedModel(base, adapter, GatedResidual(), base.default_objective())


def test_a_backbone_without_a_frame_to_continue_from_is_refused(model):
    from dataclasses import replace

    clip, actions = episode(10)
    base = tiny_base()
    base.card = replace(base.card, context_frames=0)
    m = ComposedModel(base, LatentResidual(width=16, depth=1), GatedResidual(), base.default_objective())
    with pytest.raises(InspectError, match="cannot be rolled out: its card says context_frames=0"):
        rollout(m, clip, actions, steps=STEPS, state=None)


def test_chunk_seeds_are_pure_and_distinct():
    assert chunk_seed(3, 0) == 3
    seeds = {chunk_seed(s, k) for s in range(4) for k in range(1, 50)}
    assert len(seeds) == 4 * 49 and all(0 <= x < 2**63 for x in seeds)
    with pytest.raises(ValueError, match="chunk must be an int >= 0"):
        chunk_seed(0, -1)


def test_the_hand_probe_is_found_by_name_through_the_registry():
    """state='probe' needs no import of the world-model package: the registry finds the reader through the installed
    entry point of the group workbench.state_readers (read from every distribution's metadata, so a stale egg-info
    in a development checkout does not hide it)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from workbench.registry import registered; from workbench.inspect.recording.state import "
            "state_reader; print('probe' in registered('state_reader'), 'workbench.worldmodel' in sys.modules); "
            "read = state_reader('probe'); print(type(read).__name__, read.keys, 'workbench.worldmodel.rollouts' in "
            "sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.split("\n")[:2] == ["True False", "HandProbeReader ('ee_pos',) True"]


def test_by_default_a_rollout_gives_no_state(model, path_model):
    clip, actions = episode(7)
    ro = rollout(model, clip, actions, steps=STEPS)
    assert ro.state_mode == "none" and ro.states == [None, None]
    assert all("ee_pos" not in c.conditions for c in ro.chunks)
    assert np.array_equal(ro.video, rollout(model, clip, actions, steps=STEPS, state=None).video)
    # an adapter that reads a state the clip records per frame is refused without a reader, naming the fixes
    with pytest.raises(InspectError, match=r"the adapter reads 'ee_pos' at each chunk's first frame, which start "
                                           r"records per frame; .* got no state reader\. Pass a state reader that "
                                           r"fills 'ee_pos': a registered one by name \(registered: 'object_probe', "
                                           r"'probe'\), or StateReader\(fn, keys=\('ee_pos',\)\); or state='start' "
                                           r"\(the value recorded at frame 0, held for every chunk\), or state='rec"):
        rollout(path_model, clip, actions, steps=STEPS)


def test_a_reader_fills_the_conditions_of_its_keys_that_the_adapter_reads(model, path_model):
    clip, actions = episode(7)
    calls = []

    def light(frames):
        calls.append(len(frames))
        return np.zeros((len(frames), 3))

    # the adapter reads no 'ee_pos': the reader is never asked
    ro = rollout(model, clip, actions, steps=STEPS, state=StateReader(light, keys=("ee_pos",)))
    assert calls == [] and ro.states == [None, None] and ro.state_mode == "reader"
    # a reader of another condition fills nothing the path adapter reads: refused, naming it
    with pytest.raises(InspectError, match=r"reads 'ee_pos'.*got state=StateReader\('light', keys=\('light',\)\), "
                                           r"which fills none of its names"):
        rollout(path_model, clip, actions, steps=STEPS, state=StateReader(light, keys=("light",)))
    ro = rollout(path_model, clip, actions, steps=STEPS, state=StateReader(light, keys=("light", "ee_pos")))
    assert calls == [DEFAULT_MICRO_BATCH] and torch.equal(ro.chunks[1].conditions["ee_pos"], torch.zeros(1, W, 3))


def test_a_state_reader_is_told_apart_from_a_plain_function(model):
    clip, actions = episode(7)
    with pytest.raises(InspectError, match=r"state=mean_colour is a plain function, which does not say which "
                                           r"conditions its reading fills\. Wrap it: "
                                           r"state=StateReader\(mean_colour, keys=\('ee_pos',\)\)"):
        rollout(model, clip, actions, steps=STEPS, state=mean_colour)
    with pytest.raises(InspectError, match=r"keys must name the conditions its reading fills.*got 'ee_pos'"):
        StateReader(mean_colour, keys="ee_pos")
    with pytest.raises(InspectError, match=r"StateReader needs a function to read with"):
        StateReader(keys=("ee_pos",))
    with pytest.raises(InspectError, match=r"rollout: state=3; pass None \(no state\), 'start', 'recorded'"):
        rollout(model, clip, actions, steps=STEPS, state=3)
