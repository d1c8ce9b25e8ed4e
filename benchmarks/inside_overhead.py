"""exp.fit steps with each adapter inside the base vs a hand-written loop doing the same work.

For ``lora`` the hand-written loop is plain peft (``inject_adapter_in_model`` on the denoiser, an
AdamW over the LoRA weights, the base called with gradients). ``action_modulation`` and
``controlnet`` have no peft counterpart: their hand-written loop drives the same adapter modules
directly (``adapter.engaged`` around ``base.denoise``), without the experiment or the composed
model. One adapted base call per step on both sides.
"""

from __future__ import annotations

import sys

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import BENCH_BASE, finish, interleaved, report, start

from workbench import AdapterExperiment, Replace, TrainingConfig
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.config import build
from workbench.core.backbone import freeze

STEPS = 3
KINDS = {"lora": {"rank": 8}, "action_modulation": {"hidden": 32, "lora": {"rank": 4}}, "controlnet": {"blocks": 1}}


def base() -> TinyVideo:
    torch.manual_seed(0)
    return TinyVideo(TinyVideoConfig(**BENCH_BASE))


def hand_written(kind: str, raw: dict):
    """The loop a researcher would write by hand for ``kind`` (see the module docstring)."""
    net = base()
    freeze(net)
    objective = net.default_objective()
    generator = torch.Generator()
    if kind == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        targets = ["spatial", "temporal", "film", "down", "up", "merge", "out"]
        inject_adapter_in_model(LoraConfig(r=8, lora_alpha=8, target_modules=targets), net.denoiser)
        params = [p for p in net.parameters() if p.requires_grad]
        adapter = None
    else:
        adapter = build("adapter", kind, KINDS[kind])
        adapter.bind(net)
        adapter.set_objective(objective)
        adapter.attach_base_model(net)
        params = list(adapter.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)

    def loop():
        for step in range(STEPS):
            batch = net.prepare_batch(raw)
            noise, t = objective.sample_noise_and_t(batch.latents, generator.manual_seed(step))
            x_t = objective.add_noise(batch.latents, noise, t)
            if adapter is None:
                pred = net.denoise(x_t, t, batch.cond)
            else:
                cond = adapter.conditioning(batch, x_t, step=step, training=True)
                with adapter.engaged(cond, x_t, t):
                    pred = net.denoise(x_t, t, batch.cond)
            loss = objective.loss(pred, objective.target(batch.latents, noise, t), batch.loss_mask)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return loop


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    torch.manual_seed(0)
    raw = {"video": torch.rand(4, 3, 8, 32, 32) * 2 - 1, "action": torch.rand(4, 8, 4) * 2 - 1}
    data = [raw] * 1000
    ratios = {}
    for kind, config in KINDS.items():
        exp = AdapterExperiment(base=base(), adapter=build("adapter", kind, config), composer=Replace(),
                                training=TrainingConfig(learning_rate=1e-4, progress=False, clip_grad_norm=None,
                                                        sync_every=10))
        hand = hand_written(kind, raw)
        times = interleaved({"exp.fit": lambda exp=exp: exp.fit(data, steps=STEPS), "hand-written loop": hand},
                            repeats=8, warmup=1)
        ratios[kind] = report(f"inside_overhead[{kind}]: {STEPS} training steps, exp.fit vs a hand-written loop",
                              times, ("exp.fit", "hand-written loop"), target=1.05)
        trainable = sum(p.numel() for p in exp.model.trainable_parameters())
        with_state = sum(p.numel() for p in exp.optimizer.state)
        print(f"  trainable parameters {trainable:,}; optimizer state for {with_state:,} (trainable only: "
              f"{with_state == trainable})")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
