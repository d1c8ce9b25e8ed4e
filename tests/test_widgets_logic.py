"""The logic behind the notebook views (workbench.inspect: views, ablation, colours; the live
fit, workbench.train.FitSession), tested without any widget: what each view shows, that
scrubbing and sliders reuse what was computed, and that a background fit stops at a step
boundary and resumes exactly."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import BaseCalls, nonzero_model, raw_batch, tiny_base

from workbench import AdapterExperiment, Add, Batch, GatedResidual, MaskMix, NoiseGated, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.data.synthetic import SyntheticMoves
from workbench.errors import CallbackError, InspectError, StepError
from workbench.inspect import (
    VIEWS,
    Ablation,
    ConditionEdit,
    GatesState,
    StepperState,
    record,
    swap_conditions,
    view_image,
)
from workbench.inspect.cache import LRUCache
from workbench.inspect.previews.colors import colorize, lut
from workbench.inspect.probes.gates import find_gate_history
from workbench.inspect.probes.sensitivity import condition_plots
from workbench.inspect.views import effective_gate_map
from workbench.inspect.views import given_frames as _given
from workbench.train import FitSession

STEPS = 4


@pytest.fixture(autouse=True)
def preview_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))





@pytest.fixture
def model():
    return nonzero_model()


@pytest.fixture
def traj(model):
    return record(model, model.base.prepare_batch(raw_batch()), steps=STEPS, seed=0)


# -- colours ---------------------------------------------------------------------------------
def test_diverging_map_is_white_at_zero_blue_below_red_above():
    rgb = colorize(np.array([-1.0, 0.0, 1.0]), "diverging", -1, 1).astype(int)
    assert (rgb[1] > 240).all()
    assert rgb[0, 2] > rgb[0, 0] and rgb[2, 0] > rgb[2, 2]
    assert lut("sequential").shape == (256, 3)
    with pytest.raises(InspectError, match="Unknown colour map 'rainbow'"):
        lut("rainbow")


# -- what each view shows ----------------------------------------------------------------------
@pytest.mark.parametrize("view", VIEWS)
def test_every_view_renders_every_frame(traj, view):
    image = view_image(traj, 2, view)
    assert len(image) == 4 and "step 2 of 4" in image.caption
    if image.kind == "rgb":
        assert image.frames.dtype == np.uint8 and image.frames.shape == (4, 16, 16, 3)
    else:
        assert image.frames.dtype == np.float32 and image.frames.ndim == 3
    assert image.given == (True, False, False, False)  # tiny_video is given frame 0
    assert image.frame(1).colored().shape[-1] == 3


def test_given_frames_follow_a_causal_vae_layout():
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])  # per latent frame; 0: given
    batch = Batch(latents=torch.zeros(2, 4, 3, 2, 2), cond={}, loss_mask=mask)
    assert _given(batch, 0, 3) == (True, False, False)  # frames = latent frames
    assert _given(batch, 0, 9) == (True,) + (False,) * 8  # frame 0 alone, then 4 frames per latent frame
    assert _given(batch, 1, 9) == (True,) * 5 + (False,) * 4
    assert _given(batch, 1, 5) == (True, True, True, False, False)  # 2 frames per latent frame (a preview)
    assert _given(batch, 0, 8) == ()  # no causal layout fits: no labels rather than wrong ones


@pytest.mark.parametrize("view", ["x0", "x_t"])
def test_picture_views_are_the_trajectory_frames(traj, view):
    assert np.array_equal(view_image(traj, 1, view).frames, traj.frames(1, kind=view))


def test_the_composed_prediction_is_a_signed_map_with_a_colour_bar_that_names_it(traj, model):
    from workbench.inspect.previews.linear_preview import preview_for

    image = view_image(traj, 1, "composed")
    z = traj[1].composed[:1]
    expected = preview_for(model.base, tuple(z.shape[1:])).linear(z)[0].float().mean(dim=0).numpy()
    assert image.kind == "signed" and np.array_equal(image.frames, expected)
    assert image.label == "composed prediction (velocity; linear preview, mean RGB)"  # flow matching's
    assert image.limit == pytest.approx(float(np.abs(expected).max()))


def test_where_the_adapter_is_off_its_views_say_so_instead_of_failing(traj):
    off = traj.fork(at=0, with_adapter=False, label="base alone")
    image = view_image(off, 2, "adapter")  # nothing ran: an empty map, not an InspectError
    assert (image.frames == 0).all() and image.note == "adapter off here (this branch runs the base alone)"
    gate = view_image(off, 2, "gate")
    assert gate.note == "effective weight 0.00 · adapter off here (this branch runs the base alone)"
    assert view_image(off, 2, "adapter-base").frame(1).note == "adapter off here (this branch runs the base alone)"
    assert view_image(traj, 2, "adapter").note == ""  # the run itself: the adapter acts
    assert view_image(traj, 2, "gate").note == "effective weight 0.50"


def test_outside_a_noise_band_the_views_name_the_band_and_show_the_effective_weight():
    model = nonzero_model(composer=NoiseGated(GatedResidual(gate_init=0.5), lo=0.3, hi=0.9))
    traj = record(model, model.base.prepare_batch(raw_batch()), steps=STEPS, seed=0)
    # noise levels 1.0, 0.75, 0.5, 0.25: steps 0 and 3 lie outside [0.3, 0.9]
    outside = "adapter off here (NoiseGated band 0.30–0.90, noise level 0.25)"
    assert view_image(traj, 3, "adapter").note == outside  # the adapter ran; its output has weight 0 here
    assert np.abs(view_image(traj, 3, "adapter").frames).max() > 0
    assert view_image(traj, 3, "gate").note == f"effective weight 0.00 · {outside}"
    assert view_image(traj, 0, "gate").note.endswith("(NoiseGated band 0.30–0.90, noise level 1.00)")
    assert view_image(traj, 2, "gate").note == "effective weight 0.50"
    stepper = StepperState(traj, view="adapter")
    stepper.seek(3)
    assert stepper.panels()[0].note == outside


def test_base_view_is_the_x0_estimate_of_the_base_alone(traj, model):
    rec = traj[2]
    expected = model.objective.x0_from_prediction(rec.base, rec.x_t, rec.t)
    assert np.array_equal(view_image(traj, 2, "base").frames, traj.render(expected))


def test_adapter_minus_base_is_zero_where_the_adapter_is_off(traj):
    assert np.abs(view_image(traj, 2, "adapter-base").frames).max() > 0
    off = traj.fork(at=0, with_adapter=False)
    assert np.abs(view_image(off, 2, "adapter-base").frames).max() == 0


def test_view_names_accept_the_display_spelling(traj):
    state = StepperState(traj, view="adapter − base")
    assert state.view == "adapter-base"
    with pytest.raises(InspectError, match="view='x00' is not allowed.*Did you mean 'x0'"):
        state.set_view("x00")


# -- gates -----------------------------------------------------------------------------------
GATE_CASES = [
    ("gated 0.5", lambda: GatedResidual(gate_init=0.5), 0.5),
    ("add", Add, 1.0),
    ("noise-gated, outside the band", lambda: NoiseGated(GatedResidual(gate_init=0.5), lo=0.0, hi=0.1), 0.0),
    ("noise-gated, inside the band", lambda: NoiseGated(GatedResidual(gate_init=0.5), lo=0.0, hi=1.0), 0.5),
]


@pytest.mark.parametrize("name,make,expected", GATE_CASES, ids=[c[0] for c in GATE_CASES])
def test_effective_gate_map(name, make, expected):
    model = nonzero_model(composer=make())
    traj = record(model, model.base.prepare_batch(raw_batch()), steps=STEPS, seed=0)
    gate = effective_gate_map(traj[1])  # noise level 0.75
    assert gate.shape == (4, 4, 4)
    np.testing.assert_allclose(gate, expected, rtol=1e-6)


def test_mask_mix_gate_map_is_its_spatial_mask():
    composer = MaskMix(channels=4, identity_init=False, gate_init=0.3)
    with torch.no_grad():
        composer.mask_net.weight.normal_(0, 1.0)
    model = nonzero_model(composer=composer)
    traj = record(model, model.base.prepare_batch(raw_batch()), steps=STEPS, seed=0)
    gate = effective_gate_map(traj[1], index=1)
    np.testing.assert_allclose(gate, traj[1].diagnostics.mask[1, 0].numpy(), rtol=1e-6)
    assert gate.std() > 0


def test_gate_map_is_zero_with_the_adapter_off(traj):
    off = traj.fork(at=0, with_adapter=False)
    assert (effective_gate_map(off[1]) == 0).all()


def test_gates_state_probes_levels_reads_the_band_and_maps_a_step():
    model = nonzero_model(composer=NoiseGated(GatedResidual(gate_init=0.5), lo=0.3, hi=0.9))
    traj = record(model, model.base.prepare_batch(raw_batch()), steps=STEPS, seed=0)
    state = GatesState(model, trajectory=traj, levels=(0.1, 0.5, 0.97))
    assert state.band == (0.3, 0.9) and state.history is None
    np.testing.assert_allclose(state.weight, [0.0, 0.5, 0.0], atol=1e-6)
    assert (state.step, state.frame, state.frames) == (2, 1, 4)  # the middle stored step, frame 1
    assert state.seek(0) == 0  # noise level 1.0: outside the band, the map is 0
    assert (state.map_panel().image == 0).all() and "gate map · step 0 of 4" in state.map_panel().title
    state.seek(-2)  # noise level 0.5: inside, the gate itself
    np.testing.assert_allclose(state.map_panel().image, 0.5, rtol=1e-6)
    summary = state.describe()
    assert summary.startswith("adapter weight by noise level {0.1: 0.000, 0.5: 0.500, 1.0: 0.000}; gate_mean=0.5000")
    assert summary.endswith("map at step 2, frame 1")
    with pytest.raises(InspectError, match="frame=4 is out of range: the gate map has 4 frames"):
        state.set_frame(4)
    bare = GatesState(model)
    assert bare.map_panel() is None
    with pytest.raises(InspectError, match="no trajectory, so no gate map"):
        bare.seek(0)
    with pytest.raises(InspectError, match="Gates needs an AdapterExperiment or a ComposedModel, got int"):
        GatesState(3)


def test_lru_cache_computes_once_and_drops_the_least_recent():
    cache, calls = LRUCache(2), []

    def compute(k):
        calls.append(k)
        return k * 10

    assert cache.get("a", lambda: compute(1)) == 10 and cache.get("a", lambda: compute(9)) == 10
    cache.get("b", lambda: compute(2))
    cache.get("a", lambda: compute(9))  # "a" is now the most recent
    cache.get("c", lambda: compute(3))  # drops "b"
    assert calls == [1, 2, 3] and "a" in cache and "b" not in cache and len(cache) == 2


# -- the stepper state -------------------------------------------------------------------------
def test_stepper_state_navigates_stored_steps_only(model):
    from workbench.inspect import StoragePolicy

    traj = record(model, model.base.prepare_batch(raw_batch()), steps=5, seed=0, storage=StoragePolicy(every=2))
    state = StepperState(traj)
    assert state.steps == (0, 2, 4)
    assert state.step_by(1) == 2 and state.step_by(5) == 4 and state.step_by(-9) == 0
    with pytest.raises(StepError, match="Step 1 was not stored"):
        state.seek(1)
    with pytest.raises(StepError, match="frame=4 is out of range: the video has 4 frames"):
        state.set_frame(4)


def test_stepper_state_caches_pictures_and_forks_side_by_side(traj, model):
    state = StepperState(traj)
    state.seek(2)
    calls = BaseCalls(model)
    first = state.panels()  # the last frame by default
    state.set_frame(0)
    state.set_frame(3)
    assert calls.count == 0  # scrubbing frames reuses the cached pictures
    assert np.array_equal(state.panels()[0].image, first[0].image)
    fork = state.fork_here(cond={"action": torch.full((4, 4), 0.9)})
    assert calls.count == STEPS - 2  # the prefix is replayed, steps 2..3 run live
    assert torch.equal(fork[1].x_t, traj[1].x_t)
    panels = state.panels()
    assert [p.title for p in panels] == [traj.label, fork.label]
    assert state.caption() == "x0 estimate · step 2 of 4 · noise level 0.50 · frame 3"
    state.set_frame(0)
    assert state.caption().endswith("frame 0 (given)")
    with pytest.raises(InspectError, match="only forks"):
        state.remove_branch(0)
    state.remove_branch(1)
    assert len(state.branches) == 1


def test_signed_panels_of_all_branches_share_one_colour_range(traj):
    state = StepperState(traj, view="adapter-base")
    state.seek(2)
    state.fork_here(cond={"action": torch.full((4, 4), 0.9)})
    limits = {p.limit for p in state.panels()}
    assert len(limits) == 1 and limits.pop() == max(state.view_image(b).limit for b in (0, 1))


def test_an_all_zero_difference_does_not_set_the_shared_colour_range(traj):
    state = StepperState(traj, view="adapter-base")
    state.seek(2)
    state.fork_here(with_adapter=False)  # the base alone: its adapter − base is zero everywhere
    run, alone = state.view_image(0), state.view_image(1)
    assert not np.any(alone.frames) and alone.limit == 1.0  # alone, its own range says nothing
    assert 0 < run.limit < 1.0
    assert {p.limit for p in state.panels()} == {run.limit}  # symmetric: ± the run's largest difference
    assert {p.vrange for p in state.panels()} == {(-run.limit, run.limit)}


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_export_writes_a_readable_video_of_steps_by_branches(traj, tmp_path, suffix):
    import imageio.v3 as iio

    state = StepperState(traj, view="adapter-base")
    state.seek(1)
    state.fork_here(with_adapter=False)
    path = state.export(tmp_path / f"steps{suffix}", scale=2)
    video = iio.imread(path, index=None)
    assert video.shape[0] == 4  # every frame of the clip plays
    assert video.shape[1] > 4 * 32 and video.shape[2] > 2 * 32  # 4 rows (steps) x 2 columns (branches) of 32 px
    assert video.std() > 0


# -- condition edits and ablation --------------------------------------------------------------
def test_condition_edit_sets_all_or_one_frame_and_resets(traj):
    edit = ConditionEdit(traj.model, traj.batch, "actions")  # an alias names the same condition
    assert (edit.dims, edit.frames, edit.key) == (4, 4, "action")
    assert edit.overrides() is None
    edit.set(3, 0.5)
    assert (edit.values[..., 3] == 0.5).all() and edit.get(3) == 0.5
    edit.set(0, -1.0, frame=2)
    assert edit.get(0, frame=2) == -1.0 and edit.get(0, frame=1) == float(edit.original[0, 1, 0])
    assert set(edit.overrides()) == {"actions"}
    edit.reset(3)
    assert torch.equal(edit.values[..., 3], edit.original[..., 3])
    edit.reset()
    assert not edit.changed


@pytest.mark.parametrize("call,match", [
    (lambda e: e.set(4, 0.0), r"dim=4: 'action' has 4 dimensions \(0..3\)"),
    (lambda e: e.set(0, 0.0, frame=9), r"frame=9 is out of range: 'action' has 4 frames"),
    (lambda e: e.set(True, 0.0), "dim=True"),
])
def test_condition_edit_errors_name_the_allowed_values(traj, call, match):
    with pytest.raises(InspectError, match=match):
        call(ConditionEdit(traj.model, traj.batch))


def test_unknown_condition_names_what_exists(traj):
    with pytest.raises(InspectError, match="condition='acton' is not a condition.*Did you mean one of 'action'"):
        ConditionEdit(traj.model, traj.batch, "acton")


def test_unedited_ablation_reproduces_the_recording(traj):
    abl = Ablation(traj, step=2)
    assert abl.change() == 0.0
    before, after, diff = abl.images()
    assert np.array_equal(before.frames, after.frames) and np.abs(diff.frames).max() == 0
    assert np.array_equal(before.frames, traj.frames(2, kind="x0"))


def test_ablation_reuses_the_base_output_and_caches_results(traj, model):
    abl = Ablation(traj, step=2)
    calls = BaseCalls(model)
    abl.set(3, 0.9)
    first = abl.ablated_x0()
    abl.set(3, -0.9)
    abl.ablated_x0()
    abl.set(3, 0.9)
    again = abl.ablated_x0()
    assert calls.count == 0  # only the adapter and the composer ran
    assert abl.evaluations == 2 and torch.equal(first, again)  # the third move was served from the cache
    assert abl.change() > 0
    assert abl.describe_edits() == ["d3=+0.90"]


def test_a_slider_move_decodes_the_frame_it_shows_and_draws_what_every_frame_gives(traj, model):
    decoded = []
    decode = model.base.decode
    model.base.decode = lambda z, *a, **k: (decoded.append(z.shape[2]), decode(z, *a, **k))[1]
    try:
        abl = Ablation(traj, step=2, decode="full")
        abl.panels(frame=0)
        abl.set(0, 0.6)
        decoded.clear()
        shown, caption = abl.panels(frame=3)
        assert decoded == [1, 1]  # the edited and the recorded x0 at frame 3, one latent frame each
        decoded.clear()
        abl.set(0, -0.4)
        shown, _ = abl.panels(frame=3)
        assert decoded == [1]  # the recorded frame is kept
        whole = abl.images()  # every frame
        assert abl.images(frame=3)[0].partial and not whole[0].partial
        for got, image in zip(shown, whole):
            expected = image.frame(3)
            assert got.title == expected.title and got.limit == expected.limit == 1.0
            if got.kind == "rgb":  # a frame decoded alone is that frame of the clip (in float, to rounding)
                assert np.array_equal(got.image, expected.image)
            else:
                assert np.allclose(got.image, expected.image, rtol=0, atol=1e-6)
        assert caption == f"{whole[0].caption} · frame 3"
        abl.colour_range = None  # each edit's own range: it needs every frame, so every frame is decoded
        decoded.clear()
        abl.panels(frame=3)
        assert sum(decoded) == traj.batch.latents.shape[2]  # the edited clip (the recorded one is kept whole)
    finally:
        del model.base.decode


def test_ablated_prediction_equals_a_full_recompute(traj, model):
    abl = Ablation(traj, step=1)
    abl.set(0, 1.0, frame=2)
    rec = traj[1]
    batch = traj.batch
    edited = type(batch)(latents=batch.latents, cond={**batch.cond, "action": abl.edit.values},
                         loss_mask=batch.loss_mask, per_frame=batch.per_frame, meta=batch.meta)
    with torch.no_grad():
        full = model.predict(rec.x_t, rec.t, edited)
    torch.testing.assert_close(abl.prediction().composed, full.composed, rtol=0, atol=0)
    assert abl.describe_edits() == ["d0=+1.00@f2"]
    named = Ablation(traj, step=1, dim_names=["dx", "dy", "dz", "grip"])
    named.set(0, 1.0, frame=2)
    assert named.describe_edits() == ["dx=+1.00@f2"]
    with pytest.raises(InspectError, match=r"dim_names has 3 names for the 4 dimensions of 'action'; give one name"):
        Ablation(traj, dim_names=["dx", "dy", "dz"])


@pytest.mark.parametrize("step", [0, 2, 3])
def test_a_propagated_edit_is_the_fork_bit_for_bit(traj, step):
    abl = Ablation(traj, step=step)
    abl.set(1, -0.7)
    final = abl.propagate()
    fork = traj.fork(at=step, cond={"action": abl.edit.values})
    assert torch.equal(final.trajectory.final, fork.final)
    assert all(torch.equal(final.trajectory[k].x0, traj[k].x0) for k in range(step))  # the recording's prefix
    assert np.array_equal(final.recorded, traj.render(traj.final)) and np.array_equal(final.edited,
                                                                                      traj.render(fork.final))
    assert final.resampled == STEPS - step and final.edits == ["d1=-0.70"] and final.path is None
    assert abl.propagate() is final  # cached per (step, edit)
    panels = final.panels(frame=2)
    assert [p.kind for p in panels] == ["rgb", "rgb", "signed"]
    np.testing.assert_allclose(panels[2].image, final.difference[2])
    assert final.caption(0) == f"final prediction · steps {step}-3 sampled again with the edit · frame 0 (given)"


def test_an_unedited_propagation_is_the_recording_itself(traj, model):
    abl = Ablation(traj, step=2)
    calls = BaseCalls(model)
    final = abl.propagate()
    assert calls.count == 0 and final.trajectory is traj and final.resampled == 0
    assert (final.difference == 0).all() and final.describe() == "final prediction: no edit, the recorded run"


def test_a_propagation_asked_to_stop_stops_and_is_not_kept(traj, model):
    abl = Ablation(traj, step=0)
    abl.set(0, 1.0)
    calls = BaseCalls(model)
    asked = []
    assert abl.propagate(should_stop=lambda: asked.append(1) or True) is None
    assert calls.count == 1 and asked == [1]  # stopped after its first live step
    assert abl.cached_propagation() is None
    assert torch.equal(abl.propagate().trajectory.final, traj.fork(at=0, cond={"action": abl.edit.values}).final)


def test_path_comparison_says_how_far_and_where(traj):
    from workbench.inspect import Readout

    def left_right(frames):  # a made-up position: the frame index in cm along x, the mean red along y
        return np.stack([np.arange(len(frames), dtype=float), frames[..., 0].mean(axis=(1, 2)),
                         np.zeros(len(frames))], axis=1)

    abl = Ablation(traj, step=1, readout=Readout(left_right, name="hand", unit="cm"))
    abl.set(0, 1.0)
    path = abl.propagate().path
    assert path.axes == ("x", "y", "z") and path.predicted == (1, 2, 3)
    assert (path.shift[[0, 2]] == 0).all() and path.moved == pytest.approx(abs(path.shift[1]))
    assert path.mean_distance == pytest.approx(float(np.abs(path.edited[1:, 1] - path.recorded[1:, 1]).mean()))
    text = path.describe()
    assert text.startswith(f"hand moved {path.moved:.1f} cm at the last frame (x +0.0, y {path.shift[1]:+.1f}, "
                           f"z +0.0 cm)")
    assert text.endswith("on average over the predicted frames")
    assert path.describe(frame=0).startswith("hand moved 0.0 cm at frame 0")  # the given frame cannot move


def test_the_instruments_share_one_lock_per_model(model):
    from workbench.inspect.common import model_lock

    lock = model_lock(model)
    assert model_lock(model) is lock and model_lock(nonzero_model()) is not lock
    with lock, lock:  # reentrant: a probe inside a held lock
        pass


def test_swapped_actions_come_from_another_clip(traj):
    swapped = swap_conditions(traj)["action"]
    assert torch.equal(swapped[0], traj.batch.cond["action"][1])


# -- condition plots -------------------------------------------------------------------------
def test_condition_plots_show_what_the_adapter_sees(model):
    plots = condition_plots(model, raw_batch(), index=1)
    assert plots["action"]["kind"] == "series"
    np.testing.assert_array_equal(plots["action"]["values"], raw_batch()["action"][1].numpy())
    assert plots["first_frame"]["kind"] == "image" and plots["first_frame"]["values"].shape == (16, 16, 3)
    bare = condition_plots(model.adapter, raw_batch())  # without the model: a grey picture of the latent
    assert bare["first_frame"]["values"].dtype == np.uint8


# -- live fits -------------------------------------------------------------------------------
def make_exp(seed: int = 0) -> AdapterExperiment:
    torch.manual_seed(seed)
    base = tiny_base()
    return AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1), composer=GatedResidual(),
                             training=TrainingConfig(steps=6, learning_rate=1e-3, batch_size=4, sync_every=1))


DATA = SyntheticMoves(items=16, frames=4, size=16)


def weights(exp: AdapterExperiment) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in exp.model.trainable_state_dict().items()}


class Gate:
    """A listener that holds the training thread at a given step until released."""

    def __init__(self, at: int):
        self.at, self.reached, self.release = at, threading.Event(), threading.Event()

    def __call__(self, session, event):
        if event == "step" and session.exp.step == self.at:
            self.reached.set()
            assert self.release.wait(30)


def test_start_returns_while_training_goes_on():
    session = FitSession(make_exp(), DATA, steps=4)
    gate = Gate(at=1)
    session.add_listener(gate)
    session.start()
    assert gate.reached.wait(30)
    assert session.running and session.exp.step == 1  # the caller is free while the thread trains
    gate.release.set()
    session.wait()
    assert session.state == "done" and session.exp.step == 4
    assert [s for s, _ in session.history] == [1, 2, 3, 4]


@pytest.mark.parametrize("stop_at", [1, 3])
def test_stop_ends_after_a_completed_step_and_resume_is_exact(stop_at):
    reference = make_exp().fit(DATA, steps=6, progress=False)
    exp = make_exp()
    session = FitSession(exp, DATA, steps=6)
    gate = Gate(at=stop_at)
    session.add_listener(gate)
    session.start()
    assert gate.reached.wait(30)
    session.stop()  # while step `stop_at` has completed and the next has not begun
    assert session.state == "stopping"
    gate.release.set()
    session.wait()
    assert session.state == "stopped" and exp.step == stop_at and session.remaining == 6 - stop_at
    session.resume()
    session.wait()
    assert session.state == "done" and exp.step == 6
    ours, theirs = weights(exp), weights(reference)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert exp.loss_history == reference.loss_history


def test_run_blocks_and_more_steps_extend_the_target():
    session = FitSession(make_exp(), DATA, steps=2).run()
    assert session.state == "done" and session.exp.step == 2
    with pytest.raises(InspectError, match="Nothing left to train.*Pass steps=N"):
        session.start()
    session.run(steps=1)
    assert session.exp.step == 3 and session.target == 3


def test_an_error_in_the_thread_is_raised_by_wait():
    session = FitSession(make_exp(), DATA, steps=3)

    def broken(session, event):
        if event == "step":
            raise RuntimeError("listener broke")

    session.add_listener(broken)
    session.start()
    with pytest.raises(CallbackError, match="listener broke"):
        session.wait()
    assert session.state == "failed"


def test_starting_twice_is_refused():
    session = FitSession(make_exp(), DATA, steps=3)
    gate = Gate(at=1)
    session.add_listener(gate)
    session.start()
    assert gate.reached.wait(30)
    with pytest.raises(InspectError, match="already training"):
        session.start()
    gate.release.set()
    session.wait()


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_fit_session_steps_must_be_positive(steps):
    with pytest.raises(InspectError, match="steps must be a positive int"):
        FitSession(make_exp(), DATA, steps=steps)


def test_gate_history_of_an_experiment():
    exp = make_exp()
    assert find_gate_history(exp) is None
    exp.fit(DATA, steps=10, progress=False)
    history = find_gate_history(exp)
    assert list(history["step"]) == [10.0] and "gate_mean" in history


def test_compare_views_and_watch_a_view_over_steps(traj):
    state = StepperState(traj)
    panels = state.compare(("x_t", "x0", "base", "adapter-base"), step=2, frame=3)
    assert [p.title for p in panels] == ["x_t (noisy input)", "x0 estimate", "base alone (x0)",
                                         "adapter − base (x0)"]
    assert np.array_equal(panels[1].image, traj.frames(2)[3])
    strip = state.over_steps([0, 1, 3], view="adapter-base", frame=2)
    assert [p.title for p in strip] == ["step 0 · noise 1.00", "step 1 · noise 0.75", "step 3 · noise 0.25"]
    assert len({p.limit for p in strip}) == 1  # one colour range along the strip


def test_views_follow_what_the_trajectory_stored(model):
    from workbench.inspect import StoragePolicy

    traj = record(model, model.base.prepare_batch(raw_batch()), steps=2, seed=0,
                  storage=StoragePolicy(fields=("x0", "adapter")))
    state = StepperState(traj)
    assert state.views == ("x0", "adapter", "gate")
    with pytest.raises(InspectError, match="view='base' needs the fields x_t, base.*available views: x0, adapter"):
        state.set_view("base")
