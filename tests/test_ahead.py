"""`workbench demo --quick` on two processes and on one: every output written, and the same numbers bit for bit.

The second process runs the frozen base a step ahead and predicts half the clips (workbench.train.ahead);
the world summary's rollouts and policy rankings (open and closed loop) share its jobs between the two processes
(workbench.worldmodel.imagination). One quick demo per process count serves every test here; a test hook
records what each process did (the batches and base halves handed over, the clips predicted, the jobs run),
so that a second process that did nothing fails them, whatever the numbers.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workbench.cli import main
from workbench.core.composed import BaseHalf
from workbench.core.conditions import Batch
from workbench.errors import ConfigError
from workbench.train.ahead import Ahead, AheadError, AheadStream, BaseAhead
from workbench.worldmodel.common import json_safe
from workbench.worldmodel.demo import DemoConfig, run_demo
from workbench.worldmodel.imagination import jobs

STEPS = DemoConfig.quick().steps


def weights(out, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(out / "run" / f"step-{step:07d}" / "trainable.safetensors"))


class Witness:
    """What each process of a run did, as this process (the one that trains) saw it happen, recorded by a
    test hook rather than read back from the run: every micro-batch the second process handed over (with its
    process id), the batch, step and base half of every training evaluation here, every chunk of clips the
    second process predicted, and the world summary's jobs run in this process."""

    def __init__(self):
        self.handed: list[tuple[Ahead, int]] = []
        self.trained: list[tuple[int, Batch, BaseHalf | None]] = []
        self.predicted: list[tuple[tuple[str, int], int, int]] = []
        self.jobs_here: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def watching(self):
        from workbench.core.composed import ComposedModel
        from workbench.worldmodel import imagination

        get, loss, job = BaseAhead._get, ComposedModel.training_loss, imagination.run_job

        def _get(ahead, expect):
            got = get(ahead, expect)
            if expect == "batch":
                self.handed.append((got[0], ahead._process.pid))
            else:  # "videos": (name, first clip), the videos
                self.predicted.append((got[0], len(got[1]), ahead._process.pid))
            return got

        def training_loss(model, batch, **kwargs):
            self.trained.append((kwargs["step"], batch, kwargs.get("base_half")))
            return loss(model, batch, **kwargs)

        @functools.wraps(job)  # (pickled by its name: the pool's processes run the real one)
        def run_job(todo, *args, **kwargs):
            self.jobs_here.append(todo)
            return job(todo, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(BaseAhead, "_get", _get)
            patch.setattr(ComposedModel, "training_loss", training_loss)
            patch.setattr(imagination, "run_job", run_job)
            yield self


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The quick demo (10 steps of batch 2, 4 clips seen and 4 unseen, 2 sampling steps, the world summary at
    its quick size): from the command line on two processes (with what it printed), and on one process; each
    with what its processes did (a :class:`Witness`)."""
    two, seen = tmp_path_factory.mktemp("p2") / "demo", {1: Witness(), 2: Witness()}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), seen[2].watching():
        assert main(["demo", "--quick", "--processes", "2", "--output", str(two)]) == 0
    one = tmp_path_factory.mktemp("p1") / "demo"
    with seen[1].watching():
        m1 = run_demo(DemoConfig.quick(output=str(one), processes=1), progress=False)
    return {2: (two, json.loads((two / "metrics.json").read_text()), printed.getvalue(), seen[2]),
            1: (one, m1, "", seen[1])}


def test_demo_quick_writes_every_output(runs):
    out, metrics, printed, _ = runs[2]
    assert "(b) beats (c) on moving PSNR" in printed and "(a) frozen base alone" in printed
    assert "tasks never seen in pretraining or training: 4 clips" in printed and "action err cm" in printed
    # it ends with the first table: the clips, then the rollouts and the two policy rankings at the quick size
    last = printed[printed.index("What the adapter buys: 4 held-out clips"):].splitlines()
    assert last[1].split() == ["frozen", "base", "base", "+", "adapter", "adapter,", "swapped", "from", "scratch",
                               "measured", "path"]
    assert last[6].startswith("rollout, hand error cm, chunk 1 -> 2") and last[6].count("->") == 5  # name + 4 cells
    assert last[7].startswith("policy ranking, open loop, rho [95%]")
    assert last[8].startswith("policy ranking, closed loop, rho [95%]")
    assert "the whole study, from fresh start states: workbench eval" in printed and "--policies --scratch" in printed
    assert "NOT met" not in "\n".join(last)
    for name in ("side_by_side.mp4", "side_by_side.gif", "loss.png", "metrics.json", "unseen/side_by_side.gif"):
        assert (out / name).stat().st_size > 1000, name
    assert metrics["training"]["steps"] == 10 and len(metrics["training"]["loss_history"]) == 10
    assert metrics["evaluation"]["clips"] == 4 and metrics["unseen"]["evaluation"]["clips"] == 4
    assert metrics["world"]["rollout"]["episodes"] == 2 and metrics["world"]["policies"]["episodes"] == 6
    assert metrics["world"]["closed_loop"]["episodes"] == 6
    assert metrics["first_table"] == "\n".join(last[:len(metrics["first_table"].splitlines())])
    for per_clip in (metrics["per_clip"], metrics["unseen"]["per_clip"]):
        for variant in ("base", "adapter", "swapped"):
            for metric in ("psnr", "ssim", "moving_psnr", "action_error"):
                values = per_clip[f"{variant}_{metric}"]
                assert len(values) == 4 and all(np.isfinite(values)), (variant, metric)
    assert set(metrics["unseen"]["summary"]["per_task"]) <= {
        "button-press-v3", "drawer-open-v3", "door-close-v3", "window-open-v3", "plate-slide-v3", "sweep-into-v3"}
    assert metrics["base"]["model_id"] == "tiny_video-metaworld-i2v"
    # the adapter checkpoint is loadable and holds the trained adapter
    from workbench import AdapterExperiment

    exp = AdapterExperiment.load(metrics["training"]["checkpoint"])
    assert exp.step == 10
    import imageio.v3 as iio

    video = iio.imread(out / "side_by_side.mp4")
    assert video.ndim == 4 and video.shape[0] == 16


def test_two_processes_train_bit_exactly_what_one_trains(runs):
    (one, m1, _, alone), (two, m2, _, shared) = runs[1], runs[2]
    # each process's share, as it happened: alone, the training process drew its own noise and ran the base itself
    assert alone.handed == [] and [(step, half) for step, _, half in alone.trained] == [
        (step, None) for step in range(STEPS)]
    # on two, the second process (another one) read each step's micro-batch and ran the frozen base on it, in
    # order, and the training process trained on exactly what it handed over: that batch and that base half
    assert [(a.step, a.micro, a.position) for a, _ in shared.handed] == [
        (step, 0, {"epoch": 0, "batches": step + 1}) for step in range(STEPS)]
    pids = {pid for _, pid in shared.handed}
    assert len(pids) == 1 and not pids & {None, os.getpid()}, pids
    assert [step for step, _, _ in shared.trained] == list(range(STEPS))
    for (a, _), (_, batch, half), (_, own, _) in zip(shared.handed, shared.trained, alone.trained, strict=True):
        assert batch is a.batch and half is a.half and isinstance(half, BaseHalf)
        assert torch.equal(batch.latents, own.latents)  # the batch the one process read at that step
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
    (_, m1, _, alone), (_, m2, _, shared) = runs[1], runs[2]
    # the second process predicted one of the three variants' 4 clips of each evaluation, seen and unseen
    assert alone.predicted == [] and len(shared.predicted) == 2
    for (name, first), clips, pid in shared.predicted:
        assert name in ("base", "adapter", "swapped") and (first, clips) == (0, 4) and pid != os.getpid()
    assert m1["per_clip"] == m2["per_clip"]
    assert m1["unseen"]["per_clip"] == m2["unseen"]["per_clip"]
    assert m1["summary"] == m2["summary"]
    assert len(m1["per_clip"]["items"]) == 4


def test_two_processes_give_the_one_process_rollouts_and_policy_rankings_bit_for_bit(runs):
    one, two = runs[1][1]["world"], runs[2][1]["world"]
    # one process ran the eight (question, model) jobs itself; of two, each ran some (the one started for them
    # took the costliest first)
    assert sorted(runs[1][3].jobs_here) == sorted(jobs(scratch=True)) and len(jobs(scratch=True)) == 8
    here = runs[2][3].jobs_here
    assert 0 < len(here) < 8 and jobs(scratch=True)[0] not in here and len(set(here)) == len(here)
    for report in (one["policies"], two["policies"], one["closed_loop"], two["closed_loop"]):
        for variant in report["variants"].values():  # (CPU seconds are timings, not results)
            variant.pop("cpu_seconds")
    assert one["rollout"] == two["rollout"] and one["policies"] == two["policies"]
    # (the two-process run's is read back from its metrics.json, where a NaN is written as null)
    assert json_safe(one["closed_loop"]) == two["closed_loop"]
    assert np.isnan(one["closed_loop"]["variants"]["base"]["agreement"]["all"]["rho"])  # ties: see below
    rollout = one["rollout"]
    assert (rollout["episodes"], rollout["frames"], len(rollout["chunks"])) == (2, 31, 2)
    row = rollout["chunks"][0]
    for variant in ("base", "adapter", "swapped", "scratch"):
        assert np.isfinite(row[f"{variant}_hand_error_cm"]) and np.isfinite(row[f"{variant}_moving_psnr"])
    report = one["policies"]
    assert report["episodes"] == 6 and report["tasks"] == ["reach-v3"] and set(report["variants"]) == {
        "base", "adapter"}
    distances = [report["variants"][v]["distance_m"] for v in ("base", "adapter")]
    assert distances[0] != distances[1]  # the adapter changes where the imagined hand ends
    assert -1.0 <= report["variants"]["adapter"]["agreement"]["all"]["rho"] <= 1.0


@pytest.fixture(scope="module")
def trained(runs):
    """The one-process run's adapter, loaded from its checkpoint."""
    from workbench import AdapterExperiment

    return AdapterExperiment.load(runs[1][1]["training"]["checkpoint"])


def test_the_closed_loop_row_ranks_the_models_own_closed_loops_against_the_simulators_record(runs, trained):
    """The closed-loop row at the quick size: the six policies from reach start 0 of the shipped recording, each
    chunk's actions chosen from the model's last frame, against the outcomes the simulator twin recorded there."""
    from workbench.worldmodel import closed_loop_eval as cle
    from workbench.worldmodel.policies import load_policies, policy_names, spearman
    from workbench.worldmodel.scripted import ScriptedPolicy
    from workbench.worldmodel.simulated_record import SIMULATED_PATH
    from workbench.worldmodel.summary import COLUMNS

    report, printed = runs[2][1]["world"]["closed_loop"], runs[2][2]
    names = policy_names()
    assert report["policies"] == names and report["tasks"] == ["reach-v3"] and report["frames"] == 61
    assert (report["chunks"], report["sampling_steps"], report["start_states"]["per_task"]) == (4, 1, 1)
    assert report["simulated"]["record"] == SIMULATED_PATH.name
    # the simulated outcomes are the record's, reach start 0 (its first row), policy by policy
    record = json.loads(SIMULATED_PATH.read_text())
    assert record["start_states"]["rows"][0] == {**record["start_states"]["rows"][0], "task": "reach-v3", "index": 0}
    assert report["simulated_distance_m"] == [record["simulated_distance_m"][k][0] for k in names]
    # the adapter's imagined outcome of a policy is what the library's closed loop gives, run here directly
    start = cle.starts_from_recording(load_policies()).select(per_task=1, tasks=["reach-v3"])
    adapter = report["variants"]["adapter"]["distance_m"]
    for i in (0, 5):  # the expert and the random policy
        alone = cle.imagine_closed_loop(trained.model, start, ScriptedPolicy(0.0 if i == 0 else None), frames=61,
                                        steps=1, gate_scale=2.0)
        assert adapter[i] == round(float(alone["distance"][0]), 5), names[i]
    assert len(set(adapter)) == 6  # each policy ends somewhere else in the adapter's imagination
    # the frozen base ignores the actions: every policy's episode is the same, its ranking all ties
    base = report["variants"]["base"]["distance_m"]
    assert len(set(base)) == 1 and set(base).isdisjoint(adapter)
    rho = spearman(adapter, report["simulated_distance_m"])  # one start state: ρ of the episodes themselves
    a = report["variants"]["adapter"]["agreement"]["all"]
    assert a["rho"] == pytest.approx(rho, abs=1e-12) and a["low"] == a["high"] == pytest.approx(rho, abs=1e-12)
    row = next(line for line in printed.splitlines() if line.startswith("policy ranking, closed loop"))
    cells = [row[40 + 20 * i:60 + 20 * i].strip() for i in range(len(COLUMNS))]
    assert cells == ["n/a (ties)", f"{rho:+.2f} [{rho:+.2f},{rho:+.2f}]", "", "", ""]


def test_split_chunks_keep_each_chunks_seeded_noise(trained):
    """Chunks of 1 over 3 clips: three chunks per variant, nine in all, shared by the two processes."""
    from workbench.worldmodel.common import clip_source
    from workbench.worldmodel.evaluate import evaluate_world_model

    exp = trained
    clip = exp.model.base.clip()
    source = clip_source("sample", window=clip.frames, split="val", size=clip.size)
    subset = torch.utils.data.Subset(source, [0, 6, 12])
    kwargs = dict(sampling_steps=2, seed=3, chunk=1, progress=False, gate_scale=2.0)
    alone = evaluate_world_model(exp, subset, **kwargs)
    with BaseAhead(exp.resolved_config(), steps=0) as ahead:
        ahead.load_weights(exp.model.trainable_state_dict())
        shared = evaluate_world_model(exp, subset, predict=ahead.predict, **kwargs)
    for name in ("base", "adapter", "swapped"):
        assert shared[name].shape == (3, clip.frames, *clip.size, 3)
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


def handed(step: int, micro: int, batches: int) -> Ahead:
    """A micro-batch as the second process hands it over, its tensors all ``micro``."""
    value = torch.full((1,), float(micro))
    return Ahead(step=step, micro=micro, batch=Batch(latents=value), half=BaseHalf(value, value, value, value),
                 position={"epoch": 0, "batches": batches})


def test_a_base_half_for_another_step_is_refused():
    ahead = handed(3, 0, 1)
    assert ahead.half_for(3, 0) is ahead.half
    with pytest.raises(AheadError, match="is for step 3, micro-batch 0, but the training loop is at step 4"):
        ahead.half_for(4, 0)


class Handover:
    """Stands in for a BaseAhead: hands over the micro-batches it was given, in order, once each."""

    def __init__(self, items):
        self.items = list(items)

    def next_batch(self) -> Ahead:
        return self.items.pop(0)


def test_the_stream_serves_each_batch_with_its_base_half_again_after_a_rolled_back_step():
    items = [handed(0, 0, 1), handed(0, 1, 2), handed(1, 0, 3)]
    stream = AheadStream(Handover(items), batch_size=1)
    mark = stream.mark()
    assert stream.next() is items[0].batch and stream.base_half(0, 0) is items[0].half
    assert stream.next() is items[1].batch and stream.state_dict() == {"epoch": 0, "batches": 2}
    stream.rollback(mark)  # a Ctrl-C during step 0: both its micro-batches are served again
    assert stream.state_dict() == {"epoch": 0, "batches": 0}
    assert stream.next() is items[0].batch and stream.base_half(0, 0) is items[0].half
    with pytest.raises(AheadError, match="step 0, micro-batch 0, but the training loop is at step 0, micro-batch 1"):
        stream.base_half(0, 1)
    assert stream.next() is items[1].batch and stream.base_half(0, 1) is items[1].half
    assert stream.next() is items[2].batch and stream.base_half(1, 0) is items[2].half
    assert stream.state_dict() == {"epoch": 0, "batches": 3}


def test_processes_must_be_one_or_two():
    with pytest.raises(ConfigError, match=r"processes must be 1 or 2 .*got 3\. Use --processes 2"):
        DemoConfig(processes=3)


def test_close_ends_a_second_process_still_steps_ahead(trained):
    """What an interrupted fit leaves: a process blocked on batches nobody reads; close() ends it."""
    import time

    ahead = BaseAhead(trained.resolved_config(), steps=50)
    first = ahead.next_batch()
    assert (first.step, first.micro, first.position) == (0, 0, {"epoch": 0, "batches": 1})
    assert isinstance(first.half, BaseHalf) and first.half.base_output.shape == first.batch.latents.shape
    started = time.monotonic()
    ahead.close()
    assert not ahead._process.is_alive() and time.monotonic() - started < 30


AMP_CONFIG = {
    "name": "amp-ahead",
    "base": {"type": "tiny_video", "config": {"image_size": 16, "frames": 8, "width": 16, "ae_width": 8, "depth": 1}},
    "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1, "dim": 4, "per_frame": "keep"}},
    "training": {"steps": 1, "batch_size": 2, "amp_dtype": "bf16", "progress": False},
    "data": {"type": "synthetic_moves", "config": {"items": 4, "frames": 8, "size": 16}},
}


def test_the_base_computed_ahead_runs_under_the_runs_autocast():
    """With ``training.amp_dtype``, the second process runs the base's half in the training step's autocast:
    its output is the training process's own, bit for bit (in float32 it would differ in the bf16 rounding)."""
    from workbench.train.config import parse_experiment
    from workbench.train.experiment import AdapterExperiment, autocast
    from workbench.train.seeds import StepNoise

    exp = AdapterExperiment.from_config(parse_experiment(AMP_CONFIG))
    with BaseAhead(exp.resolved_config(), steps=1) as ahead:
        handed_over = ahead.next_batch()
    batch = exp.prepare(exp.feed.stream().next())
    noise = StepNoise(exp.training.seed, exp.device)
    with autocast("bf16", exp.device):
        here = exp.model.base_half(batch, noise.generator(0, 0))
    plain = exp.model.base_half(batch, noise.generator(0, 0))
    assert torch.equal(handed_over.batch.latents, batch.latents)
    assert torch.equal(handed_over.half.x_t, here.x_t) and torch.equal(handed_over.half.t, here.t)
    assert torch.equal(handed_over.half.base_output, here.base_output)
    assert not torch.equal(plain.base_output, here.base_output)  # autocast changes the values: the check can fail
