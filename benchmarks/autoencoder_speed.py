"""The embedded model's autoencoder on a CPU: slices of 16 frames and a copy-made upsampling (what
``TinyVideo.encode`` / ``decode`` run) vs one call over every frame with torch's nearest upsampling.

The shipped 64x64 model, 12 clips of 16 frames: a chunk of the policy replay (``workbench eval --policies``
decodes 24 clips a chunk). Targets: decode <= 0.70, encode <= 0.85 of the one-call time; the outputs equal bit
for bit (checked here too, and in tests/test_tiny_video_autoencoder.py).
"""

from __future__ import annotations

import sys

import torch
from _bench import finish, interleaved, report, scaled, start
from torch import nn

from workbench.backbones.tiny_video import TinyVideo
from workbench.backbones.tiny_video_networks import Upsample2x


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    base = TinyVideo.from_pretrained()
    base.requires_grad_(False)
    one_call = nn.Sequential(*[nn.Upsample(scale_factor=2, mode="nearest") if isinstance(m, Upsample2x) else m
                               for m in base.autoencoder.decoder])
    clips = scaled(12, 2)
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(clips, base.config.latent_channels, 16, 16, 16, generator=g)
    video = torch.rand(clips, 3, 16, 64, 64, generator=g) * 2 - 1
    frames = latents.permute(0, 2, 1, 3, 4).reshape(-1, *latents.shape[1:2], 16, 16)

    def decode_one_call():
        return one_call(base._denorm(frames)).clamp(-1, 1)

    with torch.no_grad():
        same = torch.equal(base.decode(latents).permute(0, 2, 1, 3, 4).reshape(-1, 3, 64, 64), decode_one_call())
        pixels = video.permute(0, 2, 1, 3, 4).reshape(-1, 3, 64, 64)
        same &= torch.equal(base.encode(video).permute(0, 2, 1, 3, 4).reshape(pixels.shape[0], -1, 16, 16),
                            base._norm(base.autoencoder.encoder(pixels)))
        print(f"{clips} clips of 16 frames at 64x64; sliced == one call, bit for bit: {same}")
        t = interleaved({"decode, slices": lambda: base.decode(latents),
                         "decode, one call": decode_one_call,
                         "encode, slices": lambda: base.encode(video),
                         "encode, one call": lambda: base._norm(base.autoencoder.encoder(pixels))},
                        repeats=scaled(7))
    report("decode", {k: v for k, v in t.items() if k.startswith("decode")},
           ("decode, slices", "decode, one call"), 0.70)
    report("encode", {k: v for k, v in t.items() if k.startswith("encode")}, ("encode, slices", "encode, one call"),
           0.85)
    return finish() if same else 1


if __name__ == "__main__":
    sys.exit(main())
