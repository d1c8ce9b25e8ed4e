"""exp.fit steps vs a minimal hand-written PyTorch loop doing the same work, on two tiny_video sizes.

The hand loop draws the same noise and t, calls the same base, adapter, gate and constraint,
the same masked loss and the same AdamW: after the timed rounds both have trained the same
number of steps, and their weights are checked to be bit-identical (otherwise the comparison
would be of different work, and the script fails). What is left between them is the loop's
fixed cost per step — callbacks, the LR schedule, the data stream, the loss bookkeeping and
the rest — reported in µs per step beside the ratio. The small case (base forward of a few
milliseconds, as on a GPU) is where that fixed cost shows; on the larger one it vanishes.

Two single-step measurements resolve that fixed cost better than whole rounds on a loaded machine:
the loop alone (the model's work replaced by a one-parameter loss in both), and the fixed cost with
the whole composition path in place but the model's work made nearly free (judged: <= 100 µs).
"""

from __future__ import annotations

import statistics
import sys

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import BENCH_BASE, finish, interleaved, judge, report, scaled, start

from workbench import AdapterExperiment, GatedResidual, SideAdapter, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.train.seeds import mix_seed

SMALL_BASE = dict(image_size=16, frames=4, width=16, ae_width=8, depth=1)
TINY_BASE = dict(image_size=8, frames=2, width=8, ae_width=8, depth=1)  # 2x2 latents: the step is nearly all overhead
CASES = {
    # name: (backbone config, batch size, adapter width/depth, steps per round, rounds, target ratio)
    "tiny": (TINY_BASE, 1, dict(width=8, depth=1), 20, 61, None),
    "small": (SMALL_BASE, 2, dict(width=16, depth=1), 20, 41, 1.03),
    "bench": (BENCH_BASE, 4, dict(width=32, depth=2), 3, 8, 1.05),
}


def experiment(base_config: dict, adapter_config: dict) -> AdapterExperiment:
    torch.manual_seed(0)
    return AdapterExperiment(base=TinyVideo(TinyVideoConfig(**base_config)), adapter=LatentResidual(**adapter_config),
                             composer=GatedResidual(),
                             training=TrainingConfig(learning_rate=1e-4, progress=False, clip_grad_norm=None,
                                                     sync_every=10))


def run_case(name: str) -> float:
    base_config, batch_size, adapter_config, steps, rounds, target = CASES[name]
    steps, rounds = scaled(steps, 2), scaled(rounds, 1)
    size, frames = base_config["image_size"], base_config["frames"]
    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(batch_size, 3, frames, size, size, generator=g) * 2 - 1,
           "action": torch.rand(batch_size, frames, 4, generator=g) * 2 - 1}
    data = [raw] * (steps * (rounds + 2))
    exp = experiment(base_config, adapter_config)
    # The hand loop trains an identical copy with the same parts, called directly.
    ref = experiment(base_config, adapter_config).model
    base, adapter, gate, objective = ref.base, ref.adapter, ref.composer.gate, ref.objective
    seed = exp.training.seed
    opt = torch.optim.AdamW([*adapter.parameters(), gate], lr=1e-4, weight_decay=0.0)
    generator = torch.Generator()
    done = [0]

    def fit():
        exp.fit(data, steps=steps)

    def hand_loop():
        adapter.train()
        for step in range(done[0], done[0] + steps):
            batch = base.prepare_batch(raw)
            noise, t = objective.sample_noise_and_t(batch.latents, generator.manual_seed(mix_seed(seed, step, 0)))
            x_t = objective.add_noise(batch.latents, noise, t)
            with torch.no_grad():
                b = base.denoise(x_t, t, batch.cond)
            cond = adapter.conditioning(batch, x_t, step=step, training=True)
            pred = base.constrain(b + gate * adapter(x_t, t, cond, b), x_t, t, batch.cond)
            loss = objective.loss(pred, objective.target(batch.latents, noise, t), batch.loss_mask)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        done[0] += steps
        adapter.train(False)

    times = interleaved({"exp.fit": fit, "hand-written loop": hand_loop}, repeats=rounds, warmup=1)
    ours, theirs = exp.model.trainable_state_dict(), ref.trainable_state_dict()
    if exp.step != done[0] or any(not torch.equal(ours[k], theirs[k]) for k in theirs):
        raise SystemExit(f"train_overhead ({name}): exp.fit and the hand loop did not train identically "
                         f"({exp.step} vs {done[0]} steps); the comparison would be meaningless.")
    value = report(f"train_overhead ({name}): {steps} training steps per round, exp.fit vs a minimal loop "
                   f"(weights bit-identical after {exp.step} steps each)", times,
                   ("exp.fit", "hand-written loop"), target=target)
    extra = sorted((a - b) / steps * 1e6 for a, b in zip(times["exp.fit"], times["hand-written loop"]))
    quartiles = statistics.quantiles(extra, n=4) if len(extra) > 1 else extra * 3
    print(f"  fixed cost of exp.fit: {statistics.median(extra):+.0f} us per step (median over {rounds} rounds; "
          f"quartiles {quartiles[0]:+.0f} .. {quartiles[2]:+.0f}; hand step "
          f"{statistics.median(times['hand-written loop']) / steps * 1e3:.2f} ms)")
    if name == "bench":
        trainable = sum(p.numel() for p in exp.model.trainable_parameters())
        frozen = sum(p.numel() for p in exp.model.base.parameters())
        with_state = sum(p.numel() for p in exp.optimizer.state)
        print(f"  trainable parameters {trainable:,}  frozen base parameters {frozen:,}")
        print(f"  optimizer state held for {with_state:,} parameters (trainable only: {with_state == trainable})")
    return value


def loop_only(steps: int = 3000) -> float:
    """The loop's own cost per step, timed step by step: the model's work (prepare, noise, base,
    adapter, loss) replaced by a one-parameter loss in both loops, so what differs is only what
    ``exp.fit`` does around it (the composition's own cost is compose_overhead.py's subject)."""
    from workbench.loop import SigintGuard

    exp = experiment(TINY_BASE, dict(width=8, depth=1))
    raw = {"video": torch.zeros(1, 3, 2, 8, 8), "action": torch.zeros(1, 2, 4)}
    batch = exp.model.base.prepare_batch(raw)
    gate = exp.model.composer.gate
    exp.model.base.prepare_batch = lambda _raw: batch
    exp.model.training_loss = lambda _batch, generator=None, step=None, base_half=None: ((gate * 2.0).square(), None)
    exp.optimizer = torch.optim.AdamW([gate], lr=1e-4, weight_decay=0.0)
    stream, guard = exp.feed.stream([raw] * (2 * steps)), SigintGuard()
    hooks = exp._hooks()
    exp.model.train()
    param = torch.nn.Parameter(torch.tensor(0.1))
    opt, generator, done = torch.optim.AdamW([param], lr=1e-4, weight_decay=0.0), torch.Generator(), [0]

    def hand_step():
        generator.manual_seed(mix_seed(0, done[0], 0))
        (param * 2.0).square().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        done[0] += 1

    variants = {"exp.fit step": lambda: exp._run_step(stream, hooks, guard), "hand-written step": hand_step}
    times = interleaved(variants, repeats=steps, warmup=scaled(50, 0))
    steps = len(next(iter(times.values())))  # (one under --quick)
    extra = sorted(a - b for a, b in zip(*times.values()))
    low = [sorted(v)[len(v) // 10] for v in times.values()]
    print(f"train_overhead (loop only): {steps} single steps each, interleaved")
    hand, median = statistics.median(times["hand-written step"]) * 1e6, statistics.median(extra) * 1e6
    q1, q3 = extra[len(extra) // 4] * 1e6, extra[3 * len(extra) // 4] * 1e6
    print(f"  hand-written step {hand:.0f} us; exp.fit's extra per step: median {median:+.0f} us, "
          f"quartiles {q1:+.0f} .. {q3:+.0f} us, 10th percentiles {(low[0] - low[1]) * 1e6:+.0f} us")
    return statistics.median(extra)


class _Scale(SideAdapter):
    """A one-parameter adapter (``scale * x_t``): the cheapest adapter that trains."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x_t, t, cond, base_output=None):
        return self.scale * x_t


def fixed_cost(steps: int = 4000) -> float:
    """exp.fit's fixed cost per step with the whole composition path in place (noise draws from the
    per-step generator, base, adapter, gate, first-frame constraint, the masked fp32 loss, AdamW) but
    the model's work made nearly free: the base's denoiser one multiply, the batch prepared once, a
    one-parameter adapter. The hand step makes the same calls directly; the weights are checked to
    match. Single steps interleaved, so the difference resolves a few µs on a loaded machine."""
    from workbench.loop import SigintGuard

    def make() -> AdapterExperiment:
        torch.manual_seed(0)
        return AdapterExperiment(base=TinyVideo(TinyVideoConfig(**TINY_BASE)), adapter=_Scale(),
                                 composer=GatedResidual(),
                                 training=TrainingConfig(learning_rate=1e-4, progress=False, clip_grad_norm=None,
                                                         sync_every=10))

    exp, ref = make(), make().model
    raw = {"video": torch.zeros(1, 3, 2, 8, 8), "action": torch.zeros(1, 2, 4)}
    batch = exp.model.base.prepare_batch(raw)
    for base in (exp.model.base, ref.base):
        base.prepare_batch = lambda _raw: batch
        base.denoise = lambda x_t, t, cond: x_t * 0.5
    stream, guard = exp.feed.stream([raw] * (2 * steps + 200)), SigintGuard()
    hooks = exp._hooks()  # the gate statistics included
    exp.model.train()
    base, adapter, gate, objective = ref.base, ref.adapter, ref.composer.gate, ref.objective
    adapter.train()
    opt = torch.optim.AdamW([*adapter.parameters(), gate], lr=1e-4, weight_decay=0.0)
    generator, done = torch.Generator(), [0]

    def hand_step():
        step = done[0]
        batch = base.prepare_batch(raw)
        noise, t = objective.sample_noise_and_t(batch.latents, generator.manual_seed(mix_seed(0, step, 0)))
        x_t = objective.add_noise(batch.latents, noise, t)
        with torch.no_grad():
            b = base.denoise(x_t, t, batch.cond)
        cond = adapter.conditioning(batch, x_t, step=step, training=True)
        pred = base.constrain(b + gate * adapter(x_t, t, cond, b), x_t, t, batch.cond)
        objective.loss(pred, objective.target(batch.latents, noise, t), batch.loss_mask).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        done[0] += 1

    variants = {"exp.fit step": lambda: exp._run_step(stream, hooks, guard), "hand-written step": hand_step}
    times = interleaved(variants, repeats=steps, warmup=scaled(100, 0))
    exp._sync()
    ours, theirs = exp.model.trainable_state_dict(), ref.trainable_state_dict()
    if exp.step != done[0] or any(not torch.equal(ours[k], theirs[k]) for k in theirs):
        raise SystemExit("train_overhead (fixed cost): exp.fit and the hand steps did not train identically.")
    steps = len(next(iter(times.values())))
    extra = sorted(a - b for a, b in zip(*times.values()))
    median_extra = statistics.median(extra)
    print(f"train_overhead (fixed cost, the model's work stubbed): {steps} single steps each, interleaved, "
          f"weights bit-identical")
    print(f"  hand-written step {statistics.median(times['hand-written step']) * 1e6:.0f} us; quartiles of exp.fit's "
          f"extra {extra[len(extra) // 4] * 1e6:+.0f} .. {extra[3 * len(extra) // 4] * 1e6:+.0f} us")
    judge("  exp.fit's fixed cost per step (us)", median_extra * 1e6, 100, fmt="+.0f")
    return median_extra


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    for name in CASES:
        run_case(name)
    loop_only(scaled(3000, 20))
    fixed_cost(scaled(4000, 20))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
