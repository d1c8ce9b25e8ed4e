"""Installed as a user installs it: the built wheel in a new environment, one extra at a time.

One environment is built up in three stages — the core (`pip install WHEEL`), then `[data]`, then
`[data,widgets]` — with pip, from the wheel's own metadata and the versions in constraints.txt. At each
stage `workbench doctor` reports what is installed, every command whose extra is missing refuses before
it starts, naming the extra and the pip command, and the commands whose extras are there run a few steps.

torch (and the packages torch itself requires) is linked from this environment instead of unpacked a
second time, which would add about a minute: it is the same wheel, and no extra brings it. Set
WORKBENCH_INSTALL_TEST_FULL=1 to install it too. Several minutes in all on a busy 2-core machine, so
the test runs on one worker (``make test`` schedules the suite file by file, this file among the first).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.install, pytest.mark.xdist_group(name="install")]
WHEEL_NAME = "grafted_workbench"


def run(cmd: list, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{done.args}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


def refused(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, f"{done.args}: exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr[-3000:]


def link_torch(into: Path) -> None:
    """Symlinks to torch and every package it requires (markers evaluated here), for a .pth file."""
    from importlib import metadata

    from packaging.requirements import Requirement

    into.mkdir()
    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        dist = metadata.distribution(name)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for top in {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            if not (into / top).exists():
                (into / top).symlink_to(Path(dist.locate_file(top)))


def metaworld_config(path: Path) -> Path:
    path.write_text("name: mw\nbase: {type: tiny_video}\nadapter: {type: latent_residual}\n"
                    "training: {steps: 2, batch_size: 2, progress: false}\n"
                    "data: {type: metaworld, config: {path: sample, window: 16, stride: 16}}\n")
    return path


DEMO = ("from workbench.worldmodel.demo import DemoConfig, run_demo; "
        "m = run_demo(DemoConfig.quick(output='demo', steps=2, eval_clips=2, unseen_clips=0, video_clips=1, "
        "sampling_steps=2, batch_size=2), progress=False); print('demo steps', m['training']['steps'])")


def test_the_wheel_installs_and_each_extra_serves_its_commands(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PIP_NO_COMPILE="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [sys.executable, "-m", "pip"]
    ok(run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", ROOT], ROOT, env))
    wheel = next((tmp_path / "dist").glob(f"{WHEEL_NAME}-*.whl"))
    venv = tmp_path / "venv"
    ok(run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env))
    python = venv / "bin" / "python"
    if os.environ.get("WORKBENCH_INSTALL_TEST_FULL") != "1":
        link_torch(tmp_path / "torch-linked")
        version = sysconfig.get_python_version()
        (venv / "lib" / f"python{version}" / "site-packages" / "torch-linked.pth").write_text(
            str(tmp_path / "torch-linked") + "\n")
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    work = tmp_path / "work"  # not the source tree: `import workbench` must find the installed package
    work.mkdir()
    install = [*pip, "--python", python, "install", "--quiet", "-c", ROOT / "constraints.txt"]
    workbench = [venv / "bin" / "workbench"]
    mw = metaworld_config(work / "mw.yaml")

    # -- the core ------------------------------------------------------------------------------------------
    ok(run([*install, wheel], work, env))
    assert str(work) not in ok(run([python, "-c", "import workbench; print(workbench.__file__)"], work, env))
    doctor = ok(run([*workbench, "doctor"], work, env))
    assert re.search(r"^  data       missing h5py, metaworld, imageio, imageio_ffmpeg, PIL, pyarrow, av, packaging - "
                     r"datasets and video files: .*; commands: workbench data, workbench demo", doctor, re.M), doctor
    assert re.search(r"^  widgets    missing ipywidgets, matplotlib, ipykernel - the notebook views "
                     r"\(workbench\.widgets: Stepper, Fit, \.\.\.\) and the demo's loss chart; commands: workbench "
                     r"demo$", doctor, re.M)
    # outside a clone: the example configs come from the wheel, and the README's command runs as printed
    assert "wrote examples/configs/tiny.yaml" in ok(run([*workbench, "init"], work, env))
    assert (work / "examples" / "configs" / "tiny.yaml").read_text() == \
        (ROOT / "examples" / "configs" / "tiny.yaml").read_text()
    assert "Finished tiny at step 3" in ok(run(["bash", "-c", "workbench train examples/configs/tiny.yaml --steps 3 "
                                                "--output outputs/tiny --quiet"], work, env))
    refused(run([*workbench, "train", mw, "--output", "mw", "--quiet"], work, env),
            f"error: workbench train {mw} (data: metaworld) needs h5py from the 'data' extra, which is not installed "
            f"in this environment. Install it with: pip install \"grafted-workbench[data]\"")
    refused(run([*workbench, "demo", "--quick", "--output", "demo"], work, env),
            "error: workbench demo needs h5py, imageio, imageio_ffmpeg, PIL (the 'data' extra); matplotlib (the "
            "'widgets' extra), not installed in this environment. Install with: pip install "
            "\"grafted-workbench[data,widgets]\"")
    refused(run([*workbench, "data", "metaworld", "--out", "x.h5"], work, env),
            "error: workbench data metaworld needs pyarrow, av, PIL (the 'data' extra)")
    assert not (work / "mw").exists() and not (work / "demo").exists() and not (work / "x.h5").exists()

    # -- + data --------------------------------------------------------------------------------------------
    ok(run([*install, f"{wheel}[data]"], work, env))
    doctor = ok(run([*workbench, "doctor"], work, env))
    assert re.search(r"^  data       installed - datasets and video files: .*; commands: workbench data", doctor,
                     re.M), doctor
    assert "Finished mw at step 2" in ok(run([*workbench, "train", mw, "--output", "mw", "--quiet"], work, env))
    generated = run([*workbench, "data", "metaworld", "--tasks", "reach-v3", "--episodes", 1, "--frames", 6,
                     "--size", 32, "--out", "one.h5", "--no-progress"], work, env)
    if generated.returncode == 2:  # a machine without offscreen rendering: the refusal must still be clean
        refused(generated, "error: MuJoCo cannot render")
    else:
        ok(generated)
        assert (work / "one.h5").is_file()
    refused(run([*workbench, "demo", "--quick", "--output", "demo"], work, env),
            "error: workbench demo needs matplotlib (the 'widgets' extra), not installed in this environment. "
            "Install with: pip install \"grafted-workbench[widgets]\"")
    assert not (work / "demo").exists()

    # -- + widgets -----------------------------------------------------------------------------------------
    ok(run([*install, f"{wheel}[data,widgets]"], work, env))
    doctor = ok(run([*workbench, "doctor"], work, env))
    assert re.search(r"^  widgets    installed - the notebook views .*; commands: workbench demo$", doctor,
                     re.M), doctor
    assert "demo steps 2" in ok(run([python, "-c", DEMO], work, env))  # the demo's code, on a budget of seconds
    assert (work / "demo" / "loss.png").is_file() and (work / "demo" / "side_by_side.mp4").is_file()
