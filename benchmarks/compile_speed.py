"""Compiled vs eager: ``base.compile()`` on the embedded model (tiny_video's shipped weights) on this CPU.

Two copies of the embedded model (64x64, 16 frames, its own 20-step Euler sampler), one compiled
with inductor: the compile (warm-up) time of the first sample and of the first fit step, then,
timed interleaved (CPU time, medians), a 20-step sample of one clip with ``action_modulation``
inside the base (hooks on every block, zero at init) and one ``fit`` step of that adapter (batch
of 2). The recompilations are counted with dynamo's counters: during the timed rounds (none
expected), and while a recording's forks switch the adapter off / on at every step (none once
both states have been compiled).

Nothing is judged: the ratios compiled / eager are reported, whichever way they go (on a CPU
with small convolutions, compiling buys little; see the guide ``docs/guides/compile.md``).
``--quick`` uses dynamo with the ``aot_eager`` backend (the graphs traced, no inductor code
generated): seconds instead of minutes of cold compile, so the test suite can run it.
"""

from __future__ import annotations

import sys
import time

import _bench  # noqa: F401  (threads pinned first)
import torch
from _bench import interleaved, median, ratio, scaled, start

from workbench import AdapterExperiment, Replace, TrainingConfig
from workbench.adapters.action_modulation import ActionModulation
from workbench.backbones.tiny_video import TinyVideo
from workbench.core.compiled import compile_stats
from workbench.data.synthetic import SyntheticMoves
from workbench.inspect import record


def experiment(compiled: bool, backend: str) -> AdapterExperiment:
    base = TinyVideo.from_pretrained()
    if compiled:
        base.compile(backend=backend)
    torch.manual_seed(1)
    return AdapterExperiment(base=base, adapter=ActionModulation(hidden=32), composer=Replace(),
                             training=TrainingConfig(steps=10_000, learning_rate=1e-4, batch_size=2, progress=False,
                                                     sync_every=1))


def graphs() -> int:
    return compile_stats()["graphs"]


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    quick = _bench.QUICK
    backend = "aot_eager" if quick else "inductor"
    eager, compiled = experiment(False, backend), experiment(True, backend)
    clip = eager.model.base.clip()
    frames = scaled(clip.frames, 4)
    data = SyntheticMoves(items=8, frames=frames, size=clip.height, square=8)
    g = torch.Generator().manual_seed(0)
    raw = {"image": torch.rand(1, 3, clip.height, clip.width, generator=g) * 2 - 1,
           "action": torch.rand(1, frames, 4, generator=g) * 2 - 1}
    steps = scaled(20, 3)

    def sampler(exp):
        batch = exp.model.base.prepare_batch(raw)
        return lambda: exp.model.generate(batch, steps=steps, generator=torch.Generator().manual_seed(0))

    def fit_step(exp):
        return lambda: exp.fit(data, steps=1)

    print(f"embedded model: tiny_video {clip.height}x{clip.width}, {frames} frames, {steps} sampler steps, "
          f"action_modulation inside; compiled with {backend}" + (" (quick mode: no inductor code)" if quick else ""))
    before = graphs()
    start_wall = time.perf_counter()
    first = sampler(compiled)()
    sample_compile = time.perf_counter() - start_wall
    start_wall = time.perf_counter()
    fit_step(compiled)()
    fit_compile = time.perf_counter() - start_wall
    warm_graphs = graphs() - before
    reference = sampler(eager)()
    fit_step(eager)()
    print(f"compile (warm-up, wall time): first sample {sample_compile:.1f} s, first fit step {fit_compile:.1f} s; "
          f"{warm_graphs} graph(s) compiled")
    rel = float((first - reference).abs().max() / reference.abs().max())
    print(f"compiled vs eager sample: largest difference {rel:.1e} relative")

    before = graphs()
    t = interleaved({"eager sample": sampler(eager), "compiled sample": sampler(compiled)}, repeats=5)
    f = interleaved({"eager fit step": fit_step(eager), "compiled fit step": fit_step(compiled)}, repeats=7)
    timed_graphs = graphs() - before
    sample_ratio = ratio(t, "compiled sample", "eager sample")
    fit_ratio = ratio(f, "compiled fit step", "eager fit step")
    print(f"eager sample {median(t['eager sample']) * 1e3:.0f} ms, compiled "
          f"{median(t['compiled sample']) * 1e3:.0f} ms (CPU time)")
    print(f"compiled / eager sampling = {sample_ratio:.3f}")
    print(f"eager fit step {median(f['eager fit step']) * 1e3:.0f} ms, compiled "
          f"{median(f['compiled fit step']) * 1e3:.0f} ms (CPU time)")
    print(f"compiled / eager fit step = {fit_ratio:.3f}")

    model = compiled.model
    traj = record(model, compiled.model.base.prepare_batch(raw), steps=steps, seed=0)
    before = graphs()
    chain = traj
    for k in range(steps):
        chain = chain.fork(at=k, with_adapter=k % 2 != 0)
    switch_graphs = graphs() - before
    print(f"recompilations: {timed_graphs} during the timed rounds, {switch_graphs} while forks switched the adapter "
          f"off/on at each of {steps} steps (both states compiled before)")
    if not quick:
        for what, value in (("sampling", sample_ratio), ("a fit step", fit_ratio)):
            verdict = ("faster" if value < 0.95 else "slower" if value > 1.05 else "no real difference (within 5%)")
            print(f"on this CPU, compiled {what} takes {value:.2f}x the eager time: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
