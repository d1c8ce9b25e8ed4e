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


def test_the_api_reference_documents_the_composer_and_objective_configurations(site):
    """Every configuration dataclass of the built-in composers and objectives (what a ``config:`` block fills)."""
    import dataclasses

    from workbench.core import composers, objectives

    configs = [f"{module.__name__}.{name}" for module in (composers, objectives) for name, value in vars(module).items()
               if name.endswith("Config") and dataclasses.is_dataclass(value) and value.__module__ == module.__name__]
    assert len(configs) == 6, configs
    core = _page(site, "api/core")
    assert [c for c in configs if f'id="{c}"' not in core] == []


def test_no_api_page_shows_a_literal_double_colon(site):
    """A reStructuredText ``Example::`` is no section to mkdocstrings: it shows as text, its code as prose."""
    pages = sorted((site / "api").glob("*/index.html"))
    assert len(pages) >= 10
    shown = {page.parent.name: re.findall(r"\w+::</p>", page.read_text()) for page in pages}
    assert {name: found for name, found in shown.items() if found} == {}


def test_the_notebooks_are_rendered_with_their_stored_outputs(site):
    for notebook in NOTEBOOKS:
        html = _page(site, f"notebooks/{notebook.stem}")
        assert html.count("data:image/png;base64,") >= 1, f"{notebook.name}: no stored picture rendered"
    quickstart = _page(site, f"notebooks/{NOTEBOOKS[0].stem}")
    assert "AdapterExperiment" in quickstart          # the code cells too


def test_each_rendered_notebook_links_its_download(site):
    for notebook in NOTEBOOKS:
        html = _page(site, f"notebooks/{notebook.stem}")
        assert f'href="{notebook.name}" download="{notebook.name}"' in html, notebook.name
        assert (site / "notebooks" / notebook.stem / notebook.name).read_bytes() == notebook.read_bytes()


def test_the_site_says_which_version_it_documents(site):
    from workbench._version import __version__

    for page in ("", "guides/install"):
        html = _page(site, page)
        header = re.search(r'<div class="md-header__topic">\s*<span class="md-ellipsis">\s*([^<]+?)\s*</span>', html)
        assert header and header.group(1) == f"workbench {__version__}", page
        assert re.search(rf"<title>[^<]*workbench {re.escape(__version__)}</title>", html), page


def test_notebook_headings_are_searched_by_their_text_alone(site):
    """nbconvert ends each heading with a "¶" permalink; the search index's titles leave it out."""
    import json

    entries = json.loads((site / "search" / "search_index.json").read_text())["docs"]
    assert [e["title"] for e in entries if "¶" in e["title"]] == []
    first = json.loads(NOTEBOOKS[0].read_text())
    headings = [line.lstrip("#").strip() for cell in first["cells"] if cell["cell_type"] == "markdown"
                for line in "".join(cell["source"]).splitlines() if line.startswith("## ")]
    titles = {e["title"] for e in entries if e["location"].startswith(f"notebooks/{NOTEBOOKS[0].stem}/#")}
    assert headings and set(headings) <= titles, (headings, titles)


def test_docstring_examples_render_as_code_not_as_quotes(site):
    """A ``>>>`` outside an Examples section renders as a nested quote with its lines run together."""
    for page in ("api/core", "api/inspect", "api/train", "api/widgets", "api/testing", "api/utilities"):
        html = _page(site, page)
        assert "<blockquote>" not in html and "&gt;&gt;&gt;" not in re.sub(r"<pre.*?</pre>", "", html, flags=re.S)
        assert "doctest:" not in html, page
    assert '<span class="gp">&gt;&gt;&gt; </span>' in _page(site, "api/inspect")   # highlighted as a session


def test_each_api_page_says_its_package_intro_once(site):
    for page, intro in (("api/inspect", "The instruments: recorded trajectories"), ("api/core", "The contract:"),
                        ("api/testing", "conformance kit"), ("api/widgets", "Notebook views")):
        text = re.sub(r"<[^>]+>", "", _page(site, page).split('<article', 1)[1])
        assert text.count(intro) == 1, (page, text.count(intro))


def test_every_summary_is_a_whole_sentence(site):
    """The summary tables show a docstring's first line: it must not stop mid-sentence."""
    inspect = _page(site, "api/inspect")
    assert "What instruments take as a readout: frames in, positions out." in inspect


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


def test_notebook_permalinks_are_left_out_of_search_and_the_version_is_read_as_text(tmp_path):
    hooks = _load("docs_hooks")
    heading = '<h2 id="sample">Sample<a class="anchor-link" href="#sample">¶</a></h2>'
    assert hooks.without_permalinks_in_search(heading) == (
        '<h2 id="sample">Sample<a class="anchor-link" data-search-exclude href="#sample">¶</a></h2>')
    (tmp_path / "_version.py").write_text('"""Doc."""\n\n__version__ = "9.8.7rc1"\n')
    assert hooks.documented_version(tmp_path / "_version.py") == "9.8.7rc1"
    from workbench._version import __version__

    assert hooks.documented_version() == __version__


def test_a_summary_line_holds_the_whole_first_sentence():
    roles = _load("griffe_roles")
    cut = "What instruments take as a readout: ``readout(frames)`` maps frames to\npositions in ``unit``.\n\nMore."
    assert roles.whole_first_sentence(cut).split("\n")[0].endswith("maps frames to positions in ``unit``.")
    assert roles.whole_first_sentence("Done here.\nNext one\ngoes on.") == "Done here.\nNext one\ngoes on."
    assert roles.whole_first_sentence("Caps (e.g. the\nfirst).") == "Caps (e.g. the first)."
    assert roles.whole_first_sentence("No stop\nExamples:\n    >>> 1") == "No stop\nExamples:\n    >>> 1"


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


# -- the supported-models table ------------------------------------------------------------------------------
def _models_table() -> dict[str, dict[str, str]]:
    """``{row: {backbone: cell}}`` of the table under "Supported models" in docs/guides/backbones.md."""
    text = (DOCS / "guides" / "backbones.md").read_text()
    rows = [line.strip("|").split(" | ") for line in text.split("## Supported models", 1)[1].splitlines()
            if line.startswith("|")]
    names = [name.strip(" `") for name in rows[0][1:]]
    return {row[0].strip(): dict(zip(names, (cell.strip() for cell in row[1:]))) for row in rows[2:]}


def test_the_supported_models_table_says_what_the_code_says():
    """Capabilities, clips, precision and adapters of each backbone, read from its code (no model is built)."""
    pytest.importorskip("workbench_wan22", reason="the backbone plugins are not installed")
    from importlib import metadata

    from workbench_dynamicrafter import backbone as dynamicrafter
    from workbench_dynamicrafter.variants import VARIANTS
    from workbench_easyanimate import backbone as easyanimate
    from workbench_wan22 import backbone as wan22

    from workbench.backbones import diffusers_bridge, tiny_video
    from workbench.core.capabilities import InsideAccess, unwritten
    from workbench.core.card import CAPABILITIES

    table = _models_table()
    backbones = {ep.name: ep for ep in metadata.entry_points(group="workbench.backbones")}
    assert set(table["model"]) == set(backbones)
    classes = {"tiny_video": tiny_video.TinyVideo, "wan22_ti2v": wan22.Wan22TI2V,
               "easyanimate": easyanimate.EasyAnimate, "dynamicrafter": dynamicrafter.DynamiCrafter}
    modules = {"tiny_video": tiny_video, "wan22_ti2v": wan22, "easyanimate": easyanimate,
               "dynamicrafter": dynamicrafter}

    def capabilities(cls) -> str:  # the card's capabilities tuple, as the card's code spells it
        maker = next(vars(cls)[n] for n in ("card_fields", "make_card", "_make_card", "card")
                     if n in vars(cls))
        code = (maker.fget if isinstance(maker, property) else maker).__code__
        found = [c for c in code.co_consts if isinstance(c, tuple) and c and set(c) <= set(CAPABILITIES)]
        assert len(found) == 1, (cls, found)
        return ", ".join(found[0])

    def clip(defaults) -> str:
        return f"{defaults['num_frames']} frames, {defaults['height']}x{defaults['width']}"

    adapters = {}
    for ep in metadata.entry_points(group="workbench.adapters"):
        adapters.setdefault(ep.dist.name, []).append(ep.name)
    for name, cls in classes.items():
        assert table["distribution"][name] == f"`{backbones[name].dist.name}`"
        assert table["capabilities (card)"][name] == capabilities(cls), name
        card_precision = getattr(modules[name], "PRECISION", None) or diffusers_bridge.PRECISION  # the card's
        precision = ", ".join(f"{device} {dtype}" for device, dtype in card_precision.items())
        assert table["precision, `dtype: auto` (card)"][name] == precision, name
        beside = [a for a in adapters[backbones[name].dist.name] if a.endswith("latent_residual")]
        assert table["adapters beside the base"][name] == ", ".join(f"`{a}`" for a in beside), name
        assert issubclass(cls, InsideAccess) and "inside_spec" not in unwritten(cls), f"{name}: no adapters inside"
    assert {"lora", "action_modulation", "controlnet"} <= set(adapters["grafted-workbench"])
    cards = table["clip (`clip()`, the real model's card)"]
    tiny = tiny_video.TinyVideo.from_pretrained().card.sampling
    assert cards["tiny_video"] == f"{tiny.num_frames} frames, {tiny.height}x{tiny.width}, {tiny.fps} fps"
    for name in ("wan22_ti2v", "easyanimate"):
        assert cards[name] == f"{clip(modules[name].REAL_DEFAULTS)}, {modules[name].REAL_DEFAULTS['fps']} fps"
    for variant in ("256", "512", "1024"):
        v = VARIANTS[variant]
        assert f"{v.height}x{v.width} (`{variant}`)" in cards["dynamicrafter"], variant
    assert table["sizes"]["dynamicrafter"] == "variants " + ", ".join(f"`{v}`" for v in VARIANTS)



# -- navigation, indexes, the site's configuration --------------------------------------------------------
def _mkdocs_config(env: dict[str, str] | None = None) -> dict:
    from mkdocs.utils.yaml import yaml_load

    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with open(ROOT / "mkdocs.yml") as f:
            return yaml_load(f)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _section(nav: list, title: str) -> list:
    return next(item[title] for item in nav if isinstance(item, dict) and title in item)


def _expanded_nav() -> list:
    hooks = _load("docs_hooks")

    class Config:
        docs_dir = str(DOCS)
        nav = _mkdocs_config()["nav"]

    return hooks.on_config(Config()).nav


def _index_order(text: str) -> list[str]:
    """The pages an index's table rows link, in order (each once)."""
    links = [link for line in text.splitlines() if line.startswith("| ")
             for link in re.findall(r"\]\(([\w/-]+\.md)\)", line)]
    return list(dict.fromkeys(links))


GUIDE_GROUPS = ("How-to", "The world model", "Extending", "Internals")


def test_new_guides_land_at_the_end_of_how_to_before_troubleshooting():
    guides = _section(_mkdocs_config()["nav"], "Guides")
    assert guides[0] == "guides/index.md" and [next(iter(g)) for g in guides[1:]] == list(GUIDE_GROUPS)
    assert _section(guides, "How-to")[-2:] == ["guides/*.md", "guides/troubleshooting.md"]
    assert _section(guides, "Internals")[-1] == "guides/development.md"
    assert {"Changelog": "changelog.md"} in _mkdocs_config()["nav"]


def test_the_guides_navigation_has_the_groups_of_the_guides_index():
    """Each group of mkdocs.yml's Guides lists the pages of the same group of docs/guides/index.md, in its order
    (a subsection by its first page); a new guide is named in mkdocs.yml where its index row puts it."""
    guides = _section(_expanded_nav(), "Guides")
    index = (DOCS / "guides" / "index.md").read_text()
    for group in GUIDE_GROUPS:
        rows = index.split(f"\n## {group}\n", 1)[1].split("\n## ", 1)[0]
        listed = [f"guides/{page}" for page in _index_order(rows)]
        named = [entry if isinstance(entry, str) else next(iter(entry.values()))[0]
                 for entry in _section(guides, group)]
        assert named == listed, f"mkdocs.yml's {group!r} differs from docs/guides/index.md's: {named} != {listed}"


def test_the_results_navigation_follows_the_results_index():
    results = _section(_expanded_nav(), "Results")
    listed = [f"results/{page}" for page in _index_order((DOCS / "results" / "index.md").read_text())]
    assert results == ["results/index.md", *listed], "name each results page in mkdocs.yml in the index's order"


def test_each_changelog_heading_is_unique():
    """Headings are the changelog's anchors: one date (or version) has one heading."""
    headings = re.findall(r"^#+ (.+)$", (DOCS / "changelog.md").read_text(), re.M)
    assert [h for h in set(headings) if headings.count(h) > 1] == []
    assert any(re.fullmatch(r"\d{4}-\d\d-\d\d", h) for h in headings)


def test_the_guides_and_results_indexes_list_every_page():
    for folder in ("guides", "results"):
        index = (DOCS / folder / "index.md").read_text()
        missing = [p.name for p in (DOCS / folder).glob("*.md") if p.name != "index.md" and f"]({p.name}" not in index]
        assert missing == [], f"docs/{folder}/index.md does not list {missing}"


def test_the_repository_link_is_configured_not_invented():
    assert _mkdocs_config({"WORKBENCH_DOCS_REPO_URL": ""}).get("repo_url") in (None, "")
    configured = _mkdocs_config({"WORKBENCH_DOCS_REPO_URL": "https://git.example.org/team/workbench"})
    assert configured["repo_url"] == "https://git.example.org/team/workbench"
    assert "content.action.edit" in configured["theme"]["features"]
    hooks = _load("docs_hooks")

    class Config:
        docs_dir, nav = str(DOCS), None
        repo_url, edit_uri = configured["repo_url"], configured.get("edit_uri")

    assert hooks.on_config(Config()).edit_uri == "edit/main/docs/"
    Config.edit_uri = "edit/docs-branch/docs/"
    assert hooks.on_config(Config()).edit_uri == "edit/docs-branch/docs/"


def test_a_link_to_a_missing_anchor_is_found():
    hooks = _load("docs_hooks")
    page = ('<nav><a href="#the-pipeline-written-with-loaded-like-a-checkpoint">x</a><a href="#fine">y</a></nav>'
            '<h2 id="the-pipeline-written-with-save_pretrained-loaded-like-a-checkpoint">z</h2><h2 id="fine">f</h2>')
    assert hooks.missing_anchors(page) == ["the-pipeline-written-with-loaded-like-a-checkpoint"]


def test_notebook_headings_hold_no_code():
    """mkdocs-jupyter's contents list drops a heading's code from the anchor the heading itself keeps."""
    import json

    for notebook in NOTEBOOKS:
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                headings = [line for line in "".join(cell["source"]).splitlines() if line.startswith("#")]
                assert [h for h in headings if "`" in h or "<" in h] == [], notebook.name


def test_the_changelog_starts_at_the_current_version():
    from workbench._version import __version__

    text = (DOCS / "changelog.md").read_text()
    first = re.search(r"^## (\S+)", text, re.M)
    assert first and first.group(1) == __version__
