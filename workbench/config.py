"""Config validation: every ``config:`` block is checked by its component's own dataclass.

All problems found in one pass are reported together in a single
:class:`~workbench.errors.ConfigError`, each with its path (``adapter.config.rnak``) and, for
misspelled keys, a did-you-mean. Components expose ``config_class`` (a dataclass) and are
built with ``from_config(config)``; a dataclass validates its own values in ``__post_init__``
with :func:`check`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from workbench.errors import ConfigError, UnknownComponentError, did_you_mean, listing
from workbench.registry import name_of, registered, resolve


class Problems(list):
    """Problems collected while validating: ``(path, message)`` pairs."""

    def add(self, path: str, message: str) -> None:
        self.append((path, message))


def format_problems(problems: list[tuple[str, str]], header: str = "Invalid config") -> str:
    count = len(problems)
    lines = [f"{header} ({count} problem{'s' if count != 1 else ''}):"]
    lines += [f"  - {path}: {message}" if path else f"  - {message}" for path, message in problems]
    return "\n".join(lines)


def raise_problems(problems: list[tuple[str, str]], header: str = "Invalid config") -> None:
    if problems:
        error = ConfigError(format_problems(problems, header))
        error.problems = list(problems)
        raise error


def check(ok: bool, field: str, message: str) -> None:
    """Inside a config ``__post_init__``: raise a ConfigError for ``field`` unless ``ok``."""
    if not ok:
        raise_problems([(field, message)])


def check_compile(value: Any) -> None:
    """A backbone config's ``compile`` field: a bool (``true`` runs the denoiser through
    ``torch.compile``)."""
    check(isinstance(value, bool), "compile",
          f"must be true or false (true runs the backbone's denoiser through torch.compile), "
          f"got {_describe(value)}.")


def component_field(kind: str, default: Any = dataclasses.MISSING) -> Any:
    """Declare a dataclass field that holds a nested component block of ``kind``."""
    kwargs: dict[str, Any] = {"metadata": {"component_kind": kind}}
    if default is None:
        kwargs["default"] = None  # an optional block
    elif default is not dataclasses.MISSING:
        kwargs["default_factory"] = lambda: dict(default)
    return dataclasses.field(**kwargs)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


SCALAR_NAMES = {bool: "bool (true/false)", int: "int", float: "float", str: "str"}

# YAML 1.1 (PyYAML) reads ``1e-3`` and ``5E4`` as strings: its float needs a dot and a signed
# exponent (``1.0e-3``). A number field takes such a string as the number it spells.
_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _number(value: Any) -> float | None:
    """The number a string spells (``"1e-3"`` → 0.001), or None."""
    if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip()):
        return float(value)
    return None


def _scalar(tp: type, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` is a ``tp`` (bool / int / float / str) as YAML gives it, and the value as a ``tp``.

    A bool is never an int or a float; an integral float is an int; an int is a float; a string
    that spells a number (``1e-3``, which YAML 1.1 leaves a string) is that number.
    """
    spelled = _number(value) if tp in (int, float) else None
    if spelled is not None:
        value = spelled
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    return isinstance(value, tp), value


def coerce(tp: Any, value: Any, path: str, problems: Problems) -> Any:
    """Check ``value`` against the annotation ``tp``; return the converted value."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if value in args and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in args)):
            return value
        hint = did_you_mean(value, [str(a) for a in args]) if isinstance(value, str) else ""
        problems.add(path, f"got {_describe(value)}; allowed: {_type_name(tp)}.{hint}")
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):  # a nested block: report inside it
            return coerce(options[0], value, path, problems)
        for option in args:
            if option is type(None):
                continue
            trial = Problems()
            result = coerce(option, value, path, trial)
            if not trial:
                return result
        problems.add(path, f"expected {_type_name(tp)}, got {_describe(value)}.")
        return value
    if tp in SCALAR_NAMES:
        ok, converted = _scalar(tp, value)
        if not ok:
            spelled = _number(value) if tp in (int, float) else None
            hint = f" (the number {spelled:g}, not an {SCALAR_NAMES[tp]})" if spelled is not None else ""
            problems.add(path, f"expected {SCALAR_NAMES[tp]}, got {_describe(value)}{hint}.")
        return converted
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            problems.add(path, f"expected a list, got {_describe(value)}.")
            return value
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                problems.add(path, f"expected {len(args)} items, got {len(value)}.")
                return value
            items = [coerce(a, v, f"{path}[{i}]", problems) for i, (a, v) in enumerate(zip(args, value))]
        else:
            item_tp = args[0] if args else Any
            items = [coerce(item_tp, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            problems.add(path, f"expected a mapping, got {_describe(value)}.")
            return value
        value_tp = args[1] if len(args) == 2 else Any
        return {k: coerce(value_tp, v, f"{path}.{k}", problems) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return validate(tp, value, path, problems)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    problems.add(path, f"expected {_type_name(tp)}, got {_describe(value)}.")
    return value


def validate_component_block(kind: str, block: Any, path: str, problems: Problems) -> dict | None:
    """Check a ``{type, config}`` block: known type, allowed keys, config valid for that type."""
    if isinstance(block, str):
        block = {"type": block}
    if not isinstance(block, Mapping):
        problems.add(path, f"expected a {{type: ..., config: {{...}}}} block, got {_describe(block)}.")
        return None
    for key in block:
        if key not in ("type", "config"):
            hint = did_you_mean(key, ["type", "config"])
            problems.add(f"{path}.{key}", f"unknown key. Allowed: 'type', 'config'.{hint}")
    name = block.get("type")
    if not isinstance(name, str):
        problems.add(f"{path}.type", f"missing or not a string (got {_describe(name)}). "
                     f"Registered {kind}s: {listing(registered(kind))}.")
        return None
    try:
        cls = resolve(kind, name, where=f"{path}.type")
    except UnknownComponentError as err:
        names = registered(kind)
        problems.add(f"{path}.type", f"unknown {kind} {name!r}. Registered: {listing(names)}."
                     f"{did_you_mean(name, names)} "
                     + " ".join(line.strip() for line in str(err).split("\n")[1:]))
        return None
    config = block.get("config") or {}
    config_class = getattr(cls, "config_class", None)
    if config_class is None:
        if config:
            problems.add(f"{path}.config", f"{kind} {name!r} takes no config, got keys {listing(config)}.")
        return {"type": name, "config": {}}
    if not isinstance(config, Mapping):
        problems.add(f"{path}.config", f"expected a mapping, got {_describe(config)}.")
        return None
    validate(config_class, config, f"{path}.config", problems)
    return {"type": name, "config": dict(config)}


def validate(cls: type, data: Any, path: str, problems: Problems) -> Any:
    """Validate a mapping against the dataclass ``cls``; return an instance (or None on problems)."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        problems.add(path, f"expected a mapping for {cls.__name__}, got {_describe(data)}.")
        return None
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    before = len(problems)
    for key in data:
        if key not in fields:
            problems.add(f"{path}.{key}" if path else str(key),
                         f"unknown key. Allowed: {listing(fields)}.{did_you_mean(key, fields)}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        sub = f"{path}.{name}" if path else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.add(sub, f"missing required field ({_type_name(hints[name])}).")
            continue
        kind = f.metadata.get("component_kind")
        if kind and data[name] is None and f.default is None:
            values[name] = None
        elif kind:
            block = validate_component_block(kind, data[name], sub, problems)
            values[name] = block
        else:
            values[name] = coerce(hints[name], data[name], sub, problems)
    if len(problems) > before:
        return None
    try:
        return cls(**values)
    except ConfigError as err:
        for field_path, message in getattr(err, "problems", [("", str(err))]):
            problems.add(f"{path}.{field_path}" if path and field_path else (path or field_path), message)
        return None


def config_from(owner: type, config: Any = None, overrides: Mapping[str, Any] | None = None) -> Any:
    """The one construction convention: ``Component(config=None, **overrides)``.

    Returns ``config`` (an ``owner.config_class`` instance) as given, or ``config_class(**overrides)``
    when there is none — validated by the dataclass either way — for the component to keep as
    ``self.config``. Both at once is a TypeError (one of them would be dropped), and so is a
    positional value that is not a config; an unknown override name is a ConfigError.
    """
    config_class = owner.config_class
    overrides = dict(overrides or {})
    if config is not None and not isinstance(config, config_class):
        raise TypeError(f"{owner.__name__}(...) takes a {config_class.__name__} or keyword fields, got "
                        f"{type(config).__name__} {config!r:.60}. Pass fields by name, e.g. "
                        f"{owner.__name__}({dataclasses.fields(config_class)[0].name}=...).")
    if config is not None:
        if overrides:
            raise TypeError(f"pass either a config ({config_class.__name__}) or keyword overrides, not both: "
                            f"got a config and {listing(overrides)}. Use dataclasses.replace(config, ...) to "
                            f"change fields of a config.")
        return config
    fields = [f.name for f in dataclasses.fields(config_class) if f.init]
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise_problems([(k, f"unknown field of {config_class.__name__}. Allowed: {listing(fields)}."
                            f"{did_you_mean(k, fields)}") for k in unknown],
                       header=f"Invalid {owner.__name__}")
    return config_class(**overrides)


def block_of(component: Any, kind: str) -> dict:
    """``{type, config}`` of a built component: its registered name and its config as plain data.

    ``build(kind, block["type"], block.get("config"))`` rebuilds it (a component registered under
    no name gets ``module:qualname``, which documents it but does not rebuild).
    """
    cls = type(component)
    block: dict[str, Any] = {"type": name_of(kind, cls) or f"{cls.__module__}:{cls.__qualname__}"}
    config = getattr(component, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        block["config"] = to_dict(config)
    return block


def to_dict(config: Any) -> dict:
    """A config dataclass as plain YAML-friendly data."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    return plain(config)


def build(kind: str, name: str, config: Any = None, *, where: str | None = None) -> Any:
    """Build a component from its registered name and a config mapping (or config instance).

    The mapping is validated by the component's own config dataclass (``config_class``).

    Args:
        kind: The component kind (``"adapter"``, ``"composer"``, ``"backbone"``, ...).
        name: The name the component was registered under (see :func:`~workbench.registry.register`).
        config: A mapping of its config's fields, an instance of its config class, or None for the
            defaults.
        where: The config path the problems are reported at (default: ``kind``).

    Returns:
        The component, made from the validated config.

    Raises:
        UnknownComponentError: When ``kind`` or ``name`` is not registered; the message lists what is
            and suggests close matches.
        ConfigError: Every problem of the config at once, each with its path.

    Examples:
        >>> composer = build("composer", "gated_residual", {"gate_init": 0.1})
        >>> type(composer).__name__, composer.config.gate_init
        ('GatedResidual', 0.1)
    """
    where = where or kind
    cls = resolve(kind, name, where=f"{where}.type")
    config_class = getattr(cls, "config_class", None)
    if config_class is None:
        if config:
            raise_problems([(f"{where}.config", f"{kind} {name!r} takes no config, got {config!r}.")])
        return cls()
    problems = Problems()
    instance = validate(config_class, config if config is not None else {}, f"{where}.config", problems)
    raise_problems(problems)
    if hasattr(cls, "from_config"):
        return cls.from_config(instance)
    return cls(**{f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)})
