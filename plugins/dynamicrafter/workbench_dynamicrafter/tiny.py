"""A tiny random DynamiCrafter in the official checkpoint layout, for tests and examples (no downloads).

Our own model classes at toy sizes (:data:`TINY_SIZES`): a one-level U-Net at 32 channels, a
4x VAE, one-layer towers with a character-level vocabulary, a one-layer resampler; 8 frames.
The weights are seeded random values (:mod:`workbench_dynamicrafter.reference`) with the
variant's real schedule buffers; random values need no precision, so they are stored as float8
(e4m3) safetensors (about 0.85 MB) and loaded back through ``from_checkpoint`` exactly like an
official file (as float32).

    python -m workbench_dynamicrafter.tiny OUT_DIR [--variant 512]   # writes OUT_DIR/model.safetensors

``path: tiny`` in a ``dynamicrafter`` config builds it once under ``$WORKBENCH_CACHE/fixtures``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.backbones.diffusers_bridge import fixture_directory
from workbench_dynamicrafter.reference import SCHEDULE, random_state

VERSION = 1
TINY_SIZES = dict(
    model_channels=32, channel_mult=(1,), num_res_blocks=1, attention_resolutions=(1,), head_channels=16,
    context_dim=32, init_attn_heads=2, frames=8,
    text_width=32, text_layers=2, text_heads=2, text_vocab=64,
    vision_width=32, vision_layers=1, vision_heads=2, vision_image_size=28, vision_patch=14,
    clip_embed_dim=16,
    resampler_dim=32, resampler_depth=1, resampler_heads=2, resampler_head_dim=16, resampler_ff_mult=2,
    vae_channels=(32, 32, 32), vae_res_blocks=1,
)


def tiny_state(variant: str = "512", seed: int = 0) -> dict[str, torch.Tensor]:
    """The tiny model's checkpoint (upstream key layout, float32)."""
    from workbench_dynamicrafter.checkpoint import upstream_shapes
    from workbench_dynamicrafter.model import DynamiCrafterModel
    from workbench_dynamicrafter.variants import get_variant, schedule_buffers

    v = get_variant(variant)
    with torch.device("meta"):
        model = DynamiCrafterModel(v, v.sizes.replace(**TINY_SIZES))
    state = random_state(upstream_shapes(model), seed)
    state.update(schedule_buffers(v))
    return state


def save_tiny_checkpoint(out_dir: str | Path, seed: int = 0, variant: str = "512") -> Path:
    """Write ``out_dir/model.safetensors`` (float8 weights, float32 schedule) and a ``model_index.json``
    note."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v if k in SCHEDULE else v.to(torch.float8_e4m3fn)).contiguous()
             for k, v in tiny_state(variant, seed).items()}
    save_file(state, str(out / "model.safetensors"))
    (out / "model_index.json").write_text(json.dumps({"model": "dynamicrafter-tiny", "variant": variant,
                                                      "seed": seed, "sizes": TINY_SIZES}, indent=1))
    return out


def ensure_tiny_checkpoint(variant: str = "512") -> Path:
    """The tiny checkpoint file under ``$WORKBENCH_CACHE/fixtures`` (built once, atomically)."""
    folder = fixture_directory(f"dynamicrafter-tiny-{variant}-v{VERSION}",
                               lambda d: save_tiny_checkpoint(d, 0, variant))
    return folder / "model.safetensors"


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m workbench_dynamicrafter.tiny",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", default="512", choices=["256", "512", "1024", "512_interp"])
    args = parser.parse_args(argv)
    out = save_tiny_checkpoint(args.out_dir, args.seed, args.variant)
    size = (out / "model.safetensors").stat().st_size
    print(f"wrote a tiny DynamiCrafter ({args.variant}) to {out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
