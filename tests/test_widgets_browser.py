"""The views in a real browser: Voilà serves a small notebook on 127.0.0.1 (the pretrained
tiny_video on a Meta-World clip of the shipped sample), headless Chromium (Debian's, driven by
Playwright) opens it, and we check that the Stepper shows a picture, that
moving its step slider changes it, and that moving an action slider changes the prediction.

A screenshot of the page is kept as a test artefact in ``outputs/test-artifacts/``. ``make
test`` installs Debian's chromium; without it (no apt-get, not root) the test is skipped and
says why.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import chromium, free_port
from local_jupyter import serving, write_notebook

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "outputs" / "test-artifacts"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 90_000

APP = [
    """import os
os.environ["OMP_NUM_THREADS"] = "1"
import torch
torch.set_num_threads(1)
from workbench import ComposedModel, GatedResidual
from workbench.adapters.latent_residual import LatentResidual
from torch.utils.data import default_collate
from workbench.backbones.tiny_video import TinyVideo
from workbench.data.metaworld import MetaWorldClips
from workbench.inspect import record
from workbench.widgets import AblationSliders, Stepper""",
    """torch.manual_seed(0)
base = TinyVideo.from_pretrained()  # the shipped weights: the pictures show the robot arm
adapter = LatentResidual(width=16, depth=1)
with torch.no_grad():  # a nonzero adapter, so the action sliders move the prediction
    for p in adapter.out.parameters():
        p.normal_(0, 0.1)
model = ComposedModel(base, adapter, GatedResidual(gate_init=0.5), base.default_objective())
clips = MetaWorldClips(path="sample", window=16, stride=8, split="val")
traj = record(model, base.prepare_batch(default_collate([clips[10]])), steps=8, seed=0)""",
    "Stepper(traj, decode='full', frame=8, dim_names=['dx', 'dy', 'dz', 'grip'])",
    "AblationSliders(traj, step=6, decode='full', frame=8, dim_names=['dx', 'dy', 'dz', 'grip'])",
]


@pytest.fixture(scope="module")
def voila_url(tmp_path_factory):
    chromium()
    pytest.importorskip("voila", reason="voila is installed by `make test` (the dev extra)")
    folder = tmp_path_factory.mktemp("voila")
    notebook = write_notebook(folder / "stepper_app.ipynb", APP)
    port = free_port()
    command = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
               "--show_tracebacks=True"]
    url = f"http://127.0.0.1:{port}/"
    env = {"WORKBENCH_CACHE": str(folder / "cache"), "JUPYTER_RUNTIME_DIR": str(folder / "runtime")}
    with serving(command, folder, env, url + "static/", folder / "voila.log", timeout=60):
        yield url


def x0_change(page) -> float:
    text = page.inner_text(".workbench-ablation-status")
    return float(re.search(r"x0 change \(RMS, latent units\): ([0-9.]+)", text).group(1))


def move_slider(page, selector: str, key: str, presses: int = 1) -> None:
    handle = page.locator(f"{selector} .noUi-handle").first
    handle.focus()
    for _ in range(presses):
        handle.press(key)


def test_stepper_and_action_slider_in_a_real_browser(voila_url):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is installed by `make test`")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1500})
            # nothing leaves this machine: fonts / CDN requests are answered with an abort
            page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda route: route.abort())
            page.goto(voila_url, timeout=TIMEOUT_MS)
            stepper_image = page.locator("img.workbench-stepper-image")
            stepper_image.wait_for(state="visible", timeout=TIMEOUT_MS)
            page.wait_for_function("() => { const i = document.querySelector('img.workbench-stepper-image');"
                                   " return i && i.complete && i.naturalWidth > 100; }", timeout=TIMEOUT_MS)
            first = stepper_image.get_attribute("src")
            first_pixels = stepper_image.screenshot()
            assert stepper_image.evaluate("i => i.naturalWidth") > 200  # the Stepper renders a picture

            move_slider(page, ".workbench-step-slider", "ArrowRight", presses=2)
            page.wait_for_function(  # the kernel has seen both key presses and redrawn
                "(prev) => { const i = document.querySelector('img.workbench-stepper-image');"
                " return i.src !== prev && i.complete &&"
                " document.querySelector('.workbench-stepper').innerHTML.includes('step <b>2</b>'); }",
                arg=first, timeout=TIMEOUT_MS)
            page.wait_for_timeout(500)  # the last picture's blob has been swapped in
            assert stepper_image.screenshot() != first_pixels  # moving the step slider changed the picture

            ablation_image = page.locator("img.workbench-ablation-image")
            ablation_image.wait_for(state="visible", timeout=TIMEOUT_MS)
            assert x0_change(page) == 0.0
            before = ablation_image.get_attribute("src")
            move_slider(page, ".workbench-ablation .workbench-condition-slider", "ArrowRight", presses=6)
            page.wait_for_function(
                "() => /x0 change \\(RMS, latent units\\): ([0-9.]+)/.exec("
                "document.querySelector('.workbench-ablation').innerText)[1] !== '0.0000'", timeout=TIMEOUT_MS)
            assert x0_change(page) > 0  # the action slider changed the prediction
            assert ablation_image.get_attribute("src") != before
            readout = page.locator(".workbench-ablation .workbench-condition-slider .widget-readout").first
            page.wait_for_function(  # the kernel has caught up with the last key press: picture = slider
                "(value) => document.querySelector('.workbench-ablation').innerText.includes('edited: dx=' + value)",
                arg=readout.inner_text().strip(), timeout=TIMEOUT_MS)
            page.wait_for_timeout(500)  # the last picture's blob has been swapped in
            page.screenshot(path=str(ARTIFACTS / "voila-stepper.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "voila-stepper.png").stat().st_size > 10_000
