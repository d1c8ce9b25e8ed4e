"""The command line behaves like one: numbers as YAML 1.1 spells them, files with the user's umask,
progress on long commands, the optional extras checked before work, messages that end with their fix."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
from pathlib import Path

import pytest
import yaml
from conftest import TINY_RUN, cli, tiny_base, write_run_config

from workbench.errors import ConfigError
from workbench.train.config import parse_experiment

ROOT = Path(__file__).resolve().parents[1]


# -- numbers YAML 1.1 leaves as text -------------------------------------------------------------------------
def test_numbers_yaml_1_1_reads_as_text_are_numbers():
    data = yaml.safe_load("learning_rate: 1e-3\nmin_lr_ratio: 5E-2\nsteps: 1e3\nwarmup_steps: 2.0e1\n")
    assert data["learning_rate"] == "1e-3"  # what PyYAML gives
    config = parse_experiment({**TINY_RUN, "training": data})
    assert (config.training.learning_rate, config.training.min_lr_ratio) == (0.001, 0.05)
    assert (config.training.steps, config.training.warmup_steps) == (1000, 20)


@pytest.mark.parametrize("field, value, message", [
    ("steps", "1e-3", r"training\.steps: expected int, got str '1e-3' \(the number 0\.001, not an int\)\."),
    ("learning_rate", "fast", r"training\.learning_rate: expected float, got str 'fast'\.$"),
])
def test_a_string_that_is_not_that_kind_of_number_is_refused(field, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_experiment({**TINY_RUN, "training": {field: value}})


# -- files with the user's umask ---------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_files_are_written_with_the_users_umask(tmp_path, capsys, mask):
    pytest.importorskip("peft")
    from workbench.adapters.lora import LoRA
    from workbench.train import AdapterExperiment

    config = write_run_config(tmp_path / "c.yaml", **{"data.config.items": 4})
    previous = os.umask(mask)
    try:
        status, out, _ = cli(capsys, "train", config, "--output", tmp_path / "run", "--steps", 2, "--quiet")
        assert status == 0
        # what comes next, for a run whose data `workbench eval` does not score (the synthetic toy)
        assert out.splitlines()[-1] == f"Load it in Python with: AdapterExperiment.load({str(tmp_path / 'run')!r})"
        assert cli(capsys, "cache-latents", config, "--out", tmp_path / "cache", "--quiet")[0] == 0
        AdapterExperiment(base=tiny_base(), adapter=LoRA(rank=2)).export_lora(tmp_path / "lora")
    finally:
        os.umask(previous)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "c.yaml"]
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert {"cache/shard-00000.safetensors", "cache/shard-00000.manifest.json", "cache/cache.json", "run/LATEST",
            "run/step-0000002/trainable.safetensors", "run/step-0000002/manifest.json",
            "lora/pytorch_lora_weights.safetensors", "lora/manifest.json"} <= set(modes)
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes


# -- progress on long commands --------------------------------------------------------------------------------
def test_cache_latents_shows_its_progress_unless_quiet(tmp_path, capsys):
    config = write_run_config(tmp_path / "c.yaml", **{"data.config.items": 6})
    status, out, err = cli(capsys, "cache-latents", config, "--out", tmp_path / "a", "--shard-size", 4)
    assert status == 0 and re.search(r"cache-latents: 100%\|.*\| 6/6 ", err), err
    status, out, err = cli(capsys, "cache-latents", config, "--out", tmp_path / "b", "--quiet")
    assert status == 0 and err == ""


# -- messages that end with their fix ---------------------------------------------------------------------------
def test_an_unknown_component_message_ends_with_the_command_that_lists_them():
    with pytest.raises(ConfigError) as info:
        parse_experiment({**TINY_RUN, "base": {"type": "cogvideo"}})
    message = str(info.value)
    assert "then list what this environment sees with `workbench doctor`, or: python -c \"import importlib." \
           "metadata as m; print({g: [e.name for e in m.entry_points(group=g)] for g in ['workbench.backbones'" \
           in message
    assert message.rstrip().endswith("'workbench.datasets', 'workbench.state_readers']})\"")


def test_grad_accum_on_the_command_line_and_in_the_ranks_message(tmp_path, capsys):
    from workbench.train.distributed import Distributed

    config = write_run_config(tmp_path / "c.yaml")
    status, _, _ = cli(capsys, "train", config, "--output", tmp_path / "run", "--steps", 1, "--grad-accum", 2)
    assert status == 0
    saved = yaml.safe_load((tmp_path / "run" / "step-0000001" / "config.yaml").read_text())
    assert saved["training"]["grad_accum"] == 2
    ranks = Distributed.__new__(Distributed)
    ranks.world_size = 2
    with pytest.raises(ConfigError, match=r"use a multiple of 2, e\.g\. 2, 4, 6 \(on the command line: workbench "
                                          r"train CONFIG --grad-accum 2\)"):
        ranks.split_micro_batches(1)


def test_eval_given_a_data_file_says_how_to_call_it(tmp_path, capsys):
    from workbench.data.metaworld import sample_path

    status, _, err = cli(capsys, "eval", sample_path(), "--out", tmp_path / "out")
    assert status == 2
    assert f"error: {sample_path()} is a file (a data file), not a run directory. `workbench eval` takes the " \
           f"adapter's run directory first and the data with --data: workbench eval RUN_DIR --data {sample_path()}" \
           in err
    assert not (tmp_path / "out").exists()


def test_a_few_clips_cover_every_task():
    from workbench.worldmodel.common import clip_source, spread_over_tasks

    source = clip_source("sample", window=16, split="val")
    tasks = sorted(set(source.task_names))
    for n in (6, 12):
        chosen = spread_over_tasks(source, n)
        counts = {t: sum(source.task_names[source.index[i][0]] == t for i in chosen) for t in tasks}
        assert len(chosen) == n and set(counts.values()) == {n // len(tasks)}, counts


def test_lerobot_generation_names_only_what_it_wrote(tmp_path, capsys):
    for name in ("metaworld", "mujoco"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install './[data]' in a clone)")
    from workbench.worldmodel.sim import RenderingUnavailable

    out = tmp_path / "robot"
    try:
        status, text, err = cli(capsys, "data", "metaworld", "--format", "lerobot", "--tasks", "reach-v3",
                                "--episodes", 1, "--frames", 6, "--size", 32, "--out", out)
    except RenderingUnavailable as err:  # pragma: no cover - no EGL here
        pytest.skip(str(err))
    if status == 2 and "cannot render" in err:
        pytest.skip(err)
    assert status == 0, err
    assert "rollouts.h5" not in text and text.startswith(f"wrote {out}: LeRobot v3.0 dataset"), text
    assert not list(tmp_path.glob("*.h5"))


# -- the optional extras -----------------------------------------------------------------------------------------
def test_the_extras_table_is_the_distributions():
    from workbench.extras import EXTRAS

    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: sorted(re.split(r"[<>=\[ ;]", spec)[0].lower() for spec in specs)
             for extra, specs in declared.items() if not any(s.startswith("grafted-workbench") for s in specs)}
    names.pop("dev")
    names.pop("docs")  # builds this documentation site; no command or component needs it
    assert names == {extra: sorted(dists) for extra, dists in EXTRAS.items()}


def test_make_demo_installs_every_package_the_demo_needs():
    from workbench.worldmodel.cli import demo
    from workbench.worldmodel.demo import WORLD_NEEDS

    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("DEMO_PACKAGES :="))
    listed = set(line.split(":=")[1].split())
    distribution = {"PIL": "pillow", "imageio_ffmpeg": "imageio-ffmpeg"}  # (module -> what pip installs)
    needed = {distribution.get(m, m) for modules in demo.extras.values() for m in modules}
    assert listed == needed | set(WORLD_NEEDS)  # the command's extras, and what its world summary's experts import


def _without(monkeypatch, *modules: str) -> None:
    from workbench import extras

    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module not in modules and real(module))


@pytest.mark.parametrize("missing, wording", [
    (("matplotlib", "h5py"), "error: workbench demo needs h5py (the 'data' extra); matplotlib (the 'widgets' extra), "
                             "not installed in this environment. Install with: pip install \"./[data,widgets]\" in a "
                             "clone of the repository"),
    # the scripted experts its closed loops run
    (("metaworld", "mujoco"), "error: the demo needs metaworld, mujoco (the 'data' extra), not installed in this "
                              "environment. Install with: pip install \"./[data]\" in a clone of the repository"),
])
def test_the_demo_refuses_before_work_when_a_package_it_needs_is_missing(tmp_path, capsys, monkeypatch, missing,
                                                                        wording):
    _without(monkeypatch, *missing)
    status, out, err = cli(capsys, "demo", "--quick", "--output", tmp_path / "demo")
    assert status == 2 and out == ""
    assert wording in err
    assert not (tmp_path / "demo").exists()


def test_train_checks_the_extras_its_config_needs_before_work(tmp_path, capsys, monkeypatch):
    _without(monkeypatch, "h5py")
    config = write_run_config(tmp_path / "c.yaml", data={"type": "metaworld", "config": {"path": "sample"}})
    status, _, err = cli(capsys, "train", config, "--output", tmp_path / "run", "--quiet")
    assert status == 2
    assert f"error: workbench train {config} (data: metaworld) needs h5py from the 'data' extra, which is not " \
           f"installed in this environment. Install it with: pip install \"./[data]\" in a clone of the " \
           f"repository" in err
    assert not (tmp_path / "run").exists()


def test_an_import_of_a_missing_extra_anywhere_names_the_extra(capsys, monkeypatch):
    from workbench import cli as cli_module
    from workbench.cli import Command

    def needs_av(args):
        raise ModuleNotFoundError("No module named 'av'", name="av")

    command = Command("late", "imports av late", lambda parser: None, needs_av)
    monkeypatch.setattr(cli_module, "registered_commands", lambda: [command])
    status, _, err = cli(capsys, "late")
    assert status == 2 and "error: workbench late needs the module 'av' from the 'data' extra" in err


def test_doctor_says_what_each_extra_serves_and_which_commands_need_it(capsys):
    status, out, _ = cli(capsys, "doctor")
    assert status == 0
    assert '\nextras (pip install "./[EXTRA]" in a clone of the repository):\n' in out, out
    assert "grafted-workbench" not in out  # the distribution is not on the package index yet
    assert re.search(r"^  data       installed - datasets and video files: the metaworld and lerobot datasets, "
                     r"importing your own videos, MP4 / GIF output; commands: workbench data, workbench demo, "
                     r"workbench eval, workbench pretrain, workbench probe$", out, re.M), out
    assert re.search(r"^  widgets    installed - the notebook views \(workbench\.widgets: Stepper, Fit, \.\.\.\) and "
                     r"the demo's loss chart; commands: workbench demo$", out, re.M), out
    assert re.search(r"^  peft       (installed|missing peft) - lora adapters and lora: blocks inside "
                     r"action_modulation$", out, re.M), out


# -- commands that work as printed -------------------------------------------------------------------------------
def test_init_writes_the_examples_where_the_docs_expect_them_and_keeps_what_is_there(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, out, _ = cli(capsys, "init", "tiny")
    assert status == 0 and out.splitlines() == ["wrote examples/configs/tiny.yaml",
                                                "Train one with: workbench train examples/configs/tiny.yaml"]
    assert (tmp_path / "examples/configs/tiny.yaml").read_text() == (ROOT / "examples/configs/tiny.yaml").read_text()
    (tmp_path / "examples/configs/tiny.yaml").write_text("# mine\n")
    status, out, _ = cli(capsys, "init")
    shipped = sorted(p.name for p in (ROOT / "examples" / "configs").glob("*.yaml"))
    assert status == 0 and sorted(p.name for p in (tmp_path / "examples/configs").iterdir()) == shipped
    assert "kept 1 that were there already (never overwritten): tiny.yaml" in out
    assert (tmp_path / "examples/configs/tiny.yaml").read_text() == "# mine\n"
    status, _, err = cli(capsys, "init", "tiny_lorra")
    assert status == 2 and "error: No example config called 'tiny_lorra'." in err
    assert "Did you mean one of 'tiny_lora'" in err


def test_the_continue_line_carries_the_runs_own_arguments_and_parses_back_to_them():
    import shlex

    from workbench.cli import build_parser, continue_train

    argv = ["train", "my run.yaml", "--output", "runs/a", "--steps", "300", "--grad-accum", "2", "--camera",
            "observation.images.wrist", "--state", "none", "--action-dim", "7", "--quiet"]
    args = build_parser().parse_args(argv)
    line = continue_train(args)
    assert line == ("workbench train 'my run.yaml' --output runs/a --steps 300 --grad-accum 2 --camera "
                    "observation.images.wrist --state none --action-dim 7 --resume --quiet")
    again = build_parser().parse_args(shlex.split(line)[1:])
    assert {**vars(again), "resume": False} == {**vars(args), "func": again.func}
    started = build_parser().parse_args(["train", "c.yaml", "--resume", "--from", "step-2", "--override", "steps"])
    assert continue_train(started, "outputs/tiny") == "workbench train c.yaml --output outputs/tiny --resume"


def _two_d_dataset(root: Path, episodes: int = 4, frames: int = 8, state: bool = False) -> Path:
    import numpy as np

    from workbench.data.lerobot_write import LeRobotWriter

    features = {"action": ("float32", ["dx", "dy"])}
    if state:
        features["observation.state"] = ("float32", ["x"])
    with LeRobotWriter(root, 10, features, ["observation.images.main"]) as writer:
        for e in range(episodes):
            data = {"action": np.full((frames, 2), e / 10, np.float32)}
            if state:
                data["observation.state"] = np.zeros((frames, 1), np.float32)
            writer.add_episode({"observation.images.main": np.full((frames, 16, 16, 3), 20 * e, np.uint8)}, data,
                               f"task {e % 2}")
    return root


def test_eval_of_a_run_on_data_of_another_action_width_stops_before_any_work(tmp_path, capsys):
    data = _two_d_dataset(tmp_path / "two_d")
    config = write_run_config(tmp_path / "c.yaml")  # latent_residual with the default dim 4
    assert cli(capsys, "train", config, "--output", tmp_path / "run", "--steps", 1, "--quiet")[0] == 0
    status, _, err = cli(capsys, "eval", tmp_path / "run", "--data", data, "--out", tmp_path / "eval")
    assert status == 2
    assert f"error: The run's adapter was trained on 4-D 'action' vectors, but the clips of {data} serve 2-D ones. " \
           f"Nothing was evaluated. Evaluate it on data with 4-D action vectors (or choose such a feature with " \
           f"--actions FEATURE), or train an adapter for this data: `workbench train CONFIG --action-dim 2`" in err
    assert not (tmp_path / "eval").exists()


def test_demo_data_needs_no_state_and_reads_the_width_of_the_chosen_actions(tmp_path):
    """The issue's case: `workbench demo --data` refused a dataset without observation.state."""
    from workbench.worldmodel.demo import DemoConfig, build_experiment

    data = _two_d_dataset(tmp_path / "two_d", frames=16)
    exp = build_experiment(DemoConfig.quick(data=str(data), output=str(tmp_path / "demo")), tmp_path / "demo" / "run")
    assert exp.model.adapter.config.dim == 2
    item = exp.default_data()[0]
    assert "proprio" not in item and tuple(item["action"].shape) == (16, 2)
    assert tuple(item["video"].shape) == (3, 16, 64, 64)  # resized to the base's frames


def test_train_and_eval_take_the_same_data_options_and_need_no_state_the_adapter_does_not_read(tmp_path, capsys):
    with_state = _two_d_dataset(tmp_path / "with_state", state=True)
    without = _two_d_dataset(tmp_path / "without")
    data = {"type": "lerobot", "config": {"root": str(with_state), "window": 4, "stride": 4, "split": "all"}}
    config = write_run_config(tmp_path / "c.yaml", data=data, **{"training.checkpoint_every": None})
    status, out, err = cli(capsys, "train", config, "--output", tmp_path / "run", "--steps", 1, "--quiet",
                           "--state", "observation.state", "--action-dim", 2)
    assert status == 0, err
    run = tmp_path / "run"
    assert out.splitlines()[-1] == f"Evaluate it with: workbench eval {run} --out {run}_eval"
    saved = yaml.safe_load((tmp_path / "run" / "step-0000001" / "config.yaml").read_text())
    assert saved["data"]["config"]["state"] == "observation.state" and saved["adapter"]["config"]["dim"] == 2
    status, out, err = cli(capsys, "eval", tmp_path / "run", "--data", without, "--out", tmp_path / "eval",
                           "--clips", 2, "--sampling-steps", 1, "--no-progress", "--split", "all")
    assert status == 0, err  # the run read a state, its adapter does not: data without one evaluates
    assert "without (all): 2 clips" in out
    status, out, err = cli(capsys, "eval", tmp_path / "run", "--out", tmp_path / "own", "--clips", 2,
                           "--sampling-steps", 1, "--no-progress", "--split", "all")
    assert status == 0 and "with_state (all): 2 clips" in out  # by default, the run's own data
    status, out, err = cli(capsys, "cache-latents", config, "--out", tmp_path / "cache", "--state", "none", "--quiet")
    assert status == 0 and "cache-latents: 8 items of lerobot cached in" in out, err
    identity = json.loads((tmp_path / "cache" / "cache.json").read_text())
    assert '"state": null' in json.dumps(identity)  # the flag is part of what the cache is of
    status, _, err = cli(capsys, "train", config, "--output", tmp_path / "other", "--camera", "front", "--quiet")
    assert status == 2 and "camera 'front' is not a video feature of this dataset" in err
    synthetic = write_run_config(tmp_path / "s.yaml")
    status, _, err = cli(capsys, "train", synthetic, "--output", tmp_path / "s", "--state", "none", "--quiet")
    assert status == 2 and "error: --state: the dataset of " in err and "is 'synthetic_moves', which has no 'state' " \
                                                                          "setting" in err


# -- output cut off by its reader ----------------------------------------------------------------------------
class _ClosedPipe:
    """A stdout whose reader has gone (``workbench ... | head`` after head exits)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return 99


@pytest.mark.parametrize("argv", [["init", "tiny", "--dir", "{tmp}"], ["doctor"],
                                  ["data", "example", "{tmp}/ex", "--episodes", "1", "--frames", "2", "--size", "8"]],
                         ids=["init", "doctor", "data example"])
def test_a_closed_pipe_ends_any_command_quietly(tmp_path, monkeypatch, argv):
    import sys

    from workbench import cli as module

    silenced = []
    monkeypatch.setattr(module.os, "dup2", lambda fd, target: silenced.append(target))
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert module.main([a.format(tmp=tmp_path) for a in argv]) == 141  # 128 + SIGPIPE, as a shell reports it
    assert 99 in silenced  # later writes, and the flush at exit, go nowhere


def test_a_closed_pipe_leaves_no_traceback_in_a_real_process(tmp_path):
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a line
    try:
        done = subprocess.run([sys.executable, "-m", "workbench", "init", "tiny", "--dir", str(tmp_path)], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


def test_the_top_level_help_says_pretrain_reads_any_videos():
    from workbench.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "pretrain pretrain or fine-tune the tiny_video backbone on videos alone (no actions): Meta-World clips " \
           "or a LeRobot dataset, and check that it carries them" in text
