"""The ``workbench`` command finds the commands other packages register (the world-model wing's among
them) through the ``workbench.commands`` entry-point group, and refuses a broken or clashing one."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from workbench import cli
from workbench.cli import COMMANDS, Command, main, registered_commands

HELLO = Command("hello", "say hello", lambda p: p.add_argument("--name", default="world"),
                lambda args: print(f"hello {args.name}") or 0)
NOT_A_COMMAND = object()
TRAIN_AGAIN = Command("train", "another train", lambda p: None, lambda args: 0)


def _fake_entry_points(monkeypatch, targets: dict[str, str]):
    eps = [md.EntryPoint(name=n, value=v, group=COMMANDS) for n, v in targets.items()]
    real = md.entry_points
    monkeypatch.setattr(cli.md, "entry_points", lambda group=None, **kw: eps if group == COMMANDS else real(
        group=group, **kw))


def test_the_wing_commands_are_found_through_entry_points():
    assert [c.name for c in registered_commands()] == ["data", "demo", "eval", "pretrain", "probe"]


def test_a_registered_command_runs(monkeypatch, capsys):
    _fake_entry_points(monkeypatch, {"hello": "tests.test_cli_commands:HELLO"})
    assert main(["hello", "--name", "plugin"]) == 0
    assert capsys.readouterr().out == "hello plugin\n"


@pytest.mark.parametrize("targets, message", [
    ({"train": "tests.test_cli_commands:TRAIN_AGAIN"},
     "Two packages register the command 'train': tests.test_cli_commands:TRAIN_AGAIN and workbench itself"),
    ({"hello": "tests.test_cli_commands:NOT_A_COMMAND"},
     "entry point 'hello' = 'tests.test_cli_commands:NOT_A_COMMAND' must name a workbench.cli.Command"),
    ({"hi": "tests.test_cli_commands:HELLO"}, "must name a workbench.cli.Command called 'hi'"),
])
def test_a_broken_registration_is_refused_with_the_fix(monkeypatch, capsys, targets, message):
    _fake_entry_points(monkeypatch, targets)
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
