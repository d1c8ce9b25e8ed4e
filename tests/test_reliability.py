"""Bad input gets a clear error and loses nothing: a table of cases, each asserting on the message."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import forked
import pytest
import torch
import yaml
from conftest import tiny_base

from workbench import Condition, GatedResidual, MaskMix, build
from workbench.adapters.latent_residual import LatentResidual
from workbench.errors import (
    CheckpointError,
    CompositionError,
    ConditionError,
    ConfigError,
    DataError,
    UnknownComponentError,
    WorkbenchError,
)
from workbench.train import AdapterExperiment, TrainingConfig
from workbench.train.checkpoint import latest_checkpoint, list_checkpoints
from workbench.train.config import parse_experiment

ROOT = Path(__file__).resolve().parents[1]
TINY_BASE = {"type": "tiny_video", "config": {"image_size": 16, "frames": 4, "width": 16, "ae_width": 8, "depth": 1}}
GOOD = {
    "name": "ok",
    "base": TINY_BASE,
    "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1}},
    "composer": {"type": "gated_residual"},
    "training": {"steps": 2, "batch_size": 4, "progress": False},
    "data": {"type": "synthetic_moves", "config": {"items": 8, "frames": 4, "size": 16}},
}


def with_(path: str, value):
    """GOOD with one value replaced (``a.b.c`` path; value None deletes)."""
    import copy

    config = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return config


CONFIG_CASES = {
    "typo in adapter config": (with_("adapter.config.widht", 8),
                               ["adapter.config.widht: unknown key", "Did you mean 'width'?"]),
    "unknown adapter type": (with_("adapter.type", "latent_resdual"),  # installed plugins may add close matches
                             ["adapter.type: unknown adapter 'latent_resdual'", "Did you mean", "'latent_residual'"]),
    "unknown backbone type": (with_("base.type", "cogvideox"), ["base.type: unknown backbone 'cogvideox'",
                                                                "install the plugin here"]),
    "wrong type int": (with_("training.steps", "ten"), ["training.steps: expected int, got str 'ten'"]),
    "wrong type bool": (with_("training.progress", "yes"), ["training.progress: expected bool"]),
    "bad literal": (with_("training.schedule", "cosin"), ["training.schedule: got str 'cosin'; allowed: 'constant' | "
                                                          "'cosine'.", "Did you mean 'cosine'?"]),
    "bad value": (with_("training.learning_rate", -1.0), ["training.learning_rate: must be > 0, got -1.0"]),
    "missing adapter block": (with_("adapter", None), ["adapter: missing required block"]),
    "unknown top-level key": (with_("trianing", {}), ["trianing: unknown top-level key", "Did you mean 'training'?"]),
    "block with extra key": (with_("composer.confg", {}), ["composer.confg: unknown key. Allowed: 'type', 'config'."]),
    "nested composer typo": (with_("composer", {"type": "noise_gated", "config": {"inner": {"type": "gated_resid"}}}),
                             ["composer.config.inner.type: unknown composer 'gated_resid'"]),
    "cap freeze in config": (with_("composer", {"type": "gated_residual", "config": {"gate_init": 0.5,
                                                                                     "max_gate": 0.2}}),
                             ["composer.config.max_gate: max_gate=0.2 is at or below |gate_init|=0.5"]),
    "noise band inverted": (with_("composer", {"type": "noise_gated", "config": {"lo": 0.9, "hi": 0.1}}),
                            ["composer.config.lo: need 0 <= lo < hi <= 1"]),
    "callbacks not a list": (with_("callbacks", {"type": "console"}), ["callbacks: expected a list"]),
    "unknown callback": (with_("callbacks", [{"type": "consol"}]), ["callbacks[0].type: unknown callback 'consol'",
                                                                     "Did you mean 'console'?"]),
    "dataset config typo": (with_("data.config.itmes", 3), ["data.config.itmes: unknown key"]),
    "amp dtype": (with_("training.amp_dtype", "float8"),
                  ["training.amp_dtype: expected 'bf16' | 'fp16' | null, got str 'float8'"]),
    "betas length": (with_("training.betas", [0.9]), ["training.betas: expected 2 items, got 1"]),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_errors_name_path_and_fix(case):
    data, fragments = CONFIG_CASES[case]
    with pytest.raises(ConfigError) as info:
        parse_experiment(data)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_all_config_problems_come_in_one_error():
    data = with_("training.steps", "x")
    data["adapter"]["config"]["rnak"] = 3
    data["composer"] = {"type": "gatd"}
    with pytest.raises(ConfigError) as info:
        parse_experiment(data)
    msg = str(info.value)
    assert "(3 problems)" in msg
    assert all(p in msg for p in ("training.steps", "adapter.config.rnak", "composer.type"))


def test_yaml_file_errors(tmp_path):
    from workbench.train.config import load_yaml

    with pytest.raises(ConfigError, match="Config file not found"):
        load_yaml(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_yaml(bad)
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError):
        load_yaml(evil)  # safe_load refuses python tags


def test_missing_condition_from_the_backbone():
    base = tiny_base()
    with pytest.raises(ConditionError, match="consumes condition 'depth'"):
        AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1, condition="depth", aliases=()))


def test_wrong_condition_width_on_first_use():
    base = tiny_base()
    exp = AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1, dim=6),
                            training=TrainingConfig(progress=False, batch_size=2))
    from conftest import raw_batch

    with pytest.raises(ConditionError, match="has width 4 .* declares dim=6"):
        exp.fit([raw_batch()], steps=1)
    assert exp.step == 0


def test_bad_composer_settings():
    with pytest.raises(ConfigError, match="at or below the gate's init value"):
        MaskMix(channels=4, gate_init=0.9, max_gate=0.5, identity_init=False)
    with pytest.raises(CompositionError, match="neither would ever get a gradient"):
        AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                          composer=GatedResidual(gate_init=0.0))


def test_missing_data_and_unusable_data():
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False))
    with pytest.raises(DataError, match="fit\\(\\) needs data"):
        exp.fit(steps=1)
    with pytest.raises(DataError, match="must be an iterable of batch dicts or a dataset, got int"):
        exp.fit(3, steps=1)
    with pytest.raises(DataError, match="needs 'video' \\(B, 3, T, H, W\\), 'latents' \\(B, C, T, h, w\\) or 'image'"):
        exp.fit([{"frames": torch.zeros(1)}], steps=1)
    with pytest.raises(DataError, match="ran out after 1 batches"):
        from conftest import raw_batch

        exp.fit(iter([raw_batch()]), steps=2)
    assert exp.step == 1  # the completed step is kept


def test_unreadable_and_mismatched_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="No checkpoint at"):
        AdapterExperiment.load(tmp_path / "nothing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        AdapterExperiment.load(empty)
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path / "run")))
    path = exp.save_checkpoint()
    (path / "trainable.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"step-0000000 is damaged: trainable.safetensors is 22 bytes, the "
                                              r"manifest expects \d+ \(truncated\). Nothing was loaded"):
        exp.load_checkpoint(path)
    reseal(path)  # the same bytes with matching digests: read, and refused as unreadable
    with pytest.raises(CheckpointError, match="is unreadable .* It is corrupt"):
        exp.load_checkpoint(path)
    other = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=8, depth=1),
                              training=TrainingConfig(progress=False, output_dir=str(tmp_path / "run2")))
    good = other.save_checkpoint()
    with pytest.raises(CheckpointError, match="does not fit this experiment"):
        exp.load_checkpoint(good)
    (good / "state.pt").unlink()
    with pytest.raises(CheckpointError, match="is damaged: state.pt is missing"):
        other.load_checkpoint(good)
    (good / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="is damaged: manifest.json is missing"):
        other.load_checkpoint(good)


def test_a_checkpoint_of_another_adapter_type_or_setting_says_which_and_how_to_load_it(tmp_path):
    from workbench.adapters.action_modulation import ActionModulation

    saved = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                              training=TrainingConfig(progress=False, output_dir=str(tmp_path / "run")))
    path = saved.save_checkpoint()
    other = AdapterExperiment(base=tiny_base(), adapter=ActionModulation(), training=TrainingConfig(progress=False))
    with pytest.raises(CheckpointError) as info:
        other.load_checkpoint(path)
    message = str(info.value)
    assert message.startswith(f"Checkpoint {path} does not fit this experiment: it holds the weights of adapter "
                              f"'latent_residual', this experiment has adapter 'action_modulation'; it holds the "
                              f"weights of composer 'gated_residual', this experiment has composer 'replace'. Build "
                              f"the experiment the checkpoint was saved with instead: AdapterExperiment.load('{path}') "
                              f"reads its config.yaml. (Weights missing from the checkpoint: ")
    wider = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=32, depth=1),
                              training=TrainingConfig(progress=False))
    with pytest.raises(CheckpointError, match=r"does not fit this experiment: its adapter 'latent_residual' was "
                                              r"configured otherwise \(width: 16 saved, 32 here\)\. Build the "):
        wider.load_checkpoint(path)


def reseal(path: Path) -> None:
    """Rewrite a checkpoint's manifest for its files as they are now (what a deliberate tamperer would do)."""
    from workbench.integrity import entry_of, manifest_bytes
    from workbench.train.checkpoint import FILES

    (path / "manifest.json").write_bytes(manifest_bytes({n: entry_of((path / n).read_bytes()) for n in FILES}))


class _RunsCode:
    """Unpickling this would call os.system (what a tampered checkpoint could hold)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Unknown:
    """A class torch's safe loader does not know."""


@pytest.mark.parametrize("payload, found", [
    (lambda marker: {"optimizer": {}, "rng_cpu": torch.zeros(1), "step": 0, "hook": _RunsCode(marker)},
     r"references to posix\.system"),
    (lambda marker: {"optimizer": {}, "rng_cpu": torch.zeros(1), "step": 0, "extra": _Unknown()},
     r"references to test_reliability\._Unknown"),
])
def test_state_that_is_not_tensors_and_plain_data_is_refused_unread(tmp_path, payload, found):
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=8, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path / "run")))
    path = exp.save_checkpoint()
    marker = tmp_path / "code-ran"
    torch.save(payload(marker), path / "state.pt")
    reseal(path)
    for load in (exp.load_checkpoint, AdapterExperiment.load):
        with pytest.raises(CheckpointError) as info:
            load(path)
        message = str(info.value)
        assert re.search(rf"Checkpoint .*{path.name}: state\.pt holds {found}\. workbench writes only tensors "
                         rf"and plain data .* tampered with or not written by workbench, and it will not be "
                         rf"unpickled", message), message
        assert "weights_only" not in message and "trusted source" not in message  # not torch's advice
        assert info.value.__cause__ is None
    assert not marker.exists()


def test_state_without_the_training_state_is_refused(tmp_path):
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=8, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path / "run")))
    path = exp.save_checkpoint()
    torch.save([torch.zeros(2)], path / "state.pt")
    reseal(path)
    with pytest.raises(CheckpointError, match=r"state\.pt holds list, not the training state workbench writes "
                                              r"\(missing optimizer, rng_cpu, step\)"):
        exp.load_checkpoint(path)



def test_an_optimizer_state_that_does_not_fit_is_refused_at_load_whether_the_optimizer_is_built_or_not(tmp_path):
    """A loaded experiment builds its optimizer on first use; the saved optimizer state is checked at load all
    the same: into an experiment whose optimizer exists, and into a fresh one whose optimizer does not yet."""
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=8, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path / "run")))
    path = exp.save_checkpoint()  # (its optimizer built to save its state)
    state = torch.load(path / "state.pt", weights_only=True)
    state["optimizer"]["param_groups"][0]["params"] = [0]
    torch.save(state, path / "state.pt")
    reseal(path)
    count = len(list(exp.model.trainable_parameters()))
    wording = (rf"Checkpoint .*step-0000000: the optimizer state in state\.pt does not fit this experiment's "
               rf"parameters \(parameters per group: saved \[1\], this experiment \[{count}\]\)\. Build the "
               rf"experiment from the checkpoint's config\.yaml")
    for load in (exp.load_checkpoint, AdapterExperiment.load):
        with pytest.raises(CheckpointError, match=wording):
            load(path)


LOAD_AND_SAMPLE = """
import sys
import torch
from workbench.worldmodel import TRAINED_ADAPTER
from workbench.worldmodel.common import load_run
exp = load_run(TRAINED_ADAPTER)
print("dynamo after load:", "torch._dynamo" in sys.modules)
state = exp.optimizer.state_dict()["state"]
print("optimizer state entries:", len(state), "of", len(list(exp.model.trainable_parameters())))
print("dynamo after the optimizer:", "torch._dynamo" in sys.modules)
"""


def test_a_run_loaded_to_evaluate_builds_no_optimizer_until_asked(tmp_path):
    """Creating a torch optimizer imports torch._dynamo (seconds of CPU time): a run loaded to sample or evaluate
    does without; asked for, the optimizer comes with the checkpoint's state (AdamW's moments of every weight)."""
    done = subprocess.run([sys.executable, "-c", LOAD_AND_SAMPLE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert lines["dynamo after load"] == "False"
    saved, total = lines["optimizer state entries"].split(" of ")
    assert saved == total and int(total) > 0
    assert lines["dynamo after the optimizer"] == "True"

def test_tiny_video_weights_errors(tmp_path):
    from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig

    with pytest.raises(CheckpointError, match="tiny_video weights not found"):
        TinyVideo(TinyVideoConfig(weights=str(tmp_path / "x.safetensors")))
    small = tiny_base()
    path = small.save_pretrained(tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match=r"different tiny_video architecture: .*width: built 32, weights 16\. "
                                              r"Build with TinyVideo\.from_pretrained\(path\) .* or in a config "
                                              r"give it with the weights: base: \{type: tiny_video, config: "
                                              r"\{weights: .*, width: 16\}\}"):
        TinyVideo(TinyVideoConfig(image_size=16, frames=4, width=32, ae_width=8, depth=1, weights=str(path)))
    assert torch.equal(TinyVideo.from_pretrained(path).denoiser.out.weight, small.denoiser.out.weight)


def test_a_backbone_naming_weight_files_that_are_not_there_is_told_so(tmp_path, monkeypatch):
    base = tiny_base()
    monkeypatch.setattr(base, "weight_files", lambda: (tmp_path / "gone.safetensors",))
    with pytest.raises(CheckpointError, match=rf"TinyVideo\.weight_files\(\) names 1 file\(s\) that cannot be read: "
                                              rf"{re.escape(str(tmp_path / 'gone.safetensors'))}\. It must list the "
                                              rf"files its frozen weights were read from .* Put the files back, or fix "
                                              rf"the backbone's weight_files\(\)\."):
        AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1))


def test_unknown_component_lists_and_suggests():
    with pytest.raises(UnknownComponentError) as info:
        build("composer", "gated_residul")
    msg = str(info.value)
    assert "Unknown composer 'gated_residul'" in msg and "Did you mean 'gated_residual'?" in msg
    assert "importlib.metadata" in msg  # the one-line command listing visible entry points
    with pytest.raises(UnknownComponentError, match="Unknown component kind 'adaptor'.*Did you mean 'adapter'"):
        build("adaptor", "x")


def test_cli_refuses_to_overwrite_and_resume_needs_a_checkpoint(tmp_path, capsys):
    from workbench.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(GOOD))
    out = tmp_path / "run"
    assert main(["train", str(config), "--output", str(out), "--resume", "--quiet"]) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    assert main(["train", str(config), "--output", str(out), "--steps", "1", "--quiet"]) == 0
    assert main(["train", str(config), "--output", str(out), "--steps", "2", "--quiet"]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert [p.name for p in list_checkpoints(out)] == ["step-0000001"]


def test_condition_declaration_error_is_a_workbench_error():
    with pytest.raises(WorkbenchError):
        Condition("x", per_frame="avg")


def test_sigkill_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        torch.set_num_threads(1)
        from conftest import tiny_base
        from workbench.adapters.latent_residual import LatentResidual
        from workbench.data.synthetic import SyntheticMoves
        from workbench.train import AdapterExperiment, TrainingConfig
        from workbench.train import checkpoint
        torch.manual_seed(0)
        exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                                training=TrainingConfig(progress=False, batch_size=4, output_dir={str(tmp_path)!r}))
        data = SyntheticMoves(items=8, frames=4, size=16)
        exp.fit(data, steps=1)
        exp.save_checkpoint()
        exp.fit(data, steps=1)
        write = checkpoint.write_bytes
        def slow_write(path, data):  # the kill lands between two files of the save
            write(path, data)
            time.sleep(30)
        checkpoint.write_bytes = slow_write
        print("saving", flush=True)
        exp.save_checkpoint()
    """)
    proc = forked.start(["-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.readline().strip() == "saving", proc.stderr[-2000:]
    import time

    deadline = time.time() + 30
    while not list(tmp_path.glob(".tmp-step-*/trainable.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".tmp-step-*")), "the save never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-0000001"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000001"]
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path)))
    assert exp.load_checkpoint(tmp_path).step == 1
    exp.save_checkpoint()  # the next save cleans the leftover temporary directory
    assert not list(tmp_path.glob(".tmp-*"))
