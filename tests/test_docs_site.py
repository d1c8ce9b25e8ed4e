"""The documentation site builds strictly, and holds what it promises.

One ``mkdocs build --strict`` (module fixture): a broken link or anchor, a docstring griffe cannot
parse, or a docstring naming a ``workbench`` object that does not exist fails the build, hence this
file. The built site is then read: every section's pages (and each in the navigation), the API
reference covering each public name, the notebooks with their stored outputs, the results with their
dates and commands. The two build-time helpers (tools/docs_hooks.py, tools/griffe_roles.py) are tested
on their own too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]
    assert "WARNING" not in log, log[-5000:]
    return out


def _page(site: Path, path: str) -> str:
    page = site / path / "index.html"
    assert page.is_file(), f"{path}: not built"
    return page.read_text()


def test_every_page_of_every_section_is_built(site):
    for source in [*DOCS.rglob("*.md"), *NOTEBOOKS]:
        relative = source.relative_to(ROOT / "notebooks" if source.suffix == ".ipynb" else DOCS)
        if source.suffix == ".ipynb":
            relative = Path("notebooks") / relative
        if relative.parts[0] == "notebooks" and relative.name == "README.md":
            built = Path("notebooks")
        elif relative.stem == "index":
            built = relative.parent
        else:
            built = relative.with_suffix("")
        _page(site, built.as_posix())
    for section in ("getting-started", "concepts", "guides", "api", "notebooks", "results"):
        _page(site, section)


def test_the_navigation_lists_every_section_and_page(site):
    home = _page(site, "")
    for title in ("Getting started", "Concepts", "Guides", "API reference", "Notebooks", "Results"):
        assert f">{title}<" in home or f"> {title} <" in home or re.search(rf">\s*{title}\s*<", home), title
    # every page of a section's folder is in the navigation (the `*.md` entries), so each is linked from home
    for folder in ("concepts", "guides", "guides/plugins", "results", "api"):
        for source in DOCS.glob(f"{folder}/*.md"):
            href = f"{folder}/" if source.stem == "index" else f"{folder}/{source.stem}/"
            assert f'href="{href}"' in home, source.relative_to(DOCS)


@pytest.mark.parametrize("package, page", [
    ("workbench", "api/workbench"), ("workbench.core", "api/core"), ("workbench.train", "api/train"),
    ("workbench.inspect", "api/inspect"), ("workbench.widgets", "api/widgets"), ("workbench.data", "api/data"),
    ("workbench.testing", "api/testing"), ("workbench.worldmodel", "api/worldmodel"),
])
def test_the_api_reference_covers_each_public_name(site, package, page):
    module = importlib.import_module(package)
    html = _page(site, page)
    missing = [name for name in module.__all__ if not re.search(rf'(id|href)="[^"]*\b{re.escape(name)}"', html)]
    assert missing == [], f"{page} does not document {missing}"


def test_the_api_reference_renders_signatures_and_docstrings(site):
    core = _page(site, "api/core")
    assert 'id="workbench.core.BaseVideoModel.run_sampler"' in core
    assert "compose_fn" in core and "every prediction" in core          # run_sampler's docstring, rendered
    inspect = _page(site, "api/inspect")
    assert 'id="workbench.inspect.Trajectory.fork"' in inspect
    assert 'id="workbench.inspect.record"' in inspect
    train = _page(site, "api/train")
    assert 'id="workbench.train.AdapterExperiment.fit"' in train
    assert 'id="workbench.loop.TrainingLoop"' in train
    testing = _page(site, "api/testing")
    assert 'id="workbench.testing.check_backbone"' in testing
    # the docstrings' :class:`...` roles are links, never shown raw
    for page in ("api/core", "api/inspect", "api/train", "api/testing", "api/widgets", "api/worldmodel"):
        assert ":class:`" not in _page(site, page) and ":func:`" not in _page(site, page), page
    assert 'class="autorefs autorefs-internal"' in inspect


def test_the_notebooks_are_rendered_with_their_stored_outputs(site):
    for notebook in NOTEBOOKS:
        html = _page(site, f"notebooks/{notebook.stem}")
        assert html.count("data:image/png;base64,") >= 1, f"{notebook.name}: no stored picture rendered"
    quickstart = _page(site, f"notebooks/{NOTEBOOKS[0].stem}")
    assert "AdapterExperiment" in quickstart          # the code cells too


def test_each_results_page_gives_dates_and_commands():
    pages = [p for p in DOCS.glob("results/*.md") if p.name != "index.md"]
    assert pages
    for page in pages:
        text = page.read_text()
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page.name}: no date of measurement"
        assert "```bash" in text or re.search(r"`(make|workbench|python|torchrun|cd) [^`]+`", text), \
            f"{page.name}: no command to rerun"
        assert "|---" in text, f"{page.name}: no table"


def test_the_readme_is_the_front_door_and_its_links_hold():
    """At most 250 lines; every relative link (and picture) names a file that exists (the site checks its own)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    relative = [t for t in targets if "://" not in t]
    assert "docs/assets/world-model.png" in relative and "docs/getting-started.md" in relative
    assert [t for t in relative if not (ROOT / t).exists()] == []


# -- the build-time helpers ----------------------------------------------------------------------------------
def test_a_glob_in_the_navigation_lists_the_pages_not_named_elsewhere(tmp_path):
    hooks = _load("docs_hooks")
    for name in ("a.md", "b.md", "index.md", "z.md"):
        (tmp_path / "guides").mkdir(exist_ok=True)
        (tmp_path / "guides" / name).write_text("# x\n")

    class Config:
        docs_dir = str(tmp_path)
        nav = [{"Home": "index.md"}, {"Guides": ["guides/index.md", "guides/z.md", "guides/*.md"]},
               {"More": ["guides/b.md"]}]

    assert hooks.on_config(Config()).nav == [
        {"Home": "index.md"}, {"Guides": ["guides/index.md", "guides/z.md", "guides/a.md"]}, {"More": ["guides/b.md"]}]


def test_docstring_roles_become_references_and_a_stale_name_is_a_warning(tmp_path, caplog):
    griffe = pytest.importorskip("griffe")
    roles = _load("griffe_roles")
    package = tmp_path / "docs_probe"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        """See :class:`Thing`, :func:`~docs_probe.helper`, :class:`torch.Tensor` and :class:`docs_probe.Gone`."""

        class Thing:
            """A thing."""

        def helper():
            """Help."""
    '''))
    with caplog.at_level("WARNING"):
        loaded = griffe.load("docs_probe", search_paths=[tmp_path], extensions=griffe.load_extensions(
            roles.RolesToLinks(package="docs_probe")))
    text = loaded.docstring.value
    assert '<autoref identifier="docs_probe.Thing" optional><code>Thing</code></autoref>' in text
    assert '<autoref identifier="docs_probe.helper" optional><code>helper()</code></autoref>' in text
    assert "<code>torch.Tensor</code>" in text and "<code>docs_probe.Gone</code>" in text
    assert ":class:" not in text
    assert "docs_probe: the docstring names docs_probe.Gone, which does not exist" in caplog.text
