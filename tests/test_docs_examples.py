"""Every example in the documentation runs as written.

Pages: README.md, every ``docs/**/*.md`` (a new page is picked up by the glob) and ``notebooks/*.md``.
A page's ```python and ```bash blocks run in order, in one namespace (Sybil), in a scratch directory
that holds the repository's ``examples/``, so a later block continues from an earlier one. Every page
starts from the names that ``docs/guides/index.md`` defines ("The names the examples use": the shipped
world model ``exp``, ``model``, ``train``, ``val``, ``raw``, ``traj``), built once per process; ``exp``
is copied for each page, so a page that trains it leaves the next page's alone.

A shell line ``workbench ARGS`` runs in this process through the console script's own function
(``workbench.cli.main``), which spares a Python start and the imports per line, and so do
``python -m workbench.MODULE ARGS`` and ``python examples/SCRIPT.py ARGS`` (the shipped example scripts, as
``__main__``). ``python research/SCRIPT.py ARGS`` runs in a process of its own, since those scripts patch the
library, but a fork of one that has imported torch (``tests/forked.py``); any other line runs in ``bash``.
Each must exit 0.

Docstrings: the ``>>>`` examples of the library (the API reference renders them) run as doctests, module by
module, from the same names plus the module's own.

A block opts out only with ``<!-- skip: next "the reason" -->`` on the line before it (Sybil's directive,
invisible on the rendered page); :func:`test_every_opt_out_gives_its_reason` lists them and holds their
number, so a new one is a deliberate change.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import doctest
import importlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from unittest import SkipTest

import forked
import pytest
import torch
from conftest import kept

sybil = pytest.importorskip("sybil", reason="the dev extra brings sybil (make install)")
from sybil import Lexeme, Region, Sybil  # noqa: E402
from sybil.evaluators.skip import Skipper  # noqa: E402
from sybil.parsers.markdown import CodeBlockParser, SkipParser  # noqa: E402
from sybil.parsers.rest import DocTestParser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHARED = DOCS / "guides" / "index.md"  # its blocks define the names every page starts from
COPIED = ("exp",)  # shared names a page may change: each page gets its own copy
# The number of blocks that opt out, each because it needs a GPU or a real checkpoint (every other block runs, a
# long command as its quick twin below); an opt-out more (or fewer) is a deliberate change to this number.
OPT_OUTS = 5
RUN_LANGUAGES = ("python", "bash")
SHIPPED_RUN = "workbench/worldmodel/weights/metaworld_action"  # the run `workbench demo` trains, as shipped
FEW = "--episodes 2 --frames 16"  # a Meta-World rendering's quick twin: two episodes of one window
# A block whose command takes minutes runs in the suite as its quick twin: the same lines with the words below
# replaced (regular expressions, applied in order to each of the page's blocks): fewer episodes, frames, clips and
# steps, `--quick`, a pretraining scored on its own small data (`--val-data`) instead of the shipped sample, the
# shipped run where the page names the run `workbench demo` trains (or the reader's own, RUN_DIR), a small file for
# the reader's FILE.h5, and `make -n` (what a target runs, printed, not run) for a make target that sets up an
# environment or runs this very suite. A replacement that matches no line of its page fails
# the page, so a twin cannot drift from the block it stands for.
MAKE_N = (r"^make ([\w-]+)", rf"make -n -C {ROOT} \1")
EVAL_RUN = (r"\b(outputs/demo/run|RUN_DIR)\b", SHIPPED_RUN)
PLUGIN_STEPS = (r"(train examples/configs/(?:wan22|easyanimate)\.yaml) --steps 20", r"\1 --steps 1")
FEW_CLIPS = (r"^(workbench eval \S+ --data .*?)( +#.*)?$", r"\1 --clips 2 --steps 1\2")  # 2 clips, 1 sampling step
ONE_START = "--episodes 1 --tasks reach-v3 --steps 1"  # a policy evaluation's twin: 6 policies from one start state
CLOSED_LOOP = (r"(--out outputs/closed_loop)$", rf"\1 {ONE_START} --frames 16")  # ... for one chunk
SCRATCH_RUN = "workbench/worldmodel/weights/metaworld_scratch"
# Your own videos at a real budget, in a new folder (`cd`: the page's later blocks run where it leaves them).
OWN_DATA = ((r"^(workbench data example my_videos .*?)--episodes 48", r"mkdir -p blob\ncd blob\n\1--episodes 12"),
            (r"--ae-steps 200 --steps 300 --batch-size 16", "--ae-steps 1 --steps 1 --batch-size 2"),
            (r"--ae-batch-size 16", "--ae-batch-size 2"),
            (r"own_videos\.yaml --steps 1200", "own_videos.yaml --steps 1"),
            (r"^(workbench eval outputs/own_videos --out outputs/own_videos_eval)( +#.*)$",
             r"\1 --clips 4 --sampling-steps 1\2\ncd .."))
TWINS: dict[str, tuple[tuple[str, str], ...]] = {
    "README.md": (MAKE_N,),
    "docs/getting-started.md": (MAKE_N,),
    "docs/guides/development.md": (MAKE_N,),
    "docs/guides/notebooks-and-views.md": (MAKE_N,),
    "docs/results/world-model.md": (
        MAKE_N, EVAL_RUN, (r"--clips 36|--stride 48", "--clips 2 --steps 1"),
        (r"steps=60\b", "steps=1"), (r"steps=20\b", "steps=1"), (r"range\(4\)", "range(1)")),
    "docs/results/metaworld-demo.md": (
        MAKE_N, EVAL_RUN, (r"--clips 36|--stride 48", "--clips 2 --steps 1"),
        (r"demo --from-scratch", "demo --from-scratch --quick --steps 2 --processes 1")),
    "docs/results/rollouts.md": ((r"--rollout ", "--rollout --episodes 2 --frames 8 "), (r"--steps \d+", "--steps 1")),
    "docs/guides/rollouts.md": (EVAL_RUN, (r"--rollout ", "--rollout --episodes 2 --frames 8 "),
                                (r"--steps \d+", "--steps 1")),
    "docs/results/training-against-drift.md": (
        (r"(metaworld_drift\.yaml --output \S+)", r"\1 --steps 1"),
        (r"--rollout --steps 8", "--rollout --steps 1 --episodes 2 --frames 16"),
        (r"--clips 36", "--clips 2 --steps 1"),
        # the ablation's scripts: one training step, two 16-frame episodes rolled out with one sampling step
        (r"(train_variant\.py .*)$", r"\1 --steps 1"),
        (r"(eval_variant\.py .*--only rollout.*)$", r"\1 --episodes 2 --frames 16 --steps 1")),
    "docs/results/reliability.md": ((r"^cd benchmarks", f"cd {ROOT}/benchmarks"), (r"\.py$", ".py --quick")),
    "docs/results/policy-ranking.md": (
        CLOSED_LOOP, (r"(--out outputs/(?:policy_eval|policy_eval_seed1))$", rf"\1 {ONE_START}"),
        (r"--starts 10 --frames 61", "--starts 1 --frames 16 --tasks reach-v3"),
        # the contact mix: two tasks' three one-window episodes each (one of each held out), the quick demo on them
        (r"--tasks reach-v3,push-v3,pick-place-v3,\S+", "--tasks reach-v3,push-v3"),
        (r"--episodes 60 --frames 48 --size 64", "--episodes 6 --frames 16 --size 64"),
        (r"(--output outputs/demo_contact)$", r"\1 --quick --steps 1 --processes 1")),
    "docs/results/own-data.md": OWN_DATA,
    # pip resolves and builds the project's metadata, installing nothing (tests/test_install.py installs a wheel)
    "docs/guides/install.md": (
        (r'^pip install ("?)\.', rf"pip install --dry-run --no-index --no-build-isolation \1{ROOT}"),),
    "docs/results/adapters.md": ((r"(compare_adapters\.py \w+)", r"\1 --quick --steps 1 --clips 2"),
                                 (r"--speed", "--speed --quick")),
    "docs/guides/your-own-data.md": (
        (r"--episodes 100 --frames 48", FEW), *OWN_DATA,
        # the LeRobot worked example: two tasks' ten one-window episodes (eight to train on, one per task held out)
        (r"--episodes 60 --frames 48 (--action-repeat 2 --out data/metaworld_lerobot)",
         r"--episodes 10 --frames 16 --tasks reach-v3,push-v3 \1"),
        (r"(lerobot_world_model\.yaml --output outputs/lerobot_world_model)$", r"\1 --steps 1"),
        (r"(demo --data data/metaworld_lerobot --output outputs/demo_lerobot)", r"\1 --quick --steps 1 --processes 1")),
    "docs/guides/memory-plan.md": ((r"examples/configs/wan22\.yaml|my_run\.yaml", "examples/configs/tiny.yaml"),),
    "docs/guides/world-model.md": (
        (r"--episodes \d+ --frames \d+", FEW), (r"--out workbench/data/samples/", "--out data/"),
        (r"(pretrain --data (\S+))", r"\1 --val-data \2 --ae-steps 1 --steps 1 --width 8 --depth 1 --ae-width 8"),
        (r"(probe train --data data/probe_train\.h5)", r"\1 --steps 2"), (r"--steps 1500", "--steps 2"),
        EVAL_RUN, (r"--clips 12", "--clips 2"), (r"FILE\.h5", "data/probe_train.h5"),
        (r"^(workbench eval \S+ --data LEROBOT_DIR)",
         rf"workbench data metaworld --format lerobot --tasks reach-v3 {FEW} --out mine_lerobot\n\1"),
        (r"LEROBOT_DIR", "mine_lerobot"),
        (r"observation\.images\.front", "observation.images.corner2_close --split all"),
        (r"--out DIR", "--out outputs/eval_dir"), FEW_CLIPS),
    "docs/guides/action-path.md": (
        (r"^(workbench data calibrate FILE\.h5)",
         rf"workbench data metaworld --tasks reach-v3 {FEW} --out mine.h5\n\1"),
        (r"^(workbench data calibrate LEROBOT_DIR)( +#)",
         rf"workbench data metaworld --format lerobot --tasks reach-v3 {FEW} --out mine_lerobot\n"
         r"\1\2"),
        (r"FILE\.h5", "mine.h5"), (r"LEROBOT_DIR", "mine_lerobot")),
    "docs/guides/configs-and-cli.md": (  # (--standalone: a free port, whatever else the machine runs)
        (r"^torchrun --nproc_per_node=2 (.*--grad-accum 2 --output outputs/tiny-2ranks)",
         r"torchrun --standalone --nproc_per_node=2 \1 --steps 2"), EVAL_RUN, FEW_CLIPS),
    "docs/guides/drive.md": ((r"-s tests/", rf"-s --collect-only {ROOT}/tests/"),),
    "docs/guides/policies.md": (
        EVAL_RUN, CLOSED_LOOP, (r"(--out outputs/policies)$", rf"\1 {ONE_START}"),
        (r"--starts 4 --frames 61", "--starts 1 --frames 16 --tasks reach-v3"),
        (r"(--policy-data my_policies\.npz)$", r"\1 --steps 1"), (r"--episodes 2 --steps 4", ONE_START),
        (r"--scratch outputs/demo/scratch", f"--scratch {SCRATCH_RUN} {ONE_START}")),
    "docs/guides/training-loop.md": (
        (r'data="data/probe_train\.h5"', 'data="workbench/data/samples/metaworld_sample.h5", steps=2'),),
    "docs/guides/plugins/diffusers.md": (PLUGIN_STEPS,),
    "docs/guides/plugins/wan22.md": (PLUGIN_STEPS,),
    "docs/guides/plugins/easyanimate.md": (PLUGIN_STEPS,),
}
# Fences that look runnable but would not run: write them as ```python / ```bash (or a non-code language).
LOOKALIKES = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])?[ \t]*```[ \t]*(py|python3|pycon|sh|shell|console|zsh)\b", re.M)


# -- evaluators ---------------------------------------------------------------------------------------
def twin(example, source: str) -> str:
    """``source`` with its page's :data:`TWINS` replacements made, each one that matched noted in the namespace."""
    page = Path(example.path).resolve()
    rules = TWINS.get(page.relative_to(ROOT).as_posix(), ()) if page.is_relative_to(ROOT) else ()
    matched = example.namespace.setdefault("__twins_matched__", set())
    for index, (pattern, replacement) in enumerate(rules):
        source, count = re.subn(pattern, replacement, source, flags=re.M)
        if count:
            matched.add(index)
    return source


def run_python(example) -> None:
    """A ```python block, compiled like a notebook cell: a top-level ``await`` runs in an event loop. What it prints
    is kept for a ``<!-- prints -->`` block after it."""
    source = "\n" * (example.line + example.parsed.line_offset) + twin(example, str(example.parsed))
    code = compile(source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = eval(code, example.namespace)  # noqa: S307 - the documentation's own example
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    example.namespace.pop("__builtins__", None)
    example.namespace["__printed__"] = printed.getvalue()
    sys.stdout.write(printed.getvalue())


def shell_lines(source: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comment-only and blank lines dropped, and a
    ``for``/``while``/``if`` with its body up to its ``done``/``fi`` kept together as one command."""
    lines = [line.strip() for line in source.replace("\\\n", " ").splitlines()]
    commands: list[str] = []
    depth = 0
    for line in lines:
        if not line or line.startswith("#"):
            continue
        if depth:
            commands[-1] += "\n" + line
        else:
            commands.append(line)
        depth += bool(re.match(r"(for|while|until|if)\b", line)) - bool(re.match(r"(done|fi)\b", line))
    return commands


def _workbench_argv(line: str) -> tuple[dict[str, str], list[str]] | None:
    """``(environment, argv)`` when ``line`` is ``[NAME=VALUE ...] [path/]workbench ARGS`` and nothing else,
    ``[NAME=VALUE ...] [path/]python -m workbench.MODULE ARGS`` (then argv starts ``-m``, the module), or
    ``[NAME=VALUE ...] [path/]python examples/SCRIPT.py ARGS`` or ``research/SCRIPT.py`` (argv starts with the
    script)."""
    if re.search(r"[|&;<>`$(){}]", line.split(" #")[0]):
        return None
    words = shlex.split(line, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words and Path(words[0]).name == "workbench":
        return env, words[1:]
    if len(words) > 2 and Path(words[0]).name == "python" and words[1] == "-m" and words[2].startswith("workbench."):
        return env, words[1:]
    if len(words) > 1 and Path(words[0]).name == "python" and re.fullmatch(r"(examples|research)/\w+\.py", words[1]):
        return env, words[1:]  # a shipped example script, or a research script (which runs in a fork)
    return None


def _run_in_process(argv: list[str]) -> int | str | None:
    """The exit status of ``workbench ARGV``, of ``python -m MODULE ARGS`` (the module's ``main(args)``, which
    its ``__main__`` block runs), or of ``python examples/SCRIPT.py ARGS`` (the script as ``__main__``, with
    ``sys.argv`` as that command line gives it), run in this process."""
    from workbench.cli import main

    if argv[0] == "-m":
        main = importlib.import_module(argv[1]).main
        argv = argv[2:]
    elif argv[0].endswith(".py"):
        script, argv = argv[0], argv[1:]

        def main(args: list[str]) -> None:
            saved = sys.argv
            sys.argv = [script, *args]
            try:
                runpy.run_path(script, run_name="__main__")
            finally:
                sys.argv = saved
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own exits, and a script's
        return stop.code


def run_shell(example) -> None:
    """A ```bash block, line by line, in the page's scratch directory; every line must exit 0. The lines that
    run ``workbench``, a module of it or an example script run in this process, a research script in a fork
    (a fresh interpreter would import torch again)."""
    printed = []
    for line in shell_lines(twin(example, str(example.parsed))):
        parsed = _workbench_argv(line)
        out = io.StringIO()
        if re.fullmatch(r"cd \S+", line):  # the page's later lines run there, as in the reader's shell
            os.chdir(line.split()[1])
            continue
        if parsed is not None and parsed[1][0].startswith("research/"):  # they patch the library: a process each
            env, argv = parsed
            done = forked.run(argv, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=300)
            code, text = done.returncode, done.stdout + done.stderr
        elif parsed is not None:
            env, argv = parsed
            saved = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    code = _run_in_process(argv)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                torch.set_num_threads(1)
            text = out.getvalue()
        else:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            done = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=300)
            code, text = done.returncode, done.stdout + done.stderr
        assert code in (0, None), f"{example.path}:{example.line}: `{line}` exited {code}:\n{text[-3000:]}"
        assert "Traceback" not in text, f"{example.path}:{example.line}: `{line}`:\n{text[-3000:]}"
        printed.append(text)
    example.namespace["__printed__"] = "".join(printed)
    example.namespace["__printed_pages__"] = example.namespace.get("__printed_pages__", "") + "".join(printed)


# The output a page shows: a ```text block right after the line ``<!-- prints -->`` is what the block before it
# printed (doctest's rules: ``...`` stands for any text, runs of whitespace compare equal).
PRINTS = re.compile(r"^<!-- prints -->[ \t]*\n\n?```text\n(?P<want>.*?)^```[ \t]*$", re.M | re.S)


def check_printed(example) -> None:
    want, got = str(example.parsed), example.namespace.get("__printed__", "")
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert checker.check_output(want, got, flags), (
        f"{example.path}:{example.line}: the page shows\n{want}\nthe block before it printed\n{got}")


def prints_parser(document):
    for match in PRINTS.finditer(document.text):
        lexeme = Lexeme(match.group("want"), offset=match.start("want") - match.start(),
                        line_offset=document.text.count("\n", match.start(), match.start("want")))
        yield Region(match.start(), match.end(), lexeme, check_printed)


def markdown_sybil() -> Sybil:
    return Sybil(parsers=[CodeBlockParser("python", run_python), CodeBlockParser("bash", run_shell), SkipParser(),
                          prints_parser])


def docstring_sybil() -> Sybil:
    return Sybil(parsers=[DocTestParser(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)])


# -- what runs -----------------------------------------------------------------------------------------
def pages() -> list[Path]:
    """README.md, every page under docs/ and the notebooks' README (docs/notebooks links that folder)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), *sorted((ROOT / "notebooks").glob("*.md"))]


def modules_with_examples() -> list[Path]:
    return sorted(p for p in (ROOT / "workbench").rglob("*.py") if ">>>" in p.read_text())


def _scratch(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "examples").symlink_to(ROOT / "examples")
    (path / "workbench").symlink_to(ROOT / "workbench")  # the shipped runs and samples the pages name
    (path / "research").symlink_to(ROOT / "research")  # the scripts a results page reruns
    if (ROOT / ".venv").exists():
        (path / ".venv").symlink_to(ROOT / ".venv")
    return path


def evaluate(document, cwd: Path) -> list[str]:
    """Run every example of ``document`` in order in ``cwd``; the reasons of those that opted out."""
    skipped: list[str] = []
    before = Path.cwd()
    os.chdir(cwd)
    try:
        for example in document:
            try:
                example.evaluate()
            except SkipTest as skip:
                skipped.append(f"line {example.line}: {skip}")
    finally:
        os.chdir(before)
        torch.set_num_threads(1)
    return skipped


@cache
def shared_names(scratch: str) -> dict:
    """The namespace ``docs/guides/index.md`` leaves, built once per process (its CPU seconds with it)."""
    start = time.process_time()
    document = markdown_sybil().parse(SHARED)
    evaluate(document, _scratch(Path(scratch)))
    names = {k: v for k, v in document.namespace.items() if not k.startswith("__")}
    names["__cpu_seconds__"] = time.process_time() - start
    return names


@pytest.fixture
def shared(tmp_path_factory):
    return shared_names(str(tmp_path_factory.getbasetemp() / "shared-docs-names"))


def _start(shared: dict, text: str) -> dict:
    names = {k: v for k, v in shared.items() if not k.startswith("__")}
    for name in COPIED:
        if name in names and re.search(rf"\b{name}\b", text):
            names[name] = copy.deepcopy(names[name])
    if "exp" in names and names["exp"] is not shared.get("exp"):
        names["model"] = names["exp"].model
    return names


# What a page's examples must leave behind, beyond running: values the page shows or promises.
def _getting_started(ns: dict) -> None:
    scores = ns["exp"].evaluate(ns["SyntheticMoves"](items=16, frames=8, size=16, seed=1), batches=2)
    assert set(scores) >= {"improvement"}, scores
    assert ns["other"].label == "fork@4: cond"
    assert ns["exp"].step == 50


def _writing_a_backbone(ns: dict) -> None:
    written, tiny = ns["report"], ns["tiny_report"]  # the worked example's report, after the last one on the page
    assert written.ok and written.declared == ("Previews",) and written["previews"].status == "kept", written
    assert tiny.ok and str(tiny).splitlines()[0] == kept("tiny_video", "cpu"), tiny
    assert ns["bf16_report"].ok and ns["bf16_report"].setting == "cpu bfloat16"
    assert ns["refusal"].startswith("Forgot writes pixel_space of the Previews capability without declaring it")


def _step_through(ns: dict) -> None:
    traj, other = ns["traj"], ns["other"]
    assert torch.equal(other[9].x_t, traj[9].x_t) and not torch.equal(other.final, traj.final)
    assert (Path("outputs/steps.mp4").stat().st_size if Path("outputs/steps.mp4").exists() else 1) > 0


def _policies(ns: dict) -> None:
    """The open-loop ranking's twin (6 policies from reach start 0 of the shipped recording, 1 sampling step):
    what it printed and wrote, its simulated outcomes those of the recording."""
    import json

    from workbench.worldmodel.policies import load_policies

    printed = ns["__printed_pages__"]
    assert "6 policies x 1 start states x 1 tasks (6 episodes of 61 frames), 1 sampling steps" in printed
    for label in ("frozen base alone", "base + adapter", "probes on the simulator's frames (ceiling)"):
        assert label in printed
    report = json.loads(Path("outputs/policies/policy_ranking.json").read_text())
    assert set(report["variants"]) == {"probe_on_truth", "base", "adapter"}
    assert report["gate_scale"] == 2.0 and report["sampling_steps"] == 1 and report["episodes"] == 6
    assert len(report["variants"]["adapter"]["distance_m"]) == 6
    assert report["simulated_distance_m"] == pytest.approx(
        load_policies().select(starts=1, tasks=["reach-v3"]).sim_distance.tolist(), abs=1e-5)
    closed = json.loads(Path("outputs/closed_loop/metrics.json").read_text())
    assert closed["policies"][-1] == "my_policies.py:straight_at_the_goal", closed["policies"]


def _your_own_data(ns: dict) -> None:
    """The walk-through from a folder of MP4s and .npy actions: every step left what it promises."""
    import json

    import numpy as np

    from workbench.data.lerobot import LeRobotClips

    info = json.loads(Path("my_dataset/meta/info.json").read_text())
    assert (info["total_episodes"], info["fps"], info["features"]["action"]["shape"]) == (12, 10, [2])
    assert info["features"]["observation.images.main"]["shape"] == [32, 32, 3]
    assert not Path("my_dataset.partial").exists()
    clips = LeRobotClips(root="my_dataset", window=8, stride=8, split="all")
    item = clips[len(clips) - 1]
    recorded = np.load(f"my_videos/episode_{item['episode']:03d}.npy")
    assert np.array_equal(item["action"].numpy(), recorded[item["start"]:item["start"] + 8]) and "proprio" not in item
    import yaml

    config = Path("examples/configs/own_videos.yaml").read_text()  # `init --data` filled in the shipped example
    assert config.startswith("# Filled in for my_dataset by `workbench init own_videos --data my_dataset`.\n")
    filled = yaml.safe_load(config)
    assert (filled["data"]["config"]["root"], filled["adapter"]["config"]["dim"]) == ("my_dataset", 2)
    base = json.loads(Path("outputs/own_base.json").read_text())["provenance"]
    assert base["validation"]["data"] == "my_dataset" and base["train_steps"] == 30
    assert base["initialised_from"] == "the shipped weights (tiny_video-metaworld-i2v)"  # pretrain's default
    assert base["pretrain_config"]["moving_weight"] == 10 and isinstance(base["base_check"]["carries"], bool)
    assert Path("outputs/own_base.check.png").stat().st_size > 0
    metrics = json.loads(Path("outputs/own_videos_eval/metrics.json").read_text())
    assert metrics["evaluation"]["clips"] == 4 and metrics["evaluation"]["data"] == "my_dataset"
    assert np.isfinite(metrics["summary"]["mean"]["adapter"]["psnr"])
    rolled = json.loads(Path("outputs/own_videos_rollout/rollout_metrics.json").read_text())  # the run's own data
    evaluation = rolled["evaluation"]
    assert (evaluation["data"], evaluation["split"], evaluation["state"]) == ("my_dataset", "val", "none")
    assert (evaluation["frames"], evaluation["metrics"]) == (24, ["moving_psnr"])  # whole episodes, no probe
    assert np.isfinite(rolled["summary"]["chunks"][0]["adapter_moving_psnr"])
    assert ns["exp"].step == 30 and len(ns["trajectory"]) == 8


def _writing_a_composer(ns: dict) -> None:
    composer = ns["ChannelGate"](channels=4)
    base, adapter = torch.randn(1, 4, 2, 3, 3), torch.randn(1, 4, 2, 3, 3)
    out = composer.compose(base, adapter, None)
    assert torch.equal(out.prediction, base + 0.1 * adapter) and out.gate.shape == (1, 4, 1, 1, 1) and out.mask is None
    with composer.override_gate(torch.tensor([0.0, 1.0, 0.0, 0.0])):  # one channel open
        assert torch.equal(composer(base, adapter)[:, 1], base[:, 1] + adapter[:, 1])
        assert torch.equal(composer(base, adapter)[:, 0], base[:, 0])
    assert composer.gate_override is None


def _writing_an_adapter(ns: dict) -> None:
    report = ns["report"]
    assert report.ok and [f.promise for f in report.findings] == ["identity", "training"], report
    assert ns["ActionShift"].at_init == "zero_output"


CHECKS = {
    "docs/getting-started.md": _getting_started,
    "docs/guides/writing-a-composer.md": _writing_a_composer,
    "docs/guides/writing-an-adapter.md": _writing_an_adapter,
    "docs/guides/your-own-data.md": _your_own_data,
    "docs/guides/policies.md": _policies,
    "docs/guides/writing-a-backbone.md": _writing_a_backbone,
    "docs/guides/step-through.md": _step_through,
}


@pytest.mark.parametrize("page", [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in pages()])
def test_the_examples_of_each_page_run(page, shared, tmp_path, record_property):
    if page == SHARED:  # built once for every page (the fixture); its names are checked here
        assert {"exp", "model", "train", "val", "raw", "traj"} <= set(shared), sorted(shared)
        assert shared["traj"].steps == 20 and tuple(shared["raw"]["action"].shape) == (2, 16, 4)
        record_property("cpu_seconds", round(shared["__cpu_seconds__"], 2))
        return
    document = markdown_sybil().parse(page)
    examples = list(document)
    if not examples:
        pytest.skip("no python or bash block")
    start = time.process_time()
    document.namespace.update(_start(shared, page.read_text()))
    skipped = evaluate(document, _scratch(tmp_path))
    record_property("cpu_seconds", round(time.process_time() - start, 2))
    rules = TWINS.get(page.relative_to(ROOT).as_posix(), ())
    matched = document.namespace.get("__twins_matched__", ())
    unmatched = [rule for index, rule in enumerate(rules) if index not in matched]
    assert unmatched == [], f"{page}: these replacements of its quick twin match no line of the page: {unmatched}"
    check = CHECKS.get(page.relative_to(ROOT).as_posix())
    if check is not None:
        before = Path.cwd()
        os.chdir(tmp_path)
        try:
            check(document.namespace)
        finally:
            os.chdir(before)
    ran = [e for e in examples if not isinstance(e.region.evaluator, Skipper)]
    if len(skipped) == len(ran):
        pytest.skip("every block opts out: " + "; ".join(skipped))


@pytest.mark.parametrize("module", [pytest.param(p, id=p.relative_to(ROOT).as_posix())
                                    for p in modules_with_examples()])
def test_the_docstring_examples_of_each_module_run(module, shared, tmp_path, record_property):
    document = docstring_sybil().parse(module)
    examples = list(document)
    assert examples, f"{module}: '>>>' appears but no doctest example was found"
    start = time.process_time()
    # the shared names (what the API reference says the examples continue from), then the module's own
    document.pop_evaluator(document.import_document)
    from sybil.python import import_path

    document.namespace.update(_start(shared, module.read_text()))
    document.namespace.update(import_path(module).__dict__)
    evaluate(document, _scratch(tmp_path))
    record_property("cpu_seconds", round(time.process_time() - start, 2))


# -- the rules the harness keeps --------------------------------------------------------------------
def opt_outs() -> list[tuple[str, int, str, str]]:
    """``(page, line, action, reason)`` of every skip directive of every page."""
    out = []
    for page in pages():
        document = markdown_sybil().parse(page)
        for example in document:
            if isinstance(example.region.evaluator, Skipper):
                action, reason = example.region.parsed
                out.append((page.relative_to(ROOT).as_posix(), example.line, action, reason or ""))
    return out


def test_every_opt_out_gives_its_reason():
    """``<!-- skip: next "why" -->`` only: a reason of a few words in quotes, never a bare skip or a range; and
    the reason is a GPU or a real checkpoint, since everything else runs here as a quick twin."""
    found = opt_outs()
    listing = "\n".join(f"  {page}:{line}: {reason}" for page, line, _, reason in found)
    bad = [(page, line, action, reason) for page, line, action, reason in found
           if action != "next" or not re.fullmatch(r"""(["']).{12,}\1""", reason.strip())]
    assert bad == [], f"an opt-out without its reason in quotes (or not 'skip: next'):\n{bad}"
    assert len(found) == OPT_OUTS, (
        f"{len(found)} blocks opt out, OPT_OUTS says {OPT_OUTS}; update it deliberately. They are:\n{listing}")
    runnable = [f"{page}:{line}" for page, line, _, reason in found if not re.search(r"GPU|checkpoint", reason)]
    assert runnable == [], (f"these blocks opt out for a reason other than a GPU or a real checkpoint: {runnable}. "
                            f"Run them as a quick twin instead (TWINS: fewer steps, episodes or clips).")


def test_every_code_fence_is_run_or_plainly_not_code():
    """A fence Sybil would not run (```py, ```sh, ```pycon, ...) is a block a reader copies untested."""
    found = {page.relative_to(ROOT).as_posix(): LOOKALIKES.findall(page.read_text()) for page in pages()}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_harness_sees_every_python_and_bash_block():
    """Sybil's lexer finds as many blocks as a plain count of the fences (none hides in a list or a quote)."""
    for page in pages():
        text = page.read_text()
        opening = rf"^[ \t>]*(?:[-*+]|\d+[.)])?[ \t]*```(?:{'|'.join(RUN_LANGUAGES)})[ \t]*$"
        fences = len(re.findall(opening, text, re.M))
        blocks = [e for e in markdown_sybil().parse(page)
                  if not isinstance(e.region.evaluator, Skipper) and e.region.evaluator is not check_printed]
        assert len(blocks) == fences, page


def test_the_docstring_examples_render_as_code_and_hide_no_skip():
    """``>>>`` sits in an ``Examples:`` section (mkdocstrings renders it as a code block, not a quote), and no
    doctest directive shows on the page."""
    misplaced, directives = [], []
    for module in modules_with_examples():
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node, clean=True) or ""
            if "doctest:" in doc:
                directives.append(f"{module.name}:{getattr(node, 'name', '<module>')}")
            section = None
            for line in doc.splitlines():
                if re.fullmatch(r"[A-Z][A-Za-z ]*:", line):
                    section = line[:-1]
                elif line and not line[0].isspace():
                    section = None
                if line.lstrip().startswith(">>>") and section != "Examples":
                    misplaced.append(f"{module.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}")
                    break
    assert directives == [], directives
    assert misplaced == [], f"'>>>' outside an Examples: section: {misplaced}"


def test_a_failing_block_fails_with_its_page_and_line(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('# A page\n\n```python\nx = 1\n```\n\n<!-- skip: next "needs a GPU and minutes" -->\n\n'
                    '```python\nraise RuntimeError("never run")\n```\n\n```bash\nfalse\n```\n')
    document = markdown_sybil().parse(page)
    with pytest.raises(AssertionError, match=r"page\.md:13: `false` exited 1"):
        evaluate(document, _scratch(tmp_path / "run"))
    assert document.namespace["x"] == 1


def test_what_a_page_shows_a_block_printing_is_compared(tmp_path):
    page = tmp_path / "page.md"
    shown = ("```python\nprint({'loss': 0.25, 'steps': 3})\n```\n\n<!-- prints -->\n\n"
             "```text\n{'loss': ..., 'steps': %s}\n```\n")
    page.write_text(shown % 3)
    evaluate(markdown_sybil().parse(page), _scratch(tmp_path / "run"))
    page.write_text(shown % 4)
    with pytest.raises(AssertionError, match=r"page\.md:5: the page shows\n +\{'loss': \.\.\., 'steps': 4\}"):
        evaluate(markdown_sybil().parse(page), _scratch(tmp_path / "run2"))


def test_workbench_lines_and_example_scripts_run_in_process_and_others_in_bash():
    assert _workbench_argv("workbench train a.yaml --steps 3  # comment") == ({}, ["train", "a.yaml", "--steps", "3"])
    assert _workbench_argv("OMP_NUM_THREADS=1 .venv/bin/workbench doctor") == ({"OMP_NUM_THREADS": "1"}, ["doctor"])
    assert _workbench_argv("workbench cache-latents run.yaml --out cache/ && torchrun x") is None
    assert _workbench_argv("cd benchmarks && python x.py") is None
    assert _workbench_argv("python -m workbench.worldmodel.policies --starts 1") == (
        {}, ["-m", "workbench.worldmodel.policies", "--starts", "1"])
    assert _workbench_argv("python -m pytest tests") is None and _workbench_argv("python x.py") is None
    assert _workbench_argv("OMP_NUM_THREADS=1 python examples/compare_adapters.py controlnet  # 7 min") == (
        {"OMP_NUM_THREADS": "1"}, ["examples/compare_adapters.py", "controlnet"])
    assert _workbench_argv("python research/train_variant.py x --steps 1") == (
        {}, ["research/train_variant.py", "x", "--steps", "1"])  # (run in a fork: it patches the library)
    assert _workbench_argv("python benchmarks/real_size.py") is None
    assert [line.split() for line in shell_lines("# one\nworkbench a \\\n    --b 1   # c\n\nmake x\n")] == [
        ["workbench", "a", "--b", "1", "#", "c"], ["make", "x"]]


def test_the_backbone_guides_worked_example_is_the_fixture_plugins_backbone():
    """The guide writes its backbone in full and the fixture plugin installs the same file through an entry point:
    the first block under "A backbone, written" is that module's source, character for character, so the page and
    the tested plugin cannot drift apart."""
    page = (DOCS / "guides" / "writing-a-backbone.md").read_text()
    section = page.split("\n## A backbone, written\n", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    module = ROOT / "tests" / "fixtures" / "workbench-fixture-plugin" / "workbench_fixture_plugin" / "backbone.py"
    assert block == module.read_text()
    code = [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith(("#", '"""'))]
    assert len(code) <= 70, len(code)  # a backbone with the required part only is short enough to read whole


@pytest.mark.parametrize("page", ["docs/guides/writing-a-composer.md", "docs/guides/writing-an-adapter.md"])
def test_a_newcomers_composer_and_adapter_fit_in_30_lines(page):
    """The extension points stay small: each page's whole example, its identity test included, is at most 30
    lines of code (blank lines not counted)."""
    blocks = [e for e in markdown_sybil().parse(ROOT / page) if not isinstance(e.region.evaluator, Skipper)]
    lines = [line for e in blocks for line in e.parsed.splitlines() if line.strip()]
    assert len(blocks) == 1 and 15 <= len(lines) <= 30, (len(blocks), len(lines))
