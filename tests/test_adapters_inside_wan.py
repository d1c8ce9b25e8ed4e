"""Adapters inside the frozen base on the tiny Wan2.2 TI2V pipeline (the real diffusers classes).

Identity at init, the frozen transformer after training, generation through diffusers' own
pipeline, the diffusers round trip of an exported LoRA (bit-exact), ControlNet under gradient
checkpointing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import requires_plugins

pytestmark = requires_plugins

from workbench import AdapterExperiment, ComposedModel, Replace, TrainingConfig  # noqa: E402
from workbench.config import build  # noqa: E402
from workbench.errors import ConfigError  # noqa: E402

PROMPT = "a robot arm pushes a puck"
KINDS = {
    "lora": ("lora", {"rank": 2}),
    "action_modulation": ("action_modulation", {"hidden": 8, "lora": {"rank": 2}}),
    "controlnet": ("controlnet", {"blocks": 1}),
}
ALL = pytest.mark.parametrize("kind", list(KINDS))


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory) -> Path:
    import workbench_wan22.tiny

    return workbench_wan22.tiny.save_tiny_pipeline(tmp_path_factory.mktemp("wan") / "tiny")


def load(folder: Path):
    return build("backbone", "wan22_ti2v", {"path": str(folder), "height": 64, "width": 64, "num_frames": 9,
                                            "steps": 4, "prompt": PROMPT})


def inside(kind: str, seed: int = 1):
    name, config = KINDS[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build("adapter", name, config)


def clips(batch: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.rand(batch, 3, 9, 64, 64, generator=g) * 2 - 1,
            "action": torch.rand(batch, 9, 4, generator=g) * 2 - 1, "prompt": PROMPT}


def generation_input(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"prompt": PROMPT, "action": torch.rand(1, 9, 4, generator=g) * 2 - 1,
            "image": torch.rand(1, 3, 64, 64, generator=g) * 2 - 1}


def experiment(kind: str, folder: Path, **training) -> AdapterExperiment:
    defaults = dict(steps=4, learning_rate=5e-2, batch_size=2, progress=False)
    return AdapterExperiment(base=load(folder), adapter=inside(kind),
                             training=TrainingConfig(**{**defaults, **training}))


def plain_generate(folder: Path, raw: dict, seed: int, lora: Path | None = None) -> torch.Tensor:
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(str(lora))
    return pipe(prompt=raw["prompt"], negative_prompt="", image=(raw["image"] + 1) / 2, height=64, width=64,
                num_frames=9, num_inference_steps=4, guidance_scale=5.0, generator=torch.Generator().manual_seed(seed),
                output_type="latent").frames


DATA = [clips(seed=i) for i in range(2)]


@ALL
def test_identity_at_init_and_a_frozen_transformer_after_training(kind, wan_dir):
    exp = experiment(kind, wan_dir)
    fresh = load(wan_dir)
    batch = exp.prepare(clips(seed=5))
    x_t, t, _ = exp.model.noised(batch, torch.Generator().manual_seed(2))
    with torch.no_grad():
        pred = exp.model.train(False).predict(x_t, t, batch)
        frozen = fresh.denoise(x_t, t, batch.cond)
    assert torch.equal(pred.composed, frozen) and torch.equal(pred.base, frozen)
    own = [p for p in exp.model.base.parameters() if not p.requires_grad]
    before = [p.detach().clone() for p in own]
    exp.fit(DATA, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(before, own))
    assert set(map(id, exp.optimizer.state)) == {id(p) for p in exp.model.adapter.parameters()}
    with torch.no_grad():
        moved = exp.model.predict(x_t, t, batch)
    assert torch.equal(moved.base, frozen) and not torch.equal(moved.composed, frozen)


@pytest.mark.parametrize("kind", ["action_modulation", "controlnet"])
def test_generate_at_init_is_diffusers_own_pipeline(kind, wan_dir):
    base = load(wan_dir)
    model = ComposedModel(base, inside(kind), Replace(), base.default_objective())
    raw = generation_input()
    ours = model.generate(raw, steps=4, generator=torch.Generator().manual_seed(7), guidance_scale=5.0)
    assert torch.equal(ours, plain_generate(wan_dir, raw, seed=7))


def test_an_exported_lora_generates_the_same_video_in_a_plain_diffusers_pipeline(wan_dir, tmp_path):
    exp = experiment("lora", wan_dir)
    exp.fit(DATA, steps=2)
    out = exp.export_lora(tmp_path / "lora")
    assert (out / "pytorch_lora_weights.safetensors").is_file()
    raw = generation_input(seed=3)
    ours = exp.model.generate(raw, steps=4, generator=torch.Generator().manual_seed(11), guidance_scale=5.0)
    base_only = plain_generate(wan_dir, raw, seed=11)
    theirs = plain_generate(wan_dir, raw, seed=11, lora=out)
    assert not torch.equal(ours, base_only)  # the LoRA changes the video...
    assert torch.equal(ours, theirs)  # ...exactly as diffusers applies it


def test_a_lora_from_diffusers_or_peft_is_a_starting_point(wan_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    exp = experiment("lora", wan_dir)
    exp.fit(DATA, steps=1)
    out = exp.export_lora(tmp_path / "diffusers")
    trained = exp.model.adapter.lora.peft_state_dict()
    peft_file = tmp_path / "peft" / "adapter_model.safetensors"
    peft_file.parent.mkdir()
    save_file({k.replace("transformer.", "base_model.model.", 1): v
               for k, v in load_file(str(out / "pytorch_lora_weights.safetensors")).items()}, str(peft_file))
    for source in (out, peft_file):
        started = build("adapter", "lora", {"rank": 2, "init_from": str(source)})
        ComposedModel(base := load(wan_dir), started, Replace(), base.default_objective())
        loaded = started.lora.peft_state_dict()
        assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)


def test_wan_defaults_and_refusals(wan_dir):
    base = load(wan_dir)
    model = ComposedModel(base, inside("lora"), Replace(), base.default_objective())
    names = sorted(model.adapter.lora.layers)
    assert names == sorted(f"blocks-{i}-{attn}-{m}" for i in range(2) for attn in ("attn1", "attn2")
                           for m in ("to_q", "to_k", "to_v", "to_out-0"))  # self- and cross-attention
    with pytest.raises(ConfigError, match=r"controlnet blocks: 3 is more than Wan22TI2V has to copy: its first 2 "
                                          r"blocks"):
        ComposedModel(base := load(wan_dir), build("adapter", "controlnet", {"blocks": 3}), Replace(),
                      base.default_objective())
    with pytest.raises(ConfigError, match=r"'to_qq' \(did you mean 'to_q'.*\) match no layer of Wan22TI2V\. .*"
                                          r"'to_out\.0'"):
        ComposedModel(base := load(wan_dir), build("adapter", "lora", {"targets": ["to_qq"]}), Replace(),
                      base.default_objective())


def test_controlnet_trains_the_same_under_gradient_checkpointing(wan_dir):
    grads = []
    for checkpointing in (False, True):
        base = load(wan_dir)
        if checkpointing:
            base.transformer.enable_gradient_checkpointing()
        torch.manual_seed(0)
        model = ComposedModel(base, inside("controlnet"), Replace(), base.default_objective()).train()
        with torch.no_grad():
            for p in model.adapter.projections.parameters():
                p.normal_(0, 0.1)  # open the branch, so gradients reach the copy
        batch = base.prepare_batch(clips())
        loss, _ = model.training_loss(batch, generator=torch.Generator().manual_seed(0), step=0)
        loss.backward()
        grads.append([p.grad.clone() for p in model.trainable_parameters()])
    plain, checkpointed = grads
    assert all(g.abs().sum() > 0 for g in plain[:3])
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(plain, checkpointed))


def test_resume_is_bit_exact_on_wan(wan_dir, tmp_path):
    full = experiment("action_modulation", wan_dir)
    full.fit(DATA, steps=3)
    part = experiment("action_modulation", wan_dir, output_dir=str(tmp_path))
    part.fit(DATA, steps=1)
    path = part.save_checkpoint()
    resumed = experiment("action_modulation", wan_dir).load_checkpoint(path)
    resumed.fit(DATA, steps=2)
    assert resumed.loss_history == full.loss_history
    a, b = resumed.model.trainable_state_dict(), full.model.trainable_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the run records the pipeline directory it was trained on: each file's SHA-256 and path, sorted by path
    files = sorted(p for p in wan_dir.rglob("*") if p.is_file() and not any(name.startswith(".") for name in
                                                                            p.relative_to(wan_dir).parts))
    listing = "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(wan_dir).as_posix()}\n"
                      for f in files)
    assert json.loads((path / "meta.json").read_text())["base"] == {
        "sha256": hashlib.sha256(listing.encode()).hexdigest(),
        "covers": f"the {len(files)} files of the directory {wan_dir.name}/"}


@ALL
def test_each_kind_keeps_the_inside_adapter_promises_on_wan(kind, wan_dir):
    """``workbench.testing.check_inside_adapter`` on the tiny Wan2.2: identity at init, the transformer switched
    off after training, its own tensors untouched and out of the optimizer, recorded == unrecorded (both
    guidance branches through the adapted transformer)."""
    from workbench.testing import check_inside_adapter

    report = check_inside_adapter(lambda: load(wan_dir), lambda: inside(kind), raw=clips(), steps=2)
    assert report.ok and report["recording"].detail == "2 steps, 4 base calls per step recorded (2 sampling), bit-exact"
