"""Griffe extension for the API reference: the docstrings' reStructuredText roles become links.

The docstrings name other objects as ``:class:`Trajectory```, ``:func:`~workbench.inspect.record```,
``:mod:`workbench.widgets.render``` and so on. Each role is resolved the way a reader would: a dotted
name from the top of the package, else relative to the docstring's class, its module and the
modules above it. A name that resolves becomes a cross-reference to that object (a link when the
reference documents it, its name in code otherwise). A name under ``workbench.`` that names nothing
is a warning, which fails the strict build: a stale reference in a docstring is caught like a broken
link. Other names (``torch.Tensor``, a parameter) are shown in code.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
logger = griffe.get_logger("griffe_roles")


def _lookup(collection: griffe.ModulesCollection, path: str) -> griffe.Object | griffe.Alias | None:
    try:
        found = collection[path]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return found


def _candidates(obj: griffe.Object, name: str) -> list[str]:
    out = [name]
    scope: griffe.Object | None = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        out.append(f"{scope.path}.{name}")
        scope = scope.parent
    return out


def _link(obj: griffe.Object, collection: griffe.ModulesCollection, match: re.Match, package: str) -> str:
    target = match["target"].strip()
    short = target.startswith("~")
    name = target.lstrip("~.").removesuffix("()")
    shown = name.rsplit(".", 1)[-1] if short else name
    if match["role"] in ("func", "meth"):
        shown += "()"
    for path in _candidates(obj, name):
        found = _lookup(collection, path)
        if found is not None:
            return (f'<autoref identifier="{html.escape(found.path)}" optional>'
                    f"<code>{html.escape(shown)}</code></autoref>")
    if name.split(".", 1)[0] == package:
        logger.warning("%s: the docstring names %s, which does not exist", obj.path, name)
    return f"<code>{html.escape(shown)}</code>"


class RolesToLinks(griffe.Extension):
    """Rewrites the roles of every docstring of the package once it is loaded.

    Args:
        package: the package whose names must resolve (a stale one is a warning).
    """

    def __init__(self, package: str = "workbench") -> None:
        super().__init__()
        self.package = package

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != self.package:
            return
        collection = loader.modules_collection
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda m, o=obj: _link(o, collection, m, self.package),
                                              obj.docstring.value)
            stack.extend(member for member in obj.members.values() if not member.is_alias)
