"""Declared conditions: matching, wording of every error, preparation semantics, view()."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import RecordingAdapter, ToyBackbone, toy_raw

from workbench import Add, ComposedModel, Condition, FlowMatching, GatedResidual
from workbench.errors import ConditionError


def compose(adapter, base=None):
    base = base or ToyBackbone()
    return ComposedModel(base, adapter, Add(), FlowMatching())


def test_mismatch_raises_at_construction_with_the_fix():
    adapter = RecordingAdapter(consumes=(Condition("depth", aliases=("z",)),))
    base = ToyBackbone()
    with pytest.raises(ConditionError) as info:
        compose(adapter, base)
    msg = str(info.value)
    assert "RecordingAdapter consumes condition 'depth' (looked for 'depth', 'z')" in msg
    assert "ToyBackbone.provides() provides 'action', 'c_concat', 'fs'" in msg
    assert "add the key 'depth' in the backbone's prepare_batch" in msg
    assert "declare an alias on the Condition" in msg
    assert "required=False" in msg
    assert base.calls == 0  # before any compute


def test_alias_resolution_records_the_matched_key():
    adapter = RecordingAdapter(consumes=(Condition("act", aliases=("action",), dim=4, per_frame="keep"),))
    model = compose(adapter)
    assert model.adapter.resolved_conditions[0].key == "action"
    raw = toy_raw()
    view = adapter.view(raw)
    assert torch.equal(view.act, raw["action"])
    assert "act (matched alias 'action')" in repr(view)


def test_first_alias_present_wins_and_name_comes_first():
    adapter = RecordingAdapter(consumes=(Condition("fs", aliases=("action",)),))
    compose(adapter)
    assert adapter.resolved_conditions[0].key == "fs"


def test_width_checked_on_use_naming_both_widths():
    adapter = RecordingAdapter(consumes=(Condition("action", dim=7, per_frame="mean"),))
    compose(adapter)
    with pytest.raises(ConditionError, match=r"condition 'action' \(key 'action'\) has width 4 .*declares dim=7"):
        adapter.view(toy_raw())


def test_per_frame_tensor_with_per_frame_none_names_the_choices():
    adapter = RecordingAdapter(consumes=(Condition("action"),))
    compose(adapter)
    with pytest.raises(ConditionError) as info:
        adapter.view(toy_raw())
    msg = str(info.value)
    assert "is per-frame, shape (2, 3, 4)" in msg
    assert "per_frame=None" in msg and "'keep'" in msg and "'mean'" in msg and "'sum'" in msg


def test_per_sample_tensor_with_a_frame_reduction_is_refused():
    adapter = RecordingAdapter(consumes=(Condition("fs", per_frame="mean"),))
    compose(adapter)
    with pytest.raises(ConditionError, match="is per-sample, shape \\(2,\\), but the Condition has per_frame='mean'"):
        adapter.view(toy_raw())


@pytest.mark.parametrize("mode, reduce", [
    ("keep", lambda a: a), ("mean", lambda a: a.mean(1)), ("sum", lambda a: a.sum(1)),
])
def test_per_frame_semantics(mode, reduce):
    adapter = RecordingAdapter(consumes=(Condition("action", per_frame=mode, dim=4),))
    compose(adapter)
    raw = toy_raw()
    view = adapter.view(raw)
    assert torch.equal(view.action, reduce(raw["action"]))
    assert view.info["action"].per_frame == mode


def test_missing_optional_condition_is_none_not_zeros():
    adapter = RecordingAdapter(consumes=(Condition("depth", required=False), Condition("fs")))
    compose(adapter)
    view = adapter.view(toy_raw())
    assert view.depth is None
    assert "depth: None (optional, not supplied by the backbone)" in repr(view)


def test_optional_declared_but_absent_from_this_batch_is_none():
    adapter = RecordingAdapter(consumes=(Condition("action", required=False, per_frame="keep"),))
    compose(adapter)
    raw = toy_raw()
    del raw["action"]
    assert adapter.view(raw).action is None


def test_required_condition_absent_from_the_batch_says_which_keys_exist():
    adapter = RecordingAdapter(consumes=(Condition("action", per_frame="keep"),))
    compose(adapter)
    raw = toy_raw()
    del raw["action"]
    with pytest.raises(ConditionError, match=r"this batch has no 'action'\. Keys in the batch: 'c_concat', 'fs'"):
        adapter.view(raw)


def test_backbone_native_keys_by_subscript_and_undeclared_attribute_error():
    adapter = RecordingAdapter(consumes=(Condition("action", per_frame="keep"),))
    compose(adapter)
    raw = toy_raw()
    view = adapter.view(raw)
    assert torch.equal(view["fs"], raw["fs"])
    assert torch.equal(view["c_concat"], raw["c_concat"])
    with pytest.raises(AttributeError, match="did not declare condition 'fs'.*cond\\['fs'\\]"):
        _ = view.fs
    with pytest.raises(KeyError, match="No condition 'nope'"):
        _ = view["nope"]


def test_dtype_and_device_follow_x_t():
    adapter = RecordingAdapter(consumes=(Condition("action", per_frame="keep"),))
    compose(adapter)
    batch = ToyBackbone().prepare_batch(toy_raw())
    cond = adapter.conditioning(batch, batch.latents.double())
    assert cond.action.dtype == torch.float64
    ints = ToyBackbone().prepare_batch(toy_raw(action=torch.ones(2, 3, 4, dtype=torch.long)))
    assert adapter.conditioning(ints, batch.latents.double()).action.dtype == torch.long


def test_dropout_only_in_training_per_sample_seeded_and_observable():
    adapter = RecordingAdapter(consumes=(Condition("action", per_frame="keep", dropout=0.5),))
    compose(adapter)
    b = 512
    raw = toy_raw(b=b)
    batch = ToyBackbone().prepare_batch(raw)
    adapter.train()
    cond = adapter.conditioning(batch, batch.latents, step=3)
    dropped = cond.dropped("action")
    assert dropped.shape == (b,) and dropped.dtype == torch.bool
    rate = dropped.float().mean().item()
    assert 0.4 < rate < 0.6
    assert torch.equal(cond.action[dropped], torch.zeros_like(cond.action[dropped]))
    assert torch.equal(cond.action[~dropped], raw["action"][~dropped])
    again = adapter.conditioning(batch, batch.latents, step=3)
    assert torch.equal(again.dropped("action"), dropped)  # seeded by (seed, step, name)
    other = adapter.conditioning(batch, batch.latents, step=4)
    assert not torch.equal(other.dropped("action"), dropped)
    assert re.search(r"dropout 0.5: \d+ of 512 dropped", repr(cond))
    adapter.eval()
    quiet = adapter.conditioning(batch, batch.latents, step=3)
    assert quiet.dropped("action") is None and torch.equal(quiet.action, raw["action"])
    assert "dropout 0.5: off (not training)" in repr(quiet)


def test_view_equals_training_inputs_bit_exactly():
    adapter = RecordingAdapter(consumes=(Condition("action", per_frame="keep", dropout=0.3),
                                         Condition("fs", required=False)))
    model = compose(adapter)
    model.train()
    raw = toy_raw(b=8)
    batch = model.base.prepare_batch(raw)
    for step in (0, 5):
        adapter.seen.clear()
        model.training_loss(batch, generator=torch.Generator().manual_seed(step), step=step)
        seen = adapter.seen[-1]
        view = adapter.view(raw, step=step)
        assert view.keys() == seen.keys()
        for name in ("action", "fs"):
            assert torch.equal(view[name], seen[name])
        assert torch.equal(view.dropped("action"), seen.dropped("action"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="a b"), "must be a Python identifier"),
    (dict(name="a", per_frame="avg"), "per_frame='avg'; allowed: None, 'mean', 'sum', 'keep'"),
    (dict(name="a", dim=0), "dim=0; must be a positive int"),
    (dict(name="a", dropout=1.0), "dropout=1.0; must be in \\[0, 1\\)"),
])
def test_condition_declaration_errors(kwargs, message):
    with pytest.raises(ConditionError, match=message):
        Condition(**kwargs)


def test_view_before_binding_says_how_to_bind():
    with pytest.raises(ConditionError, match="not bound to a backbone yet"):
        RecordingAdapter().view(toy_raw())


def test_duplicate_condition_names_refused():
    adapter = RecordingAdapter(consumes=(Condition("fs"), Condition("fs")))
    with pytest.raises(ConditionError, match="declares condition 'fs' twice"):
        ComposedModel(ToyBackbone(), adapter, GatedResidual(), FlowMatching())
