"""Instruments on plugins loaded in bf16, where the real-size rehearsal found them failing.

* ``recompose`` (ablations) on a recording of EasyAnimate in bf16: the pipeline's latents are bf16,
  the composition runs at the batch's dtype; the recomposed step equals the recorded one bit for bit.
* A ControlNet inside DynamiCrafter's U-Net in bf16: the copied stage's bf16 output reaches the
  float32 zero projections; two fit steps train it.
"""

from __future__ import annotations

import torch
from conftest import requires_plugins

pytestmark = requires_plugins

from workbench import AdapterExperiment, ComposedModel, GatedResidual, TrainingConfig  # noqa: E402
from workbench.config import build  # noqa: E402
from workbench.inspect import Ablation, record  # noqa: E402


def test_an_easyanimate_recording_in_bf16_recomposes_exactly_and_ablates():
    base = build("backbone", "easyanimate", {"path": "tiny", "device": "cpu", "dtype": "bfloat16", "steps": 3,
                                             "height": 64, "width": 64, "num_frames": 9})
    torch.manual_seed(0)
    adapter = build("adapter", "easyanimate_latent_residual", {"channels": 4, "width": 8, "depth": 1, "dim": 4})
    with torch.no_grad():
        for p in adapter.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.02)
    model = ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective())
    g = torch.Generator().manual_seed(0)
    batch = base.prepare_batch({"prompt_embeds": torch.randn(1, 8, 16, generator=g),
                                "negative_prompt_embeds": torch.randn(1, 8, 16, generator=g),
                                "action": torch.rand(1, 9, 4, generator=g), "frames": 9})
    traj = record(model, batch, steps=3, seed=0)
    assert traj[1].x_t.dtype == torch.bfloat16 and batch.latents.dtype == torch.float32
    assert torch.equal(traj.recompose(1).composed, traj[1].composed)
    ablation = Ablation(traj, step=1, condition="action")
    ablation.set(0, 0.9)
    assert ablation.change() > 0 and ablation.evaluations == 1


def test_a_controlnet_inside_dynamicrafter_in_bf16_trains():
    base = build("backbone", "dynamicrafter", {"path": "tiny", "random_weights": True, "device": "cpu",
                                               "dtype": "bfloat16", "prompt": "a robot arm"})
    base.tokenize = lambda prompts: torch.ones(len(prompts), 77, dtype=torch.long)  # no tokenizer files
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        adapter = build("adapter", "controlnet", {"blocks": 1})
    exp = AdapterExperiment(base=base, adapter=adapter,
                            training=TrainingConfig(steps=2, batch_size=1, learning_rate=1e-3, progress=False,
                                                    gradient_checkpointing=True, device="cpu"))
    assert adapter.copies[0][0].in_layers[0].weight.dtype == torch.float32  # a Float32GroupNorm, as in the base
    g = torch.Generator().manual_seed(0)
    data = [{"video": torch.rand(1, 3, 8, 64, 64, generator=g) * 2 - 1, "action": torch.rand(1, 8, 4, generator=g)}]
    exp.fit(data, steps=2)
    assert len(exp.loss_history) == 2 and all(torch.isfinite(torch.tensor(exp.loss_history)))
    assert adapter.projections[0].weight.abs().sum() > 0  # the zero projection moved: gradients reached it
