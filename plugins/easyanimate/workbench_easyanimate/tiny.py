"""A tiny random EasyAnimate pipeline in the diffusers layout, for tests and examples (no downloads).

The real diffusers classes at toy sizes: ``AutoencoderKLMagvit`` (8x spatial, 4x temporal, 4
latent channels), a 2-layer ``EasyAnimateTransformer3DModel``, a 2-layer Qwen2-VL text encoder
with a character-level tokenizer and a chat template, and ``FlowMatchEulerDiscreteScheduler``.
64x64 frames, 9 frames → 8x8x3 latents. About 0.6 MB on disk, written with ``save_pretrained``
and loaded back like any real checkpoint.

    python -m workbench_easyanimate.tiny OUT_DIR

``path: tiny`` in an ``easyanimate`` config builds it once under ``$WORKBENCH_CACHE/fixtures``.
"""

from __future__ import annotations

import torch

from workbench.backbones.diffusers_bridge import TinyFixture

VERSION = 1
CHARACTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + [
    " ", "-", ".", ":", "\n", "Ġ", "Ċ"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% for c in m['content'] %}{{ c['text'] }}{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_pipeline(seed: int = 0):
    """The tiny ``EasyAnimatePipeline`` (random weights from ``seed``), every module in eval mode."""
    from diffusers import (
        AutoencoderKLMagvit,
        EasyAnimatePipeline,
        EasyAnimateTransformer3DModel,
        FlowMatchEulerDiscreteScheduler,
    )
    from transformers import Qwen2Tokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vocab = {piece: i for i, piece in enumerate([*dict.fromkeys(CHARACTERS), *SPECIAL])}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLMagvit(in_channels=3, latent_channels=4, out_channels=3,
                                  block_out_channels=[8, 8, 8, 8], layers_per_block=1, norm_num_groups=4,
                                  spatial_group_norm=False)
        # attention_head_dim 16: smaller heads trip the 3-D rotary embedding's split
        transformer = EasyAnimateTransformer3DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, patch_size=2,
            sample_width=8, sample_height=8, time_embed_dim=16, num_layers=2, mmdit_layers=2,
            text_embed_dim=16)
        config = Qwen2VLConfig(
            text_config=dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                             rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
                             bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"]),
            vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, patch_size=2,
                               spatial_merge_size=1, temporal_patch_size=1, in_channels=3, mlp_ratio=2))
        text_encoder = Qwen2VLForConditionalGeneration(config)
    for module in (vae, transformer, text_encoder):
        module.eval()
    return EasyAnimatePipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                               transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))


FIXTURE = TinyFixture(f"easyanimate-tiny-v{VERSION}", build_tiny_pipeline, "a tiny EasyAnimate pipeline",
                      "python -m workbench_easyanimate.tiny")
save_tiny_pipeline = FIXTURE.save  # (out_dir, seed=0) -> Path

if __name__ == "__main__":
    FIXTURE.main()
