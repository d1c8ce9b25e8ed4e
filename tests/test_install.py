"""Installed as a user installs it: the built wheel in a new environment, one extra at a time.

The wheel is named as the install guide names it and carries the licence its metadata declares.

One environment is built up in three stages — the core (`pip install WHEEL`), then `[data]`, then
`[data,widgets]` — from the wheel's own metadata and the versions in constraints.txt. At each stage
`workbench doctor` reports what is installed, every command whose extra is missing refuses before it
starts, naming the extra and the pip command, and the commands whose extras are there run a few steps. With
the core alone: `doctor` names what each extra would bring, `init` writes the example configs and `train` runs
the tiny one, and `train` on Meta-World data, `demo` and `data metaworld` refuse, naming the `data` extra,
with nothing written. The commands of these two stages run in one process per stage (each start of the command
imports torch, about 4 CPU seconds), through the console script's own function; the last stage starts the
console script itself.

At each stage pip resolves the wheel's requirement (``pip install --dry-run --report``, the
constraints applied, against what the new environment already holds) and the distributions it would
install are linked from this environment instead of unpacked a second time, after a check that each
is here at the version pip chose (the constraints pin both); the wheel itself is installed by pip, and
``pip check`` ends the test. So the new environment holds exactly what the wheel's metadata brings,
and a requirement missing from an extra still leaves its command refusing. Unpacking the same wheels
again (torch, pyarrow, mujoco, av, matplotlib, ...) cost most of this test's time; set
WORKBENCH_INSTALL_TEST_FULL=1 to install every stage for real. The test runs on one worker (``make
test`` schedules the suite file by file, the longest first).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
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


def link(names: list[str], into: Path) -> None:
    """Symlinks to the files of distributions ``names`` of this environment (their top-level packages,
    modules and ``.dist-info``), in ``into``, a folder a ``.pth`` file puts on the new environment's path."""
    from importlib import metadata

    into.mkdir(exist_ok=True)
    for name in names:
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")} - {"__pycache__"}:
            if not (into / top).exists():
                (into / top).symlink_to(Path(dist.locate_file(top)))


def torch_closure() -> list[str]:
    """torch and every package it requires (markers evaluated here)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    todo, seen = ["torch"], []
    while todo:
        name = todo.pop()
        if name.lower() in {s.lower() for s in seen}:
            continue
        seen.append(name)
        for text in metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def resolve_and_link(pip: list, requirement: str, work: Path, env: dict, into: Path) -> list[str]:
    """What pip would install for ``requirement`` (a dry run with the constraints, against the new
    environment), each checked to be here at that version, linked into ``into``; the names, sorted."""
    from importlib import metadata

    report = work / "resolved.json"
    ok(run([*pip, "install", "--quiet", "--dry-run", "--report", report, "-c", ROOT / "constraints.txt", requirement],
           work, env))
    items = json.loads(report.read_text())["install"]
    chosen = {item["metadata"]["name"]: item["metadata"]["version"] for item in items}
    chosen.pop("grafted-workbench", None)
    here = {name: metadata.version(name) for name in chosen}
    assert here == chosen, f"{requirement}: pip chose {chosen}, this environment holds {here} (constraints pin both)"
    link(sorted(chosen), into)
    return sorted(chosen, key=str.lower)


def metaworld_config(path: Path) -> Path:
    path.write_text("name: mw\nbase: {type: tiny_video}\nadapter: {type: latent_residual}\n"
                    "training: {steps: 2, batch_size: 2, progress: false}\n"
                    "data: {type: metaworld, config: {path: sample, window: 16, stride: 16}}\n")
    return path


# The demo's code on a budget of seconds. Its rollouts and policy ranking (the world summary, seconds of sampling
# in two processes) run in the full environment (tests/test_ahead.py); here their modules import and the shipped
# policy recording loads, which is what an extra's missing requirement would break.
DEMO = ("from workbench.worldmodel.demo import DemoConfig, run_demo; "
        "m = run_demo(DemoConfig.quick(output='demo', steps=2, eval_clips=2, unseen_clips=0, video_clips=1, "
        "sampling_steps=2, batch_size=2, world=False), progress=False); print('demo steps', m['training']['steps']); "
        "import workbench.worldmodel.imagination, workbench.inspect.recording.rollouts; "
        "from workbench.worldmodel.rollout_eval import long_episodes; "
        "from workbench.worldmodel.policies import load_policies; "
        "print('policy episodes', len(load_policies()), 'long episodes', len(long_episodes('long', episodes=2)))")


# Command lines run in turn in one process through the console script's own function (workbench.cli.main), each
# line's exit status and what it printed kept: the core stage's, which would otherwise import torch once each.
IN_TURN = """
import contextlib, io, json, sys
import workbench
from workbench.cli import main
done = {"imported from": workbench.__file__}
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    done[" ".join(argv)] = status, out.getvalue(), err.getvalue()
print(json.dumps(done))
"""


def in_turn(python: Path, lines: list[list], work: Path, env: dict) -> dict[str, subprocess.CompletedProcess]:
    """Each command line of ``lines`` (``workbench`` left out) run by :data:`IN_TURN` in one new process of
    ``python``: by line, its exit status and what it printed, as :func:`run` returns them."""
    done = json.loads(ok(run([python, "-c", IN_TURN, json.dumps([[str(a) for a in line] for line in lines])], work,
                             env)).splitlines()[-1])
    imported = done.pop("imported from")
    assert str(work) not in imported and str(ROOT) not in imported, imported  # the installed package
    return {line: subprocess.CompletedProcess(line, *result) for line, result in done.items()}


def test_the_wheel_installs_and_each_extra_serves_its_commands(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), PIP_NO_COMPILE="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [sys.executable, "-m", "pip"]
    ok(run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", ROOT], ROOT, env))
    wheel = next((tmp_path / "dist").glob(f"{WHEEL_NAME}-*.whl"))
    # the wheel carries the licence its metadata names, under the distribution name the install guide gives
    with zipfile.ZipFile(wheel) as archive:
        info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        carried = archive.read(f"{info}/licenses/LICENSE").decode()
    for field in ("Name: grafted-workbench", "License-Expression: MIT", "License-File: LICENSE"):
        assert re.search(rf"^{field}$", metadata, re.M), field
    assert carried == (ROOT / "LICENSE").read_text()
    assert f"`pip install \"dist/{wheel.name}[data,widgets]\"`" in (ROOT / "docs" / "guides" / "install.md").read_text()
    venv = tmp_path / "venv"
    ok(run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env))
    python = venv / "bin" / "python"
    full = os.environ.get("WORKBENCH_INSTALL_TEST_FULL") == "1"
    linked = tmp_path / "linked"
    if not full:
        link(torch_closure(), linked)
        version = sysconfig.get_python_version()
        (venv / "lib" / f"python{version}" / "site-packages" / "linked.pth").write_text(f"{linked}\n")
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    work = tmp_path / "work"  # not the source tree: `import workbench` must find the installed package
    work.mkdir()
    install = [*pip, "--python", python, "install", "--quiet", "-c", ROOT / "constraints.txt"]
    workbench = [venv / "bin" / "workbench"]
    mw = metaworld_config(work / "mw.yaml")

    def stage(extras: str) -> list[str]:
        """The wheel with ``extras`` in the new environment: for real, or resolved and linked (see above)."""
        requirement = f"{wheel}{extras}"
        if full:
            ok(run([*install, requirement], work, env))
            return []
        brought = resolve_and_link([*pip, "--python", python], requirement, work, env, linked)
        if not extras:
            ok(run([*install, "--no-deps", wheel], work, env))  # the wheel itself, by pip
        return brought

    # -- the core ------------------------------------------------------------------------------------------
    brought = stage("")
    assert full or not {"h5py", "matplotlib", "ipywidgets", "pyarrow"} & {n.lower() for n in brought}, brought
    tiny = "train examples/configs/tiny.yaml --steps 3 --output outputs/tiny --quiet"
    core = in_turn(python, [["doctor"], ["init"], tiny.split(), ["train", mw, "--output", "mw", "--quiet"],
                            ["demo", "--quick", "--output", "demo"], ["data", "metaworld", "--out", "x.h5"]], work, env)
    doctor = ok(core["doctor"])
    assert re.search(r"^  data       missing h5py, metaworld, imageio, imageio_ffmpeg, PIL, pyarrow, av, packaging - "
                     r"datasets and video files: .*; commands: workbench data, workbench demo, workbench eval, "
                     r"workbench pretrain, workbench probe$", doctor, re.M), doctor
    assert re.search(r"^  widgets    missing ipywidgets, anywidget, matplotlib, ipykernel - the notebook views "
                     r"\(workbench\.widgets: Stepper, Fit, \.\.\.\) and the demo's loss chart; commands: workbench "
                     r"demo$", doctor, re.M), doctor
    # outside a clone: the example configs come from the wheel, and the README's command runs as printed
    assert "wrote examples/configs/tiny.yaml" in ok(core["init"])
    assert (work / "examples" / "configs" / "tiny.yaml").read_text() == \
        (ROOT / "examples" / "configs" / "tiny.yaml").read_text()
    assert "Finished tiny at step 3" in ok(core[tiny])
    # each command whose extra is missing refuses before it starts, naming the extra and the pip command
    refused(core[f"train {mw} --output mw --quiet"],
            f"error: workbench train {mw} (data: metaworld) needs h5py from the 'data' extra, which is not installed "
            f"in this environment. Install it with: pip install \"./[data]\" in a clone of the repository")
    refused(core["demo --quick --output demo"],
            "error: workbench demo needs h5py, imageio, imageio_ffmpeg, PIL (the 'data' extra); matplotlib (the "
            "'widgets' extra), not installed in this environment. Install with: pip install "
            "\"./[data,widgets]\" in a clone of the repository")
    refused(core["data metaworld --out x.h5"],
            "error: workbench data metaworld needs pyarrow, av, PIL (the 'data' extra), not installed in this "
            "environment. Install with: pip install \"./[data]\" in a clone of the repository")
    assert not (work / "mw").exists() and not (work / "demo").exists() and not (work / "x.h5").exists()
    # -- + data --------------------------------------------------------------------------------------------
    brought = stage("[data]")
    assert full or {"h5py", "metaworld", "pyarrow", "av"} <= {n.lower() for n in brought}, brought
    generate = ["data", "metaworld", "--tasks", "reach-v3", "--episodes", 1, "--frames", 6, "--size", 32, "--out",
                "one.h5", "--no-progress"]
    data = in_turn(python, [["doctor"], ["train", mw, "--output", "mw", "--quiet"], generate,
                            ["demo", "--quick", "--output", "demo"]], work, env)
    doctor = ok(data["doctor"])
    assert re.search(r"^  data       installed - datasets and video files: .*; commands: workbench data", doctor,
                     re.M), doctor
    assert "Finished mw at step 2" in ok(data[f"train {mw} --output mw --quiet"])
    generated = data[" ".join(str(a) for a in generate)]
    if generated.returncode == 2:  # a machine without offscreen rendering: the refusal must still be clean
        refused(generated, "error: MuJoCo cannot render")
    else:
        ok(generated)
        assert (work / "one.h5").is_file()
    refused(data["demo --quick --output demo"],
            "error: workbench demo needs matplotlib (the 'widgets' extra), not installed in this environment. "
            "Install with: pip install \"./[widgets]\" in a clone of the repository")
    assert not (work / "demo").exists()

    # -- + widgets -----------------------------------------------------------------------------------------
    brought = stage("[data,widgets]")
    assert full or {"ipywidgets", "matplotlib", "ipykernel"} <= {n.lower() for n in brought}, brought
    doctor = ok(run([*workbench, "doctor"], work, env))
    assert re.search(r"^  widgets    installed - the notebook views .*; commands: workbench demo$", doctor,
                     re.M), doctor
    printed = ok(run([python, "-c", DEMO], work, env))
    assert "demo steps 2" in printed and "policy episodes 48 long episodes 2" in printed
    assert (work / "demo" / "loss.png").is_file() and (work / "demo" / "side_by_side.mp4").is_file()
    ok(run([*pip, "--python", python, "check"], work, env))  # every installed distribution's requirements met
