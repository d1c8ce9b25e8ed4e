"""Import boundaries: a light `import workbench`, one-way layers, no plugin imports in the core."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
HEAVY = ("diffusers", "transformers", "ipywidgets", "matplotlib", "h5py", "metaworld", "mujoco", "imageio", "PIL")


def _from_import(node: ast.ImportFrom, path: Path) -> set[str]:
    """What ``from M import a, b`` imports: ``M.a`` where ``a`` is a submodule of a package of
    ours, else ``M`` itself (``from workbench import Batch`` runs all of ``workbench/__init__``).
    Relative imports are resolved against ``path``."""
    module = node.module or ""
    if node.level:
        anchor = path.resolve().parent
        for _ in range(node.level - 1):
            anchor = anchor.parent
        prefix = ".".join(anchor.relative_to(ROOT).parts) if anchor.is_relative_to(ROOT) else anchor.name
        module = f"{prefix}.{module}" if module else prefix
    folder = ROOT.joinpath(*module.split("."))
    names = set()
    for alias in node.names:
        sub = folder / alias.name
        names.add(f"{module}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file() else module)
    return names


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    tree = ast.parse(path.read_text() if source is None else source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names |= _from_import(node, path)
    return names


def module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_import_workbench_is_light():
    code = ("import sys, json, workbench; "
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_nothing_in_workbench_imports_a_plugin():
    plugin_roots = {"plugins"} | {p.name for p in (ROOT / "plugins").glob("*") if p.is_dir()}
    plugin_roots |= {f"workbench_{name}" for name in list(plugin_roots)}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for name in imported_modules(path):
            if name.split(".")[0] in plugin_roots:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


LAYERS = {
    # a package may import only the packages listed (plus itself and the leaf modules)
    "core": {"core"},
    "backbones": {"core", "backbones"},
    "adapters": {"core", "adapters"},
    "data": {"core", "data"},
    "inspect": {"core", "inspect", "backbones", "adapters", "data"},
    "train": {"core", "train", "inspect", "backbones", "adapters", "data"},
    "testing": {"core", "testing", "train", "inspect", "backbones", "adapters", "data"},
    "widgets": {"core", "train", "inspect", "backbones", "adapters", "data", "widgets"},
    # the world-model wing stands on the library (and registers its commands through workbench.cli.Command)
    "worldmodel": {"core", "train", "inspect", "backbones", "adapters", "data", "worldmodel", "cli"},
}
LEAVES = {"errors", "registry", "config", "layers", "loop", "metrics", "media", "_lazy", "_version", "integrity",
          "extras", "examples", "workers"}
#: The top-level modules that are not leaves, and what each may reach.
TOP = {"__init__": {"core", "train"}, "__main__": {"cli"},
       "cli": {"core", "train", "inspect", "backbones", "adapters", "data"}}
WING = "worldmodel"


def _layers_reached(name: str) -> set[str]:
    """The packages of workbench an import of ``name`` loads: the named one, or for the top-level
    ``workbench`` itself everything its ``__init__`` imports (the training layer among them)."""
    parts = name.split(".")
    if parts[0] != "workbench":
        return set()
    if len(parts) > 1:
        return {parts[1]}
    return {n.split(".")[1] for n in imported_modules(PACKAGE / "__init__.py") if n.startswith("workbench.")}


def layer_offenders(layer: str, paths, source: str | None = None) -> list[str]:
    offenders = []
    for path in paths:
        for name in sorted(imported_modules(path, source)):
            beyond = _layers_reached(name) - LAYERS[layer] - LEAVES
            if beyond:
                offenders.append(f"{path.relative_to(ROOT)} imports {name} (reaching {', '.join(sorted(beyond))})")
    return offenders


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_one_way(layer):
    assert layer_offenders(layer, (PACKAGE / layer).rglob("*.py")) == []


def test_every_module_of_the_package_is_in_a_layer():
    """A new package or top-level module must be placed in LAYERS, LEAVES or TOP, so the checks see it."""
    known = set(LAYERS) | LEAVES | set(TOP)
    found = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py"}
    assert found - known == set()


@pytest.mark.parametrize("module", sorted(LEAVES | set(TOP)))
def test_top_level_modules_import_one_way(module):
    allowed = TOP.get(module, set())  # a leaf imports only other leaves
    offenders = []
    path = PACKAGE / f"{module}.py"
    for name in sorted(imported_modules(path)):
        beyond = _layers_reached(name) - allowed - LEAVES
        if beyond:
            offenders.append(f"{path.relative_to(ROOT)} imports {name} (reaching {', '.join(sorted(beyond))})")
    assert offenders == []


def test_the_library_never_imports_the_wing():
    """Nothing outside workbench/worldmodel imports it, in any form (a string handed to importlib included)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if WING in path.relative_to(PACKAGE).parts:
            continue
        names = imported_modules(path)
        tree = ast.parse(path.read_text())
        names |= {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")}
        offenders += [f"{path.relative_to(ROOT)} imports {n}" for n in sorted(names)
                      if n == f"workbench.{WING}" or n.startswith(f"workbench.{WING}.")]
    assert offenders == []


def test_no_library_layer_imports_the_top_level_package():
    """``workbench/__init__`` imports the training layer, so ``from workbench import X`` inside the library runs back
    up the layers (and from ``train`` into a package still initialising): import X from the module defining it."""
    probe = PACKAGE / "train" / "probe.py"  # parsed from `source`, never written
    assert "workbench" in imported_modules(probe, "from workbench import Batch")
    assert "workbench" not in imported_modules(probe, "from workbench import extras")  # (a leaf module)
    offenders = [str(path.relative_to(ROOT)) for layer in sorted(set(LAYERS) - {WING})
                 for path in sorted((PACKAGE / layer).rglob("*.py")) if "workbench" in imported_modules(path)]
    assert offenders == []


def test_the_circle_check_finds_a_circle_however_long():
    assert import_circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_training_layer_has_no_import_circle():
    """Each module of ``train`` builds on the ones below it: the step-ahead base stands on the experiment, the
    experiment on its data feed, hooks and checkpoints, and none of them imports back."""
    assert "workbench.train.experiment" in import_graph()["workbench.train.ahead"]  # (function-level imports seen)
    assert [c for c in package_circles() if any(m.startswith("workbench.train.") for m in c)] == []


def test_the_library_has_no_import_circle():
    """No two modules of workbench (the wing included) import each other, directly or round a longer loop."""
    assert package_circles() == []


def test_the_wing_check_catches_an_import():
    probe = PACKAGE / "inspect" / "probe.py"  # parsed from `source`, never written
    for line in ("from workbench.worldmodel.probe import HandProbe", "import workbench.worldmodel",
                 "from workbench import worldmodel"):
        assert imported_modules(probe, line) & {"workbench.worldmodel", "workbench.worldmodel.probe"}, line


@pytest.mark.parametrize("line, reaches", [
    ("from workbench import Batch", "train"),  # the top-level package loads the training layer
    ("import workbench", "train"),
    ("from workbench.train import AdapterExperiment", "train"),
    ("from workbench.inspect.recording.trajectory import record", "inspect"),
    ("from workbench import inspect", "inspect"),
    ("from .. import train", "train"),
    ("from ..widgets.fit import Fit", "widgets"),
])
def test_the_layer_check_catches_every_import_form(line, reaches):
    probe = PACKAGE / "backbones" / "probe.py"  # parsed from `source`, never written
    offenders = layer_offenders("backbones", [probe], source=line)
    assert len(offenders) == 1 and offenders[0].endswith(f"(reaching {reaches})"), offenders
    assert layer_offenders("backbones", [probe], source="from workbench.core import Batch") == []


# -- import circles --------------------------------------------------------------------------
def import_graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module → the modules of workbench it imports, in any form (inside a function, under TYPE_CHECKING);
    ``sources`` replaces or adds modules by name, for the check's own test."""
    paths = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph = {}
    for module in sorted(set(paths) | set(sources or {})):
        source = (sources or {}).get(module)
        found = imported_modules(paths.get(module, PACKAGE / "probe.py"), source)
        targets = set()
        for name in found:
            parts = name.split(".")
            while parts and ".".join(parts) not in paths and ".".join(parts) not in (sources or {}):
                parts.pop()
            if parts and ".".join(parts) != module:
                targets.add(".".join(parts))
        graph[module] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (strongly connected components of
    more than one module, Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


@functools.cache
def package_circles() -> list[list[str]]:
    return import_circles(import_graph())


@pytest.mark.parametrize("package", ["core", "backbones"])
def test_no_module_of_the_contract_or_the_backbones_is_in_an_import_circle(package):
    """A module that imports another which imports it back (even only for type checking) cannot be read, tested or
    moved alone: the diffusers bridge and its injection share what they need through the injection's public types."""
    circles = [c for c in package_circles() if any(m.startswith(f"workbench.{package}.") for m in c)]
    assert circles == []


def test_the_circle_check_finds_a_circle_through_a_type_checking_import():
    graph = import_graph({"workbench.backbones.diffusers_injection": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from workbench.backbones.diffusers_bridge import DiffusersBackbone\n")})
    assert ["workbench.backbones.diffusers_bridge", "workbench.backbones.diffusers_injection"] in import_circles(graph)


def test_heavy_libraries_are_never_imported_at_module_level():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "widgets" in path.parts:
            continue
        for name in module_level_imports(path):
            if name.split(".")[0] in HEAVY:
                offenders.append(f"{path.relative_to(ROOT)} imports {name} at module level")
    assert offenders == []


VIEW_LIBRARIES = ("ipywidgets", "matplotlib", "anywidget")
# The demo's report (a command's output files, not a library layer) draws loss.png with matplotlib's
# object API inside one function, and `workbench eval --rollout` its drift.png; they may, and only what they
# import there.
REPORT_IMPORTS = {"workbench/worldmodel/demo.py": {"matplotlib.figure"},
                  "workbench/worldmodel/rollout_eval.py": {"matplotlib.figure"}}  # the rollout drift plot


def test_only_the_widgets_package_imports_ipywidgets_or_matplotlib():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "widgets" and path.parent.parent == PACKAGE:
            continue
        allowed = REPORT_IMPORTS.get(str(path.relative_to(ROOT)), set())
        for name in imported_modules(path):  # anywhere in the file, not only at module level
            if name.split(".")[0] in VIEW_LIBRARIES and name not in allowed:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_nothing_imports_the_widgets_package():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "widgets" in path.relative_to(PACKAGE).parts:
            continue
        for name in imported_modules(path):
            if name == "workbench.widgets" or name.startswith("workbench.widgets."):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


# -- backbone plugins: public API only -------------------------------------------------------
PLUGIN_API = {"workbench", "workbench.config", "workbench.errors", "workbench.inspect", "workbench.registry",
              "workbench.adapters.latent_residual", "workbench.core.capabilities",
              "workbench.backbones.diffusers_bridge", "workbench.testing",
              "workbench.backbones.random_weights"}  # real architectures with random weights, for any backbone


def test_plugins_use_only_the_public_api():
    offenders = []
    for path in (ROOT / "plugins").rglob("*.py"):
        for name in imported_modules(path):
            if name.split(".")[0] == "workbench" and name not in PLUGIN_API:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []
