"""The ``dynamicrafter`` backbone plugin: loading the official key layout, schedules, the sampler, the contract.

The real models' key → shape maps (``tests/fixtures/dynamicrafter_keys.json.gz``, made from the
release's own modules) are loaded on the meta device, so the real-size layout is checked without
any download. Everything else runs on tiny seeded models on CPU.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench import AdapterExperiment, Add, ComposedModel, GatedResidual, Replace, TrainingConfig

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "plugins" / "dynamicrafter" / "tests" / "fixtures"


def _installed() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("workbench-dynamicrafter")
        metadata.distribution("diffusers")
        return True
    except metadata.PackageNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not _installed(), reason="workbench-dynamicrafter is not installed (make install "
                                                          "installs it: pip install -e plugins/dynamicrafter)")

from workbench.config import build  # noqa: E402
from workbench.errors import CapabilityError, CheckpointError, ConfigError, DataError  # noqa: E402
from workbench.testing import check_backbone  # noqa: E402

KEYS = ROOT / "tests" / "fixtures" / "dynamicrafter_keys.json.gz"
PROMPT = "a robot arm pushes a puck"


@pytest.fixture(scope="module")
def real_layouts() -> dict:
    with gzip.open(KEYS, "rt") as f:
        return {name: {k: tuple(v) for k, v in keys.items()} for name, keys in json.load(f).items()}


def meta_state(layout: dict) -> dict:
    return {k: torch.empty(shape, device="meta") for k, shape in layout.items()}


def parity_state(variant: str = "512", seed: int = 0) -> dict:
    """Seeded random weights for the parity sizes, in the official layout (with the variant's schedule)."""
    from workbench_dynamicrafter.checkpoint import upstream_shapes
    from workbench_dynamicrafter.model import DynamiCrafterModel
    from workbench_dynamicrafter.reference import PARITY_SIZES, random_state
    from workbench_dynamicrafter.variants import get_variant, schedule_buffers

    v = get_variant(variant)
    with torch.device("meta"):
        model = DynamiCrafterModel(v, v.sizes.replace(**PARITY_SIZES))
    state = random_state(upstream_shapes(model), seed)
    state.update(schedule_buffers(v))
    return state


# -- the real layout -------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["256", "512", "1024"])
def test_the_real_models_key_layout_is_consumed_exactly(variant, real_layouts):
    from workbench_dynamicrafter.checkpoint import upstream_shapes
    from workbench_dynamicrafter.model import DynamiCrafterModel, from_checkpoint
    from workbench_dynamicrafter.variants import get_variant

    with torch.device("meta"):
        model = DynamiCrafterModel(get_variant(variant))
    assert upstream_shapes(model) == real_layouts[variant]
    loaded = from_checkpoint(meta_state(real_layouts[variant]), variant, device="meta")
    counts = loaded.parameter_counts()
    assert round(counts["unet"] / 1e6, 1) == 1438.9  # the release's U-Net size
    assert counts["vae"] == 83_653_863


def test_the_256_release_names_its_fs_embedding_framestride_embed(real_layouts):
    from workbench_dynamicrafter.model import from_checkpoint

    state = {k.replace(".fps_embedding.", ".framestride_embed."): v for k, v in meta_state(real_layouts["256"]).items()}
    assert from_checkpoint(state, device="meta").variant.name == "256"  # recognised: it has attn2.alpha


def test_a_wrong_variant_names_the_one_the_keys_look_like(real_layouts):
    from workbench_dynamicrafter.model import from_checkpoint
    from workbench_dynamicrafter.variants import dynamic_scales

    with pytest.raises(CheckpointError, match=r"variant='512' was requested, but the checkpoint looks like the 256 "
                                              r"model: it has learnable image cross-attention scales"):
        from_checkpoint(meta_state(real_layouts["256"]), "512", device="meta")
    with pytest.raises(CheckpointError, match=r"looks like the 512 or 1024 model: .*Pass variant='512' or "
                                              r"variant='1024'"):
        from_checkpoint(meta_state(real_layouts["512"]), "256", device="meta")
    state = {**meta_state(real_layouts["512"]), "scale_arr": dynamic_scales(0.3, 1000)}
    with pytest.raises(CheckpointError, match=r"variant='512' was requested, but the checkpoint looks like the 1024 "
                                              r"model: its scale_arr ends at 0.30"):
        from_checkpoint(state, "512", device="meta")


def test_512_and_1024_are_told_apart_by_their_dynamic_rescale_buffer():
    from workbench_dynamicrafter.variants import dynamic_scales, recognise

    assert recognise({"scale_arr": dynamic_scales(0.3, 1000)})[0] == "1024"
    assert recognise({"scale_arr": dynamic_scales(0.7, 1000)})[0] == "512"
    assert recognise({"model.diffusion_model.x.attn2.alpha": torch.zeros(())})[0] == "256"


def test_loading_is_strict_and_lists_the_wrong_keys_with_counts():
    from workbench_dynamicrafter.model import from_checkpoint
    from workbench_dynamicrafter.reference import PARITY_SIZES

    state = parity_state()
    del state["model.diffusion_model.out.2.weight"]
    state["model.diffusion_model.extra.weight"] = torch.zeros(3)
    state["image_proj_model.latents"] = torch.zeros(1, 7, 40)
    with pytest.raises(CheckpointError) as err:
        from_checkpoint(state, "512", **PARITY_SIZES)
    message = str(err.value)
    assert "does not match the 512 model's layout: 1 missing (first: model.diffusion_model.out.2.weight)" in message
    assert "1 unexpected (first: model.diffusion_model.extra.weight)" in message
    assert "1 wrong shape (first: image_proj_model.latents: checkpoint [1, 7, 40], model [1, 48, 40])" in message


def test_a_schedule_that_is_not_the_variants_is_refused():
    from workbench_dynamicrafter.model import from_checkpoint
    from workbench_dynamicrafter.reference import PARITY_SIZES

    state = parity_state()
    state["alphas_cumprod"] = state["alphas_cumprod"] * 0.5
    with pytest.raises(CheckpointError, match=r"alphas_cumprod buffer differs from the 512 model's schedule "
                                              r"\(prediction v, zero-terminal-SNR True"):
        from_checkpoint(state, "512", **PARITY_SIZES)


def test_files_lightning_and_deepspeed_nesting_load_the_same_weights(tmp_path):
    from safetensors.torch import save_file
    from workbench_dynamicrafter.model import from_checkpoint
    from workbench_dynamicrafter.reference import PARITY_SIZES

    state = parity_state()
    save_file(state, str(tmp_path / "model.safetensors"))
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "model.ckpt")
    torch.save({"module": {"_forward_module." + k: v for k, v in state.items()}}, tmp_path / "deepspeed.pt")
    reference = from_checkpoint(state, **PARITY_SIZES).state_dict()
    for name in ("model.safetensors", "model.ckpt", "deepspeed.pt"):
        loaded = from_checkpoint(tmp_path / name, **PARITY_SIZES).state_dict()
        assert loaded.keys() == reference.keys()
        assert all(torch.equal(loaded[k], reference[k]) for k in reference), name


def test_the_unet_loads_alone_with_the_same_strict_key_checks(tmp_path):
    """``load_unet`` (``from_checkpoint(..., parts=("unet",))``): the whole model's U-Net, bit for bit, read alone
    from a file; a checkpoint that is wrong anywhere (even outside the U-Net) is refused as a whole one is."""
    from safetensors.torch import save_file
    from workbench_dynamicrafter.model import from_checkpoint, load_unet
    from workbench_dynamicrafter.reference import PARITY_SIZES
    from workbench_dynamicrafter.unet import UNet3D

    state = parity_state()
    save_file(state, str(tmp_path / "model.safetensors"))
    unet = load_unet(tmp_path / "model.safetensors", **PARITY_SIZES)
    whole = from_checkpoint(state, **PARITY_SIZES)
    assert isinstance(unet, UNet3D) and not unet.training and not any(p.requires_grad for p in unet.parameters())
    a, b = unet.state_dict(), whole.unet.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    alone = from_checkpoint(state, parts=("unet",), **PARITY_SIZES)
    assert alone.parts == ("unet",) and alone.parameter_counts() == whole.parameter_counts()
    with pytest.raises(CheckpointError, match=r"loaded with parts=\('unet',\), without 'vae'"):
        alone.vae_encode(torch.zeros(1, 3, 16, 16))
    del state["first_stage_model.decoder.conv_out.bias"]
    state["cond_stage_model.model.extra"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match=r"1 missing \(first: first_stage_model.decoder.conv_out.bias\); 1 "
                                              r"unexpected \(first: cond_stage_model.model.extra\)"):
        load_unet(state, "512", **PARITY_SIZES)


def test_the_vae_posterior_image_preprocessing_and_ddim_tables_are_the_pieces_the_model_uses():
    """The public pieces a check against upstream needs: the VAE posterior (mean and log-variance; the latent is
    the mean times 0.18215), the vision tower's input alone, the DDIM tables (against the release's float32
    ``alphas_cumprod`` stored by the parity fixture)."""
    from safetensors.torch import load_file
    from workbench_dynamicrafter.encoders import CLIP_MEAN, resize_like_release
    from workbench_dynamicrafter.model import from_checkpoint, preprocess_image
    from workbench_dynamicrafter.reference import PARITY_SIZES
    from workbench_dynamicrafter.sampling import DDIMTables
    from workbench_dynamicrafter.variants import get_variant

    model = from_checkpoint(parity_state(), **PARITY_SIZES)
    g = torch.Generator().manual_seed(0)
    frames = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
    with torch.no_grad():
        mean, logvar = model.vae_posterior(frames)
        assert mean.shape == logvar.shape == (2, 4, 16, 16) and torch.isfinite(logvar).all()
        assert torch.equal(mean * model.variant.scale_factor, model.vae_encode(frames))
        assert float(logvar.min()) >= -30 and float(logvar.max()) <= 20
        pixels = model.preprocess_image(frames)
        assert pixels.shape == (2, 3, 224, 224) and pixels.dtype == torch.float32
        assert torch.equal(pixels, preprocess_image(frames, 224))
        mean_rgb = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
        assert torch.allclose(pixels * torch.tensor((0.26862954, 0.26130258, 0.27577711)).view(1, 3, 1, 1) + mean_rgb,
                              (resize_like_release(frames, 224) + 1) / 2, atol=1e-6)
        seen = []
        hook = model.vision.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["pixel_values"]),
                                                      with_kwargs=True)
        model.encode_image(frames)
        hook.remove()
        assert torch.equal(seen[0], pixels)  # encode_image is the vision tower on exactly this input
    upstream = load_file(str(FIXTURES / "parity.safetensors"))["schedule_512_alphas_cumprod"].float()
    tables = DDIMTables(get_variant("512"), 50, "uniform_trailing", 1.0, torch.device("cpu"))
    assert tables.timesteps.tolist() == list(range(19, 1000, 20))
    assert torch.equal(tables.a, upstream[tables.timesteps])
    assert torch.equal(tables.a_prev, torch.cat([upstream[:1], upstream[tables.timesteps[:-1]]]))
    a, a_prev = tables.a.double(), tables.a_prev.double()
    assert torch.allclose(tables.sigma.double(), ((1 - a_prev) / (1 - a) * (1 - a / a_prev)).sqrt(), atol=1e-6)
    assert tables.rescale is not None and tables.rescale.shape == (50,)


class Opaque:
    """A pickled object that weights_only loading refuses (as Lightning's training state is)."""


def test_an_unsafe_ckpt_is_refused_with_the_conversion_command_which_converts_it(tmp_path):
    from workbench_dynamicrafter.cli import main
    from workbench_dynamicrafter.model import from_checkpoint
    from workbench_dynamicrafter.reference import PARITY_SIZES

    state = parity_state()
    torch.save({"state_dict": state, "callbacks": Opaque()}, tmp_path / "model.ckpt")
    with pytest.raises(CheckpointError) as err:
        from_checkpoint(tmp_path / "model.ckpt", **PARITY_SIZES)
    assert "cannot be read safely (torch.load(weights_only=True) refused it" in str(err.value)
    assert f"workbench-dynamicrafter convert {tmp_path / 'model.ckpt'} out.safetensors --trust-pickle" in str(err.value)
    assert main(["convert", str(tmp_path / "model.ckpt"), str(tmp_path / "out.safetensors")]) == 2
    assert not (tmp_path / "out.safetensors").exists()  # nothing unpickled without the flag
    assert main(["convert", str(tmp_path / "model.ckpt"), str(tmp_path / "out.safetensors"), "--trust-pickle"]) == 0
    converted = from_checkpoint(tmp_path / "out.safetensors", **PARITY_SIZES).state_dict()
    direct = from_checkpoint(state, **PARITY_SIZES).state_dict()
    assert all(torch.equal(converted[k], direct[k]) for k in direct)


# -- schedules -------------------------------------------------------------------------------
def test_ddim_spacings_and_the_zero_terminal_snr_schedule():
    from workbench_dynamicrafter.sampling import DDIMTables
    from workbench_dynamicrafter.variants import betas_for, ddim_timesteps, get_variant, schedule_buffers

    assert ddim_timesteps("uniform", 50).tolist() == list(range(1, 1000, 20))
    assert ddim_timesteps("uniform_trailing", 50).tolist() == list(range(19, 1000, 20))
    assert ddim_timesteps("uniform_trailing", 3).tolist() == [332, 666, 999]
    with pytest.raises(ValueError, match=r"reaches timestep 1000, past the schedule's 1000; with 'uniform' spacing"):
        DDIMTables(get_variant("256"), 3, "uniform", 1.0, torch.device("cpu"))
    abar = torch.cumprod(1 - betas_for(get_variant("512")), 0)
    assert abar[-1] == 0 and abar[0] == torch.cumprod(1 - betas_for(get_variant("256")), 0)[0]
    assert torch.cumprod(1 - betas_for(get_variant("256")), 0)[-1] > 0
    buffers = schedule_buffers(get_variant("1024"))
    assert buffers["scale_arr"].shape == (1400,) and buffers["scale_arr"][0] == 1 and buffers["scale_arr"][-1] == 0.3
    assert "scale_arr" not in schedule_buffers(get_variant("256"))
    assert torch.equal(buffers["sqrt_recip_alphas_cumprod"], torch.zeros(1000))  # v-prediction stores zeros


def test_guidance_rescale_matches_the_std_ratio_definition():
    from workbench_dynamicrafter.sampling import rescale_guided

    g = torch.Generator().manual_seed(0)
    guided, cond = torch.randn(2, 4, 3, 2, 2, generator=g) * 3, torch.randn(2, 4, 3, 2, 2, generator=g)
    out = rescale_guided(guided, cond, 0.7)
    for i in range(2):
        expected = 0.7 * guided[i] * cond[i].std() / guided[i].std() + 0.3 * guided[i]
        torch.testing.assert_close(out[i], expected)
    assert torch.equal(rescale_guided(guided, cond, 0.0), guided)


# -- the backbone on the tiny model ------------------------------------------------------------
@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    from workbench_dynamicrafter.tiny import save_tiny_checkpoint

    root = tmp_path_factory.mktemp("workbench-cache")
    for variant in ("512", "256", "512_interp"):
        save_tiny_checkpoint(root / "fixtures" / f"dynamicrafter-tiny-{variant}-v1", 0, variant)
    return root


_BASES: dict = {}


def test_bfloat16_is_its_cards_gpu_precision_and_keeps_the_contract_on_the_cpu(cache_root):
    """DynamiCrafter in bf16 (its card's precision on CUDA), on the CPU: the float32 GroupNorms keep float32 weights
    (a bf16 load and a float32 load moved to bf16 are the same tensors, bit for bit), the U-Net computes in bf16,
    latents and the sampler stay float32, and every promise of the contract holds (16x16 clips: bf16 convolutions
    are slow on a CPU)."""
    from workbench_dynamicrafter.unet import Float32GroupNorm

    config = {"path": "tiny", "variant": "512", "prompt": PROMPT, "steps": 2, "num_frames": 4, "height": 16,
              "width": 16}
    assert tiny(cache_root).card.precision["cuda"] == "bfloat16"
    base = build_in(cache_root, {**config, "dtype": "bfloat16"})
    moved = build_in(cache_root, {**config, "dtype": "float32"}).to(torch.bfloat16)
    a, b = base.state_dict(), moved.state_dict()
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    norms = [m for m in base.model.modules() if isinstance(m, Float32GroupNorm)]
    assert len(norms) == len(base.keep_in_float32()) == 11  # weight and bias: 22 tensors
    assert all(p.dtype == torch.float32 for m in norms for p in m.parameters())
    assert base.dtype == torch.bfloat16 and base.model.unet.out[2].weight.dtype == torch.bfloat16
    g = torch.Generator().manual_seed(5)
    raw = {"video": torch.rand(2, 3, 4, 16, 16, generator=g) * 2 - 1, "action": torch.rand(2, 4, 4, generator=g),
           "proprio": torch.rand(2, 4, 3, generator=g), "ee_pos": torch.rand(2, 4, 3, generator=g),
           "control": torch.rand(2, 1, 4, 16, 16, generator=g), "prompt": [PROMPT, "another prompt"]}  # every input
    # the issue's own call: generate() in bf16 (it failed at the first float32 GroupNorm)
    latents = base.generate({"image": raw["video"][:1, :, 0], "action": raw["action"][:1]}, steps=2,
                            generator=torch.Generator().manual_seed(0))
    assert latents.dtype == torch.float32 and torch.isfinite(latents).all()
    assert base.decode(latents).dtype == torch.float32
    seen = []
    hook = base.model.unet.out[2].register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    batch = base.prepare_batch(raw)
    with torch.no_grad():
        out = base.denoise(batch.latents, torch.full((2,), 500), batch.cond)
    hook.remove()
    assert seen == [(torch.bfloat16, torch.bfloat16)] and out.dtype == batch.latents.dtype == torch.float32
    report = check_backbone(base, raw=raw, adapter_factory=adapter, steps=2, dtype=torch.bfloat16)
    assert report.setting == "cpu bfloat16" and "22 kept in float32" in report["to"].detail
    assert report["recording"].detail == "2 steps, 2 base call(s) per step, bit-exact"
    assert "latents (2, 4, 4, 4, 4) torch.float32 -> video torch.float32" in report["encode_decode"].detail


def build_in(cache_root: Path, config: dict):
    """``build`` with ``$WORKBENCH_CACHE`` pointing at the session's tiny checkpoints (restored after)."""
    saved = os.environ.get("WORKBENCH_CACHE")
    os.environ["WORKBENCH_CACHE"] = str(cache_root)
    try:
        return build("backbone", "dynamicrafter", config)
    finally:
        if saved is None:
            del os.environ["WORKBENCH_CACHE"]
        else:
            os.environ["WORKBENCH_CACHE"] = saved


def tiny(cache_root: Path, variant: str = "512", **overrides):
    key = f"{variant}:{sorted(overrides.items())}"
    if key not in _BASES:
        config = {"path": "tiny", "variant": variant, "prompt": PROMPT, "steps": 3, "num_frames": 4, "height": 32,
                  "width": 32, **overrides}
        _BASES[key] = build_in(cache_root, config)
    return _BASES[key]


def adapter(nonzero: bool = False, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        made = build("adapter", "dynamicrafter_latent_residual", {"width": 16, "depth": 1})
        if nonzero:
            with torch.no_grad():
                for p in made.out.parameters():
                    p.normal_(0, 0.5)
    return made


def clips(batch: int = 2, seed: int = 0, frames: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.rand(batch, 3, frames, 32, 32, generator=g) * 2 - 1,
            "action": torch.rand(batch, frames, 4, generator=g) * 2 - 1}


def request(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"image": torch.rand(1, 3, 32, 32, generator=g) * 2 - 1, "action": torch.rand(1, 4, 4, generator=g) * 2 - 1}


def test_the_tiny_checkpoint_is_small_and_loads_through_the_official_loader(cache_root):
    file = cache_root / "fixtures" / "dynamicrafter-tiny-512-v1" / "model.safetensors"
    assert file.stat().st_size < 1024 * 1024
    base = tiny(cache_root)
    assert base.variant.name == "512" and base.card.prediction_type == "v"
    assert base.card.components["unet"].parameters == sum(p.numel() for p in base.model.unet.parameters())


def test_the_card_carries_each_variants_release_defaults(cache_root):
    from workbench_dynamicrafter.variants import VARIANTS

    expected = {"256": (256, 256, None, "uniform", 0.0, "eps"), "512": (320, 512, 24, "uniform_trailing", 0.7, "v"),
                "1024": (576, 1024, 10, "uniform_trailing", 0.7, "v")}
    for name, (h, w, fps, spacing, rescale, prediction) in expected.items():
        v = VARIANTS[name]
        assert (v.height, v.width, v.spacing, v.guidance_rescale, v.prediction) == (h, w, spacing, rescale, prediction)
        assert (v.steps, v.eta, v.guidance_scale, v.frames) == (50, 1.0, 7.5, 16)
        assert (v.fs if v.fs_kind == "fps" else None) == fps
    card = build_in(cache_root, {"path": "tiny", "variant": "256"}).card
    s = card.sampling
    assert (s.steps, s.sampler, s.guidance_scale, s.height, s.width, s.num_frames, s.fps) == (
        50, "ddim", 7.5, 256, 256, 16, None)
    assert "fs 3" in card.notes and "DDIM uniform eta 1.0" in card.notes
    assert card.precision == {"cpu": "float32", "cuda": "bfloat16"}
    assert {"unet", "vae", "text_encoder", "image_encoder", "resampler"} <= set(card.components)


def test_prepare_batch_builds_the_release_conditions(cache_root):
    base = tiny(cache_root)
    raw = clips()
    batch = base.prepare_batch(raw)
    assert batch.latents.shape == (2, 4, 4, 8, 8)
    with torch.no_grad():
        first = base.model.vae_encode(raw["video"][:, :, 0])
        text = base.conditioning.encode_text(base.tokenize([PROMPT] * 2))
        # clip by clip, as prepare_batch encodes (the image tower is not batch-invariant on every CPU)
        image = torch.cat([base.conditioning.resample(base.conditioning.encode_image(raw["video"][i:i + 1, :, 0]))
                           for i in range(2)])
    assert torch.equal(batch.cond["first_frame"], first)
    assert torch.equal(batch.cond["concat"], first[:, :, None].expand(-1, -1, 4, -1, -1))
    assert torch.equal(batch.cond["context"], torch.cat([text, image], 1))
    assert batch.cond["context"].shape == (2, 77 + 8 * 16, 32)
    assert batch.cond["fs"].tolist() == [24, 24] and batch.loss_mask.all()
    assert torch.equal(batch.cond["action"], raw["action"])
    with pytest.raises(DataError, match=r"'video' is 34x32 pixels; height and width must be multiples of 4"):
        base.prepare_batch({"video": torch.zeros(1, 3, 4, 34, 32)})


def test_the_interpolation_model_is_given_the_first_and_last_frame(cache_root):
    base = tiny(cache_root, "512_interp")
    assert base.variant.interp and base.recipe()["fs"] == 5
    g = torch.Generator().manual_seed(3)
    first, last = (torch.rand(1, 3, 32, 32, generator=g) * 2 - 1 for _ in range(2))
    batch = base.prepare_batch({"image": first, "last_image": last, "frames": 4})
    concat = batch.cond["concat"]
    with torch.no_grad():
        assert torch.equal(concat[:, :, 0], base.model.vae_encode(first))
        assert torch.equal(concat[:, :, -1], base.model.vae_encode(last))
    assert not concat[:, :, 1:-1].any()  # the frames in between are zeros, as the release conditions them
    with pytest.raises(DataError, match=r"512_interp generates between two frames: give 'image' \(the first\) and "
                                        r"'last_image'"):
        base.prepare_batch({"image": first, "frames": 4})


@pytest.mark.parametrize("variant", ["512", "512_interp"])
def test_the_conformance_kit_finds_every_promise_kept(variant, cache_root):
    """``workbench.testing.check_backbone`` on the tiny model: valid card, provides() against prepare_batch,
    encode / decode, identity at init bit-exact, recorded == unrecorded with both guidance branches composed,
    a fork's prefix, a training step that leaves the U-Net, VAE and towers bit-identical, .to(), no base
    weight saved."""
    base = tiny(cache_root, variant)
    g = torch.Generator().manual_seed(5)
    raw = {**clips(), "proprio": torch.rand(2, 4, 3, generator=g), "ee_pos": torch.rand(2, 4, 3, generator=g),
           "control": torch.rand(2, 1, 4, 32, 32, generator=g), "prompt": [PROMPT, "another prompt"]}  # every input
    report = check_backbone(base, raw=raw, adapter_factory=adapter, steps=3)
    assert report["recording"].detail == "3 steps, 2 base call(s) per step, bit-exact"  # conditional + unconditional
    assert "this batch has no given frames" in report["given_frames"].detail
    if variant == "512_interp":  # it also needs the clip's last frame: a rollout does not know it, and says so
        assert base.card.context_frames == 0 and report["rollout"].status == "skipped"
        detail = report["rollout"].detail
        assert "context_frames=0" in detail and "also needs a future frame" in detail
    else:  # chunk 1 from the frame chunk 0 produced (the image condition), recorded == unrecorded
        assert base.card.context_frames == 1 and report["rollout"].status == "kept", report["rollout"].detail


def test_a_text_only_request_is_refused_with_the_fix(cache_root):
    """DynamiCrafter generates from a first frame: a prompt without an image is refused, never sampled from noise."""
    base = tiny(cache_root)
    with pytest.raises(CapabilityError, match=r"text only.*Add 'image' \(B, 3, H, W\).*always generates from a first"):
        base.prepare_batch({"prompt": [PROMPT], "frames": 4})


@pytest.mark.parametrize("composer", [Add, GatedResidual], ids=["add", "gated_residual"])
def test_identity_at_init_composed_equals_the_frozen_base_bit_exactly(composer, cache_root):
    base = tiny(cache_root)
    model = ComposedModel(base, adapter(), composer(), base.default_objective()).train()
    batch = base.prepare_batch(clips())
    x_t, t, _ = model.noised(batch, torch.Generator().manual_seed(2))
    pred = model.predict(x_t, t, batch, step=0)
    with torch.no_grad():
        frozen = base.denoise(x_t, t, batch.cond)
    assert torch.equal(pred.composed, frozen) and torch.equal(pred.base, frozen)
    zero = model.generate(request(), generator=torch.Generator().manual_seed(1))
    bare = base.generate(request(), generator=torch.Generator().manual_seed(1))
    assert torch.equal(zero, bare)


def test_recorded_equals_unrecorded_and_forks_replay_their_prefix(cache_root):
    base = tiny(cache_root)
    exp = AdapterExperiment(base=base, adapter=adapter(nonzero=True), composer=GatedResidual(gate_init=0.5),
                            training=TrainingConfig(progress=False))
    traj = exp.sample(request(), steps=3, seed=3)
    plain = exp.model.generate(exp.prepare(request()), steps=3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(traj.final, plain) and len(traj) == 3 and traj.complete
    assert not torch.equal(traj[1].composed, traj[1].base)
    assert torch.equal(traj.fork(at=3).final, traj.final)
    pushed = traj.fork(at=2, cond={"action": torch.ones(4, 4)})
    assert torch.equal(pushed[1].x_t, traj[1].x_t) and not torch.equal(pushed.final, traj.final)


class Spy:
    def __init__(self, base):
        self.base, self.calls = base, []

    def __call__(self, x, t, batch):
        self.calls.append(batch)
        return self.base.denoise(x, t, batch.cond)


@pytest.mark.parametrize("multi", [False, True], ids=["text-cfg", "image-cfg"])
def test_each_guidance_branch_is_composed_with_its_own_conditions(multi, cache_root):
    base = tiny(cache_root)
    batch = base.prepare_batch(request())
    spy = Spy(base)
    kwargs = {"image_guidance_scale": 2.0} if multi else {}
    base.generate(batch, steps=2, generator=torch.Generator().manual_seed(0), compose_fn=spy, **kwargs)
    per_step = 3 if multi else 2
    assert len(spy.calls) == 2 * per_step
    empty = base.encode_text([""])
    zero_image = base.image_context(torch.zeros(1, 3, 32, 32))
    image = batch.cond["context"][:, 77:]
    cond, uncond = spy.calls[0], spy.calls[1]
    assert cond is batch
    assert torch.equal(uncond.cond["context"], torch.cat([empty, zero_image], 1))
    assert torch.equal(uncond.cond["action"], torch.zeros_like(batch.cond["action"]))
    assert torch.equal(uncond.cond["concat"], batch.cond["concat"]) and uncond.meta["branch"] == "uncond"
    if multi:
        assert torch.equal(spy.calls[2].cond["context"], torch.cat([empty, image], 1))


def test_the_sampler_is_the_release_ddim_written_out(cache_root):
    """Two steps of 512-style sampling (v, trailing spacing, guidance rescale, dynamic rescale, eta 1) by hand."""
    from workbench_dynamicrafter.sampling import rescale_guided
    from workbench_dynamicrafter.variants import betas_for, dynamic_scales

    base = tiny(cache_root)
    batch = base.prepare_batch(request())
    ours = base.generate(batch, steps=2, generator=torch.Generator().manual_seed(5))
    abar64 = torch.cumprod(1 - betas_for(base.variant), 0)
    abar = abar64.float()
    arr = dynamic_scales(0.7, 1000).float()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(batch.latents.shape, generator=g)
    empty = base.encode_text([""])
    uncond = {**batch.cond, "context": torch.cat([empty, base.image_context(torch.zeros(1, 3, 32, 32))], 1)}
    ts = [999, 499]
    for i, t in enumerate(ts):
        tt = torch.tensor([t])
        c, u = base.denoise(x, tt, batch.cond), base.denoise(x, tt, uncond)
        out = rescale_guided(u + 7.5 * (c - u), c, 0.7)
        a = abar[t]
        a_prev = abar[ts[i + 1]] if i + 1 < len(ts) else abar[0]
        sa, s1 = abar64[t].sqrt().float(), (1 - abar64[t]).sqrt().float()
        eps = sa * out + s1 * x
        x0 = (sa * x - s1 * out) * (arr[ts[i + 1] if i + 1 < len(ts) else ts[i]] / arr[t])
        a64, p64 = a.double(), a_prev.double()
        sigma = ((1 - p64) / (1 - a64) * (1 - a64 / p64)).sqrt().float()
        noise = sigma * torch.randn(x.shape, generator=g)
        x = a_prev.sqrt() * x0 + (1 - a_prev - sigma**2).clamp_min(0).sqrt() * eps + noise
    torch.testing.assert_close(ours, x, rtol=1e-6, atol=1e-6)


def test_the_backbone_moves_and_comes_back_and_the_adapter_holds_no_base_weights(cache_root):
    base = tiny(cache_root)
    exp = AdapterExperiment(base=base, adapter=adapter(), training=TrainingConfig(progress=False))
    base_ids = {id(p) for p in base.parameters()}
    assert base_ids.isdisjoint(id(p) for p in exp.model.adapter.parameters())
    assert not any(k.startswith(("model.", "unet.", "vae.")) for k in exp.model.adapter.state_dict())
    before = {k: v.clone() for k, v in base.state_dict().items()}
    base.to(torch.float64).to(torch.float32)
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())


def test_a_training_step_changes_the_adapter_only(cache_root):
    base = tiny(cache_root)
    frozen = {k: v.clone() for k, v in base.state_dict().items()}
    exp = AdapterExperiment(base=base, adapter=adapter(), composer=GatedResidual(),
                            training=TrainingConfig(batch_size=2, learning_rate=1e-2, progress=False))
    exp.fit([clips(seed=i) for i in range(2)], steps=2)
    assert exp.step == 2 and all(torch.isfinite(torch.tensor(exp.loss_history)))
    assert all(torch.equal(frozen[k], v) for k, v in base.state_dict().items())
    assert not any(p.requires_grad for p in base.parameters())


def test_the_objective_trains_on_dynamically_rescaled_latents(cache_root):
    base = tiny(cache_root)
    obj = base.default_objective()
    x0, noise, t = torch.randn(1, 4, 2, 2, 2), torch.randn(1, 4, 2, 2, 2), torch.tensor([700])
    scale = 0.7  # scale_arr[700] is past the 400-step ramp
    a, s = obj.coefficients(t)
    torch.testing.assert_close(obj.add_noise(x0, noise, t), a * scale * x0 + s * noise)
    torch.testing.assert_close(obj.target(x0, noise, t), a * noise - s * scale * x0)
    torch.testing.assert_close(obj.x0_from_prediction(obj.target(x0, noise, t), obj.add_noise(x0, noise, t), t), x0,
                               rtol=1e-4, atol=1e-5)
    assert obj.coefficients(torch.tensor([999]))[0] == 0  # zero terminal SNR


def test_entry_points_resolve_without_importing_diffusers():
    code = ("import sys, json; from workbench.registry import resolve; "
            "print(json.dumps([resolve('backbone', 'dynamicrafter').__name__, "
            "resolve('adapter', 'dynamicrafter_latent_residual').__name__, 'diffusers' in sys.modules]))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out == ["DynamiCrafter", "DynamiCrafterLatentResidual", False]


# -- real weights (opt-in) ----------------------------------------------------------------------
REAL = os.environ.get("WORKBENCH_DYNAMICRAFTER_CHECKPOINT")


@pytest.mark.skipif(not REAL, reason="set WORKBENCH_DYNAMICRAFTER_CHECKPOINT (and WORKBENCH_DYNAMICRAFTER_VARIANT) "
                                     "to an official DynamiCrafter checkpoint to run")
def test_a_real_checkpoint_loads_strictly_and_generates():
    variant = os.environ.get("WORKBENCH_DYNAMICRAFTER_VARIANT")
    base = build("backbone", "dynamicrafter", {"path": REAL, "variant": variant, "prompt": PROMPT})
    v = base.variant
    raw = {"image": torch.zeros(1, 3, v.height, v.width), "frames": v.frames}
    latents = base.generate(raw, steps=2, generator=torch.Generator(device=base.device).manual_seed(0))
    assert latents.shape == (1, 4, v.frames, v.height // 8, v.width // 8) and torch.isfinite(latents).all()


# -- the example config: training on Meta-World clips, resumed bit-exactly ----------------------
def test_the_example_config_trains_on_metaworld_and_resumes_bit_exactly(cache_root, tmp_path, monkeypatch):
    from workbench.cli import main

    monkeypatch.setenv("WORKBENCH_CACHE", str(cache_root))
    config = ROOT / "examples" / "configs" / "dynamicrafter.yaml"
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", str(config), "--steps", "4", "--output", str(one), "--quiet"]) == 0
    assert main(["train", str(config), "--steps", "2", "--output", str(two), "--quiet"]) == 0
    assert main(["train", str(config), "--steps", "4", "--output", str(two), "--resume", "--quiet"]) == 0
    a = json.loads((one / "step-0000004" / "meta.json").read_text())["loss_history"]
    b = json.loads((two / "step-0000004" / "meta.json").read_text())["loss_history"]
    assert len(a) == 4 and a == b and all(v == v for v in a)
    assert (one / "step-0000004" / "trainable.safetensors").read_bytes() == \
        (two / "step-0000004" / "trainable.safetensors").read_bytes()
    saved = (one / "step-0000004" / "config.yaml").read_text()
    assert "type: dynamicrafter" in saved and "path: tiny" in saved
    from workbench_dynamicrafter.tiny import ensure_tiny_checkpoint

    checkpoint = ensure_tiny_checkpoint()  # the run records the checkpoint file it was trained on
    assert json.loads((two / "step-0000004" / "meta.json").read_text())["base"] == {
        "sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(), "covers": "the file model.safetensors"}


INSIDE = {"lora": {"rank": 2}, "action_modulation": {"hidden": 8, "lora": {"rank": 2}}, "controlnet": {"blocks": 1}}


@pytest.mark.parametrize("kind", list(INSIDE))
def test_adapters_inside_the_unet_keep_their_promises(kind, cache_root):
    """lora / action_modulation / controlnet reach into DynamiCrafter's U-Net (stages with frames folded into the
    batch): identity at init, the U-Net switched off after training, its own tensors untouched, recorded ==
    unrecorded with both guidance branches adapted."""
    from workbench.testing import check_inside_adapter

    config = {"path": "tiny", "variant": "512", "prompt": PROMPT, "steps": 2, "num_frames": 4, "height": 32,
              "width": 32}

    def inside():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            return build("adapter", kind, INSIDE[kind])

    report = check_inside_adapter(lambda: build_in(cache_root, config), inside, raw=clips(), steps=2)
    assert report["recording"].detail == "2 steps, 4 base calls per step recorded (2 sampling), bit-exact"
    if kind == "controlnet":  # the tiny U-Net's chain after its stem is one stage long
        with pytest.raises(ConfigError, match=r"controlnet blocks: 2 is more than DynamiCrafter has to copy: its "
                                              r"first 1 blocks form the chain a copy can run \(model.unet\)"):
            base = build_in(cache_root, config)
            ComposedModel(base, build("adapter", kind, {"blocks": 2}), Replace(), base.default_objective())


def test_a_controlnet_reads_a_control_video_in_the_unet(cache_root):
    """A control video (B, C, T, H, W) reaches DynamiCrafter's U-Net through controlnet: pooled onto each frame's grid
    (frames folded into the batch), with the promises of an inside adapter kept."""
    from workbench.testing import check_inside_adapter

    config = {"path": "tiny", "variant": "512", "prompt": PROMPT, "steps": 2, "num_frames": 4, "height": 32,
              "width": 32}

    def video_controlnet():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            return build("adapter", "controlnet", {"condition": "control", "aliases": [], "video": True, "dim": 2})

    g = torch.Generator().manual_seed(3)
    raw = {**clips(), "control": torch.rand(2, 2, 4, 32, 32, generator=g) * 2 - 1}
    report = check_inside_adapter(lambda: build_in(cache_root, config), video_controlnet, raw=raw, steps=2)
    assert report.ok and report["recording"].detail == "2 steps, 4 base calls per step recorded (2 sampling), bit-exact"
    base = build_in(cache_root, config)
    model = ComposedModel(base, video_controlnet(), Replace(), base.default_objective()).train(False)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        batch = base.prepare_batch(raw)
        x_t, t, _ = model.noised(batch, torch.Generator().manual_seed(0))
        one = model.predict(x_t, t, batch)
        other = model.predict(x_t, t, base.prepare_batch({**raw, "control": raw["control"].flip(0)}))
    assert torch.equal(one.base, other.base) and (one.composed - other.composed).abs().max() > 1e-4


def test_the_prompt_tokenizer_gives_open_clips_own_ids():
    """``tokenize`` (open_clip's cleaning and pre-tokenizer, transformers' CLIP BPE) against ids made by open_clip's
    own ``tokenize`` (``scripts/make_tokenizer_fixture.py``, open_clip_torch 2.22.0 as DynamiCrafter pins it) on a
    corpus of unicode, punctuation, casing, whitespace, HTML entities, special-token spellings and over-long text.
    The tokenizer is built from the fixture's part of OpenAI CLIP's vocabulary (every merge the corpus needs)."""
    from transformers import CLIPTokenizer
    from workbench_dynamicrafter.encoders import tokenize
    from workbench_dynamicrafter.variants import get_variant

    fixture = json.loads((FIXTURES / "open_clip_tokens.json").read_text(encoding="utf-8"))
    provenance = fixture["provenance"]
    assert provenance["open_clip_torch"] == "2.22.0" and provenance["date"] and "sha256" in provenance["vocabulary"]
    tokenizer = CLIPTokenizer(vocab=fixture["vocab"], merges=[tuple(m.split(" ")) for m in fixture["merges"]])
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (49406, 49407)
    ids = tokenize(fixture["corpus"], tokenizer, get_variant("512").sizes)
    want = torch.zeros(len(fixture["corpus"]), 77, dtype=torch.long)
    for i, row in enumerate(fixture["ids"]):
        want[i, :len(row)] = torch.tensor(row)
    mismatched = [repr(p)[:40] for p, a, b in zip(fixture["corpus"], ids, want) if not torch.equal(a, b)]
    assert mismatched == []
    lengths = [len(row) for row in fixture["ids"]]
    assert fixture["ids"][0] == [49406, 49407] and lengths.count(77) >= 3  # the empty prompt; over-long ones cut
    assert all(row[-1] == 49407 for row in fixture["ids"])
