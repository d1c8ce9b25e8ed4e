"""ModelCard validation and the recipe's sampler assumptions."""

from __future__ import annotations

import pytest
import torch
from conftest import ToyBackbone, tiny_base

from workbench import ComponentSpec, ModelCard, SamplingDefaults
from workbench.core.card import RecipeSpec
from workbench.errors import CardError, SamplerMismatchError


def card(**kw):
    base = dict(model_id="m", family="f", prediction_type="velocity",
                components={"denoiser": ComponentSpec("denoiser")}, capabilities=("ti2v",))
    return ModelCard(**{**base, **kw})


@pytest.mark.parametrize("kwargs, message", [
    (dict(prediction_type="velocty"), "prediction_type='velocty'; allowed: 'eps', 'v', 'velocity', 'x0'. "
                                      "Did you mean 'velocity'?"),
    (dict(components={}), "components is empty"),
    (dict(components={"dit": ComponentSpec("transformer")}), "components\\['dit'\\].kind='transformer'"),
    (dict(components={"dit": ComponentSpec("denoiser", source="")}), "source is empty"),
    (dict(capabilities=("tiv2",)), "capability 'tiv2' is unknown.*Did you mean 'ti2v'"),
    (dict(precision={"cuda": "bf16"}), "precision\\['cuda'\\]='bf16'"),
    (dict(sampling=SamplingDefaults(steps=0)), "sampling.steps=0; must be a positive int"),
    (dict(sampling=SamplingDefaults(sampler="ddim")), "sampling.sampler='ddim' is not one of the card's samplers"),
    (dict(sampling=SamplingDefaults(steps=50), recipe=RecipeSpec(method="dmd2", assumes_steps=4)),
     "sampling.steps=50 contradicts recipe.assumes_steps=4"),
    (dict(recipe=RecipeSpec(assumes_sampler="lcm")), "recipe.assumes_sampler='lcm' is not a sampler"),
    (dict(sampling=SamplingDefaults(height=-1)), "sampling.height=-1"),
    (dict(context_frames=-1), "context_frames=-1; must be an int >= 0"),
    (dict(context_frames=4, sampling=SamplingDefaults(num_frames=4)),
     "context_frames=4 leaves no new frame in a clip of sampling.num_frames=4"),
])
def test_card_validation_failures(kwargs, message):
    with pytest.raises(CardError, match=message):
        card(**kwargs)


def test_all_problems_reported_together():
    with pytest.raises(CardError) as info:
        card(prediction_type="?", components={}, capabilities=("x",))
    assert "(3 problems)" in str(info.value)


def test_distilled_recipe_refuses_other_step_counts():
    distilled = card(sampling=SamplingDefaults(steps=4),
                     recipe=RecipeSpec(method="dmd2", assumes_steps=4, assumes_sampler="euler"))
    assert distilled.resolve_steps(None) == (4, "euler")
    with pytest.raises(SamplerMismatchError) as info:
        distilled.resolve_steps(50)
    assert "made with recipe 'dmd2' for exactly 4 sampling steps; 50 were requested" in str(info.value)
    assert "Use steps=4" in str(info.value)
    with pytest.raises(SamplerMismatchError, match="Sampler 'ddim' requested for 'm', which runs 'euler'"):
        distilled.resolve_steps(4, "ddim")


def test_backbone_generate_checks_the_card_before_compute():
    base = ToyBackbone()
    object.__setattr__(base, "card", card(sampling=SamplingDefaults(steps=4), recipe=RecipeSpec(assumes_steps=4)))
    with pytest.raises(SamplerMismatchError):
        base.generate({"latents": torch.zeros(1, 4, 2, 2, 2)}, steps=50)
    assert base.calls == 0


def test_tiny_video_card_describes_the_model():
    base = tiny_base()
    c = base.card
    assert c.family == "tiny_video" and c.prediction_type == "velocity"
    assert c.capabilities == ("i2v",) and c.sampling.sampler == "euler"
    assert c.components["denoiser"].parameters == sum(p.numel() for p in base.denoiser.parameters())
    ddim = tiny_base(objective="diffusion", prediction="v")
    assert ddim.card.prediction_type == "v" and ddim.card.samplers == ("ddim",)


# -- precision per device, and the mode a backbone serves ----------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(precision={"gpu": "bfloat16"}), r"precision has a key 'gpu', not a device type; allowed: 'cpu', 'cuda', "
                                          r"'mps'\."),
    (dict(precision={"cuda": ()}), r"precision\['cuda'\]=\(\); give a dtype or a non-empty list of them, best first"),
    (dict(precision={"cuda": ("bfloat16", "fp8")}), r"precision\['cuda'\]='fp8'; allowed: 'bfloat16'"),
    (dict(capabilities=("t2v", "ti2v"), mode="i2v"), r"mode='i2v' is not one of the card's capabilities 't2v', "
                                                     r"'ti2v'"),
])
def test_precision_and_mode_are_validated(kwargs, message):
    with pytest.raises(CardError, match=message):
        card(**kwargs)


def test_precision_lists_preferences_per_device():
    c = card(precision={"cpu": "float32", "cuda": ("bfloat16", "float16")})
    assert (c.dtype_for("cuda"), c.dtype_for("cpu"), c.dtype_for("mps")) == ("bfloat16", "float32", "float32")
    assert card(capabilities=("t2v", "ti2v")).serving is None
    assert card(capabilities=("t2v", "ti2v"), mode="t2v").serving == "t2v"
    assert card(capabilities=("i2v",)).serving == "i2v"


IMAGE = torch.zeros(1, 3, 8, 8)


@pytest.mark.parametrize("mode, raw, message", [
    ("i2v", {"image": IMAGE, "prompt": "a robot"},
     r"m serves image-to-video \('i2v'; card capabilities: 'i2v', 't2v', 'ti2v'\), which reads no text, but the "
     r"request holds 'prompt': it would be ignored\. Remove it, or use a backbone or mode that reads text\. FIX$"),
    ("t2v", {"image": IMAGE, "prompt": "a robot"},
     r"m serves text-to-video \('t2v'.*which generates without a given first frame, but the request holds 'image': "
     r"it would be ignored\. Remove 'image', or use an image-to-video mode\. FIX$"),
    ("ti2v", {"prompt": "a robot", "frames": 9},
     r"m serves text\+image-to-video \('ti2v'.*which generates from a given first frame, but the request is text only "
     r"\(keys \['frames', 'prompt'\]\)\. Add 'image' \(B, 3, H, W\) in \[-1, 1\], or use a text-to-video mode\. FIX$"),
    ("ti2v", {"prompt_embeds": torch.zeros(1, 2, 3)}, r"the request is text only \(keys \['prompt_embeds'\]\)"),
])
def test_a_request_the_mode_cannot_serve_is_refused(mode, raw, message):
    from workbench.errors import CapabilityError, DataError

    c = card(capabilities=("t2v", "i2v", "ti2v"), mode=mode)
    with pytest.raises(CapabilityError, match=message) as info:
        c.check_request(raw, backbone="m", fix="FIX")
    assert isinstance(info.value, DataError)  # callers catching data errors still catch it


@pytest.mark.parametrize("mode, raw", [
    ("i2v", {"image": IMAGE}), ("i2v", {"video": IMAGE[:, :, None], "task": "push"}),
    ("i2v", {"video": IMAGE[:, :, None], "prompt": "push"}),  # a training clip's task text (LeRobot) is data
    ("t2v", {"prompt": "a robot"}), ("t2v", {"video": IMAGE[:, :, None], "prompt": None, "image": None}),
    ("ti2v", {"image": IMAGE, "prompt": "x"}), ("ti2v", {"video": IMAGE[:, :, None], "prompt": "x"}),
    ("ti2v", {"image": IMAGE}),  # the text may come from the backbone's default prompt
])
def test_requests_the_mode_serves_pass(mode, raw):
    card(capabilities=("t2v", "i2v", "ti2v"), mode=mode).check_request(raw, backbone="m")


def test_tiny_video_refuses_text_it_would_ignore():
    from workbench.errors import CapabilityError

    base = tiny_base()
    with pytest.raises(CapabilityError, match=r"tiny_video serves image-to-video \('i2v'; card capabilities: 'i2v'\), "
                                              r"which reads no text, but the request holds 'prompt'.*tiny_video "
                                              r"conditions on the first frame only"):
        base.prepare_batch({"image": torch.zeros(1, 3, 16, 16), "prompt": "push the puck"})
    assert base.prepare_batch({"image": torch.zeros(1, 3, 16, 16), "task": "push"}).latents.shape[0] == 1
