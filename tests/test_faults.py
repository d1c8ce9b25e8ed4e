"""Fault injection: damaged files, killed processes, edited configs and signals, each with its exact outcome.

Every case damages one thing on purpose (seeded: the same bytes every run) and asserts what the user
gets: a clear error that names the file and the fix, with no traceback and nothing lost (the files
are byte-for-byte what they were), or a correct continuation (bit-exact where the design promises it).
docs/guides/reliability.md states what is promised and counts these cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import textwrap
import time
from pathlib import Path

import forked
import pytest
import torch
from conftest import COLLECTED, TINY_RUN, cli, flip_bits, snapshot, tiny_base, truncate, write_run_config

from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.errors import CheckpointError, ConfigError, DataError, NonFiniteLossError
from workbench.train import AdapterExperiment
from workbench.train.checkpoint import FILES, MANIFEST, checkpoint_problem, latest_checkpoint, list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
FINAL = "step-0000006"


# -- a run to damage ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 4-step run (checkpoints at steps 2 and 4) and the uninterrupted 6-step run of the same config."""
    root = tmp_path_factory.mktemp("runs")
    config = write_run_config(root / "run.yaml")
    assert cli(_NullCapture(), "train", config, "--output", root / "run", "--quiet")[0] == 0
    assert cli(_NullCapture(), "train", config, "--output", root / "six", "--steps", 6, "--quiet")[0] == 0
    return config, root / "run", root / "six"


class _NullCapture:
    """A stand-in for capsys in module fixtures: output goes to the terminal (nothing to assert on there)."""

    def readouterr(self):
        return "", ""


def copy_run(runs, tmp_path) -> tuple[Path, Path, Path]:
    config, run, six = runs
    mine = tmp_path / "run"
    shutil.copytree(run, mine)
    return config, mine, six


def trainable(run: Path, step: str = FINAL) -> bytes:
    return (run / step / "trainable.safetensors").read_bytes()


# -- checkpoint files: bit flips and truncations -------------------------------------------------------------
PROBLEM = {  # (file, fault) -> what the refusal says about the file
    "flip": r"{name} has sha256 [0-9a-f]{{16}}…, the manifest expects [0-9a-f]{{16}}… \(same size: its contents "
            r"changed, e\.g\. flipped bits\)",
    "truncate": r"{name} is \d+ bytes, the manifest expects \d+ \(truncated\)",
}


@pytest.mark.parametrize("fault", ["flip", "truncate"])
@pytest.mark.parametrize("name", [*FILES, MANIFEST])
def test_a_damaged_checkpoint_file_is_refused_naming_it_and_the_newest_that_verifies(runs, tmp_path, capsys, name,
                                                                                     fault):
    config, run, _ = copy_run(runs, tmp_path)
    target = run / "step-0000004" / name
    seed = sorted([*FILES, MANIFEST]).index(name)
    flip_bits(target, seed) if fault == "flip" else truncate(target, seed)
    before = snapshot(run)
    status, out, err = cli(capsys, "train", config, "--output", run, "--resume", "--steps", 6, "--quiet")
    assert status == 2 and out == ""
    problem = rf"{MANIFEST} is damaged \(.+\)" if name == MANIFEST else PROBLEM[fault].format(name=name)
    pattern = (rf"error: Checkpoint {run}/step-0000004 is damaged: {problem}\. Nothing was loaded\. The newest "
               rf"checkpoint of this run that verifies is step-0000002: continue from it with `workbench train CONFIG "
               rf"--output {run} --resume --from step-0000002`")
    assert re.search(pattern, err), err
    assert snapshot(run) == before  # nothing lost, nothing written


def test_one_low_bit_in_a_hundred_values_is_caught(runs, tmp_path):
    """The issue's case: flipping the lowest mantissa bit of 100 weights used to resume silently."""
    _, run, _ = copy_run(runs, tmp_path)
    path = run / "step-0000004" / "trainable.safetensors"
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    for offset in random.Random(0).sample(range(header, len(data), 4), 100):  # float32 little-endian: byte 0
        data[offset] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"trainable\.safetensors has sha256 .* \(same size: its contents "
                                              r"changed, e\.g\. flipped bits\)\. Nothing was loaded\. The newest "
                                              r"checkpoint of this run that verifies is step-0000002"):
        AdapterExperiment.load(run)


def test_an_exponent_bit_is_caught_at_load_not_blamed_on_the_learning_rate(runs, tmp_path):
    """The issue's case: a flipped exponent bit used to surface as "Loss became nan ... lower the learning rate"."""
    _, run, _ = copy_run(runs, tmp_path)
    path = run / "step-0000004" / "trainable.safetensors"
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header + 3] ^= 0x40  # the top exponent bit of the first float32
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        AdapterExperiment.load(run / "step-0000004")
    assert "step-0000004 is damaged: trainable.safetensors has sha256" in str(info.value)
    assert "learning rate" not in str(info.value)


def test_eval_of_a_damaged_checkpoint_is_refused_before_any_work(runs, tmp_path, capsys):
    """The issue's case: `eval` on a corrupt checkpoint used to fail deep inside video encoding."""
    _, run, _ = copy_run(runs, tmp_path)
    flip_bits(run / "step-0000004" / "trainable.safetensors", seed=7)
    status, _, err = cli(capsys, "eval", run, "--data", "sample", "--out", tmp_path / "eval")
    assert status == 2 and f"error: Checkpoint {run}/step-0000004 is damaged: trainable.safetensors has sha256" in err
    assert not (tmp_path / "eval").exists()


def test_from_an_earlier_checkpoint_continues_bit_exactly_and_keeps_the_later_ones(runs, tmp_path, capsys):
    config, run, six = copy_run(runs, tmp_path)
    flip_bits(run / "step-0000004" / "trainable.safetensors", seed=1)
    damaged = snapshot(run / "step-0000004")
    status, out, err = cli(capsys, "train", config, "--output", run, "--resume", "--from", "step-0000002",
                           "--steps", 6, "--quiet")
    assert status == 0, err
    assert f"Resuming from step-0000002: the 1 later checkpoint(s) were moved to {run / 'superseded'}" in out
    assert trainable(run) == trainable(six)  # the continuation from step 2 is the uninterrupted run
    assert json.loads((run / FINAL / "meta.json").read_text())["loss_history"] == \
        json.loads((six / FINAL / "meta.json").read_text())["loss_history"]
    assert snapshot(run / "superseded" / "step-0000004") == damaged  # kept, not deleted
    assert [p.name for p in list_checkpoints(run)] == ["step-0000002", "step-0000004", FINAL]


@pytest.mark.parametrize("args, message", [
    (["--resume", "--from", "step-9"], r"--from step-9: not a checkpoint of the run in .*run\. Its checkpoints: "
                                       r"step-0000002, step-0000004\. Pass one of them"),
    (["--from", "step-2"], r"--from goes with --resume"),
    (["--override", "steps"], r"--override goes with --resume"),
])
def test_from_and_override_errors(runs, tmp_path, capsys, args, message):
    config, run, _ = copy_run(runs, tmp_path)
    before = snapshot(run)
    status, _, err = cli(capsys, "train", config, "--output", run, *args, "--quiet")
    assert status == 2 and re.search(message, err), err
    assert snapshot(run) == before


# -- checkpoints written before digests existed ---------------------------------------------------------------
def make_legacy(step_dir: Path) -> None:
    """What an older workbench wrote: no manifest, no integrity record and no base in meta.json."""
    (step_dir / MANIFEST).unlink()
    meta = json.loads((step_dir / "meta.json").read_text())
    meta.pop("integrity")
    meta.pop("base")
    (step_dir / "meta.json").write_text(json.dumps(meta, indent=1))


def meta_of(step_dir: Path) -> dict:
    return json.loads((step_dir / "meta.json").read_text())


def test_a_legacy_checkpoint_loads_with_a_note_and_continues_bit_exactly(runs, tmp_path, capsys):
    config, run, six = copy_run(runs, tmp_path)
    for step in ("step-0000002", "step-0000004"):
        make_legacy(run / step)
    status, out, err = cli(capsys, "train", config, "--output", run, "--resume", "--steps", 6, "--quiet")
    assert status == 0
    assert f"note: checkpoint {run}/step-0000004 has no manifest.json (written by a workbench before checkpoints " \
           f"carried digests): its files were read but cannot be verified." in err
    assert re.search(rf"note: checkpoint {run}/step-0000004 records no digest of the base it was trained on \(written "
                     rf"by a workbench before runs recorded their base\), so the base cannot be checked; the next "
                     rf"checkpoint this run saves records this one's \(sha256 [0-9a-f]{{64}}\)\.", err), err
    assert trainable(run) == trainable(six)
    assert (run / FINAL / MANIFEST).is_file() and checkpoint_problem(run / FINAL) is None
    assert meta_of(run / FINAL)["base"] == meta_of(six / FINAL)["base"]  # recorded from here on


def test_a_legacy_checkpoint_that_does_not_read_says_it_cannot_tell_why(runs, tmp_path):
    _, run, _ = copy_run(runs, tmp_path)
    make_legacy(run / "step-0000004")
    truncate(run / "step-0000004" / "trainable.safetensors", seed=3)
    with pytest.raises(CheckpointError, match=r"step-0000004 is unreadable \(.*\); it has no digests to tell damage "
                                              r"from a bad save\. It is corrupt; use an earlier checkpoint"):
        AdapterExperiment.load(run)


def _set_first_weight(step_dir: Path, value: float) -> str:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(step_dir / "trainable.safetensors"))
    name = sorted(k for k, v in weights.items() if v.is_floating_point() and v.numel() > 4 and "out" in k)[0]
    weights[name].view(-1)[0] = value
    save_file(weights, str(step_dir / "trainable.safetensors"))
    return name


def test_a_legacy_checkpoint_holding_inf_is_refused_at_load(runs, tmp_path):
    _, run, _ = copy_run(runs, tmp_path)
    make_legacy(run / "step-0000004")
    name = _set_first_weight(run / "step-0000004", float("inf"))
    with pytest.raises(CheckpointError, match=rf"holds non-finite values \(nan or inf\) in 1 tensor\(s\): "
                                              rf"trainable\.safetensors {name}: 1 of \d+ values\. Training cannot "
                                              rf"continue from it; it has no digests .* verifies is step-0000002"):
        AdapterExperiment.load(run)


def test_a_nan_right_after_resuming_from_an_unverifiable_checkpoint_says_so(runs, tmp_path):
    _, run, _ = copy_run(runs, tmp_path)
    make_legacy(run / "step-0000004")
    _set_first_weight(run / "step-0000004", 3e38)  # a flipped exponent that stays finite
    exp = AdapterExperiment.load(run)
    with pytest.raises(NonFiniteLossError) as info:
        exp.fit(steps=2)
    message = str(info.value)
    assert f"It diverged right after resuming from {run}/step-0000004 (step 4), which has no digests (written by " \
           f"an older workbench): its weights are finite, but damage in their low bits cannot be ruled out. Resume " \
           f"from an earlier checkpoint (--from step-N) to tell the two apart" in message


def test_a_nan_right_after_an_intact_resume_is_the_trainings(runs, tmp_path):
    _, run, _ = copy_run(runs, tmp_path)
    exp = AdapterExperiment.load(run)
    poisoned = [{"video": torch.full((4, 3, 4, 16, 16), float("nan")), "action": torch.zeros(4, 4, 4)}] * 3
    with pytest.raises(NonFiniteLossError) as info:
        exp.fit(poisoned, steps=2)
    assert f"It diverged right after resuming from {run}/step-0000004 (step 4), whose files verify against their " \
           f"digests and whose weights are finite: the checkpoint was loaded intact, so the cause is the training " \
           f"itself" in str(info.value)


def test_a_nan_later_names_the_last_checkpoint_only_after_verifying_it(runs, tmp_path):
    _, run, _ = copy_run(runs, tmp_path)
    exp = AdapterExperiment.load(run)
    exp.fit(steps=1)  # a finite loss after the resume: a later NaN is no longer "right after" it
    flip_bits(run / "step-0000004" / "state.pt", seed=5)  # the last checkpoint is damaged meanwhile
    poisoned = [{"video": torch.full((4, 3, 4, 16, 16), float("nan")), "action": torch.zeros(4, 4, 4)}] * 3
    with pytest.raises(NonFiniteLossError) as info:
        exp.fit(poisoned, steps=1)
    message = str(info.value)
    assert f"the last checkpoint {run}/step-0000004 does not verify (state.pt has sha256" in message
    assert "The newest checkpoint of this run that verifies is step-0000002" in message


# -- the base a run was trained on ----------------------------------------------------------------------------------
def write_base(path: Path, seed: int) -> Path:
    """A tiny_video base file of TINY_RUN's architecture, random weights drawn from ``seed`` (as `workbench
    pretrain --out PATH` writes one: the same seed gives the same bytes)."""
    torch.manual_seed(seed)
    return TinyVideo(TinyVideoConfig(**TINY_RUN["base"]["config"])).save_pretrained(path)


def test_a_base_written_again_is_refused_by_resume_eval_and_load_naming_both_digests_and_the_file(tmp_path, capsys):
    """The issue's case: `pretrain` rerun into the run's base file; `eval` then gave other numbers and
    `train --resume` continued on the new base, both without a word."""
    base, run = write_base(tmp_path / "own_base.safetensors", seed=0), tmp_path / "run"
    config = write_run_config(tmp_path / "run.yaml", **{"base.config.weights": str(base)})
    assert cli(capsys, "train", config, "--output", run, "--quiet")[0] == 0  # checkpoints at steps 2 and 4
    trained_on = hashlib.sha256(base.read_bytes()).hexdigest()
    assert meta_of(run / "step-0000004")["base"] == {"sha256": trained_on, "covers": "the file own_base.safetensors"}
    write_base(base, seed=1)  # the base file written again
    now = hashlib.sha256(base.read_bytes()).hexdigest()
    assert now != trained_on
    before = snapshot(run)
    refusal = (rf"Checkpoint {re.escape(str(run))}/step-0000004 was trained on another base: it records base sha256 "
               rf"{trained_on} \(the file own_base\.safetensors\), and this base, {re.escape(str(base))}, has sha256 "
               rf"{now} \(the file own_base\.safetensors\)\. An adapter is fitted to the base it was trained on, so "
               rf"nothing was loaded onto this one\. If the file {re.escape(str(base))} was written again since the "
               rf"run was trained \(a second `workbench pretrain` into the same path, another download\), put back the "
               rf"file whose sha256 is {trained_on} \(`sha256sum FILE` prints a file's\) at that path; to use the base "
               rf"as it is now, train a new run on it \(`workbench train CONFIG --output NEW_DIR`\)\.")
    status, out, err = cli(capsys, "train", config, "--output", run, "--resume", "--steps", 6, "--quiet")
    assert status == 2 and re.search(f"error: {refusal}", err), err
    status, _, err = cli(capsys, "eval", run, "--data", "sample", "--out", tmp_path / "eval")
    assert status == 2 and re.search(f"error: {refusal}", err), err
    assert not (tmp_path / "eval").exists()
    with pytest.raises(CheckpointError, match=refusal):
        AdapterExperiment.load(run)
    assert snapshot(run) == before  # nothing written
    write_base(base, seed=0)  # the original put back (a new file, the same bytes): the run is whole again
    assert AdapterExperiment.load(run).step == 4


def test_the_shipped_runs_record_the_shipped_base(capsys):
    """Runs written before runs recorded their base had their meta.json (and manifest) written again, the
    weights bit for bit as they were: they load with no note."""
    shipped = hashlib.sha256((ROOT / "workbench" / "backbones" / "weights" / "tiny_video.safetensors").read_bytes())
    runs = ROOT / "workbench" / "worldmodel" / "weights"
    record = {"sha256": shipped.hexdigest(), "covers": "the file tiny_video.safetensors"}
    for name in ("metaworld_action", "metaworld_scratch", "metaworld_drift"):
        assert meta_of(runs / name)["base"] == record
        assert checkpoint_problem(runs / name) is None
    capsys.readouterr()
    assert AdapterExperiment.load(runs / "metaworld_action").step == 600
    assert "note:" not in capsys.readouterr().err


# -- edited configs on resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, lines", [
    ({"adapter.config.width": 32},
     ["adapter.config.width: 16 in the run, 32 in {cfg} — cannot change on resume (the adapter the checkpoint's "
      "weights belong to)"]),
    ({"data.config.items": 12},
     ["data.config.items: 8 in the run, 12 in {cfg} — cannot change on resume (the data the run reads (its position "
      "in the data belongs to it))"]),
    ({"training.learning_rate": 1.0e-3},
     ["training.learning_rate: 0.005 in the run, 0.001 in {cfg} — may change with --override learning_rate (the "
      "learning rate from this step on (not bit-exact))",
      "Nothing was changed; to change learning_rate, pass --override learning_rate."]),
    ({"training.seed": 3, "training.weight_decay": 0.1, "training.sync_every": 2},
     ["differs from the config the run was saved with ({run}/step-0000004) in 3 fields:",
      "training.seed: 0 in the run, 3 in {cfg} — cannot change on resume (the run's noise draws and data order)",
      "training.sync_every: 1 in the run, 2 in {cfg} — may change with --override sync_every",
      "training.weight_decay: 0.0 in the run, 0.1 in {cfg} — cannot change on resume (the optimizer's arithmetic",
      "to change sync_every, pass --override sync_every; to change training.seed, training.weight_decay, start a new "
      "run (--output NEW_DIR) or put {cfg} back as the run has it"]),
])
def test_an_edited_config_is_refused_listing_each_difference(runs, tmp_path, capsys, change, lines):
    _, run, _ = copy_run(runs, tmp_path)
    edited = write_run_config(tmp_path / "edited.yaml", **change)
    before = snapshot(run)
    status, _, err = cli(capsys, "train", edited, "--output", run, "--resume", "--quiet")
    assert status == 2
    for line in lines:
        assert line.format(cfg=edited, run=run) in err, err
    assert snapshot(run) == before


def test_override_names_what_may_change(runs, tmp_path, capsys):
    config, run, _ = copy_run(runs, tmp_path)
    status, _, err = cli(capsys, "train", config, "--output", run, "--resume", "--override", "seed", "--quiet")
    assert status == 2 and "--override seed: not a field a resume may change. Fields that may change: callbacks, " \
                           "evaluation, name, training.cache_latents" in err
    edited = write_run_config(tmp_path / "edited.yaml", **{"adapter.config.width": 32})
    status, _, err = cli(capsys, "train", edited, "--output", run, "--resume", "--override", "learning_rate", "--quiet")
    assert status == 2 and "adapter.config.width: 16 in the run, 32" in err  # an override never unlocks a fixed field


@pytest.mark.parametrize("change, override", [
    ({"training.sync_every": 3}, "sync_every"),
    ({"training.checkpoint_every": 1, "training.keep_last": 2}, "checkpoint_every keep_last"),
    ({"callbacks": [{"type": "jsonl", "config": {"every_n_steps": 2}}, {"type": "console"}]}, "callbacks"),
    ({"training.gradient_checkpointing": True}, "gradient_checkpointing"),
    ({"training.cache_latents": True}, "cache_latents"),
    ({"training.steps": 6}, "steps"),
])
def test_a_change_that_keeps_the_result_continues_bit_exactly_and_is_recorded(runs, tmp_path, capsys, change,
                                                                              override):
    _, run, six = copy_run(runs, tmp_path)
    edited = write_run_config(tmp_path / "edited.yaml", **change)
    status, out, err = cli(capsys, "train", edited, "--output", run, "--resume", "--steps", 6,
                           "--override", *override.split(), "--quiet")
    assert status == 0, err
    assert trainable(run) == trainable(six)
    recorded = json.loads((run / FINAL / "meta.json").read_text())["config_changes"]
    fields = {c["field"] for c in recorded}
    assert {"training.steps", *(k for k in change if k != "callbacks"), *(["callbacks"] if "callbacks" in change
                                                                          else [])} == fields
    assert all(c["step"] == 4 and c["bit_exact"] for c in recorded)
    for c in recorded:
        assert f"changed {c['field']}: {c['from']} -> {c['to']} from step 4 (the continuation stays bit-exact" in out


def test_a_learning_rate_change_continues_and_is_recorded_as_not_bit_exact(runs, tmp_path, capsys):
    _, run, six = copy_run(runs, tmp_path)
    edited = write_run_config(tmp_path / "edited.yaml", **{"training.learning_rate": 1.0e-3})
    status, out, _ = cli(capsys, "train", edited, "--output", run, "--resume", "--steps", 6, "--override",
                         "learning_rate", "--quiet")
    assert status == 0
    assert "changed training.learning_rate: 0.005 -> 0.001 from step 4 (not bit-exact from here" in out
    meta = json.loads((run / FINAL / "meta.json").read_text())
    assert {"step": 4, "field": "training.learning_rate", "from": 0.005, "to": 0.001, "bit_exact": False} in \
        meta["config_changes"]
    assert trainable(run) != trainable(six)
    # the change stays on record through later resumes, and the saved config is the new one
    status, _, _ = cli(capsys, "train", edited, "--output", run, "--resume", "--steps", 7, "--quiet")
    assert status == 0
    later = json.loads((run / "step-0000007" / "meta.json").read_text())["config_changes"]
    assert [c["field"] for c in later] == ["training.learning_rate", "training.steps", "training.steps"]


def test_cosine_steps_change_is_recorded_as_not_bit_exact(tmp_path, capsys):
    config = write_run_config(tmp_path / "c.yaml", **{"training.schedule": "cosine"})
    run = tmp_path / "run"
    assert cli(capsys, "train", config, "--output", run, "--quiet")[0] == 0
    status, out, _ = cli(capsys, "train", config, "--output", run, "--resume", "--steps", 6, "--quiet")
    assert status == 0 and "changed training.steps: 4 -> 6 from step 4 (not bit-exact from here" in out


def test_a_number_yaml_reads_as_text_equals_the_saved_number(runs, tmp_path, capsys):
    _, run, six = copy_run(runs, tmp_path)
    text = (tmp_path / "edited.yaml")
    write_run_config(text)
    text.write_text(text.read_text().replace("learning_rate: 0.005", "learning_rate: 5e-3"))  # YAML 1.1: a string
    status, _, err = cli(capsys, "train", text, "--output", run, "--resume", "--steps", 6, "--quiet")
    assert status == 0, err
    assert trainable(run) == trainable(six)


def test_resume_in_python_applies_the_same_rules(runs, tmp_path):
    from workbench.train.config import load_yaml

    config, run, _ = copy_run(runs, tmp_path)
    edited = load_yaml(write_run_config(tmp_path / "e.yaml", **{"training.learning_rate": 1.0e-3}))
    with pytest.raises(ConfigError, match=r"training\.learning_rate: 0\.005 in the run, 0\.001 in the config"):
        AdapterExperiment.resume(run, edited)
    exp = AdapterExperiment.resume(run, edited, override=["training.learning_rate"])
    assert exp.step == 4 and exp.config_changes[0]["field"] == "training.learning_rate"
    import dataclasses  # load(training=...) takes the settings as given, and records what they change

    longer = AdapterExperiment.load(run, training=dataclasses.replace(exp.training, learning_rate=0.005, steps=9))
    assert longer.config_changes == [{"step": 4, "field": "training.steps", "from": 4, "to": 9, "bit_exact": True}]


# -- latent-cache shards ---------------------------------------------------------------------------------------
CACHE_CONFIG = {"data.config.items": 10}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    config = write_run_config(root / "c.yaml", **CACHE_CONFIG)
    assert cli(_NullCapture(), "cache-latents", config, "--out", root / "cache", "--shard-size", 4, "--quiet")[0] == 0
    return config, root / "cache"


def copy_cache(cache, tmp_path):
    config, root = cache
    mine = tmp_path / "cache"
    shutil.copytree(root, mine)
    trains = write_run_config(tmp_path / "train.yaml", **CACHE_CONFIG, **{"training.cache_latents": str(mine)})
    return config, trains, mine, snapshot(root)


@pytest.mark.parametrize("name, fault, problem", [
    ("shard-00001.safetensors", "flip", r"shard-00001\.safetensors has sha256 .* \(same size: its contents changed"),
    ("shard-00001.safetensors", "truncate", r"shard-00001\.safetensors is \d+ bytes, the manifest expects \d+ "
                                            r"\(truncated\)"),
    ("shard-00001.manifest.json", "flip", r"shard-00001\.manifest\.json is damaged"),
    ("shard-00001.manifest.json", "delete", r"shard-00001\.safetensors has no manifest \(its write did not finish\)"),
])
def test_a_damaged_shard_is_named_and_a_rerun_rewrites_it(cache, tmp_path, capsys, name, fault, problem):
    config, trains, root, original = copy_cache(cache, tmp_path)
    target = root / name
    {"flip": lambda: flip_bits(target, 2), "truncate": lambda: truncate(target, 2),
     "delete": target.unlink}[fault]()
    status, _, err = cli(capsys, "train", trains, "--output", tmp_path / "run", "--steps", 2, "--quiet")
    assert status == 2
    if fault == "delete":
        assert re.search(rf"{root} is incomplete: 1 of 3 shards missing or unfinished \(first: "
                         r"shard-00001\.safetensors\)\. Rerun `workbench cache-latents` to finish it\.", err), err
    else:
        assert re.search(rf"shard shard-00001\.safetensors \(items 4–7\) of the latent cache {root} is damaged: "
                         rf"{problem}.*\. Rerun `workbench cache-latents CONFIG --out {root}`: it verifies every "
                         rf"shard, keeps the intact ones and rewrites the others\.", err), err
    status, out, _ = cli(capsys, "cache-latents", config, "--out", root, "--shard-size", 4, "--quiet")
    assert status == 0
    assert "1 shard(s) written" in out and "2 already there and verified" in out
    assert snapshot(root) == original  # rewritten exactly as it was
    assert cli(capsys, "train", trains, "--output", tmp_path / "run", "--steps", 2, "--quiet")[0] == 0


def test_a_damaged_cache_identity_says_to_rebuild(cache, tmp_path, capsys):
    _, trains, root, _ = copy_cache(cache, tmp_path)
    truncate(root / "cache.json", seed=1)
    status, _, err = cli(capsys, "train", trains, "--output", tmp_path / "run", "--steps", 2, "--quiet")
    assert status == 2 and f"training.cache_latents: {root}/cache.json is damaged (" in err
    assert f"Delete {root} and rebuild it with `workbench cache-latents CONFIG --out {root}`" in err


def test_a_legacy_cache_is_read_with_a_note_and_a_rerun_adds_the_manifests(cache, tmp_path, capsys):
    config, trains, root, original = copy_cache(cache, tmp_path)
    for listing in root.glob("*.manifest.json"):
        listing.unlink()
    identity = json.loads((root / "cache.json").read_text())
    for key in ("shard_manifests", "shard_size"):
        identity.pop(key)
    (root / "cache.json").write_text(json.dumps(identity))
    status, _, err = cli(capsys, "train", trains, "--output", tmp_path / "run", "--steps", 2, "--quiet")
    assert status == 0 and f"note: the latent cache {root} has no shard manifests" in err
    assert cli(capsys, "cache-latents", config, "--out", root, "--shard-size", 4, "--quiet")[0] == 0
    assert sorted(p.name for p in root.glob("*.manifest.json")) == [f"shard-0000{i}.manifest.json" for i in range(3)]
    assert {k: v for k, v in snapshot(root).items() if k.startswith("shard-")} == \
        {k: v for k, v in original.items() if k.startswith("shard-")}


# -- data files the workbench reads: HDF5 ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def h5(tmp_path_factory):
    from conftest import small_metaworld_file

    return small_metaworld_file(tmp_path_factory.mktemp("h5") / "mw.h5")


def chunk_region(path: Path, dataset: str, episode: int) -> tuple[int, int]:
    import h5py

    with h5py.File(path) as f:
        info = f[dataset].id.get_chunk_info(episode)
    return info.byte_offset, info.byte_offset + info.size


@pytest.mark.parametrize("in_memory", [False, True])
@pytest.mark.parametrize("dataset", ["frames", "actions"])
def test_a_damaged_hdf5_chunk_names_the_file_the_episode_and_the_fix(h5, tmp_path, dataset, in_memory):
    from workbench.data.metaworld import MetaWorldClips

    path = tmp_path / "mw.h5"
    shutil.copy(h5, path)
    flip_bits(path, seed=4, count=8, region=chunk_region(path, dataset, 2))
    clips = MetaWorldClips(path=str(path), window=8, stride=8, split="all", in_memory=in_memory)
    task = clips.task_names[2]
    first = next(i for i, (e, _) in enumerate(clips.index) if e == 2)
    with pytest.raises(DataError) as info:
        for i in range(first + 1):
            clips[i]
    assert str(info.value).startswith(f"{path}: the file is damaged: dataset '{dataset}' of episode 2 (task {task}) "
                                      f"cannot be read (OSError: Can't synchronously read data (filter returned "
                                      f"failure during read)). Its compressed data no longer decodes")
    assert "regenerate it with `workbench data metaworld --out FILE.h5`" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_training_on_a_damaged_hdf5_stops_with_the_error_and_keeps_the_last_checkpoint(h5, tmp_path, capsys):
    from workbench.data.metaworld import MetaWorldClips
    from workbench.train.data import EpochSampler

    data = {"type": "metaworld", "config": {"path": str(h5), "window": 4, "stride": 4, "split": "all"}}
    clips = MetaWorldClips(**data["config"])
    order = EpochSampler(len(clips), seed=0, epoch=0, start=0, shuffle=True).order().tolist()  # one clip a step
    first = {}
    for position, i in enumerate(order):
        first.setdefault(clips.index[i][0], position)
    episode = max(first, key=first.get)  # the episode the run reaches last: steps (and checkpoints) come before
    reached = first[episode]
    assert reached >= 2
    path = tmp_path / "mw.h5"
    shutil.copy(h5, path)
    flip_bits(path, seed=4, count=8, region=chunk_region(path, "frames", episode))
    config = write_run_config(tmp_path / "c.yaml", data={**data, "config": {**data["config"], "path": str(path)}},
                              base={"type": "tiny_video", "config": {"image_size": 64, "frames": 4, "width": 8,
                                                                     "ae_width": 8, "depth": 1}},
                              **{"training.batch_size": 1, "training.checkpoint_every": 1})
    status, _, err = cli(capsys, "train", config, "--output", tmp_path / "run", "--steps", 40, "--quiet")
    assert status == 2 and f"error: {path}: the file is damaged: dataset 'frames' of episode {episode}" in err
    latest = latest_checkpoint(tmp_path / "run")
    assert latest is not None and latest.name == f"step-{reached:07d}"  # every step before the damage, kept
    assert checkpoint_problem(latest) is None


def test_a_truncated_hdf5_is_named(h5, tmp_path):
    from workbench.data.metaworld import MetaWorldClips

    path = tmp_path / "mw.h5"
    shutil.copy(h5, path)
    truncate(path, seed=0)
    with pytest.raises(DataError, match=rf"{path} is not a readable HDF5 file \(.*\)\. It may be corrupt or "
                                        rf"truncated; regenerate it"):
        MetaWorldClips(path=str(path), window=8, split="all")


def read_all(make) -> str:
    """``ok`` when every item reads, else the DataError's text; anything else propagates (and fails the test)."""
    try:
        clips = make()
        for i in range(len(clips)):
            clips[i]
    except DataError as err:
        return str(err)
    return "ok"


def test_bit_flips_anywhere_in_an_hdf5_file_never_escape_as_tracebacks(h5, tmp_path):
    """24 seeded flips anywhere in the file: each is a DataError naming it, or (in bytes nothing checks — an
    uncompressed task name, an attribute, an unread dataset) a file that still reads."""
    from workbench.data.metaworld import MetaWorldClips

    outcomes = []
    for seed in range(24):
        path = tmp_path / f"mw{seed}.h5"
        shutil.copy(h5, path)
        flip_bits(path, seed=100 + seed)
        outcome = read_all(lambda p=path: MetaWorldClips(path=str(p), window=8, stride=8, split="all"))
        assert outcome == "ok" or outcome.startswith(str(path)), outcome
        outcomes.append(outcome != "ok")
    assert sum(outcomes) >= 16  # most flips land in compressed chunks, which are checksummed (zlib's adler32)


# -- data files the workbench reads: LeRobot parquet, MP4, JSON ------------------------------------------------
@pytest.fixture(scope="module")
def lerobot(tmp_path_factory):
    import lerobot_fixture

    root = tmp_path_factory.mktemp("lerobot")
    return {v: lerobot_fixture.write(root / v, v) for v in ("v2.1", "v3.0")}


def read_lerobot(root: Path) -> str:
    from lerobot_fixture import CAMERAS

    from workbench.data.lerobot import LeRobotClips

    return read_all(lambda: LeRobotClips(root=str(root), camera=CAMERAS[0], window=4, stride=4, split="all"))


def used_files(root: Path, kind: str) -> list[Path]:
    """The files of ``kind`` the reader opens (the second camera's videos and stats.json are never read)."""
    from lerobot_fixture import CAMERAS

    suffix = {"parquet": ".parquet", "mp4": ".mp4", "json": ".json", "jsonl": ".jsonl"}[kind]
    files = [p for p in sorted(root.rglob(f"*{suffix}")) if "stats" not in p.name]
    return [p for p in files if kind != "mp4" or CAMERAS[0] in str(p)]


@pytest.mark.parametrize("version, kind", [("v3.0", "parquet"), ("v3.0", "mp4"), ("v3.0", "json"),
                                           ("v2.1", "parquet"), ("v2.1", "mp4"), ("v2.1", "jsonl")])
def test_damage_anywhere_in_a_lerobot_file_never_escapes_as_a_traceback(lerobot, tmp_path, version, kind):
    """12 seeded faults (every third a truncation) in the files the reader opens: each is a DataError naming a
    file of the dataset, or data that still reads (a flip in bytes without a checksum: parquet pages, H.264)."""
    errors = 0
    for seed in range(12):
        root = tmp_path / f"{seed}"
        shutil.copytree(lerobot[version], root)
        files = used_files(root, kind)
        target = files[random.Random(seed).randrange(len(files))]
        truncate(target, seed) if seed % 3 == 0 else flip_bits(target, seed)
        outcome = read_lerobot(root)
        assert outcome == "ok" or str(root) in outcome, outcome
        errors += outcome != "ok"
        if seed % 3 == 0:  # a truncated file never reads as if it were whole
            assert outcome != "ok", target
    assert errors >= 4


@pytest.mark.parametrize("version, relative, message", [
    ("v3.0", "data/chunk-000/file-000.parquet", r"{file}: not a readable parquet file \("),
    ("v3.0", "meta/episodes/chunk-000/file-000.parquet", r"{file}: cannot read the parquet table \("),
    ("v3.0", "meta/info.json", r"{file}: not readable JSON \(.*\)\. The dataset's metadata is damaged; re-download"),
    ("v3.0", "videos/observation.images.front/chunk-000/file-000.mp4",
     r"{file}: not a readable video \(episode 0, camera observation\.images\.front\) \(.*\)\. The MP4 is corrupt or "
     r"truncated; re-download or re-export the dataset\."),
    ("v2.1", "meta/episodes.jsonl", r"{file}: (a line is not valid JSON|an episode's line is damaged)"),
    ("v2.1", "videos/chunk-000/observation.images.front/episode_000001.mp4",
     r"{file}: not a readable video \(episode 1, camera observation\.images\.front\)"),
])
def test_a_truncated_lerobot_file_is_named_with_the_fix(lerobot, tmp_path, version, relative, message):
    root = tmp_path / "data"
    shutil.copytree(lerobot[version], root)
    file = root / relative
    with open(file, "r+b") as f:
        f.truncate(file.stat().st_size // 2)
    outcome = read_lerobot(root)
    assert re.search(message.format(file=re.escape(str(file))), outcome), outcome


# -- bad values: NaN, infinities and 1e30 in actions, state and calibration; never a signal -------------------------
def _poison_lerobot(root: Path, column: str, episode: int, frame: int, value: float) -> Path:
    """``column[frame][2]`` of ``episode`` in a v3.0 copy's parquet table set to ``value``; returns the table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    for row in rows:
        if row["episode_index"] == episode and row["frame_index"] == frame:
            row[column][2] = value
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return path


WORLD_MODEL = {"type": "latent_residual", "config": {"width": 16, "depth": 1, "dim": 5, "cumulative": True,
                                                     "coords": True, "warps": 2}}  # the demo's adapter, small


@pytest.mark.parametrize("column, value, shown", [
    ("action", float("nan"), "NaN"), ("action", float("-inf"), "infinite"), ("action", 1e30, r"1e\+30, beyond ±1e\+06"),
    ("observation.state", float("inf"), "infinite"),
], ids=["nan-action", "minus-inf-action", "1e30-action", "inf-state"])
def test_a_bad_value_in_a_lerobot_table_stops_training_naming_file_episode_and_frame(lerobot, tmp_path, capsys, column,
                                                                                    value, shown):
    root = tmp_path / "data"
    shutil.copytree(lerobot["v3.0"], root)
    table = _poison_lerobot(root, column, episode=1, frame=3, value=value)
    config = write_run_config(tmp_path / "c.yaml", adapter=WORLD_MODEL, data={"type": "lerobot", "config": {
        "root": str(root), "camera": "observation.images.front", "window": 4, "stride": 4, "split": "all",
        "size": [16, 16], "state": "observation.state"}})
    status, out, err = cli(capsys, "train", config, "--output", tmp_path / "run", "--quiet")
    assert status == 2
    assert re.search(rf"error: {re.escape(str(table))}: episode 1: '{re.escape(column)}' \((action|proprio)\) at frame "
                     rf"3, column 2 is {shown} \(1 such value\(s\) in all\)\. A NaN, an infinity or a value that "
                     rf"large is a gap or damage in the recording, not a measurement.*Fix those values in the dataset "
                     rf"and re-export it", err), err
    assert not (tmp_path / "run").exists()  # refused before anything was built or written


@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (1e30, r"1e\+30, beyond ±1e\+06")],
                         ids=["nan", "1e30"])
def test_a_bad_value_in_an_hdf5_file_names_the_file_episode_and_frame(h5, tmp_path, value, shown):
    import h5py

    from workbench.data.metaworld import MetaWorldClips

    path = tmp_path / "mw.h5"
    shutil.copy(h5, path)
    with h5py.File(path, "r+") as f:
        actions = f["actions"][2]
        actions[6, 1] = value
        f["actions"][2] = actions
        task = f["task"][2].decode()
    outcome = read_all(lambda: MetaWorldClips(path=str(path), window=4, stride=4, split="all"))
    assert re.fullmatch(rf"{re.escape(str(path))}: episode 2 \(task {task}\): dataset 'actions' at frame 6, column 1 "
                        rf"is {shown} .* Fix those values in the file or regenerate it .*", outcome), outcome


def test_a_non_finite_calibration_names_its_file_and_camera(lerobot, h5, tmp_path):
    from workbench.data.camera import CameraCalibration
    from workbench.data.lerobot import LeRobotClips
    from workbench.data.metaworld import MetaWorldClips

    root = tmp_path / "data"
    shutil.copytree(lerobot["v3.0"], root)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    good = CameraCalibration.look_at([1.0, 0.0, 1.0], [0.0, 0.0, 0.0], 45.0, 32, 24).to_json()
    good["intrinsics"][0][0] = float("nan")  # (JSON as Python writes it: NaN)
    info["features"]["observation.images.front"]["calibration"] = good
    info_path.write_text(json.dumps(info))
    with pytest.raises(DataError, match=rf"{re.escape(str(info_path))} \(camera observation\.images\.front\): the "
                                        rf"camera calibration is unusable: Invalid camera calibration: intrinsics\[0\]"
                                        rf"\[0\] is nan .* Rewrite it with `workbench data calibrate FILE`"):
        LeRobotClips(root=str(root), camera="observation.images.front", window=4, split="all")
    import h5py

    path = tmp_path / "mw.h5"
    shutil.copy(h5, path)
    with h5py.File(path, "r+") as f:
        extrinsics = f.attrs["camera_extrinsics"]
        extrinsics[0, 3] = 1e30
        f.attrs["camera_extrinsics"] = extrinsics
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: the camera calibration in its attributes is "
                                        rf"unusable: Invalid camera calibration: extrinsics\[0\]\[3\] is 1e\+30"):
        MetaWorldClips(path=str(path), window=4, split="all")


NAN_ACTIONS = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    torch.set_num_threads(1)
    from conftest import tiny_base
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.errors import NonFiniteLossError
    from workbench.train import AdapterExperiment, TrainingConfig
    for value in (float("nan"), float("inf")):  # given in Python: no reader stands between them and the adapter
        torch.manual_seed(0)
        exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1, dim=4, cumulative=True,
                                                                         coords=True, warps=2),
                                training=TrainingConfig(progress=False, batch_size=4, output_dir={out!r}))
        g = torch.Generator().manual_seed(0)
        action = torch.rand(4, 4, 4, generator=g)
        action[1, 2, 0] = value
        batch = {{"video": torch.rand(4, 3, 4, 16, 16, generator=g) * 2 - 1, "action": action,
                  "episode": torch.tensor([7, 8, 8, 9]), "start": torch.tensor([0, 4, 8, 0])}}
        try:
            exp.fit([batch] * 2, steps=2)
        except NonFiniteLossError as err:
            print(err, flush=True)
    sys.exit(3)
""")


def test_a_nan_action_under_the_world_model_adapter_is_an_error_not_a_segfault(tmp_path):
    """The issue's crash: a NaN action through the warps made grid_sample's backward write out of bounds (exit 139)."""
    script = NAN_ACTIONS.format(tests=str(ROOT / "tests"), out=str(tmp_path / "r"))
    done = forked.run(["-c", script], env=ENV, timeout=300)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])  # not -SIGSEGV: both values reached the end
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(re.match(r"Loss became (nan|inf) at step 1; training stopped\.", line)
                                   for line in lines), lines
    for line in lines:
        assert ("The batch of step 1 held episode 7 (from frame 0), episode 8 (from frame 4), episode 8 (from frame "
                "8), episode 9 (from frame 0): look there first for values that are NaN, infinite or far out of "
                "range") in line
        assert f"No checkpoint of this run exists yet (none in {tmp_path / 'r'}), so there is nothing to go back to: " \
               f"find the cause, then start the run again." in line
        assert "AdapterExperiment.load" not in line  # (it used to advise loading a checkpoint that did not exist)


def test_a_non_finite_loss_names_the_last_checkpoint_that_exists(runs, tmp_path):
    _, run, _ = copy_run(runs, tmp_path)
    exp = AdapterExperiment.load(run)
    exp.fit(steps=1)
    shutil.rmtree(run / "step-0000004")  # the checkpoint it resumed from is gone (deleted, or set aside)
    (run / "LATEST").unlink()
    poisoned = [{"video": torch.full((4, 3, 4, 16, 16), float("nan")), "action": torch.zeros(4, 4, 4),
                 "episode": torch.tensor([1, 2, 3, 4]), "start": torch.tensor([0, 0, 4, 4])}] * 3
    with pytest.raises(NonFiniteLossError) as info:
        exp.fit(poisoned, steps=1)
    message = str(info.value)
    assert message.startswith("Loss became nan at step 6; training stopped.")
    assert f"the last checkpoint is {run}/step-0000002 (it verifies; left intact)" in message
    assert "The batch of step 6 held episode 1 (from frame 0), episode 2 (from frame 0), episode 3 (from frame 4), " \
           "episode 4 (from frame 4)" in message
    assert f"then continue from it with AdapterExperiment.load('{run}/step-0000002') (pass training=... with the " \
           f"lower rate) and fit() again" in message


# -- the writer and sizes: mismatches refused before anything is written or computed ------------------------------
def _writer(root: Path):
    from workbench.data.lerobot_write import LeRobotWriter

    return LeRobotWriter(root, 10, {"action": ("float32", ["dx", "dy"])}, ["observation.images.main"])


def _episode(frames: int = 4, actions: int = 4, value: float = 0.0):
    import numpy as np

    return ({"observation.images.main": np.zeros((frames, 8, 8, 3), np.uint8)},
            {"action": np.full((actions, 2), value, np.float32)})


@pytest.mark.parametrize("frames, actions, value, message", [
    (5, 4, 0.0, r"{root}: episode 1: feature 'action' has 4 rows but the episode has 5 frames \(camera "
                r"'observation\.images\.main'\)\. Row t is the value at frame t, so every feature has one row per "
                r"frame: drop the extra frames or rows, or repeat the last row\. Nothing of this episode was "
                r"written\."),
    (4, 5, 0.0, r"{root}: episode 1: feature 'action' has 5 rows but the episode has 4 frames"),
    (4, 4, float("inf"), r"{root}: episode 1: feature 'action' at frame 0, column 0 is infinite"),
], ids=["more-frames-than-actions", "more-actions-than-frames", "inf-action"])
def test_the_writer_refuses_an_episode_before_writing_it_and_leaves_nothing(tmp_path, frames, actions, value, message):
    root = tmp_path / "data"
    with pytest.raises(DataError, match=message.format(root=re.escape(str(root)))):  # noqa: SIM117
        with _writer(root) as writer:
            writer.add_episode(*_episode(), task="t")
            writer.add_episode(*_episode(frames, actions, value), task="t")
    assert list(tmp_path.iterdir()) == []  # neither the dataset nor its partial directory


def test_frames_of_another_size_than_the_model_are_refused_in_the_datas_terms(lerobot, tmp_path, capsys):
    """The issue's case: size [48, 48] on the 64-px model failed after 13 s with a message about 'latents'."""
    config = write_run_config(tmp_path / "c.yaml", adapter=WORLD_MODEL, data={"type": "lerobot", "config": {
        "root": str(lerobot["v3.0"]), "camera": "observation.images.front", "window": 4, "split": "all",
        "size": [24, 24]}}, **{"training.cache_latents": True})
    status, _, err = cli(capsys, "train", config, "--output", tmp_path / "run", "--quiet")
    assert status == 2
    assert "error: tiny_video was built for 16x16 frames, but the data serves 24x24. Set the dataset's size: [16, " \
           "16] (the lerobot dataset resizes its frames; `workbench data import --size 16 16` stores them so), or " \
           "build the backbone with image_size: 24" in err
    assert "latents" not in err and not list_checkpoints(tmp_path / "run")


def test_eval_of_a_damaged_checkpoint_advises_evaluating_the_newest_intact_one(runs, tmp_path, capsys):
    _, run, _ = copy_run(runs, tmp_path)
    truncate(run / "step-0000004" / "trainable.safetensors", seed=2)
    status, _, err = cli(capsys, "eval", run, "--data", "sample", "--out", tmp_path / "eval", "--clips", 4)
    assert status == 2
    assert f"The newest checkpoint of this run that verifies is step-0000002: evaluate it instead with `workbench " \
           f"eval {run}/step-0000002 --data sample --out {tmp_path / 'eval'} --clips 4`." in err
    assert "workbench train" not in err and not (tmp_path / "eval").exists()


# -- exported LoRA -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_export(tmp_path_factory):
    pytest.importorskip("peft")
    from workbench.adapters.lora import LoRA

    exp = AdapterExperiment(base=tiny_base(), adapter=LoRA(rank=2))
    with torch.no_grad():
        for p in exp.model.trainable_parameters():
            p.add_(0.01)
    return exp.export_lora(tmp_path_factory.mktemp("lora") / "lora")


@pytest.mark.parametrize("name, fault, problem", [
    ("pytorch_lora_weights.safetensors", "flip", r"pytorch_lora_weights\.safetensors has sha256 .* \(same size"),
    ("pytorch_lora_weights.safetensors", "truncate", r"pytorch_lora_weights\.safetensors is \d+ bytes, the manifest "
                                                     r"expects \d+ \(truncated\)"),
    (MANIFEST, "flip", r"manifest\.json is damaged"),
])
def test_a_damaged_exported_lora_is_refused_by_init_from(lora_export, tmp_path, name, fault, problem):
    from workbench.adapters.lora import LoRA

    out = tmp_path / "lora"
    shutil.copytree(lora_export, out)
    flip_bits(out / name, seed=6) if fault == "flip" else truncate(out / name, seed=6)
    with pytest.raises(CheckpointError, match=rf"lora init_from '.*pytorch_lora_weights\.safetensors' is damaged: "
                                              rf".*{problem}.*\. Nothing was loaded; export the LoRA again"):
        AdapterExperiment(base=tiny_base(), adapter=LoRA(rank=2, init_from=str(out)))
    whole = AdapterExperiment(base=tiny_base(), adapter=LoRA(rank=2, init_from=str(lora_export)))
    assert all(float(p.detach().abs().sum()) > 0 for p in whole.model.trainable_parameters())


# -- kill -9 at random points of a save and of cache-latents -------------------------------------------------------
SAVES = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    torch.set_num_threads(1)
    from conftest import tiny_base
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.data.synthetic import SyntheticMoves
    from workbench.train import AdapterExperiment, TrainingConfig
    torch.manual_seed(0)
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False, batch_size=4, output_dir={out!r}))
    exp.fit(SyntheticMoves(items=8, frames=4, size=16), steps=1)
    exp.save_checkpoint(keep_last=2)  # one whole save (a loaded machine can take a second for the first)
    print("ready", flush=True)
    while True:  # saves back to back: a kill at any moment lands inside one
        exp.step += 1
        exp.save_checkpoint(keep_last=2)
""")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_9_at_a_random_point_of_a_save_leaves_every_checkpoint_verifiable(tmp_path, seed):
    out = tmp_path / "run"
    proc = forked.start(["-c", SAVES.format(tests=str(ROOT / "tests"), out=str(out))], env=ENV)
    assert proc.readline().strip() == "ready", proc.stderr[-2000:]
    time.sleep(random.Random(seed).uniform(0.2, 1.0))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    found = list_checkpoints(out)
    assert found, "not even the save before the kills was kept"
    assert [p.name for p in found if checkpoint_problem(p) is not None] == []
    latest = latest_checkpoint(out)
    assert latest in found
    exp = AdapterExperiment.load(out)
    assert exp.step == int(latest.name.removeprefix("step-"))
    exp.save_checkpoint(keep_last=2)  # the next save clears what the kill left behind
    assert not list(out.glob(".tmp-*")) and not list(out.glob(".LATEST.tmp-*"))


def test_a_save_killed_while_it_deletes_rotated_checkpoints_leaves_none_half_deleted(tmp_path, monkeypatch):
    """The moment the random kills above can miss: deleting the checkpoints that keep_last rotates out."""
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.train import TrainingConfig, checkpoint

    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path)))
    for step in (1, 2):
        exp.step = step
        exp.save_checkpoint(keep_last=2)

    def killed_midway(path, ignore_errors=False):
        (Path(path) / "trainable.safetensors").unlink()  # the first file goes, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_midway)
    exp.step = 3
    with pytest.raises(KeyboardInterrupt):
        exp.save_checkpoint(keep_last=2)
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000002", "step-0000003"]
    assert all(checkpoint_problem(p) is None for p in list_checkpoints(tmp_path))
    exp.step = 4
    exp.save_checkpoint(keep_last=2)  # the next save clears the half-deleted directory
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_save_of_the_same_step_killed_between_its_renames_puts_the_old_one_back(tmp_path, monkeypatch):
    """Re-saving a step moves the old directory aside, then renames the new one into place: a process
    that dies between the two leaves the old one aside, and the next load or save puts it back."""
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.train import TrainingConfig, checkpoint

    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(progress=False, output_dir=str(tmp_path)))
    exp.step = 2
    first = snapshot(exp.save_checkpoint())
    replace = os.replace

    def dies_after_moving_aside(src, dst):
        replace(src, dst)
        if ".tmp-old-" in str(dst):
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "replace", dies_after_moving_aside)
    with pytest.raises(KeyboardInterrupt):
        exp.save_checkpoint()
    monkeypatch.undo()
    assert list_checkpoints(tmp_path) == []  # (what a reader listing the directory would see now)
    assert AdapterExperiment.load(tmp_path).step == 2
    assert snapshot(tmp_path / "step-0000002") == first


CACHING = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    torch.set_num_threads(1)
    from workbench import integrity
    from workbench.train import latent_store
    from workbench.cli import main
    point, shard = {point!r}, {shard}
    write_bytes, write_manifest = integrity.write_bytes, latent_store._write_manifest

    def hold(what):  # the kill lands here: this never returns
        print(what, flush=True)
        time.sleep(600)

    def half_written(path, data):  # shard `shard` is cut off halfway through its file
        if point == "inside a shard's file" and path.name.startswith(".shard-{{:05d}}.safetensors.tmp".format(shard)):
            with open(path, "wb") as f:
                f.write(bytes(data)[:len(data) // 2])
                f.flush()
            hold("mid-write " + path.name)
        write_bytes(path, data)

    def manifest(root, s, data):  # shard `shard` is complete, its manifest not yet written
        if point == "between a shard and its manifest" and s == shard:
            hold("mid-write shard-{{:05d}}.safetensors, no manifest yet".format(s))
        write_manifest(root, s, data)

    integrity.write_bytes, latent_store._write_manifest = half_written, manifest
    print("ready", flush=True)
    sys.exit(main(["cache-latents", {config!r}, "--out", {out!r}, "--shard-size", "1", "--quiet"]))
""")


@pytest.mark.parametrize("point", ["inside a shard's file", "between a shard and its manifest"])
def test_kill_9_in_the_middle_of_writing_a_cache_then_a_rerun_gives_the_same_cache(cache, tmp_path, capsys, point):
    """The process is held at a point where a shard is half written, proven from the files, then killed."""
    config, reference = cache
    out = tmp_path / "cache"
    whole = tmp_path / "whole"
    assert cli(capsys, "cache-latents", config, "--out", whole, "--shard-size", 1, "--quiet")[0] == 0
    proc = forked.start(["-c", CACHING.format(tests=str(ROOT / "tests"), config=str(config), out=str(out),
                                              point=point, shard=3)], env=ENV)
    assert proc.readline().strip() == "ready", proc.stderr[-2000:]
    held = proc.readline().strip()
    assert held.startswith("mid-write"), held
    complete = sorted(p.name for p in out.glob("shard-*.manifest.json"))
    assert complete == [f"shard-0000{i}.manifest.json" for i in range(3)]  # shards 0-2 done, 3 in the middle
    if point == "inside a shard's file":
        partial = list(out.glob(".shard-00003.safetensors.tmp-*"))
        assert len(partial) == 1 and 0 < partial[0].stat().st_size < (whole / "shard-00003.safetensors").stat().st_size
    else:
        assert (out / "shard-00003.safetensors").read_bytes() == (whole / "shard-00003.safetensors").read_bytes()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL  # it died of the kill, mid-write
    status, _, _ = cli(capsys, "cache-latents", config, "--out", out, "--shard-size", 1, "--quiet")
    assert status == 0
    assert snapshot(out) == snapshot(whole)  # (the half-written file of the killed process is gone too)


# -- one writer per run -----------------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_naming_the_first_and_a_killed_writer_never_blocks(tmp_path, capsys):
    """The issue's case: a second `train --resume` into a running run removed the first one's temporary
    checkpoint (the first died at its next save), then finished from an old checkpoint, leaving a stray newer one."""
    from workbench.train.checkpoint import step_of

    config = write_run_config(tmp_path / "long.yaml", **{"training.checkpoint_every": 3})
    out = tmp_path / "run"
    first = forked.start(["-m", "workbench", "train", str(config), "--output", str(out), "--steps", "100000",
                          "--quiet"], env=ENV)
    try:
        deadline = time.time() + 120
        while not list_checkpoints(out) and time.time() < deadline:
            time.sleep(0.05)
        holder = (rf"Run directory {re.escape(str(out))} is in use: process {first.pid} on host "
                  rf"{re.escape(socket.gethostname())} \(`python -m workbench train {re.escape(str(config))} --output "
                  rf"{re.escape(str(out))} --steps 100000 --quiet`\) has been writing it since "
                  rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d .*\(lock file {re.escape(str(out))}/\.writer\.lock\)\. Two "
                  rf"processes writing one run delete each other's checkpoints, so this one stopped before writing "
                  rf"anything there\. Wait for it to finish, or stop it \(Ctrl-C in its terminal, or "
                  rf"`kill {first.pid}`: a training run saves a checkpoint and exits\), ")
        status, _, err = cli(capsys, "train", config, "--output", out, "--resume", "--steps", 1000, "--quiet")
        assert status == 2 and re.search(
            f"error: {holder}then continue the run with `workbench train {re.escape(str(config))} --output "
            f"{re.escape(str(out))} --steps 1000 --resume --quiet`; to train beside it, write to another directory",
            err), err
        with pytest.raises(CheckpointError, match=f"{holder}then try again"):  # and in Python
            AdapterExperiment.from_yaml(config).save_checkpoint(out)
        seen = step_of(latest_checkpoint(out))
        while step_of(latest_checkpoint(out)) <= seen + 3 and first.poll() is None:
            time.sleep(0.05)
        assert first.poll() is None  # the first writer goes on saving, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    killed_at = step_of(latest_checkpoint(out))
    # the killed writer's lock went with it: the run continues at once from its latest checkpoint
    status, printed, err = cli(capsys, "train", config, "--output", out, "--resume", "--steps", killed_at + 2,
                               "--quiet")
    assert status == 0, err
    assert f"Resuming tiny-run from {out}/step-{killed_at:07d} (step {killed_at})" in printed
    assert step_of(latest_checkpoint(out)) == killed_at + 2
    assert all(step_of(p) <= killed_at + 2 and checkpoint_problem(p) is None for p in list_checkpoints(out))
    assert not list(out.glob(".tmp-*")) and (out / ".writer.lock").read_bytes() == b""  # released


# -- signals ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_training_saves_and_says_how_to_continue(tmp_path, capsys, signum, status):
    config = write_run_config(tmp_path / "long.yaml", **{"training.steps": 100000, "training.checkpoint_every": 3})
    out = tmp_path / "run"
    proc = forked.start(["-m", "workbench", "train", str(config), "--output", str(out), "--steps", "90000"], env=ENV)
    deadline = time.time() + 120
    while not list_checkpoints(out) and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signum)
    proc.wait(timeout=120)
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == status, stderr[-2000:]
    assert "Traceback" not in stderr
    lines = stdout.splitlines()
    stopped = next(line for line in lines if line.startswith("Interrupted: stopped cleanly after step "))
    step = int(stopped.split("after step ")[1].split(" ")[0])
    assert f"Saved the run at step {step}: {out}/step-{step:07d}" in lines
    assert f"Continue with: workbench train {config} --output {out} --steps 90000 --resume" in lines  # as started
    assert checkpoint_problem(out / f"step-{step:07d}") is None
    # continuing gives the run that was never interrupted
    assert cli(capsys, "train", config, "--output", out, "--resume", "--steps", step + 2, "--quiet")[0] == 0
    assert cli(capsys, "train", config, "--output", tmp_path / "straight", "--steps", step + 2, "--quiet")[0] == 0
    name = f"step-{step + 2:07d}"
    assert trainable(out, name) == trainable(tmp_path / "straight", name)


def test_ctrl_c_during_cache_latents_says_how_to_continue(cache, tmp_path, capsys):
    config, _ = cache
    out = tmp_path / "cache"
    script = CACHING.format(tests=str(ROOT / "tests"), config=str(config), out=str(out),
                            point="between a shard and its manifest", shard=3)
    proc = forked.start(["-c", script], env=ENV)
    assert proc.readline().strip() == "ready", proc.stderr[-2000:]
    assert proc.readline().startswith("mid-write")  # held in the middle of the cache
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    stderr = proc.stderr
    assert proc.returncode == 130 and "Traceback" not in stderr
    line = next(line for line in stderr.splitlines() if "Continue with: " in line).split("Continue with: ")[1]
    assert line == f"workbench cache-latents {config} --out {out} --shard-size 1 --quiet"  # its own arguments
    status, printed, _ = cli(capsys, *shlex.split(line)[1:])  # and it runs as printed
    assert status == 0 and "7 shard(s) written (1 of them damaged before), 3 already there and verified" in printed


def test_the_reliability_guide_counts_these_cases(request):
    """docs/guides/reliability.md states how many cases this file holds, in total and row by row."""
    # every case pytest collected from this file, whichever of them this session runs (one alone by its node id)
    cases = sum(nodeid.startswith(f"{request.node.parent.nodeid}::") for nodeid in COLLECTED)
    guide = (ROOT / "docs" / "guides" / "reliability.md").read_text()
    assert f"`tests/test_faults.py` ({cases} cases" in guide
    table = guide.split("## How it is tested")[1]
    rows = [int(m.group(1)) for m in re.finditer(r"^\|[^|]+\| (\d+) \|", table, re.M)]
    assert sum(rows) == cases, rows
