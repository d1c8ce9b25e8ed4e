"""Parity of the ``dynamicrafter`` plugin with the upstream implementation at its pinned commit.

``plugins/dynamicrafter/tests/fixtures/parity.safetensors`` holds inputs and the upstream code's
outputs on tiny random weights (``PARITY_SIZES``, seed 0, the official key layout); it was made by
``plugins/dynamicrafter/scripts/make_parity_fixture.py`` (provenance in ``parity.json``). Here the
same weights are rebuilt from the seed, loaded through ``from_checkpoint``, and every piece is
compared: the error is the largest absolute difference over the reference's largest value.

    python tests/test_plugin_dynamicrafter_parity.py     # prints the error of every component
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "plugins" / "dynamicrafter" / "tests" / "fixtures"
TOLERANCE = 1e-4

try:
    import workbench_dynamicrafter  # noqa: F401

    INSTALLED = True
except ImportError:
    INSTALLED = False
pytestmark = pytest.mark.skipif(not INSTALLED, reason="workbench-dynamicrafter is not installed")


@lru_cache(maxsize=1)
def fixture() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(FIXTURES / "parity.safetensors"))


@lru_cache(maxsize=3)
def model(variant: str):
    from workbench_dynamicrafter.checkpoint import upstream_shapes
    from workbench_dynamicrafter.model import DynamiCrafterModel, from_checkpoint
    from workbench_dynamicrafter.reference import PARITY_SIZES, random_state
    from workbench_dynamicrafter.variants import get_variant, schedule_buffers

    v = get_variant(variant)
    with torch.device("meta"):
        meta = DynamiCrafterModel(v, v.sizes.replace(**PARITY_SIZES))
    seed = json.loads((FIXTURES / "parity.json").read_text())["seed"]
    state = random_state(upstream_shapes(meta), seed)
    state.update(schedule_buffers(v))
    return from_checkpoint(state, variant, **PARITY_SIZES)


def error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    return float((ours.double() - reference.double()).abs().max() / reference.double().abs().max())


def sample(variant: str) -> torch.Tensor:
    """The recipe the fixture ran, through our model's callables and our DDIM loop."""
    from workbench_dynamicrafter.sampling import DDIMTables, ddim_loop

    from workbench import Batch

    recipe = json.loads((FIXTURES / "parity.json").read_text())["recipes"][variant]
    f, m = fixture(), model(variant)
    with torch.no_grad():
        text_c, text_u = m.encode_text(f["sample_tokens"]), m.encode_text(f["sample_empty_tokens"])
        image = m.resample(m.encode_image(f["sample_image"]))
        zero = m.resample(m.encode_image(torch.zeros_like(f["sample_image"])))
        z = m.vae_encode(f["sample_image"])
    frames = m.sizes.frames
    concat = z[:, :, None].expand(-1, -1, frames, -1, -1)
    latents = torch.zeros(1, 4, frames, *z.shape[-2:])

    def batch(context):
        return Batch(latents=latents, cond={"context": context})

    def unet(x, t, b):
        return m.unet(torch.cat([x, concat], 1), t, context=b.cond["context"], fs=torch.tensor([recipe["fs"]]))

    cond, uncond = batch(torch.cat([text_c, image], 1)), batch(torch.cat([text_u, zero], 1))
    uncond_image = batch(torch.cat([text_u, image], 1)) if recipe["cfg_img"] is not None else None
    tables = DDIMTables(m.variant, recipe["steps"], recipe["spacing"], recipe["eta"], torch.device("cpu"))
    assert torch.equal(tables.timesteps, f[f"sample_{variant}_ddim_timesteps"])
    generator = torch.Generator().manual_seed(recipe["seed"])
    x = torch.randn(latents.shape, generator=generator)
    assert torch.equal(x, f[f"sample_{variant}_x_T"])  # the same noise stream as the release's sampler
    with torch.no_grad():
        return ddim_loop(x, tables, m.variant, cond=cond, uncond=uncond, uncond_image=uncond_image,
                         guidance_scale=recipe["guidance"], image_guidance_scale=recipe["cfg_img"],
                         guidance_rescale=recipe["rescale"], compose_fn=unet, on_step=None, generator=generator)


def outputs() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{component: (ours, upstream)}``."""
    f = fixture()
    m = model("512")
    big = torch.rand(1, 3, 720, 560, generator=torch.Generator().manual_seed(77)) * 2 - 1
    assert torch.isclose(big.double().sum(), f["image_big_sum"].double())
    with torch.no_grad():
        pairs = {f"unet_{v}": (model(v).unet(f["unet_x"], f["unet_t"], context=f["unet_context"], fs=f["unet_fs"]),
                               f[f"unet_{v}"]) for v in ("512", "256", "1024")}
        pairs["unet_512_shared_context_default_fs"] = (
            m.unet(f["unet_x"], f["unet_t"], context=f["unet_shared_context"]), f["unet_512_shared"])
        pairs["text"] = (m.encode_text(f["text_tokens"]), f["text"])
        pairs["vision"] = (m.encode_image(f["image"]), f["vision"])
        pairs["vision_downscaled"] = (m.encode_image(big), f["vision_big"])
        pairs["resampler"] = (m.resample(f["vision"]), f["resampler"])
        pairs["vae_encode"] = (m.vae_encode(f["vae_pixels"]), f["vae_encode"])
        pairs["vae_decode"] = (m.vae_decode(f["vae_latents"]), f["vae_decode"])
    for variant in ("512", "256", "1024"):
        pairs[f"ddim_{variant}"] = (sample(variant), f[f"sample_{variant}"])
    return pairs


@lru_cache(maxsize=1)
def errors() -> dict[str, float]:
    return {name: error(ours, ref) for name, (ours, ref) in outputs().items()}


COMPONENTS = ["unet_512", "unet_256", "unet_1024", "unet_512_shared_context_default_fs", "text", "vision",
              "vision_downscaled", "resampler", "vae_encode", "vae_decode", "ddim_512", "ddim_256", "ddim_1024"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_matches_the_upstream_implementation(component):
    assert errors()[component] <= TOLERANCE, f"{component}: max error {errors()[component]:.2e} of the largest value"


def test_the_variants_references_differ_where_their_u_nets_do():
    f = fixture()
    assert not torch.allclose(f["unet_256"], f["unet_512"], rtol=1e-3)  # the 256 model's learnable image scales
    assert torch.equal(f["unet_512"], f["unet_1024"])  # identical structure and weights: only the sampling differs
    assert not torch.allclose(f["sample_512"], f["sample_1024"])


def test_the_fixture_is_small_and_documents_where_it_came_from():
    assert (FIXTURES / "parity.safetensors").stat().st_size <= 2 * 1024 * 1024
    provenance = json.loads((FIXTURES / "parity.json").read_text())
    assert provenance["upstream_commit"].startswith("c453369")
    assert provenance["made_by"] == "plugins/dynamicrafter/scripts/make_parity_fixture.py"
    from workbench_dynamicrafter.reference import PARITY_SIZES

    assert provenance["sizes"] == json.loads(json.dumps(PARITY_SIZES))


if __name__ == "__main__":
    for name, value in errors().items():
        print(f"{name:40s} {value:.2e}")
