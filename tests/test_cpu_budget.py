"""The per-file CPU budget (tests/cpu_budget.py): its sums, its verdicts, and the hook that records the seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cpu_budget
import pytest

HERE = Path(__file__).resolve().parent


def junit(path: Path, cases: list[tuple[str, str, float]]) -> Path:
    rows = "".join(f'<testcase classname="{c}" name="{n}" time="9"><properties><property name="test_cpu_seconds" '
                   f'value="{s}" /><property name="other" value="5" /></properties></testcase>' for c, n, s in cases)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{rows}'
                    f'<testcase classname="tests.test_none" name="t" time="1" /></testsuite></testsuites>')
    return path


def test_the_seconds_are_summed_per_file_test_modules_classes_and_notebooks(tmp_path):
    report = junit(tmp_path / "j.xml", [("tests.test_a", "t1", 1.5), ("tests.test_a.TestGroup", "t2", 2.25),
                                        ("tests.test_b", "t", 4.0), ("notebooks.08_adapters_inside.ipynb", "Cell 0", 3),
                                        ("notebooks.08_adapters_inside.ipynb", "Cell 2", 7.5)])
    assert cpu_budget.per_file(report) == {"tests/test_a.py": 3.75, "tests/test_b.py": 4.0,
                                           "notebooks/08_adapters_inside.ipynb": 10.5}


def test_only_a_big_overshoot_fails_and_everything_is_reported():
    budget = {"tests/test_a.py": 100, "tests/test_b.py": 10, "tests/test_gone.py": 5}
    lines, over = cpu_budget.check({"tests/test_a.py": 229, "tests/test_b.py": 51, "tests/test_new.py": 59}, budget)
    assert over == ["tests/test_b.py: 51 CPU s, budget 10, allowed 50"]  # 2 x 10 + 30; test_a's 229 <= 230 passes
    assert lines[1].split() == ["tests/test_a.py", "229", "100", "ok"]  # the largest first
    assert lines[2].split()[:2] == ["tests/test_new.py", "59"] and "new: not in the table" in lines[2]
    assert "OVER 50 (2 x budget + 30)" in lines[3]
    assert "in the table, not in this run: tests/test_gone.py" in lines
    _, over = cpu_budget.check({"tests/test_new.py": 600}, budget)
    assert over == []  # reported, not judged: --write adds it


def test_the_command_reports_exits_1_on_an_overshoot_and_writes_the_table(tmp_path, monkeypatch):
    report = junit(tmp_path / "j.xml", [("tests.test_a", "t", 500.0)])
    monkeypatch.setattr(cpu_budget, "BUDGET", {"tests/test_a.py": 100})
    assert cpu_budget.main([str(report)]) == 1
    monkeypatch.setattr(cpu_budget, "BUDGET", {"tests/test_a.py": 300})
    assert cpu_budget.main([str(report)]) == 0
    assert cpu_budget.main([str(tmp_path / "none.xml")]) == 2
    copy = tmp_path / "cpu_budget.py"
    copy.write_text(Path(cpu_budget.__file__).read_text())
    cpu_budget.write({"tests/test_a.py": 12.4, "notebooks/x.ipynb": 40.6}, copy)
    table = copy.read_text().split("# BEGIN TABLE\n")[1].split("# END TABLE")[0]
    assert table == 'BUDGET: dict[str, float] = {\n    "notebooks/x.ipynb": 41,\n    "tests/test_a.py": 12,\n}\n'


def test_the_checked_in_table_lists_files_and_orders_the_suite():
    assert cpu_budget.BUDGET, "the table is empty: regenerate it with --write from a make test run"
    assert all(name.startswith(("tests/test_", "notebooks/")) for name in cpu_budget.BUDGET)
    import conftest

    biggest = max(cpu_budget.BUDGET, key=cpu_budget.BUDGET.get)
    ranks = [conftest._start_rank(HERE.parent / name) for name in cpu_budget.BUDGET]
    assert conftest._start_rank(HERE.parent / biggest) == min(ranks)


@pytest.mark.parametrize("spin", [0.3])
def test_each_test_carries_its_cpu_seconds_into_the_junit_report(tmp_path, spin):
    test = tmp_path / "test_spin.py"
    test.write_text("import subprocess, sys, time\n"
                    "def test_spin():\n"
                    f"    end = time.process_time() + {spin}\n"
                    "    while time.process_time() < end: pass\n"
                    f"    subprocess.run([sys.executable, '-c', 'import time\\nend = time.process_time() + {spin}\\n"
                    "while time.process_time() < end: pass'], check=True)\n")
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                                          "from cpu_budget import pytest_runtest_protocol, pytest_runtest_teardown\n")
    report = tmp_path / "j.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           f"--junitxml={report}", str(test)], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    seconds = cpu_budget.per_file(report)
    assert list(seconds) == ["test_spin.py"] and 2 * spin <= seconds["test_spin.py"] < 2 * spin + 5, seconds


def test_make_check_takes_the_cheapest_unit_test_files_within_its_cpu_seconds(capsys):
    budget = {"tests/test_a.py": 50, "tests/test_b.py": 5, "notebooks/01.ipynb": 1, "tests/test_c.py": 12,
              "tests/test_d.py": 5, "tests/test_install.py": 16}
    assert cpu_budget.fast_files(400, budget) == ["tests/test_b.py", "tests/test_d.py", "tests/test_c.py"]
    assert cpu_budget.fast_files(20, budget) == ["tests/test_b.py", "tests/test_d.py"]
    assert cpu_budget.main(["--fast", "100"]) == 0
    assert capsys.readouterr().out == " ".join(cpu_budget.fast_files(100)) + "\n"
