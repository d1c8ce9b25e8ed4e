"""The Drive view driven as a person drives it, without a front end: key presses (the messages the key
field sends), sliders and buttons, checked against the logic state and the rendered picture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import nonzero_model
from test_drive import Blob, start_clip

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.inspect import Trajectory  # noqa: E402
from workbench.widgets import Drive, Stepper  # noqa: E402
from workbench.widgets.drive import drive_picture  # noqa: E402
from workbench.widgets.render import png_array  # noqa: E402


@pytest.fixture(autouse=True)
def preview_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def view():
    return Drive(nonzero_model(), start_clip(), steps=2, readout=Blob())


def picture(view) -> np.ndarray:
    return png_array(view.image.value)


def test_it_opens_on_a_first_chunk_and_says_how_it_samples(view):
    assert view.state.chunks == 1 and view.state.frames == 4
    status = view.status.value
    assert "<b>1</b> chunk · 4 frames · <b>2 sampling steps</b> per chunk · frames: full decode" in status
    assert "last chunk: " in status and "s CPU); step to picture <b>" in status
    assert view.last_latency_s is not None and view.last_latency_s > 0
    assert picture(view).shape[0] > 100
    assert repr(view).startswith("Drive: 1 chunk, 4 frames; next action dx=+0.00")


def test_a_key_message_sets_the_action_steps_a_chunk_and_redraws(view):
    before = view.image.value
    view.keypad._handle_custom_msg({"key": "ArrowLeft"}, [])  # what the front end sends on a key press
    assert view.state.chunks == 2 and view.state.action.tolist() == [-1.0, 0.0, 0.0, 0.0]
    assert [s.value for s in view.sliders] == [-1.0, 0.0, 0.0, 0.0]  # the sliders show the key's action
    assert view.image.value != before and "s CPU); key ArrowLeft to picture <b>" in view.status.value
    assert np.array_equal(view.state.actions()[4:], np.tile([-1.0, 0, 0, 0], (3, 1)))
    view.keypad._handle_custom_msg({"key": "q"}, [])  # not a driving key: nothing happens
    assert view.state.chunks == 2


def test_sliders_set_the_action_and_step_uses_them(view):
    view.sliders[1].value = 0.5
    view.sliders[3].value = 1.0
    assert view.state.chunks == 1 and view.state.action.tolist() == [0.0, 0.5, 0.0, 1.0]  # no chunk yet
    assert "next: dx=+0.00, dy=+0.50, dz=+0.00, grip=+1.00" in view.status.value
    view.step_button.click()
    assert view.state.chunks == 2 and view.state.actions()[-1].tolist() == [0.0, 0.5, 0.0, 1.0]


def test_undo_branch_switch_and_stepper_buttons(view):
    view.key("ArrowRight")
    view.key("ArrowUp")
    assert [label for label, _ in view.chunk_select.options] == ["chunk 0", "chunk 1", "chunk 2"]
    three = view.state.video().copy()
    view.undo_button.click()
    assert view.state.chunks == 2 and view.chunk_select.value == 1
    view.chunk_select.value = 0
    view.sliders[1].value = 0.0
    view.sliders[2].value = 1.0
    view.branch_button.click()
    assert len(view.state.branches) == 1 and "branched at chunk 0 with dx=+0.00, dy=+0.00, dz=+1.00" in \
        view.tool_status.value
    assert [label for label, _ in view.switch_select.options] == ["line 0 · chunk 0: all 0 · 2 chunks, 7 frames"]
    view.switch_button.click()
    assert np.array_equal(view.state.video(), three[:7])
    view.chunk_select.value = 1
    view.stepper_button.click()
    stepper = view.stepper_box.children[1]
    assert isinstance(stepper, Stepper) and isinstance(stepper.state.trajectory, Trajectory)
    assert stepper.state.trajectory is view.state.trajectory(1)
    view.switch_button.click()  # back on the branch: its forked chunk in the Stepper says what it was branched with
    assert view.open_stepper(0).summary().endswith(
        "branches: chunk 0 (frames 0..), branched: dx=+0.00, dy=+0.00, dz=+1.00, grip=+0.00")


def test_save_writes_the_file_and_says_who_reads_it(view, tmp_path):
    view.save_path.value = str(tmp_path / "driven.h5")
    view.save_button.click()
    assert (tmp_path / "driven.h5").is_file()
    assert "4 frames): MetaWorldClips(path=..., split='all') reads it" in view.tool_status.value


def test_a_line_about_the_episode_goes_when_the_episode_changes(view, tmp_path):
    view.save(tmp_path / "driven.h5")
    assert any(line.startswith("wrote ") and " 4 frames): " in line for line in view.status_texts())
    view.key("ArrowRight")  # 7 frames now: the line about the 4 saved ones goes, from the view and its picture
    assert view.tool_status.value == "" and not any("wrote" in line for line in view.status_texts())
    view.branch(0)
    assert view.status_texts()[-1].startswith("branched at chunk 0 with dx=+1.00")
    view.undo()
    assert not any("branched" in line for line in view.status_texts())


def test_branch_draws_each_chunk_as_it_comes_and_a_key_press_stops_it(view, monkeypatch):
    import asyncio

    from workbench.widgets import drive as drive_module

    marked = []
    monkeypatch.setattr(drive_module, "mark_modified", lambda: marked.append(view.state.chunks))
    for key in ("ArrowRight", "ArrowUp", "ArrowLeft"):
        view.key(key)
    old = view.state.rollout
    shown = []
    view.image.observe(lambda _: shown.append((view.state.chunks, view.status_texts()[-1])), names="value")

    async def branch_then_press():
        view.chunk_select.value = 0
        view.branch_button.click()  # as the front end's click arrives: in the kernel's event loop
        assert view.state.chunks == 4 and not shown  # it starts after the click's message is handled
        while view._branch_at[1] < 1:  # chunks 0 and 1 sampled again, each drawn
            await asyncio.sleep(0.001)
        view.key("ArrowDown")
        await asyncio.sleep(0.2)  # nothing more comes

    asyncio.run(branch_then_press())
    assert shown[:2] == [(1, "branching at chunk 0 with dx=-1.00, dy=+0.00, dz=+0.00, grip=+0.00: chunk 0 of 3 "
                             "sampled, the next ones follow (a key press stops it)"),
                         (2, "branching at chunk 0 with dx=-1.00, dy=+0.00, dz=+0.00, grip=+0.00: chunk 1 of 3 "
                             "sampled, the next ones follow (a key press stops it)")]
    assert view.state.chunks == 2 and view.state.branches == [old] and len(old.chunks) == 4
    assert view.state.action.tolist() == [-1.0, 0.0, 0.0, 0.0]  # the key stopped the branch, it set nothing
    assert len(shown) == 2 and view.status_texts()[-1] == (
        "branch at chunk 0 stopped by the key ArrowDown after chunk 1 of 3: this line has 2 chunks; the old line is "
        "kept (switch goes back)")
    assert marked == []  # stopped by the person at the view: nothing finished behind their back

    async def branch_to_the_end():
        view.branch_button.click()
        while view._branching is not None:
            await asyncio.sleep(0.001)

    view.chunk_select.value = 1
    asyncio.run(branch_to_the_end())
    assert view.state.chunks == 2 and shown[-1][1].startswith("branched at chunk 1 with")
    assert marked == [2]  # finished in the background: JupyterLab is told the notebook changed


def test_the_path_over_the_frames_is_the_last_chunks_fading():
    from workbench.widgets.drive import NEW_RGB, PAST_RGB, path_segments

    pixels = np.arange(26, dtype=np.float64).reshape(13, 2)  # frame f at (2f, 2f + 1)
    chunks = [range(1, 4), range(4, 7), range(7, 10), range(10, 13)]
    lines = path_segments(pixels, chunks, shown=3)
    assert [[p[0] / 2 for p in points] for points, _, _ in lines] == [  # each from the frame before it
        [3, 4, 5, 6], [6, 7, 8, 9], [9, 10, 11, 12]]  # chunk 0 is left out
    assert [(colour, width) for _, colour, width in lines] == [
        ((109, 167, 206), 2), (PAST_RGB, 2), (NEW_RGB, 3)]  # the oldest drawn 35% toward white
    partial = path_segments(pixels[:9], chunks, shown=3)  # a frame inside chunk 2: its path up to that frame
    assert [[p[0] / 2 for p in points] for points, _, _ in partial] == [[3, 4, 5, 6], [6, 7, 8]]
    assert path_segments(pixels[:1], chunks) == []  # the start frame: no path yet


def test_the_picture_draws_the_path_over_the_frames():
    model = nonzero_model()
    blob = Blob()
    with_path = Drive(model, start_clip(), steps=2, readout=blob)
    without = Drive(model, start_clip(), steps=2, readout=None)
    assert torch.equal(torch.from_numpy(with_path.state.video()), torch.from_numpy(without.state.video()))
    a, b = drive_picture(with_path.state), drive_picture(without.state)
    assert a.shape[0] > b.shape[0]  # the path chart below the frames
    top = b.shape[0] - 10
    assert (a[:top] != b[:top]).any()  # the path drawn over the frames
