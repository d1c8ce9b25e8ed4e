"""One composed denoise (base no-grad + adapter + composer) vs the same calls by hand."""

from __future__ import annotations

import sys

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import BENCH_BASE, finish, interleaved, report, start

from workbench import ComposedModel, GatedResidual
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    torch.manual_seed(0)
    base = TinyVideo(TinyVideoConfig(**BENCH_BASE))
    adapter = LatentResidual(width=32, depth=2)
    composer = GatedResidual()
    model = ComposedModel(base, adapter, composer, base.default_objective()).train()
    raw = {"video": torch.rand(4, 3, 8, 32, 32) * 2 - 1, "action": torch.rand(4, 8, 4) * 2 - 1}
    batch = base.prepare_batch(raw)
    x_t = torch.randn(batch.latents.shape)
    t = torch.full((4,), 0.6)
    cond = adapter.conditioning(batch, x_t, step=0)
    gate = composer.gate

    def composed():
        model.predict(x_t, t, batch, step=0).composed.sum().backward()

    def by_hand():
        with torch.no_grad():
            b = base.denoise(x_t, t, batch.cond)
        (b + gate * adapter(x_t, t, cond, b)).sum().backward()

    times = interleaved({"ComposedModel.predict": composed, "hand-written": by_hand}, repeats=20)
    report("compose_overhead: composed denoise + backward vs the same calls by hand", times,
           ("ComposedModel.predict", "hand-written"), target=1.05)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
