"""The notebook views, driven the way a person drives them: build one, set control values (or
click buttons) in Python, and check the logic state and the rendered picture. No front end."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from conftest import BaseCalls, DeviceReads, raw_batch, tiny_base

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from workbench import AdapterExperiment, ComposedModel, GatedResidual, NoiseGated, TrainingConfig  # noqa: E402
from workbench.adapters.latent_residual import LatentResidual  # noqa: E402
from workbench.data.synthetic import SyntheticMoves  # noqa: E402
from workbench.errors import (
    DataError,  # noqa: E402
    InspectError,
)
from workbench.inspect import Ablation, record  # noqa: E402
from workbench.widgets import (  # noqa: E402
    AblationSliders,
    ActionSensitivity,
    ConditionProbe,
    Fit,
    Gates,
    Stepper,
    render,  # noqa: E402
)
from workbench.widgets.render import png_array  # noqa: E402

STEPS = 4
DIMS = ["dx", "dy", "dz", "grip"]


@pytest.fixture(autouse=True)
def preview_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def model() -> ComposedModel:
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1)
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in adapter.out.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return ComposedModel(base, adapter, NoiseGated(GatedResidual(gate_init=0.5), lo=0.2, hi=1.0),
                         base.default_objective())


@pytest.fixture
def traj(model):
    return record(model, model.base.prepare_batch(raw_batch()), steps=STEPS, seed=0)


def picture(view) -> np.ndarray:
    return png_array(view.image.value)


def changed(before: np.ndarray, after: np.ndarray) -> bool:
    return before.shape != after.shape or bool((before != after).any())





# -- Stepper ---------------------------------------------------------------------------------
def test_stepper_step_slider_moves_the_picture(traj):
    stepper = Stepper(traj, dim_names=DIMS)
    assert stepper.state.step == 0
    before = picture(stepper)
    stepper.step_slider.value = 2
    assert stepper.state.step == 2 and traj.position == 2
    assert changed(before, picture(stepper))
    stepper.forward_button.click()
    assert stepper.state.step == 3 and stepper.step_slider.value == 3
    stepper.back_button.click()
    stepper.back_button.click()
    assert stepper.state.step == 1


def test_stepper_frame_slider_and_decode(traj):
    stepper = Stepper(traj)
    stepper.step_slider.value = 3
    before = picture(stepper)
    stepper.frame_slider.value = 2
    assert stepper.state.frame == 2 and changed(before, picture(stepper))
    stepper.decode_select.value = "full"
    assert stepper.state.decode == "full" and "full decode" in repr(stepper)


def test_the_decode_choices_carry_their_measured_fidelity(traj):
    from workbench.inspect import clear_preview_cache, fit_preview

    clear_preview_cache()  # previews other tests fitted in this process
    base = traj.model.base
    linear = fit_preview(base, latent_shape=tuple(traj.final.shape[1:]))
    labels = [label for label, _ in Stepper(traj).decode_select.options]
    assert labels == [f"linear {linear.psnr:.1f} dB", "tiny", "full"]  # no tiny preview yet: no number
    tiny = fit_preview(base, kind="tiny", n_fit=2, n_heldout=1, steps=5)
    stepper = Stepper(traj)
    assert [label for label, _ in stepper.decode_select.options] == [f"linear {linear.psnr:.1f} dB",
                                                                     f"tiny {tiny.psnr:.1f} dB", "full"]
    stepper.decode_select.value = "tiny"
    assert stepper.state.decode == "tiny" and "tiny decode" in repr(stepper)
    clear_preview_cache()


@pytest.mark.parametrize("view", ["x_t", "x0", "base", "adapter", "composed", "adapter-base", "gate"])
def test_stepper_renders_each_view(traj, view):
    stepper = Stepper(traj)
    stepper.step_slider.value = 1
    before = picture(stepper)
    stepper.view_select.value = view
    assert stepper.state.view == view
    if view != "x0":
        assert changed(before, picture(stepper))
    assert picture(stepper).shape[0] > 200  # frames large enough to see


def test_fork_here_with_the_condition_editor_adds_a_branch(traj, model):
    stepper = Stepper(traj, dim_names=DIMS)
    stepper.step_slider.value = 2
    before = picture(stepper)
    stepper.editor.frame_select.value = 1
    stepper.editor.sliders[3].value = 0.75  # grip on frame 1
    calls = BaseCalls(model)
    stepper.fork_button.click()
    assert calls.count == STEPS - 2  # replayed prefix, live from step 2
    assert len(stepper.state.branches) == 2
    fork = stepper.state.branches[1]
    assert float(fork.batch.cond["action"][0, 1, 3]) == 0.75
    assert float(fork.batch.cond["action"][0, 2, 3]) == float(traj.batch.cond["action"][0, 2, 3])
    after = picture(stepper)
    assert after.shape[1] > before.shape[1]  # two branches side by side
    assert fork.label == "fork@2: grip=+0.75@f1"  # what changed, as the ablation says it
    assert "fork@2: grip=+0.75@f1" in repr(stepper) and "fork@2: grip=+0.75@f1" in stepper.fork_status.value
    assert stepper.with_adapter_select.label == "adapter as recorded"  # the first choice shows, not a blank
    assert stepper.state.branches[1].settings.with_adapter is None
    stepper.editor.reset_button.click()
    stepper.with_adapter_select.value = "adapter off (base alone)"
    stepper.fork_button.click()
    assert stepper.state.branches[2].settings.with_adapter is False
    assert stepper.state.branches[2].label == "fork@2: adapter off"
    stepper.clear_button.click()
    assert len(stepper.state.branches) == 1


def test_slider_moves_draw_from_the_arrays_without_building_a_figure(traj, monkeypatch):
    from workbench.widgets import render

    stepper = Stepper(traj)
    ablation = AblationSliders(traj, step=2, dim_names=DIMS)

    def refuse(*args, **kwargs):
        raise AssertionError("a slider move built a matplotlib figure")

    monkeypatch.setattr(render, "panels_figure", refuse)
    stepper.step_slider.value = 2
    stepper.frame_slider.value = 1
    ablation.sliders.sliders[0].value = 0.5
    shown = picture(stepper)[..., :3]
    panel = stepper.state.panels()[0]
    scale = render.panel_scale(panel.image.shape[0], panels=1)  # one branch: the frame fills the row
    expected = np.repeat(np.repeat(panel.colored(), scale, 0), scale, 1)
    h, w = expected.shape[:2]
    found = [(y, x) for y in range(shown.shape[0] - h + 1) for x in range(0, 20)
             if np.array_equal(shown[y:y + h, x:x + w], expected)]
    assert found  # the frame itself, scaled by an integer factor, pixel for pixel


def test_a_step_move_decodes_only_the_shown_frame_of_each_branch(traj, model):
    from workbench.inspect import view_image

    stepper = Stepper(traj, decode="full", frame=2)
    stepper.fork_here(with_adapter=False)
    seen = []
    decode = model.base.decode

    def counted(latents):
        seen.append(latents.shape[2])
        return decode(latents)

    model.base.decode = counted
    try:
        stepper.step_slider.value = 3
        assert seen == [1, 1]  # one latent frame per branch, not the clip's four
        panel = stepper.state.panels()[0]
        whole = view_image(traj, 3, "x0", decode="full")
        assert np.array_equal(panel.image, whole.frames[2])  # the same pixels as decoding the whole clip
        seen.clear()
        stepper.step_slider.value = 2
        stepper.step_slider.value = 3  # drawn before: from the cache
        assert seen == [1, 1]
    finally:
        del model.base.decode


def test_play_steps_to_the_end_in_the_kernel_however_often_the_view_is_displayed(traj):
    import asyncio

    from IPython.display import display

    stepper = Stepper(traj, interval=1)
    display(stepper)
    display(stepper)  # a page-side Play would stop after one step here; the kernel's timer does not care
    visited = []
    stepper.step_slider.observe(lambda c: visited.append(c["new"]), names="value")

    async def play():
        stepper.play.value = True
        assert stepper.play.description == "pause"
        while stepper.play.value:
            await asyncio.sleep(0.005)

    asyncio.run(asyncio.wait_for(play(), timeout=30))
    assert visited == [1, 2, 3] and stepper.state.step == 3  # every stored step, in order, then it stops
    assert stepper.play.description == "play"

    async def pause_and_replay():
        stepper.play.value = True  # at the end: plays again from the start
        await asyncio.sleep(0)
        stepper.play.value = False
        await asyncio.sleep(0.05)

    visited.clear()
    asyncio.run(pause_and_replay())
    assert visited[0] == 0 and len(visited) <= 2 and not stepper.play.value  # paused: no more steps


def test_a_burst_of_moves_inside_the_event_loop_draws_once(traj):
    import asyncio

    stepper = Stepper(traj)
    draws = []
    original = stepper.state.panels

    def counted():
        draws.append(stepper.state.step)
        return original()

    stepper.state.panels = counted

    async def burst():
        for value in (1, 2, 3, 2, 3):
            stepper.step_slider.value = value  # each handled while the loop is busy with this burst
        before = stepper.image.value
        assert draws == [] and stepper.image.value == before  # the old picture stays until the new one
        await asyncio.sleep(0)

    asyncio.run(burst())
    assert draws == [3] and stepper.state.step == 3  # only the latest state was drawn


def test_the_editor_says_when_all_frames_replaces_a_varying_sequence(traj):
    stepper = Stepper(traj, dim_names=DIMS)
    actions = traj.batch.cond["action"][0]
    assert float(actions[:, 0].max() - actions[:, 0].min()) > 0  # the recorded dx varies over frames
    note = stepper.editor.note.value
    assert f"dx {float(actions[:, 0].min()):+.2f}…{float(actions[:, 0].max()):+.2f}" in note
    assert "moving one sets every frame to its value" in note
    assert stepper.editor.sliders[0].value == pytest.approx(float(actions[:, 0].mean()), abs=1e-6)


def test_stale_status_lines_are_replaced(traj, tmp_path):
    stepper = Stepper(traj, export_path=tmp_path / "a.gif")
    stepper.export_button.click()
    assert stepper.export_status.value.startswith(f"wrote {tmp_path / 'a.gif'}") and "x0, 1 branch" in \
        stepper.export_status.value
    stepper.frame_slider.value = 1
    assert stepper.export_status.value.startswith("wrote")  # an export holds every frame: still true
    stepper.view_select.value = "x_t"
    assert stepper.export_status.value == ""  # it described the x0 view
    stepper.export_path.value = str(tmp_path / "b.webm")
    with pytest.raises(DataError, match=r"unknown file extension '\.webm'"):
        stepper.export()
    assert "not written: DataError: write_video: unknown file extension '.webm'" in stepper.export_status.value


def test_condition_editor_shows_the_chosen_frame_without_editing(traj):
    stepper = Stepper(traj, dim_names=DIMS)
    editor = stepper.editor
    editor.frame_select.value = 2
    assert editor.sliders[0].value == pytest.approx(float(traj.batch.cond["action"][0, 2, 0]))
    assert not editor.edit.changed
    editor.sliders[0].value = -0.5
    assert editor.edit.changed
    editor.reset_button.click()
    assert not editor.edit.changed


@pytest.mark.parametrize("fmt", [".mp4", ".gif"])
def test_stepper_export_writes_a_readable_video(traj, tmp_path, fmt):
    import imageio.v3 as iio

    stepper = Stepper(traj, export_path=tmp_path / "steps.mp4")
    stepper.export_format.value = fmt
    assert stepper.export_path.value.endswith(fmt)
    stepper.export_button.click()
    video = iio.imread(stepper.export_path.value, index=None)
    assert video.ndim == 4 and video.shape[0] == 4 and video.std() > 0
    assert "wrote" in stepper.export_status.value


def test_a_view_displays_without_a_front_end(traj):
    stepper = Stepper(traj)
    bundle = stepper._repr_mimebundle_()
    # the status line the live view writes beside its controls, then the picture, in the PNG
    assert stepper.status_texts() == ["step 0 of 4 · noise level 1.00"]
    shown, live = render.png_array(base64.b64decode(bundle["image/png"]))[..., :3], picture(stepper)[..., :3]
    text = render.text_image(stepper.status_texts(), live.shape[1])
    assert shown.shape == (text.shape[0] + 4 + live.shape[0], live.shape[1], 3)
    assert np.array_equal(shown[:text.shape[0]], text) and np.array_equal(shown[-live.shape[0]:], live)
    assert (text < 128).any()  # the text is drawn
    assert bundle["text/plain"] == ("Stepper: step 0 of 4 (noise 1.00), frame 3 of 4, view x0, preview decode; "
                                    "branches: run (seed 0)")
    assert "0x" not in bundle["text/plain"]  # nothing that changes from run to run


def test_stepper_condition_editor_is_optional(traj):
    assert Stepper(traj, condition=None).editor is None
    with pytest.raises(InspectError, match="this batch has no 'proprio'"):
        Stepper(traj, condition="proprio")


# -- Ablation sliders ------------------------------------------------------------------------
def test_ablation_slider_changes_the_prediction_without_calling_the_base(traj, model):
    view = AblationSliders(traj, step=2, dim_names=DIMS, propagate=False)
    assert view.state.change() == 0.0
    before = picture(view)
    calls = BaseCalls(model)
    view.sliders.sliders[0].value = 1.0
    view.sliders.sliders[3].value = -1.0
    assert calls.count == 0  # the base output recorded at step 2 is reused
    assert view.state.evaluations == 3  # the recorded actions, then one re-run per slider move
    assert view.state.change() > 0 and changed(before, picture(view))
    assert "dx=+1.00, grip=-1.00" in repr(view)  # the edits by the dimensions' names
    assert "edited: dx=+1.00, grip=-1.00" in view.status.value
    assert "final prediction" not in repr(view) and view.final_image.value == b""
    view.sliders.reset_button.click()
    assert view.state.change() == 0.0


def test_ablation_carries_each_edit_to_the_last_step_as_a_fork(traj, model):
    view = AblationSliders(traj, step=2, dim_names=DIMS)
    assert repr(view).endswith("action: no edit; x0 change 0.0000, frame 3")  # nothing edited: no fork to tell
    assert view.state.cached_propagation().trajectory is traj and "no edit" in view.final_status.value
    instant = picture(view)
    calls = BaseCalls(model)
    view.sliders.sliders[0].value = 1.0
    assert calls.count == STEPS - 2  # the instant picture none; the fork from step 2 samples steps 2 and 3
    final = view.state.cached_propagation()
    fork = traj.fork(at=2, cond={"action": view.state.edit.values})
    assert torch.equal(final.trajectory.final, fork.final)  # bit for bit the fork machinery's
    assert np.array_equal(final.edited, traj.render(fork.final)) and final.resampled == 2
    assert repr(view).endswith("final prediction with dx=+1.00 from step 2 of 4")  # no readout: no numbers
    assert "no readout" in view.final_status.value and "2 steps re-sampled in" in view.final_status.value
    both = png_array(view.static_png())
    assert both.shape[0] > png_array(view.image.value).shape[0]  # a page without a front end shows both
    assert changed(instant, picture(view))
    shown, count = png_array(view.final_image.value), calls.count
    view.frame_slider.value = 1  # another frame: the same fork, drawn again
    assert calls.count == count and view.state.cached_propagation() is final
    assert changed(shown, png_array(view.final_image.value))


def test_ablation_reads_where_the_edit_lands_through_a_readout(traj):
    from workbench.inspect import Readout

    calls = []

    def brightness(frames):  # the mean colour of each frame: a position the edit can move
        calls.append(frames.shape)
        return frames.reshape(len(frames), -1, 3).mean(axis=1)

    view = AblationSliders(traj, step=1, dim_names=DIMS,
                           readout=Readout(brightness, name="colour", unit="u", axes=("r", "g", "b")))
    view.sliders.sliders[0].value = 1.0
    final = view.state.cached_propagation()
    path = final.path
    assert np.array_equal(path.recorded, brightness(final.recorded)) and np.array_equal(path.edited,
                                                                                       brightness(final.edited))
    assert path.moved == pytest.approx(float(np.linalg.norm(path.edited[-1] - path.recorded[-1])))
    assert path.predicted == (1, 2, 3)  # frame 0 is given: it says nothing about the edit
    assert path.describe() in repr(view) and path.describe().startswith("colour moved ")
    assert " u at the last frame (r " in path.describe()
    assert path.describe() in view.final_status.value


def test_a_readout_that_fails_says_so_in_the_view(traj):
    import html

    from workbench.inspect import Readout

    view = AblationSliders(traj, step=2, readout=Readout(lambda f: np.zeros((2, 3)), name="broken"))
    status = html.unescape(view.final_status.value)
    assert "carrying the edit to the last step failed: InspectError: The readout 'broken' returned shape (2, 3) " \
           "for 4 frames; it must return one position per frame, [4, D]." in status
    assert isinstance(view.final_error, InspectError)


def saturation(panel) -> float:
    """How far the strongest colour of a drawn difference is from white (0: white; ~1.3: full red or blue)."""
    return float((255 - panel.colored().astype(np.float64)).max() / 255 + (255 - panel.colored()).mean() / 255)


def test_two_edits_of_different_size_show_different_colour_strength_on_the_views_one_scale(traj):
    assert AblationSliders(traj, step=2, propagate=False).fixed_range == 1.0  # by default: ±1, [-1, 1] RGB units
    # this random tiny model changes its pictures by ~1e-4: a range of that size, fixed for the view
    probe = Ablation(traj, step=2, colour_range=None)
    probe.set(0, 1.0)
    peak = float(np.abs(probe.images()[2].frames).max())
    view = AblationSliders(traj, step=2, dim_names=DIMS, propagate=False, colour_range=peak)
    assert view.scale_menu.value == "fixed" and view.fixed_range == peak
    shown = []
    for value in (0.1, 1.0):  # a small edit, a large one
        view.sliders.sliders[0].value = value
        panel = view.state.panels(view.frame_slider.value)[0][2]
        shown.append((panel.limit, saturation(panel), float(np.abs(panel.image).max()), panel.title))
    (small_limit, small, small_peak, title), (large_limit, large, large_peak, _) = shown
    assert small_limit == large_limit == peak and title == f"edited − recorded\ncolours ±{peak:.2g} fixed"
    assert small_peak < large_peak and small < large - 0.05  # the larger edit, the stronger colour
    assert f"colour scale fixed at ±{peak:.2g} for this view" in view.status.value
    # following each edit, both reach the ends of their range: the same strength, whatever the size (the old lie)
    view.scale_menu.value = "edit"
    strengths = []
    for value in (0.1, 1.0):
        view.sliders.sliders[0].value = value
        panel = view.state.panels(view.frame_slider.value)[0][2]
        strengths.append(saturation(panel))
        assert panel.limit == pytest.approx(float(np.abs(view.state.images()[2].frames).max()))
        assert f"colours ±{panel.limit:.2g}, this edit's own" in panel.title
    assert strengths[0] == pytest.approx(strengths[1], abs=0.15) and "follows each edit" in view.status.value


def test_the_final_difference_keeps_the_views_scale_too(traj):
    view = AblationSliders(traj, step=2, dim_names=DIMS)
    view.sliders.sliders[0].value = 1.0
    view.settle()
    assert view._final_shown_limit == 1.0
    final = view._shown.panels(view.frame_slider.value, 1.0, "±1 fixed")[2]
    assert final.limit == 1.0 and final.title.endswith("colours ±1 fixed")
    view.scale_menu.value = "edit"
    assert view._final_shown_limit == pytest.approx(float(np.abs(view._shown.difference).max()))


def test_a_colour_range_is_a_positive_number_or_none(traj):
    assert AblationSliders(traj, step=2, colour_range=0.25, propagate=False).state.images()[2].limit == 0.25
    free = AblationSliders(traj, step=2, colour_range=None, propagate=False)
    assert free.scale_menu.value == "edit" and [v for _, v in free.scale_menu.options] == ["edit", "held"]
    with pytest.raises(InspectError, match=r"colour_range=-1 is not a colour range; it must be a positive number"):
        AblationSliders(traj, step=2, colour_range=-1)


def test_a_held_colour_scale_stays_while_the_edits_grow(traj):
    view = AblationSliders(traj, step=2, dim_names=DIMS, propagate=False)
    view.scale_menu.value = "edit"
    view.sliders.sliders[0].value = 0.2
    small = view.state.images()[2].limit
    view.scale_menu.value = "held"
    view.sliders.sliders[0].value = 1.0
    image = view.state.images()[2]
    assert image.limit == small and np.abs(image.frames).max() > small  # stronger colour, same range
    assert "held range" in image.label and "colour scale held" in view.status.value
    view.scale_menu.value = "edit"
    assert view.state.images()[2].limit == pytest.approx(float(np.abs(image.frames).max()))


def test_the_next_move_cancels_a_propagation_in_flight_without_holding_up_the_sliders(traj, model):
    import asyncio
    import time

    denoise = model.base.denoise
    model.base.denoise = lambda *a, **k: (time.sleep(0.05), denoise(*a, **k))[1]  # a slower base

    async def use() -> AblationSliders:
        view = AblationSliders(traj, step=0, dim_names=DIMS)
        await asyncio.sleep(0)  # the first picture
        view.settle()
        view.sliders.sliders[0].value = 1.0
        await asyncio.sleep(0)  # the instant picture is drawn, the fork starts in the background
        assert "dx=+1.00" in view.status.value and view.state.cached_propagation() is None  # not there yet
        assert "re-sampling steps 0–3 with dx=+1.00" in view.final_status.value
        view.sliders.sliders[0].value = -1.0  # cancels it after its current step
        await asyncio.sleep(0)
        while "workbench-stale" in view.final_image._dom_classes:  # until the final picture of the edit is in
            await asyncio.sleep(0.02)
        return view

    try:
        view = asyncio.run(use())
    finally:
        del model.base.denoise
    final = view.state.cached_propagation()
    assert final is not None and final.edits == ["dx=-1.00"]
    assert len(view.state._propagated) == 2  # the recording (no edit) and dx=-1; dx=+1 never finished
    expected = traj.fork(at=0, cond={"action": view.state.edit.values}).final
    assert torch.equal(final.trajectory.final, expected)
    assert "final prediction with dx=-1.00 from step 0" in view.final_status.value


def test_a_save_while_an_edit_is_carried_through_keeps_no_final_picture_of_the_edit_before(traj, model, monkeypatch):
    import asyncio
    import time

    import ipywidgets

    from workbench.widgets import ablation as ablation_module
    from workbench.widgets.static import _parts

    marked = []
    monkeypatch.setattr(ablation_module, "mark_modified", lambda: marked.append(view.final_image.value))
    denoise = model.base.denoise
    model.base.denoise = lambda *a, **k: (time.sleep(0.05), denoise(*a, **k))[1]  # a slower base
    view = AblationSliders(traj, step=0, dim_names=DIMS)  # no event loop: the recorded run's final, at once

    def saved() -> list[str]:  # what a save keeps of the view, as JupyterLab's widget state holds it now
        state = ipywidgets.Widget.get_manager_state(drop_defaults=True)["state"]
        return [kind if kind == "image" else " / ".join(value) for kind, value in _parts(state, view.model_id)]

    before = saved()
    assert [part for part in before if part == "image"] == ["image", "image"]  # the instant and the final picture

    async def edit_and_save():
        view.sliders.sliders[0].value = 1.0
        await asyncio.sleep(0)  # the instant picture is drawn, the edit is carried through in the background
        during = saved()
        while "workbench-stale" in view.final_image._dom_classes:  # until the final picture of the edit is in
            await asyncio.sleep(0.02)
        return during

    try:
        during = asyncio.run(edit_and_save())
    finally:
        del model.base.denoise
    # while it ran: the new instant picture and the line saying the final one is coming, not the old final picture
    assert [part for part in during if part == "image"] == ["image"]
    assert "edited: dx=+1.00" in during[0] and during[-1] == "re-sampling steps 0–3 with dx=+1.00 …"
    after = saved()
    assert [part for part in after if part == "image"] == ["image", "image"]
    assert "final prediction with dx=+1.00 from step 0 of 4" in after[2]
    assert marked == [view.final_image.value]  # once its picture was in: JupyterLab marks the notebook modified


def test_ablation_slider_on_one_frame_and_another_step(traj):
    view = AblationSliders(traj, step=1, dim_names=DIMS)
    view.sliders.frame_select.value = 3
    view.sliders.sliders[2].value = 0.8
    assert view.state.describe_edits() == ["dz=+0.80@f3"]
    first = view.state.change()
    view.step_slider.value = 3
    assert view.state.step == 3 and view.state.change() != first
    before = picture(view)
    view.frame_slider.value = 1
    assert changed(before, picture(view))


def test_ablation_dim_names_must_match(traj):
    with pytest.raises(InspectError, match="dim_names has 2 names for the 4 dimensions"):
        AblationSliders(traj, dim_names=["a", "b"])


# -- Condition probe -------------------------------------------------------------------------
def test_condition_probe_table_and_plots(model):
    raw = raw_batch()
    view = ConditionProbe(model, raw, dim_names={"action": DIMS})
    assert "<td style='padding:2px 8px'>action</td>" in view.table.value
    assert "first_frame" in view.table.value
    text = repr(view)
    assert text.splitlines()[2].split()[:3] == ["action", "action", "(2,"]
    before = picture(view)
    view.index_select.value = 1
    assert changed(before, picture(view))


def test_condition_probe_shows_training_dropout():
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1, dropout=0.5)
    model = ComposedModel(base, adapter, GatedResidual(), base.default_objective())
    model.train()
    raw = raw_batch(b=8)
    view = ConditionProbe(model, raw)
    assert "dropped" in repr(view)
    assert view.step is None and "no dropout" in view.note.value  # what sampling passes
    view.step_box.value = 3  # a step typed in: training's view of it
    assert view.when_select.value == "training" and view.step == 3
    row = next(r for r in view.rows if r["name"] == "action")
    assert row["dropout_applied"] and row["dropped"] == int(adapter.view(raw, step=3).dropped("action").sum())
    assert "exactly what training step 3 passed" in view.note.value
    model.train(False)
    view.refresh()
    assert "the adapter is in eval mode, so no dropout applies" in view.note.value
    view.when_select.value = "sampling"
    assert view.step is None


# -- Gates -----------------------------------------------------------------------------------
def tiny_exp(composer=None) -> AdapterExperiment:
    torch.manual_seed(0)
    base = tiny_base()
    return AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1),
                             composer=composer or NoiseGated(GatedResidual(), lo=0.3, hi=0.9),
                             training=TrainingConfig(steps=20, learning_rate=3e-3, batch_size=4, sync_every=1))


DATA = SyntheticMoves(items=16, frames=4, size=16)


def test_gates_over_noise_levels_training_and_space():
    exp = tiny_exp()
    exp.fit(DATA, steps=20, progress=False)
    traj = exp.sample(raw_batch(), steps=STEPS, seed=0)
    view = Gates(exp, batch=raw_batch(), trajectory=traj)
    assert list(view.history["step"]) == [10.0, 20.0]
    weight = view.weight
    assert weight[0] == 0 and weight[1] == 0 and weight[-1] > 0  # the band is [0.3, 0.9]
    assert weight[3] == pytest.approx(exp.model.composer.inner.effective_gate().item(), rel=1e-4)
    assert view.band == (0.3, 0.9)
    before = picture(view)
    view.step_slider.value = 0  # noise 1.0, outside the band: the map is 0
    assert changed(before, picture(view))
    assert repr(view).startswith("Gates: adapter weight by noise level {0.1: 0.000, 0.2: 0.000, 0.3:")


def test_gates_of_a_bare_model_without_history(model):
    view = Gates(model)
    assert view.history is None and view.step_slider is None
    assert view.weight[0] == 0 and view.weight[4] == pytest.approx(0.5)
    with pytest.raises(InspectError, match="Gates needs an AdapterExperiment or a ComposedModel"):
        Gates(object())


# -- Action sensitivity ----------------------------------------------------------------------
def test_action_sensitivity_heatmap_and_toggle(model):
    view = ActionSensitivity(model, raw_batch(), levels=(0.3, 0.6, 0.9), dim_names=DIMS)
    assert view.result.x0.shape == (3, 4)
    before = picture(view)
    view.quantity_select.value = "adapter"
    assert changed(before, picture(view))
    assert repr(view).startswith("ActionSensitivity: x0 sensitivity per unit action, max ")


# -- Fit -------------------------------------------------------------------------------------
def weights(exp):
    return {k: v.clone() for k, v in exp.model.trainable_state_dict().items()}


def test_fit_stop_button_ends_after_a_completed_step_and_resume_continues():
    reference = tiny_exp().fit(DATA, steps=6, progress=False)
    exp = tiny_exp()
    fit = Fit(exp, DATA, steps=6)
    empty = picture(fit)
    reached, release = threading.Event(), threading.Event()

    def press_stop_at_step_2(session, event):
        if event == "step" and exp.step == 2:
            fit.stop_button.click()  # as a person would, while the run is going
            reached.set()
            assert release.wait(30)

    fit.session.add_listener(press_stop_at_step_2)
    fit.train_button.click()
    assert reached.wait(30)
    assert fit.stop_button.disabled is False or fit.session.state == "stopping"
    release.set()
    fit.wait()
    assert fit.session.state == "stopped" and exp.step == 2 and fit.progress.value == 2
    assert fit.train_button.description == "resume" and not fit.train_button.disabled
    assert changed(empty, picture(fit))  # the loss plot has its two steps
    assert picture(fit).shape == empty.shape
    fit.train_button.click()  # resume
    fit.wait()
    assert exp.step == 6 and fit.session.state == "done" and fit.progress.value == 6
    assert all(torch.equal(a, b) for a, b in zip(weights(exp).values(), weights(reference).values()))
    assert repr(fit) == f"Fit: step 6/6, loss {exp.loss_history[-1]:.4f} (done)"
    assert fit.train_button.description == "train more"
    fit.steps_box.value = 2
    fit.train_button.click()
    fit.wait()
    assert exp.step == 8 and fit.progress.max == 8


def test_a_stopped_fit_plots_the_steps_it_trained_not_the_planned_run(monkeypatch):
    from workbench.widgets import render

    drawn = []
    loss_figure = render.loss_figure
    monkeypatch.setattr(render, "loss_figure", lambda *a, **k: (drawn.append(a), loss_figure(*a, **k))[1])
    exp = tiny_exp()
    fit = Fit(exp, DATA, steps=1000)
    assert drawn[-1][2] == 1000  # nothing trained yet: the planned run
    fit.session.add_listener(lambda session, event: event == "step" and fit.stop())
    fit.start()
    fit.wait()
    assert fit.session.state == "stopped" and exp.step == 1
    steps, losses, target = drawn[-1][:3]
    assert steps == [1] and target is None  # the axis spans what was trained: one point, inside it


def test_fit_run_blocks_and_the_experiment_is_usable_next():
    exp = tiny_exp()
    fit = Fit(exp, DATA, steps=3).run()
    assert exp.step == 3 and fit.session.state == "done"
    traj = exp.sample(raw_batch(), steps=2, seed=0)
    assert traj.complete


def test_fit_view_makes_no_step_wait_for_the_device():
    """The widget's run reads losses back only at the experiment's sync points (see DeviceReads)."""
    exp = tiny_exp()
    exp.training = dataclasses.replace(exp.training, sync_every=4)
    items = [DATA[i] for i in range(4)]  # batches made up front: data loading runs on the host anyway
    loader = [{k: torch.stack([item[k] for item in items]) for k in items[0]}] * 8
    fit = Fit(exp, loader, steps=1).run()  # warm up
    with DeviceReads() as reads:
        fit.run(steps=7)
    assert reads.calls == ["cpu in _sync", "tolist in _sync"] * 2  # steps 4 and 8
    assert fit.session.history == list(zip(range(1, 9), exp.loss_history))
    assert repr(fit) == f"Fit: step 8/8, loss {exp.loss_history[-1]:.4f} (done)"


def test_fit_start_returns_at_once():
    exp = tiny_exp()
    fit = Fit(exp, DATA, steps=3)
    gate = threading.Event()
    fit.session.add_listener(lambda s, e: gate.wait(30) if e == "step" else None)
    fit.start()
    assert fit.session.running and fit.train_button.disabled and not fit.stop_button.disabled
    gate.set()
    fit.wait()
    assert exp.step == 3


# -- imports ---------------------------------------------------------------------------------
def test_importing_the_widgets_package_is_light():
    code = ("import sys, json, workbench.widgets as w; names = dir(w); "
            "print(json.dumps([m for m in ('ipywidgets', 'matplotlib') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    with pytest.raises(AttributeError, match="views: AblationSliders, ActionSensitivity"):
        __import__("workbench.widgets", fromlist=["x"]).Steper  # noqa: B018


def test_awaiting_a_fit_keeps_the_loop_free_so_stop_is_handled_meanwhile():
    import asyncio

    exp = tiny_exp()
    fit = Fit(exp, DATA, steps=40)
    statuses = []

    async def notebook():
        fit.start()
        waiting = asyncio.ensure_future(fit.finished())  # the cell that waits for the run
        while exp.step < 2:  # meanwhile the loop serves other messages: a click on stop
            await asyncio.sleep(0.01)
        statuses.append(fit.status.value)
        fit.stop_button.click()
        return await asyncio.wait_for(waiting, timeout=60)

    assert asyncio.run(notebook()) is fit
    assert fit.session.state == "stopped" and 2 <= exp.step < 40
    assert "steps/s · ETA " in statuses[0] and " · lr 0.003" in statuses[0]  # while running
    # the status has a line of its own under the controls (beside them it wrapped), and never wraps
    assert fit.children[1] is fit.status and statuses[0].startswith("<div style='white-space:nowrap'>step ")
    assert fit.train_button.description == "resume"


def test_the_loss_average_is_bias_corrected_not_seeded_by_the_first_loss():
    from workbench.widgets.render import _ema

    flat = _ema([2.0] * 5, 0.9)
    assert np.allclose(flat, 2.0)  # an unchanging loss averages to itself from the first step
    drop = _ema([10.0, 1.0, 1.0], 0.9)
    weights = np.array([0.9 * 0.1, 0.1])
    assert drop[1] == pytest.approx((weights @ [10.0, 1.0]) / weights.sum())  # 5.26, not 9.1 as a seeded average
    assert drop[2] < drop[1] < drop[0] == 10.0


def test_a_notebook_saved_through_the_hook_keeps_views_as_pictures_and_other_widgets_as_they_are(traj):
    from workbench.widgets.static import HOOK, WIDGET_VIEW, keep_static_on_save

    view = Stepper(traj)
    bundle = view._repr_mimebundle_()
    assert WIDGET_VIEW in bundle  # live: the widget, with its picture and text beside it
    other = {WIDGET_VIEW: {"model_id": "x", "version_major": 2, "version_minor": 0}, "text/plain": "IntSlider()"}
    cells = [{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": dict(bundle)}]},
             {"cell_type": "code", "outputs": [{"output_type": "display_data", "data": dict(other)}]},
             {"cell_type": "markdown"}]
    model = {"type": "notebook", "content": {"cells": cells, "metadata": {}}}
    keep_static_on_save(model=model, path="a.ipynb", contents_manager=None)
    saved = model["content"]["cells"]
    assert sorted(saved[0]["outputs"][0]["data"]) == ["image/png", "text/plain"]
    assert saved[0]["outputs"][0]["data"]["image/png"] == bundle["image/png"]
    assert saved[1]["outputs"][0]["data"] == other  # a widget without a picture stays live
    keep_static_on_save(model={"type": "file", "content": "text"})  # other files: untouched, no error
    assert f"{keep_static_on_save.__module__}.{keep_static_on_save.__name__}" == HOOK


def test_with_the_saved_widget_state_a_view_is_saved_as_it_is_now_not_as_its_cell_left_it(traj):
    import ipywidgets

    from workbench.widgets.static import STATE, WIDGET_VIEW, keep_static

    view = AblationSliders(traj, step=2, dim_names=DIMS, propagate=False)
    bundle = view._repr_mimebundle_()  # what the cell displayed: nothing edited
    view.sliders.sliders[0].value = 1.0  # then, in the browser, an edit
    view.flush()
    state = ipywidgets.Widget.get_manager_state(drop_defaults=True)  # as JupyterLab saves it
    cells = [{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": dict(bundle)}]}]
    notebook = {"cells": cells, "metadata": {"widgets": {STATE: state}}}
    assert keep_static(notebook) == 1
    data = notebook["cells"][0]["outputs"][0]["data"]
    assert sorted(data) == ["image/png", "text/plain"] and "widgets" not in notebook["metadata"]
    assert data["text/plain"].startswith("AblationSliders: x0 change (RMS, latent units): ")
    assert "edited: dx=+1.00" in data["text/plain"]  # the state it was saved in
    saved = render.png_array(base64.b64decode(data["image/png"]))[..., :3]
    assert np.array_equal(saved, render.png_array(view.static_png())[..., :3])  # what the kernel would draw now
    # a widget that is not a view keeps the saved state it needs
    other = {WIDGET_VIEW: {"model_id": "x", "version_major": 2, "version_minor": 0}}
    cells.append({"cell_type": "code", "outputs": [{"output_type": "display_data", "data": other}]})
    cells[0]["outputs"][0]["data"] = dict(bundle)
    notebook["metadata"]["widgets"] = {STATE: state}
    assert keep_static(notebook) == 1 and "widgets" in notebook["metadata"]
