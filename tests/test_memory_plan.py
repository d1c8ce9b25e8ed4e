"""The memory plan (``workbench plan``): weights exact, the recording against a real recording's own bytes,
the tracer exact on a module whose saved tensors are known."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_plugins
from torch import nn

from workbench.errors import ConfigError
from workbench.train.memory import ActivationTrace, parse_bytes, trace_saved


def test_parse_bytes_reads_binary_and_decimal_units():
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("24 GB") == 24 * 10**9
    assert parse_bytes("1.5MiB") == 3 * 2**19
    assert parse_bytes(1024) == 1024
    with pytest.raises(ConfigError, match=r"memory '80 gigs': expected a size such as 80GiB, 24GB or 512MiB"):
        parse_bytes("80 gigs")


def test_the_tracer_counts_what_autograd_saves_once_without_the_weights():
    torch.manual_seed(0)
    first, second = nn.Linear(8, 16), nn.Linear(16, 4)
    for p in (*first.parameters(), *second.parameters()):
        p.requires_grad_(False)
    x = torch.randn(3, 8, requires_grad=True)
    model = nn.Sequential(first, nn.ReLU(), second)
    # frozen linears save only their weights (excluded); ReLU saves its output (3 x 16 float32)
    trace = trace_saved(lambda: model(x), blocks=[model[1]], exclude=list(model.parameters()))
    assert trace.total == 3 * 16 * 4
    assert trace.blocks == [3 * 16 * 4] and trace.block_inputs == [3 * 16 * 4]
    second.weight.requires_grad_(True)  # a LoRA-like target: its input is saved too (the ReLU's output, once)
    assert trace_saved(lambda: model(x), exclude=list(model.parameters())).total == 3 * 16 * 4
    first.weight.requires_grad_(True)  # now x itself is saved for first.weight's gradient
    assert trace_saved(lambda: model(x), exclude=list(model.parameters())).total == 3 * 16 * 4 + 3 * 8 * 4


def test_checkpointing_keeps_block_inputs_and_one_block():
    trace = ActivationTrace(total=100, blocks=[30, 40], block_inputs=[5, 6])
    assert trace.checkpointed == 100 - 70 + 11 + 40
    assert ActivationTrace(total=7).checkpointed == 7


def test_attention_is_counted_as_a_fused_kernel_saves_it():
    q = torch.randn(1, 2, 64, 8, requires_grad=True)
    trace = trace_saved(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    # q (once: k and v are the same tensor), the output, and the row log-sum-exp; no 64 x 64 matrix
    assert trace.total == q.numel() * 4 * 2 + 2 * 64 * 4


@requires_plugins
@pytest.mark.parametrize("kind", ["wan22_ti2v", "dynamicrafter"])
def test_the_plan_s_weights_and_recording_match_a_real_build(kind):
    from workbench import ComposedModel, GatedResidual
    from workbench.backbones.random_weights import parameter_bytes
    from workbench.config import build
    from workbench.inspect import StoragePolicy, record
    from workbench.train.memory import memory_plan

    config = {"path": "tiny", "steps": 2, "height": 64, "width": 64,
              "num_frames": 9 if kind == "wan22_ti2v" else 8}
    plan = memory_plan({"type": kind, "config": config}, device="cpu")
    real = build("backbone", kind, {**config, "device": "cpu", "dtype": "float32", "prompt": "a robot arm"})
    assert plan.weights == parameter_bytes(real)
    assert plan.dtype == "float32" and plan.recording_steps == 2
    adapter = build("adapter", "latent_residual", {"channels": plan.latent_shape[0], "width": 8, "depth": 1,
                                                   "dim": 4})
    model = ComposedModel(real, adapter, GatedResidual(), real.default_objective())
    g = torch.Generator().manual_seed(0)
    raw = {"image": torch.rand(1, 3, 64, 64, generator=g) * 2 - 1,
           "action": torch.rand(1, config["num_frames"], 4, generator=g)}
    batch = real.prepare_batch(raw)
    assert tuple(batch.latents.shape[1:]) == plan.latent_shape
    policy = StoragePolicy()
    trajectory = record(model, batch, steps=2, seed=0, storage=policy)
    assert plan.recording_calls == model.base.predictions_per_step(batch) == 2  # both tiny cards guide
    assert "50 steps" not in plan.table() and "2 steps, on the host; 2 predictions a step (guidance)" in plan.table()
    assert plan.as_dict()["recording_predictions_per_step"] == 2
    scalar_slack = 2 * 8 * 2  # t and noise level are counted at 8 bytes each
    # the proof is the real trajectory's bytes (the plan sizes it with estimate_memory, so that is no check)
    assert trajectory.nbytes() <= plan.recording <= trajectory.nbytes() + scalar_slack


def test_workbench_plan_sizes_the_embedded_model_s_example_config(capsys):
    """The embedded model (a weights file, not a diffusers directory) is planned from its config's random init on
    the meta device: its weights are what a real build of the same config holds, its latents what it encodes."""
    from workbench.backbones.random_weights import parameter_bytes
    from workbench.backbones.tiny_video import TinyVideo
    from workbench.cli import main
    from workbench.train.memory import memory_plan

    config = {"image_size": 16, "frames": 8, "width": 16, "ae_width": 8, "depth": 1, "sampling_steps": 8}
    real = TinyVideo(**config)
    plan = memory_plan("examples/configs/tiny.yaml", device="cpu")
    tensors = [*real.parameters(), *real.buffers()]  # (the latent normalisation is stored with the weights)
    assert plan.weights == parameter_bytes(real) == 4 * sum(t.numel() for t in tensors)
    assert plan.latent_shape == tuple(real.encode(torch.zeros(1, 3, 8, 16, 16)).shape[1:]) == (4, 8, 4, 4)
    assert main(["plan", "examples/configs/tiny.yaml", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("memory plan: tiny_video (tiny_video-flow_matching) on cpu (float32)")


@requires_plugins
def test_workbench_plan_prints_the_table(capsys):
    from workbench.cli import main

    assert main(["plan", "examples/configs/wan22.yaml", "--memory", "24GiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory plan: wan22_ti2v (wan2.2-ti2v:wan22-ti2v-tiny-v1) on cuda (bfloat16), 64x64, "
                          "9 frames, latents (48, 3, 4, 4), batch 1")
    for row in ("weights (denoiser + VAE)", "activations, gradient checkpointing", "recording (default StoragePolicy)"):
        assert row in out
    assert "on 24.00 GiB: a step fits without checkpointing, fits with it" in out


def _tiny_guided(kind: str):
    """A tiny plugin backbone with a latent_residual adapter, and a batch for it."""
    from workbench import ComposedModel, GatedResidual
    from workbench.config import build

    g = torch.Generator().manual_seed(0)
    if kind == "easyanimate":
        base = build("backbone", kind, {"path": "tiny", "device": "cpu", "dtype": "float32", "steps": 2,
                                        "height": 64, "width": 64, "num_frames": 9})
        raw = {"prompt_embeds": torch.randn(1, 8, 16, generator=g), "action": torch.rand(1, 9, 4, generator=g),
               "negative_prompt_embeds": torch.randn(1, 8, 16, generator=g), "frames": 9}
    else:
        frames = 9 if kind == "wan22_ti2v" else 8
        base = build("backbone", kind, {"path": "tiny", "steps": 2, "height": 64, "width": 64, "num_frames": frames,
                                        "device": "cpu", "dtype": "float32", "prompt": "a robot arm"})
        raw = {"image": torch.rand(1, 3, 64, 64, generator=g) * 2 - 1, "action": torch.rand(1, frames, 4, generator=g)}
    batch = base.prepare_batch(raw)
    adapter = build("adapter", "latent_residual", {"channels": batch.latents.shape[1], "width": 8, "depth": 1,
                                                   "dim": 4})
    return ComposedModel(base, adapter, GatedResidual(), base.default_objective()), batch


@requires_plugins
@pytest.mark.parametrize("kind, sampler_kwargs, calls", [
    ("wan22_ti2v", {}, 2),
    ("wan22_ti2v", {"guidance_scale": 1.0}, 1),
    ("easyanimate", {}, 2),
    ("dynamicrafter", {}, 2),
    ("dynamicrafter", {"guidance_scale": 1.0}, 1),
    ("dynamicrafter", {"image_guidance_scale": 2.0}, 3),
])
def test_a_guided_recording_is_sized_with_every_call_of_its_steps(kind, sampler_kwargs, calls):
    from workbench.errors import StorageWarning
    from workbench.inspect import StoragePolicy, estimate_memory, record

    model, batch = _tiny_guided(kind)
    assert model.base.predictions_per_step(batch, **sampler_kwargs) == calls
    policy = StoragePolicy()
    expected = estimate_memory(model, batch, steps=2, storage=policy, **sampler_kwargs)
    traj = record(model, batch, steps=2, seed=0, storage=policy, **sampler_kwargs)
    assert [len(entry.calls) for entry in traj.log] == [calls, calls]  # what the sampler really made
    scalar_slack = 2 * 8 * 2  # t and noise level are counted at 8 bytes each
    assert traj.nbytes() <= expected <= traj.nbytes() + scalar_slack
    # a budget between the one-call size and the real size is refused before anything runs
    one_call = estimate_memory(model, batch, steps=2, storage=policy, guidance_scale=1.0)
    if calls > 1:
        assert one_call < expected
        with pytest.warns(StorageWarning, match="over StoragePolicy"):
            record(model, batch, steps=2, seed=0, storage=StoragePolicy(max_bytes=one_call, on_exceed="warn"),
                   **sampler_kwargs)
