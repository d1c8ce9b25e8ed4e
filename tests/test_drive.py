"""The logic of the Drive view (workbench.inspect.drive.DriveState) on the tiny model: keys and sliders set
the next chunk's action, each step adds one chunk of a rollout, undo / branch / switch, the hand's path read
once per chunk, and the driven episode saved as a clip file the Meta-World reader loads back bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import nonzero_model

from workbench.data.camera import CameraCalibration
from workbench.errors import InspectError
from workbench.inspect import Readout, Trajectory
from workbench.inspect.drive import KEYS, DriveState, calibration_from_vector
from workbench.inspect.recording.rollouts import rollout

pytest.importorskip("h5py")

CAMERA = CameraCalibration.look_at([0.0, -0.4, 0.6], [0.0, 0.6, 0.1], 45.0, 16, 16)


@pytest.fixture(autouse=True)
def preview_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def model():
    return nonzero_model()


def start_clip(frames: int = 4, size: int = 16, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.rand(3, frames, size, size, generator=g) * 2 - 1,
            "action": torch.rand(frames, 4, generator=g) * 2 - 1,
            "camera": torch.from_numpy(CAMERA.vector()), "task": "reach-v3"}


class Blob:
    """A readout in cm: where the bright pixels are, as a point in front of the camera (counts its frames)."""

    name, unit, axes = "hand", "cm", ("x", "y", "z")

    def __init__(self):
        self.frames_read = 0

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        self.frames_read += len(frames)
        f = frames.astype(np.float64).mean(axis=-1)
        return np.stack([f.mean(axis=(1, 2)) / 10, 60 + f[:, :8].mean(axis=(1, 2)) / 20, 10 + f.std(axis=(1, 2)) / 10],
                        axis=-1)


def drive(model, **kw) -> DriveState:
    return DriveState(model, start_clip(), steps=2, readout=kw.pop("readout", Blob()), **kw)


# -- the next chunk's action -----------------------------------------------------------------------
def test_keys_and_sliders_set_the_next_action(model):
    d = drive(model, speed=0.5)
    assert d.press("ArrowRight").tolist() == [0.5, 0.0, 0.0, 0.0]
    assert d.press("c").tolist() == [0.5, 0.0, 0.0, 1.0]  # the gripper keeps the motion
    assert d.press("ArrowUp").tolist() == [0.0, 0.5, 0.0, 1.0]  # a motion key replaces the motion
    assert d.press("PageDown").tolist() == [0.0, 0.0, -0.5, 1.0]
    assert d.press(".").tolist() == [0.0, 0.0, 0.0, 1.0]
    assert d.set_action({"dx": -1.0, "grip": -1.0}).tolist() == [-1.0, 0.0, 0.0, -1.0]
    assert d.set_action([0.25, 0.5, -0.25, 0.0]).tolist() == [0.25, 0.5, -0.25, 0.0]
    assert set(KEYS) >= {"ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "PageUp", "PageDown"}


def test_wrong_actions_and_keys_are_refused_saying_what_is_allowed(model):
    d = drive(model)
    with pytest.raises(InspectError, match=r"key 'x' drives nothing; the keys are ArrowRight, ArrowLeft"):
        d.press("x")
    with pytest.raises(InspectError, match=r"an action needs 4 values \(dx, dy, dz, grip\), got 3"):
        d.set_action([0, 0, 0])
    with pytest.raises(InspectError, match=r"must be finite and in \[-1, 1\], got \[2.0, 0.0, 0.0, 0.0\]"):
        d.set_action([2, 0, 0, 0])
    with pytest.raises(InspectError, match=r"unknown action dimension\(s\) \['yaw'\]; this model's actions are"):
        d.set_action({"yaw": 0.1})
    with pytest.raises(InspectError, match=r"start\['video'\] must be one clip \(3, T, H, W\), got shape "
                                           r"\(1, 3, 4, 16, 16\); pass clips\[i\]"):
        DriveState(model, {**start_clip(), "video": start_clip()["video"][None]})
    with pytest.raises(InspectError, match="steps must be a positive int"):
        DriveState(model, start_clip(), steps=0)
    exp = type("Experiment", (), {"model": model})()  # what an AdapterExperiment offers: its model
    with pytest.raises(InspectError, match=r"DriveState needs a workbench.ComposedModel .*got Experiment\. "
                                           r"Pass exp.model"):
        DriveState(exp, start_clip())
    with pytest.raises(InspectError, match="nothing to branch yet: step"):
        d.branch()


# -- stepping, undo, branches ------------------------------------------------------------------------
def test_each_step_adds_one_chunk_equal_to_a_one_shot_rollout_of_the_same_actions(model):
    d = drive(model)
    assert d.frames == 0 and d.video().shape == (1, 16, 16, 3)  # the start frame alone
    d.press("ArrowRight")
    first = d.step()
    assert d.chunks == 1 and d.frames == 4 == d.window and list(first.frames) == [1, 2, 3]
    d.press("ArrowDown")
    d.step()
    assert d.chunks == 2 and d.frames == 4 + d.stride == 7
    expected = np.concatenate([np.tile([1.0, 0, 0, 0], (4, 1)), np.tile([0, -1.0, 0, 0], (3, 1))]).astype(np.float32)
    assert np.array_equal(d.actions(), expected)
    once = rollout(model, start_clip(), torch.from_numpy(expected), steps=2, seed=0)
    assert np.array_equal(d.video(), once.video)  # chunk by chunk = all at once, bit for bit
    assert [t.chunk for t in d.timings] == [0, 1] and all(t.cpu_s > 0 and t.steps == 2 for t in d.timings)
    assert isinstance(d.trajectory(1), Trajectory) and d.trajectory(1).steps == 2  # what the Stepper opens
    assert d.chunk_of(5) == 1 and d.chunk_of(2) == 0


def test_undo_drops_the_last_chunk_down_to_the_start_frame(model):
    d = drive(model)
    d.step([0.5, 0, 0, 0])
    one = d.video().copy()
    d.step([0, 0.5, 0, 0])
    assert d.undo() and d.chunks == 1 and np.array_equal(d.video(), one)
    assert d.undo() and d.chunks == 0 and d.rollout is None
    assert not d.undo()


def test_branch_forks_at_a_chunk_keeps_the_old_line_and_switch_goes_back(model):
    d = drive(model)
    d.step([1.0, 0, 0, 0])
    d.step([0, 1.0, 0, 0])
    before = d.video().copy()
    d.branch(0, action=[-1.0, 0, 0, 0])
    assert len(d.branches) == 1 and np.array_equal(d.branches[0].video, before)
    assert d.frames == 7 and not np.array_equal(d.video(), before)
    assert np.array_equal(d.actions()[:4], np.tile([-1.0, 0, 0, 0], (4, 1)))  # chunk 0's window: the new action
    assert np.array_equal(d.actions()[4:], np.tile([0, 1.0, 0, 0], (3, 1)))  # chunk 1 re-rolled with its own
    fresh = rollout(model, start_clip(), torch.from_numpy(d.actions()), steps=2, seed=0)
    assert np.array_equal(d.video(), fresh.video)  # a fork at step 0 is a fresh rollout of the edited actions
    d.switch(0)
    assert np.array_equal(d.video(), before)
    with pytest.raises(InspectError, match=r"chunk=5 is not a chunk of this episode; it has 2 \(0..1\)"):
        d.branch(5)


def test_branch_steps_samples_one_chunk_at_a_time_like_branch_and_can_stop_early(model):
    d = drive(model)
    for action in ([1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, -1.0, 0, 0]):
        d.step(action)
    old = d.rollout
    whole = old.fork(chunk=1, at=0, cond={"action": torch.tensor([[-1.0, 0, 0, 0]] * old.window)})
    steps = d.branch_steps(1, action=[-1.0, 0, 0, 0])
    assert d.branches == [] and d.rollout is old  # nothing changes before the first chunk
    assert next(steps) == (1, 3) and d.branches == [old] and d.chunks == 2  # the forked chunk: the line so far
    assert next(steps) == (2, 3) and d.chunks == 3
    assert list(steps) == [(3, 3)] and d.chunks == 4
    assert np.array_equal(d.video(), whole.video)  # chunk by chunk = the fork all at once, bit for bit
    assert np.array_equal(d.actions(), torch.as_tensor(whole.actions).numpy())
    assert [t.chunk for t in d.timings[-3:]] == [1, 2, 3]  # each chunk sampled again is timed

    stopped = drive(model)
    for action in ([1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0]):
        stopped.step(action)
    before = stopped.rollout
    steps = stopped.branch_steps(0, action=[0, 0, 0, 1.0])
    next(steps)
    steps.close()  # stopped after the forked chunk: the new line is that chunk, the old line is kept whole
    assert stopped.chunks == 1 and stopped.branches == [before] and len(before.chunks) == 3
    never = drive(model)
    never.step([1.0, 0, 0, 0])
    never.branch_steps(0).close()
    assert never.branches == [] and never.chunks == 1
    with pytest.raises(InspectError, match=r"chunk=3 is not a chunk of this episode; it has 1 \(0..0\)"):
        never.branch_steps(3)  # checked at once, not when the first chunk is asked for


def test_kept_lines_are_labelled_by_where_they_differ_and_the_branched_chunk_by_its_action(model):
    d = drive(model)
    for action in ([1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 0.5, 0, 0]):
        d.step(action)
    d.branch(1, action=[-1.0, 0, 0, 0])  # line 0: the first one
    d.branch(2, action=[0, 0, 0, 1.0])  # line 1: the branch at chunk 1
    # all three lines have 3 chunks and 10 frames: what tells them apart is where they leave the current one
    assert d.line_labels() == ["line 0 · chunk 1: dx=+1 · 3 chunks, 10 frames",
                               "line 1 · chunk 2: dy=+0.5 · 3 chunks, 10 frames"]
    d.switch(0)
    assert d.line_labels() == ["line 0 · chunk 1: dx=-1 · 3 chunks, 10 frames",
                               "line 1 · chunk 1: dx=-1 · 3 chunks, 10 frames"]
    d.switch(1)  # back on the branch at chunk 1 (line 1 holds the first line now)
    d.undo()
    assert d.line_labels() == ["line 0 · chunk 2: grip=+1 · 3 chunks, 10 frames",  # longer than this line
                               "line 1 · chunk 1: dx=+1 · 3 chunks, 10 frames"]
    steps = d.branch_steps(0, action=[0, 0, 0, -1.0])
    next(steps)
    steps.close()
    assert d.line_labels()[-1] == "line 2 · chunk 0: dx=+1 · 2 chunks, 7 frames"  # stopped: one chunk so far
    d.switch(2)
    assert d.line_labels()[-1] == "line 2 · chunk 0: grip=-1 · 1 chunk, 4 frames"
    # the Stepper shows a chunk's run by its label: a branched chunk says what it was branched with
    assert d.trajectory(0).label == "chunk 0 (frames 0..)"
    assert d.trajectory(1).label == "chunk 1 (frames 3..), branched: dx=-1.00, dy=+0.00, dz=+0.00, grip=+0.00"
    d.switch(2)
    assert d.trajectory(0).label == "chunk 0 (frames 0..), branched: dx=+0.00, dy=+0.00, dz=+0.00, grip=-1.00"


# -- the hand's path ----------------------------------------------------------------------------------
def test_the_path_reads_each_frame_once_and_projects_into_the_picture(model):
    blob = Blob()
    d = drive(model, readout=blob)
    d.step([1.0, 0, 0, 0])
    d.step([0, 1.0, 0, 0])
    path = d.path()
    assert blob.frames_read == 7 and path.shape == (7, 3)
    assert np.allclose(path, blob(d.video()))  # the same numbers as reading the whole video
    blob.frames_read = 0
    d.path()
    assert blob.frames_read == 0  # cached per chunk
    d.step([0, 0, 1.0, 0])
    d.path()
    assert blob.frames_read == 3  # only the new chunk's frames
    uv = d.path_pixels()
    expected, _ = CAMERA.project(d.path() / 100)
    assert np.allclose(uv, expected, atol=1e-3)  # normalised projection x frame size = pixels
    assert DriveState(model, start_clip(), steps=2, readout=None).path() is None
    default = DriveState(model, start_clip(), steps=2)  # no state reader by default, so no path of its own
    assert default.readout is None and default.readout_note == ("no path: state=None reads nothing off the frames "
                                                                "(pass readout=)")
    no_probe = DriveState(model, start_clip(), steps=2, state="probe")  # the hand probe reads 64x64 frames only
    assert no_probe.readout is None
    assert no_probe.readout_note.startswith("no path: the state reader 'probe' cannot read these frames (HandProbe: ")
    with pytest.raises(InspectError, match=r"readout='probe': pass 'state' \(the state reader's own readout\), a "
                                           r"Readout, or None"):
        DriveState(model, start_clip(), steps=2, readout="probe")


def test_the_calibration_is_recovered_from_the_camera_vector():
    cal = calibration_from_vector(CAMERA.vector(), 16, 16)
    assert np.allclose(cal.intrinsics, CAMERA.intrinsics, atol=1e-4)
    assert np.allclose(cal.extrinsics, CAMERA.extrinsics, atol=1e-5)
    assert np.allclose(cal.vector(), CAMERA.vector(), atol=1e-6)


# -- saving ----------------------------------------------------------------------------------------------
def test_the_driven_episode_saves_as_a_clip_file_the_reader_loads_bit_for_bit(model, tmp_path):
    from workbench.data.metaworld import MetaWorldClips

    d = drive(model)
    with pytest.raises(InspectError, match="nothing to save yet: step"):
        d.save(tmp_path / "x.h5")
    d.step([1.0, 0, 0, -1.0])
    d.step([0, 0.5, 0, 1.0])
    with pytest.raises(InspectError, match=r"must end in .h5 or .hdf5, got '.*driven.mp4'"):
        d.save(tmp_path / "driven.mp4")
    written = d.save(tmp_path / "out" / "driven.h5")
    clips = MetaWorldClips(path=str(written), window=7, stride=1, split="all")
    assert len(clips) == 1 and clips.task_names == ["reach-v3"]
    item = clips[0]
    frames = ((item["video"].permute(1, 2, 3, 0) + 1) * 127.5).round().to(torch.uint8).numpy()
    assert np.array_equal(frames, d.video())  # lossless
    assert torch.equal(item["action"], torch.from_numpy(d.actions()))
    assert torch.allclose(item["ee_pos"], torch.from_numpy(d.path() / 100).float())
    assert item["proprio"].shape == (7, 0)
    assert torch.allclose(item["camera"], start_clip()["camera"], atol=1e-6)
    assert clips.attrs["driven"] and "not measured" in clips.attrs["ee_pos_source"]
    assert clips.attrs["sampling_steps"] == 2 and clips.attrs["chunks"] == 2
    again = DriveState(model, clips[0], steps=2, readout=None)  # a saved episode is a start clip again
    again.step([0, 0, 0, 0])
    assert again.frames == 4
    assert not (tmp_path / "out" / "driven.h5.partial").exists()


def test_describe_says_where_the_drive_is(model):
    d = drive(model)
    assert d.describe() == ("the start frame; next action dx=+0.00, dy=+0.00, dz=+0.00, grip=+0.00; "
                            "2 sampling steps per chunk")
    d.step([1.0, 0, 0, 0])
    assert d.describe().startswith("1 chunk, 4 frames; next action dx=+1.00")
    assert Readout  # the readout type a study passes (see workbench.inspect.probes.readout)
