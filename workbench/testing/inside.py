"""The promises of an adapter that works *inside* the frozen base (``adapter.inside``), checked in one call.

``check_backbone`` checks a backbone with adapters beside it, several of them over one base. An
inside adapter rewires the base it is given (LoRA layers, forward hooks, a branch copied from its
blocks), so this check builds a fresh base for every model it needs and compares each against an
untouched one:

```python
from workbench.testing import check_inside_adapter

def test_my_lora_keeps_its_promises():
    check_inside_adapter(lambda: MyBackbone(tiny_config), lambda: LoRA(rank=2), steps=3)
```

(``raw=`` overrides the backbone's own :meth:`~workbench.BaseVideoModel.example_batch`.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from workbench.core.adapter import Adapter
from workbench.core.backbone import BaseVideoModel
from workbench.errors import ConformanceError
from workbench.testing.kit import Broken, ConformanceReport, Finding, few, max_diff

INSIDE_PROMISES = {
    "identity": "with a fresh adapter the composed prediction is the untouched base's, bit-exact",
    "switched_off": "after training, the base with the adapter switched off is the untouched base, bit-exact",
    "base_untouched": "training changes the adapter's parameters only; the base's own stay bit-identical and "
                      "out of the optimizer",
    "state_dict": "the checkpointed state holds the adapter's tensors only, none of the base's",
    "recording": "recorded == unrecorded sampling, bit-exact; recording makes two base calls "
                 "(base and adapted) for each one sampling makes",
}
"""Promise name → what it promises, for adapters inside the base, in checking order (see
check_inside_adapter)."""


class _Run:
    def __init__(self, make_backbone, adapter_factory, raw, steps, seed):
        self.make_backbone, self.adapter_factory, self.raw, self.steps, self.seed = (
            make_backbone, adapter_factory, raw, steps, seed)
        self.reference = self.base()
        if raw is None:
            from workbench.testing.promises import example_batch_of

            self.raw = raw = example_batch_of(self.reference)
        self.batch = self.reference.prepare_batch(raw)
        self.trained = None

    def base(self) -> BaseVideoModel:
        base = self.make_backbone()
        if not isinstance(base, BaseVideoModel):
            raise Broken(f"make_backbone() returned {type(base).__name__}, not a workbench BaseVideoModel.")
        return base.eval()

    def adapter(self) -> Adapter:
        adapter = self.adapter_factory()
        if not getattr(adapter, "inside", False):
            raise Broken(f"{type(adapter).__name__} is not an inside adapter (adapter.inside is False); "
                         f"check it with check_backbone(..., adapter_factory=...) instead.")
        return adapter

    def model(self):
        from workbench.core.composed import ComposedModel
        from workbench.core.composers import Replace

        base = self.base()
        return ComposedModel(base, self.adapter(), Replace(), base.default_objective())

    def noised(self, model, seed: int = 1):
        return model.noised(self.batch, torch.Generator().manual_seed(seed))

    def fit(self):
        """A base and adapter trained two steps (kept for the later promises), with the base's own tensors
        before."""
        if self.trained is None:
            from workbench.core.composers import Replace
            from workbench.train import AdapterExperiment, TrainingConfig

            base, adapter = self.base(), self.adapter()
            exp = AdapterExperiment(base=base, adapter=adapter, composer=Replace(), training=TrainingConfig(
                batch_size=self.batch.batch_size, learning_rate=1e-2, progress=False, device="cpu"))
            own = {id(p) for p in adapter.parameters()} | {id(b) for b in adapter.buffers()}
            before = {n: t.detach().clone() for n, t in _named_tensors(base) if id(t) not in own}
            start = [p.detach().clone() for p in exp.model.trainable_parameters()]
            exp.fit([self.raw, self.raw], steps=2)
            self.trained = (exp, before, start, own)
        return self.trained


def _named_tensors(module: torch.nn.Module):
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def _identity(r: _Run) -> str:
    model = r.model().eval()
    x_t, t, _ = r.noised(model)
    with torch.no_grad():
        pred = model.predict(x_t, t, r.batch, step=0)
        frozen = r.reference.denoise(x_t, t, r.batch.cond)
    if not torch.equal(pred.composed, frozen):
        raise Broken(f"a fresh {type(model.adapter).__name__} changes the base's prediction "
                     f"({max_diff(pred.composed, frozen)}): its output paths must start at exactly zero.")
    if pred.base is None or not torch.equal(pred.base, frozen):
        raise Broken("the base prediction beside the adapted one (adapter switched off) "
                     "is not the untouched base's.")
    return "composed and switched-off predictions equal the untouched base, bit-exact"


def _switched_off(r: _Run) -> str:
    exp, *_ = r.fit()
    model = exp.model.eval()
    x_t, t, _ = r.noised(model, seed=2)
    with torch.no_grad():
        adapted = model.predict(x_t, t, r.batch).composed
        with model.adapter.switched_off():
            off = model.base.denoise(x_t, t, r.batch.cond)
        frozen = r.reference.denoise(x_t, t, r.batch.cond)
    if not torch.equal(off, frozen):
        raise Broken(f"switched off, the trained adapter still changes the base ({max_diff(off, frozen)}).")
    if torch.equal(adapted, frozen):
        raise Broken("two training steps left the adapted prediction equal to the base's: the adapter is not "
                     "engaged when the composed model predicts.")
    return "switched off: bit-exact; engaged: the prediction moved"


def _base_untouched(r: _Run) -> str:
    exp, before, start, own = r.fit()
    after = {n: t for n, t in _named_tensors(exp.model.base) if id(t) not in own}
    problems = []
    changed = sorted(n for n in before if n not in after or not torch.equal(before[n], after[n].detach()))
    if changed:
        problems.append(f"training changed the base's own tensors: {few(changed)}")
    graded = sorted(n for n, p in exp.model.base.named_parameters() if id(p) not in own and p.requires_grad)
    if graded:
        problems.append(f"base parameters take gradients: {few(graded)}")
    optimized = {id(p) for group in exp.optimizer.param_groups for p in group["params"]}
    stray = optimized - own - {id(p) for p in exp.model.composer.parameters()}
    if stray:
        problems.append(f"{len(stray)} parameters in the optimizer are not the adapter's")
    if all(torch.equal(a, p.detach()) for a, p in zip(start, exp.model.trainable_parameters())):
        problems.append("no trainable parameter changed in two optimizer steps")
    if problems:
        raise Broken("; ".join(problems) + ".")
    return f"{len(before)} base tensors bit-identical; optimizer holds {len(optimized)} adapter tensors"


def _state_dict(r: _Run) -> str:
    exp, before, _, own = r.fit()
    state = exp.model.trainable_state_dict()
    stray = [k for k in state if not k.startswith(("adapter.", "composer."))]
    base_storages = {t.untyped_storage().data_ptr() for n, t in _named_tensors(exp.model.base)
                     if id(t) not in own and t.numel()}
    leaked = [k for k, v in state.items() if v.numel() and v.untyped_storage().data_ptr() in base_storages]
    if stray or leaked:
        raise Broken("; ".join(filter(None, [stray and f"keys outside adapter./composer.: {few(stray)}",
                                             leaked and f"base weights saved as {few(leaked)}"])) + ".")
    return f"{len(state)} tensors, {sum(v.numel() for v in state.values())} values, none of the base's"


def _recording(r: _Run) -> str:
    from workbench.inspect import record
    from workbench.testing.kit import counting_base_calls

    exp, *_ = r.fit()
    model = exp.model.eval()
    batch = r.batch.select([0])
    with counting_base_calls(model.base) as plain_calls:
        plain = model.generate(batch, steps=r.steps, generator=torch.Generator().manual_seed(r.seed))
    with counting_base_calls(model.base) as calls:
        traj = record(model, batch, steps=r.steps, seed=r.seed)
    if not torch.equal(traj.final, plain):
        raise Broken(f"the recorded run's final latents differ from the unrecorded run's "
                     f"({max_diff(traj.final, plain)}).")
    per_step = plain_calls[0] // r.steps  # one per guidance branch
    if calls[0] != 2 * plain_calls[0]:
        raise Broken(f"a {r.steps}-step recording made {calls[0]} base calls "
                     f"where sampling made {plain_calls[0]}; expected twice as many "
                     f"(the base with the adapter switched off, and the adapted base).")
    return f"{r.steps} steps, {2 * per_step} base calls per step recorded ({per_step} sampling), bit-exact"


CHECKS = {"identity": _identity, "switched_off": _switched_off, "base_untouched": _base_untouched,
          "state_dict": _state_dict, "recording": _recording}


def check_inside_adapter(make_backbone: Callable[[], BaseVideoModel],
                         adapter_factory: Callable[[], Adapter], *,
                         raw: Mapping[str, Any] | None = None, steps: int = 3, seed: int = 0,
                         raise_on_broken: bool = True) -> ConformanceReport:
    """Check every promise of an inside adapter (:data:`INSIDE_PROMISES`) on fresh bases from
    ``make_backbone``; runs on the CPU in the backbone's own dtype.

    Args:
        make_backbone: A callable returning a fresh backbone (called once per check that changes one).
        adapter_factory: A callable returning a fresh inside adapter for that backbone.
        raw: A raw training batch for ``prepare_batch`` holding what the adapter reads (default: the
            backbone's :meth:`~workbench.BaseVideoModel.example_batch`).
        steps: Sampling steps of the checks that sample.
        seed: The seed of the checks' generators.
        raise_on_broken: ``False`` returns the report instead of raising.

    Returns:
        The :class:`ConformanceReport`, one finding per promise.

    Raises:
        ConformanceError: When a promise is broken (and ``raise_on_broken``); its report lists them.
    """
    torch.manual_seed(seed)
    run = _Run(make_backbone, adapter_factory, raw, steps, seed)
    name = f"{type(adapter_factory()).__name__} in {type(run.reference).__name__}"
    report = ConformanceReport(name, "cpu")
    for promise, check in CHECKS.items():
        try:
            report.findings.append(Finding(promise, INSIDE_PROMISES[promise], "kept", check(run)))
        except Broken as err:
            report.findings.append(Finding(promise, INSIDE_PROMISES[promise], "broken", str(err)))
    if raise_on_broken and not report.ok:
        raise ConformanceError(report)
    return report
