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
