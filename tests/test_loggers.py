"""The tensorboard and wandb callbacks: what they write, and that they stay optional."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from conftest import tiny_base

from workbench import AdapterExperiment, GatedResidual, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.config import build
from workbench.data.synthetic import SyntheticMoves
from workbench.errors import CallbackError


def experiment(tmp_path, callback) -> AdapterExperiment:
    torch.manual_seed(0)
    return AdapterExperiment(tiny_base(frames=8), LatentResidual(width=8, depth=1), GatedResidual(),
                             training=TrainingConfig(batch_size=4, learning_rate=1e-3, progress=False, sync_every=2,
                                                     output_dir=str(tmp_path / "run")),
                             callbacks=[callback])


def test_tensorboard_writes_events_a_reader_parses(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callback = build("callback", "tensorboard", {"every_n_steps": 2})
    exp = experiment(tmp_path, callback)
    data = SyntheticMoves(items=8, frames=8, size=16)
    exp.fit(data, steps=6)
    exp.evaluate(data, batches=1)
    callback.close()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "eval/loss", "eval/base_loss"} <= set(tags) and "train/step" not in tags
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [2, 4, 6]
    assert [e.value for e in loss] == pytest.approx([exp.loss_history[i] for i in (1, 3, 5)], rel=1e-6)
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([1e-3] * 3)
    assert [e.step for e in events.Scalars("eval/loss")] == [6]


class FakeRun:
    def __init__(self, **kwargs):
        self.kwargs, self.rows, self.finished = kwargs, [], False

    def log(self, values, step):
        self.rows.append((step, values))

    def finish(self):
        self.finished = True


def test_wandb_is_offline_unless_configured_and_logs_what_tensorboard_does(tmp_path, monkeypatch):
    runs = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: runs.append(FakeRun(**kwargs)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    callback = build("callback", "wandb", {"every_n_steps": 3, "project": "arm"})
    exp = experiment(tmp_path, callback)
    exp.fit(SyntheticMoves(items=8, frames=8, size=16), steps=6)
    (run,) = runs
    assert run.kwargs["mode"] == "offline" and run.kwargs["project"] == "arm" and run.kwargs["name"] == "run"
    assert run.kwargs["config"]["training"]["learning_rate"] == 1e-3
    assert [step for step, _ in run.rows] == [3, 6]
    assert run.rows[0][1]["train/loss"] == pytest.approx(exp.loss_history[2], rel=1e-6)
    callback.close()
    assert run.finished


@pytest.mark.parametrize("callback, module, advice", [
    # tensorboard comes with the 'logging' extra; wandb belongs to no extra and is installed on its own
    ("tensorboard", "torch.utils.tensorboard",
     r'pip install "\./\[logging\]" in a clone of the repository \(pip install -e "\./\[logging\]" for an editable '
     r"install; `make install` there installs every extra\)"),
    ("wandb", "wandb", r"pip install wandb"),
])
def test_a_missing_tracker_package_says_how_to_install_it(tmp_path, monkeypatch, callback, module, advice):
    monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    exp = experiment(tmp_path, build("callback", callback, {}))
    with pytest.raises(CallbackError, match=rf"^The {callback} callback needs the '{callback}' package, which is not "
                                            rf"installed\. Install it with `{advice}`, or remove the callback from "
                                            r"the config\.$"):
        exp.fit(SyntheticMoves(items=8, frames=8, size=16), steps=1)


def test_a_bad_mode_is_refused_with_the_allowed_ones():
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"mode: got str 'offlne'; allowed: 'offline' \| 'online' \| 'disabled'.*"
                                          r"Did you mean one of 'offline'"):
        build("callback", "wandb", {"mode": "offlne"})
