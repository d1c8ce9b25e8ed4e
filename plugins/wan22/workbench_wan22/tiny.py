"""A tiny random Wan2.2 TI2V pipeline in the diffusers layout, for tests and examples (no downloads).

The real diffusers classes at toy sizes: ``AutoencoderKLWan`` with Wan2.2's 48 latent channels,
16x spatial and 4x temporal compression; a 2-layer ``WanTransformer3DModel``; a 1-layer UMT5
text encoder with a character-level tokenizer; Wan2.2's ``UniPCMultistepScheduler`` (flow
prediction, shift 5); ``expand_timesteps=True``. 64x64 frames, 9 frames → 4x4x3 latents. About
0.3 MB on disk, written with ``save_pretrained`` and loaded back like any real checkpoint.

    python -m workbench_wan22.tiny OUT_DIR      # writes OUT_DIR/model_index.json, transformer/, vae/, ...

``path: tiny`` in a ``wan22_ti2v`` config builds it once under ``$WORKBENCH_CACHE/fixtures``.
"""

from __future__ import annotations

import torch

from workbench.backbones.diffusers_bridge import TinyFixture

VERSION = 1
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + ["-", "▁"]


def build_tiny_pipeline(seed: int = 0):
    """The tiny ``WanPipeline`` (random weights from ``seed``), every module in eval mode."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(
            base_dim=3, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
            dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
            scale_factor_spatial=16, scale_factor_temporal=4,
            latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=48,
            out_channels=48, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32)
        vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(piece, -1.0) for piece in LETTERS]
        tokenizer = T5Tokenizer(vocab=vocab)
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=len(vocab), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
            relative_attention_num_buckets=8))
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=5.0, num_train_timesteps=1000)
    for module in (vae, transformer, text_encoder):
        module.eval()
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=transformer, expand_timesteps=True)


FIXTURE = TinyFixture(f"wan22-ti2v-tiny-v{VERSION}", build_tiny_pipeline, "a tiny Wan2.2 TI2V pipeline",
                      "python -m workbench_wan22.tiny")
save_tiny_pipeline = FIXTURE.save  # (out_dir, seed=0) -> Path

if __name__ == "__main__":
    FIXTURE.main()
