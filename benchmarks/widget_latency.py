"""Slider latency of the notebook views on the embedded model (64x64, 16 frames, 20 steps).

Measures, in Python, the wall time of the whole callback (logic, decode, picture, PNG) as a
person moving a control waits for it, the median over 19 moves of:

* an ablation slider move (adapter + composer re-run on the cached base output, then drawn),
  with the tiny preview and with the full decoder, and on a recording that kept no base output
  (so the base runs too: what a slider would cost without the cache);
* Stepper moves with three branches (the run and two forks, as notebook 2 shows them), for each
  decode (linear preview, tiny preview, full): a step move to a step not drawn yet, back to one
  already drawn, and a frame move; beside them, what drawing the same panels as a matplotlib
  figure alone costs (what every move paid before pictures were composed from the arrays).

Messaging between the browser and the kernel adds about 15 ms to each (see the README). Uses the shipped
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
from workbench.widgets import AblationSliders, Stepper, render  # noqa: E402

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


def median_ms(times: list[float]) -> float:
    return 1000 * statistics.median(times[2:])  # the first two moves warm caches up


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
    print(f"model: {which}, {frames} frames of {size}x{size}, {STEPS} steps, one CPU thread")
    values = [round(-1 + 0.1 * i, 2) for i in range(21)]

    # ablation slider, as notebook 3 ships it (tiny preview), and with the full decoder
    ablations = {d: AblationSliders(traj, step=STEPS // 2, decode=d) for d in ("tiny", "full")}
    uncached = AblationSliders(no_base, step=STEPS // 2, decode="tiny")
    times: dict[str, list[float]] = {name: [] for name in ("tiny", "full", "no base cache")}
    for value in values:
        for name, view in (*ablations.items(), ("no base cache", uncached)):
            times[name].append(timed(lambda view=view, value=value: setattr(view.sliders.sliders[0], "value", value)))
    ms = {name: median_ms(t) for name, t in times.items()}
    print(f"ablation slider move: {ms['tiny']:.0f} ms (tiny preview), {ms['full']:.0f} ms (full decode); "
          f"{ms['no base cache']:.0f} ms when the base re-runs too (tiny)")
    print(f"cached / base re-run = {ms['tiny'] / ms['no base cache']:.2f}")

    # Stepper step and frame sliders with three branches (the run and two forks), as in notebook 2
    for decode in ("preview", "tiny", "full"):
        stepper = Stepper(traj, decode=decode)
        stepper.step_slider.value = 4
        stepper.fork_here(cond={"action": batch.cond["action"].flip(0)}, label="swapped")
        stepper.step_slider.value = 0
        stepper.fork_here(adapter="off", label="base alone")
        new_step, seen_step, frame_move, figure = [], [], [], []
        for i in range(len(values)):
            target = (i % (STEPS - 1)) + 1
            new_step.append(timed(lambda s=stepper, t=target: setattr(s.step_slider, "value", t)))
            seen_step.append(timed(lambda s=stepper: setattr(s.step_slider, "value", 0)))
            frame_move.append(timed(lambda s=stepper, i=i: setattr(s.frame_slider, "value", i % frames)))
            panels, caption = stepper.state.panels(), stepper.state.caption()
            figure.append(timed(lambda p=panels, c=caption: render.figure_png(render.panels_figure(p, title=c))))
        print(f"stepper ({decode} decode, 3 branches): step move {median_ms(new_step):.0f} ms to an unseen step, "
              f"{median_ms(seen_step):.0f} ms back to a drawn one; frame move {median_ms(frame_move):.0f} ms "
              f"(a matplotlib figure of the same panels alone: {median_ms(figure):.0f} ms)")


if __name__ == "__main__":
    main()
