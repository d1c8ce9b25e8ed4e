"""The files around the code say the same thing as the code and as each other.

The licence (``LICENSE``, each distribution's ``pyproject.toml``, the README, ``CITATION.cff``), the
citation's version (``workbench/_version.py``), and the conda route (``environment.yml``) against what
``make install`` installs (the Makefile's install rule). Text only: nothing is built or installed here
(tests/test_install.py checks that the built wheel carries the licence).
"""

from __future__ import annotations

import datetime
import re
import shlex
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads pyproject.toml with tomllib")

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIRS = sorted(p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("plugins/*/pyproject.toml"))

# The top-level keys of the Citation File Format 1.2.0 (its schema's "properties"), and those it requires.
CFF_KEYS = {"abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers",
            "keywords", "license", "license-url", "message", "preferred-citation", "references", "repository",
            "repository-artifact", "repository-code", "title", "type", "url", "version"}
CFF_REQUIRED = {"authors", "cff-version", "message", "title"}


def pyproject(folder: str = ".") -> dict:
    return tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]


def test_every_distribution_carries_the_mit_licence_the_readme_names():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License\n\nCopyright (c) 2026 the workbench authors\n"), licence[:80]
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in licence
    assert PLUGIN_DIRS == ["plugins/dynamicrafter", "plugins/easyanimate", "plugins/wan22"]
    for folder in [".", *PLUGIN_DIRS]:
        project = pyproject(folder)
        assert (project["license"], project.get("license-files")) == ("MIT", ["LICENSE"]), folder
        assert (ROOT / folder / "LICENSE").read_text() == licence, f"{folder}/LICENSE differs from LICENSE"
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^MIT licensed: see \[LICENSE\]\(LICENSE\)\.$", readme, re.M), "the README's licence line"
    assert "copyright: Copyright &copy; 2026 the workbench authors. MIT License.\n" in (ROOT / "mkdocs.yml").read_text()


def test_the_citation_is_valid_cff_and_names_this_version():
    from workbench._version import __version__

    text = (ROOT / "CITATION.cff").read_text()
    citation = yaml.safe_load(text)
    assert CFF_REQUIRED <= set(citation) <= CFF_KEYS, set(citation) ^ CFF_KEYS
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == __version__
    assert citation["license"] == pyproject()["license"]
    assert citation["authors"] == [{"name": "workbench authors"}]
    assert citation["type"] == "software" and citation["title"].startswith("workbench: ")
    assert len(citation["abstract"].split()) > 30
    # a quoted ISO date: an unquoted one is a YAML date, which CFF's validators refuse
    assert re.search(r'^date-released: "\d{4}-\d\d-\d\d"$', text, re.M)
    datetime.date.fromisoformat(citation["date-released"])


def _make_install() -> dict:
    """What the Makefile's install rule (``$(STAMP):``) installs: extras, plugin folders, constraints file."""
    makefile = (ROOT / "Makefile").read_text()
    plugins = re.search(r"^PLUGINS := (.+)$", makefile, re.M).group(1).split()
    recipe = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    install = [line.strip() for line in recipe.splitlines() if line.strip().startswith("$(PIP_INSTALL)")]
    assert len(install) == 1, recipe
    words = shlex.split(install[0])
    assert "$(addprefix -e ,$(PLUGINS))" in install[0], install[0]   # every folder of PLUGINS, editable
    core = [words[i + 1] for i, w in enumerate(words) if w == "-e" and words[i + 1].startswith(".[")]
    assert len(core) == 1, install[0]
    pip = re.search(r"^PIP_INSTALL = (.+)$", makefile, re.M).group(1).split()
    return {"extras": set(core[0][2:-1].split(",")), "plugins": plugins,
            "constraints": pip[pip.index("-c") + 1]}


def test_environment_yml_installs_what_make_install_installs():
    made = _make_install()
    assert sorted(made["plugins"]) == PLUGIN_DIRS, "make install leaves out a plugin"
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    options = [shlex.split(line) for line in pip]
    assert ["-c", made["constraints"]] in options, pip
    editable = [words[1] for words in options if words[0] == "-e"]
    core = [e for e in editable if e.startswith(".[")]
    assert len(core) == 1 and set(core[0][2:-1].split(",")) == made["extras"], (core, made["extras"])
    assert sorted(e for e in editable if e not in core) == PLUGIN_DIRS, editable
    assert len(options) == 2 + len(PLUGIN_DIRS), f"environment.yml installs more than make install: {pip}"
