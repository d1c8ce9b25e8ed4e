"""Real-weights checks for the backbone plugins, behind an environment variable per checkpoint.

    WORKBENCH_WAN22_CHECKPOINT=/models/Wan2.2-TI2V-5B-Diffusers pytest tests/test_plugin_real_weights.py
    WORKBENCH_EASYANIMATE_CHECKPOINT=/models/EasyAnimateV5.1-12b-zh-diffusers pytest tests/test_plugin_real_weights.py

Each checkpoint (a diffusers-format directory) gets: every weight in its safetensors files loaded
into the module that owns it, one denoise step, identity at init, one training step that leaves
the transformer, VAE and text encoder bit-identical, and a short generation equal to diffusers'
own pipeline bit for bit. They run on CUDA when present, in the card's precision (bf16), at a
reduced resolution. Without the variable they skip, naming it. The same checks always run on the
tiny random pipelines in bf16 on CPU, so this path is exercised even where no checkpoint is.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import requires_plugins

pytestmark = requires_plugins

from workbench import AdapterExperiment, ComposedModel, GatedResidual, TrainingConfig  # noqa: E402
from workbench.config import build  # noqa: E402


@dataclass(frozen=True)
class Case:
    backbone: str
    adapter: str
    variable: str  # the environment variable naming the checkpoint; None for the tiny pipelines
    tiny: str | None  # the module building the tiny pipeline
    size: tuple[int, int, int]  # (frames, height, width) of the short clips
    channels: int


REAL = [
    Case("wan22_ti2v", "wan22_latent_residual", "WORKBENCH_WAN22_CHECKPOINT", None, (9, 256, 256), 48),
    Case("easyanimate", "easyanimate_latent_residual", "WORKBENCH_EASYANIMATE_CHECKPOINT", None, (9, 256, 256), 16),
]
TINY = [
    Case("wan22_ti2v", "wan22_latent_residual", "", "workbench_wan22.tiny", (9, 64, 64), 48),
    Case("easyanimate", "easyanimate_latent_residual", "", "workbench_easyanimate.tiny", (9, 64, 64), 4),
]
CASES = [pytest.param(c, id=f"{c.backbone}-real") for c in REAL] + \
        [pytest.param(c, id=f"{c.backbone}-tiny-bf16") for c in TINY]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module", params=CASES)
def loaded(request, tmp_path_factory):
    """``(case, base, path)``: the backbone on the device, in bf16."""
    case = request.param
    if case.tiny is None:
        path = os.environ.get(case.variable)
        if not path:
            pytest.skip(f"{case.variable} is not set: point it at a diffusers-format {case.backbone} checkpoint "
                        f"directory (model_index.json) to run the real-weights checks")
    else:
        path = tmp_path_factory.mktemp(case.backbone) / "pipe"
        __import__(case.tiny, fromlist=["save_tiny_pipeline"]).save_tiny_pipeline(path)
    frames, height, width = case.size
    base = build("backbone", case.backbone, {"path": str(path), "dtype": "bfloat16", "num_frames": frames,
                                             "height": height, "width": width, "steps": 4,
                                             "prompt": "a robot arm pushes a red block across a table"})
    base.to(DEVICE)
    yield case, base, Path(path)
    del base
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


def clips(case: Case, batch: int = 1, seed: int = 0) -> dict:
    frames, height, width = case.size
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.rand(batch, 3, frames, height, width, generator=g) * 2 - 1,
            "action": torch.rand(batch, frames, 4, generator=g) * 2 - 1}


def adapter(case: Case):
    return build("adapter", case.adapter, {"channels": case.channels, "width": 32, "depth": 1})


def fingerprint(module: torch.nn.Module) -> str:
    """A hash of every parameter's and buffer's bytes (bit-exact comparison without a second copy)."""
    h = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        value = value.detach().to("cpu").contiguous()
        h.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        h.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_every_weight_in_the_checkpoint_is_loaded(loaded):
    """Each component, loaded on its own with its library's loading report, has no missing, unexpected
    or mismatched weights, and the plugin's module holds exactly those weights."""
    case, base, path = loaded
    for name in ("transformer", "vae", "text_encoder"):
        module = getattr(base, name)
        reference, info = type(module).from_pretrained(str(path), subfolder=name, dtype=module.dtype,
                                                       output_loading_info=True)
        problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        assert problems == {}, f"{name}: {problems}"
        assert fingerprint(reference) == fingerprint(module), f"{name}: the plugin's weights differ from the files"
        del reference


def test_one_denoise_step_and_identity_at_init(loaded):
    case, base, _ = loaded
    model = ComposedModel(base, adapter(case).to(DEVICE), GatedResidual(), base.default_objective()).train()
    batch = base.prepare_batch(clips(case))
    x_t, t, _ = model.noised(batch, torch.Generator(device=DEVICE).manual_seed(0))
    pred = model.predict(x_t, t, batch, step=0)
    assert pred.base.shape == batch.latents.shape and torch.isfinite(pred.base).all()
    assert torch.equal(pred.composed, pred.base)


def test_one_training_step_trains_the_adapter_only(loaded):
    case, base, _ = loaded
    before = {name: fingerprint(getattr(base, name)) for name in ("transformer", "vae", "text_encoder")}
    exp = AdapterExperiment(base=base, adapter=adapter(case), composer=GatedResidual(),
                            training=TrainingConfig(batch_size=1, learning_rate=1e-3, progress=False, device="auto"))
    start = fingerprint(exp.model.adapter)
    exp.fit([clips(case, seed=1)], steps=1)
    assert exp.step == 1 and all(torch.isfinite(torch.tensor(exp.loss_history)))
    assert fingerprint(exp.model.adapter) != start
    assert {name: fingerprint(getattr(base, name)) for name in before} == before


def test_a_short_generation_matches_the_diffusers_pipeline(loaded):
    case, base, _ = loaded
    frames, height, width = case.size
    raw = {"prompt": "a robot arm pushes a red block across a table", "frames": frames, "height": height,
           "width": width, "action": torch.zeros(1, frames, 4)}
    if case.backbone == "wan22_ti2v":
        raw["image"] = clips(case)["video"][:, :, 0]
    model = ComposedModel(base, adapter(case).to(DEVICE), GatedResidual(), base.default_objective())
    ours = model.generate(raw, steps=4, generator=torch.Generator(device=DEVICE).manual_seed(0))
    pipe = base.pipelines["i2v"] if case.backbone == "wan22_ti2v" else base.pipeline  # the same modules, unwrapped
    kwargs = dict(prompt=raw["prompt"], negative_prompt="", height=height, width=width, num_frames=frames,
                  num_inference_steps=4, guidance_scale=base.card.sampling.guidance_scale,
                  generator=torch.Generator(device=DEVICE).manual_seed(0), output_type="latent")
    if case.backbone == "wan22_ti2v":
        kwargs.update(image=(raw["image"].to(DEVICE) + 1) / 2, max_sequence_length=base.config.max_sequence_length)
    upstream = pipe(**kwargs).frames
    assert torch.equal(ours, upstream.to(ours.dtype))
    video = base.decode(ours)
    assert video.shape == (1, 3, frames, height, width) and torch.isfinite(video).all()
