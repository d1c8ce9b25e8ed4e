"""The tiny preview on the pretrained tiny_video: dB gained over the linear preview and cost vs the full decode.

Fidelity is PSNR against ``base.decode`` on held-out Meta-World clips (the shipped sample's
validation split, encoded by the base: what a trajectory's clean estimates look like) and on
held-out data-free latents (what the preview was distilled on); cost is the median CPU time of
rendering one clip each way (targets: >= +6 dB over linear, <= 0.10 of the full decode).
``--distil`` distils afresh (timed; target <= 2 minutes on one thread) instead of loading the
preview shipped with workbench.
"""

from __future__ import annotations

import sys
import time

import torch
from _bench import finish, interleaved, judge, median, ratio, start
from torch.utils.data import default_collate

from workbench.backbones.tiny_video import TinyVideo
from workbench.data.metaworld import MetaWorldClips
from workbench.inspect import fit_preview
from workbench.metrics import psnr


def main(argv: list[str] | None = None) -> int:
    distil = "--distil" in start(argv, __doc__).extra
    base = TinyVideo.from_pretrained()
    linear = fit_preview(base, cache=False)
    started = time.perf_counter()
    tiny = fit_preview(base, kind="tiny", refit=distil, cache=not distil)
    seconds = time.perf_counter() - started
    print(f"{tiny!r}")
    print(f"{'distilled' if distil else 'loaded'} in {seconds:.1f} s (wall)")
    if distil:
        judge("distillation time, minutes", seconds / 60, 2.0, fmt=".2f")
    val = MetaWorldClips(path="sample", window=16, stride=8, split="val")
    video = default_collate([val[i] for i in range(5, 65, 10)])["video"]
    with torch.no_grad():
        z = base.encode(video)
        full = base.decode(z)
    p_linear, p_tiny = psnr(linear(z), full, data_range=255.0), psnr(tiny(z), full, data_range=255.0)
    print(f"held-out Meta-World clips (6 x 16 frames): linear {p_linear:.1f} dB, tiny {p_tiny:.1f} dB")
    judge("gain of the tiny preview over the linear one, dB", p_tiny - p_linear, 6.0, at_most=False, fmt="+.1f")
    print(f"held-out data-free latents: linear {tiny.linear_psnr:.1f} dB, tiny {tiny.psnr:.1f} dB, "
          f"gain {tiny.psnr - tiny.linear_psnr:+.1f} dB")
    one = z[:1]
    t = interleaved({"full": lambda: base.decode(one), "tiny": lambda: tiny(one), "linear": lambda: linear(one)},
                    repeats=15)
    print(f"one clip (16 frames): full {median(t['full']) * 1e3:.1f} ms, tiny {median(t['tiny']) * 1e3:.1f} ms, "
          f"linear {median(t['linear']) * 1e3:.2f} ms (CPU time)")
    judge("tiny / full decode", ratio(t, "tiny", "full"), 0.10)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
