"""The public API documents what it takes and gives: each public callable's docstring has a Google-style
``Args:`` entry for every parameter of its signature (a class: of its constructor; a dataclass may list its fields
under ``Attributes:``), and a function that returns something has a ``Returns:`` (or ``Yields:``) section. The
sections are parsed by griffe with the Google parser, as the API reference (mkdocstrings) renders them.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import re
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="the docs extra brings griffe (make install)")

ROOT = Path(__file__).resolve().parents[1]
# The packages whose ``__all__`` is the public API.
PACKAGES = ("workbench", "workbench.core", "workbench.inspect", "workbench.train", "workbench.testing",
            "workbench.data", "workbench.worldmodel", "workbench.widgets")


def public_callables() -> dict[str, object]:
    """``{"package.Name": object}`` for every function and class a package's ``__all__`` names, each once (under
    the first package that exports it)."""
    found: dict[str, object] = {}
    seen: set[int] = set()
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and id(obj) not in seen:
                seen.add(id(obj))
                found[f"{package}.{name}"] = obj
    return found


def sections(docstring: str | None) -> list:
    # griffe warns about every parameter without a type: the types live in the signatures, which it is not given
    logger = logging.getLogger("griffe")
    level, logger.level = logger.level, logging.ERROR
    try:
        return griffe.Docstring(inspect.cleandoc(docstring or ""), parser="google").parse()
    finally:
        logger.level = level


def _names(parsed: list, kinds: tuple[str, ...]) -> set[str]:
    return {item.name.lstrip("*") for section in parsed if section.kind.value in kinds for item in section.value}


def problems(obj) -> list[str]:
    """What ``obj``'s docstring leaves undocumented: each parameter missing from its Args (for a class, those of
    its constructor; a dataclass may use Attributes), and a missing Returns for a function that returns a value.
    ``*args`` / ``**kwargs`` count as documented when the docstring names them anywhere."""
    if inspect.isclass(obj):
        docstring = "\n\n".join(filter(None, [inspect.getdoc(obj), obj.__dict__.get("__init__") and
                                              inspect.getdoc(obj.__init__)]))
        target = obj.__init__
        kinds = ("parameters", "attributes") if dataclasses.is_dataclass(obj) else ("parameters",)
    else:
        docstring, target, kinds = inspect.getdoc(obj) or "", obj, ("parameters",)
    parsed = sections(docstring)
    documented = _names(parsed, kinds)
    out = []
    if not inspect.isfunction(target) or target.__module__.split(".")[0] != obj.__module__.split(".")[0]:
        return out  # a constructor of another library (object's, torch's, an exception's) is documented there
    signature = inspect.signature(target)
    for i, (name, parameter) in enumerate(signature.parameters.items()):
        if inspect.isclass(obj) and i == 0:
            continue  # self
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            if name not in documented and not re.search(rf"\*{{1,2}}{name}\b|``{name}``|`{name}`", docstring):
                out.append(f"*{name}" if parameter.kind is parameter.VAR_POSITIONAL else f"**{name}")
        elif name not in documented:
            out.append(name)
    if not inspect.isclass(obj):
        returns = signature.return_annotation
        gives = returns is not inspect.Signature.empty and returns not in ("None", None, "NoReturn")
        if gives and not any(s.kind.value in ("returns", "yields") for s in parsed):
            out.append("Returns")
    return out


def undocumented() -> dict[str, list[str]]:
    return {name: missing for name, obj in public_callables().items() if (missing := problems(obj))}


def test_every_public_callable_documents_its_parameters_and_what_it_returns():
    assert len(public_callables()) > 100  # the packages' __all__s were read, not an empty list
    assert undocumented() == {}


# -- the check itself can fail -----------------------------------------------------------------------------------
def _documented(frames: int, *, size: int = 64, **options) -> str:
    """Made up for the test.

    Args:
        frames: How many.
        size: Pixels.
        **options: Passed on.

    Returns:
        A word.
    """


def _one_missing(frames: int, size: int = 64) -> str:
    """Made up for the test.

    Args:
        frames: How many.

    Returns:
        A word.
    """


def _prose_only(frames: int, *rest) -> str:
    """Made up for the test: ``frames`` is how many, and the rest is ignored."""


class _Made:
    """Made up for the test.

    Args:
        width: Channels.
    """

    def __init__(self, width: int, depth: int = 1):
        pass


@dataclasses.dataclass
class _Fields:
    """Made up for the test.

    Attributes:
        steps: How many.
    """

    steps: int = 1
    seed: int = 0


@pytest.mark.parametrize(("obj", "missing"), [
    (_documented, []),
    (_one_missing, ["size"]),
    (_prose_only, ["frames", "*rest", "Returns"]),  # prose is not a section mkdocstrings renders
    (_Made, ["depth"]),
    (_Fields, ["seed"]),
])
def test_the_check_finds_what_a_made_up_docstring_leaves_out(obj, missing):
    assert problems(obj) == missing


def test_no_docstring_uses_a_restructuredtext_literal_block():
    # "Example::" or "made with::" is reStructuredText: the Markdown the reference renders shows the colons
    # and an unhighlighted block. A fenced block (```python, ```bash, ...) renders as code.
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("workbench", "plugins") for path in
             sorted((ROOT / folder).rglob("*.py")) for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"::\s*$", line) and not line.lstrip().startswith("#")]
    assert found == []
