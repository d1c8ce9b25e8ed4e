"""Names of a package resolved on first access, so that importing the package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str], noun: str = "names"
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package`` whose ``names`` map to the modules defining them.

    The module is imported when one of its names is first used; an unknown name raises the usual
    AttributeError, listing the ``noun`` that do exist.
    """
    exported = sorted(names)

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}; {noun}: {', '.join(exported)}.")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exported})

    return exported, __getattr__, __dir__
