"""Every registered component keeps its validated config, and that config alone rebuilds it.

The construction convention (``Component(config=None, **overrides)``, ``self.config``,
``from_config``) is checked over the whole registry, plugins included, so a new component that
breaks it fails here without anyone having to remember to add it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml
from conftest import TINY, tiny_base
from torch import nn

from workbench.config import block_of, build
from workbench.errors import CallbackError, ConfigError
from workbench.registry import KINDS, registered

DIFFUSERS = {"path": "tiny", "height": 64, "width": 64, "num_frames": 9, "steps": 4}
SMALL_ADAPTER = {"width": 16, "depth": 1}

# Non-default values wherever they are cheap, so a dropped field shows; a component missing
# here is built from its defaults.
CONFIGS = {
    ("backbone", "tiny_video"): {**TINY, "shift": 2.0},
    ("backbone", "wan22_ti2v"): {**DIFFUSERS, "prompt": "a robot arm", "first_frame": False},
    ("backbone", "easyanimate"): {**DIFFUSERS, "prompt": "a robot arm"},
    ("backbone", "dynamicrafter"): {"path": "tiny", "variant": "512", "prompt": "a robot arm", "steps": 3, "eta": 0.5,
                                    "num_frames": 4, "height": 32, "width": 32},
    ("adapter", "latent_residual"): {**SMALL_ADAPTER, "cumulative": True, "coords": True},
    ("adapter", "wan22_latent_residual"): SMALL_ADAPTER,
    ("adapter", "easyanimate_latent_residual"): SMALL_ADAPTER,
    ("adapter", "dynamicrafter_latent_residual"): SMALL_ADAPTER,
    ("composer", "gated_residual"): {"gate_init": 0.3, "max_gate": 0.9},
    ("composer", "mask_mix"): {"channels": 4, "gate_init": 0.3, "identity_init": False},
    ("composer", "noise_gated"): {"lo": 0.2, "hi": 0.9, "ramp": 0.05,
                                  "inner": {"type": "mask_mix", "config": {"channels": 4}}},
    ("composer", "pretrain_warmup"): {"steps": 7, "inner": {"type": "noise_gated", "config": {
        "lo": 0.3, "inner": {"type": "gated_residual", "config": {"per_channel": True, "channels": 4}}}}},
    ("objective", "flow_matching"): {"shift": 3.0, "t_sampling": "logit_normal", "logit_std": 0.5},
    ("objective", "diffusion"): {"prediction": "v", "schedule": "cosine", "num_train_timesteps": 100},
    ("callback", "console"): {"every_n_steps": 3},
    ("callback", "jsonl"): {"every_n_steps": 3, "path": "metrics.jsonl"},
    ("callback", "checkpoint"): {"every_n_steps": 3, "keep_last": 2},
    ("callback", "periodic_eval"): {"every_n_steps": 3, "batches": 1},
    ("callback", "grad_norm"): {"every_n_steps": 3},
    ("callback", "loss_history"): {"every_n_steps": 3},
    ("dataset", "metaworld"): {"path": "sample", "window": 4, "stride": 32, "split": "val"},
    ("dataset", "synthetic_moves"): {"items": 5, "size": 8, "square": 2, "seed": 3},
}
COMPONENTS = [(kind, name) for kind in KINDS for name in registered(kind)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """``path: tiny`` pipelines are written into a scratch cache, and a small LeRobot dataset into a
    scratch directory, once for the module."""
    from lerobot_fixture import CAMERAS, write_v30

    patch = pytest.MonkeyPatch()
    patch.setenv("WORKBENCH_CACHE", str(tmp_path_factory.mktemp("workbench-cache")))
    root = write_v30(tmp_path_factory.mktemp("lerobot") / "data")
    patch.setitem(CONFIGS, ("dataset", "lerobot"), {"root": str(root), "camera": CAMERAS[1], "window": 4,
                                                    "stride": 3, "split": "all", "fps": 5.0, "seed": 2})
    yield
    patch.undo()


def built(kind: str, name: str, config):
    torch.manual_seed(0)
    return build(kind, name, config)


def plain(block: dict) -> dict:
    return json.loads(json.dumps(block))


@pytest.mark.parametrize("kind, name", COMPONENTS, ids=[f"{k}:{n}" for k, n in COMPONENTS])
def test_build_save_rebuild_gives_an_identical_component(kind, name, cache):
    given = CONFIGS.get((kind, name), {})
    first = built(kind, name, given)
    saved = block_of(first, kind)
    assert saved["type"] == name
    if getattr(type(first), "config_class", None) is None:  # a component without settings
        assert "config" not in saved and built(kind, name, None).__class__ is type(first)
        return
    assert dataclasses.is_dataclass(first.config) and isinstance(first.config, type(first).config_class)
    assert yaml.safe_load(yaml.safe_dump(saved)) == plain(saved)  # plain YAML data
    for key, value in given.items():  # what was asked for is kept (a nested block, in full)
        if key != "inner":
            assert plain(saved["config"])[key] == plain({key: value})[key], key
    again = built(kind, name, yaml.safe_load(yaml.safe_dump(saved))["config"])
    assert block_of(again, kind) == saved
    if isinstance(first, nn.Module):
        ours, theirs = first.state_dict(), again.state_dict()
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert value.dtype == theirs[key].dtype and torch.equal(value, theirs[key]), key


@pytest.mark.parametrize("kind, name", COMPONENTS, ids=[f"{k}:{n}" for k, n in COMPONENTS])
def test_a_config_and_overrides_together_are_refused_not_dropped(kind, name, cache):
    first = built(kind, name, CONFIGS.get((kind, name), {}))
    cls = type(first)
    if getattr(cls, "config_class", None) is None:
        return
    field = next(f.name for f in dataclasses.fields(cls.config_class) if f.name != "inner")
    with pytest.raises(TypeError, match=rf"pass either a config \({cls.config_class.__name__}\) or keyword overrides, "
                                        rf"not both: got a config and '{field}'"):
        cls(config=first.config, **{field: getattr(first.config, field)})


def test_overrides_are_checked_and_positional_values_refused():
    from workbench import FlowMatching, GatedResidual
    from workbench.adapters.latent_residual import LatentResidual, LatentResidualConfig

    assert LatentResidual(width=16, depth=1).config == LatentResidualConfig(width=16, depth=1)
    with pytest.raises(TypeError, match=r"not both: got a config and 'depth'"):
        LatentResidual(LatentResidualConfig(width=16), depth=1)  # used to build depth=2, silently
    with pytest.raises(ConfigError, match=r"Invalid LatentResidual \(1 problem\):\n  - wdith: unknown field of "
                                          r"LatentResidualConfig\. .*Did you mean one of 'width', 'depth'\?"):
        LatentResidual(wdith=16)
    with pytest.raises(TypeError, match=r"GatedResidual\(\.\.\.\) takes a GatedResidualConfig or keyword fields, got "
                                        r"float 0\.5\. Pass fields by name, e\.g\. GatedResidual\(gate_init=\.\.\.\)"):
        GatedResidual(0.5)
    with pytest.raises(ConfigError, match=r"shift: must be > 0"):
        FlowMatching(shift=0.0)


def test_wrappers_built_in_python_keep_the_whole_stack():
    from workbench import GatedResidual, MaskMix, NoiseGated, PretrainWarmup

    stack = PretrainWarmup(NoiseGated(MaskMix(channels=4, gate_init=0.2, identity_init=False), lo=0.3), steps=5)
    assert stack.config.steps == 5 and stack.steps == 5
    inner = stack.config.inner
    assert inner["type"] == "noise_gated" and inner["config"]["lo"] == 0.3
    assert inner["config"]["inner"] == {"type": "mask_mix", "config": {"channels": 4, "gate_init": 0.2,
                                                                       "max_gate": 1.0, "identity_init": False}}
    rebuilt = build("composer", "pretrain_warmup", block_of(stack, "composer")["config"])
    assert rebuilt.describe() == stack.describe() == "PretrainWarmup(NoiseGated(MaskMix, lo=0.3, hi=1), steps=5)"
    assert NoiseGated(GatedResidual(gate_init=0.2)).config.inner["config"]["gate_init"] == 0.2
    with pytest.raises(ConfigError, match=r"need 0 <= lo < hi <= 1, got lo=0.9, hi=0.5"):
        NoiseGated(GatedResidual(), lo=0.9, hi=0.5)


def test_an_experiment_built_in_python_saves_a_config_that_rebuilds_it():
    from workbench import AdapterExperiment, GatedResidual, NoiseGated, TrainingConfig
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.train.config import parse_experiment

    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1, coords=True),
                            composer=NoiseGated(GatedResidual(gate_init=0.2), lo=0.25),
                            training=TrainingConfig(progress=False))
    config = exp.resolved_config()
    again = AdapterExperiment.from_config(parse_experiment(yaml.safe_load(yaml.safe_dump(config))))
    for part in ("adapter", "composer", "objective"):
        assert block_of(getattr(again.model, part), part) == config[part]
    assert again.model.composer.describe() == "NoiseGated(GatedResidual, lo=0.25, hi=1)"


# -- evaluation data from the config ---------------------------------------------------------
def tiny_run(**extra) -> dict:
    return {"name": "evaluated",
            "base": {"type": "tiny_video", "config": {**TINY, "frames": 8}},
            "adapter": {"type": "latent_residual", "config": {**SMALL_ADAPTER, "per_frame": "keep"}},
            "training": {"steps": 4, "batch_size": 2, "sync_every": 2, "learning_rate": 1e-3},
            "data": {"type": "synthetic_moves", "config": {"items": 8, "frames": 8, "size": 16}},
            **extra}


def test_periodic_eval_from_yaml_writes_eval_records_through_the_cli(tmp_path):
    from workbench.cli import main

    run = tiny_run(evaluation={"data": {"type": "synthetic_moves", "config": {"items": 4, "frames": 8, "size": 16,
                                                                              "seed": 9}}},
                   callbacks=[{"type": "periodic_eval", "config": {"every_n_steps": 2, "batches": 1}},
                              {"type": "jsonl", "config": {"every_n_steps": 2}}])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    assert main(["train", str(path), "--output", str(tmp_path / "out"), "--quiet"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for row in evals:
        assert set(row["eval"]) == {"loss", "base_loss", "improvement", "batches"} and row["eval"]["batches"] == 1
        assert row["eval"]["loss"] > 0
    saved = yaml.safe_load((tmp_path / "out" / "step-0000004" / "config.yaml").read_text())
    assert saved["evaluation"] == {"data": run["evaluation"]["data"], "split": None}
    assert main(["train", str(path), "--output", str(tmp_path / "out"), "--steps", "6", "--resume", "--quiet"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval" in r] == [2, 4, 6]  # the resumed run evaluates on the same data


def test_evaluation_split_takes_the_training_data_at_that_split():
    from workbench import AdapterExperiment
    from workbench.train.config import parse_experiment

    mw = {"type": "metaworld", "config": {"path": "sample", "window": 4, "stride": 32}}
    exp = AdapterExperiment.from_config(parse_experiment(tiny_run(data=mw, evaluation={"split": "val"})))
    assert exp.eval_data.config == dataclasses.replace(exp.default_data().config, split="val")
    assert exp.default_data().config.split == "train"


@pytest.mark.parametrize("extra, message", [
    (dict(callbacks=[{"type": "periodic_eval"}]),
     r"callbacks\[0\]: periodic_eval needs evaluation data, and the config names none: add `evaluation: \{split: "
     r"val\}`"),
    (dict(evaluation={"split": "val"}),
     r"evaluation.split: dataset 'synthetic_moves' has no split setting \(its config fields: 'frames', 'items', "
     r"'seed', 'size', 'square'\); give evaluation.data"),
    (dict(evaluation={}), r"evaluation.data: give exactly one of data \(a \{type, config\} dataset block\) or split"),
    (dict(evaluation={"data": {"type": "synthetic_movs"}}), r"evaluation.data.type: unknown dataset 'synthetic_movs'.*"
                                                            r"Did you mean 'synthetic_moves'\?"),
    (dict(evaluation={"split": "val"}, data=None), r"evaluation.split: split: val takes the training data at that "
                                                   r"split, but the config has no data: block"),
])
def test_an_evaluation_that_could_never_run_is_a_config_error(extra, message):
    from workbench.train.config import parse_experiment

    with pytest.raises(ConfigError, match=message):
        parse_experiment(tiny_run(**extra))


def test_periodic_eval_without_data_refuses_to_start_in_python():
    from workbench import AdapterExperiment, TrainingConfig
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.train.callbacks import PeriodicEval

    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(**SMALL_ADAPTER),
                            training=TrainingConfig(progress=False, batch_size=2))
    with pytest.raises(CallbackError, match=r"PeriodicEval raised in on_fit_start at step 0: ConfigError: "
                                            r"periodic_eval has no evaluation data, so it would never evaluate"):
        exp.fit([], steps=1, callbacks=[PeriodicEval(every_n_steps=1)])
    assert exp.step == 0
