"""Adapters inside the frozen base (``lora``, ``action_modulation``, ``controlnet``) on tiny_video.

What is promised bit-exactly is tested bit-exactly: identity at init, the base's own weights
after training, the base with the adapter switched off, resume from a checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from conftest import perturb, raw_batch, tiny_base

from workbench import AdapterExperiment, ComposedModel, GatedResidual, Replace, TrainingConfig
from workbench.adapters.action_modulation import ActionModulation
from workbench.adapters.controlnet import ControlNet
from workbench.adapters.lora import LoRA
from workbench.config import build
from workbench.data.synthetic import SyntheticMoves
from workbench.errors import CheckpointError, CompositionError, ConfigError, ConformanceError
from workbench.inspect.recording.trajectory import record
from workbench.testing import INSIDE_PROMISES, check_inside_adapter

DATA = SyntheticMoves(items=16, frames=4, size=16)
KINDS = {
    "lora": lambda: LoRA(rank=2, dropout=0.1),
    "action_modulation": lambda: ActionModulation(hidden=16, dropout=0.2),
    "action_modulation+lora": lambda: ActionModulation(hidden=16, lora={"rank": 2}),
    "controlnet": lambda: ControlNet(blocks=1),
}
ALL = pytest.mark.parametrize("kind", list(KINDS))


def model_of(kind: str, base=None) -> ComposedModel:
    base = base or tiny_base()
    torch.manual_seed(1)
    return ComposedModel(base, KINDS[kind](), Replace(), base.default_objective())


def make(kind: str, tmp_path=None, **training) -> AdapterExperiment:
    defaults = dict(steps=8, learning_rate=2e-2, batch_size=4, sync_every=2, progress=False)
    if tmp_path is not None:
        defaults["output_dir"] = str(tmp_path)
    base = tiny_base()
    torch.manual_seed(1)
    return AdapterExperiment(base=base, adapter=KINDS[kind](), training=TrainingConfig(**{**defaults, **training}))


def noised(model, seed=2):
    batch = model.base.prepare_batch(raw_batch())
    x_t, t, _ = model.noised(batch, torch.Generator().manual_seed(seed))
    return batch, x_t, t


def weights(exp):
    return {k: v.clone() for k, v in exp.model.trainable_state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- identity and the frozen base ------------------------------------------------------------
@ALL
def test_identity_at_init_is_bit_exact(kind):
    model = model_of(kind).train(False)
    fresh = tiny_base()
    batch, x_t, t = noised(model)
    with torch.no_grad():
        pred = model.predict(x_t, t, batch)
        frozen = fresh.denoise(x_t, t, batch.cond)
    assert torch.equal(pred.composed, frozen) and torch.equal(pred.base, frozen) and torch.equal(pred.adapter, frozen)


@ALL
def test_switched_off_is_the_frozen_base_exactly_after_the_adapter_moved(kind):
    model = model_of(kind).train(False)
    perturb(model)
    fresh = tiny_base()
    batch, x_t, t = noised(model)
    with torch.no_grad():
        pred = model.predict(x_t, t, batch)
        off = model.predict(x_t, t, batch, with_adapter=False)
        frozen = fresh.denoise(x_t, t, batch.cond)
    assert torch.equal(pred.base, frozen) and torch.equal(off.composed, frozen)
    assert not torch.equal(pred.composed, frozen)  # the adapter does change the prediction


@ALL
def test_training_leaves_the_bases_own_weights_frozen_and_bit_identical(kind, tmp_path):
    exp = make(kind, tmp_path)
    own = list(exp.model.base.parameters())  # the LoRA weights peft adds later are not among them
    own = [p for p in own if not p.requires_grad]
    before = [p.detach().clone() for p in own]
    exp.fit(DATA, steps=3)
    assert all(torch.equal(a, b) and not b.requires_grad and b.grad is None for a, b in zip(before, own))
    trainable = {id(p) for p in exp.model.trainable_parameters()}
    assert trainable == {id(p) for p in exp.model.adapter.parameters()}
    assert set(map(id, exp.optimizer.state)) == trainable and not trainable & set(map(id, own))
    from safetensors.torch import load_file

    keys = load_file(str(exp.save_checkpoint() / "trainable.safetensors")).keys()
    assert keys and all(k.startswith("adapter.") for k in keys)
    assert sum(v.numel() for v in exp.model.trainable_state_dict().values()) == sum(
        p.numel() for p in exp.model.adapter.parameters())


@ALL
def test_training_runs_one_adapted_base_call_per_step(kind):
    from conftest import BaseCalls

    exp = make(kind)
    calls = BaseCalls(exp.model)
    exp.fit(DATA, steps=3)
    assert calls.count == 3
    assert exp.loss_history[0] != exp.loss_history[-1]


@ALL
def test_resume_from_checkpoint_is_bit_exact(kind, tmp_path):
    full = make(kind)
    full.fit(DATA, steps=4)
    part = make(kind, tmp_path)
    part.fit(DATA, steps=2)
    path = part.save_checkpoint()
    resumed = make(kind).load_checkpoint(path)
    resumed.fit(DATA, steps=2)
    assert resumed.loss_history == full.loss_history
    assert same(weights(resumed), weights(full))


# -- recording, forks, recompose --------------------------------------------------------------
@ALL
def test_recording_keeps_the_base_and_the_adapted_prediction_at_the_same_x_t(kind):
    from conftest import BaseCalls

    model = model_of(kind)
    perturb(model)
    fresh = tiny_base()
    batch = model.base.prepare_batch(raw_batch())
    unrecorded = model.generate(batch, steps=3, generator=torch.Generator().manual_seed(0))
    calls = BaseCalls(model)
    traj = record(model, batch, steps=3, seed=0)
    assert calls.count == 6  # two calls per step: the base alone, then the adapted base
    assert torch.equal(traj.final, unrecorded)
    assert traj.description == ("run (seed 0): 3/3 steps; " + type(model.adapter).__name__ + " works inside the "
                                "base: 2 base calls per step (the base with the adapter switched off, and the adapted "
                                "base, at the same x_t)")
    with torch.no_grad():
        step = traj[1]
        assert torch.equal(step.base, fresh.denoise(step.x_t, step.t, batch.cond))
        assert not torch.equal(step.composed, step.base)
    fork = traj.fork(at=2)
    assert torch.equal(fork.final, traj.final) and torch.equal(fork[1].x_t, traj[1].x_t)
    off = traj.fork(at=0, with_adapter=False)
    assert torch.equal(off.final, fresh.generate(batch, steps=3, generator=torch.Generator().manual_seed(0)))
    same_step = traj.recompose(1)
    assert torch.equal(same_step.composed, traj[1].composed) and torch.equal(same_step.base, traj[1].base)


@pytest.mark.parametrize("kind", ["action_modulation", "controlnet"])
def test_the_condition_reaches_the_adapted_prediction(kind):
    model = model_of(kind)
    perturb(model)
    batch = model.base.prepare_batch(raw_batch())
    traj = record(model, batch, steps=3, seed=0)
    moved = traj.recompose(1, cond={"action": batch.cond["action"] + 0.5})
    assert torch.equal(moved.base, traj[1].base) and not torch.equal(moved.composed, traj[1].composed)


@pytest.mark.parametrize("kind", ["action_modulation", "controlnet"])
def test_cumulative_reads_the_running_sum_of_the_actions_too(kind):
    """``cumulative: true``: the condition's embedding sees each frame's actions and their sum over the previous
    frames; at init the adapted base is still the base, bit for bit."""
    base = tiny_base()
    torch.manual_seed(1)
    adapter = ActionModulation(hidden=16, cumulative=True) if kind == "action_modulation" else \
        ControlNet(blocks=1, cumulative=True)
    model = ComposedModel(base, adapter, Replace(), base.default_objective()).train(False)
    first = adapter.trunk[0] if kind == "action_modulation" else adapter.embed
    seen = {}
    first.register_forward_hook(lambda module, args, out: seen.update(x=args[0]))
    batch, x_t, t = noised(model)
    with torch.no_grad():
        pred = model.predict(x_t, t, batch)
    assert torch.equal(pred.composed, tiny_base().denoise(x_t, t, batch.cond))
    actions = batch.cond["action"]
    assert first.in_features == 8
    assert torch.equal(seen["x"], torch.cat([actions, torch.cumsum(actions, 1) - actions], dim=-1))


def test_plain_generate_makes_one_base_call_per_step():
    from conftest import BaseCalls

    model = model_of("controlnet")
    calls = BaseCalls(model)
    model.generate(model.base.prepare_batch(raw_batch()), steps=3, generator=torch.Generator().manual_seed(0))
    assert calls.count == 3


# -- configs and refusals --------------------------------------------------------------------
@pytest.mark.parametrize("kind, config, match", [
    ("lora", {"rank": 0}, r"adapter\.config\.rank: must be an int >= 1 .*got 0\. Use e\.g\. rank: 4"),
    ("lora", {"dropout": 1.0}, r"adapter\.config\.dropout: must be in \[0, 1\), got 1\.0"),
    ("action_modulation", {"lora": {"rank": 0}}, r"rank: must be an int >= 1"),
    ("controlnet", {"blocks": 0}, r"adapter\.config\.blocks: must be >= 1"),
    ("controlnet", {"cumulative": True, "video": True, "condition": "control"},
     r"adapter\.config\.cumulative: sums a per-frame vector over frames; a control video \(video: true\) has none"),
])
def test_bad_config_values_are_refused_with_the_fix(kind, config, match):
    from workbench.config import Problems, validate_component_block

    problems = Problems()
    validate_component_block("adapter", {"type": kind, "config": config}, "adapter", problems)
    from workbench.config import format_problems

    assert problems and __import__("re").search(match, format_problems(problems))


def test_a_target_that_does_not_exist_lists_the_ones_that_do():
    with pytest.raises(ConfigError, match=r"lora targets: 'spatal' \(did you mean 'spatial'\?\) match no layer of "
                                          r"TinyVideo\. Layers LoRA can target there .*'film'.*'temporal'"):
        model_of_adapter(LoRA(targets=["spatal"]))


def test_more_controlnet_blocks_than_the_base_has_is_refused():
    with pytest.raises(ConfigError, match=r"controlnet blocks: 3 is more than TinyVideo has to copy: its first 1 "
                                          r"blocks .* Use blocks: 1 or fewer"):
        model_of_adapter(ControlNet(blocks=3))


def test_modulated_block_indices_are_checked():
    with pytest.raises(ConfigError, match=r"action_modulation blocks: \[7\] .* TinyVideo has 4 blocks \(0\.\.3\)"):
        model_of_adapter(ActionModulation(blocks=[7]))


def test_a_gated_composer_and_a_second_inside_adapter_are_refused():
    base = tiny_base()
    with pytest.raises(CompositionError, match=r"composed with Replace, got GatedResidual\. Use composer: "
                                               r"\{type: replace\}"):
        ComposedModel(base, LoRA(), GatedResidual(), base.default_objective())
    ComposedModel(base, LoRA(), Replace(), base.default_objective())
    with pytest.raises(CompositionError, match=r"already carries a LoRA adapter inside it"):
        ComposedModel(base, ControlNet(), Replace(), base.default_objective())


def test_where_to_reach_is_the_backbones_own_inside_spec_never_its_family():
    from conftest import ToyBackbone

    from workbench import InsideSpec
    from workbench.core.capabilities import InsideAccess

    toy = ToyBackbone(provides=("action",))
    toy.card = toy.card.replace(family="wan2.2")  # a family name is no answer: only inside_spec() is
    with pytest.raises(CompositionError, match=r"ToyBackbone does not say where adapters may reach into it: it "
                                               r"does not declare InsideAccess\. .* declare InsideAccess on it .* "
                                               r"with `inside_spec\(\)` returning a workbench\.InsideSpec .* or use "
                                               r"latent_residual"):
        ComposedModel(toy, LoRA(), Replace(), toy.default_objective())

    class Reachable(ToyBackbone, InsideAccess):
        def inside_spec(self):
            return InsideSpec(root=self.net, root_name="net", lora_targets=("0", "3"),
                              blocks=(self.net[0], self.net[3]), widths=(8, 4), branch_blocks=0, layout="channels")

    toy = Reachable(provides=("action",))
    model = ComposedModel(toy, LoRA(rank=2), Replace(), toy.default_objective())
    assert sorted(model.adapter.lora.layers) == ["0", "3"]
    with pytest.raises(CompositionError, match=r"InsideSpec is invalid: widths has 1 entries for 2 blocks; .*"
                                               r"layout='rows'; allowed: 'channels', 'frames', 'tokens'"):
        InsideSpec(root=toy.net, root_name="net", lora_targets=("0",), blocks=(toy.net[0], toy.net[3]), widths=(8,),
                   branch_blocks=0, layout="rows")


def model_of_adapter(adapter):
    base = tiny_base()
    return ComposedModel(base, adapter, Replace(), base.default_objective())


def test_each_kind_builds_by_name_from_its_config():
    for name, cls in (("lora", LoRA), ("action_modulation", ActionModulation), ("controlnet", ControlNet)):
        assert isinstance(build("adapter", name, {}), cls)


# -- LoRA files ------------------------------------------------------------------------------
def test_exported_lora_is_a_starting_point_for_another_fit(tmp_path):
    exp = make("lora")
    exp.fit(DATA, steps=2)
    out = exp.export_lora(tmp_path / "lora")
    from safetensors.torch import load_file

    saved = load_file(str(out / "pytorch_lora_weights.safetensors"))
    assert saved and all(k.startswith("denoiser.") and ".lora_" in k for k in saved)
    again = model_of_adapter(LoRA(rank=2, init_from=str(out)))
    ours = exp.model.adapter.lora.peft_state_dict()
    theirs = again.adapter.lora.peft_state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(CheckpointError, match=r"does not fit this LoRA: .*shape mismatches"):
        model_of_adapter(LoRA(rank=3, init_from=str(out)))


def test_export_without_a_lora_says_which_adapters_have_one(tmp_path):
    with pytest.raises(CompositionError, match=r"ControlNet has no LoRA to export"):
        make("controlnet").export_lora(tmp_path)


def test_ablation_sliders_work_on_the_slower_path_and_say_why(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("matplotlib")
    from conftest import BaseCalls

    from workbench.widgets import AblationSliders

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = model_of("action_modulation")
    perturb(model)
    traj = record(model, model.base.prepare_batch(raw_batch()), steps=3, seed=0)
    view = AblationSliders(traj, step=1, propagate=False)  # the instant picture alone
    assert view.state.change() == 0.0
    calls = BaseCalls(model)
    view.sliders.sliders[0].value = 1.0
    view.settle()
    assert calls.count == 1  # the stored base is reused; the adapted base runs once per edit
    assert view.state.change() > 0
    assert "slower path: each edit re-runs the base (the adapter works inside it)" in view.status.value
    view.propagate_box.value = True  # the final picture re-samples steps 1 and 2 with the edit
    view.settle()
    # the instant picture is kept; each re-sampled step runs the base twice (plain, then adapted: the edit
    # moved the latents off the recording, so the stored base output no longer applies)
    assert calls.count == 1 + 2 * 2, calls.count
    assert view.final_error is None and view.final_seconds is not None


# -- example configs -------------------------------------------------------------------------
EXAMPLES = ["tiny_lora", "tiny_action_modulation", "tiny_controlnet", "tiny_controlnet_edges", "wan22_lora",
            "wan22_action_modulation", "wan22_controlnet"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_config_builds_and_trains_a_few_steps(name, tmp_path, monkeypatch):
    from pathlib import Path

    if name.startswith("wan22"):
        from conftest import _installed

        if not (_installed("workbench-wan22") and _installed("h5py")):
            pytest.skip("the wan22 plugin and h5py are needed (pip install -e plugins/wan22 '.[data]')")
        import workbench_wan22.tiny

        monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
        workbench_wan22.tiny.FIXTURE.ensure()  # what path: tiny loads
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[1] / "examples" / "configs" / f"{name}.yaml"
    exp = AdapterExperiment.from_yaml(config)
    assert exp.model.adapter.inside and isinstance(exp.model.composer, Replace)
    exp.fit(steps=2, progress=False)
    assert exp.step == 2 and all(v == v for v in exp.loss_history)


# -- evaluation and probes -------------------------------------------------------------------
def test_evaluate_and_the_probes_compare_against_the_base_switched_off():
    from workbench.inspect.probes.sensitivity import action_sensitivity, sigma_sensitivity

    exp = make("action_modulation")
    first = exp.evaluate(DATA, batches=1)
    assert first["loss"] == first["base_loss"]  # identity at init
    perturb(exp.model)
    after = exp.evaluate(DATA, batches=1)
    assert after["base_loss"] == first["base_loss"] and after["loss"] != after["base_loss"]
    batch = exp.model.base.prepare_batch(raw_batch())
    sens = action_sensitivity(exp.model, batch, levels=(0.5,))
    assert (sens.x0 > 0).all()  # the adapted prediction moves with the actions
    sigma = sigma_sensitivity(exp.model, batch, levels=(0.5,), draws=1)
    assert sigma.adapted[0] != sigma.base[0]


# -- the inside-adapter conformance check ----------------------------------------------------
@ALL
def test_each_kind_keeps_the_inside_adapter_promises_on_tiny_video(kind):
    """``workbench.testing.check_inside_adapter``: identity at init, the base switched off after training,
    the base's own tensors untouched and out of the optimizer, no base weight saved, recorded == unrecorded."""
    report = check_inside_adapter(tiny_base, KINDS[kind], raw=raw_batch(), steps=3)
    assert [f.promise for f in report.findings] == list(INSIDE_PROMISES)
    assert report["recording"].detail == "3 steps, 2 base calls per step recorded (1 sampling), bit-exact"


def test_the_inside_check_names_an_adapter_that_is_not_the_base_at_init():
    class Nonzero(LoRA):  # LoRA whose B matrices start away from zero once injected
        def attach_base_model(self, base):
            super().attach_base_model(base)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if ".B." in name:
                        p.fill_(0.05)

    report = check_inside_adapter(tiny_base, lambda: Nonzero(rank=2), raw=raw_batch(), steps=3,
                                  raise_on_broken=False)
    assert report["identity"].status == "broken"
    assert "a fresh Nonzero changes the base's prediction (max |difference| 0.21)" in report["identity"].detail
    assert report["switched_off"].status == "kept"  # switched off is still the base, exactly
    with pytest.raises(ConformanceError, match=r"Nonzero in TinyVideo on cpu: 1 of 5 promises broken"):
        check_inside_adapter(tiny_base, lambda: Nonzero(rank=2), raw=raw_batch(), steps=3)
    with pytest.raises(ConformanceError, match=r"LatentResidual is not an inside adapter"):
        from workbench.adapters.latent_residual import LatentResidual

        check_inside_adapter(tiny_base, lambda: LatentResidual(width=8, depth=1), raw=raw_batch())
