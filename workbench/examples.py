"""The example configs that ship with workbench, and writing them where a user works (``workbench init``).

The YAML runs of the repository's ``examples/configs/`` are installed with the package (as
``workbench/configs/``), so ``workbench init`` writes them into the current folder and the commands
the README and the guides print (``workbench train examples/configs/tiny.yaml``) work outside a clone::

    workbench init                      # every example into examples/configs/
    workbench init tiny own_videos      # just these
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from workbench.errors import ConfigError, did_you_mean, listing

#: Where ``workbench init`` writes the examples (the path the docs use).
DEFAULT_DIR = Path("examples") / "configs"


def example_configs() -> dict[str, str]:
    """Every shipped example config: name (``tiny``) → its YAML text."""
    folder = resources.files("workbench") / "configs"
    return {entry.name.removesuffix(".yaml"): entry.read_text() for entry in sorted(folder.iterdir(),
                                                                                   key=lambda e: e.name)
            if entry.name.endswith(".yaml")}


def write_examples(names: list[str] | None = None,
                   into: str | Path = DEFAULT_DIR) -> tuple[list[Path], list[Path]]:
    """Write the example configs ``names`` (all by default) into ``into``; returns (written, kept): a file
    already there is kept as it is, never overwritten."""
    shipped = example_configs()
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
        if path.exists():
            kept.append(path)
            continue
        path.write_text(shipped[name])
        written.append(path)
    return written, kept


__all__ = ["DEFAULT_DIR", "example_configs", "write_examples"]
