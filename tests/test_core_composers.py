"""Composers: identity at init (bit-exact), stacking, cap guards, noise gating, warmup."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench import Add, ComposeContext, GatedResidual, MaskMix, NoiseGated, PretrainWarmup, Replace, build
from workbench.core.composers import composer_tree
from workbench.errors import CompositionError, ConfigError

SHAPE = (3, 4, 5, 6, 6)


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)


def ctx(level=0.5):
    return ComposeContext(noise_level=torch.full((SHAPE[0],), level), step=0)


COMPOSERS = {
    "add": lambda: Add(),
    "gated_residual": lambda: GatedResidual(),
    "gated_residual_closed": lambda: GatedResidual(gate_init=0.0),
    "gated_residual_capped": lambda: GatedResidual(max_gate=0.5),
    "gated_residual_per_channel": lambda: GatedResidual(per_channel=True, channels=4),
    "mask_mix_identity": lambda: MaskMix(channels=4, identity_init=True),
    "noise_gated": lambda: NoiseGated(GatedResidual(gate_init=0.0), lo=0.3, hi=1.0),
    "warmup": lambda: PretrainWarmup(GatedResidual(), steps=10),
    "stack": lambda: NoiseGated(PretrainWarmup(GatedResidual(), steps=500), lo=0.3, hi=1.0),
    "stack_mask": lambda: NoiseGated(MaskMix(channels=4), lo=0.0, hi=0.8, ramp=0.1),
}


@pytest.mark.parametrize("name", COMPOSERS)
def test_identity_at_init_is_bit_exact(name):
    composer = COMPOSERS[name]()
    assert composer.identity_at_init
    base, adapter = tensors()
    for level in (0.1, 0.5, 0.95):
        if composer.needs_zero_adapter:
            out = composer(base, torch.zeros_like(adapter), ctx(level))
        else:  # identity for any adapter output: test with a nonzero one
            out = composer(base, adapter, ctx(level))
        assert torch.equal(out, base), name


def test_claims_are_honest_for_the_non_identity_composers():
    base, adapter = tensors()
    assert not Replace().identity_at_init
    assert torch.equal(Replace()(base, adapter), adapter)
    open_gate = GatedResidual(gate_init=0.2)
    assert open_gate.needs_zero_adapter  # the identity only through a zero adapter
    assert not torch.equal(open_gate(base, adapter), base)
    assert not MaskMix(channels=4, identity_init=False).identity_at_init
    out = MaskMix(channels=4, gate_init=0.25, identity_init=False)(base, adapter)
    assert torch.allclose(out, 0.75 * base + 0.25 * adapter, atol=1e-6)
    assert Add().needs_zero_adapter and not GatedResidual(gate_init=0.0).needs_zero_adapter
    assert GatedResidual().needs_zero_adapter


def test_gated_residual_gate_gets_a_gradient_at_init():
    composer = GatedResidual()
    base, adapter = tensors()
    composer(base, adapter).sum().backward()
    assert composer.gate.grad is not None
    assert torch.allclose(composer.gate.grad, adapter.sum())


def test_mask_mix_identity_setting_keeps_the_gate_alive():
    composer = MaskMix(channels=4, identity_init=True)
    base, adapter = tensors()
    out = composer(base, adapter)
    (out - 2 * adapter).square().mean().backward()
    assert composer.scale.grad is not None and composer.scale.grad.abs().item() > 1e-4
    opt = torch.optim.SGD(composer.parameters(), lr=1.0)
    opt.step()
    assert not torch.equal(composer(base, adapter), base)  # it moved off the identity


@pytest.mark.parametrize("make, message", [
    (lambda: MaskMix(channels=4, gate_init=0.5, max_gate=0.5, identity_init=False),
     "max_gate=0.5 is at or below the gate's init value gate_init=0.5.*freeze"),
    (lambda: MaskMix(channels=4, gate_init=0.6, max_gate=0.4, identity_init=False), "at or below"),
    (lambda: GatedResidual(gate_init=0.3, max_gate=0.3), "max_gate=0.3 is at or below \\|gate_init\\|=0.3"),
    (lambda: GatedResidual(gate_init=-0.5, max_gate=0.2), "freeze"),
])
def test_cap_at_or_below_init_is_refused(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_cap_guard_also_applies_from_config():
    with pytest.raises(ConfigError, match=r"composer\.config\.max_gate: max_gate=0.1 is at or below"):
        build("composer", "mask_mix", {"channels": 4, "gate_init": 0.2, "max_gate": 0.1, "identity_init": False})


def test_noise_gated_without_noise_level_refuses():
    composer = NoiseGated(GatedResidual(), lo=0.2, hi=0.8)
    base, adapter = tensors()
    with pytest.raises(CompositionError, match="NoiseGated needs the noise level of x_t, but none was given"):
        composer(base, adapter, ComposeContext())


def test_noise_gated_band_is_exact_on_both_sides():
    inner = GatedResidual(gate_init=0.5)
    composer = NoiseGated(inner, lo=0.3, hi=0.7)
    base, adapter = tensors()
    levels = torch.tensor([0.1, 0.5, 0.9])
    out = composer(base, adapter, ComposeContext(noise_level=levels))
    expected_inner = inner(base, adapter)
    assert torch.equal(out[0], base[0]) and torch.equal(out[2], base[2])
    assert torch.equal(out[1], expected_inner[1])


def test_noise_gated_ramp_blends_linearly():
    composer = NoiseGated(Replace(), lo=0.4, hi=1.0, ramp=0.2)
    w = composer.weight(torch.tensor([0.1, 0.2, 0.3, 0.4, 0.9]))
    assert torch.allclose(w, torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]))


def test_noise_gated_band_validated():
    with pytest.raises(ConfigError, match="need 0 <= lo < hi <= 1, got lo=0.8, hi=0.2"):
        NoiseGated(Add(), lo=0.8, hi=0.2)


def test_pretrain_warmup_bypasses_the_gate_then_hands_over():
    inner = GatedResidual(gate_init=0.3)
    composer = PretrainWarmup(inner, steps=3)
    composer.train()
    base, adapter = tensors()
    adapter.requires_grad_(True)
    early = composer(base, adapter, ComposeContext(step=1))
    assert torch.equal(early, base + adapter)
    early.sum().backward()
    assert inner.gate.grad is None  # the gate is not trained during warmup
    late = composer(base, adapter.detach(), ComposeContext(step=3))
    assert torch.equal(late, inner(base, adapter.detach()))  # now the inner composition
    assert int(composer.seen_step) == 3
    composer.eval()
    assert torch.equal(composer(base, adapter.detach(), ComposeContext()), late)  # last step seen decides
    assert "seen_step" in composer.state_dict()


def test_stacked_composer_from_yaml_style_config_nests():
    composer = build("composer", "noise_gated", {
        "lo": 0.3, "hi": 1.0,
        "inner": {"type": "pretrain_warmup", "config": {"steps": 500, "inner": {"type": "gated_residual"}}},
    })
    kinds = [type(c).__name__ for c in composer_tree(composer)]
    assert kinds == ["NoiseGated", "PretrainWarmup", "GatedResidual"]
    assert composer.describe() == "NoiseGated(PretrainWarmup(GatedResidual, steps=500), lo=0.3, hi=1)"


def test_nested_config_errors_carry_their_path():
    with pytest.raises(ConfigError) as info:
        build("composer", "noise_gated", {"inner": {"type": "pretrain_warmup", "config": {"stesp": 5}}})
    assert "composer.config.inner.config.stesp: unknown key" in str(info.value)
    assert "Did you mean 'steps'?" in str(info.value)


def test_diagnostics_expose_gate_maps():
    composer = NoiseGated(MaskMix(channels=4), lo=0.0, hi=1.0)
    base, adapter = tensors()
    diag = composer.compose(base, adapter, ctx()).diagnostics
    assert diag.mask.shape == (SHAPE[0], 1, *SHAPE[2:])
    assert torch.equal(diag.noise_weight, torch.ones(SHAPE[0]))
    diag = GatedResidual(gate_init=0.25).compose(base, adapter, ctx()).diagnostics
    assert float(diag.gate) == 0.25
    assert GatedResidual(gate_init=0.25).gate_values() == {"gate_mean": 0.25, "gate_abs_max": 0.25}


def test_a_composition_is_its_prediction_and_the_named_fields_of_diagnostics_only():
    """One declaration of the four fields (a Composition is Diagnostics plus the prediction); neither unpacks
    nor reads by key, and Diagnostics takes its fields by name only."""
    from workbench import Composition
    from workbench.core.composers import Diagnostics

    base, adapter = tensors()
    out = NoiseGated(MaskMix(channels=4), lo=0.0, hi=1.0).compose(base, adapter, ctx())
    assert isinstance(out, Composition) and out.gate is None and out.extra == {}
    assert out.mask.shape == (SHAPE[0], 1, *SHAPE[2:]) and torch.equal(out.noise_weight, torch.ones(SHAPE[0]))
    diag = out.diagnostics
    assert type(diag) is Diagnostics and diag.mask is out.mask and diag.noise_weight is out.noise_weight
    assert list(diag.as_dict()) == ["mask", "noise_weight"]
    assert [f.name for f in dataclasses.fields(Composition)] == [
        *(f.name for f in dataclasses.fields(Diagnostics)), "prediction"]
    with pytest.raises(TypeError, match="cannot unpack non-iterable Composition"):
        prediction, diag = out
    with pytest.raises(TypeError, match="not subscriptable"):
        diag["mask"]
    with pytest.raises(TypeError, match="positional argument"):
        Diagnostics(out.mask)
    assert not hasattr(Composition, "of") and not hasattr(Diagnostics, "of")
    warm = PretrainWarmup(GatedResidual(), steps=5).compose(base, adapter, ctx())
    assert torch.equal(warm.prediction, base + adapter) and list(warm.diagnostics.extra) == ["warmup"]


def test_a_composer_returning_anything_but_a_composition_is_refused_with_the_fix():
    """A composer of one's own composes through its gate hook (check_gate_override, gate_override) and returns a
    Composition; the (prediction, dict) pair is refused, naming what to return."""
    from conftest import tiny_base

    from workbench import ComposedModel, Composer, Composition
    from workbench.adapters.latent_residual import LatentResidual

    class Halved(Composer):
        identity_at_init = needs_zero_adapter = True

        def compose(self, base, adapter, ctx):
            g = torch.tensor(0.5) if self.gate_override is None else self.gate_override
            return Composition(base + g * adapter, gate=g, extra={"norm": adapter.norm()})

        def check_gate_override(self, value):
            return torch.as_tensor(value, dtype=torch.float32)

    class Pair(Halved):
        def compose(self, base, adapter, ctx):
            return base + adapter, {"gate": torch.tensor(1.0)}

    base = tiny_base()
    model = ComposedModel(base, LatentResidual(width=16, depth=1), Halved(), base.default_objective())
    batch = base.prepare_batch(base.example_batch())
    pred = model.predict(torch.randn_like(batch.latents), 0.5, batch)
    assert float(pred.diagnostics.gate) == 0.5 and list(pred.diagnostics.extra) == ["norm"]
    with model.composer.override_gate(0.25):
        assert float(model.composer.gate_override) == 0.25
        assert float(model.predict(torch.randn_like(batch.latents), 0.5, batch).diagnostics.gate) == 0.25
    with pytest.raises(CompositionError, match="Add has no gate to override"), Add().override_gate(0.5):
        pass
    model.composer = Pair()
    with pytest.raises(CompositionError, match=r"Pair.compose returned a tuple, not a workbench.Composition\. "
                                               r"Return Composition\(prediction, gate=\.\.\., mask=\.\.\."):
        model.predict(torch.randn_like(batch.latents), 0.5, batch)
    with pytest.raises(CompositionError, match="Pair.compose returned a tuple"):
        NoiseGated(Pair())(*tensors(), ctx())
    assert not hasattr(Composer, "_gate_override")


def test_claims_are_plain_attributes_set_by_settings():
    assert (GatedResidual(gate_init=0.0).needs_zero_adapter, GatedResidual(gate_init=0.0).starves_zero_adapter) == (
        False, True)
    warm = PretrainWarmup(GatedResidual(gate_init=0.0), steps=5)
    assert (warm.identity_at_init, warm.needs_zero_adapter, warm.starves_zero_adapter) == (True, True, False)
    assert NoiseGated(MaskMix(channels=4, identity_init=False)).identity_at_init is False
    assert "identity_at_init" in vars(GatedResidual()) and not isinstance(vars(GatedResidual).get("identity_at_init"),
                                                                           property)


def test_adapter_kinds_declare_one_init_behaviour():
    from workbench import Adapter, InsideAdapter, SideAdapter
    from workbench.adapters.inside import InsideSpecAdapter as Shipped
    from workbench.adapters.latent_residual import LatentResidual

    assert (LatentResidual.at_init, LatentResidual.inside) == ("zero_output", False)
    assert issubclass(Shipped, InsideAdapter) and Shipped.__name__ == "InsideSpecAdapter"  # one name, one class
    assert (Shipped.at_init, Shipped.inside, Shipped.reuses_base_output) == ("identity", True, False)

    class Unsaid(SideAdapter):  # a flag the contract does not know changes nothing: at_init is the one promise
        zero_init_output = True

    assert Unsaid.at_init == "any" and issubclass(LatentResidual, SideAdapter) and not hasattr(Adapter,
                                                                                            "zero_init_output")
    with pytest.raises(TypeError, match="at_init = 'zeros'; allowed: zero_output, identity, any"):
        type("Wrong", (SideAdapter,), {"at_init": "zeros"})


def test_a_closed_gate_on_a_zero_adapter_is_refused_with_the_fix():
    from conftest import tiny_base

    from workbench import ComposedModel
    from workbench.adapters.latent_residual import LatentResidual

    base = tiny_base()
    with pytest.raises(CompositionError, match="neither would ever get a gradient.*gate_init=0.1"):
        ComposedModel(base, LatentResidual(width=16, depth=1), GatedResidual(gate_init=0.0), base.default_objective())
    ComposedModel(base, LatentResidual(width=16, depth=1), PretrainWarmup(GatedResidual(gate_init=0.0), steps=5),
                  base.default_objective())
