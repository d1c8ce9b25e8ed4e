"""Plugin overhead: ``wan22_ti2v`` ``generate()`` with a zero adapter vs diffusers' own pipeline.

On the tiny Wan2.2 TI2V pipeline (128x128, 17 frames, 20 steps, guidance 5: two transformer
calls of 80 tokens per step), timed interleaved in one process: the plain
``WanImageToVideoPipeline`` call, the plugin's ``generate()`` through the composed model
(recording off), ``record()`` (recording on), and the bare backbone's ``generate()`` (the
injection alone). The plain pipeline gets the same precomputed text embeddings. The targets
(<= 1.05 off, <= 1.10 on) are for the plugin's machinery, measured with a zero adapter that
costs one multiply; the last line adds the reference ``wan22_latent_residual`` for scale: on
this toy transformer its convolutions are a sizeable fraction of a transformer call, on the
real 5B model a rounding error.

Each ratio also comes as the plugin's fixed cost in µs per sampling step (the median over rounds
of the difference to the pipeline, divided by the steps). The toy transformer's call is so short
that recording's copies weigh several percent of it; the same comparison on a wider transformer
(the tiny pipeline with a 4-layer, 128-wide transformer: a step four times longer, the same
latents) shows the ratio falling as the step grows while the µs per step stay put.

The second case is ``dynamicrafter``, whose sampler is the plugin's own: on its tiny model
(64x64, 8 frames, 10 DDIM steps, guidance 7.5: two U-Net calls per step) the bare sampler (the
U-Net called directly) against ``generate()`` with the zero adapter (target <= 1.03) and
``record()`` (target <= 1.05).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from _bench import finish, interleaved, judge, median, ratio, scaled, start
from torch import nn

from workbench import ComposedModel, GatedResidual, SideAdapter
from workbench.config import build
from workbench.inspect import record

STEPS = 20
SIZE, FRAMES = 128, 17  # 8x8 latents x 5 latent frames: 80 tokens per transformer call


class ZeroScale(SideAdapter):
    """The cheapest zero-initialised adapter: ``scale * x_t`` with ``scale = 0``."""

    at_init = "zero_output"

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(()))

    def forward(self, x_t, t, cond, base_output=None):
        return self.scale * x_t


WIDE = dict(num_attention_heads=4, attention_head_dim=32, ffn_dim=512, num_layers=4)
"""The wider transformer of the second Wan case (the tiny one: 2 heads of 8, ffn 32, 2 layers)."""


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    with tempfile.TemporaryDirectory() as tmp:  # (the text encoder loads from it when first needed)
        wan(tmp)
        wan(tmp, wide=True)
        dynamicrafter(tmp)
    return finish()


def per_step(t: dict[str, list[float]], name: str, steps: int) -> float:
    """``name``'s extra CPU time over the plain pipeline, in µs per sampling step (median over rounds)."""
    return median([a - b for a, b in zip(t[name], t["pipeline"])]) / steps * 1e6


def save_wide_pipeline(folder: Path) -> Path:
    """The tiny pipeline with the transformer replaced by a wider, deeper one (random weights)."""
    from diffusers import WanTransformer3DModel
    from workbench_wan22.tiny import save_tiny_pipeline

    save_tiny_pipeline(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = WanTransformer3DModel(patch_size=(1, 2, 2), in_channels=48, out_channels=48, text_dim=16,
                                            freq_dim=16, rope_max_seq_len=32, **WIDE).eval()
    transformer.save_pretrained(str(folder / "transformer"), safe_serialization=True)
    return folder


def wan(tmp: str, wide: bool = False) -> None:
    from workbench_wan22.tiny import save_tiny_pipeline

    steps = scaled(STEPS, 2)
    folder = save_wide_pipeline(Path(tmp) / "wan22-wide") if wide else save_tiny_pipeline(Path(tmp) / "wan22-tiny")
    config = {"path": str(folder), "height": SIZE, "width": SIZE, "num_frames": FRAMES, "steps": steps,
              "prompt": "a robot arm pushes a puck"}
    base = build("backbone", "wan22_ti2v", config)
    model = ComposedModel(base, ZeroScale(), GatedResidual(), base.default_objective())
    residual = build("adapter", "wan22_latent_residual", {"width": 8, "depth": 1})  # zero output at init too
    reference = ComposedModel(base, residual, GatedResidual(), base.default_objective())
    g = torch.Generator().manual_seed(0)
    batch = base.prepare_batch({"image": torch.rand(1, 3, SIZE, SIZE, generator=g) * 2 - 1, "frames": FRAMES,
                                "action": torch.rand(1, FRAMES, 4, generator=g)})
    negative = base.negative_embeddings(batch)
    pipe = base.pipelines["i2v"]  # diffusers' pipeline over the same modules (not wrapped outside generate)

    def plain():
        return pipe(image=(batch.cond["image"] + 1) / 2, prompt_embeds=batch.cond["prompt_embeds"],
                    negative_prompt_embeds=negative, height=SIZE, width=SIZE, num_frames=FRAMES,
                    num_inference_steps=steps, guidance_scale=5.0, generator=torch.Generator().manual_seed(0),
                    output_type="latent").frames

    def plugin():
        return model.generate(batch, steps=steps, generator=torch.Generator().manual_seed(0))

    def backbone_alone():  # the injection with the bare base as the composition: the plugin's own share
        return base.generate(batch, steps=steps, generator=torch.Generator().manual_seed(0))

    def recorded():
        return record(model, batch, steps=steps, seed=0).final

    def with_residual():
        return reference.generate(batch, steps=steps, generator=torch.Generator().manual_seed(0))

    expected = plain()
    variants = {"pipeline": plain, "generate": plugin, "record": recorded, "backbone": backbone_alone,
                "latent_residual": with_residual}
    if wide:  # the question there is only how the ratios scale
        variants = {name: variants[name] for name in ("pipeline", "generate", "record")}
    assert all(torch.equal(fn(), expected) for fn in variants.values())  # the same result, bit for bit
    t = interleaved(variants, repeats=21 if wide else 61)
    size = "wider transformer, " if wide else ""
    print(f"pipeline {median(t['pipeline']) * 1e3:.1f} ms, generate {median(t['generate']) * 1e3:.1f} ms, "
          f"record {median(t['record']) * 1e3:.1f} ms ({size}{SIZE}x{SIZE}x{FRAMES}, {steps} steps, guidance 5, "
          f"CPU time)")
    if wide:
        print(f"  wider transformer: generate / pipeline = {ratio(t, 'generate', 'pipeline'):.3f} "
              f"({per_step(t, 'generate', steps):+.0f} us per step), record / pipeline = "
              f"{ratio(t, 'record', 'pipeline'):.3f} ({per_step(t, 'record', steps):+.0f} us per step)")
        return
    judge("generate / pipeline", ratio(t, "generate", "pipeline"), 1.05)
    print(f"  {per_step(t, 'generate', steps):+.0f} us per step")
    judge("record / pipeline", ratio(t, "record", "pipeline"), 1.10)
    print(f"  {per_step(t, 'record', steps):+.0f} us per step")
    print(f"base.generate (injection, no composition) / pipeline = {ratio(t, 'backbone', 'pipeline'):.3f} "
          f"({per_step(t, 'backbone', steps):+.0f} us per step)")
    print(f"generate with wan22_latent_residual (width 8) / pipeline = "
          f"{ratio(t, 'latent_residual', 'pipeline'):.3f} (adapter compute included)")


def dynamicrafter(tmp: str) -> None:
    import os

    os.environ.setdefault("WORKBENCH_CACHE", tmp)  # the tiny checkpoint is built there once
    base = build("backbone", "dynamicrafter", {"path": "tiny", "variant": "512", "prompt": "a robot arm",
                                               "steps": scaled(10, 2), "height": 64, "width": 64, "num_frames": 8})
    model = ComposedModel(base, ZeroScale(), GatedResidual(), base.default_objective())
    g = torch.Generator().manual_seed(0)
    batch = base.prepare_batch({"image": torch.rand(1, 3, 64, 64, generator=g) * 2 - 1, "frames": 8,
                                "action": torch.rand(1, 8, 4, generator=g)})

    def bare():  # our sampler, the U-Net called directly (no composition)
        return base.generate(batch, generator=torch.Generator().manual_seed(0))

    def plugin():
        return model.generate(batch, generator=torch.Generator().manual_seed(0))

    def recorded():
        return record(model, batch, seed=0).final

    variants = {"sampler": bare, "generate": plugin, "record": recorded}
    expected = bare()
    assert all(torch.equal(fn(), expected) for fn in variants.values())
    t = interleaved(variants, repeats=21)
    print(f"dynamicrafter sampler {median(t['sampler']) * 1e3:.1f} ms (tiny model, 64x64x8, "
          f"{base.card.sampling.steps} steps, guidance 7.5)")
    judge("dynamicrafter generate / sampler", ratio(t, "generate", "sampler"), 1.03)
    judge("dynamicrafter record / sampler", ratio(t, "record", "sampler"), 1.05)


if __name__ == "__main__":
    sys.exit(main())
