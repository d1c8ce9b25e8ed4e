"""Compiled backbones: ``base.compile()`` and ``compile: true`` run the denoiser through ``torch.compile``.

Most tests here compile through ``aot_eager`` (unless ``WORKBENCH_COMPILE_TEST_BACKEND`` names another backend,
e.g. ``inductor``): dynamo captures the graph, guards it and recompiles, and AOTAutograd traces the backward,
then the graph runs with eager kernels. What they check is that capture: the graph of tiny_video and of each tiny
plugin computes what the eager network computes (within 1e-5 relative for one call); the hooks of an inside
adapter attached after the first compile are in it; recorded == unrecorded bit for bit and a fork's prefix is
the recording's through it; an adapter switched on and off captures one graph per state, never one per step; a
``fit`` step with an inside adapter trains through it as it does eagerly. Graphs are counted with dynamo's own
counters (:func:`workbench.core.compiled.compile_stats`).

Inductor's own code, the C++ kernels that ``compile: true`` gives users on a CPU, is checked with
``WORKBENCH_COMPILE_TEST_BACKEND=inductor``: every test here then runs through it (done for
docs/guides/compile.md), and one more compiles a residual block of tiny_video's denoiser in a process of its own,
its kernels against eager within 1e-5 (about 13 CPU seconds with an empty inductor cache). By default none does:
in one fresh machine's ``make test``, the worker compiling that block crashed, taking the rest of the suite with
it. ``make bench`` measures inductor (``benchmarks/compile_speed.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import perturb, raw_batch, requires_plugins, tiny_base

from workbench import AdapterExperiment, Add, ComposedModel, Replace, TrainingConfig
from workbench.adapters.action_modulation import ActionModulation
from workbench.config import build
from workbench.core.backbone import compile_target
from workbench.core.compiled import compile_stats, compiled_options
from workbench.data.synthetic import SyntheticMoves
from workbench.errors import ConfigError
from workbench.inspect import record
from workbench.testing.kit import ProbeAdapter

PROMPT = "a robot arm pushes a puck"
BACKEND = os.environ.get("WORKBENCH_COMPILE_TEST_BACKEND", "aot_eager")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference relative to the largest magnitude of ``b``."""
    return float((a - b).abs().max() / b.abs().max())


def graphs() -> int:
    return compile_stats()["graphs"]


def sample(model, batch, seed: int = 0) -> torch.Tensor:
    return model.generate(batch, generator=torch.Generator().manual_seed(seed))


def modulated(base) -> ComposedModel:
    """``base`` with a moved ``action_modulation`` inside it (hooks on every block), in eval mode."""
    torch.manual_seed(1)
    model = ComposedModel(base, ActionModulation(hidden=16), Replace(), base.default_objective())
    perturb(model)
    return model.train(False)


@pytest.fixture(scope="module")
def tiny_pair():
    """The same tiny_video with an inside adapter twice: eager, and compiled before the adapter attached."""
    eager = modulated(tiny_base())
    base = tiny_base()
    assert base.compile(backend=BACKEND) is base and base.is_compiled
    with torch.no_grad():
        base.denoise(*noised(base))  # the first graph is made before any hook exists
    return eager, modulated(base)


def noised(base):
    batch = base.prepare_batch(raw_batch())
    g = torch.Generator().manual_seed(2)
    return torch.randn(batch.latents.shape, generator=g), torch.full((2,), 0.6), batch.cond


# -- tiny_video ------------------------------------------------------------------------------
def test_the_graph_captured_from_tiny_video_computes_eager_values_with_hooks_added_after_compiling(tiny_pair):
    eager, compiled = tiny_pair
    batch = eager.base.prepare_batch(raw_batch())
    expected = sample(eager, batch)
    got = sample(compiled, compiled.base.prepare_batch(raw_batch()))
    assert relative(got, expected) <= 1e-5
    # without the adapter's hooks in the graph the result would be the frozen base's
    frozen = sample(ComposedModel(tiny_base(), ProbeAdapter(), Add(), eager.objective), batch)
    assert relative(got, frozen) > 1e-3 and relative(expected, frozen) > 1e-3
    # the module is unchanged: same names, same state dict, a compiled forward on the network only
    assert compiled.base.state_dict().keys() == eager.base.state_dict().keys()
    assert compiled_options(compiled.base.denoiser)["dynamic"] is False
    assert compiled_options(eager.base.denoiser) is None and not eager.base.is_compiled


def test_compile_is_idempotent():
    base = tiny_base()
    forward = base.compile().denoiser.forward
    assert base.compile(mode="max-autotune") is base and base.denoiser.forward is forward
    assert compiled_options(base.denoiser)["mode"] is None  # the first call's options stay


def test_recorded_equals_unrecorded_and_a_fork_replays_the_prefix_through_the_captured_graph(tiny_pair):
    _, model = tiny_pair
    batch = model.base.prepare_batch(raw_batch())
    plain = sample(model, batch)
    traj = record(model, batch, seed=0)
    assert torch.equal(traj.final, plain) and torch.equal(record(model, batch, seed=0).final, plain)
    fork = traj.fork(at=2)
    assert all(torch.equal(a.x_t, b.x_t) and torch.equal(a.composed, b.composed) for a, b in zip(list(fork)[:2],
                                                                                              list(traj)[:2]))
    assert torch.equal(fork.final, traj.final)  # the live steps recompute what was recorded, bit for bit


def test_switching_the_adapter_captures_one_graph_per_state_not_one_per_step(tiny_pair):
    eager, model = tiny_pair
    batch = model.base.prepare_batch(raw_batch())
    traj = record(model, batch, seed=0)  # on (the composed prediction) and off (the base's own): both compiled
    before = graphs()
    chain = traj
    for k in range(len(traj)):  # a chain of forks switching the adapter off / on / off / on at every step
        chain = chain.fork(at=k, with_adapter=k % 2 != 0)
    x_t, t, _ = noised(model.base)
    with torch.no_grad():
        calls = [model.predict(x_t, t, batch, with_adapter=i % 2 == 0).composed for i in range(6)]  # on/off/on/...
        eager_calls = [eager.predict(x_t, t, batch, with_adapter=i % 2 == 0).composed for i in range(2)]
    assert graphs() == before, "a graph was compiled again although every adapter state had been seen"
    assert all(torch.equal(calls[i], calls[i % 2]) for i in range(6)) and not torch.equal(calls[0], calls[1])
    assert relative(calls[0], eager_calls[0]) <= 1e-5 and relative(calls[1], eager_calls[1]) <= 1e-5


def test_a_fit_step_with_an_inside_adapter_trains_through_the_captured_graph_as_eagerly(tmp_path):
    data = SyntheticMoves(items=8, frames=4, size=16)
    runs = {}
    for compiled in (False, True):
        base = tiny_base()  # compiled before the hooks and LoRA layers come, as compile: true in a config does
        if compiled:
            base.compile(backend=BACKEND)
        torch.manual_seed(1)
        adapter = ActionModulation(hidden=16, lora={"rank": 2, "targets": ["film"]})
        exp = AdapterExperiment(base=base, adapter=adapter, training=TrainingConfig(
            steps=2, learning_rate=1e-2, batch_size=4, progress=False, seed=0))
        frozen = {k: v.clone() for k, v in base.state_dict().items() if "lora_" not in k}
        before = graphs()
        exp.fit(data)
        runs[compiled] = exp.model.trainable_state_dict(), exp.loss_history, graphs() - before
        assert base.is_compiled is compiled
        assert all(torch.equal(v, base.state_dict()[k]) for k, v in frozen.items())  # the base never trains
    (eager, eager_losses, _), (got, losses, compiled_graphs) = runs[False], runs[True]
    assert 1 <= compiled_graphs <= 2  # the training graph (forward and backward), once for the two steps
    assert len(losses) == len(eager_losses) == 2
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, eager_losses))
    assert eager.keys() == got.keys()
    # Adam divides each gradient by its own scale: a difference of rounding in a near-zero gradient moves
    # that weight by up to the learning rate's order, so the weights are compared per tensor, at 1e-3
    assert all(relative(got[k], eager[k]) <= 1e-3 for k in eager)
    assert any(not torch.equal(got[k], torch.zeros_like(got[k])) for k in got if "film.B." in k)  # LoRA moved


# -- inductor's kernels ----------------------------------------------------------------------
INDUCTOR_BLOCK = """
import copy, sys
import torch
from torch._dynamo.utils import counters
sys.path.insert(0, sys.argv[1])
from conftest import tiny_base
from workbench.core.compiled import compile_network, compiled_options

torch.set_num_threads(1)
block = tiny_base().denoiser.down_blocks[0]
eager = copy.deepcopy(block)
assert compile_network(block, backend="inductor") and compiled_options(block)["backend"] == "inductor"
g = torch.Generator().manual_seed(4)
hidden, emb = torch.randn(2, 16, 4, 4, 4, generator=g), torch.randn(2, 32, generator=g)  # (B, W, T, h, w)
with torch.no_grad():
    got, expected = block(hidden, emb), eager(hidden, emb)
made = counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"]
print("graphs made by inductor:", made)
print("relative difference:", float((got - expected).abs().max() / expected.abs().max()))
"""


@pytest.mark.skipif(BACKEND != "inductor", reason="inductor's C++ kernels compile only with "
                    "WORKBENCH_COMPILE_TEST_BACKEND=inductor (make bench measures them)")
def test_inductor_kernels_for_a_block_of_tiny_video_give_the_eager_values(tmp_path):
    """inductor, as ``compile: true`` runs it, on one of tiny_video's residual blocks (GroupNorm, SiLU, the
    (2+1)-D convolutions, FiLM from the time embedding): the generated C++ kernels against eager.

    The kernels are built and loaded in a process of their own: a crash in generated code (once seen on a
    fresh machine) then fails this test with its signal and stack instead of ending the test worker, and
    with it the rest of the suite."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run([sys.executable, "-c", INDUCTOR_BLOCK, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert int(lines["graphs made by inductor"]) == 1  # inductor generated the graph's code (compiled it now)
    assert float(lines["relative difference"]) <= 1e-5


# -- the config switch -----------------------------------------------------------------------
def test_compile_true_in_a_config_builds_a_compiled_backbone():
    config = dict(image_size=16, frames=4, width=16, ae_width=8, depth=1, sampling_steps=4)
    torch.manual_seed(0)
    base = build("backbone", "tiny_video", {**config, "compile": True})
    assert base.is_compiled and base.config.compile is True
    torch.manual_seed(0)
    assert not build("backbone", "tiny_video", config).is_compiled


@pytest.mark.parametrize("value, wording", [
    ("yes", "backbone.config.compile: expected bool (true/false), got str 'yes'."),
    (1, "backbone.config.compile: expected bool (true/false), got int 1."),
])
def test_a_compile_value_that_is_not_a_bool_is_refused_with_the_field_and_the_value(value, wording):
    with pytest.raises(ConfigError) as err:
        build("backbone", "tiny_video", {"compile": value})
    assert wording in str(err.value)
    with pytest.raises(ConfigError, match=r"compile: must be true or false \(true runs the backbone's denoiser "
                                          r"through torch.compile\), got str 'yes'"):
        tiny_base(compile="yes")


# -- the plugins -----------------------------------------------------------------------------
PLUGINS = {
    "wan22_ti2v": ({"path": "tiny", "height": 64, "width": 64, "num_frames": 9, "steps": 3, "prompt": PROMPT},
                   lambda g: {"image": torch.rand(1, 3, 64, 64, generator=g) * 2 - 1, "frames": 9}),
    "easyanimate": ({"path": "tiny", "height": 64, "width": 64, "num_frames": 9, "steps": 3, "prompt": PROMPT},
                    lambda g: {"frames": 9}),
    "dynamicrafter": ({"path": "tiny", "variant": "512", "prompt": PROMPT, "steps": 3, "num_frames": 4,
                       "height": 16, "width": 16},
                      lambda g: {"image": torch.rand(1, 3, 16, 16, generator=g) * 2 - 1, "frames": 4}),
}


@requires_plugins
@pytest.mark.parametrize("name", list(PLUGINS))
def test_the_graph_captured_from_each_tiny_plugin_computes_eager_values_and_records_bit_exactly(name, tmp_path_factory,
                                                                                               monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "workbench-cache"))
    config, request = PLUGINS[name]
    base = build("backbone", name, config).compile(backend=BACKEND)
    eager = build("backbone", name, config)
    batch = base.prepare_batch(request(torch.Generator().manual_seed(0)))
    model = ComposedModel(base, ProbeAdapter(), Add(), base.default_objective())
    with torch.no_grad():
        model.adapter.scale.fill_(0.25)  # a composition that changes the result
    net = compile_target(base)
    before = graphs()
    got = sample(model, batch)
    assert graphs() - before >= 1 and compiled_options(net) is not None  # the network ran compiled
    eager_model = ComposedModel(eager, model.adapter, Add(), eager.default_objective())
    expected = sample(eager_model, batch)
    traj, eager_traj = record(model, batch, seed=0), record(eager_model, batch, seed=0)
    assert torch.equal(eager_traj.final, expected)
    # one network call (the first step's base prediction, from the same noise) within 1e-5; the whole sample
    # within 1e-4, as the steps carry the differences on (and guidance multiplies them: 7.5 for dynamicrafter)
    assert relative(list(traj)[0].base, list(eager_traj)[0].base) <= 1e-5
    assert relative(got, expected) <= 1e-4
    assert torch.equal(traj.final, got) and torch.equal(traj.fork(at=1).final, got)
    assert torch.equal(list(traj.fork(at=2))[1].composed, list(traj)[1].composed)
    assert compiled_options(net) is not None  # the sampler's injection was undone: the compiled forward is back
