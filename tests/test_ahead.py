"""Two processes train and evaluate exactly what one does (workbench.train.ahead, `workbench demo --processes 2`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workbench.errors import ConfigError
from workbench.train.ahead import Ahead, AheadError, BaseAhead
from workbench.worldmodel.demo import DemoConfig, build_experiment, run_demo

STEPS = 4


def weights(out, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(out / "run" / f"step-{step:07d}" / "trainable.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The quick demo (batch 2, 4 clips seen and 4 unseen, 4 sampling steps; no rollouts) on one process and two."""
    out = {}
    for processes in (1, 2):
        path = tmp_path_factory.mktemp(f"p{processes}")
        cfg = DemoConfig.quick(output=str(path), steps=STEPS, processes=processes, world=False)
        out[processes] = path, run_demo(cfg, progress=False)
    return out


def test_two_processes_train_bit_exactly_what_one_trains(runs):
    (one, m1), (two, m2) = runs[1], runs[2]
    w1, w2 = weights(one), weights(two)
    assert w1.keys() == w2.keys() and len(w1) > 10
    for key in w1:
        assert torch.equal(w1[key], w2[key]), key
    assert m1["training"]["loss_history"] == m2["training"]["loss_history"]
    assert len(m1["training"]["loss_history"]) == STEPS
    assert (m1["training"]["processes"], m2["training"]["processes"]) == (1, 2)
    from workbench.train.checkpoint import load_checkpoint

    s1, s2 = (load_checkpoint(p / "run" / f"step-{STEPS:07d}").state for p in (one, two))
    assert s1["data"] == s2["data"] == {"epoch": 0, "batches": STEPS}  # the same data position


def test_two_processes_score_every_clip_exactly_as_one(runs):
    (_, m1), (_, m2) = runs[1], runs[2]
    assert m1["per_clip"] == m2["per_clip"]
    assert m1["unseen"]["per_clip"] == m2["unseen"]["per_clip"]
    assert m1["summary"] == m2["summary"]
    assert len(m1["per_clip"]["items"]) == 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = DemoConfig.quick(output=str(tmp_path_factory.mktemp("trained")), steps=2)
    exp = build_experiment(cfg, tmp_path_factory.mktemp("run"))
    exp.fit(progress=False)
    return exp


def test_split_chunks_keep_each_chunks_seeded_noise(trained):
    """Chunks of 2 over 5 clips: three chunks per variant, nine in all, shared by the two processes."""
    from workbench.worldmodel.evaluate import clip_source, evaluate_world_model

    exp = trained
    clip = exp.model.base.clip()
    source = clip_source("sample", window=clip.frames, split="val", size=clip.size)
    subset = torch.utils.data.Subset(source, [0, 3, 6, 9, 12])
    kwargs = dict(sampling_steps=2, seed=3, chunk=2, progress=False, gate_scale=2.0)
    alone = evaluate_world_model(exp, subset, **kwargs)
    with BaseAhead(exp.resolved_config(), steps=0) as ahead:
        ahead.load_weights(exp.model.trainable_state_dict())
        shared = evaluate_world_model(exp, subset, predict=ahead.predict, **kwargs)
    for name in ("base", "adapter", "swapped"):
        assert shared[name].shape == (5, clip.frames, *clip.size, 3)
        assert np.array_equal(alone[name], shared[name]), name
    assert not np.array_equal(alone["adapter"], alone["swapped"])  # (a trained adapter: the variants differ)


def test_a_failing_second_process_is_reported_with_its_error_and_the_fix(trained):
    config = trained.resolved_config()
    config["data"] = {"type": "metaworld", "config": {"path": "no-such-file.h5"}}
    ahead = BaseAhead(config, steps=1)
    with pytest.raises(AheadError, match=r"The second process failed: .*no-such-file\.h5") as info:
        ahead.next_batch()
    assert "workbench demo --processes 1" in str(info.value)
    ahead.close()


def test_values_for_another_step_are_refused():
    ahead = Ahead(step=3, micro=0, x_t=torch.zeros(1), t=torch.zeros(1), target=torch.zeros(1),
                  base_output=torch.zeros(1))
    assert ahead.values_for(3, 0)[0] is ahead.x_t
    with pytest.raises(AheadError, match="is for step 3, micro-batch 0, but the training loop is at step 4"):
        ahead.values_for(4, 0)


def test_processes_must_be_one_or_two():
    with pytest.raises(ConfigError, match=r"processes must be 1 or 2 .*got 3\. Use --processes 2"):
        DemoConfig(processes=3)


def test_close_ends_a_second_process_still_steps_ahead(trained):
    """What an interrupted fit leaves: a process blocked on batches nobody reads; close() ends it."""
    import time

    ahead = BaseAhead(trained.resolved_config(), steps=50)
    batch, position = ahead.next_batch()
    assert batch.meta["computed_ahead"].step == 0 and position == {"epoch": 0, "batches": 1}
    started = time.monotonic()
    ahead.close()
    assert not ahead._process.is_alive() and time.monotonic() - started < 30
