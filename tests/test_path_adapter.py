"""The action path (``path:`` on latent_residual and controlnet): drawn from the first frame's measured hand
position and the actions only, projected with the camera calibration; identity at init, nothing read from
the future, resume bit-exact, and edits of ``action`` (sliders, forks) move it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_resume_is_bit_exact, perturb, requires_plugins, tiny_base

from workbench import AdapterExperiment, ComposedModel, GatedResidual, Replace, TrainingConfig
from workbench.adapters.controlnet import ControlNet
from workbench.adapters.latent_residual import LatentResidual
from workbench.adapters.path import (
    CAMERA_DIM,
    CAMERA_KEY,
    ActionPath,
    PathConfig,
    hand_path,
    path_heatmap,
    project_points,
)
from workbench.data.camera import CAMERA_DIM as DATA_CAMERA_DIM
from workbench.data.camera import CAMERA_KEY as DATA_CAMERA_KEY
from workbench.data.camera import CameraCalibration
from workbench.errors import CompositionError, ConfigError, DataError

torch.set_num_threads(1)
CAMERA = CameraCalibration.look_at((0.695, 0.173, 1.049), (0.0, 0.66, 0.2), 45.0, 16, 16)


def path_batch(b: int = 2, t: int = 4, size: int = 16, seed: int = 0) -> dict:
    """Clips with actions, a hand moving in the camera's view, and the calibration."""
    g = torch.Generator().manual_seed(seed)
    ee = torch.tensor([0.0, 0.66, 0.2]) + (torch.rand(b, t, 3, generator=g) - 0.5) * 0.2
    return {"video": torch.rand(b, 3, t, size, size, generator=g) * 2 - 1,
            "action": torch.rand(b, t, 4, generator=g) * 2 - 1,
            "ee_pos": ee, "camera": torch.from_numpy(CAMERA.vector()).expand(b, -1).clone()}


def residual(**over) -> LatentResidual:
    torch.manual_seed(0)
    return LatentResidual(**{"width": 8, "depth": 1, "cumulative": True, "coords": True, "warps": 1, "path": {},
                             **over})


def controlnet(**over) -> ControlNet:
    torch.manual_seed(0)
    return ControlNet(**{"cumulative": True, "path": {}, **over})


ADAPTERS = {"latent_residual": residual, "controlnet": controlnet}


def composer(kind: str):
    return Replace() if kind == "controlnet" else GatedResidual(gate_init=0.5)  # controlnet works inside the base


def model_of(kind: str) -> ComposedModel:
    base = tiny_base()
    return ComposedModel(base, ADAPTERS[kind](), composer(kind), base.default_objective()).train(False)


# -- the path itself ---------------------------------------------------------------------------
def test_the_data_and_the_adapters_agree_on_the_camera_condition():
    assert (CAMERA_KEY, CAMERA_DIM) == (DATA_CAMERA_KEY, DATA_CAMERA_DIM)


def test_the_hand_path_integrates_the_actions_from_the_first_frame():
    action = torch.tensor([[[1.0, 0.0, -0.5, 0.9], [0.5, 1.0, 0.0, 0.1], [0.0, 0.0, 1.0, -1.0], [1.0, 1.0, 1.0, 0.0]]])
    start = torch.tensor([[0.1, 0.6, 0.2]])
    on_target = hand_path(action, start, PathConfig(scale=0.02, response=1.0))
    expected = start[:, None] + 0.02 * torch.cat([torch.zeros(1, 1, 3), action[:, :-1, :3].cumsum(1)], dim=1)
    assert torch.allclose(on_target, expected, atol=1e-7)
    assert torch.equal(on_target[:, 0], start)  # frame t shows the result of actions 0 .. t-1
    lagging = hand_path(action, start, PathConfig(scale=0.02, response=0.5))
    target, hand = start.clone(), start.clone()
    for t in range(1, 4):
        target = target + 0.02 * action[:, t - 1, :3]
        hand = hand + 0.5 * (target - hand)
        assert torch.allclose(lagging[:, t], hand, atol=1e-7)
    # the last action moves nothing in the clip (its result is the frame after)
    changed = action.clone()
    changed[:, -1] = -1
    assert torch.equal(hand_path(changed, start, PathConfig()), hand_path(action, start, PathConfig()))


def test_the_projection_and_the_heatmap_put_the_point_where_the_calibration_says():
    points = torch.tensor([[[0.0, 0.66, 0.2], [0.1, 0.6, 0.1]]], dtype=torch.float64)
    uv, front = project_points(points, torch.from_numpy(CAMERA.vector()).double()[None])
    want, _ = CAMERA.project(points[0].numpy())
    assert front.all() and np.allclose(uv[0].numpy() * 16, want, atol=1e-4)
    heat = path_heatmap(uv, front, 16, 16, sigma=1.0)
    assert heat.shape == (1, 2, 16, 16) and float(heat.max()) <= 1.0
    for k in range(2):
        row, col = divmod(int(heat[0, k].argmax()), 16)
        assert abs(col + 0.5 - want[k, 0]) <= 0.5 and abs(row + 0.5 - want[k, 1]) <= 0.5
    behind = path_heatmap(uv, torch.zeros_like(front), 16, 16, 1.0)
    assert float(behind.abs().max()) == 0.0  # a point behind the camera draws nothing


@pytest.mark.parametrize(("options", "pattern"), [
    ({"path": {"sigma": 0}}, r"path.sigma: must be > 0 latent pixels, got 0"),
    ({"path": {"respons": 0.5}}, r"path: unknown option\(s\) 'respons'. Allowed: .*Did you mean 'response'\?"),
    ({"path": {"xyz": [0, 1, 4]}}, r"path: reads action dimensions \[0, 1, 4\], but the condition has dim: 4"),
    ({"path": {}, "per_frame": "mean", "cumulative": False}, "path: draws one point per frame, so it needs "
                                                             "per_frame: keep, got per_frame: mean"),
    ({"path": 3}, r"path: must be a mapping of .* \(or \{\} for the defaults\), or null; got int"),
])
def test_path_option_errors(options, pattern):
    with pytest.raises(ConfigError, match=pattern):
        LatentResidual(width=8, depth=1, **options)


def test_a_control_video_controlnet_refuses_a_path():
    with pytest.raises(ConfigError, match=r"path: draws the path of per-frame actions; a control video"):
        ControlNet(condition="control", video=True, dim=1, path={})


def test_the_config_keeps_the_path_options_in_full():
    adapter = residual(path={"sigma": 1.5})
    assert adapter.config.path == {"xyz": [0, 1, 2], "scale": 0.02, "response": 0.25, "sigma": 1.5,
                                   "state": "ee_pos", "camera": "camera", "translate": True,
                                   "measured": False}
    assert {c.name for c in adapter.consumes} == {"action", "first_frame", "ee_pos", "camera"}


def test_without_a_calibration_the_error_says_what_was_received_and_the_fix():
    model = model_of("latent_residual")
    raw = path_batch()
    del raw["camera"]
    batch = model.base.prepare_batch(raw)
    with pytest.raises(DataError) as err:
        model.predict(torch.randn(batch.latents.shape), torch.full((2,), 0.5), batch)
    text = str(err.value)
    assert "latent_residual draws the action path into the picture and needs the camera's calibration" in text
    assert "the batch has no 'camera'. Received: action, ee_pos; allowed: 'camera', a (12,) vector per clip" in text
    assert "`workbench data calibrate FILE` adds it" in text


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_a_backbone_that_does_not_pass_the_calibration_on_is_refused_when_composed(kind):
    base = tiny_base()
    base.provides = lambda: tuple(k for k in type(base).provides(base) if k != "camera")
    with pytest.raises(CompositionError) as err:
        ComposedModel(base, ADAPTERS[kind](), composer(kind), base.default_objective())
    text = str(err.value)
    assert (f"{kind} with path: draws the hand's path through the camera's calibration (the 'camera' condition), "
            f"but TinyVideo does not pass it on to adapters: its provides() lists") in text
    assert "With TinyVideo, leave path: out (the adapter then reads the actions alone)." in text
    from workbench.adapters.inside import OWNER

    assert getattr(base, OWNER, None) is None  # refused before anything reached into the base


@requires_plugins
def test_the_path_on_a_diffusers_plugin_is_refused_with_what_it_lacks():
    from workbench.config import build

    base = build("backbone", "wan22_ti2v", {"path": "tiny", "device": "cpu", "dtype": "float32"})
    with pytest.raises(CompositionError, match=r"latent_residual with path: .* but Wan22TI2V does not pass it on "
                                               r"to adapters.*the diffusers plugins do not yet"):
        ComposedModel(base, residual(channels=base.latent_channels), GatedResidual(), base.default_objective())


# -- the promises -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_identity_at_init_is_bit_exact(kind):
    model = model_of(kind)
    batch = model.base.prepare_batch(path_batch())
    x_t = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pred = model.predict(x_t, torch.full((2,), 0.6), batch)
        alone = tiny_base().denoise(x_t, torch.full((2,), 0.6), batch.cond)
    assert torch.equal(pred.composed, pred.base) and torch.equal(pred.composed, alone)
    final = model.generate(batch, steps=3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(final, tiny_base().generate(batch, steps=3, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_nothing_is_read_from_the_future(kind):
    """Predicted from the first frame: replacing every later frame, and changing the measured hand position of
    every later frame, leaves the sampled prediction bit-identical; the first frame's position does not."""
    model = model_of(kind)
    perturb(model)
    raw = path_batch()
    final = model.generate(model.base.prepare_batch(raw), steps=3, generator=torch.Generator().manual_seed(0))
    future = {**raw, "video": raw["video"].clone(), "ee_pos": raw["ee_pos"].clone()}
    future["video"][:, :, 1:] = torch.rand_like(future["video"][:, :, 1:]) * 2 - 1
    future["ee_pos"][:, 1:] += 0.3
    again = model.generate(model.base.prepare_batch(future), steps=3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, final)
    moved = {**raw, "ee_pos": raw["ee_pos"].clone()}
    moved["ee_pos"][:, 0] += 0.05
    other = model.generate(model.base.prepare_batch(moved), steps=3, generator=torch.Generator().manual_seed(0))
    assert (other - final).abs().max() > 1e-4
    # the camera is read only by the path: another calibration moves the drawn path, and so the prediction
    turned = CameraCalibration.look_at((0.9, 0.0, 1.5), (0.0, 0.66, 0.2), 45.0, 16, 16)
    seen = model.generate(model.base.prepare_batch({**raw, "camera": torch.from_numpy(turned.vector()).expand(2, -1)}),
                          steps=3, generator=torch.Generator().manual_seed(0))
    assert (seen - final).abs().max() > 1e-4
    # and at one denoising step, at the same x_t: the adapter's output is unchanged too
    batch, changed = model.base.prepare_batch(raw), model.base.prepare_batch({**raw, "ee_pos": future["ee_pos"]})
    x_t = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a = model.predict(x_t, torch.full((2,), 0.7), batch).composed
        b = model.predict(x_t, torch.full((2,), 0.7), changed).composed
    assert torch.equal(a, b)


class PathClips(torch.utils.data.Dataset):
    def __init__(self, n: int = 16):
        self.items = []
        for i in range(n):
            raw = path_batch(b=1, seed=i)
            self.items.append({k: v[0] for k, v in raw.items()})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_resume_with_a_path_adapter_is_bit_exact(kind, tmp_path):
    def make(out=None):
        torch.manual_seed(1)
        training = dict(steps=8, learning_rate=2e-2, batch_size=4, sync_every=2, progress=False)
        return AdapterExperiment(base=tiny_base(), adapter=ADAPTERS[kind](), composer=composer(kind),
                                 training=TrainingConfig(**training, **({"output_dir": str(out)} if out else {})))

    full = assert_resume_is_bit_exact(make, PathClips(), tmp_path)
    assert full.loss_history[0] != full.loss_history[-1]


@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_sliders_and_forks_on_action_move_the_path_and_the_prediction(kind):
    from workbench.inspect.probes.ablation import Ablation, swap_conditions
    from workbench.inspect.recording.trajectory import record

    model = model_of(kind)
    perturb(model)
    batch = model.base.prepare_batch(path_batch())
    traj = record(model, batch, steps=3, seed=0)
    path = ActionPath(PathConfig(), kind)
    view = model.adapter.view(batch)
    maps, _ = path.render(view, view.action, 8, 8)
    # a slider: dx = +1 on every frame, from the middle step
    ablation = Ablation(traj, step=1)
    before = ablation.ablated_x0().clone()
    ablation.set(0, 1.0)
    edited = ablation.edit.overrides()
    moved, _ = path.render(view, edited["action"], 8, 8)  # what the adapter draws from the edited actions
    assert not torch.equal(moved[:, 0, 1:], maps[:, 0, 1:])  # the drawn path moved ...
    assert torch.equal(moved[:, 1], maps[:, 1])  # ... from the same start
    assert ablation.change() > 0 and not torch.equal(ablation.ablated_x0(), before)
    # the propagated edit and a fork with another clip's actions change the final prediction
    fork = traj.fork(at=1, cond={"action": edited["action"]})
    assert not torch.equal(fork.final, traj.final)
    swapped = traj.fork(at=1, cond=swap_conditions(traj, "action"))
    assert not torch.equal(swapped.final, traj.final)
    assert torch.equal(traj.fork(at=1).final, traj.final)


def test_the_measured_path_reads_the_future_and_is_for_measurement_only():
    """``measured: true`` draws the recorded hand of every frame (the ceiling of a perfect path): changing a later
    frame's position changes the prediction — the leak the default path does not have."""
    base = tiny_base()
    torch.manual_seed(0)
    model = ComposedModel(base, residual(path={"measured": True}), GatedResidual(gate_init=0.5),
                          base.default_objective()).train(False)
    perturb(model)
    raw = path_batch()
    final = model.generate(model.base.prepare_batch(raw), steps=3, generator=torch.Generator().manual_seed(0))
    later = {**raw, "ee_pos": raw["ee_pos"].clone()}
    later["ee_pos"][:, 1:] += 0.1
    again = model.generate(model.base.prepare_batch(later), steps=3, generator=torch.Generator().manual_seed(0))
    assert (again - final).abs().max() > 1e-4


def test_translate_moves_the_first_frame_by_the_path_displacement():
    from workbench.adapters.path import translated

    first = torch.zeros(1, 1, 8, 8)
    first[0, 0, 3, 2] = 1.0
    along = torch.zeros(1, 3, 4)
    along[0, 1, 2] = 1 / 8  # one latent pixel right at frame 1
    along[0, 2, 3] = -2 / 8  # two latent pixels up at frame 2
    moved = translated(first, along)
    assert moved.shape == (1, 1, 3, 8, 8)
    assert torch.equal(moved[0, 0, 0], first[0, 0])
    assert divmod(int(moved[0, 0, 1].argmax()), 8) == (3, 3) and torch.allclose(moved[0, 0, 1].max(), torch.tensor(1.0))
    assert divmod(int(moved[0, 0, 2].argmax()), 8) == (1, 2)
