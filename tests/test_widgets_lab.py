"""The views in JupyterLab itself, as a person uses them: headless Chromium (Debian's, driven by
Playwright) opens a small notebook in a JupyterLab served on 127.0.0.1, runs all cells from the
menu, presses stop on the Fit view while later cells are queued, moves a slider of each view,
switches the Stepper to the adapter's output where a branch has the adapter off, lets the
ablation view carry an edit to the last step (and a second key press cancel the first; an edit after a
save marks the notebook modified when its final picture is in), holds its colour scale, saves the notebook
(as ``make lab`` sets JupyterLab up: each view saved as its picture, no widget state), shuts its kernel
down and reopens it (JupyterLab starts a fresh kernel that knows none of the views' models). We check
that pictures arrive, that the states hold (the fit stopped, the queued cells ran, the sliders moved the
pictures, the final picture follows the last edit), that status lines never wrap, and that the reopened
notebook shows the pictures, no widget error, and is not marked modified; and that a shipped notebook
opens without being marked modified. Never how long anything took.

Screenshots are kept in ``outputs/test-artifacts/``. Skipped, saying why, without Debian's
chromium (``make browser``) or JupyterLab (``make test`` installs it).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import chromium, free_port
from local_jupyter import QUIET_LAB, lab_command, serving, write_notebook
from test_notebook_figures import PRINTED_WIDTH

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "outputs" / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 90_000
TOKEN = uuid.uuid4().hex

CELLS = [
    """import os
os.environ["OMP_NUM_THREADS"] = "1"
import torch
torch.set_num_threads(1)
from torch.utils.data import default_collate
from workbench import AdapterExperiment, GatedResidual, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo
from workbench.data.metaworld import MetaWorldClips
from workbench.widgets import AblationSliders, Fit, Stepper
torch.manual_seed(0)
base = TinyVideo.from_pretrained()
clips = MetaWorldClips(path="sample", window=16, stride=8, split="val")
exp = AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1), composer=GatedResidual(gate_init=0.5),
                        training=TrainingConfig(batch_size=2, seed=0, sync_every=1))""",
    """fit = Fit(exp, clips, steps=100000)
fit.start()
fit""",
    """await fit.finished()
print("fit ended:", fit.session.state)""",
    """raw = default_collate([clips[10], clips[35]])
traj = exp.sample({"image": raw["video"][:, :, 0], "action": raw["action"]}, steps=8, seed=0)
stepper = Stepper(traj, decode="tiny", dim_names=["dx", "dy", "dz", "grip"])
stepper.fork_here(with_adapter=False, label="base alone")
stepper""",
    """AblationSliders(traj, step=4, decode="tiny", dim_names=["dx", "dy", "dz", "grip"])""",
    """print(" ".join(["word"] * 23))  # 114 characters: what a notebook may print on one line""",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    chromium()
    pytest.importorskip("jupyterlab", reason="JupyterLab is installed by `make test` (the lab extra)")
    folder = tmp_path_factory.mktemp("lab")
    write_notebook(folder / "views.ipynb", CELLS)
    port = free_port()
    command, env = lab_command(folder, port, TOKEN,  # as `make lab` sets it up
                               {**QUIET_LAB, "@jupyter-widgets/jupyterlab-manager/plugin": {"saveState": True}})
    url = f"http://127.0.0.1:{port}"
    with serving(command, folder, {**env, "WORKBENCH_CACHE": str(folder / "cache")},
                 f"{url}/api/status?token={TOKEN}", folder / "lab.log"):
        yield url, folder


def api(url: str, path: str, method: str = "GET"):
    request = urllib.request.Request(f"{url}{path}?token={TOKEN}", method=method)
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - our own local server
        body = answer.read()
    return json.loads(body) if body else None


def open_notebook(browser, url: str, name: str = "views.ipynb"):
    page = browser.new_page(viewport={"width": 1400, "height": 2200})
    page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda route: route.abort())
    page.goto(f"{url}/lab/workspaces/w{uuid.uuid4().hex[:8]}/tree/{name}?token={TOKEN}", timeout=TIMEOUT_MS)
    page.locator(".jp-Notebook").wait_for(timeout=TIMEOUT_MS)
    return page


def menu(page, top: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()


def picture_src(page, css: str) -> str:
    page.wait_for_function(f"() => {{ const i = document.querySelector('{css}');"
                           " return i && i.complete && i.naturalWidth > 100; }", timeout=TIMEOUT_MS)
    return page.locator(css).first.get_attribute("src")


def press(page, slider: str, key: str, image: str) -> None:
    before = page.locator(image).first.get_attribute("src")
    handle = page.locator(f"{slider} .noUi-handle").first
    handle.focus()
    handle.press(key)
    page.wait_for_function("([css, prev]) => { const i = document.querySelector(css); return i && i.src !== prev; }",
                           arg=[image, before], timeout=TIMEOUT_MS)


def test_a_shipped_notebook_opens_unmodified(lab):
    """JupyterLab writes the kernelspec of the kernel it starts; stored differently, the notebook opens modified."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is installed by `make test`")
    url, folder = lab
    shutil.copy(ROOT / "notebooks" / "02_step_through.ipynb", folder / "shipped.ipynb")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=FLAGS, headless=True)
        try:
            page = open_notebook(browser, url, "shipped.ipynb")
            kernel_ready(url)
            page.wait_for_timeout(1500)  # the kernel's info has arrived and been written into the metadata
            assert page.locator(".jp-mod-dirty").count() == 0
        finally:
            browser.close()
            for session in api(url, "/api/sessions"):
                api(url, f"/api/sessions/{session['id']}", method="DELETE")


def test_run_all_stop_sliders_and_reopen_without_a_kernel(lab):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is installed by `make test`")
    url, folder = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=FLAGS, headless=True)
        try:
            page = open_notebook(browser, url)
            try:
                run_all_and_use(page, url)
            except Exception:
                page.screenshot(path=str(ARTIFACTS / "lab-failed.png"), full_page=True)  # what went wrong
                raise
            page.close()
        finally:
            browser.close()
        check_reopened(p, url, folder)
    assert (ARTIFACTS / "lab-reopened-without-kernel.png").stat().st_size > 10_000


def kernel_ready(url: str) -> None:
    """Wait until the notebook's kernel has been idle for a second (Run All before that can be lost)."""
    deadline, idle_since = time.monotonic() + TIMEOUT_MS / 1000, None
    while time.monotonic() < deadline:
        sessions = api(url, "/api/sessions")
        idle = bool(sessions) and all(s["kernel"]["execution_state"] == "idle" for s in sessions)
        idle_since = (idle_since or time.monotonic()) if idle else None
        if idle_since is not None and time.monotonic() - idle_since > 1.0:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the kernel did not become idle: {api(url, '/api/sessions')}")


def run_all_and_use(page, url: str) -> None:
    """Run All; stop the fit while later cells wait; move a slider of each view; save."""
    kernel_ready(url)
    menu(page, "Run", "Run All Cells")
    # the fit trains in the background; the next cell awaits it, the rest are queued behind
    stop = page.locator(".workbench-fit button", has_text="stop")
    page.wait_for_function("() => { const f = document.querySelector('.workbench-fit');"
                           " return f && /step [1-9][0-9]*\\/100[0-9]* · loss/.test(f.innerText); }",
                           timeout=TIMEOUT_MS)
    stop.click()
    page.locator(".jp-OutputArea-output", has_text="fit ended: stopped").wait_for(timeout=TIMEOUT_MS)
    assert "stopped" in page.locator(".workbench-fit").inner_text()
    # the queued cells ran after the stop: both views show a picture, and each slider moves it
    picture_src(page, "img.workbench-stepper-image")
    picture_src(page, "img.workbench-ablation-image")
    press(page, ".workbench-step-slider", "ArrowRight", "img.workbench-stepper-image")
    press(page, ".workbench-frame-slider", "ArrowLeft", "img.workbench-stepper-image")
    assert "step <b>1</b>" in page.locator(".workbench-stepper").inner_html()
    use_the_adapter_view_where_it_is_off(page)
    carry_edits_to_the_last_step(page)
    # the keyboard: space on the focused play button plays (the kernel steps the view) and pauses
    play = page.locator(".workbench-stepper button", has_text=re.compile("^play$")).first
    play.focus()
    play.press("Space")
    page.locator(".workbench-stepper button", has_text=re.compile("^pause$")).first.wait_for(timeout=TIMEOUT_MS)
    page.wait_for_function("() => /step <b>[2-8]<\\/b>/.test(document.querySelector('.workbench-stepper').innerHTML)",
                           timeout=TIMEOUT_MS)
    page.locator(".workbench-stepper button", has_text=re.compile("^pause$")).first.press("Space")
    page.locator(".workbench-stepper button", has_text=re.compile("^play$")).first.wait_for(timeout=TIMEOUT_MS)
    page.screenshot(path=str(ARTIFACTS / "lab-run-all.png"), full_page=True)
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=TIMEOUT_MS)


def use_the_adapter_view_where_it_is_off(page) -> None:
    """The base-alone branch has no adapter output: the view says so instead of failing (the picture changes)."""
    before = page.locator("img.workbench-stepper-image").first.get_attribute("src")
    page.locator(".workbench-stepper select").first.select_option(label="adapter output")
    page.wait_for_function("([css, prev]) => document.querySelector(css).src !== prev",
                           arg=["img.workbench-stepper-image", before], timeout=TIMEOUT_MS)
    page.locator(".workbench-stepper select").first.select_option(label="x0 estimate")


FINAL_STATUS = ".workbench-ablation-final-status"


def carry_edits_to_the_last_step(page) -> None:
    """An edit: the instant picture, then the final one; two quick presses: the final follows the second."""
    slider = ".workbench-ablation .workbench-condition-slider"
    picture_src(page, "img.workbench-ablation-final")  # the recorded run's final prediction, at first
    press(page, slider, "ArrowRight", "img.workbench-ablation-image")
    value = page.locator(f"{slider} .widget-readout").first.inner_text().strip()
    page.wait_for_function(  # the final picture of this edit is in: no longer marked stale, its status says so
        "([css, text]) => !document.querySelector('img.workbench-ablation-final').classList.contains("
        "'workbench-stale') && document.querySelector(css).innerText.includes(text)",
        arg=[FINAL_STATUS, f"final prediction with dx={value} from step 4"], timeout=TIMEOUT_MS)
    handle = page.locator(f"{slider} .noUi-handle").first
    handle.press("ArrowRight")
    handle.press("ArrowRight")  # before the first one's propagation can finish: it is cancelled
    value = page.locator(f"{slider} .widget-readout").first.inner_text().strip()
    page.wait_for_function("([css, text]) => document.querySelector(css).innerText.includes(text)",
                           arg=[FINAL_STATUS, f"final prediction with dx={value} from step 4"], timeout=TIMEOUT_MS)
    # saved, then edited: once the edit's final picture is in, the notebook is marked modified (a save made while
    # it was carried through kept the view without it)
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=TIMEOUT_MS)
    handle.press("ArrowLeft")
    value = page.locator(f"{slider} .widget-readout").first.inner_text().strip()
    page.wait_for_function("([css, text]) => document.querySelector(css).innerText.includes(text)",
                           arg=[FINAL_STATUS, f"final prediction with dx={value} from step 4"], timeout=TIMEOUT_MS)
    page.wait_for_function("() => !!document.querySelector('.jp-mod-dirty')", timeout=TIMEOUT_MS)
    assert "colour scale fixed at ±1 for this view" in page.locator(".workbench-ablation-status").inner_text()
    page.locator(".workbench-ablation-scale select").select_option(label="hold as now")
    page.wait_for_function("() => document.querySelector('.workbench-ablation-status').innerText"
                           ".includes('colour scale held')", timeout=TIMEOUT_MS)
    # status lines stay whole: each one line high, however narrow the column (the Fit's too)
    lines = ", ".join(f"{status} .widget-html-content > div"
                      for status in (".workbench-ablation-status", FINAL_STATUS, ".workbench-fit-status"))
    heights = page.evaluate("""(css) => [...document.querySelectorAll(css)].map(d => [d.getBoundingClientRect().height,
        parseFloat(getComputedStyle(d).lineHeight) || 20, getComputedStyle(d).whiteSpace])""", lines)
    assert len(heights) >= 6 and all(style == "nowrap" and h < 1.5 * line for h, line, style in heights)
    status, view = (page.locator(css).first.bounding_box()
                    for css in (".workbench-fit-status .widget-html-content > div", ".workbench-fit"))
    assert status["x"] + status["width"] <= view["x"] + view["width"]  # whole, inside the view
    # a printed line of PRINTED_WIDTH characters (tests/test_notebook_figures.py) stays one line high
    printed = page.locator(".jp-OutputArea-output pre", has_text="word word").first
    assert len(printed.inner_text().strip()) >= PRINTED_WIDTH and printed.bounding_box()["height"] < 1.5 * 20


def check_reopened(p, url: str, folder: Path) -> None:
    """The saved notebook keeps each view as its picture (with its status lines) and no widget state; with the
    views' kernel gone it shows the pictures, no widget error, and opening it does not mark it modified (restoring
    saved widget state would: JupyterLab's widget manager sets the flag for every model it restores)."""
    saved = json.loads((folder / "views.ipynb").read_text())
    assert "widgets" not in saved["metadata"]
    names = ("Fit: ", "Stepper: ", "AblationSliders: ")
    views = [o["data"] for c in saved["cells"] for o in c.get("outputs", ())
             if "".join(o.get("data", {}).get("text/plain", "")).startswith(names)]
    assert len(views) == 3 and all(sorted(data) == ["image/png", "text/plain"] for data in views)
    # each picture and line is the view as it was when saved (from the widget state), not as the cell left it
    fit, stepper, ablation = ("".join(data["text/plain"]) for data in views)
    assert fit.startswith("Fit: step ") and "stopped" in fit
    assert re.search(r"^Stepper: step [1-8] of 8", stepper), stepper  # it played past step 0
    assert "edited: dx=" in ablation and "colour scale held" in ablation, ablation
    for session in api(url, "/api/sessions"):  # the views' kernel is gone
        api(url, f"/api/sessions/{session['id']}", method="DELETE")
    assert api(url, "/api/sessions") == []

    browser = p.chromium.launch(executable_path=chromium(), args=FLAGS, headless=True)
    try:
        page = open_notebook(browser, url)
        picture_src(page, ".jp-RenderedImage img")  # the views' pictures, from the file: no kernel, no widget state
        kernel_ready(url)
        page.wait_for_timeout(1500)  # the kernel's info has arrived; a widget manager would have restored by now
        assert page.locator(".jp-RenderedImage img").count() >= 3
        assert "model not found" not in page.locator(".jp-Notebook").inner_text()
        page.screenshot(path=str(ARTIFACTS / "lab-reopened-without-kernel.png"), full_page=True)
        assert page.locator(".jp-mod-dirty").count() == 0  # opening it changed nothing: not marked modified
    finally:
        browser.close()
