"""ComposedModel: a frozen base that stays frozen, gradients only where they belong, and
sampling with the adapter injected into the backbone's own sampler."""

from __future__ import annotations

import pytest
import torch
from conftest import RecordingAdapter, ToyBackbone, raw_batch, tiny_base, toy_raw

from workbench import Add, ComposedModel, Condition, Diffusion, FlowMatching, GatedResidual, MaskMix, NoiseGated
from workbench.adapters.latent_residual import LatentResidual
from workbench.errors import CompositionError


def base_state(base):
    return {k: v.clone() for k, v in base.state_dict().items()}


def test_base_with_dropout_and_batch_norm_is_bit_identical_after_training():
    base = ToyBackbone()
    before = base_state(base)
    model = ComposedModel(base, RecordingAdapter(), GatedResidual(gate_init=0.1), FlowMatching())
    model.train()
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2)
    batch = base.prepare_batch(toy_raw(b=4))
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        loss, _ = model.training_loss(batch, generator=g, step=step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = base.state_dict()
    assert before.keys() == after.keys() and "net.1.running_mean" in after
    for key in before:
        assert torch.equal(before[key], after[key]), key
    opt_params = {id(p) for group in opt.param_groups for p in group["params"]}
    assert not opt_params & {id(p) for p in base.parameters()}


def test_base_stays_in_eval_mode_whatever_is_switched_to_train():
    base = ToyBackbone()
    model = ComposedModel(base, RecordingAdapter(), Add(), FlowMatching())
    model.train()
    assert model.adapter.training and model.composer.training
    assert not any(m.training for m in base.modules())
    model.adapter.train()
    base.train()
    base.net.train()
    assert not any(m.training for m in base.modules())
    batch = base.prepare_batch(toy_raw())
    x = torch.randn(batch.latents.shape)
    t = torch.full((2,), 0.5)
    first, second = base.denoise(x, t, batch.cond), base.denoise(x, t, batch.cond)
    assert torch.equal(first, second)  # dropout off, batch norm on running stats


def test_gradients_reach_adapter_and_composer_only():
    base = ToyBackbone()
    model = ComposedModel(base, RecordingAdapter(), GatedResidual(gate_init=0.1), FlowMatching())
    model.train()
    loss, pred = model.training_loss(base.prepare_batch(toy_raw()), generator=torch.Generator().manual_seed(0), step=0)
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in base.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.adapter.parameters())
    assert model.composer.gate.grad.abs() > 0
    assert not pred.base.requires_grad  # base ran under no_grad
    names = {id(p) for p in model.trainable_parameters()}
    assert names == {id(p) for p in [*model.adapter.parameters(), *model.composer.parameters()]}


def test_base_runs_once_per_training_step():
    base = ToyBackbone()
    model = ComposedModel(base, RecordingAdapter(), GatedResidual(), FlowMatching())
    batch = base.prepare_batch(toy_raw())
    base.calls = 0
    for step in range(3):
        model.training_loss(batch, generator=torch.Generator().manual_seed(step), step=step)[0].backward()
    assert base.calls == 3


def test_objective_must_match_the_card():
    with pytest.raises(CompositionError, match="trains a 'eps' prediction, but 'toy' predicts 'velocity'"):
        ComposedModel(ToyBackbone(), RecordingAdapter(), Add(), Diffusion())


def test_parts_are_type_checked():
    with pytest.raises(CompositionError, match="composer must be a workbench.Composer, got str"):
        ComposedModel(ToyBackbone(), RecordingAdapter(), "gated_residual", FlowMatching())


def test_identity_at_init_through_the_whole_model_on_tiny_video():
    base = tiny_base()
    batch = base.prepare_batch(raw_batch())
    for composer in (Add(), GatedResidual(), MaskMix(channels=4), NoiseGated(GatedResidual(), lo=0.3, hi=1.0)):
        model = ComposedModel(base, LatentResidual(width=16, depth=1), composer, base.default_objective())
        loss, pred = model.training_loss(batch, generator=torch.Generator().manual_seed(0), step=0)
        assert torch.equal(pred.composed, pred.base), type(composer).__name__


def test_compose_fn_injects_into_the_native_sampler():
    base = tiny_base()
    batch = base.prepare_batch(raw_batch())
    plain = base.generate(batch, steps=4, generator=torch.Generator().manual_seed(1))
    model = ComposedModel(base, LatentResidual(width=16, depth=1), GatedResidual(), base.default_objective())
    composed = model.generate(batch, steps=4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(plain, composed)  # zero adapter: identical to the bare base
    with torch.no_grad():
        model.composer.gate.fill_(1.0)
        model.adapter.out.bias.fill_(0.1)
    moved = model.generate(batch, steps=4, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(plain[:, :, 1:], moved[:, :, 1:])
    assert torch.equal(moved[:, :, 0], batch.cond["first_frame"])  # i2v: frame 0 is the condition


def test_on_step_reports_every_step_with_one_record_shape():
    base = tiny_base()
    records = []
    out = base.generate(base.prepare_batch(raw_batch()), steps=3, generator=torch.Generator().manual_seed(0),
                        on_step=records.append)
    assert [r.index for r in records] == [0, 1, 2] and all(r.steps == 3 for r in records)
    assert torch.equal(records[1].x_t, records[0].x_next)
    assert records[0].t.tolist() == [1.0, 1.0]
    assert torch.equal(records[-1].x_next[:, :, 1:], out[:, :, 1:])


@pytest.mark.parametrize("prediction", ["eps", "v", "x0"])
def test_tiny_video_diffusion_variant_samples_with_ddim(prediction):
    base = tiny_base(objective="diffusion", prediction=prediction)
    batch = base.prepare_batch(raw_batch())
    model = ComposedModel(base, LatentResidual(width=16, depth=1), GatedResidual(), base.default_objective())
    loss, _ = model.training_loss(batch, generator=torch.Generator().manual_seed(0), step=0)
    assert torch.isfinite(loss)
    out = model.generate(batch, steps=3, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out).all()
    assert torch.allclose(out[:, :, 0], batch.cond["first_frame"])


def test_tiny_video_first_frame_follows_its_exact_noising_path():
    base = tiny_base()
    batch = base.prepare_batch(raw_batch())
    noise = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(3))
    records = []
    base.generate(batch, steps=4, on_step=records.append, initial_noise=noise)
    z0 = batch.cond["first_frame"]
    for r in records:
        s = r.t[0]
        assert torch.allclose(r.x_t[:, :, 0], (1 - s) * z0 + s * noise[:, :, 0], atol=1e-5)


def test_tiny_video_prepare_batch_and_loss_mask():
    base = tiny_base()
    batch = base.prepare_batch({**raw_batch(), "proprio": torch.zeros(2, 4, 3)})
    assert batch.latents.shape == (2, 4, 4, 4, 4)
    assert batch.per_frame == {"action", "proprio"}
    assert batch.loss_mask.tolist() == [[0, 1, 1, 1], [0, 1, 1, 1]]
    uint8 = base.prepare_batch({"video": torch.zeros(1, 4, 16, 16, 3, dtype=torch.uint8)})
    assert uint8.latents.shape == (1, 4, 4, 4, 4)
    image_only = base.prepare_batch({"image": torch.zeros(2, 3, 16, 16), "action": torch.zeros(2, 6, 4)})
    assert image_only.latents.shape[2] == 6 and image_only.meta["has_target"] is False


def test_latent_residual_reads_actions_and_is_zero_at_init():
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1, dropout=0.2)
    model = ComposedModel(base, adapter, GatedResidual(), base.default_objective())
    assert [c.name for c in adapter.consumes] == ["action", "first_frame"]
    assert adapter.consumes[0] == Condition("action", aliases=("actions",), dim=4, per_frame="keep", dropout=0.2)
    batch = base.prepare_batch(raw_batch())
    _, pred = model.training_loss(batch, generator=torch.Generator().manual_seed(0), step=0)
    assert torch.equal(pred.adapter, torch.zeros_like(pred.adapter))


def test_with_adapter_switches_the_adapter_per_call_and_takes_booleans_only():
    base = tiny_base()
    model = ComposedModel(base, RecordingAdapter(), GatedResidual(gate_init=0.5), base.default_objective())
    batch = base.prepare_batch(raw_batch())
    x_t, t = torch.randn_like(batch.latents), torch.full((batch.latents.shape[0],), 0.5)
    off, on = model.predict(x_t, t, batch, with_adapter=False), model.predict(x_t, t, batch, with_adapter=True)
    assert off.adapter is None and torch.equal(off.composed, off.base) and torch.equal(on.base, off.base)
    assert not torch.equal(on.composed, on.base)
    model.adapter_enabled = False  # None: as the model is set
    assert model.predict(x_t, t, batch).adapter is None
    assert torch.equal(model.predict(x_t, t, batch, with_adapter=True).composed, on.composed)
    with pytest.raises(CompositionError, match=r"^predict\(with_adapter='off'\) is not allowed: it takes True \(base "
                                               r"\+ adapter\), False \(the frozen base alone\) or None \(as the "
                                               r"model is set, model\.adapter_enabled\)\.$"):
        model.predict(x_t, t, batch, with_adapter="off")
    with pytest.raises(TypeError, match="unexpected keyword argument 'adapter'"):
        model.predict(x_t, t, batch, adapter=False)


@pytest.mark.parametrize("objective", ["flow_matching", "diffusion"])
def test_the_composer_reads_the_noise_level_the_objective_gives_derived_only_when_read(objective):
    class Reads(GatedResidual):
        def compose(self, base, adapter, ctx):
            seen.append((ctx._noise_level, ctx.noise_level, ctx.noise_level))
            return super().compose(base, adapter, ctx)

    seen: list = []
    base = tiny_base(objective=objective)
    objective = base.default_objective()
    model = ComposedModel(base, LatentResidual(width=8, depth=1), Reads(), objective)
    batch = base.prepare_batch(raw_batch())
    t = torch.tensor([objective.t_for_noise_level(0.2), objective.t_for_noise_level(0.8)])
    model.predict(batch.latents, t, batch)
    unread, first, again = seen[0]
    assert not isinstance(unread, torch.Tensor) and first is again  # derived when first read, once
    assert torch.equal(first, objective.noise_level(t))
    gated = ComposedModel(base, model.adapter, NoiseGated(GatedResidual(), lo=0.5, hi=1.0), objective)
    pred = gated.predict(batch.latents, t, batch)  # the band is read from the derived level
    assert torch.equal(pred.composed[0], pred.base[0]) and pred.diagnostics.noise_weight.tolist() == [0.0, 1.0]
