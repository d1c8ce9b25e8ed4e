"""Slider latency of the notebook views on the embedded model (64x64, 16 frames, 20 steps).

Measures, in Python, the wall time of the whole callback (logic, decode, picture, PNG) as a
person moving a control waits for it, the median over 19 moves of:

* an ablation slider move (adapter + composer re-run on the cached base output, then drawn),
  with the tiny preview and with the full decoder, and on a recording that kept no base output
  (so the base runs too: what a slider would cost without the cache);
* Stepper moves with three branches (the run and two forks, as notebook 2 shows them), for each
  decode (linear preview, tiny preview, full): a step move to a step not drawn yet, back to one
  already drawn, and a frame move; beside them, what drawing the same panels as a matplotlib
  figure alone costs (what every move paid before pictures were composed from the arrays);
* the ablation view's propagated picture on the world model ``workbench demo`` ships (its
  adapter, the hand probe as readout, tiny preview): an edit carried from the middle step (10 of
  20) to the last — the fork, the decode and the readout — beside a fresh 20-step sample of the
  same batch, the plain alternative (median of 5 edits).

Then, when Debian's chromium and playwright are installed (``make browser``; the dev extra),
the same configuration in a real browser, served on 127.0.0.1 by Voilà and by JupyterLab (the
lab extra; Run All from its menu): headless Chromium presses an arrow key on a slider and
times, in the page, until the view's picture (``<img src>``) changes: the median over 11
presses per slider, printed beside the Python-side cost; then, on the ablation view of the world
model at the middle step, from a key press to its instant picture and to its propagated picture
(the final prediction, ``img.workbench-ablation-final``), the median over 5 presses; and notebook 5's
ablation view as its cell makes it (the world model, full decode, the hand probe, step 2 of 20), from a
key press to its instant picture, with no propagation in flight and with one, the median over 9 presses
each, with the kernel's own drawing time (its status line) and the load average beside it.
``--browser-only`` runs the browser part alone, ``--front-ends lab`` (or ``voila``) in one front end.
Without them that part says what is missing and is skipped. Uses the shipped pretrained tiny_video when it
is installed, else the default architecture with random weights (the cost is the same). Nothing asserts on
time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from local_jupyter import QUIET_LAB, ServerDidNotStart, free_port, lab_command, serving, write_notebook  # noqa: E402

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
EDITS = 5


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


def main(argv: list[str] | None = None) -> int:
    from _bench import finish, scaled, start

    args = start(argv, __doc__)
    quick = args.quick
    own = argparse.ArgumentParser()
    own.add_argument("--browser-only", action="store_true", help="only the browser part (the Python side: skipped)")
    own.add_argument("--front-ends", default="voila,lab", help="the browser part in these: voila, lab or both")
    own = own.parse_args(args.extra)
    if own.browser_only and not quick:
        browser(None, own.front_ends.split(","))
        return finish()
    steps = scaled(STEPS, 4)
    model, which = embedded_model()
    clip = model.base.clip()
    frames = clip.frames
    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(2, 3, frames, clip.height, clip.width, generator=g) * 2 - 1,
           "action": torch.rand(2, frames, 4, generator=g) * 2 - 1}
    batch = model.base.prepare_batch(raw)
    traj = record(model, batch, steps=steps, seed=0)
    # the same view on a recording that kept no base output: each move runs the base as well
    no_base = record(model, batch, steps=steps, seed=0, storage=StoragePolicy(fields=("x_t", "x0", "composed")))
    print(f"model: {which}, {frames} frames of {clip.height}x{clip.width}, {steps} steps, one CPU thread")
    values = [round(-1 + 0.1 * i, 2) for i in range(scaled(21, 4))]

    # ablation slider (tiny preview), and with the full decoder: the instant picture a move waits for (the
    # propagation to the last step runs in the background in a notebook; measured on its own below)
    ablations = {d: AblationSliders(traj, step=steps // 2, decode=d, propagate=False) for d in ("tiny", "full")}
    uncached = AblationSliders(no_base, step=steps // 2, decode="tiny", propagate=False)
    times: dict[str, list[float]] = {name: [] for name in ("tiny", "full", "no base cache")}
    for value in values:
        for name, view in (*ablations.items(), ("no base cache", uncached)):
            times[name].append(timed(lambda view=view, value=value: setattr(view.sliders.sliders[0], "value", value)))
    ms = {name: median_ms(t) for name, t in times.items()}
    cpu = []
    for value in values:  # the kernel's own work (thread CPU time): the wall time on an idle machine, about
        started = time.thread_time()
        ablations["tiny"].sliders.sliders[1].value = value
        cpu.append(time.thread_time() - started)
    print(f"ablation slider move: {ms['tiny']:.0f} ms (tiny preview; {median_ms(cpu):.0f} ms of CPU time), "
          f"{ms['full']:.0f} ms (full decode); {ms['no base cache']:.0f} ms when the base re-runs too (tiny)")
    print(f"cached / base re-run = {ms['tiny'] / ms['no base cache']:.2f}")

    # Stepper step and frame sliders with three branches (the run and two forks), as in notebook 2
    for decode in ("preview", "tiny", "full"):
        stepper = Stepper(traj, decode=decode)
        stepper.step_slider.value = min(4, steps - 1)
        stepper.fork_here(cond={"action": batch.cond["action"].flip(0)}, label="swapped")
        stepper.step_slider.value = 0
        stepper.fork_here(with_adapter=False, label="base alone")
        new_step, seen_step, frame_move, figure = [], [], [], []
        for i in range(len(values)):
            target = (i % (steps - 1)) + 1
            new_step.append(timed(lambda s=stepper, t=target: setattr(s.step_slider, "value", t)))
            seen_step.append(timed(lambda s=stepper: setattr(s.step_slider, "value", 0)))
            frame_move.append(timed(lambda s=stepper, i=i: setattr(s.frame_slider, "value", i % frames)))
            panels, caption = stepper.state.panels(), stepper.state.caption()
            figure.append(timed(lambda p=panels, c=caption: render.figure_png(render.panels_figure(p, title=c))))
        print(f"stepper ({decode} decode, 3 branches): step move {median_ms(new_step):.0f} ms to an unseen step, "
              f"{median_ms(seen_step):.0f} ms back to a drawn one; frame move {median_ms(frame_move):.0f} ms "
              f"(a matplotlib figure of the same panels alone: {median_ms(figure):.0f} ms)")
        if decode == "tiny":
            python_side = {"step": median_ms(new_step), "frame": median_ms(frame_move)}
    python_side["ablation"] = ms["tiny"]
    python_side["final"] = propagation(steps, scaled(EDITS, 1))
    if quick:
        print("browser: not in --quick mode (tests/test_widgets_browser.py and test_widgets_lab.py drive the views)")
    else:
        browser(python_side, own.front_ends.split(","))
    return finish()


def propagation(steps: int, edits: int) -> float:
    """The ablation view's propagated picture on the shipped world model, beside a fresh sample; ms."""
    from torch.utils.data import default_collate

    from workbench import AdapterExperiment
    from workbench.data.metaworld import MetaWorldClips
    from workbench.inspect import Ablation
    from workbench.worldmodel.demo import TRAINED_ADAPTER
    from workbench.worldmodel.probe import shipped_probe

    exp = AdapterExperiment.load(TRAINED_ADAPTER)
    clips = MetaWorldClips(path="sample", window=16, stride=8, split="val")
    batch = exp.model.base.prepare_batch(default_collate([clips[10], clips[35]]))
    traj = record(exp.model, batch, steps=steps, seed=0)
    state = Ablation(traj, step=steps // 2, decode="tiny", readout=shipped_probe().readout())
    state.recorded_final()  # decoded once per view, not per edit
    carried, fresh = [], []
    for i in range(edits + 2):
        state.set(0, round(-1 + 0.3 * i, 2))
        carried.append(timed(state.propagate))
        fresh.append(timed(lambda i=i: record(exp.model, batch, steps=steps, seed=i, record=False)))
    a, b = median_ms(carried), median_ms(fresh)
    print(f"propagated picture (world model, hand readout, tiny preview), edit at step {steps // 2} of {steps}: "
          f"{a:.0f} ms; a fresh {steps}-step sample of the same batch {b:.0f} ms; ratio {a / b:.2f}")
    return a


# -- in a real browser -------------------------------------------------------------------------
APP = [
    """import os
os.environ["OMP_NUM_THREADS"] = "1"
import torch
torch.set_num_threads(1)
from torch.utils.data import default_collate
from workbench import ComposedModel, GatedResidual
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo
from workbench.data.metaworld import MetaWorldClips
from workbench.inspect import record, swap_conditions
from workbench.widgets import AblationSliders, Stepper
torch.manual_seed(0)
base = TinyVideo.from_pretrained()
adapter = LatentResidual(width=16, depth=1)
with torch.no_grad():
    for p in adapter.out.parameters():
        p.normal_(0, 0.1)
model = ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective())
clips = MetaWorldClips(path="sample", window=16, stride=8, split="val")
traj = record(model, base.prepare_batch(default_collate([clips[10], clips[35]])), steps=20, seed=0)
DIMS = ["dx", "dy", "dz", "grip"]""",
    """stepper = Stepper(traj, decode="tiny", dim_names=DIMS)
stepper.step_slider.value = 4
stepper.fork_here(cond=swap_conditions(traj), label="swapped")
stepper.step_slider.value = 0
stepper.fork_here(with_adapter=False, label="base alone")
stepper""",
    """from workbench import AdapterExperiment
from workbench.worldmodel.demo import TRAINED_ADAPTER
from workbench.worldmodel.probe import shipped_probe
world = AdapterExperiment.load(TRAINED_ADAPTER)
world_traj = record(world.model, world.model.base.prepare_batch(default_collate([clips[10], clips[35]])), steps=20,
                    seed=0)
AblationSliders(world_traj, step=10, decode="tiny", dim_names=DIMS, readout=shipped_probe().readout())""",
    # notebook 5's ablation view, as its cell makes it: full decode, the hand probe, dx = -1 from step 2 of 20
    """from workbench.worldmodel.evaluate import from_first_frame
val = MetaWorldClips(path="sample", window=16, stride=16, split="val")
nb5 = world.sample(from_first_frame(default_collate([val[9], val[18]])), steps=20, seed=0)
notebook5 = AblationSliders(nb5, step=2, dim_names=DIMS, decode="full", readout=shipped_probe().readout())
notebook5.sliders.sliders[0].value = -1.0
notebook5.add_class("notebook5")
notebook5""",
]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PRESSES = 11
FINAL_PRESSES = 5
TIME_BOTH = """([instant, final]) => {
  // the instant picture: its src changes; the propagated one: the final picture is marked stale when the
  // propagation starts and unmarked when its picture is in (a class change alone re-sets an <img> src)
  const a = document.querySelector(instant), b = document.querySelector(final);
  const first = a.src;
  const shown = new Promise(resolve => {
    const seen = new MutationObserver(() => {
      if (a.src !== first) { seen.disconnect(); resolve(performance.now() - window.__pressed); }
    });
    seen.observe(a, {attributes: true, attributeFilter: ["src"]});
  });
  const carried = new Promise(resolve => {
    let stale = false;
    const seen = new MutationObserver(() => {
      const now = b.classList.contains("workbench-stale");
      if (now) stale = true;
      else if (stale) { seen.disconnect(); resolve(performance.now() - window.__pressed); }
    });
    seen.observe(b, {attributes: true, attributeFilter: ["class"]});
  });
  window.__latency = Promise.all([shown, carried]);
  window.__pressed = performance.now();
}"""
TIME_PRESS = """([img, key]) => {
  const image = document.querySelector(img);
  const before = image.src;
  window.__latency = new Promise(resolve => {
    const seen = new MutationObserver(() => {
      if (image.src !== before) { seen.disconnect(); resolve(performance.now() - window.__pressed); }
    });
    seen.observe(image, {attributes: true, attributeFilter: ["src"]});
  });
  window.__pressed = performance.now();
}"""


def browser(python_side: dict[str, float] | None, front_ends: Sequence[str] = ("voila", "lab")) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = [name for name, ok in (("chromium (make browser)", chromium is not None),
                                     ("playwright", _importable("playwright"))) if not ok]
    if missing:
        print(f"browser latency: skipped, {', '.join(missing)} not installed")
        return
    folder = Path(tempfile.mkdtemp(prefix="workbench-latency-"))
    write_notebook(folder / "latency.ipynb", APP)
    for name, module, serve in (("Voilà", "voila", _voila), ("JupyterLab", "jupyterlab", _jupyterlab)):
        if module.removeprefix("jupyter") not in front_ends:
            continue
        if not _importable(module):
            print(f"browser latency in {name}: skipped, not installed")
            continue
        with serve(folder) as opened:
            if opened is None:
                print(f"browser latency in {name}: the server did not start (see {folder})")
                continue
            _measure(name, chromium, opened, python_side)


@contextlib.contextmanager
def _started(command: list[str], folder: Path, env: dict, ready: str, log_name: str):
    """The server running until the block ends: yields True, or False when it did not start."""
    try:
        with serving(command, folder, env, ready, folder / log_name):
            yield True
    except ServerDidNotStart:
        yield False


@contextlib.contextmanager
def _voila(folder: Path):
    """Voilà serving the notebook: yields a function that opens it in a page and runs it."""
    port = free_port()
    command = [sys.executable, "-m", "voila", "latency.ipynb", "--no-browser", f"--port={port}",
               "--Voila.ip=127.0.0.1"]
    url = f"http://127.0.0.1:{port}/"
    with _started(command, folder, {"JUPYTER_RUNTIME_DIR": str(folder / "runtime-voila")}, url + "static/",
                  "voila.log") as up:
        yield (lambda page: page.goto(url, timeout=180_000)) if up else None


@contextlib.contextmanager
def _jupyterlab(folder: Path):
    """JupyterLab on the notebook: yields a function that opens it in a page and runs all its cells."""
    token = os.urandom(16).hex()
    port = free_port()
    command, env = lab_command(folder, port, token, QUIET_LAB)
    url = f"http://127.0.0.1:{port}"

    def kernel_idle() -> None:  # Run All sent before the kernel is idle can be lost
        deadline, idle_since = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=10) as answer:  # noqa: S310
                sessions = json.loads(answer.read())
            idle = bool(sessions) and all(s["kernel"]["execution_state"] == "idle" for s in sessions)
            idle_since = (idle_since or time.monotonic()) if idle else None
            if idle_since is not None and time.monotonic() - idle_since > 1.0:
                return
            time.sleep(0.2)

    def open_and_run(page) -> None:
        page.goto(f"{url}/lab/tree/latency.ipynb?token={token}", timeout=180_000)
        page.locator(".jp-Notebook").wait_for(timeout=180_000)
        kernel_idle()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).first.click()

    with _started(command, folder, env, f"{url}/api/status?token={token}", "lab.log") as up:
        yield open_and_run if up else None


def _beside(python_side: dict[str, float] | None, which: str) -> str:
    return "" if python_side is None else f"; Python side {python_side[which]:.0f} ms"


def _measure(where: str, chromium: str, open_and_run, python_side: dict[str, float] | None) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
        try:
            page = chrome.new_page(viewport={"width": 1400, "height": 2400})
            page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda r: r.abort())
            open_and_run(page)
            for img in ("img.workbench-stepper-image", "img.workbench-ablation-image"):
                page.wait_for_function(f"() => {{ const i = document.querySelector('{img}');"
                                       " return i && i.complete && i.naturalWidth > 100; }", timeout=180_000)
            cases = [("stepper step slider (tiny, 3 branches)", ".workbench-step-slider",
                      "img.workbench-stepper-image", "ArrowRight", "step"),
                     ("stepper frame slider (tiny, 3 branches)", ".workbench-frame-slider",
                      "img.workbench-stepper-image", "ArrowLeft", "frame"),
                     ("ablation slider dx (tiny)", ".workbench-ablation .workbench-condition-slider",
                      "img.workbench-ablation-image", "ArrowLeft", "ablation")]
            for name, slider, img, key, which in cases:
                handle = page.locator(f"{slider} .noUi-handle").first
                handle.focus()
                times = []
                for _ in range(PRESSES):
                    page.evaluate(TIME_PRESS, [img, key])
                    handle.press(key)
                    times.append(page.evaluate("async () => await window.__latency"))
                    page.wait_for_timeout(150)
                print(f"browser ({where}), key press to new picture, {name}: median {statistics.median(times):.0f} ms "
                      f"(range {min(times):.0f}-{max(times):.0f}{_beside(python_side, which)})")
            final = "img.workbench-ablation-final"
            page.wait_for_function(f"() => {{ const i = document.querySelector('{final}');"
                                   " return i && i.complete && i.naturalWidth > 100; }", timeout=180_000)
            # dy: values no earlier press visited, so no propagation comes from the view's cache
            handle = page.locator(".workbench-ablation .workbench-condition-slider .noUi-handle").nth(1)
            handle.focus()
            both = []
            settled = f"() => !document.querySelector('{final}').classList.contains('workbench-stale')"
            for _ in range(FINAL_PRESSES):
                page.wait_for_function(settled, timeout=180_000)  # no propagation of an earlier press in flight
                page.wait_for_timeout(300)
                page.evaluate(TIME_BOTH, ["img.workbench-ablation-image", final])
                handle.press("ArrowRight")
                both.append(page.evaluate("async () => await window.__latency"))
                page.wait_for_timeout(300)
            instant, carried = [t[0] for t in both], [t[1] for t in both]
            print(f"browser ({where}), world model at step 10 of 20 (dy), key press to the instant picture: median "
                  f"{statistics.median(instant):.0f} ms; to the propagated picture: median "
                  f"{statistics.median(carried):.0f} ms (range {min(carried):.0f}-{max(carried):.0f}"
                  f"{_beside(python_side, 'final')})")
            notebook5(page, where)
        finally:
            chrome.close()


NOTEBOOK5_PRESSES = 9


def notebook5(page, where: str) -> None:
    """Notebook 5's ablation view (the world model, full decode, the hand probe, step 2 of 20): a key press on
    dx to its instant picture, with no propagation in flight (each press waits for the last one's final picture),
    then pressed again every 150 ms (each press arrives while the last edit is carried through)."""
    view = ".notebook5"
    instant, final = f"{view} img.workbench-ablation-image", f"{view} img.workbench-ablation-final"
    settled = f"() => !document.querySelector('{final}').classList.contains('workbench-stale')"
    page.wait_for_function(f"() => {{ const i = document.querySelector('{final}');"
                           " return i && i.complete && i.naturalWidth > 100; }", timeout=180_000)
    handle = page.locator(f"{view} .workbench-condition-slider .noUi-handle").first
    handle.focus()
    alone, loads, kernel = [], [], []
    for _ in range(NOTEBOOK5_PRESSES):
        page.wait_for_function(settled, timeout=180_000)
        page.wait_for_timeout(300)
        page.evaluate(TIME_BOTH, [instant, final])
        handle.press("ArrowRight")
        alone.append(page.evaluate("async () => await window.__latency")[0])
        loads.append(os.getloadavg()[0])
        kernel.append(float(re.search(r"re-rendered in (\d+) ms", page.locator(f"{view} .workbench-ablation-status")
                                      .inner_text()).group(1)))
    page.wait_for_function(settled, timeout=180_000)
    page.wait_for_timeout(300)
    busy = []
    for _ in range(NOTEBOOK5_PRESSES):  # on to values not seen yet: no propagation comes from the view's cache
        page.evaluate(TIME_PRESS, [instant, "ArrowRight"])
        handle.press("ArrowRight")
        busy.append(page.evaluate("async () => await window.__latency"))
        loads.append(os.getloadavg()[0])
        page.wait_for_timeout(150)
    print(f"browser ({where}), notebook 5's ablation view (full decode, hand probe, step 2 of 20), key press to the "
          f"instant picture: median {statistics.median(alone):.0f} ms with no propagation in flight "
          f"(range {min(alone):.0f}-{max(alone):.0f}), {statistics.median(busy):.0f} ms with one in flight "
          f"(range {min(busy):.0f}-{max(busy):.0f}); the kernel's drawing (its status line) "
          f"{statistics.median(kernel):.0f} ms; load average {min(loads):.1f}-{max(loads):.1f} "
          f"(median {statistics.median(loads):.1f})")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main())
