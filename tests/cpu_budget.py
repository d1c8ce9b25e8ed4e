"""The suite's CPU budget: each test file's CPU seconds, checked in, so that growth shows in review.

``make test`` writes a JUnit report (``--junitxml``) in which every test carries its CPU seconds
(setup, call and teardown, this process and the children it waited for: the property
``test_cpu_seconds``, added by ``tests/conftest.py``), then runs

    python tests/cpu_budget.py outputs/junit.xml

which sums them per file and prints each file beside its budget below, the largest first. It is a
report, not a timing assertion: CPU seconds do not count the time a process waits for a core, so a
loaded machine moves them little, and the run fails only on an overshoot no noise explains — a
file over ``2 x budget + 30`` CPU seconds. Anything smaller is printed and left to review, and so is
a file missing from the table (printed as new, with its seconds). ``--write`` replaces the table with the run's
numbers (do it deliberately, with the reason in the commit). The same table orders the suite:
``tests/conftest.py`` starts the files with the largest budgets first, so that neither of the two
workers is left with a long file at the end.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

#: a file fails the check above FACTOR x its budget + SLACK CPU seconds
FACTOR, SLACK = 2.0, 30.0

# CPU seconds per test file (or notebook), measured 2026-12-07 with the AVX2 kernels (ATEN_CPU_CAPABILITY=avx2,
# ONEDNN_MAX_CPU_ISA=AVX2) on the 2-core development machine, from a complete `make test` of a fresh clone
# on three workers (load average 3.35 median, 6.2 at most, during; 951 CPU s of tests in all; the machine's speed
# moves by a fifth from hour to hour, so a run an hour later may take 1100).
# BEGIN TABLE
BUDGET: dict[str, float] = {
    "tests/test_docs_examples.py": 227,
    "tests/test_benchmarks.py": 92,
    "tests/test_distributed.py": 57,
    "tests/test_ahead.py": 51,
    "tests/test_plugin_dynamicrafter.py": 38,
    "tests/test_pretrain_demo.py": 37,
    "tests/test_widgets_drive_browser.py": 28,
    "tests/test_install.py": 25,
    "tests/test_widgets_lab.py": 24,
    "tests/test_data_lerobot.py": 24,
    "tests/test_compile.py": 21,
    "tests/test_plugin_backbones.py": 21,
    "tests/test_evaluate.py": 20,
    "tests/test_adapters_controlnet_video.py": 18,
    "tests/test_faults.py": 18,
    "tests/test_closed_loop_eval.py": 16,
    "tests/test_docs_site.py": 16,
    "tests/test_plugins_and_fuzz.py": 15,
    "tests/test_inspect_tiny_preview.py": 13,
    "tests/test_widgets_views.py": 13,
    "tests/test_boundary.py": 12,
    "tests/test_rollout_eval.py": 10,
    "tests/test_evaluate_plugins.py": 9,
    "tests/test_adapters_inside.py": 9,
    "tests/test_widgets_browser.py": 8,
    "tests/test_bf16_instruments.py": 8,
    "tests/test_data_metaworld.py": 8,
    "tests/test_latent_cache_plugins.py": 7,
    "tests/test_latent_store.py": 6,
    "tests/test_core_platform.py": 5,
    "tests/test_adapters_inside_wan.py": 5,
    "tests/test_side_trainers.py": 5,
    "tests/test_reliability.py": 5,
    "tests/test_widgets_render.py": 4,
    "tests/test_memory_plan.py": 4,
    "tests/test_metrics_media.py": 4,
    "tests/test_testing_kit.py": 4,
    "tests/test_cli_behaviour.py": 4,
    "tests/test_rollout.py": 4,
    "tests/test_adapters_inside_easyanimate.py": 4,
    "tests/test_tiny_video_autoencoder.py": 3,
    "tests/test_plugin_real_weights.py": 3,
    "tests/test_train.py": 3,
    "tests/test_random_weights.py": 3,
    "tests/test_plugin_dynamicrafter_parity.py": 3,
    "tests/test_inspect_preview.py": 3,
    "tests/test_widgets_logic.py": 2,
    "tests/test_inspect_trajectory.py": 2,
    "tests/test_camera.py": 2,
    "tests/test_registration.py": 2,
    "tests/test_gpu.py": 2,
    "tests/test_config_roundtrip.py": 2,
    "tests/test_private_names.py": 2,
    "tests/test_own_data.py": 2,
    "tests/test_suite_guards.py": 1,
    "tests/test_forked.py": 1,
    "tests/test_loop.py": 1,
    "tests/test_cpu_budget.py": 1,
    "tests/test_policies.py": 1,
    "tests/test_imagination.py": 1,
    "tests/test_context_training.py": 1,
    "tests/test_closed_loop.py": 1,
    "tests/test_loggers.py": 1,
    "tests/test_base_check.py": 1,
    "tests/test_workers.py": 1,
    "tests/test_path_adapter.py": 1,
    "tests/test_plugin_platform.py": 1,
    "tests/test_widgets_drive.py": 1,
    "tests/test_data_scenes.py": 0,
    "tests/test_fit_view_drawing.py": 0,
    "tests/test_drive.py": 0,
    "tests/test_core_composed.py": 0,
    "tests/test_inspect_probes.py": 0,
    "tests/test_notebook_figures.py": 0,
    "tests/test_adapter_latent_residual.py": 0,
    "tests/test_latent_cache.py": 0,
    "tests/test_notebooks_stored.py": 0,
    "tests/test_core_composers.py": 0,
    "tests/test_core_card.py": 0,
    "tests/test_docstrings.py": 0,
    "tests/test_core_conditions.py": 0,
    "tests/test_core_objectives.py": 0,
    "tests/test_public_api.py": 0,
    "tests/test_cli_commands.py": 0,
    "tests/test_project_files.py": 0,
    "tests/test_summary.py": 0,
    "tests/test_troubleshooting_page.py": 0,
}
# END TABLE


# -- the hooks (tests/conftest.py imports them) -------------------------------------------------------------
def _cpu_now() -> float:
    """CPU seconds of this process (all threads), of its children that have been waited for, and of its fork
    server with the workers that server has waited for (workbench.workers: a server this process never waits
    for, so not among its children's)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _fork_server_cpu()


def _fork_server_cpu() -> float:
    """The fork server's CPU seconds and its reaped workers' (``/proc/PID/stat``: utime, stime, cutime,
    cstime); 0 when this process has none, or on a system without ``/proc``."""
    import os
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(ticks) for ticks in fields[11:15]) / os.sysconf("SC_CLK_TCK")


_CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU_START] = _cpu_now()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Setup, call and teardown of ``item`` in CPU seconds, as the property ``test_cpu_seconds`` of its
    teardown report (``--junitxml`` writes it). A notebook's kernel is a child process: its CPU time lands
    on the cell that runs when it is waited for, and the file's sum holds it."""
    yield
    start = item.stash.get(_CPU_START, None)
    if start is not None:
        item.user_properties.append(("test_cpu_seconds", round(_cpu_now() - start, 3)))


# -- the report ------------------------------------------------------------------------------------------
def file_of(case: ET.Element) -> str:
    """The file a JUnit test case belongs to: ``tests/test_x.py`` or ``notebooks/NAME.ipynb``."""
    if case.get("file"):
        return case.get("file")
    classname = case.get("classname", "")
    notebook = re.match(r"(\w+)\.(.+)\.ipynb", classname)  # notebooks.NAME.ipynb -> notebooks/NAME.ipynb
    if notebook:
        return f"{notebook.group(1)}/{notebook.group(2)}.ipynb"
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):  # tests.test_x.TestClass -> tests/test_x.py
        if parts[end - 1].startswith("test_"):
            return "/".join(parts[:end]) + ".py"
    return "/".join(parts) + ".py"


def per_file(junit: Path) -> dict[str, float]:
    """CPU seconds per file from a JUnit report whose test cases carry ``test_cpu_seconds``."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        for prop in case.iter("property"):
            if prop.get("name") == "test_cpu_seconds":
                totals[file_of(case)] += float(prop.get("value"))
    return dict(totals)


def limit(budget: float) -> float:
    return FACTOR * budget + SLACK


def check(measured: dict[str, float], budget: dict[str, float]) -> tuple[list[str], list[str]]:
    """The report's lines (largest first) and the overshoots that fail the run."""
    lines, over = [], []
    width = max([len(f) for f in measured] + [4])
    lines.append(f"{'file'.ljust(width)}  cpu s  budget  verdict")
    for name, seconds in sorted(measured.items(), key=lambda kv: -kv[1]):
        if name in budget:
            allowed = limit(budget[name])
            verdict = "ok" if seconds <= allowed else f"OVER {allowed:.0f} (2 x budget + {SLACK:.0f})"
            lines.append(f"{name.ljust(width)}  {seconds:5.0f}  {budget[name]:6.0f}  {verdict}")
            if seconds > allowed:
                over.append(f"{name}: {seconds:.0f} CPU s, budget {budget[name]:.0f}, allowed {allowed:.0f}")
        else:
            lines.append(f"{name.ljust(width)}  {seconds:5.0f}       -  new: not in the table (--write adds it)")
    gone = sorted(set(budget) - set(measured))
    if gone:
        lines.append(f"in the table, not in this run: {', '.join(gone)}")
    lines.append(f"total {sum(measured.values()):.0f} CPU s over {len(measured)} files "
                 f"(budget {sum(budget.get(f, 0) for f in measured):.0f})")
    return lines, over


def write(measured: dict[str, float], path: Path = Path(__file__)) -> None:
    ranked = sorted(measured.items(), key=lambda kv: -kv[1])
    rows = "".join(f'    "{name}": {seconds:.0f},\n' for name, seconds in ranked)
    text = path.read_text()
    start, end = text.index("BUDGET: dict[str, float] = {\n"), text.index("}\n# END TABLE")
    path.write_text(text[:start] + "BUDGET: dict[str, float] = {\n" + rows + text[end:])


#: make check leaves out any file above this many CPU seconds (the install, benchmark, compile and run tests)
FAST_FILE = 15.0


def fast_files(cpu_seconds: float, budget: dict[str, float] | None = None) -> list[str]:
    """The test modules of the table under ``FAST_FILE`` CPU seconds each, cheapest first, while their budgets
    sum to at most ``cpu_seconds`` (notebooks aside: the inner loop is the unit tests)."""
    chosen, total = [], 0.0
    for name, seconds in sorted((budget or BUDGET).items(), key=lambda kv: (kv[1], kv[0])):
        if not name.startswith("tests/") or seconds > FAST_FILE or total + seconds > cpu_seconds:
            continue
        chosen.append(name)
        total += seconds
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, nargs="?", help="the JUnit XML report of a pytest run (make test writes "
                                                             "one)")
    parser.add_argument("--write", action="store_true", help="replace the checked-in table with this run's numbers")
    parser.add_argument("--fast", type=float, metavar="CPU_S", help="print the cheapest test files of the table "
                        "whose budgets sum to at most CPU_S (make check runs them)")
    args = parser.parse_args(argv)
    if args.fast is not None:
        print(" ".join(fast_files(args.fast)))
        return 0
    if args.junit is None:
        parser.error("give the JUnit report (or --fast CPU_S)")
    if not args.junit.is_file():
        print(f"cpu_budget: no JUnit report at {args.junit}; run pytest with --junitxml={args.junit}", file=sys.stderr)
        return 2
    measured = per_file(args.junit)
    if not measured:
        print(f"cpu_budget: {args.junit} holds no test_cpu_seconds properties (tests/conftest.py adds them)",
              file=sys.stderr)
        return 2
    if args.write:
        write(measured)
        print(f"cpu_budget: wrote {len(measured)} files to {Path(__file__).name}")
        return 0
    lines, over = check(measured, BUDGET)
    print("\n".join(lines))
    if over:
        print("cpu_budget: over budget (a big overshoot, not noise):\n  " + "\n  ".join(over))
        return 1
    print(f"cpu_budget: every file within {FACTOR:g} x its budget + {SLACK:.0f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
