"""The diffusers-native backbone plugins (``wan22_ti2v``, ``easyanimate``) on tiny random pipelines.

Tiny configs of the real diffusers classes, saved with ``save_pretrained`` once per session and
loaded back through the plugins. What is promised bit-exactly is tested bit-exactly: the
contract's promises through ``workbench.testing.check_backbone`` (identity at init, recorded ==
unrecorded, a fork's prefix, a frozen transformer / VAE / text encoder after training, ...), and
here ``generate()`` with a zero adapter == the plain diffusers pipeline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import forked
import pytest
import torch
from conftest import EXAMPLE_BATCH_KEYS, requires_plugins

ROOT = Path(__file__).resolve().parents[1]
pytestmark = requires_plugins

from workbench import (  # noqa: E402
    AdapterExperiment,
    ComposedModel,
    GatedResidual,
    TrainingConfig,
)
from workbench.config import build  # noqa: E402
from workbench.errors import CheckpointError, CompositionError, ConfigError, DataError  # noqa: E402
from workbench.testing import check_backbone  # noqa: E402

TINY_SAMPLING = {"height": 64, "width": 64, "num_frames": 9, "steps": 4}
PROMPT = "a robot arm pushes a puck"


@dataclass(frozen=True)
class Plugin:
    backbone: str
    adapter: str
    module: str
    fixture_dir: str  # the name ``FIXTURE.ensure()`` gives it under $WORKBENCH_CACHE/fixtures
    channels: int
    downsample: int
    guidance: float  # the real model's default guidance


WAN = Plugin("wan22_ti2v", "wan22_latent_residual", "workbench_wan22", "wan22-ti2v-tiny-v1", 48, 16, 5.0)
EASY = Plugin("easyanimate", "easyanimate_latent_residual", "workbench_easyanimate", "easyanimate-tiny-v1", 4, 8, 6.0)
PLUGINS = [pytest.param(WAN, id="wan22"), pytest.param(EASY, id="easyanimate")]


# -- fixtures: each tiny pipeline is built and saved once per session ------------------------
@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    """A workbench cache holding both tiny pipelines, as ``path: tiny`` finds them."""
    import workbench_easyanimate.tiny
    import workbench_wan22.tiny

    root = tmp_path_factory.mktemp("workbench-cache")
    workbench_wan22.tiny.save_tiny_pipeline(root / "fixtures" / WAN.fixture_dir)
    workbench_easyanimate.tiny.save_tiny_pipeline(root / "fixtures" / EASY.fixture_dir)
    return root


@pytest.fixture
def cache(cache_root, monkeypatch) -> Path:
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache_root))
    return cache_root


def pipeline_dir(cache_root: Path, plugin: Plugin) -> Path:
    return cache_root / "fixtures" / plugin.fixture_dir


_BASES: dict[str, object] = {}


def load(plugin: Plugin, cache_root: Path, **overrides):
    """The plugin's backbone loaded from the saved tiny directory (one per plugin and overrides)."""
    key = f"{plugin.backbone}:{sorted(overrides.items())}"
    if key not in _BASES:
        config = {"path": str(pipeline_dir(cache_root, plugin)), **TINY_SAMPLING, "prompt": PROMPT, **overrides}
        _BASES[key] = build("backbone", plugin.backbone, config)
    return _BASES[key]


def adapter(plugin: Plugin, nonzero: bool = False, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        made = build("adapter", plugin.adapter, {"channels": plugin.channels, "width": 16, "depth": 1})
        if nonzero:
            with torch.no_grad():
                for p in made.out.parameters():
                    p.normal_(0, 0.5)
    return made


def clips(batch: int = 2, seed: int = 0, frames: int = 9) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"video": torch.rand(batch, 3, frames, 64, 64, generator=g) * 2 - 1,
            "action": torch.rand(batch, frames, 4, generator=g) * 2 - 1}


def generation_input(plugin: Plugin, seed: int = 0) -> dict:
    """One clip's generation request: the first frame (Wan2.2 TI2V), the prompt, 9 frames of actions."""
    g = torch.Generator().manual_seed(seed)
    raw = {"prompt": PROMPT, "action": torch.rand(1, 9, 4, generator=g) * 2 - 1}
    if plugin is WAN:
        raw["image"] = torch.rand(1, 3, 64, 64, generator=g) * 2 - 1
    return raw


def plain_pipeline(plugin: Plugin, cache_root: Path):
    """diffusers' own pipeline, loaded independently from the same directory."""
    from diffusers import EasyAnimatePipeline, WanImageToVideoPipeline

    cls = WanImageToVideoPipeline if plugin is WAN else EasyAnimatePipeline
    pipe = cls.from_pretrained(str(pipeline_dir(cache_root, plugin)))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def plain_generate(plugin: Plugin, cache_root: Path, raw: dict, guidance: float, seed: int) -> torch.Tensor:
    pipe = plain_pipeline(plugin, cache_root)
    kwargs = dict(prompt=raw["prompt"], negative_prompt="", height=64, width=64, num_frames=9, num_inference_steps=4,
                  guidance_scale=guidance, generator=torch.Generator().manual_seed(seed), output_type="latent")
    if plugin is WAN:
        kwargs.update(image=(raw["image"] + 1) / 2)
    return pipe(**kwargs).frames


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- installation and loading --------------------------------------------------------------
def test_entry_points_resolve_in_a_fresh_interpreter_without_importing_diffusers():
    code = (
        "import sys, json; from workbench.registry import registered, resolve; "
        "names = {k: registered(k) for k in ('backbone', 'adapter')}; "
        "classes = [resolve('backbone', n).__name__ for n in ('wan22_ti2v', 'easyanimate')]; "
        "adapters = ('wan22_latent_residual', 'easyanimate_latent_residual'); "
        "classes += [resolve('adapter', n).__name__ for n in adapters]; "
        "print(json.dumps({'names': names, 'classes': classes, 'diffusers': 'diffusers' in sys.modules}))"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert {"wan22_ti2v", "easyanimate"} <= set(out["names"]["backbone"])
    assert {"wan22_latent_residual", "easyanimate_latent_residual"} <= set(out["names"]["adapter"])
    assert out["classes"] == ["Wan22TI2V", "EasyAnimate", "Wan22LatentResidual", "EasyAnimateLatentResidual"]
    assert out["diffusers"] is False  # resolving is free: diffusers loads when a backbone is built


@pytest.mark.parametrize("plugin", PLUGINS)
def test_save_pretrained_round_trip_loads_every_weight_through_the_plugin(plugin, tmp_path):
    module = __import__(f"{plugin.module}.tiny", fromlist=["build_tiny_pipeline"])
    original = module.build_tiny_pipeline(seed=3)
    original.save_pretrained(str(tmp_path / "pipe"))
    size = sum(p.stat().st_size for p in (tmp_path / "pipe").rglob("*") if p.is_file())
    assert size < 1024 * 1024  # the fixture stays under 1 MB
    base = build("backbone", plugin.backbone, {"path": str(tmp_path / "pipe"), "dtype": "float32"})
    for name in ("transformer", "vae", "text_encoder"):
        assert same_state(state(getattr(original, name)), state(getattr(base, name))), name
    assert type(base.scheduler) is type(original.scheduler)
    private = lambda config: {k: v for k, v in config.items() if not k.startswith("_")}  # noqa: E731
    assert private(base.scheduler.config) == private(original.scheduler.config)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_directory_without_model_index_gets_the_expected_format_and_the_conversion(plugin, tmp_path):
    (tmp_path / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError) as err:
        build("backbone", plugin.backbone, {"path": str(tmp_path)})
    message = str(err.value)
    assert "has no model_index.json, so it is not a diffusers-format pipeline" in message
    assert "found: config.json, diffusion_pytorch_model.safetensors" in message
    assert "model_index.json plus transformer/, vae/, text_encoder/, tokenizer/ and scheduler/" in message
    assert "must be converted first" in message
    with pytest.raises(CheckpointError, match="is not a directory. Expected a diffusers-format pipeline directory"):
        build("backbone", plugin.backbone, {"path": str(tmp_path / "missing")})


def test_a_wan21_style_pipeline_is_refused(cache_root, tmp_path):
    index = json.loads((pipeline_dir(cache_root, WAN) / "model_index.json").read_text())
    index["expand_timesteps"] = False
    import shutil

    shutil.copytree(pipeline_dir(cache_root, WAN), tmp_path / "wan21")
    (tmp_path / "wan21" / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="is not a Wan2.2 TI2V checkpoint: expand_timesteps is false"):
        build("backbone", "wan22_ti2v", {"path": str(tmp_path / "wan21")})


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_card_carries_the_real_models_sampling_defaults_and_precision(plugin, cache_root):
    base = build("backbone", plugin.backbone, {"path": str(pipeline_dir(cache_root, plugin))})
    card = base.card
    s = card.sampling
    if plugin is WAN:
        assert (s.steps, s.guidance_scale, s.height, s.width, s.num_frames, s.fps) == (50, 5.0, 704, 1280, 121, 24)
        assert (s.sampler, s.shift) == ("unipc", 5.0)  # from the scheduler config, as the release's
        assert card.capabilities == ("t2v", "i2v", "ti2v")
    else:
        assert (s.steps, s.guidance_scale, s.height, s.width, s.num_frames, s.fps) == (50, 6.0, 512, 512, 49, 8)
        assert (s.sampler, s.shift) == ("flow_euler", 1.0)
        assert card.capabilities == ("t2v",)
    assert card.prediction_type == "velocity"
    assert card.precision == {"cpu": "float32", "cuda": "bfloat16"}
    assert {"transformer", "vae", "text_encoder", "tokenizer", "scheduler"} <= set(card.components)
    assert card.components["transformer"].parameters == sum(p.numel() for p in base.transformer.parameters())
    assert card.components["transformer"].source.endswith("/transformer")


def test_config_is_validated_by_the_plugins_dataclass_before_anything_loads():
    with pytest.raises(ConfigError) as err:
        build("backbone", "wan22_ti2v", {"path": "tiny", "dtype": "fp8", "stpes": 4})
    message = str(err.value)
    assert "backbone.config.dtype: got str 'fp8'; allowed: 'auto' | 'float32' | 'bfloat16' | 'float16'" in message
    assert "backbone.config.stpes: unknown key." in message and "'steps'" in message.split("Did you mean")[1]
    with pytest.raises(ConfigError, match=r"prompt_template: must contain '\{\}' where the batch's prompt goes"):
        build("backbone", "easyanimate", {"path": "tiny", "prompt_template": "no slot"})

    from workbench_easyanimate.backbone import EasyAnimate, EasyAnimateConfig
    from workbench_wan22.backbone import Wan22Config, Wan22TI2V

    with pytest.raises(TypeError, match=r"pass either a config \(Wan22Config\) or keyword overrides, not both"):
        Wan22TI2V(Wan22Config(path="tiny"), steps=4)
    with pytest.raises(TypeError, match=r"pass either a config \(EasyAnimateConfig\) or keyword overrides"):
        EasyAnimate(EasyAnimateConfig(path="tiny"), steps=4)

# -- the batch -----------------------------------------------------------------------------
@pytest.mark.parametrize("plugin", PLUGINS)
def test_prepare_batch_normalises_with_the_vae_and_pools_signals_onto_latent_frames(plugin, cache_root):
    base = load(plugin, cache_root)
    raw = clips()
    batch = base.prepare_batch(raw)
    latent_size = 64 // plugin.downsample
    assert batch.latents.shape == (2, plugin.channels, 3, latent_size, latent_size)
    assert batch.latents.dtype == torch.float32
    with torch.no_grad():  # clip by clip: a clip's latents never depend on the batch it came in
        mode = torch.cat([base.vae.encode(raw["video"][i:i + 1]).latent_dist.mode() for i in range(2)])
    if plugin is WAN:
        mean = torch.tensor(base.vae.config.latents_mean).view(1, -1, 1, 1, 1)
        expected = (mode - mean) * (1.0 / torch.tensor(base.vae.config.latents_std).view(1, -1, 1, 1, 1))
    else:
        expected = mode * base.vae.config.scaling_factor
    assert torch.equal(batch.latents, expected)
    action = raw["action"]
    pooled = torch.stack([action[:, 0], action[:, 1:5].mean(1), action[:, 5:9].mean(1)], dim=1)
    torch.testing.assert_close(batch.cond["action"], pooled)
    assert torch.equal(batch.cond["action_frames"], action)
    assert {"action", "action_frames"} <= batch.per_frame


def test_wan_first_frame_is_the_pipelines_own_condition_latent(cache_root):
    base = load(WAN, cache_root)
    raw = generation_input(WAN)
    batch = base.prepare_batch(raw)
    pipe = plain_pipeline(WAN, cache_root)
    image = pipe.video_processor.preprocess((raw["image"] + 1) / 2, height=64, width=64)
    _, condition, mask = pipe.prepare_latents(image, 1, 48, 64, 64, 9, torch.float32, torch.device("cpu"),
                                               torch.Generator().manual_seed(0))
    torch.testing.assert_close(batch.cond["first_frame"], condition[:, :, 0], rtol=1e-5, atol=1e-5)
    assert torch.equal(batch.loss_mask, torch.tensor([[0.0, 1.0, 1.0]]))  # the condition frame is not predicted
    # Wan2.2's per-token timestep expansion: the first latent frame's tokens at 0, the rest at 1000 t
    t = torch.tensor([0.25])
    tokens = base.token_timesteps(t, batch.latents.shape)
    expected = (mask[0][0][:, ::2, ::2] * 250.0).flatten()[None]
    assert torch.equal(tokens, expected) and tokens.shape == (1, 3 * 2 * 2)


def test_wan_denoise_conditions_on_the_clean_first_frame(cache_root):
    base = load(WAN, cache_root)
    batch = base.prepare_batch(clips())
    x = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.7, 0.3])
    other = x.clone()
    other[:, :, 0] = torch.randn(other[:, :, 0].shape)
    with torch.no_grad():
        a, b = base.denoise(x, t, batch.cond), base.denoise(other, t, batch.cond)
        direct = base.transformer(hidden_states=torch.cat([batch.cond["first_frame"][:, :, None], x[:, :, 1:]], 2),
                                  timestep=base.token_timesteps(t, x.shape),
                                  encoder_hidden_states=batch.cond["prompt_embeds"], return_dict=False)[0]
    assert torch.equal(a, b)  # frame 0 of x_t is replaced by the condition
    assert torch.equal(a, direct)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_text_is_encoded_once_per_prompt_and_precomputed_embeddings_skip_the_encoder(plugin, cache_root):
    base = load(plugin, cache_root, prompt_key="task", prompt_template="a robot arm doing the {} task")
    calls = []
    hook = base.text_encoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        raw = {**clips(), "task": ["reach-v3", "push-v3"]}
        first = base.prepare_batch(raw)
        again = base.prepare_batch(raw)
        assert len(calls) == 2  # each prompt on its own, once: the second batch came from the cache
        assert torch.equal(first.cond["prompt_embeds"], again.cond["prompt_embeds"])
        assert not torch.equal(first.cond["prompt_embeds"][0], first.cond["prompt_embeds"][1])
        direct = base.encode_text(["a robot arm doing the reach-v3 task"])
        direct = direct[0] if isinstance(direct, tuple) else direct
        assert torch.equal(first.cond["prompt_embeds"][:1], direct)
        given = base.prepare_batch({**clips(), "prompt_embeds": first.cond["prompt_embeds"]})
        assert len(calls) == 2 and torch.equal(given.cond["prompt_embeds"], first.cond["prompt_embeds"])
    finally:
        hook.remove()


BAD_INPUTS = [
    pytest.param(WAN, {"video": torch.zeros(1, 3, 8, 64, 64)}, DataError,
                 r"'video' has 8 frames \(allowed: 1 \+ 4k: 1, 5, 9, 13, \.\.\., 121\); received shape \(T, H, W\) = "
                 r"\(8, 64, 64\)\..*Crop or resize the clips, e.g. a Meta-World window of 9 frames", id="wan-frames"),
    pytest.param(WAN, {"video": torch.zeros(1, 3, 9, 48, 64)}, DataError,
                 r"48x64 pixels \(height and width must be multiples of 32\)", id="wan-size"),
    pytest.param(EASY, {"video": torch.zeros(1, 3, 9, 40, 64)}, DataError,
                 r"40x64 pixels \(height and width must be multiples of 16\)", id="easyanimate-size"),
    pytest.param(WAN, {"video": torch.zeros(1, 3, 9, 64, 64), "action": torch.zeros(1, 8, 4)}, DataError,
                 r"'action' must be \(B, T, D\) with B=1 and T=9 frames, got \(1, 8, 4\)", id="wan-action"),
    pytest.param(WAN, {"video": torch.zeros(1, 3, 9, 64, 64), "prompt_embeds": torch.zeros(1, 4, 7)}, DataError,
                 r"'prompt_embeds' must be \(B, L, 16\) with B=1, got \(1, 4, 7\)", id="wan-embeds"),
]


@pytest.mark.parametrize(("plugin", "raw", "error", "match"), BAD_INPUTS)
def test_bad_inputs_are_refused_with_the_fix(plugin, raw, error, match, cache_root):
    with pytest.raises(error, match=match):
        load(plugin, cache_root).prepare_batch(raw)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_prompts_per_clip_must_match_the_batch(plugin, cache_root):
    with pytest.raises(DataError, match=r"'prompt' must be a str or a list of 2 str \(one per clip\), got list"):
        load(plugin, cache_root).prepare_batch({**clips(), "prompt": ["only one"]})


@pytest.mark.parametrize("plugin", PLUGINS)
def test_missing_text_names_the_three_ways_to_supply_it(plugin, cache_root):
    base = load(plugin, cache_root, prompt=None)
    with pytest.raises(DataError) as err:
        base.prepare_batch(clips(batch=1))
    message = str(err.value)
    assert f"{plugin.backbone}.prepare_batch needs the text condition: a 'prompt' entry (a str, or a list of 1 str)" \
        in message
    assert "precomputed 'prompt_embeds' (B, L, D), or a default prompt in the backbone config" in message
    assert "The batch has keys ['action', 'video']" in message
    assert "prompt_key: task reads the task name" in message


def test_wan_image_to_video_takes_one_clip_per_call(cache_root):
    base = load(WAN, cache_root)
    raw = {"image": torch.zeros(2, 3, 64, 64), "prompt": PROMPT, "frames": 9}
    with pytest.raises(CompositionError, match=r"one clip per call .* this batch has 2\. Generate each clip on its "
                                               r"own: batch\.select\(\[i\]\) for i in range\(2\)"):
        base.generate(raw, steps=2, generator=torch.Generator().manual_seed(0))


# -- identity, parity, recording -----------------------------------------------------------
def full_raw(plugin: Plugin, base) -> dict:
    """A training batch holding every input the plugin takes: the backbone's own example batch, checked against
    the inputs listed for it, so that one dropped from the example batch fails here instead of going unchecked."""
    raw = base.example_batch()
    assert set(raw) == EXAMPLE_BATCH_KEYS[plugin.backbone], sorted(raw)
    return raw


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_plugin_keeps_the_backbone_contract(plugin, cache_root):
    """Every promise in one call, under classifier-free guidance (the card's): identity at init with Add and
    GatedResidual, recorded == unrecorded, a fork's prefix replayed with no model call, a training step that
    leaves the transformer, VAE and text encoder bit-identical, given frames kept, no base weight saved."""
    base = load(plugin, cache_root)
    report = check_backbone(base, raw=full_raw(plugin, base), adapter_factory=lambda: adapter(plugin), steps=4)
    assert report["recording"].detail == "4 steps, 2 base call(s) per step, bit-exact"  # both guidance branches
    given = "given latent frames [0] kept" if plugin is WAN else "this batch has no given frames"
    assert given in report["given_frames"].detail
    if plugin is WAN:  # image-to-video: a second chunk generated from the frame the first produced
        assert report["rollout"].status == "kept", report["rollout"].detail
        assert "chunk 1 from chunk 0's last produced frame" in report["rollout"].detail
    else:  # EasyAnimate's text-to-video release takes no frame: rollouts refuse it, and the kit records why
        assert report["rollout"].status == "skipped" and "context_frames=0" in report["rollout"].detail


def reduced_precisions(card) -> list[torch.dtype]:
    """bfloat16, and float16 where the card lists it: the precisions a GPU runs the backbone in."""
    listed = {d for choice in card.precision.values() for d in ((choice,) if isinstance(choice, str) else choice)}
    return [torch.bfloat16] + ([torch.float16] if "float16" in listed else [])


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_plugin_keeps_the_contract_in_the_precision_the_gpu_runs(plugin, cache_root):
    """The card's GPU precision, on the CPU: loaded in bf16 the backbone is what a float32 load moved to bf16 is
    (what diffusers keeps in float32 stays float32, bit for bit), and every promise holds there (5-frame 32x32
    clips: bf16 arithmetic is slow on a CPU)."""
    config = {"path": str(pipeline_dir(cache_root, plugin)), "height": 32, "width": 32, "num_frames": 5,
              "steps": 2, "prompt": PROMPT}
    for dtype in reduced_precisions(load(plugin, cache_root).card):
        name = str(dtype).removeprefix("torch.")
        loaded = build("backbone", plugin.backbone, {**config, "dtype": name})
        moved = build("backbone", plugin.backbone, {**config, "dtype": "float32"}).to(dtype)
        assert loaded.dtype == moved.dtype == dtype
        a, b = loaded.state_dict(), moved.state_dict()
        assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
        kept = {k for k, v in a.items() if v.is_floating_point() and v.dtype == torch.float32}
        if plugin is WAN:  # the VAE (upstream runs it in float32) and the transformer's _keep_in_fp32_modules
            assert {k for k in kept if not k.startswith("vae.")} == {
                k for k in a if k.startswith("transformer.") and any(
                    m in k.split(".") for m in type(loaded.transformer)._keep_in_fp32_modules)}
            assert any(k.startswith("vae.") for k in kept) and "transformer.blocks.0.norm2.weight" in kept
        else:
            assert kept == set()
        g = torch.Generator().manual_seed(5)
        raw = {"video": torch.rand(2, 3, 5, 32, 32, generator=g) * 2 - 1, "action": torch.rand(2, 5, 4, generator=g),
               "proprio": torch.rand(2, 5, 3, generator=g), "ee_pos": torch.rand(2, 5, 3, generator=g),
               "control": torch.rand(2, 1, 5, 32, 32, generator=g), "prompt": PROMPT}
        negative = loaded.encode_text(["", ""])
        keys = ("negative_prompt_embeds", "negative_prompt_attention_mask")
        raw.update(zip(keys, negative) if isinstance(negative, tuple) else [(keys[0], negative)])
        report = check_backbone(loaded, raw=raw, adapter_factory=lambda: adapter(plugin), steps=2, dtype=dtype)
        assert report.setting == f"cpu {name}"
        assert report["recording"].detail == "2 steps, 2 base call(s) per step, bit-exact"
        assert f"{len(kept)} kept in float32" in report["to"].detail if kept else "kept" not in report["to"].detail
        batch = loaded.prepare_batch(raw)  # latents and the sampler's arithmetic in float32, the network in bf16
        seen: list[torch.dtype] = []

        def input_dtype(module, args, kwargs, out, seen=seen):
            seen.append((kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).dtype)

        hook = loaded.transformer.register_forward_hook(input_dtype, with_kwargs=True)
        x_t, t, _ = ComposedModel(loaded, adapter(plugin), GatedResidual(), loaded.default_objective()).noised(
            batch, torch.Generator().manual_seed(0))
        with torch.no_grad():
            out = loaded.denoise(x_t, t, batch.cond)
        hook.remove()
        assert batch.latents.dtype == x_t.dtype == out.dtype == torch.float32 and seen == [dtype]
        assert loaded.decode(batch.latents).dtype == torch.float32


@pytest.mark.parametrize("guidance", [1.0, 4.0], ids=["no-guidance", "guidance"])
@pytest.mark.parametrize("plugin", PLUGINS)
def test_generate_with_a_zero_adapter_equals_the_plain_diffusers_pipeline(plugin, guidance, cache_root):
    base = load(plugin, cache_root)
    model = ComposedModel(base, adapter(plugin), GatedResidual(), base.default_objective())
    raw = generation_input(plugin)
    ours = model.generate(raw, steps=4, generator=torch.Generator().manual_seed(7), guidance_scale=guidance)
    upstream = plain_generate(plugin, cache_root, raw, guidance, seed=7)
    assert ours.shape == upstream.shape
    assert torch.equal(ours, upstream)
    bare = base.generate(raw, steps=4, generator=torch.Generator().manual_seed(7), guidance_scale=guidance)
    assert torch.equal(bare, upstream)  # the backbone alone runs the same pipeline


def test_wan_text_to_video_matches_the_plain_wan_pipeline(cache_root):
    from diffusers import WanPipeline

    base = load(WAN, cache_root, first_frame=False)
    model = ComposedModel(base, adapter(WAN, seed=1), GatedResidual(), base.default_objective())
    raw = {"prompt": [PROMPT, "a robot arm reaches"], "action": torch.zeros(2, 9, 4)}
    ours = model.generate(raw, steps=4, generator=torch.Generator().manual_seed(2))
    pipe = WanPipeline.from_pretrained(str(pipeline_dir(cache_root, WAN)))
    pipe.set_progress_bar_config(disable=True)
    upstream = pipe(prompt=raw["prompt"], negative_prompt=["", ""], height=64, width=64, num_frames=9,
                    num_inference_steps=4, guidance_scale=WAN.guidance, generator=torch.Generator().manual_seed(2),
                    output_type="latent").frames
    assert ours.shape == (2, 48, 3, 4, 4) and torch.equal(ours, upstream)
    assert "first_frame" not in base.provides() and base.prepare_batch(clips()).loss_mask.all()


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_recording_reports_the_schedulers_sigmas_and_forks_with_changes(plugin, cache_root):
    base = load(plugin, cache_root)
    exp = AdapterExperiment(base=base, adapter=adapter(plugin, nonzero=True), composer=GatedResidual(gate_init=0.5),
                            training=TrainingConfig(progress=False))
    raw = generation_input(plugin)
    traj = exp.sample(raw, steps=4, seed=3)
    step = traj[2]
    assert step.x_t.shape == traj.final.shape and step.x0.shape == traj.final.shape
    assert not torch.equal(step.composed, step.base)  # the adapter is live
    torch.testing.assert_close(step.noise_level, base.pipelines["t2v"].scheduler.sigmas[2].expand(1)
                               if plugin is WAN else base.scheduler.sigmas[2].expand(1))
    again = traj.fork(at=4)  # every step replayed: no model call, same result
    assert torch.equal(again.final, traj.final)
    pushed = traj.fork(at=2, cond={"action": torch.ones(3, 4)})
    assert torch.equal(pushed[1].x_t, traj[1].x_t) and torch.equal(pushed[2].x_t, traj[2].x_t)
    assert not torch.equal(pushed.final, traj.final)
    fresh = traj.fork(at=0, with_adapter=False)
    off = ComposedModel(base, adapter(plugin), GatedResidual(), base.default_objective())
    assert torch.equal(fresh.final, off.generate(raw, steps=4, generator=torch.Generator().manual_seed(3)))


def test_wan_step_through_renders_frames_through_the_shared_preview(cache, cache_root):
    base = load(WAN, cache_root)
    exp = AdapterExperiment(base=base, adapter=adapter(WAN), training=TrainingConfig(progress=False))
    traj = exp.sample(generation_input(WAN), steps=4, seed=0)
    frames = traj.frames(3, kind="x0")
    assert frames.shape == (9, 64, 64, 3) and frames.dtype.name == "uint8"
    full = traj.frames("final", decode="full", chunk_frames=None)
    assert full.shape == (9, 64, 64, 3)


def test_wan_full_decode_of_a_long_clip_is_one_call_through_the_causal_vae(cache_root):
    from workbench.inspect.previews.latent_space import decode_chunked

    base = load(WAN, cache_root)
    z = torch.randn(1, 48, 10, 4, 4, generator=torch.Generator().manual_seed(0))  # more than one default chunk
    with torch.no_grad():
        whole = base.decode(z)
    decoded = decode_chunked(base, z)
    assert decoded.shape == whole.shape == (1, 3, 37, 64, 64)  # 1 + 4 (T' - 1) frames
    assert torch.equal(decoded, whole)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_latent_preview_fits_the_plugins_latents_by_least_squares(plugin, cache, cache_root):
    from workbench.inspect import fit_preview

    base = load(plugin, cache_root)
    h = 64 // plugin.downsample
    # 3 latent frames decode to 9 frames: "3 per latent frame" fits too, the declared causal VAE decides
    preview = fit_preview(base, latent_shape=(plugin.channels, 3, h, h), n_fit=4, n_heldout=2, refit=True)
    assert (preview.channels, preview.downsample, preview.frames_per_latent) == (plugin.channels, plugin.downsample, 4)
    assert preview.causal  # 1 + 4 (T' - 1) frames: the first latent frame has its own map
    assert preview(torch.zeros(1, plugin.channels, 3, h, h)).shape == (1, 3, 9, 64, 64)
    assert preview(torch.zeros(1, plugin.channels, 5, h, h)).shape == (1, 3, 17, 64, 64)
    assert fit_preview(base) is preview  # cached per backbone


# -- classifier-free guidance: each half composed with its own conditions --------------------
class Spy:
    """A ``compose_fn`` that records what each call was given and adds an action-dependent term."""

    def __init__(self, base):
        self.base, self.calls = base, []

    def __call__(self, x, t, batch):
        self.calls.append((x.shape[0], batch))
        return self.base.denoise(x, t, batch.cond) + batch.cond["action"].mean() * 0.1


@pytest.mark.parametrize("plugin", PLUGINS)
def test_guidance_composes_the_unconditional_branch_with_its_conditions_dropped(plugin, cache_root):
    base = load(plugin, cache_root)
    batch = base.prepare_batch(generation_input(plugin))
    spy = Spy(base)
    base.generate(batch, steps=2, generator=torch.Generator().manual_seed(0), compose_fn=spy, guidance_scale=5.0)
    assert len(spy.calls) == 4  # two steps, the conditional then the unconditional branch
    negative = base.negative_embeddings(batch) if plugin is WAN else base.encode_text([""])[0]
    for rows, seen in spy.calls[0::2]:
        assert rows == 1 and torch.equal(seen.cond["action"], batch.cond["action"])
        assert torch.equal(seen.cond["prompt_embeds"], batch.cond["prompt_embeds"])
    for rows, seen in spy.calls[1::2]:
        assert rows == 1 and torch.equal(seen.cond["action"], torch.zeros_like(batch.cond["action"]))
        assert torch.equal(seen.cond["action_frames"], torch.zeros_like(batch.cond["action_frames"]))
        assert torch.equal(seen.cond["prompt_embeds"], negative)
        assert seen.meta["branch"] == "uncond"


def test_easyanimate_splits_the_doubled_batch_and_rejoins_it_in_the_pipelines_order(cache_root):
    """The plugin's result equals the pipeline run with the split written out by hand: rows [0, B) of the
    one transformer call are the unconditional half (composed with zeroed actions), rows [B, 2B) the
    conditional half (the real actions). Swapping the halves, or keeping the actions on the
    unconditional half, changes the result."""
    base = load(EASY, cache_root)
    model = ComposedModel(base, adapter(EASY, nonzero=True), GatedResidual(gate_init=0.5), base.default_objective())
    model.train(False)
    g = torch.Generator().manual_seed(4)
    raw = {"prompt": [PROMPT, "a robot arm reaches"], "action": torch.rand(2, 9, 4, generator=g) * 2 - 1}
    batch = base.prepare_batch(raw)
    ours = model.generate(batch, steps=3, generator=torch.Generator().manual_seed(5), guidance_scale=5.0)

    negative, negative_mask = base.encode_text(["", ""])
    dropped = {**batch.cond, "action": torch.zeros_like(batch.cond["action"]),
               "action_frames": torch.zeros_like(batch.cond["action_frames"])}
    uncond = type(batch)(latents=batch.latents, cond=dropped, per_frame=batch.per_frame)

    def by_hand(swap: bool, keep_actions: bool):
        pipe = plain_pipeline(EASY, cache_root)
        native = pipe.transformer.forward
        first, second = (batch, uncond) if swap else (uncond, batch)
        if keep_actions:
            first = second = batch

        def forward(hidden_states, timestep, **kwargs):
            out = native(hidden_states, timestep, **kwargs)[0]
            sigma = pipe.scheduler.sigmas[pipe.scheduler.step_index or 0].expand(2)
            halves = [model.predict(hidden_states[rows], sigma, b, base_output=out[rows]).composed
                      for rows, b in ((slice(0, 2), first), (slice(2, 4), second))]
            return (torch.cat(halves),)

        pipe.transformer.forward = forward
        return pipe(prompt_embeds=batch.cond["prompt_embeds"],
                    prompt_attention_mask=batch.cond["prompt_attention_mask"], negative_prompt_embeds=negative,
                    negative_prompt_attention_mask=negative_mask, height=64, width=64, num_frames=9,
                    num_inference_steps=3, guidance_scale=5.0,
                    generator=torch.Generator().manual_seed(5), output_type="latent").frames

    assert torch.equal(ours, by_hand(swap=False, keep_actions=False))
    assert not torch.equal(ours, by_hand(swap=True, keep_actions=False))
    assert not torch.equal(ours, by_hand(swap=False, keep_actions=True))


# -- training ------------------------------------------------------------------------------
@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_example_config_trains_through_workbench_train(plugin, cache, tmp_path):
    from workbench.cli import main

    name = "wan22" if plugin is WAN else "easyanimate"
    config = ROOT / "examples" / "configs" / f"{name}.yaml"
    assert main(["train", str(config), "--steps", "2", "--output", str(tmp_path / "run"), "--quiet"]) == 0
    meta = json.loads((tmp_path / "run" / "step-0000002" / "meta.json").read_text())
    assert len(meta["loss_history"]) == 2 and all(v == v for v in meta["loss_history"])
    saved = (tmp_path / "run" / "step-0000002" / "config.yaml").read_text()
    assert f"type: {plugin.backbone}" in saved and "path: tiny" in saved


def test_the_tiny_fixture_cli_writes_a_loadable_pipeline(tmp_path):
    done = forked.run(["-m", "workbench_wan22.tiny", str(tmp_path / "w")])
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith(f"wrote a tiny Wan2.2 TI2V pipeline to {tmp_path / 'w'} (")
    assert (tmp_path / "w" / "model_index.json").is_file()
    assert (tmp_path / "w" / "transformer" / "diffusion_pytorch_model.safetensors").is_file()


# -- one x0 per step ------------------------------------------------------------------------
@pytest.mark.parametrize("plugin", PLUGINS)
def test_one_x0_per_step_under_guidance_and_an_unedited_ablation_changes_nothing(plugin, cache_root):
    """A step's x0 is its composed (conditional) prediction's estimate: what x0_of(recompose) gives, bit for bit,
    so an unedited ablation shows no change at all. The guided estimate (the sampler's update, which mixes in the
    unconditional branch) is the live step's guided_x0, a different tensor."""
    from workbench.inspect import Ablation, record

    # Wan2.2 in its image-to-video mode: the pipeline hands the transformer the image's latent as frame 0 (its
    # tokens at timestep 0) while the scheduler's latents hold noise there; the record keeps what was composed
    base = load(plugin, cache_root)
    model = ComposedModel(base, adapter(plugin, nonzero=True), GatedResidual(gate_init=0.5), base.default_objective())
    raw = dict(generation_input(plugin))
    batch = base.prepare_batch({**raw, "frames": 9})
    live = {}
    traj = record(model, batch, steps=3, seed=0, guidance_scale=5.0, on_step=lambda s: live.setdefault(s.index, s))
    assert base.predictions_per_step(batch, guidance_scale=5.0) == 2
    for i in range(3):
        assert torch.equal(traj.x0_of(traj.recompose(i)).cpu(), traj[i].x0)
        assert torch.equal(live[i].x0.cpu(), traj[i].x0) and not torch.equal(live[i].guided_x0, live[i].x0)
    ablation = Ablation(traj, step=1, condition="action")
    assert torch.equal(ablation.original_x0(), ablation.ablated_x0()) and ablation.change() == 0.0
    ablation.set(0, 0.9)
    assert ablation.change() > 0
