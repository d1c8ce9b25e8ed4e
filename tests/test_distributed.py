"""torchrun scale-out on the CPU (gloo): K ranks train exactly what one process trains.

Every distributed run here is a real `torchrun -m workbench train` (or two of them rendezvousing as
two "nodes"), compared bit for bit with the single-process run of the same config. The single-process
runs go through the same command's function (``workbench.cli.main``) in this process: each new process
costs an import of torch, seconds of CPU, and the ranks' processes are what is under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import cli, free_port
from safetensors.torch import load_file
from torch.utils.data import Dataset

from workbench.errors import ConfigError
from workbench.train.data import DataStream, ShardedStream
from workbench.train.distributed import Distributed, DistributedConfig, DistributedError
from workbench.train.runlock import LOCK_FILE, try_hold_run

CONFIG = {
    "name": "dist",
    "base": {"type": "tiny_video", "config": {"image_size": 16, "frames": 8, "width": 16, "ae_width": 8, "depth": 1}},
    "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1, "dim": 4, "per_frame": "keep"}},
    "training": {"steps": 4, "learning_rate": 1.0e-3, "batch_size": 2, "grad_accum": 2, "sync_every": 2,
                 "checkpoint_every": 2, "keep_last": 4, "progress": False},
    # every 2 steps: each rank scores its own share of 3 evaluation batches, rank 0 logs the sum
    "callbacks": [{"type": "periodic_eval", "config": {"every_n_steps": 2, "batches": 3}},
                  {"type": "jsonl", "config": {"every_n_steps": 1}}],
    "evaluation": {"data": {"type": "synthetic_moves", "config": {"items": 6, "frames": 8, "size": 16, "seed": 7}}},
    "data": {"type": "synthetic_moves", "config": {"items": 10, "frames": 8, "size": 16}},
}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def write_config(tmp_path: Path, **training) -> Path:
    config = {**CONFIG, "training": {**CONFIG["training"], **training}}
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train(config: Path, out: Path, *extra: str) -> list[str]:
    return ["-m", "workbench", "train", str(config), "--output", str(out), "--quiet", *extra]


def run_here(config: Path, out: Path, *extra: str) -> None:
    """The single-process run in this process (its output is not kept: module fixtures have no capsys)."""
    from workbench.cli import main

    assert main([str(a) for a in train(config, out, *extra)[2:]]) == 0


def run_torchrun(config: Path, out: Path, *extra: str, nproc: int = 2) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           *train(config, out, *extra)]
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"step-{step:07d}" / "trainable.safetensors"))


def meta(out: Path, step: int) -> dict:
    import json

    return json.loads((out / f"step-{step:07d}" / "meta.json").read_text())


def history(out: Path, step: int) -> list[float]:
    return meta(out, step)["loss_history"]


def assert_same_run(a: Path, b: Path, step: int = 4) -> None:
    wa, wb = weights(a, step), weights(b, step)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    assert history(a, step) == history(b, step)
    # the same base on any number of ranks, its weights sharded or not (digested whole, before sharding)
    assert meta(a, step)["base"] == meta(b, step)["base"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The single-process run: 4 steps of 2 micro-batches each."""
    tmp = tmp_path_factory.mktemp("single")
    config = write_config(tmp)
    run_here(config, tmp / "run")
    return config, tmp / "run"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, reference):
    """The reference's config on two "nodes" of one rank each, two torchruns rendezvousing on localhost:
    (output, what both launchers printed)."""
    config, _ = reference
    out = tmp_path_factory.mktemp("nodes") / "run"
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={i}",
         "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=workbench-test",
         *train(config, out)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    printed = ""
    for p in procs:
        stdout, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        printed += stdout
    return out, printed


def half_run(run: Path, into: Path) -> Path:
    """``run`` as it stood right after its step-2 checkpoint (as a run stopped there leaves it): copied into
    ``into`` without the step-4 checkpoint or the metrics rows after step 2, ``LATEST`` naming step 2."""
    import json

    shutil.copytree(run, into)
    shutil.rmtree(into / "step-0000004")
    (into / "LATEST").write_text("step-0000002")
    rows = (into / "metrics.jsonl").read_text().splitlines()
    (into / "metrics.jsonl").write_text("".join(f"{row}\n" for row in rows if json.loads(row)["step"] <= 2))
    return into


def evals(out: Path) -> list[dict]:
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "eval" in row]


def test_two_ranks_on_two_nodes_rendezvous_and_train_bit_exactly_what_one_process_trains(reference, two_nodes):
    _, single = reference
    out, stdout = two_nodes
    assert stdout.count("Finished dist at step 4 on 2 ranks") == 1  # rank 0 alone reports
    assert_same_run(single, out)
    rows = [row for row in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' not in row]
    assert len(rows) == 4  # rank 0 alone logs
    # ``evaluation:`` + ``periodic_eval``: the logged scores are the single-process run's, bit for bit
    assert [row["step"] for row in evals(single)] == [2, 4]  # every 2 steps, logged once (rank 0)
    assert evals(out) == evals(single)
    assert all(row["eval"]["batches"] == 3 and row["eval"]["loss"] > 0 for row in evals(single))


@pytest.mark.parametrize("first, then", [("ddp", "single"), ("single", "ddp")])
def test_resume_across_world_sizes_equals_the_uninterrupted_run(tmp_path, capsys, reference, two_nodes, first,
                                                                 then):
    # the step-2 checkpoint of the 2-rank run or of the single-process one, continued on the other world size
    # and past the saved steps (4 -> 6, allowed by --override): at step 4 it is the uninterrupted run
    _, single = reference
    out = half_run(two_nodes[0] if first == "ddp" else single, tmp_path / "resumed")
    longer = write_config(tmp_path, steps=6)
    if then == "ddp":
        stdout = run_torchrun(longer, out, "--resume", "--override", "steps")
    else:
        status, stdout, err = cli(capsys, *train(longer, out, "--resume", "--override", "steps")[2:])
        assert status == 0, err
    assert "Resuming dist from" in stdout and "(step 2) up to step 6" in stdout
    assert "changed training.steps: 4 -> 6 from step 2 (the continuation stays bit-exact" in stdout
    assert_same_run(single, out)
    # rank 0 held the run for both ranks (the other was not refused) and let it go at the end
    assert (out / ".writer.lock").read_bytes() == b""


def test_fsdp_sharding_the_base_is_bit_exact_with_the_unsharded_run(tmp_path, reference):
    config, single = reference
    sharded = write_config(tmp_path, distributed={"strategy": "fsdp", "shard_base": True})
    out = tmp_path / "fsdp"
    run_torchrun(sharded, out)
    assert_same_run(single, out)
    # 3 evaluation batches on 2 ranks: the rank with one batch joins the other's second sharded forward
    # (each gathers the base's parameters from both), so the periodic evaluation ends, with the same scores
    assert evals(out) == evals(single) and len(evals(out)) == 2


EXIT_PROBE = """
import atexit, os, sys, time
from workbench.cli import main

def gloo_threads():  # what is still running when the interpreter starts to shut down
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:  # a thread that ended while being listed
            pass
    return sorted(n for n in names if "gloo" in n)

def report():
    deadline = time.monotonic() + 5  # a thread still finishing its exit is given a moment; a held group never ends
    while gloo_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    # one write per rank: both ranks share the pipe, and print() writes its pieces one by one
    sys.stderr.write(f"threads at exit: {gloo_threads()}\\n")
    sys.stderr.flush()

atexit.register(report)
sys.exit(main(sys.argv[1:]))
"""


AMP = {"amp_dtype": "bf16", "gradient_checkpointing": True, "steps": 2}


@pytest.fixture(scope="module")
def amp_single(tmp_path_factory):
    """The single-process run with bf16 autocast and gradient checkpointing, 2 steps."""
    tmp = tmp_path_factory.mktemp("amp")
    run_here(write_config(tmp, **AMP), tmp / "single")
    return tmp / "single"


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def amp_ranks(request, tmp_path_factory):
    """The same run on 2 ranks under ``strategy`` (FSDP sharding the base too), each rank in the exit probe:
    (strategy, output, stderr)."""
    strategy, tmp = request.param, tmp_path_factory.mktemp(f"amp-{request.param}")
    probe = tmp / "probe.py"
    probe.write_text(EXIT_PROBE)
    config = write_config(tmp, **AMP, distributed={"strategy": strategy, "shard_base": strategy == "fsdp"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(probe),
           *train(config, tmp / "run")[2:]]
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return strategy, tmp / "run", done.stderr


def test_mixed_precision_and_gradient_checkpointing_work_under_both_strategies(amp_single, amp_ranks):
    _, out, _ = amp_ranks
    assert_same_run(amp_single, out, step=2)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads through /proc (Linux)")
def test_the_process_group_is_gone_before_the_interpreter_shuts_down(amp_ranks):
    # gloo threads that outlive destroy_process_group are torn down during interpreter shutdown,
    # where a rank aborted (SIGABRT) now and then after a finished run; none may be left at exit.
    _, _, stderr = amp_ranks
    assert stderr.count("threads at exit: []") == 2, stderr[-3000:]


def test_gradient_checkpointing_recomputes_the_same_gradients():
    from conftest import tiny_base

    from workbench import AdapterExperiment, GatedResidual, TrainingConfig
    from workbench.adapters.latent_residual import LatentResidual
    from workbench.data.synthetic import SyntheticMoves

    runs = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        exp = AdapterExperiment(tiny_base(frames=8), LatentResidual(width=8, depth=1), GatedResidual(),
                                training=TrainingConfig(batch_size=2, learning_rate=1e-3, progress=False,
                                                        gradient_checkpointing=checkpointing))
        calls = [0]
        exp.model.adapter.register_forward_pre_hook(lambda *_, c=calls: c.__setitem__(0, c[0] + 1))
        exp.fit(SyntheticMoves(items=4, frames=8, size=16), steps=3)
        runs.append((exp.loss_history, exp.model.trainable_state_dict(), calls[0]))
    (loss_a, state_a, calls_a), (loss_b, state_b, calls_b) = runs
    assert loss_a == loss_b and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert (calls_a, calls_b) == (3, 6)  # the adapter ran again in each backward


def test_a_rank_that_dies_ends_the_run_and_leaves_the_last_checkpoint_whole(tmp_path, reference):
    from workbench.train.checkpoint import latest_checkpoint

    config, single = reference
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, sys\n"
        "from workbench.cli import main\n"
        "from workbench.core.callbacks import Callback\n"
        "import workbench.train.experiment as e\n"
        "class Die(Callback):\n"
        "    def on_step_start(self, exp, step):\n"
        "        if step == 3 and exp.dist.rank == 1:\n"
        "            os._exit(7)\n"
        "init = e.AdapterExperiment.__init__\n"
        "def patched(self, *a, **k):\n"
        "    init(self, *a, **k)\n"
        "    self.callbacks.append(Die())\n"
        "e.AdapterExperiment.__init__ = patched\n"
        f"sys.exit(main(['train', {str(config)!r}, '--output', {str(tmp_path / 'out')!r}, '--quiet']))\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "exitcode  : 7" in done.stderr or "exitcode: 7" in done.stderr.replace(" ", "")
    out = tmp_path / "out"
    assert latest_checkpoint(out).name == "step-0000002"
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [LOCK_FILE]  # no half-written checkpoint
    held = try_hold_run(out)  # and rank 0, stopped with the run, holds it no more
    assert held is not None
    held.release()
    want, got = weights(single, 2), weights(out, 2)
    assert all(torch.equal(want[k], got[k]) for k in want)


class Ids(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"i": i}


@pytest.mark.parametrize("world, per_rank", [(2, 1), (2, 2), (4, 1), (1, 4)])
def test_ranks_read_disjoint_shares_of_the_single_process_order(world, per_rank):
    single = DataStream(Ids(), batch_size=2, seed=3)
    want = [single.next()["i"].tolist() for _ in range(24)]
    streams = [ShardedStream(Ids(), rank=r, world=world, per_rank=per_rank, batch_size=2, seed=3)
               for r in range(world)]
    got = []
    for _ in range(24 // (world * per_rank)):
        for s in streams:
            got += [s.next()["i"].tolist() for _ in range(per_rank)]
        assert len({(s.epoch, s.batches) for s in streams}) == 1  # every rank at the same global position
    assert got == want
    assert all(s.state_dict() == single.state_dict() for s in streams)


def test_an_iterable_cannot_be_sharded():
    from workbench.errors import DataError

    with pytest.raises(DataError, match="A distributed run reads a map-style dataset .* got list_iterator"):
        ShardedStream(iter([{"i": 0}]), rank=0, world=2, per_rank=1, batch_size=1)


def test_a_missing_master_addr_says_how_to_launch(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistributedError, match=r"WORLD_SIZE=2 asks for a distributed run, but MASTER_ADDR, "
                                               r"MASTER_PORT are not set. Launch with `torchrun --nproc_per_node=2"):
        Distributed.setup(DistributedConfig(), torch.device("cpu"))


def test_nccl_on_the_cpu_is_refused_with_the_fix(monkeypatch):
    for key, value in {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DistributedError, match=r"backend: 'nccl' cannot run on device 'cpu'.* Use backend: gloo"):
        Distributed.setup(DistributedConfig(backend="nccl"), torch.device("cpu"))


def test_shard_base_needs_fsdp():
    with pytest.raises(ConfigError, match="shard_base: sharding the base needs strategy: fsdp, got strategy: ddp"):
        DistributedConfig(shard_base=True)


def test_grad_accum_that_does_not_split_over_the_ranks_is_refused():
    d = Distributed(rank=0, world_size=2, device=torch.device("cpu"), config=DistributedConfig(), owns_group=False)
    assert d.split_micro_batches(4) == 2
    refusal = (r"grad_accum: 3 micro-batches per step cannot be split evenly over 2 ranks.* use a multiple of 2, "
               r"e.g. 2, 4, 6 \(on the command line: workbench train CONFIG --grad-accum 2\), or launch 1, 3 ranks")
    with pytest.raises(ConfigError, match=refusal):
        d.split_micro_batches(3)


def test_mismatched_configs_across_ranks_are_named(tmp_path):
    config = write_config(tmp_path)
    other = write_config(tmp_path, learning_rate=2.0e-3)
    script = tmp_path / "launch.py"
    script.write_text(
        "import os, sys\n"
        "from workbench.cli import main\n"
        f"path = {str(config)!r} if os.environ['RANK'] == '0' else {str(other)!r}\n"
        f"sys.exit(main(['train', path, '--output', {str(tmp_path / 'out')!r}, '--quiet']))\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert ("Rank 1 was started with a different config from rank 0 (training.learning_rate: rank 0 has 0.001, this "
            "rank has 0.002). Every rank must run the same config") in done.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("step-*"))
