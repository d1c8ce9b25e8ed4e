"""Trajectories: recorded == unrecorded, forks replay their prefix without model calls, a fork at
0 is a fresh run, a stopped run resumes exactly, and ablations reuse the cached base output."""

from __future__ import annotations

import pytest
import torch
from conftest import nonzero_model, raw_batch

from workbench import Add, ComposedModel, GatedResidual, MaskMix, NoiseGated, PretrainWarmup
from workbench.adapters.latent_residual import LatentResidual
from workbench.errors import CallbackError, CompositionError, InspectError, StepError, StorageWarning
from workbench.inspect import StopSampling, StoragePolicy, estimate_memory, record
from workbench.inspect.recording.step import TrajectoryStep

STEPS = 5


class Counter:
    """Counts base denoise calls and adapter forward calls."""

    def __init__(self, model: ComposedModel):
        self.base = self.adapter = 0
        denoise = model.base.denoise

        def counted(*args, **kwargs):
            self.base += 1
            return denoise(*args, **kwargs)

        model.base.denoise = counted
        model.adapter.register_forward_pre_hook(lambda *_: setattr(self, "adapter", self.adapter + 1))

    def reset(self):
        self.base = self.adapter = 0


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(params=["flow_matching", "diffusion"])
def model(request) -> ComposedModel:
    return nonzero_model(request.param)


@pytest.fixture
def batch(model):
    return model.base.prepare_batch(raw_batch())


def pushed(batch):
    return {"action": torch.ones_like(batch.cond["action"]) * 0.9}


# -- parity ----------------------------------------------------------------------------------
def test_recorded_final_is_bit_identical_to_generate(model, batch):
    plain = model.generate(batch, steps=STEPS, generator=seeded(3))
    traj = record(model, batch, steps=STEPS, seed=3)
    assert torch.equal(traj.final, plain)
    bare = model.base.generate(batch, steps=STEPS, generator=seeded(3))
    assert not torch.equal(bare[:, :, 1:], plain[:, :, 1:])  # the adapter matters in this run
    assert traj.complete and len(traj) == STEPS and traj.stored == tuple(range(STEPS))


def test_record_false_keeps_only_the_final_latents(model, batch):
    traj = record(model, batch, steps=STEPS, seed=3, record=False)
    assert torch.equal(traj.final, model.generate(batch, steps=STEPS, generator=seeded(3)))
    assert traj.stored == () and traj.nbytes() == traj.final.numel() * 4
    with pytest.raises(StepError, match="record=False, which keeps only traj.final"):
        traj[0]
    with pytest.raises(StepError, match=r"fork\(at=2\): this trajectory kept no replay cache"):
        traj.fork(at=2)
    assert torch.equal(traj.fork(at=0).final, traj.final)  # a fork at 0 needs no cache


def test_steps_hold_every_intermediate(model, batch):
    traj = record(model, batch, steps=STEPS, seed=1)
    obj = model.objective
    for k in range(STEPS - 1):
        step = traj[k]
        assert step.index == k and step.steps == STEPS
        predicted = slice(1, None)  # frame 0 is given: the composed prediction is pinned to it like the base's
        assert torch.equal(step.composed[:, :, predicted],
                           (step.base + step.diagnostics.gate * step.adapter)[:, :, predicted])
        assert torch.equal(step.composed[:, :, 0], step.base[:, :, 0])
        assert not torch.equal(step.composed, step.base)
        # what was recorded is what the sampler used: pinning it again changes nothing
        assert torch.equal(model.base.pin_first_frame(step.composed, step.x_t, step.t, batch.cond), step.composed)
        assert torch.equal(step.x0, obj.x0_from_prediction(step.composed, step.x_t, step.t))
        assert torch.equal(step.noise_level, obj.noise_level(step.t))
        assert traj[k + 1].x_t is not None and not torch.equal(traj[k + 1].x_t, step.x_t)
    assert all(s.x_t.device.type == "cpu" for s in traj)
    assert step.diagnostics.gate.ndim == 0 and step.diagnostics.mask is None  # typed fields


def test_one_x0_per_step_what_recompose_gives(model, batch):
    """x0 is the composed prediction's estimate: x0_of(recompose(k)) reproduces it bit for bit; without guidance
    the sampler's own (guided) estimate handed to on_step equals it."""
    live = {}
    traj = record(model, batch, steps=STEPS, seed=1, on_step=lambda s: live.setdefault(s.index, s))
    for k in range(STEPS):
        assert torch.equal(traj.x0_of(traj.recompose(k)), traj[k].x0)
        assert torch.equal(live[k].guided_x0, live[k].x0) and torch.equal(live[k].x0, traj[k].x0)


# -- forks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("at", [1, 3])
def test_fork_replays_the_prefix_without_model_calls(model, batch, at):
    traj = record(model, batch, steps=STEPS, seed=2)
    counter = Counter(model)
    fork = traj.fork(at=at, cond=pushed(batch))
    assert (counter.base, counter.adapter) == (STEPS - at, STEPS - at)  # only the live steps
    assert fork.parent is traj and fork.fork_step == at
    for k in range(at):
        assert fork[k] is traj[k] and fork.replayed(k)
    assert torch.equal(fork[at].x_t, traj[at].x_t)  # the sampler reproduced x_at bit for bit
    assert torch.equal(fork[at].base, traj[at].base)
    assert not torch.equal(fork[at].adapter, traj[at].adapter)  # the new action is live from `at`
    assert not fork.replayed(at)
    assert not torch.equal(fork.final[:, :, 1:], traj.final[:, :, 1:])
    assert fork.label == f"fork@{at}: cond"


def test_a_fork_is_its_parents_prefix_plus_its_live_steps(model, batch):
    """One log entry per step: a fork shares its parent's first ``at`` entries (the same objects, no copy) and
    adds its own; a fork that keeps no replay cache can still be forked inside the prefix it shares."""
    traj = record(model, batch, steps=STEPS, seed=2)
    fork = traj.fork(at=2, cond=pushed(batch), storage=StoragePolicy(replay=False))
    assert len(fork.log) == STEPS and fork.log[:2] == traj.log[:2]
    assert all(a is b for a, b in zip(fork.log[:2], traj.log[:2]))
    assert all(entry.calls is None for entry in fork.log[2:]) and all(e.calls for e in traj.log)
    assert torch.equal(fork.times, traj.times) and torch.equal(fork.noise_levels, traj.noise_levels)
    assert fork.nbytes() < fork.nbytes(own=False)  # the shared prefix is the parent's
    again = fork.fork(at=1)  # inside the shared prefix: replayable, with the fork's conditions live from step 1
    assert torch.equal(again.final, traj.fork(at=1, cond=pushed(batch)).final)
    assert torch.equal(again[0].x_t, traj[0].x_t) and again.log[0] is traj.log[0]
    with pytest.raises(StepError, match=r"fork\(at=3\): this trajectory kept no replay cache"):
        fork.fork(at=3)


def test_fork_at_zero_equals_a_fresh_run_with_those_settings(model, batch):
    traj = record(model, batch, steps=STEPS, seed=4)
    fresh = record(model, {**raw_batch(), **pushed(batch)}, steps=STEPS, seed=4)
    assert torch.equal(traj.fork(at=0, cond=pushed(batch)).final, fresh.final)
    bare = model.base.generate(batch, steps=STEPS, generator=seeded(4))
    assert torch.equal(traj.fork(at=0, with_adapter=False).final, bare)
    gated = traj.fork(at=0, gate_override=0.25).final
    with torch.no_grad():
        model.composer.gate.fill_(0.25)
    assert torch.equal(gated, model.generate(batch, steps=STEPS, generator=seeded(4)))


def test_fork_with_no_change_equals_the_parent(model, batch):
    traj = record(model, batch, steps=STEPS, seed=5)
    for at in (0, 2, STEPS):
        fork = traj.fork(at=at)
        assert torch.equal(fork.final, traj.final), at
        for k in range(STEPS):
            for name in ("x_t", "x0", "base", "adapter", "composed"):
                assert torch.equal(getattr(fork[k], name), getattr(traj[k], name)), (at, k, name)


def test_stopped_run_resumes_bit_identically(model, batch):
    full = record(model, batch, steps=STEPS, seed=6)

    def stop_after_two(step):
        if step.index == 2:
            raise StopSampling

    partial = record(model, batch, steps=STEPS, seed=6, on_step=stop_after_two)
    assert not partial.complete and len(partial) == 3 and partial.stored == (0, 1, 2)
    with pytest.raises(StepError, match="stopped after 3 of 5 steps and has no final latents yet; traj.resume"):
        _ = partial.final
    counter = Counter(model)
    resumed = partial.resume()
    assert counter.base == STEPS - 3
    assert resumed.complete and torch.equal(resumed.final, full.final)
    assert all(torch.equal(resumed[k].x_t, full[k].x_t) for k in range(STEPS))


def test_forks_of_forks_keep_their_parents_settings(model, batch):
    traj = record(model, batch, steps=STEPS, seed=0)
    off = traj.fork(at=1, with_adapter=False)
    again = off.fork(at=3)
    assert again.settings.with_adapter is False and torch.equal(again.final, off.final)
    assert off[2].adapter is None and torch.equal(off[2].composed, off[2].base)
    assert again.fork(at=3, with_adapter=True).settings.with_adapter is True
    with pytest.raises(InspectError, match="the adapter was off for this step"):
        off[2].get("adapter")


def test_fork_with_another_composer_and_noise_band():
    model = nonzero_model(composer=NoiseGated(GatedResidual(gate_init=0.5), lo=0.0, hi=0.5))
    batch = model.base.prepare_batch(raw_batch())
    traj = record(model, batch, steps=STEPS, seed=0)
    weights = [float(traj[k].diagnostics.noise_weight[0]) for k in range(STEPS)]
    assert weights == [float(s <= 0.5) for s in traj.noise_levels.tolist()]
    other = Add()
    fork = traj.fork(at=0, composer=other)
    assert model.composer is not other and "Add" in fork.label  # swapped only inside the run
    assert torch.equal(fork[0].composed[:, :, 1:], (fork[0].base + fork[0].adapter)[:, :, 1:])


# -- ablations with the cached base ----------------------------------------------------------
def test_recompose_reuses_the_cached_base_output(model, batch):
    traj = record(model, batch, steps=STEPS, seed=0)
    counter = Counter(model)
    same = traj.recompose(2)
    assert torch.equal(same.composed, traj[2].composed) and torch.equal(same.base, traj[2].base)
    assert torch.equal(traj.x0_of(same), traj[2].x0)  # the given frame included: recomposing changes nothing
    moved = traj.recompose(2, cond=pushed(batch))
    assert not torch.equal(moved.adapter, traj[2].adapter) and torch.equal(moved.base, traj[2].base)
    closed = traj.recompose(2, gate_override=0.0)
    assert torch.equal(closed.composed, closed.base)
    assert (counter.base, counter.adapter) == (0, 3)
    assert traj.x0_of(moved).shape == batch.latents.shape


def test_recompose_reruns_the_base_when_the_adapter_changes_it():
    class Intrusive(LatentResidual):
        reuses_base_output = False

    model = nonzero_model(adapter_cls=Intrusive)
    batch = model.base.prepare_batch(raw_batch())
    traj = record(model, batch, steps=STEPS, seed=0)
    counter = Counter(model)
    pred = traj.recompose(1, cond=pushed(batch))
    assert counter.base == 1 and torch.equal(pred.base, traj[1].base)


# -- storage ---------------------------------------------------------------------------------
def test_half_precision_every_other_step_still_forks_exactly(model, batch):
    policy = StoragePolicy(dtype=torch.float16, every=2)
    traj = record(model, batch, steps=STEPS, seed=1, storage=policy)
    assert traj.stored == (0, 2, 4) and traj[2].x_t.dtype == torch.float16
    assert traj[2].diagnostics.gate.dtype == torch.float16
    with pytest.raises(StepError, match=r"Step 3 was not stored: StoragePolicy\(every=2\) keeps steps 0, 2, 4"):
        traj[3]
    # one TrajectoryStep per step run: a skipped step keeps its time, noise level and replay cache, no fields
    skipped = traj._log[3]
    assert type(skipped) is TrajectoryStep and skipped.stored is None and skipped.index == 3
    assert skipped.x_t is None and skipped.diagnostics.as_dict() == {} and len(skipped.calls) == 1
    assert skipped.calls[0].dtype == torch.float32 and torch.equal(skipped.t, traj.times[3:4].expand(2))
    assert list(traj) == [traj._log[k] for k in (0, 2, 4)] and traj[2] is traj._log[2]
    fork = traj.fork(at=3)  # the replay cache stays at the model's dtype for every step
    assert torch.equal(fork.final, record(model, batch, steps=STEPS, seed=1).final)
    assert fork[3].x_t.dtype == torch.float16


@pytest.mark.parametrize("policy", [
    StoragePolicy(),
    StoragePolicy(dtype=torch.float16),
    StoragePolicy(every=3, fields=("x0",)),
    StoragePolicy(replay=False, fields=("x_t", "base")),
    StoragePolicy(device=None),
])
def test_estimate_memory_matches_what_is_stored(model, batch, policy):
    estimate = estimate_memory(model, batch, steps=STEPS, storage=policy)
    traj = record(model, batch, steps=STEPS, seed=0, storage=policy)
    actual = traj.nbytes()
    scalar_slack = 2 * batch.batch_size * 8 * STEPS  # t and noise level are counted at 8 bytes each
    assert actual <= estimate <= actual + scalar_slack


def test_memory_budget_raises_or_warns_before_recording(model, batch):
    counter = Counter(model)
    with pytest.raises(InspectError, match=r"would hold 0\.\d+ MiB .* over StoragePolicy\(max_bytes=1000\)\. "
                                           r"Keep less: dtype=torch.float16"):
        record(model, batch, steps=STEPS, storage=StoragePolicy(max_bytes=1000))
    assert counter.base == 0  # refused before any compute
    with pytest.warns(StorageWarning, match="over StoragePolicy"):
        traj = record(model, batch, steps=STEPS, storage=StoragePolicy(max_bytes=1000, on_exceed="warn"))
    assert traj.complete


def test_storage_policy_is_validated():
    with pytest.raises(InspectError, match="fields entry='x_0' is not allowed.*Did you mean one of 'x0', 'x_t'"):
        StoragePolicy(fields=("x_0",))
    with pytest.raises(InspectError, match="every=0; must be an int >= 1"):
        StoragePolicy(every=0)
    with pytest.raises(InspectError, match="dtype=torch.int8; must be a floating torch dtype"):
        StoragePolicy(dtype=torch.int8)


# -- navigation, callbacks and errors ----------------------------------------------------------
def test_navigation_helpers():
    model = nonzero_model()
    traj = record(model, raw_batch(), steps=4, seed=0)
    assert len(traj) == 4 and traj.steps == 4 and traj[-1].index == 3
    assert traj.times.tolist() == [1.0, 0.75, 0.5, 0.25]
    assert torch.equal(traj.noise_levels, traj.times)
    assert traj.seek(2) is traj[2] and traj.position == 2 and traj.current is traj[2]
    assert [s.index for s in traj] == [0, 1, 2, 3]
    assert "4/4 steps complete" in repr(traj)


def test_on_step_sees_live_device_steps_and_errors_name_the_step():
    model = nonzero_model()
    seen = []
    record(model, raw_batch(), steps=3, on_step=seen.append)
    assert [s.index for s in seen] == [0, 1, 2] and all(s.x0 is not None for s in seen)

    def broken(step):
        if step.index == 1:
            raise ValueError("boom")

    model.train()
    with pytest.raises(CallbackError, match="on_step callback .*broken raised at step 1 of 3: ValueError: boom"):
        record(model, raw_batch(), steps=3, on_step=broken)
    assert model.training and model.adapter.training and model.composer.training  # modes restored


@pytest.mark.parametrize("call, error, message", [
    (lambda t: t[7], StepError, r"step=7 is out of range: this trajectory has 5 recorded steps \(0..4, or -5..-1"),
    (lambda t: t["2"], StepError, r"step must be an int step index, got '2'"),
    (lambda t: t.fork(at=6), StepError, r"fork\(at=6\): at must be a step index from 0 to 5: this trajectory has 5 "
                                        r"recorded steps\. at=0 reruns from the initial noise"),
    (lambda t: t.fork(at=-1), StepError, r"fork\(at=-1\): at must be a step index from 0 to 5"),
    (lambda t: t.fork(at=1, with_adapter="off"), InspectError,
     r"with_adapter='off' is not allowed: it takes True \(base \+ adapter\) or False \(the frozen base alone\); "
     r"None keeps the parent's setting\.$"),
    (lambda t: t.fork(at=1, adapter=False), TypeError, r"unexpected keyword argument 'adapter'"),
    (lambda t: t.recompose(1, with_adapter=1), InspectError, r"with_adapter=1 is not allowed"),
    (lambda t: t.fork(at=1, cond={"acton": 1.0}), InspectError,
     r"cond has keys 'acton' that name no condition \(conditions: 'action', .*\)\. Did you mean one of 'action', "
     r"'actions'\? It was read as a new raw batch, and TinyVideo.prepare_batch refused it: prepare_batch needs"),
    (lambda t: t.fork(at=1, cond={"action": torch.zeros(3)}), InspectError,
     r"cond\['action'\] has shape \(3,\), but the batch's 'action' is \(2, 4, 4\)"),
    (lambda t: t.fork(at=1, cond=raw_batch(b=3)), InspectError, r"a prefix replays only onto the same shape"),
    (lambda t: t.fork(at=1, gate_override=torch.ones(3)), CompositionError, r"must be a scalar or shaped like"),
])
def test_error_wording(call, error, message):
    traj = record(nonzero_model(), raw_batch(), steps=STEPS)
    with pytest.raises(error, match=message):
        call(traj)


# -- Composer.override_gate (the core addition the forks use) --------------------------------
def test_override_gate_is_scoped_and_checked():
    x = torch.randn(2, 4, 3, 2, 2)
    base, adapter = torch.randn_like(x), torch.randn_like(x)
    from workbench.core.composers import ComposeContext

    ctx = ComposeContext(noise_level=torch.tensor([0.2, 0.8]))
    gated = GatedResidual(gate_init=0.1, max_gate=1.0)
    with gated.override_gate(0.5):
        assert torch.equal(gated(base, adapter, ctx), base + 0.5 * adapter)
    assert torch.allclose(gated.effective_gate(), torch.tensor(0.1))
    mask = MaskMix(channels=4)
    with mask.override_gate(1.0):
        assert torch.allclose(mask(base, adapter, ctx), adapter, atol=1e-6)
    band = NoiseGated(PretrainWarmup(GatedResidual(), steps=0), lo=0.5, hi=1.0)
    with band.override_gate(1.0):
        out = band(base, adapter, ctx)
    assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1] + adapter[1])
    with pytest.raises(CompositionError, match="Add has no gate to override"):
        Add().override_gate(0.5).__enter__()
    with pytest.raises(CompositionError, match=r"a scalar in \[0, 1\], got 2"):
        mask.override_gate(2).__enter__()
