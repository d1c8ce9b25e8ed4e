"""exp.fit steps vs a minimal hand-written PyTorch loop doing the same work on tiny_video."""

from __future__ import annotations

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import BENCH_BASE, interleaved, report

from workbench import AdapterExperiment, GatedResidual, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig

STEPS = 3


def main() -> float:
    torch.manual_seed(0)
    raw = {"video": torch.rand(4, 3, 8, 32, 32) * 2 - 1, "action": torch.rand(4, 8, 4) * 2 - 1}
    data = [raw] * 1000
    exp = AdapterExperiment(base=TinyVideo(TinyVideoConfig(**BENCH_BASE)), adapter=LatentResidual(width=32, depth=2),
                            composer=GatedResidual(), training=TrainingConfig(learning_rate=1e-4, progress=False,
                                                                              clip_grad_norm=None, sync_every=10))
    base = TinyVideo(TinyVideoConfig(**BENCH_BASE)).eval().requires_grad_(False)
    adapter = LatentResidual(width=32, depth=2)
    gate = torch.nn.Parameter(torch.tensor(0.1))
    exp_ref = AdapterExperiment(base=base, adapter=adapter, composer=GatedResidual(),
                                training=TrainingConfig(progress=False))  # binds conditions and the objective
    opt = torch.optim.AdamW([*adapter.parameters(), gate], lr=1e-4)
    objective = base.default_objective()
    generator = torch.Generator()

    def fit():
        exp.fit(data, steps=STEPS)

    def hand_loop():
        for step in range(STEPS):
            batch = base.prepare_batch(raw)
            noise, t = objective.sample_noise_and_t(batch.latents, generator.manual_seed(step))
            x_t = objective.add_noise(batch.latents, noise, t)
            with torch.no_grad():
                b = base.denoise(x_t, t, batch.cond)
            cond = adapter.conditioning(batch, x_t, step=step, training=True)
            pred = b + gate * adapter(x_t, t, cond, b)
            loss = objective.loss(pred, objective.target(batch.latents, noise, t), batch.loss_mask)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    times = interleaved({"exp.fit": fit, "hand-written loop": hand_loop}, repeats=8, warmup=1)
    ratio = report(f"train_overhead: {STEPS} training steps, exp.fit vs a minimal loop", times,
                   ("exp.fit", "hand-written loop"), target=1.05)
    trainable = sum(p.numel() for p in exp.model.trainable_parameters())
    frozen = sum(p.numel() for p in exp.model.base.parameters())
    with_state = sum(p.numel() for p in exp.optimizer.state)
    print(f"  trainable parameters {trainable:,}  frozen base parameters {frozen:,}")
    print(f"  optimizer state held for {with_state:,} parameters (trainable only: {with_state == trainable})")
    del exp_ref
    return ratio


if __name__ == "__main__":
    main()
