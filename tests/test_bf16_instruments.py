"""Instruments on plugins loaded in bf16, where the real-size rehearsal found them failing, and
DynamiCrafter's U-Net under gradient checkpointing (added for the rehearsal's fits).

* ``recompose`` (ablations) on a recording of EasyAnimate in bf16: the pipeline's latents are bf16,
  the composition runs at the batch's dtype; the recomposed step equals the recorded one bit for bit.
* A ControlNet inside DynamiCrafter's U-Net in bf16: the copied stage's bf16 output reaches the
  float32 zero projections; two fit steps train it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import requires_plugins

pytestmark = requires_plugins

from workbench import AdapterExperiment, ComposedModel, GatedResidual, Replace, TrainingConfig  # noqa: E402
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
    assert ablation.change() == 0  # unedited: no change, although the sampler's own x0 mixes guidance branches
    ablation.set(0, 0.9)
    assert ablation.change() > 0 and ablation.evaluations == 2


def test_a_controlnet_inside_dynamicrafter_in_bf16_trains():
    base = build("backbone", "dynamicrafter", {"path": "tiny", "random_weights": True, "device": "cpu",
                                               "dtype": "bfloat16", "prompt": "a robot arm"})
    base.tokenize = lambda prompts: torch.ones(len(prompts), 77, dtype=torch.long)  # no tokenizer files
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        adapter = build("adapter", "controlnet", {"blocks": 1})
    exp = AdapterExperiment(base=base, adapter=adapter,
                            training=TrainingConfig(steps=1, batch_size=1, learning_rate=1e-3, progress=False,
                                                    gradient_checkpointing=True, device="cpu"))
    assert adapter.copies[0][0].in_layers[0].weight.dtype == torch.float32  # a Float32GroupNorm, as in the base
    g = torch.Generator().manual_seed(0)
    data = [{"video": torch.rand(1, 3, 8, 64, 64, generator=g) * 2 - 1, "action": torch.rand(1, 8, 4, generator=g)}]
    exp.fit(data, steps=1)  # (one step in emulated bf16 is seconds on a CPU without AVX-512)
    assert len(exp.loss_history) == 1 and all(torch.isfinite(torch.tensor(exp.loss_history)))
    assert adapter.projections[0].weight.abs().sum() > 0  # the zero projection moved: gradients reached it


def loss_and_saved(model, batch) -> tuple[torch.Tensor, int]:
    """A training loss and the elements autograd saved for its backward."""
    count = [0]

    def pack(t):
        count[0] += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = model.training_loss(batch, generator=torch.Generator().manual_seed(0), step=0)
    return loss, count[0]


@pytest.mark.parametrize(("name", "config"), [("lora", {"rank": 2}), ("action_modulation", {"hidden": 8}),
                                              ("controlnet", {"blocks": 1})])
def test_dynamicrafter_s_unet_checkpoints_its_stages_with_the_same_gradients(name, config):
    grads, saved = [], []
    for checkpointing in (False, True):
        base = build("backbone", "dynamicrafter", {"path": "tiny", "random_weights": True, "device": "cpu",
                                                   "prompt": "a robot arm"})
        base.tokenize = lambda prompts: torch.ones(len(prompts), 77, dtype=torch.long)
        if checkpointing:
            base.model.unet.enable_gradient_checkpointing()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            model = ComposedModel(base, build("adapter", name, config), Replace(), base.default_objective()).train()
            for p in model.trainable_parameters():
                if p.abs().sum() == 0:
                    p.normal_(0, 0.1)  # open zero-initialised outputs, so gradients reach everything
        g = torch.Generator().manual_seed(0)
        batch = base.prepare_batch({"video": torch.rand(1, 3, 8, 64, 64, generator=g) * 2 - 1,
                                    "action": torch.rand(1, 8, 4, generator=g)})
        loss, kept = loss_and_saved(model, batch)
        loss.backward()
        grads.append([p.grad.clone() for p in model.trainable_parameters()])
        saved.append(kept)
    plain, checkpointed = grads
    assert all(g.abs().sum() > 0 for g in plain)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(plain, checkpointed, strict=True))
    assert saved[1] < saved[0] / 2  # the stages' activations are not kept
