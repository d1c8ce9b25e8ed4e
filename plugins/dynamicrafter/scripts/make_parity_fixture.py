"""Run the upstream DynamiCrafter code on tiny random weights and save its outputs as the parity fixture.

Not needed at test time: ``tests/test_plugin_dynamicrafter_parity.py`` reads the file this writes
(``plugins/dynamicrafter/tests/fixtures/parity.safetensors`` and ``parity.json``). It runs in a
separate environment that holds the upstream code's own dependencies (see the plugin README):

    python make_parity_fixture.py --upstream /path/to/DynamiCrafter --out ../tests/fixtures

Every module is the upstream one at its pinned commit, built at :data:`PARITY_SIZES` (every size
knob changed); the weights are :func:`random_state` of the upstream modules' own key layout, so
our test rebuilds the same weights from the seed. Three samplers run end to end: the 512 recipe
(v, zero-terminal-SNR, trailing spacing, guidance rescale, dynamic rescale 0.7), the 256 recipe
with the multi-condition image CFG (eps, uniform spacing, learnable image scales), and the 1024
schedule (dynamic rescale 0.3) without guidance at eta 0.5.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
SEED = 0


def load_reference():
    file = HERE.parent / "workbench_dynamicrafter" / "reference.py"
    spec = importlib.util.spec_from_file_location("dc_reference", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stub_modules():
    """What the upstream modules import but these checks never use."""
    sys.modules.setdefault("cv2", types.ModuleType("cv2"))
    fake = types.ModuleType("transformers")
    for name in ("T5Tokenizer", "T5EncoderModel", "CLIPTokenizer", "CLIPTextModel"):
        setattr(fake, name, object)
    sys.modules.setdefault("transformers", fake)
    # torchvision's compiled operators do not match every torch build; open_clip only needs its Python parts
    sys.modules.setdefault("torchvision._meta_registrations",
                           types.ModuleType("torchvision._meta_registrations"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="a checkout of Doubiiu/DynamiCrafter")
    parser.add_argument("--out", default=str(HERE.parent / "tests" / "fixtures"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    stub_modules()
    sys.path.insert(0, str(Path(args.upstream).resolve()))
    ref = load_reference()
    sizes = ref.PARITY_SIZES

    import open_clip
    from lvdm.models.autoencoder import AutoencoderKL
    from lvdm.models.ddpm3d import DDPM, DiffusionWrapper, LatentDiffusion
    from lvdm.models.samplers.ddim import DDIMSampler
    from lvdm.models.samplers.ddim_multiplecond import DDIMSampler as DDIMSamplerMultiCond
    from lvdm.modules.encoders.condition import FrozenOpenCLIPEmbedder, FrozenOpenCLIPImageEmbedderV2
    from lvdm.modules.encoders.resampler import Resampler
    from lvdm.modules.networks.openaimodel3d import UNetModel

    for sampler in (DDIMSampler, DDIMSamplerMultiCond):  # upstream moves its tables to "cuda" unconditionally
        sampler.register_buffer = lambda self, name, attr: setattr(self, name, attr)

    arch = "dynamicrafter-parity"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{arch}.json").write_text(json.dumps({
            "embed_dim": sizes["clip_embed_dim"],
            "vision_cfg": {"image_size": sizes["vision_image_size"], "layers": sizes["vision_layers"],
                           "width": sizes["vision_width"],
                           "head_width": sizes["vision_width"] // sizes["vision_heads"],
                           "patch_size": sizes["vision_patch"]},
            "text_cfg": {"context_length": 77, "vocab_size": sizes["text_vocab"],
                         "width": sizes["text_width"], "heads": sizes["text_heads"],
                         "layers": sizes["text_layers"]}}))
        open_clip.add_model_config(tmp)
        text = FrozenOpenCLIPEmbedder(arch=arch, version=None, device="cpu", layer="penultimate")
        vision = FrozenOpenCLIPImageEmbedderV2(arch=arch, version=None, device="cpu")
    frames = sizes["frames"]
    resampler = Resampler(dim=sizes["resampler_dim"], depth=sizes["resampler_depth"],
                          dim_head=sizes["resampler_head_dim"], heads=sizes["resampler_heads"],
                          num_queries=16, embedding_dim=sizes["vision_width"],
                          output_dim=sizes["context_dim"], ff_mult=sizes["resampler_ff_mult"],
                          video_length=frames)
    vae = AutoencoderKL(ddconfig=dict(double_z=True, z_channels=4, resolution=256, in_channels=3, out_ch=3,
                                      ch=sizes["vae_channels"][0],
                                      ch_mult=[c // sizes["vae_channels"][0] for c in sizes["vae_channels"]],
                                      num_res_blocks=sizes["vae_res_blocks"], attn_resolutions=[],
                                      dropout=0.0),
                        lossconfig={"target": "torch.nn.Identity"}, embed_dim=4)

    def unet(learnable: bool, default_fs: int) -> torch.nn.Module:
        return UNetModel(in_channels=8, model_channels=sizes["model_channels"], out_channels=4,
                         num_res_blocks=sizes["num_res_blocks"],
                         attention_resolutions=list(sizes["attention_resolutions"]), dropout=0.1,
                         channel_mult=list(sizes["channel_mult"]), num_head_channels=sizes["head_channels"],
                         transformer_depth=1, context_dim=sizes["context_dim"], use_linear=True,
                         use_checkpoint=False,
                         temporal_conv=True, temporal_attention=True, temporal_selfatt_only=True,
                         use_relative_position=False, use_causal_attention=False, temporal_length=frames,
                         addition_attention=True, image_cross_attention=True,
                         image_cross_attention_scale_learnable=learnable, default_fs=default_fs,
                         fs_condition=True)

    unets = {"512": unet(False, 24), "256": unet(True, 3), "1024": unet(False, 10)}
    parts = {"first_stage_model.": vae, "cond_stage_model.": text, "embedder.": vision,
             "image_proj_model.": resampler}
    layouts = {}
    for name, net in unets.items():
        state = {"model.diffusion_model." + k: v for k, v in net.state_dict().items()}
        for prefix, module in parts.items():
            state.update({prefix + k: v for k, v in module.state_dict().items()})
        layouts[name] = {k: list(v.shape) for k, v in state.items()}
        values = ref.random_state(layouts[name], SEED)
        net.load_state_dict({k[len("model.diffusion_model."):]: v for k, v in values.items()
                             if k.startswith("model.diffusion_model.")}, strict=True)
        for prefix, module in parts.items():
            module.load_state_dict({k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)},
                                   strict=True)
    for module in (*unets.values(), *parts.values()):
        module.eval()

    g = torch.Generator().manual_seed(1234)
    out: dict[str, torch.Tensor] = {}
    # -- the pieces ----------------------------------------------------------------------------
    x = torch.randn(2, 8, frames, 8, 8, generator=g)
    t = torch.tensor([981, 37])
    context = torch.randn(2, 77 + frames * 16, sizes["context_dim"], generator=g)
    # not per-frame: repeated for every frame
    shared = torch.randn(2, 77 + 5, sizes["context_dim"], generator=g)
    fs = torch.tensor([24, 7])
    tokens = torch.randint(1, sizes["text_vocab"] - 2, (2, 77), generator=g)
    tokens[:, 0], tokens[0, 20], tokens[0, 21:] = sizes["text_vocab"] - 2, sizes["text_vocab"] - 1, 0
    image = torch.rand(2, 3, 40, 40, generator=g) * 2 - 1
    # shrunk to the tower's 224 with the Gaussian pre-blur (made from its own seed: too big to store)
    big = torch.rand(1, 3, 720, 560, generator=torch.Generator().manual_seed(77)) * 2 - 1
    pixels = torch.rand(2, 3, 16, 16, generator=g) * 2 - 1
    latents = torch.randn(2, 4, 8, 8, generator=g)
    out.update(unet_x=x, unet_t=t, unet_context=context, unet_shared_context=shared, unet_fs=fs,
               text_tokens=tokens, image=image, image_big_sum=big.double().sum(), vae_pixels=pixels,
               vae_latents=latents)
    with torch.no_grad():
        for name, net in unets.items():
            out[f"unet_{name}"] = net(x, t, context=context, fs=fs)
        out["unet_512_shared"] = unets["512"](x, t, context=shared, fs=None)
        out["text"] = text.encode_with_transformer(tokens)
        out["vision"] = vision(image)
        out["vision_big"] = vision(big)
        out["resampler"] = resampler(out["vision"])
        out["vae_encode"] = vae.encode(pixels).mode() * 0.18215
        out["vae_decode"] = vae.decode(latents / 0.18215)

    # -- whole DDIM runs ---------------------------------------------------------------------------
    recipes = {
        "512": dict(variant="512", prediction="v", zero_snr=True, base_scale=0.7, steps=3,
                    spacing="uniform_trailing", eta=1.0, guidance=7.5, cfg_img=None, rescale=0.7, fs=24,
                    seed=11),
        "256": dict(variant="256", prediction="eps", zero_snr=False, base_scale=None, steps=4,
                    spacing="uniform", eta=1.0, guidance=7.5, cfg_img=2.0, rescale=0.0, fs=3, seed=12),
        "1024": dict(variant="1024", prediction="v", zero_snr=True, base_scale=0.3, steps=3,
                     spacing="uniform_trailing", eta=0.5, guidance=1.0, cfg_img=None, rescale=0.0, fs=10,
                     seed=13),
    }
    first = pixels[:1]  # 16x16: the VAE (2x) gives the 8x8 latents sampled below
    empty = torch.zeros(1, 77, dtype=torch.long)
    empty[0, 0], empty[0, 1] = sizes["text_vocab"] - 2, sizes["text_vocab"] - 1
    with torch.no_grad():
        z = vae.encode(first).mode() * 0.18215
        concat = z[:, :, None].repeat(1, 1, frames, 1, 1)
        image_ctx = resampler(vision(first))
        zero_ctx = resampler(vision(torch.zeros_like(first)))
        text_c, text_u = text.encode_with_transformer(tokens[:1]), text.encode_with_transformer(empty)
    out.update(sample_tokens=tokens[:1], sample_empty_tokens=empty, sample_image=first)
    for name, r in recipes.items():
        holder = torch.nn.Module()
        holder.v_posterior, holder.parameterization, holder.rescale_betas_zero_snr = (
            0.0, r["prediction"], r["zero_snr"])
        DDPM.register_schedule(holder, beta_schedule="linear", timesteps=1000, linear_start=0.00085,
                               linear_end=0.012)
        holder.use_dynamic_rescale = r["base_scale"] is not None
        if holder.use_dynamic_rescale:
            arr = np.concatenate((np.linspace(1.0, r["base_scale"], 400), np.full(1000, r["base_scale"])))
            holder.register_buffer("scale_arr", torch.tensor(arr, dtype=torch.float32))
        wrapper = DiffusionWrapper.__new__(DiffusionWrapper)
        torch.nn.Module.__init__(wrapper)
        wrapper.diffusion_model, wrapper.conditioning_key = unets[name], "hybrid"
        holder.model = wrapper
        holder.device = torch.device("cpu")
        for method in ("apply_model",):
            setattr(holder, method, types.MethodType(getattr(LatentDiffusion, method), holder))
        for method in ("predict_eps_from_z_and_v", "predict_start_from_z_and_v"):
            setattr(holder, method, types.MethodType(getattr(DDPM, method), holder))
        cond = {"c_crossattn": [torch.cat([text_c, image_ctx], 1)], "c_concat": [concat]}
        uc = {"c_crossattn": [torch.cat([text_u, zero_ctx], 1)], "c_concat": [concat]}
        kwargs = {}
        if r["cfg_img"] is not None:
            sampler = DDIMSamplerMultiCond(holder)
            kwargs = dict(cfg_img=r["cfg_img"],
                          unconditional_conditioning_img_nonetext={
                              "c_crossattn": [torch.cat([text_u, image_ctx], 1)], "c_concat": [concat]})
        else:
            sampler = DDIMSampler(holder)
        torch.manual_seed(r["seed"])
        x_T = torch.randn(1, 4, frames, 8, 8)
        # the sampler draws x_T itself from the same stream, then each step's noise
        torch.manual_seed(r["seed"])
        with torch.no_grad():
            samples, _ = sampler.sample(S=r["steps"], conditioning=cond, batch_size=1,
                                        shape=(4, frames, 8, 8), verbose=False,
                                        unconditional_guidance_scale=r["guidance"],
                                        unconditional_conditioning=uc if r["guidance"] != 1.0 else None,
                                        eta=r["eta"],
                                        fs=torch.tensor([r["fs"]]), timestep_spacing=r["spacing"],
                                        guidance_rescale=r["rescale"], **kwargs)
        out[f"sample_{name}_x_T"] = x_T
        out[f"sample_{name}"] = samples
        out[f"sample_{name}_ddim_timesteps"] = torch.as_tensor(
            np.asarray(sampler.ddim_timesteps).astype(np.int64))
        out[f"schedule_{name}_alphas_cumprod"] = holder.alphas_cumprod.clone()

    from safetensors.torch import save_file

    target = Path(args.out)
    target.mkdir(parents=True, exist_ok=True)
    save_file({k: v.clone().contiguous() for k, v in out.items()}, str(target / "parity.safetensors"))
    commit = subprocess.run(["git", "-C", args.upstream, "rev-parse", "HEAD"], capture_output=True, text=True)
    provenance = {
        "made_by": "plugins/dynamicrafter/scripts/make_parity_fixture.py",
        "upstream": "https://github.com/Doubiiu/DynamiCrafter",
        "upstream_commit": commit.stdout.strip() or "c453369367122d7fbb0aa38f124e76dc8fe2a91c",
        "versions": {"torch": torch.__version__, "open_clip": getattr(open_clip, "__version__", "2.22.0"),
                     "numpy": np.__version__, "python": sys.version.split()[0]},
        "seed": SEED, "sizes": sizes, "recipes": recipes,
        "layout_keys": {name: len(layout) for name, layout in layouts.items()},
    }
    (target / "parity.json").write_text(json.dumps(provenance, indent=1, default=list) + "\n")
    size = (target / "parity.safetensors").stat().st_size
    print(f"wrote {target / 'parity.safetensors'} ({size / 1024:.0f} KiB) and parity.json")


if __name__ == "__main__":
    main()
