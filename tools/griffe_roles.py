"""Griffe extension for the API reference: the docstrings' roles become links; a summary is a whole sentence.

The docstrings name other objects as ``:class:`Trajectory```, ``:func:`~workbench.inspect.record```,
``:mod:`workbench.widgets.render``` and so on. Each role is resolved the way a reader would: a dotted
name from the top of the package, else relative to the docstring's class, its module and the
modules above it. A name that resolves becomes a cross-reference to that object (a link when the
reference documents it, its name in code otherwise). A name under ``workbench.`` that names nothing
is a warning, which fails the strict build: a stale reference in a docstring is caught like a broken
link. Other names (``torch.Tensor``, a parameter) are shown in code.

The reference's summary tables show a docstring's first line. A first sentence that runs onto the next
lines would be cut mid-sentence there, so the lines of the first sentence are joined into the first line
(:func:`whole_first_sentence`); Markdown renders the paragraph the same either way.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

# A full stop, question or exclamation mark that ends a sentence (not the one inside "e.g." or "i.e.").
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)[.!?](?=\s|$)|:$")
SECTION = re.compile(r"\s*[A-Z][A-Za-z ]*:\s*$")  # a Google-style section title ("Examples:", "Args:")
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


def whole_first_sentence(text: str) -> str:
    """``text`` with the lines of its first sentence joined into its first line (within the first paragraph)."""
    lines = text.split("\n")
    first, rest = lines[0].rstrip(), lines[1:]
    while rest and rest[0].strip() and not SENTENCE_END.search(first) and not SECTION.match(rest[0]):
        first = f"{first} {rest.pop(0).strip()}"
    return "\n".join([first, *rest])


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
            if obj.docstring is not None:
                obj.docstring.value = whole_first_sentence(obj.docstring.value)
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda m, o=obj: _link(o, collection, m, self.package),
                                              obj.docstring.value)
            stack.extend(member for member in obj.members.values() if not member.is_alias)
