"""Adapters inside the frozen base on the tiny EasyAnimate pipeline (the real diffusers classes).

EasyAnimate declares where inside adapters reach through the contract's ``inside_spec()`` alone:
its MMDiT blocks (video tokens; each block hands the text stream on to the next), LoRA on the
video stream's attention. The inside-adapter promises, a ControlNet branch that carries the text
stream from block to block as the transformer does, and an exported LoRA that a plain diffusers
pipeline loads (through peft: diffusers has no LoRA loader for EasyAnimate) and generates the same
video with.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import requires_plugins

pytestmark = requires_plugins

from workbench import AdapterExperiment, ComposedModel, Replace, TrainingConfig  # noqa: E402
from workbench.config import build  # noqa: E402

PROMPT = "a robot arm pushes a puck"
KINDS = {
    "lora": ("lora", {"rank": 2}),
    "action_modulation": ("action_modulation", {"hidden": 8, "lora": {"rank": 2}}),
    "controlnet": ("controlnet", {"blocks": 2}),
}


@pytest.fixture(scope="session")
def easy_dir(tmp_path_factory) -> Path:
    import workbench_easyanimate.tiny

    return workbench_easyanimate.tiny.save_tiny_pipeline(tmp_path_factory.mktemp("easyanimate") / "tiny")


def load(folder: Path):
    return build("backbone", "easyanimate", {"path": str(folder), "height": 64, "width": 64, "num_frames": 9,
                                             "steps": 3, "prompt": PROMPT})


def inside(kind: str, seed: int = 1):
    name, config = KINDS[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build("adapter", name, config)


def clips(batch: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.rand(batch, 3, 9, 64, 64, generator=g) * 2 - 1,
            "action": torch.rand(batch, 9, 4, generator=g) * 2 - 1, "prompt": PROMPT}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_keeps_the_inside_adapter_promises_on_easyanimate(kind, easy_dir):
    """Identity at init, the transformer switched off after training, its own tensors untouched and out of the
    optimizer, recorded == unrecorded with both halves of the doubled guidance batch adapted (each half is one
    composed prediction)."""
    from workbench.testing import check_inside_adapter

    report = check_inside_adapter(lambda: load(easy_dir), lambda: inside(kind), raw=clips(), steps=2)
    assert report.ok and report["recording"].detail == "2 steps, 4 base calls per step recorded (2 sampling), bit-exact"


def test_the_spec_is_the_contracts_and_lora_targets_the_video_stream(easy_dir):
    from workbench import InsideSpec

    base = load(easy_dir)
    spec = base.inside_spec()
    assert isinstance(spec, InsideSpec) and spec.layout == "tokens" and spec.root is base.transformer
    assert spec.blocks == tuple(base.transformer.transformer_blocks) and spec.widths == (32, 32)
    model = ComposedModel(base, inside("lora"), Replace(), base.default_objective())
    assert sorted(model.adapter.lora.layers) == sorted(f"transformer_blocks-{i}-attn1-{m}" for i in range(2)
                                                       for m in ("to_q", "to_k", "to_v", "to_out-0"))


def test_a_controlnet_chain_hands_the_text_stream_on_as_the_transformer_does(easy_dir):
    """With the condition's embedding at zero, the copied chain computes exactly what the base's first blocks do:
    the second copy sees the text stream the first one returned, not the transformer's input text."""
    base = load(easy_dir)
    model = ComposedModel(base, inside("controlnet"), Replace(), base.default_objective()).eval()
    with torch.no_grad():
        model.adapter.embed.weight.zero_()
        model.adapter.embed.bias.zero_()
    seen: dict[str, list] = {"base": [], "copy": []}
    hooks = [b.register_forward_hook(lambda m, a, out: seen["base"].append(out[0].clone()))
             for b in base.transformer.transformer_blocks]
    hooks += [c.register_forward_hook(lambda m, a, out: seen["copy"].append(out[0].clone()))
              for c in model.adapter.copies]
    batch = base.prepare_batch(clips())
    x_t, t, _ = model.noised(batch, torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.predict(x_t, t, batch)
    for h in hooks:
        h.remove()
    # the base's blocks run twice (switched off, then adapted); the copies once, inside the adapted run
    assert len(seen["copy"]) == 2 and len(seen["base"]) == 4
    assert all(torch.equal(c, b) for c, b in zip(seen["copy"], seen["base"][2:]))


def test_an_exported_lora_generates_the_same_video_in_a_plain_diffusers_pipeline(easy_dir, tmp_path):
    from diffusers import EasyAnimatePipeline
    from workbench_easyanimate.lora import load_lora

    exp = AdapterExperiment(base=load(easy_dir), adapter=inside("lora"),
                            training=TrainingConfig(steps=2, learning_rate=5e-2, batch_size=2, progress=False))
    exp.fit([clips(seed=0), clips(seed=1)], steps=2)
    out = exp.export_lora(tmp_path / "lora")
    assert (out / "pytorch_lora_weights.safetensors").is_file()
    request = {"prompt": PROMPT, "frames": 9, "height": 64, "width": 64}
    ours = exp.model.generate(request, steps=3, generator=torch.Generator().manual_seed(5), guidance_scale=6.0)

    def plain(lora: Path | None) -> torch.Tensor:
        pipe = EasyAnimatePipeline.from_pretrained(str(easy_dir))
        pipe.set_progress_bar_config(disable=True)
        if lora is not None:
            load_lora(pipe, lora)
        return pipe(prompt=PROMPT, negative_prompt="", height=64, width=64, num_frames=9, num_inference_steps=3,
                    guidance_scale=6.0, generator=torch.Generator().manual_seed(5), output_type="latent").frames

    assert not torch.equal(ours, plain(None))  # the LoRA changes the video...
    assert torch.equal(ours, plain(out))  # ...exactly as peft applies it to diffusers' transformer
