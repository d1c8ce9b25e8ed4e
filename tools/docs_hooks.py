"""MkDocs hooks: the navigation's ``*`` entries, the version in the site's name, notebook headings' search
titles, and a warning for a link to an anchor a page lacks.

In mkdocs.yml, ``- guides/*.md`` inside a section stands for every ``guides/*.md`` page not named anywhere
else in ``nav``, in file-name order, each titled by its first heading. A page added to a folder is thus
in the navigation without an edit to mkdocs.yml; naming it in ``nav`` gives it a place of its own.

MkDocs checks the anchors of links written in Markdown, not those of a page rendered by a plugin: a
notebook's contents list (mkdocs-jupyter makes it from the headings with other rules than the heading
ids) could point nowhere. :func:`on_post_page` checks every ``href="#..."`` of every built page against
the page's ids, and a missing one is a warning, which ``mkdocs build --strict`` turns into a failure.

The site says which version it documents: :func:`on_config` appends ``workbench.__version__`` (read from
``workbench/_version.py``, not imported) to ``site_name``, which the header and every page's title show.
"""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.anchors")


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


#: Where pages are edited, relative to ``repo_url``, when the environment names a repository but no ``edit_uri``.
EDIT_URI = "edit/main/docs/"
VERSION_FILE = Path(__file__).resolve().parents[1] / "workbench" / "_version.py"


def documented_version(path: Path = VERSION_FILE) -> str:
    """The ``__version__`` that ``path`` assigns, read as text (the docs build need not import workbench)."""
    match = re.search(r'^__version__ = "([^"]+)"$', path.read_text(), re.M)
    if match is None:
        raise ValueError(f"{path}: no line __version__ = \"...\"")
    return match.group(1)


def on_config(config: Any, **kwargs: Any) -> Any:
    if getattr(config, "site_name", None):
        config.site_name = f"{config.site_name} {documented_version()}"
    if getattr(config, "repo_url", None) and not getattr(config, "edit_uri", None):
        config.edit_uri = EDIT_URI
    if config.nav:
        config.nav = _expanded(config.nav, Path(config.docs_dir), _named(config.nav))
    return config


def missing_anchors(page_html: str) -> list[str]:
    """The same-page anchors ``page_html`` links to (``href="#x"``) that no element's ``id`` or ``name`` holds."""
    ids = {html.unescape(i) for i in re.findall(r'\b(?:id|name)="([^"]+)"', page_html)}
    wanted = {html.unescape(h) for h in re.findall(r'href="#([^"]+)"', page_html)}
    return sorted(wanted - ids)


#: The permalink nbconvert puts at the end of each notebook heading ("¶"). MkDocs' own permalinks are left out of
#: the search index's titles by their class; this one is marked for the search plugin to leave out.
NOTEBOOK_PERMALINK = '<a class="anchor-link" '


def without_permalinks_in_search(page_html: str) -> str:
    """``page_html`` with each notebook heading's permalink excluded from search (``data-search-exclude``),
    so that a heading's search title is its text alone."""
    return page_html.replace(NOTEBOOK_PERMALINK, NOTEBOOK_PERMALINK + "data-search-exclude ")


def on_page_content(html: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        html = without_permalinks_in_search(html)
    return html


def on_post_page(output: str, page: Any, config: Any, **kwargs: Any) -> str:
    for anchor in missing_anchors(output):
        log.warning(f"{page.file.src_uri}: links to #{anchor}, which is not on the page (a heading whose id "
                    f"differs from its entry in the contents? keep code and markup out of notebook headings)")
    return output


def on_page_context(context: Any, page: Any, config: Any, nav: Any, **kwargs: Any) -> Any:
    """A notebook's "edit this page" opens ``notebooks/NAME.ipynb``: ``docs/notebooks`` is a link to that folder."""
    if page.edit_url and page.file.src_uri.startswith("notebooks/"):
        page.edit_url = page.edit_url.replace("/docs/notebooks/", "/notebooks/")
    return context
