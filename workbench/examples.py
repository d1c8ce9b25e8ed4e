"""The example configs that ship with workbench, and writing them where a user works (``workbench init``).

The YAML runs of the repository's ``examples/configs/`` are installed with the package (as
``workbench/configs/``), so ``workbench init`` writes them into the current folder and the commands
the README and the guides print (``workbench train examples/configs/tiny.yaml``) work outside a clone:

    workbench init                      # every example into examples/configs/
    workbench init tiny own_videos      # just these
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, did_you_mean, listing

#: Where ``workbench init`` writes the examples (the path the docs use).
DEFAULT_DIR = Path("examples") / "configs"


def example_configs() -> dict[str, str]:
    """Every shipped example config: name (``tiny``) → its YAML text."""
    folder = resources.files("workbench") / "configs"
    return {entry.name.removesuffix(".yaml"): entry.read_text() for entry in sorted(folder.iterdir(),
                                                                                   key=lambda e: e.name)
            if entry.name.endswith(".yaml")}


def write_examples(names: list[str] | None = None, into: str | Path = DEFAULT_DIR,
                   texts: dict[str, str] | None = None) -> tuple[list[Path], list[Path]]:
    """Write the example configs ``names`` (all by default) into ``into``; returns (written, kept): a file
    already there is kept as it is, never overwritten. ``texts``: name → the text to write instead of the
    shipped one (e.g. filled in with :func:`fill_config`); it replaces a file that holds the shipped example
    unchanged (nothing of the user's is lost), such as the one a clone of the repository has."""
    original = example_configs()
    shipped = {**original, **(texts or {})}
    unknown = [n for n in names or [] if n.removesuffix(".yaml") not in shipped]
    if unknown:
        raise ConfigError(f"No example config called {unknown[0]!r}. "
                          f"The examples: {listing(sorted(shipped))}."
                          f"{did_you_mean(unknown[0], sorted(shipped))}")
    folder = Path(into)
    folder.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for name in [n.removesuffix(".yaml") for n in names] if names else sorted(shipped):
        path = folder / f"{name}.yaml"
        if path.exists() and not (name in (texts or {}) and path.read_text() == original[name]):
            kept.append(path)
            continue
        path.write_text(shipped[name])
        written.append(path)
    return written, kept


def _yaml_value(value: Any) -> str:
    """``value`` as YAML text: plain where that reads back the same, else double-quoted (JSON is YAML)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, str) and not re.fullmatch(r"[A-Za-z0-9_./~-]+", value):
        return json.dumps(value)
    return str(value)


def fill_config(text: str, values: dict[str, dict[str, Any]], optional: tuple[str, ...] = ()) -> str:
    """``text`` (a YAML config) with the values of ``values`` (top-level block → key → value) put in place,
    comments and layout kept. A key appears once in its block, as ``key: value`` on a line or in a
    ``{...}`` mapping; ``optional`` keys (``"base.frames"``) are left alone where the block has none."""
    import yaml

    lines = text.splitlines(keepends=True)
    for block, wanted in values.items():
        starts = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(block)}:", line)]
        if len(starts) != 1:
            raise ConfigError(f"The config has {len(starts)} top-level {block}: blocks; expected one.")
        end = next((i for i in range(starts[0] + 1, len(lines)) if re.match(r"\S", lines[i])
                    and not lines[i].startswith("#")), len(lines))
        body = "".join(lines[starts[0]:end])
        for key, value in wanted.items():
            pattern = re.compile(rf"(?m)(?<![\w.]){re.escape(key)}:[ \t]*(\[[^\]\n]*\]|[^,}}\n#]*?)"
                                 rf"(?=[ \t]*(?:,|}}|#|$))")
            found = list(pattern.finditer(body))
            if not found and f"{block}.{key}" in optional:
                continue
            if len(found) != 1:
                raise ConfigError(f"The config's {block}: block names {key}: {len(found)} times; "
                                  f"expected once.")
            match = found[0]
            body = body[:match.start(1)] + _yaml_value(value) + body[match.end(1):]
        lines[starts[0]:end] = [body]
    out = "".join(lines)
    parsed = yaml.safe_load(out)
    for block, wanted in values.items():
        for key, value in wanted.items():
            found = _find(parsed.get(block), key)
            if (found is not None or f"{block}.{key}" not in optional) \
                    and found != (list(value) if isinstance(value, tuple) else value):
                raise ConfigError(f"Filling the config set {block}: {key}: to {found!r}, not {value!r}.")
    return out


def _find(tree: Any, key: str) -> Any:
    """The value of ``key`` in the mapping ``tree`` or the mappings nested in it (the first found)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


__all__ = ["DEFAULT_DIR", "example_configs", "fill_config", "write_examples"]
