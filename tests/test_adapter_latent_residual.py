"""`latent_residual` options: cumulative conditions, coordinates, a half-resolution level, warps."""

from __future__ import annotations

import pytest
import torch
from conftest import raw_batch, tiny_base

from workbench import ComposedModel, FlowMatching, GatedResidual
from workbench.adapters.latent_residual import LatentResidual
from workbench.errors import ConfigError, DataError

OPTIONS = [
    {},
    {"cumulative": True},
    {"coords": True},
    {"levels": 2},
    {"warps": 2, "cumulative": True},
    {"cumulative": True, "coords": True, "levels": 2, "warps": 1},
]


class Cond:
    """The two attributes latent_residual reads."""

    def __init__(self, action, first_frame=None):
        self.action = action
        self.first_frame = first_frame


@pytest.mark.parametrize("options", OPTIONS)
def test_every_option_is_the_identity_at_init_and_trains(options):
    base = tiny_base()
    torch.manual_seed(0)
    model = ComposedModel(base, LatentResidual(width=8, depth=1, **options), GatedResidual(),
                          base.default_objective())
    batch = base.prepare_batch(raw_batch())
    x_t = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(1))
    pred = model.predict(x_t, torch.full((2,), 0.6), batch)
    assert torch.equal(pred.composed, pred.base)
    optimizer = torch.optim.SGD(model.adapter.parameters(), lr=0.1)
    learning = []
    for step in range(2):
        optimizer.zero_grad(set_to_none=True)
        loss, _ = model.training_loss(batch, generator=torch.Generator().manual_seed(2 + step), step=step)
        loss.backward()
        learning.append({n for n, p in model.adapter.named_parameters()
                         if p.grad is not None and p.grad.abs().sum() > 0})
        optimizer.step()
    # At init the zero output layer is the only one with a gradient (it blocks every path behind it) ...
    assert learning[0] == {"out.weight", "out.bias"}
    # ... and once it has moved, every parameter learns — the warp's too, when there is one.
    assert learning[1] == {n for n, _ in model.adapter.named_parameters()}
    assert bool(options.get("warps")) == ({"warp.weight", "warp.bias"} <= learning[1])


def test_cumulative_condition_is_the_sum_over_previous_frames():
    torch.manual_seed(0)
    adapter = LatentResidual(width=8, depth=1, cumulative=True)
    adapter.set_objective(FlowMatching())
    seen = {}

    def keep_input(module, args, out):
        seen["x"] = args[0]

    adapter.cond_mlp[0].register_forward_hook(keep_input)
    actions = torch.arange(12, dtype=torch.float32).view(1, 3, 4)
    adapter(torch.zeros(1, 4, 3, 4, 4), torch.tensor([0.5]), Cond(actions))
    x = seen["x"]
    assert torch.equal(x[..., :4], actions)
    assert torch.equal(x[0, :, 4:], torch.stack([torch.zeros(4), actions[0, 0], actions[0, 0] + actions[0, 1]]))


def test_warps_translate_the_first_frame_by_the_predicted_displacement():
    adapter = LatentResidual(width=8, depth=1, cumulative=True, warps=2)
    first = torch.randn(2, 4, 8, 8)
    signal = torch.zeros(2, 3, 8)
    identity = adapter._translated(first, signal, 3)
    assert len(identity) == 2 and identity[0].shape == (2, 4, 3, 8, 8)
    torch.testing.assert_close(identity[1][:, :, 2], first, atol=1e-5, rtol=0)  # zero at init: not moved
    with torch.no_grad():
        adapter.warp.bias.copy_(torch.tensor([1.0, 0.0, 0.0, -2.0]))  # warp 0: +1 px in x; warp 1: -2 px in y
    moved = adapter._translated(first, signal, 3)
    torch.testing.assert_close(moved[0][:, :, 0, :, 1:], first[..., :-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(moved[1][:, :, 0, :-2, :], first[..., 2:, :], atol=1e-5, rtol=0)


def test_warps_follow_the_condition_per_frame():
    adapter = LatentResidual(width=8, depth=1, dim=4, cumulative=True, warps=1)
    with torch.no_grad():
        adapter.warp.weight.zero_()
        adapter.warp.weight[0, 4] = 1.0  # dx = running sum of action dim 0
    first = torch.randn(1, 4, 8, 8)
    actions = torch.zeros(1, 3, 4)
    actions[0, :, 0] = 1.0  # one pixel to the right per step
    (moved,) = adapter._translated(first, torch.cat([actions, torch.cumsum(actions, 1) - actions], -1), 3)
    torch.testing.assert_close(moved[:, :, 0], first, atol=1e-5, rtol=0)
    torch.testing.assert_close(moved[:, :, 2, :, 2:], first[..., :-2], atol=1e-5, rtol=0)


def test_state_is_read_at_the_first_frame_only():
    """``state: ee_pos``: the hand position where the clip starts joins the actions (and their running sum) on
    every frame; the positions of later frames are never read."""
    torch.manual_seed(0)
    adapter = LatentResidual(width=8, depth=1, cumulative=True, warps=1, state="ee_pos", state_dim=3)
    adapter.set_objective(FlowMatching())
    assert [(c.name, c.per_frame, c.dim) for c in adapter.consumes][-1] == ("ee_pos", "keep", 3)
    seen = {}
    adapter.cond_mlp[0].register_forward_hook(lambda module, args, out: seen.update(x=args[0]))

    class WithState(Cond):
        ee_pos = torch.arange(9, dtype=torch.float32).view(1, 3, 3)

    with torch.no_grad():
        adapter.out.weight.normal_(generator=torch.Generator().manual_seed(1))  # an output that shows its inputs
    cond = WithState(torch.ones(1, 3, 4), torch.randn(1, 4, 4, 4))

    def run():
        return adapter(torch.zeros(1, 4, 3, 4, 4), torch.tensor([0.5]), cond)

    out = run()
    assert seen["x"].shape == (1, 3, 11) and torch.equal(seen["x"][0, :, 8:], torch.tensor([[0.0, 1.0, 2.0]] * 3))
    WithState.ee_pos = WithState.ee_pos.clone()
    WithState.ee_pos[:, 1:] = 100.0  # later frames' positions: not read
    assert torch.equal(run(), out)
    WithState.ee_pos[:, 0] = -1.0  # the first frame's: read
    assert (run() - out).abs().max() > 1e-4


@pytest.mark.parametrize("options, pattern", [
    ({"cumulative": True, "per_frame": "mean"}, "cumulative: needs per_frame: keep .* got per_frame: mean"),
    ({"warps": -1}, "warps: must be >= 0, got -1"),
    ({"warps": 1, "use_first_frame": False}, "warps: translates the first frame, so it needs use_first_frame"),
    ({"state": "action"}, r"state: must be null or the name of another per-frame condition \(e\.g\. ee_pos\), got "
                          r"'action'"),
    ({"state": "ee_pos", "state_dim": 0}, "state_dim: must be >= 1, got 0"),
])
def test_option_errors(options, pattern):
    with pytest.raises(ConfigError, match=pattern):
        LatentResidual(**options)


def test_half_resolution_level_needs_even_latents():
    adapter = LatentResidual(width=8, depth=1, levels=2)
    adapter.set_objective(FlowMatching())
    with pytest.raises(DataError, match="levels=2 needs an even latent height and width, got 5x6. Use levels: 1"):
        adapter(torch.zeros(1, 4, 2, 5, 6), torch.tensor([0.5]), Cond(torch.zeros(1, 2, 4)))
