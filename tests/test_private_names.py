"""No package reads another package's private names.

A name with a leading underscore is private to the package that defines it: each package of the library
(``workbench.core``, ``workbench.inspect``, ..., each top-level module its own), the world-model wing
(``workbench.worldmodel``, a study on the library's public surface) and each plugin under ``plugins/``. A
private module right under ``workbench`` (``workbench._version``) is private to the library, the wing and
the plugins excluded. Read from the source, no imports: every ``from M import _name`` and ``import M._name``
of a module of ours, every attribute ``x._name`` (read or written) and every ``getattr(x, "_name")`` /
``hasattr`` / ``setattr`` / ``delattr`` of a private name that another of our packages defines and this one
does not. Dunder names (``__name__``) are no one's private; a private name our code nowhere defines
(``torch._C``, a simulator's own) is a third party's, not ours.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCESSORS = ("getattr", "hasattr", "setattr", "delattr")
LIBRARY = "the library"  # who may import a private module right under workbench
WING = "workbench.worldmodel"

#: Private names of a third party that a package of ours also defines, to be called as the third party calls
#: it: reading or writing one elsewhere is a use of that party's interface, not of our package's.
THIRD_PARTY = {
    "_gradient_checkpointing_func": "diffusers' ModelMixin (the DynamiCrafter UNet calls it as diffusers does)",
}

def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(path: Path) -> str:
    """The package a file belongs to: ``workbench.<subpackage>``, ``workbench.<module>`` for a top-level
    module, ``workbench`` for its ``__init__``, ``plugins.<name>`` for anything of a plugin."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] == "plugins":
        return f"plugins.{parts[1]}"
    return "workbench" if parts[1:] == ("__init__",) else f"workbench.{parts[1]}"


def module_package(module: str) -> str | None:
    """The package of a module of ours (``workbench.inspect.drive`` -> ``workbench.inspect``;
    ``workbench_wan22.backbone`` -> ``plugins.wan22``), or None for a module not ours."""
    parts = module.split(".")
    if parts[0] == "workbench":
        return "workbench" if len(parts) == 1 else f"workbench.{parts[1]}"
    if parts[0].startswith("workbench_") and (ROOT / "plugins" / parts[0].removeprefix("workbench_")).is_dir():
        return f"plugins.{parts[0].removeprefix('workbench_')}"
    return None


def module_owner(module: str) -> str | None:
    """Who may import ``module`` when a part of its path is private: the package holding it (the library for
    one right under ``workbench``); None when no part is private or the module is not ours."""
    if module_package(module) is None:
        return None
    parts = module.split(".")
    for i, part in enumerate(parts):
        if is_private(part):
            container = ".".join(parts[:i])
            return LIBRARY if container == "workbench" else module_package(container)
    return None


def may_import(owner: str, here: str) -> bool:
    return owner == here or (owner == LIBRARY and here.startswith("workbench") and here != WING)


def absolute(node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    base = path.relative_to(ROOT).with_suffix("").parts
    if base[0] == "plugins":
        base = base[2:]
    anchor = list(base[:len(base) - node.level])
    return ".".join([*anchor, *([node.module] if node.module else [])])


def on_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def definitions(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, assigned names, attributes of ``self`` / ``cls``
    (assigned, or set with ``setattr`` / ``object.__setattr__``). A private attribute written on another object
    defines nothing: it is a write of someone else's name."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and on_self(node.value):
            out.add(node.attr)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and on_self(node.args[0]):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in ("setattr", "__setattr__") and isinstance(node.args[1], ast.Constant):
                out.add(str(node.args[1].value))
    return {name for name in out if is_private(name)}


def scan(sources: dict[Path, str]) -> list[str]:
    """Every read of another package's private name in ``sources`` (path -> text): ``path:line: what (whose)``."""
    trees = {path: ast.parse(text, str(path)) for path, text in sources.items()}
    defined: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        defined[package_of(path)] |= definitions(tree)
    owners: dict[str, set[str]] = defaultdict(set)  # private name -> the packages defining it
    for package, names in defined.items():
        for name in names:
            owners[name].add(package)
    found = []
    for path, tree in trees.items():
        here, where = package_of(path), path.relative_to(ROOT)
        foreign = {name: ", ".join(sorted(packages)) for name, packages in owners.items()
                   if name not in defined[here] and name not in THIRD_PARTY}
        for node in ast.walk(tree):
            if isinstance(node, (ast.ImportFrom, ast.Import, ast.Attribute, ast.Call)):
                found += [(str(where), node.lineno, what) for what in _reads(node, path, here, foreign)]
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def _reads(node: ast.AST, path: Path, here: str, foreign: dict[str, str]) -> list[str]:
    """What ``node`` reads of another package's privates; ``foreign``: such a name -> the packages defining it."""
    out = []
    if isinstance(node, ast.ImportFrom):
        module = absolute(node, path)
        package = module_package(module)
        owner = module_owner(module)
        if owner is not None and not may_import(owner, here):
            out.append(f"from {module} import ... (a private module of {owner})")
        if package is not None and package != here:
            out += [f"from {module} import {a.name} (private to {package})" for a in node.names if is_private(a.name)]
    elif isinstance(node, ast.Import):
        for alias in node.names:
            owner = module_owner(alias.name)
            if owner is not None and not may_import(owner, here):
                out.append(f"import {alias.name} (a private module of {owner})")
    elif isinstance(node, ast.Attribute) and node.attr in foreign:
        verb = "reads" if isinstance(node.ctx, ast.Load) else "writes"
        out.append(f"{verb} {ast.unparse(node)} (private to {foreign[node.attr]})")
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
          and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
          and node.args[1].value in foreign):
        out.append(f"{ast.unparse(node)} (private to {foreign[node.args[1].value]})")
    return out


def private_reads() -> list[str]:
    paths = [p for source in (ROOT / "workbench", ROOT / "plugins") for p in sorted(source.rglob("*.py"))]
    return scan({path: path.read_text() for path in paths})


def test_no_package_reads_another_packages_private_names():
    found = private_reads()
    assert found == [], (
        f"{len(found)} read(s) of another package's private names: give each a public name in the package that "
        f"defines it (or stop needing it):\n  " + "\n  ".join(found))


def test_the_scan_finds_each_kind_of_read_and_lets_a_package_read_its_own():
    lib = ROOT / "workbench"
    sources = {
        lib / "data" / "clips.py": "class Clips:\n    def _handle(self): ...\n\ndef _helper(): ...\n",
        lib / "data" / "more.py": "def f(c):\n    return c._handle(), getattr(c, '_handle')\n",  # its own package
        lib / "train" / "experiment.py": "class Exp:\n    def __init__(self):\n        self._config = 1\n",
        lib / "inspect" / "view.py": "from workbench._version import __version__\n",  # the library's own module
        lib / "worldmodel" / "probe.py": (
            "from workbench._lazy import lazy_exports\n"
            "from workbench.data.clips import _helper\n"
            "def g(clips, exp, env):\n"
            "    clips._handle()\n"
            "    exp._config = getattr(exp, '_config', None)\n"
            "    env._freeze_rand_vec = True\n"  # a third party's private: ours nowhere defines it
            "    return clips.__dict__, hasattr(exp, '_config')\n"),
    }
    assert [f.split(": ", 1)[1] for f in scan(sources)] == [
        "from workbench._lazy import ... (a private module of the library)",
        "from workbench.data.clips import _helper (private to workbench.data)",
        "reads clips._handle (private to workbench.data)",
        "getattr(exp, '_config', None) (private to workbench.train)",
        "writes exp._config (private to workbench.train)",
        "hasattr(exp, '_config') (private to workbench.train)",
    ]
