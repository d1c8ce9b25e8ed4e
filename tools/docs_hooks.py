"""MkDocs hook: a navigation entry with a ``*`` lists the pages of a folder that the navigation does not name.

In mkdocs.yml, ``- guides/*.md`` inside a section stands for every ``guides/*.md`` page not named anywhere
else in ``nav``, in file-name order, each titled by its first heading. A page added to a folder is thus
in the navigation without an edit to mkdocs.yml; naming it in ``nav`` gives it a place of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _named(nav: list) -> set[str]:
    """Every page path ``nav`` names (globs excluded)."""
    out: set[str] = set()
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            out |= _named(value)
        elif isinstance(value, str) and "*" not in value:
            out.add(value)
    return out


def _expanded(nav: list, docs: Path, named: set[str]) -> list:
    out: list = []
    for item in nav:
        if isinstance(item, dict):
            (title, value), = item.items()
            out.append({title: _expanded(value, docs, named) if isinstance(value, list) else value})
        elif isinstance(item, str) and "*" in item:
            out.extend(path for path in sorted(p.relative_to(docs).as_posix() for p in docs.glob(item))
                       if path not in named)
        else:
            out.append(item)
    return out


def on_config(config: Any, **kwargs: Any) -> Any:
    if config.nav:
        config.nav = _expanded(config.nav, Path(config.docs_dir), _named(config.nav))
    return config
