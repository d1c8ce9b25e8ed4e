"""Import boundaries: a light `import workbench`, one-way layers, no plugin imports in the core."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
HEAVY = ("diffusers", "transformers", "ipywidgets", "matplotlib", "h5py", "metaworld", "mujoco", "imageio", "PIL")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
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
    "widgets": {"core", "train", "inspect", "backbones", "adapters", "data", "widgets"},
}
LEAVES = {"errors", "registry", "config", "layers", "metrics", "media", "_lazy"}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_one_way(layer):
    offenders = []
    for path in (PACKAGE / layer).rglob("*.py"):
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] != "workbench" or len(parts) < 2:
                continue
            if parts[1] not in LAYERS[layer] | LEAVES:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_heavy_libraries_are_never_imported_at_module_level():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "widgets" in path.parts:
            continue
        for name in module_level_imports(path):
            if name.split(".")[0] in HEAVY:
                offenders.append(f"{path.relative_to(ROOT)} imports {name} at module level")
    assert offenders == []


VIEW_LIBRARIES = ("ipywidgets", "matplotlib")


def test_only_the_widgets_package_imports_ipywidgets_or_matplotlib():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "widgets" and path.parent.parent == PACKAGE:
            continue
        for name in imported_modules(path):  # anywhere in the file, not only at module level
            if name.split(".")[0] in VIEW_LIBRARIES:
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
              "workbench.adapters.latent_residual", "workbench.backbones.diffusers_bridge", "workbench.testing"}


def test_plugins_use_only_the_public_api():
    offenders = []
    for path in (ROOT / "plugins").rglob("*.py"):
        for name in imported_modules(path):
            if name.split(".")[0] == "workbench" and name not in PLUGIN_API:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []
