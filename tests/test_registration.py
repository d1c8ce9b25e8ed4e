"""Registration has one truth: every ``@register(kind, name)`` in workbench/ and plugins/ is declared
as an entry point in its distribution's pyproject.toml (same group, name and object), and every
declared entry point names a class its module defines — registered too, in a distribution that
registers in process — so a name resolves the same whether or not its module was imported first.
Read from the source (no imports: the plugins' modules load diffusers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

from workbench.cli import COMMANDS
from workbench.registry import KINDS

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {  # pyproject.toml → the package folders it ships
    ROOT / "pyproject.toml": [ROOT / "workbench"],
    **{p / "pyproject.toml": [d for d in p.iterdir() if d.name.startswith("workbench_")]
       for p in sorted((ROOT / "plugins").iterdir()) if (p / "pyproject.toml").exists()},
}


def _module(path: Path, package_root: Path) -> str:
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def registrations(package: Path) -> dict[tuple[str, str], str]:
    """``{(group, name): "module:Class"}`` for every ``@register("kind", "name")`` under ``package``."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "register":
                    kind, name = (ast.literal_eval(a) for a in deco.args[:2])
                    key = (KINDS[kind], name)
                    assert key not in found, f"{name!r} is registered twice as a {kind}: {found[key]} and {path}"
                    found[key] = f"{_module(path, package)}:{node.name}"
    return found


def entry_points(pyproject: Path) -> dict[tuple[str, str], str]:
    groups = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {})
    return {(group, name): target for group, names in groups.items() if group in KINDS.values()
            for name, target in names.items()}


def command_entry_points(pyproject: Path) -> dict[str, str]:
    return tomllib.loads(pyproject.read_text())["project"].get("entry-points", {}).get(COMMANDS, {})


@pytest.mark.parametrize("pyproject", list(DISTRIBUTIONS), ids=lambda p: str(p.parent.relative_to(ROOT)) or "root")
def test_every_registration_has_its_entry_point_and_back(pyproject):
    registered: dict[tuple[str, str], str] = {}
    for package in DISTRIBUTIONS[pyproject]:
        registered.update(registrations(package))
    declared = entry_points(pyproject)
    assert declared, f"{pyproject} declares no workbench entry point"
    missing = {k: v for k, v in registered.items() if declared.get(k) != v}
    assert not missing, (f"@register without a matching entry point in {pyproject}: add "
                         + ", ".join(f'[project.entry-points."{g}"] {n} = "{t}"' for (g, n), t in missing.items()))
    if registered:  # a distribution that registers in process registers everything it declares
        stray = {k: v for k, v in declared.items() if k not in registered}
        assert not stray, f"entry points in {pyproject} that no @register declares: {stray}"
    root = pyproject.parent
    for (group, name), target in declared.items():
        module, cls = target.split(":")
        path = root / Path(*module.split(".")).with_suffix(".py")
        classes = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}
        assert cls in classes, f"entry point {group} {name} = {target!r}: {path} defines no class {cls}"


def test_the_scan_sees_what_the_decorator_registers():
    found = registrations(ROOT / "workbench")
    assert found[("workbench.backbones", "tiny_video")] == "workbench.backbones.tiny_video:TinyVideo"
    assert found[("workbench.composers", "noise_gated")] == "workbench.core.composers:NoiseGated"
    assert len({g for g, _ in found}) == len(KINDS)  # every kind has a built-in


@pytest.mark.parametrize("pyproject", list(DISTRIBUTIONS), ids=lambda p: str(p.parent.relative_to(ROOT)) or "root")
def test_every_command_entry_point_names_a_command_of_that_name(pyproject):
    for name, target in command_entry_points(pyproject).items():
        module, attr = target.split(":")
        path = pyproject.parent / Path(*module.split(".")).with_suffix(".py")
        made = {t.id: node.value for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
        call = made.get(attr)
        assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Command", \
            f"{COMMANDS} {name} = {target!r}: {path} assigns no Command to {attr}"
        assert ast.literal_eval(call.args[0]) == name, f"{target} is Command({ast.unparse(call.args[0])}), not {name!r}"


def test_the_wing_registers_its_commands():
    assert set(command_entry_points(ROOT / "pyproject.toml")) == {"data", "demo", "eval", "pretrain", "probe"}
