"""Count workbench's public surface: exported names per package, and the public members of the three
extension points (a backbone, an adapter, a composer) that a plugin author reads.

    python tools/public_surface.py            # a table
    python tools/public_surface.py --json     # the same numbers as JSON

A member is public when its name has no leading underscore and the class itself (or a workbench base
class above it) defines it, not ``nn.Module``; a method is anything callable, the rest are attributes
(properties included).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys

from torch import nn

PACKAGES = ("workbench", "workbench.core", "workbench.inspect", "workbench.train", "workbench.testing",
            "workbench.adapters", "workbench.data", "workbench.worldmodel", "workbench.widgets")
CLASSES = {"BaseVideoModel": "workbench.core.backbone", "Adapter": "workbench.core.adapter",
           "Composer": "workbench.core.composers"}


def exported(package: str) -> int | None:
    try:
        module = importlib.import_module(package)
    except ImportError:
        return None
    names = getattr(module, "__all__", None)
    return None if names is None else len(names)


def members(cls: type) -> tuple[list[str], list[str]]:
    """``(methods, attributes)``: public names ``cls`` and its workbench bases define beyond ``nn.Module``."""
    own: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("workbench"):
            own.update(vars(klass))
    public = {k: v for k, v in own.items() if not k.startswith("_") and not hasattr(nn.Module, k)}
    methods = sorted(k for k, v in public.items()
                     if inspect.isfunction(v) or isinstance(v, (classmethod, staticmethod)))
    attributes = sorted(k for k in public if k not in methods)
    return methods, attributes


def count() -> dict:
    out: dict = {"exports": {p: exported(p) for p in PACKAGES}, "classes": {}}
    for name, module in CLASSES.items():
        methods, attributes = members(getattr(importlib.import_module(module), name))
        out["classes"][name] = {"methods": len(methods), "attributes": len(attributes),
                                "method_names": methods, "attribute_names": attributes}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    numbers = count()
    if args.json:
        print(json.dumps(numbers, indent=2))
        return 0
    for package, n in numbers["exports"].items():
        print(f"{package:<22} {'-' if n is None else n:>4} exported names")
    for name, c in numbers["classes"].items():
        print(f"{name:<22} {c['methods']:>4} public methods, {c['attributes']} public attributes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
