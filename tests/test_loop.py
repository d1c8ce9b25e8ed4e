"""The shared training loop and the one LR schedule: every recorded training's schedule reproduces,
a Ctrl-C discards a partial step and resumes bit-exactly, wrong settings are refused."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pytest
import torch

from workbench.errors import ConfigError
from workbench.loop import Interrupted, LRSchedule, SigintGuard, TrainingLoop, then
from workbench.train.config import TrainingConfig

torch.set_num_threads(1)


# -- the schedules the trainers used before they shared one -------------------------------------------------
def adapter_experiment_lr(step, steps, base, warmup, schedule, ratio):
    """TrainingConfig.lr_at as it was written before it used LRSchedule."""
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    span = max(1, steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    floor = base * ratio
    return floor + (base - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def pretrain_lr(step, total, peak, warmup):
    """workbench pretrain's own cosine (floor 0.1), as the shipped weights were trained with it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def probe_lr(step, steps, lr):
    """The hand probe's own cosine (floor 0.05, no warm-up), as the shipped probe was trained with it."""
    return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / steps)))


@pytest.mark.parametrize("steps, lr, warmup, schedule, ratio", [
    (100, 1e-4, 0, "constant", 0.0), (100, 3e-4, 10, "constant", 0.0), (100, 1e-3, 0, "cosine", 0.0),
    (250, 2e-4, 20, "cosine", 0.1), (37, 5e-3, 7, "cosine", 0.33), (10, 1e-3, 30, "cosine", 0.0),
])
def test_adapter_experiment_schedule_is_unchanged_bit_for_bit(steps, lr, warmup, schedule, ratio):
    t = TrainingConfig(steps=steps, learning_rate=lr, warmup_steps=warmup, schedule=schedule, min_lr_ratio=ratio)
    for step in range(steps + 5):  # and past the end, where the cosine holds its floor
        assert t.lr_at(step) == adapter_experiment_lr(step, steps, lr, warmup, schedule, ratio), step


@pytest.mark.parametrize("steps, pct_start", [(800, 0.1), (250, 0.1), (12, 0.1), (5, 0.1), (1, 0.1), (97, 0.3)])
def test_one_cycle_is_torchs_one_cycle_lr_with_its_momentum(steps, pct_start):
    net = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    reference = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=pct_start)
    schedule = LRSchedule.one_cycle(3e-3, steps, pct_start=pct_start)
    for step in range(steps):
        group = optimizer.param_groups[0]
        assert (schedule.lr_at(step), schedule.beta1_at(step)) == (group["lr"], group["betas"][0]), step
        optimizer.step()
        reference.step()


def _adamw_run(lrs: list[float], weight_decay: float, n: int = 4096) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=g))
    opt = torch.optim.AdamW([p], lr=lrs[0], weight_decay=weight_decay)
    for step, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.randn(n, generator=g) * (1 + step % 7)
        opt.step()
    return p.detach()


def test_the_shipped_weights_recipes_update_exactly_as_with_their_own_schedules():
    """pretrain and the probe had cosines of their own; LRSchedule computes the same curves in another
    order of floating-point operations (some steps differ in the last bit of a float64), and over the
    whole recorded runs AdamW's float32 updates come out identical bit for bit."""
    from workbench.backbones.tiny_video import TinyVideo
    from workbench.worldmodel.probe import WEIGHTS

    recipe = TinyVideo.from_pretrained().provenance["pretrain_config"]
    probe = json.loads(WEIGHTS.with_suffix(".json").read_text())["train_config"]
    runs = [  # (old curve, new schedule, weight decay)
        ([pretrain_lr(s, recipe["ae_steps"], recipe["ae_learning_rate"], recipe["warmup"])
          for s in range(recipe["ae_steps"])],
         LRSchedule(recipe["ae_learning_rate"], recipe["ae_steps"], recipe["warmup"], floor=0.1), 0.0),
        ([pretrain_lr(s, recipe["steps"], recipe["learning_rate"], recipe["warmup"]) for s in range(recipe["steps"])],
         LRSchedule(recipe["learning_rate"], recipe["steps"], recipe["warmup"], floor=0.1), 0.01),
        ([probe_lr(s, probe["steps"], probe["learning_rate"]) for s in range(probe["steps"])],
         LRSchedule(probe["learning_rate"], probe["steps"], floor=0.05), 1e-4),
    ]
    for old, schedule, decay in runs:
        new = [schedule.lr_at(s) for s in range(schedule.steps)]
        assert max(abs(a - b) / a for a, b in zip(old, new)) < 1e-14  # the same curve, to a few units in the last place
        assert torch.equal(_adamw_run(old, decay), _adamw_run(new, decay))  # the same training


@pytest.mark.parametrize("kwargs, match", [
    ({"peak": 0.0, "steps": 10}, r"peak must be > 0, got 0.0"),
    ({"peak": 1e-3, "steps": 10, "shape": "linear"}, r"shape 'linear' is not one of cosine, constant, one_cycle"),
    ({"peak": 1e-3, "steps": 10, "floor": 2.0}, r"floor must be in \[0, 1\] \(a fraction of peak\), got 2.0"),
    ({"peak": 1e-3, "steps": -1, "warmup": -2}, r"steps must be >= 0, got -1; warmup must be >= 0, got -2"),
    ({"peak": 1e-3, "steps": 10, "momentum": (0.85, 0.95)}, r"momentum must be \(low, high\) .* with shape 'cosine'"),
])
def test_a_wrong_schedule_is_refused_with_every_problem(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LRSchedule(**kwargs)


# -- the loop ----------------------------------------------------------------------------------------------
def _problem(seed: int = 0):
    """A tiny regression with a numpy and a torch generator drawing each step's batch."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()

    def loss_fn(step):
        idx = torch.from_numpy(rng.integers(64, size=8))
        noise = 0.01 * torch.randn(8, 1, generator=gen) + 0.001 * torch.randn(8, 1)  # the global RNG too
        return torch.nn.functional.mse_loss(net(x[idx]), y[idx] + noise)

    opt = torch.optim.AdamW(net.parameters(), lr=3e-2)
    loop = TrainingLoop(opt, LRSchedule(3e-2, 30, warmup=3, floor=0.1), clip_grad_norm=1.0, randomness=[rng, gen],
                        name="toy", progress=False)
    return net, loop, loss_fn


def test_a_run_sets_the_schedule_and_records_every_loss():
    net, loop, loss_fn = _problem()
    x = torch.randn(256, 3, generator=torch.Generator().manual_seed(5))
    before = torch.nn.functional.mse_loss(net(x), x.sum(dim=1, keepdim=True).sin()).item()
    seen = []
    losses = loop.run(lambda step: (seen.append(loop.optimizer.param_groups[0]["lr"]), loss_fn(step))[1])
    assert loop.step == 30 and len(losses) == 30 and losses is loop.losses
    assert seen == [loop.schedule.lr_at(s) for s in range(30)]
    after = torch.nn.functional.mse_loss(net(x), x.sum(dim=1, keepdim=True).sin()).item()
    assert after < 0.85 * before  # it learns (measured 0.31 from 0.39)


def test_after_update_runs_once_per_completed_step():
    net, loop, loss_fn = _problem()
    calls = []
    loop.after_update = calls.append
    loop.run(loss_fn, until=4)
    assert calls == [0, 1, 2, 3]


@pytest.mark.parametrize("where", ["loss", "backward", "held update"])
def test_a_ctrl_c_discards_the_partial_step_and_resume_is_bit_exact(where):
    reference_net, reference, loss_fn = _problem()
    reference.run(loss_fn)

    net, loop, loss_fn = _problem()
    state_at = {}

    def interrupting(step):
        loss = loss_fn(step)
        if step == 11 and not state_at:
            state_at.update({k: v.clone() for k, v in net.state_dict().items()})
            if where == "loss":
                raise KeyboardInterrupt
            if where == "backward":
                loss.register_hook(lambda grad: (_ for _ in ()).throw(KeyboardInterrupt()))
            else:  # a Ctrl-C signal during the update is held until the update is complete
                loop.after_update = lambda s: (signal.raise_signal(signal.SIGINT), setattr(loop, "after_update", None))
        return loss

    with pytest.raises(Interrupted) as stopped:
        loop.run(interrupting)
    done = 12 if where == "held update" else 11
    err = stopped.value
    assert (err.step, err.steps, loop.step, len(loop.losses)) == (done, 30, done, done)
    assert str(err) == (f"Interrupted: toy stopped cleanly after step {done} of 30 (a partial step was discarded, so "
                        f"the model holds step {done}'s weights). Continue with resume() on this exception (`except "
                        f"Interrupted as stop: stop.resume()`; in a notebook, `sys.last_value.resume()`).")
    assert isinstance(err, KeyboardInterrupt)
    if where != "held update":  # nothing of step 11 reached the weights or the gradients
        assert all(torch.equal(v, state_at[k]) for k, v in net.state_dict().items())
        assert all(p.grad is None for p in net.parameters())
    assert err.resume() == reference.losses
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), reference_net.state_dict().values()))


def test_then_resumes_the_remaining_stages():
    net, loop, loss_fn = _problem()
    calls = []

    def stage_one():
        def loss(step):
            if step == 5 and not calls:
                calls.append("stopped")
                raise KeyboardInterrupt
            return loss_fn(step)
        return loop.run(loss, until=10)

    with pytest.raises(Interrupted) as stopped:
        then(stage_one, lambda losses: ("finished", len(losses)))
    assert stopped.value.step == 5 and loop.step == 5
    assert stopped.value.resume() == ("finished", 10)


def test_randomness_must_be_generators_it_can_roll_back():
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"expected numpy or torch Generators, got RandomState"):
        TrainingLoop(opt, LRSchedule(0.1, 3), randomness=[np.random.RandomState(0)])


def test_the_guard_restores_the_previous_handler():
    previous = signal.getsignal(signal.SIGINT)
    with SigintGuard() as guard:
        assert signal.getsignal(signal.SIGINT) == guard._handle
    assert signal.getsignal(signal.SIGINT) == previous
