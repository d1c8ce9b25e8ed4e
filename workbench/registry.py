"""Names → components.

Components register by name, in process with ``@register(kind, name)`` or from any installed
distribution through an entry point in the group ``workbench.<kind>s``:

```toml
[project.entry-points."workbench.adapters"]
my_adapter = "my_package.adapters:MyAdapter"
```

Entry points are read lazily, the first time a name is looked up, so installing plugins costs
nothing at ``import workbench``. The built-in components are declared the same way in
workbench's own ``pyproject.toml``: nothing here imports them.
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Callable
from typing import Any, TypeVar

from workbench.errors import UnknownComponentError, did_you_mean, listing

KINDS: dict[str, str] = {
    "backbone": "workbench.backbones",
    "adapter": "workbench.adapters",
    "composer": "workbench.composers",
    "objective": "workbench.objectives",
    "callback": "workbench.callbacks",
    "dataset": "workbench.datasets",
    "state_reader": "workbench.state_readers",
}

LIST_ENTRY_POINTS = (
    "python -c \"import importlib.metadata as m; "
    "print({g: [e.name for e in m.entry_points(group=g)] for g in "
    f"{list(KINDS.values())}}})\""
)

_registered: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}

T = TypeVar("T")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UnknownComponentError(
            f"Unknown component kind {kind!r}. Kinds: {listing(KINDS)}.{did_you_mean(kind, KINDS)}"
        )


def register(kind: str, name: str) -> Callable[[T], T]:
    """Class decorator: make the decorated class buildable as ``{type: name}`` in a ``kind`` block.

    Args:
        kind: The component kind, one of :data:`KINDS` (``"adapter"``, ``"composer"``, ``"backbone"``, ...).
        name: The name a config's ``type:`` gives it (lower_snake).

    Returns:
        The decorator, which records the class and returns it unchanged.

    Raises:
        UnknownComponentError: When ``kind`` is not a component kind; the message lists the kinds.

    Examples:
        >>> from workbench import SideAdapter, build
        >>> @register("adapter", "my_adapter")
        ... class MyAdapter(SideAdapter): ...
        >>> type(build("adapter", "my_adapter")).__name__
        'MyAdapter'
    """
    _check_kind(kind)

    def decorate(obj: T) -> T:
        _registered[kind][name] = obj
        return obj

    return decorate


def _entry_points(kind: str) -> dict[str, metadata.EntryPoint]:
    """The entry points of ``kind``'s group, from every distribution's metadata (the first of a name wins).

    Every distribution is read, not only the first of each name that ``metadata.entry_points`` keeps: a
    stale ``*.egg-info`` of a development checkout, found first from its root, would hide the installed
    metadata's names."""
    found: dict[str, metadata.EntryPoint] = {}
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == KINDS[kind]:
                found.setdefault(ep.name, ep)
    return found


def registered(kind: str) -> list[str]:
    """Every name resolvable for ``kind``: registered in process or declared by an entry point."""
    _check_kind(kind)
    return sorted(set(_registered[kind]) | set(_entry_points(kind)))


def resolve(kind: str, name: str, *, where: str | None = None) -> Any:
    """The component registered as ``name`` for ``kind``, loading its entry point if needed.

    ``where`` is the config path reported in the error (e.g. ``adapter.type``).
    """
    _check_kind(kind)
    if name in _registered[kind]:
        return _registered[kind][name]
    eps = _entry_points(kind)
    if name in eps:
        obj = eps[name].load()
        _registered[kind].setdefault(name, obj)
        return _registered[kind][name]
    names = registered(kind)
    at = f" at {where}" if where else ""
    raise UnknownComponentError(
        f"Unknown {kind} {name!r}{at}. Registered: {listing(names)}.{did_you_mean(name, names)}\n"
        f"Components from plugins resolve through the installed distribution metadata of *this* "
        f"Python environment (not PYTHONPATH): install the plugin here, e.g. "
        f"`pip install -e plugins/<name>`, then list what this environment sees with "
        f"`workbench doctor`, or:\n"
        f"  {LIST_ENTRY_POINTS}"
    )


def name_of(kind: str, cls: type) -> str | None:
    """The name ``cls`` is registered under for ``kind``, or None; loads no entry point."""
    _check_kind(kind)
    for name, obj in _registered[kind].items():
        if obj is cls:
            return name
    target = f"{cls.__module__}:{cls.__qualname__}"
    return next((name for name, ep in _entry_points(kind).items() if ep.value.strip() == target), None)
