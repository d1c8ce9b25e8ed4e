"""The diffusers plugins load where ``device`` / ``dtype`` say, and refuse what their mode cannot serve."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import requires_plugins
from test_core_platform import machine  # noqa: F401  (the fixture)

from workbench.config import build
from workbench.errors import CapabilityError

pytestmark = requires_plugins

IMAGE = torch.zeros(1, 3, 64, 64)
PROMPT = "a robot arm pushes a puck"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    import workbench_easyanimate.tiny
    import workbench_wan22.tiny

    root = tmp_path_factory.mktemp("pipelines")
    return {"wan22_ti2v": workbench_wan22.tiny.save_tiny_pipeline(root / "wan"),
            "easyanimate": workbench_easyanimate.tiny.save_tiny_pipeline(root / "easyanimate")}


@pytest.mark.parametrize("name", ["wan22_ti2v", "easyanimate"])
@pytest.mark.parametrize("pretend, device", [("cuda_bf16", "cpu"), ("cpu", "auto")])
def test_a_plugin_backbone_on_the_cpu_is_float32_even_where_cuda_has_bf16(machine, folders, name, pretend,  # noqa: F811
                                                                          device):
    machine(pretend)
    base = build("backbone", name, {"path": str(folders[name]), "device": device})
    assert base.card.precision["cuda"] == "bfloat16"  # what it would take on that GPU
    for module in (base.transformer, base.vae, base.text_encoder):
        assert {(p.device.type, p.dtype) for p in module.parameters()} == {("cpu", torch.float32)}
    assert base.card.components["transformer"].dtype == "float32"


@pytest.mark.parametrize("name, config, raw, message", [
    ("wan22_ti2v", {}, {"prompt": PROMPT, "frames": 9},
     r"wan22_ti2v serves text\+image-to-video \('ti2v'; card capabilities: 'i2v', 't2v', 'ti2v'\), which generates "
     r"from a given first frame, but the request is text only \(keys \['frames', 'prompt'\]\)\. Add 'image' .* The "
     r"mode is first_frame in the backbone config: true = text\+image-to-video, false = text-to-video\."),
    ("wan22_ti2v", {"first_frame": False}, {"image": IMAGE, "prompt": PROMPT, "frames": 9},
     r"wan22_ti2v serves text-to-video \('t2v'.*the request holds 'image': it would be ignored\. Remove 'image', or "
     r"use an image-to-video mode\. The mode is first_frame in the backbone config"),
    ("easyanimate", {}, {"image": IMAGE, "prompt": PROMPT, "frames": 9},
     r"easyanimate serves text-to-video \('t2v'; card capabilities: 't2v'\).*the request holds 'image': it would be "
     r"ignored\. .*For image-to-video use wan22_ti2v \(first_frame: true\)\."),
])
def test_a_request_the_mode_cannot_serve_is_refused_not_ignored(folders, name, config, raw, message):
    base = build("backbone", name, {"path": str(folders[name]), "height": 64, "width": 64, "num_frames": 9,
                                    **config})
    with pytest.raises(CapabilityError, match=message):
        base.prepare_batch(raw)
    with pytest.raises(CapabilityError, match=message):
        base.generate(raw, steps=1, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name, config, raw", [
    ("wan22_ti2v", {}, {"image": IMAGE, "prompt": PROMPT, "frames": 9}),
    ("wan22_ti2v", {"first_frame": False}, {"prompt": PROMPT, "frames": 9}),
    ("easyanimate", {}, {"prompt": PROMPT, "frames": 9}),
])
def test_requests_the_mode_serves_still_pass(folders, name, config, raw):
    base = build("backbone", name, {"path": str(folders[name]), "height": 64, "width": 64, "num_frames": 9, **config})
    assert base.prepare_batch(raw).latents.shape[0] == 1
