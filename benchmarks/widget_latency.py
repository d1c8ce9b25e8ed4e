"""Slider latency of the notebook views on the embedded model (64x64, 16 frames, 20 steps).

Measures, as a person moving a control would feel it (wall time of the whole callback: logic,
figure, PNG), the median over interleaved rounds of:

* an ablation slider move (adapter + composer re-run on the cached base output, then drawn),
* the same move on a recording that kept no base output, so the base runs too (what a slider
  would cost without the cache),
* a step-slider move in the Stepper to a step not seen yet, and back to one already drawn.

Prints the times and the ratio of a cached ablation move to a full recompute. Uses the shipped
pretrained tiny_video when it is installed, else the default architecture with random weights
(the cost is the same). Nothing asserts on time.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WORKBENCH_CACHE", tempfile.mkdtemp(prefix="workbench-bench-"))

import torch  # noqa: E402

torch.set_num_threads(1)

from workbench import ComposedModel, GatedResidual  # noqa: E402
from workbench.adapters.latent_residual import LatentResidual  # noqa: E402
from workbench.backbones.tiny_video import WEIGHTS_DIR, TinyVideo  # noqa: E402
from workbench.inspect import StoragePolicy, record  # noqa: E402
from workbench.widgets import AblationSliders, Stepper  # noqa: E402

STEPS = 20


def embedded_model() -> tuple[ComposedModel, str]:
    torch.manual_seed(0)
    if (WEIGHTS_DIR / "tiny_video.safetensors").exists():
        base, which = TinyVideo.from_pretrained(), "pretrained tiny_video"
    else:
        base, which = TinyVideo(), "tiny_video (default architecture, random weights)"
    adapter = LatentResidual()
    with torch.no_grad():
        for p in adapter.out.parameters():
            p.normal_(0, 0.05)
    return ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective()), which


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    model, which = embedded_model()
    size, frames = model.base.config.image_size, model.base.config.frames
    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(2, 3, frames, size, size, generator=g) * 2 - 1,
           "action": torch.rand(2, frames, 4, generator=g) * 2 - 1}
    batch = model.base.prepare_batch(raw)
    traj = record(model, batch, steps=STEPS, seed=0)
    # the same view on a recording that kept no base output: each move runs the base as well
    no_base = record(model, batch, steps=STEPS, seed=0, storage=StoragePolicy(fields=("x_t", "x0", "composed")))
    ablation = AblationSliders(traj, step=STEPS // 2)
    uncached = AblationSliders(no_base, step=STEPS // 2)
    stepper = Stepper(traj)
    slider, other = ablation.sliders.sliders[0], uncached.sliders.sliders[0]

    cached, full, new_step, seen_step = [], [], [], []
    values = [round(-1 + 0.1 * i, 2) for i in range(21)]
    stepper.step_slider.value = 0
    for i, value in enumerate(values):
        cached.append(timed(lambda value=value: setattr(slider, "value", value)))
        full.append(timed(lambda value=value: setattr(other, "value", value)))
        target = (i % (STEPS - 1)) + 1
        new_step.append(timed(lambda target=target: setattr(stepper.step_slider, "value", target)))
        seen_step.append(timed(lambda: setattr(stepper.step_slider, "value", 0)))
    ms = {name: 1000 * statistics.median(t[2:]) for name, t in
          (("cached", cached), ("full", full), ("new step", new_step), ("seen step", seen_step))}
    print(f"model: {which}, {frames} frames of {size}x{size}, {STEPS} steps, one CPU thread")
    print(f"ablation slider move, cached base output: {ms['cached']:.0f} ms (logic + figure + PNG)")
    print(f"ablation slider move, recomputing the base too: {ms['full']:.0f} ms")
    print(f"stepper step slider move: {ms['new step']:.0f} ms to an unseen step, {ms['seen step']:.0f} ms back "
          f"to a drawn one")
    print(f"cached / full recompute = {ms['cached'] / ms['full']:.2f}")


if __name__ == "__main__":
    main()
