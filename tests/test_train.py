"""The training loop: continuation, exact resume, callbacks, interrupts, NaN, no host syncs."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DeviceReads, tiny_base

from workbench import Callback, GatedResidual, NoiseGated, PretrainWarmup
from workbench.adapters.latent_residual import LatentResidual
from workbench.data.synthetic import SyntheticMoves
from workbench.errors import CallbackError, NonFiniteLossError
from workbench.train import AdapterExperiment, FitSession, TrainingConfig
from workbench.train.callbacks import GradNorm, LossHistory
from workbench.train.checkpoint import list_checkpoints

DATA = SyntheticMoves(items=16, frames=4, size=16)


def make(tmp_path=None, composer=None, **training):
    defaults = dict(steps=8, learning_rate=5e-3, batch_size=4, sync_every=2, progress=False)
    if tmp_path is not None:
        defaults["output_dir"] = str(tmp_path)
    torch.manual_seed(0)
    base = tiny_base()
    adapter = LatentResidual(width=16, depth=1, dropout=0.25)
    return AdapterExperiment(base=base, adapter=adapter, composer=composer or GatedResidual(),
                             training=TrainingConfig(**{**defaults, **training}))


def weights(exp):
    return {k: v.clone() for k, v in exp.model.trainable_state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fit_trains_the_adapter_and_counts_steps():
    exp = make()
    before = weights(exp)
    exp.fit(DATA, steps=3)
    assert exp.step == 3 and len(exp.loss_history) == 3
    assert not same(before, weights(exp))
    exp.fit(DATA, steps=2)
    assert exp.step == 5 and len(exp.loss_history) == 5


def test_two_fit_calls_equal_one_and_lr_schedule_continues():
    a = make(schedule="cosine", warmup_steps=2)
    a.fit(DATA, steps=6)
    b = make(schedule="cosine", warmup_steps=2)
    b.fit(DATA, steps=2)
    b.fit(DATA, steps=4)
    assert a.loss_history == b.loss_history
    assert same(weights(a), weights(b))
    assert b.optimizer.param_groups[0]["lr"] == pytest.approx(b.training.lr_at(5))


@pytest.mark.parametrize("stop", [1, 3])
@pytest.mark.parametrize("accum", [1, 2])
def test_resume_from_checkpoint_is_bit_exact(tmp_path, stop, accum):
    full = make(grad_accum=accum)
    full.fit(DATA, steps=5)
    part = make(tmp_path, grad_accum=accum)
    part.fit(DATA, steps=stop)
    path = part.save_checkpoint()
    resumed = make(grad_accum=accum).load_checkpoint(path)
    assert resumed.step == stop
    resumed.fit(DATA, steps=5 - stop)
    assert resumed.loss_history == full.loss_history
    assert same(weights(resumed), weights(full))


def test_resume_through_load_rebuilds_from_the_saved_config(tmp_path):
    from workbench.train.config import parse_experiment

    config = parse_experiment({
        "name": "cfg", "base": {"type": "tiny_video", "config": {"image_size": 16, "frames": 4, "width": 16,
                                                                "ae_width": 8, "depth": 1}},
        "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1}},
        "training": {"steps": 4, "batch_size": 4, "progress": False, "output_dir": str(tmp_path)},
        "data": {"type": "synthetic_moves", "config": {"items": 16, "frames": 4, "size": 16}},
    })
    full = AdapterExperiment.from_config(config).fit()
    half = AdapterExperiment.from_config(config).fit(steps=2)
    half.save_checkpoint()
    again = AdapterExperiment.load(tmp_path)
    again.fit()
    assert again.step == 4 and again.loss_history == full.loss_history
    assert same(weights(again), weights(full))


def test_callbacks_given_to_fit_do_not_leak():
    exp = make()
    history = LossHistory()
    exp.fit(DATA, steps=2, callbacks=[history])
    exp.fit(DATA, steps=2)
    assert history.steps == [1, 2]
    assert history.losses == exp.loss_history[:2]


class Recorder(Callback):
    def __init__(self, log, every=None):
        self.log = log
        self.every_n_steps = every

    def on_fit_start(self, exp):
        self.log.append("fit_start")

    def on_step_start(self, exp, step):
        self.log.append(f"step_start {step}")

    def on_after_backward(self, exp, step):
        self.log.append(f"after_backward {step}")

    def on_step_end(self, exp, step, metrics):
        self.log.append(f"step_end {step}")

    def on_eval(self, exp, step, metrics):
        self.log.append(f"eval {step}")

    def on_fit_end(self, exp):
        self.log.append("fit_end")


def test_hook_order_and_cadence():
    log, sparse = [], []
    exp = make()
    exp.fit(DATA, steps=2, callbacks=[Recorder(log), Recorder(sparse, every=2)])
    exp.evaluate(DATA, batches=1)
    assert log == ["fit_start", "step_start 0", "after_backward 0", "step_end 1", "step_start 1",
                   "after_backward 1", "step_end 2", "fit_end"]
    assert [e for e in sparse if e.startswith("step_end")] == ["step_end 2"]


def test_component_callbacks_collected_once():
    composer = NoiseGated(PretrainWarmup(GatedResidual(), steps=1), lo=0.0, hi=1.0)
    exp = make(composer=composer)
    again = [*composer.callbacks(), *composer.callbacks()]  # the same composer's gate statistics, twice more
    assert [type(c).__name__ for c in again] == ["GateStatistics", "GateStatistics"]
    exp.fit(DATA, steps=10, callbacks=again)
    assert [row["step"] for row in exp.component_callbacks[0].history] == [10]
    assert [c.history for c in again] == [[], []]  # dropped as duplicates: the statistics are recorded once


def test_callback_errors_name_the_callback_and_hook():
    class Broken(Callback):
        def on_after_backward(self, exp, step):
            raise ValueError("boom")

    exp = make()
    with pytest.raises(CallbackError, match="Callback Broken raised in on_after_backward at step 0: ValueError: boom"):
        exp.fit(DATA, steps=1, callbacks=[Broken()])


def test_keyboard_interrupt_stops_cleanly_and_fit_continues(capsys):
    class StopAt(Callback):
        def __init__(self, step, hook):
            self.step, self.hook, self.fired = step, hook, False

        def on_after_backward(self, exp, step):
            if self.hook == "mid" and step == self.step and not self.fired:
                self.fired = True
                raise KeyboardInterrupt

    full = make(grad_accum=2)
    full.fit(DATA, steps=4)
    exp = make(grad_accum=2)
    exp.fit(DATA, steps=4, callbacks=[StopAt(2, "mid")])
    assert exp.interrupted and exp.step == 2
    assert "stopped cleanly after step 2" in capsys.readouterr().out
    assert all(p.grad is None for p in exp.model.trainable_parameters())
    exp.fit(DATA, steps=2)
    assert exp.loss_history == full.loss_history
    assert same(weights(exp), weights(full))


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path):
    exp = make(tmp_path, sync_every=1, learning_rate=1e-3)
    exp.fit(DATA, steps=2)
    good = exp.save_checkpoint()
    before = (good / "trainable.safetensors").read_bytes()

    def poisoned():
        while True:
            item = DATA[0]
            yield {"video": (item["video"] * float("nan"))[None].expand(4, -1, -1, -1, -1),
                   "action": item["action"][None].expand(4, -1, -1)}

    with pytest.raises(NonFiniteLossError) as info:
        exp.fit(poisoned(), steps=3)
    assert "Loss became nan at step 3" in str(info.value)
    assert str(good) in str(info.value)
    assert (good / "trainable.safetensors").read_bytes() == before
    assert AdapterExperiment.load_checkpoint(make(), good).step == 2


def loader_of_fixed_batches(n: int = 8) -> list[dict]:
    batches = [DATA[i] for i in range(4)]
    return [{k: torch.stack([b[k] for b in batches]) for k in batches[0]}] * n


SYNCS_AT_4_AND_8 = ["cpu in _sync", "tolist in _sync"] * 2


def test_no_host_device_sync_outside_the_sync_cadence():
    """Values are read back from the device only in _sync, every sync_every steps (see DeviceReads)."""
    exp = make(sync_every=4)
    loader = loader_of_fixed_batches()
    exp.fit(loader, steps=1)  # warm up
    with DeviceReads() as reads:
        exp.fit(loader, steps=7)  # steps 2..8: syncs at steps 4 and 8 only
    assert reads.calls == SYNCS_AT_4_AND_8
    assert len(exp.loss_history) == 8


def test_a_live_fit_session_reads_losses_at_the_sync_points_only():
    exp = make(sync_every=4)
    session = FitSession(exp, loader_of_fixed_batches(), steps=1).run()  # warm up
    seen = []
    session.add_listener(lambda s, event: seen.append((event, exp.step, len(s.history))))
    with DeviceReads() as reads:
        session.run(steps=7)
    assert reads.calls == SYNCS_AT_4_AND_8
    # "step" after every step, for progress; the history grows when the experiment syncs
    assert [e for e in seen if e[0] == "step"] == [("step", k, 1 if k < 4 else 4 if k < 8 else 8)
                                                   for k in range(2, 9)]
    assert session.history == list(zip(range(1, 9), exp.loss_history))


def test_a_stopped_session_has_every_completed_step_in_its_history():
    exp = make(sync_every=4)
    session = FitSession(exp, loader_of_fixed_batches(), steps=8)
    session.add_listener(lambda s, event: s.stop() if event == "step" and exp.step == 6 else None)
    session.run()
    assert session.state == "stopped" and exp.step == 6
    assert session.history == list(zip(range(1, 7), exp.loss_history))  # read back when the run ended
    session.run()
    assert session.history == list(zip(range(1, 9), exp.loss_history))


@pytest.mark.parametrize("when", ["during the update", "before the update"])
def test_ctrl_c_during_an_update_is_held_until_it_completes(when):
    """A real SIGINT: during the optimizer update it is held (the step completes and its loss is
    kept); before it, the step is undone. Either way the resumed run equals an uninterrupted one."""
    import os
    import signal

    full = make()
    full.fit(DATA, steps=4)
    exp = make()
    handler = signal.getsignal(signal.SIGINT)
    update = exp.optimizer.step

    class CtrlC(Callback):
        def on_after_backward(self, exp, step):
            if step == 2 and when == "before the update":
                os.kill(os.getpid(), signal.SIGINT)

    def interrupted_update(*args, **kwargs):
        if exp.step == 2 and when == "during the update":
            os.kill(os.getpid(), signal.SIGINT)
        return update(*args, **kwargs)

    exp.optimizer.step = interrupted_update
    exp.fit(DATA, steps=4, callbacks=[CtrlC()])
    assert exp.interrupted and exp.step == (3 if when == "during the update" else 2)
    assert len(exp.loss_history) == exp.step
    assert signal.getsignal(signal.SIGINT) is handler  # the fit's handler is gone again
    exp.fit(DATA, steps=4 - exp.step)
    assert exp.loss_history == full.loss_history
    assert same(weights(exp), weights(full))


def test_checkpoint_rotation_keeps_the_newest(tmp_path):
    exp = make(tmp_path, checkpoint_every=1, keep_last=2)
    exp.fit(DATA, steps=4)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000003", "step-0000004"]
    assert (tmp_path / "LATEST").read_text() == "step-0000004"
    meta = json.loads((tmp_path / "step-0000004" / "meta.json").read_text())
    assert meta["step"] == 4 and meta["loss_history"] == exp.loss_history
    assert {"workbench", "torch", "python"} <= set(meta["versions"])
    names = {p.name for p in (tmp_path / "step-0000004").iterdir()}
    assert names == {"trainable.safetensors", "state.pt", "config.yaml", "meta.json", "manifest.json"}


def test_a_save_killed_before_it_named_its_checkpoint_latest_still_resumes_from_it(tmp_path):
    """A save renames its complete checkpoint into place, then points LATEST at it: a process killed between the
    two leaves LATEST naming the checkpoint before. The newer, complete one is the run's latest all the same
    (resuming from the older one would leave it behind, newer than the run's own later checkpoints)."""
    from workbench.train.checkpoint import latest_checkpoint

    exp = make(tmp_path, checkpoint_every=2)
    exp.fit(DATA, steps=4)
    (tmp_path / "LATEST").write_text("step-0000002")  # as the kill leaves it
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000004"
    resumed = AdapterExperiment.load(latest_checkpoint(tmp_path))
    assert resumed.step == 4 and resumed.loss_history == exp.loss_history


def test_base_is_never_written_and_optimizer_holds_trainable_params_only(tmp_path):
    exp = make(tmp_path)
    exp.fit(DATA, steps=1)
    path = exp.save_checkpoint()
    from safetensors.torch import load_file

    keys = load_file(str(path / "trainable.safetensors")).keys()
    assert keys and all(k.startswith(("adapter.", "composer.")) for k in keys)
    trainable = {id(p) for p in exp.model.trainable_parameters()}
    assert set(map(id, exp.optimizer.state)) == trainable


def test_evaluate_compares_against_the_base_on_the_same_noise():
    exp = make()
    first = exp.evaluate(DATA, batches=2)
    assert first["loss"] == first["base_loss"]  # identity at init
    exp.fit(DATA, steps=6)
    after = exp.evaluate(DATA, batches=2)
    assert after["base_loss"] == first["base_loss"]  # the base did not move
    assert after["loss"] != after["base_loss"]


def test_grad_norm_callback_records_on_cadence():
    norm = GradNorm(every_n_steps=2)
    make().fit(DATA, steps=4, callbacks=[norm])
    assert [r["step"] for r in norm.history] == [2, 4] and all(r["grad_norm"] > 0 for r in norm.history)


def test_iterables_and_dataloaders_are_accepted():
    loader = torch.utils.data.DataLoader(DATA, batch_size=4)
    exp = make()
    exp.fit(loader, steps=5)  # 4 batches per epoch: wraps around
    assert exp.step == 5
    batches = [next(iter(loader))] * 3
    make().fit(batches, steps=4)


def test_bf16_autocast_trains_on_cpu():
    exp = make(amp_dtype="bf16")
    before = weights(exp)
    exp.fit(DATA, steps=2)
    assert exp.step == 2 and all(v == v for v in exp.loss_history)
    assert not same(before, weights(exp))


def test_cli_steps_then_resume_equals_one_run(tmp_path):
    import yaml

    from workbench.cli import main

    config = {
        "name": "cli",
        "base": {"type": "tiny_video", "config": {"image_size": 16, "frames": 4, "width": 16, "ae_width": 8,
                                                  "depth": 1}},
        "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1, "dropout": 0.2}},
        "training": {"batch_size": 4, "learning_rate": 5e-3, "sync_every": 2},
        "data": {"type": "synthetic_moves", "config": {"items": 12, "frames": 4, "size": 16}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", str(path), "--steps", "6", "--output", str(one), "--quiet"]) == 0
    assert main(["train", str(path), "--steps", "3", "--output", str(two), "--quiet"]) == 0
    assert main(["train", str(path), "--steps", "6", "--output", str(two), "--resume", "--quiet"]) == 0
    a = json.loads((one / "step-0000006" / "meta.json").read_text())["loss_history"]
    b = json.loads((two / "step-0000006" / "meta.json").read_text())["loss_history"]
    assert len(a) == 6 and a == b
    assert (one / "step-0000006" / "trainable.safetensors").read_bytes() == \
        (two / "step-0000006" / "trainable.safetensors").read_bytes()


def test_exp_sample_records_the_native_sampler_and_matches_generate():
    from conftest import raw_batch

    exp = make()
    exp.fit(DATA, steps=2)
    raw = raw_batch()
    traj = exp.sample(raw, steps=3, seed=5)
    assert len(traj) == 3
    plain = exp.model.generate(exp.prepare(raw), steps=3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(traj.final, plain)


def test_a_large_base_file_is_hashed_once_per_contents(tmp_path, monkeypatch):
    """A base file of CACHE_FROM_BYTES or more keeps its digest against its identity (here the threshold is lowered
    to 1 byte): read once, read again after any write, and a damaged record is hashed past."""
    import hashlib
    import time

    from workbench.train import provenance

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance, "CACHE_FROM_BYTES", 1)
    monkeypatch.setattr(provenance, "_memo", {})
    file = tmp_path / "base.safetensors"
    file.write_bytes(b"a" * 1000)
    reads = []
    digest_file = provenance.digest_file
    monkeypatch.setattr(provenance, "digest_file", lambda path: reads.append(path) or digest_file(path))
    assert provenance.file_sha256(file) == hashlib.sha256(b"a" * 1000).hexdigest()
    [record] = (tmp_path / "cache" / "digests").glob("*.json")
    provenance._memo.clear()  # a new process: the record on disk is read, the file is not
    assert provenance.file_sha256(file) == hashlib.sha256(b"a" * 1000).hexdigest() and len(reads) == 1
    time.sleep(0.05)  # (past one tick of the file system's clock)
    file.write_bytes(b"b" * 1000)  # written again, the same size
    assert provenance.file_sha256(file) == hashlib.sha256(b"b" * 1000).hexdigest() and len(reads) == 2
    provenance._memo.clear()
    record.write_text("{not json")
    assert provenance.file_sha256(file) == hashlib.sha256(b"b" * 1000).hexdigest() and len(reads) == 3
