"""The data options every command takes: ``--camera``, ``--actions``, ``--state``, ``--action-dim``.

``workbench train``, ``cache-latents``, ``eval`` and ``demo --data`` read a dataset; which of its video
features and per-frame signals they read is the run's config (``data: {type: lerobot, config: {camera:
..., actions: ..., state: ...}}``, the adapter's ``dim``) or these flags, which set exactly those
fields:

    workbench train run.yaml --camera observation.images.wrist --state none --action-dim 7
    workbench eval outputs/run --data other_robot/ --actions action.joints

``--state none`` reads no state (an adapter that reads none needs none); ``--state auto`` reads
``observation.state`` when the dataset has it. A flag the dataset has no field for is an error
naming the dataset type and the fields it has.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from workbench.errors import ConfigError, listing

#: What the flags set in a dataset's config, when its config class has that field.
DATASET_FIELDS = {"camera": "camera", "actions": "actions", "state": "state"}


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """The data options of a command line (``None``: not given; the config's value stands)."""

    camera: str | None = None
    actions: str | None = None
    state: str | None = None  # a feature name, "auto", or "none"
    action_dim: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DataOptions:
        return cls(**{f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)})

    def dataset(self) -> dict[str, Any]:
        """The dataset config fields these options set (``--state none`` → ``state: None``)."""
        out: dict[str, Any] = {}
        for name in DATASET_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = None if name == "state" and value.lower() in ("none", "null") else value
        return out

    def flags(self) -> list[str]:
        """The command-line flags that give these options again (for a printed command)."""
        out = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out += [f"--{f.name.replace('_', '-')}", str(value)]
        return out


def add_data_arguments(parser: argparse.ArgumentParser, *, dim: bool = True) -> None:
    """``--camera``, ``--actions``, ``--state`` (and ``--action-dim`` with ``dim``) on ``parser``."""
    group = parser.add_argument_group("data options (default: the config's; they set its data: block)")
    group.add_argument("--camera",
                       help="the video feature to read, e.g. observation.images.front (data.config.camera)")
    group.add_argument("--actions", metavar="FEATURE",
                       help="the feature served as the actions (data.config.actions)")
    group.add_argument("--state", metavar="FEATURE|auto|none",
                       help="the feature served as the state (data.config.state): none reads no state, "
                            "auto reads observation.state where the dataset has it")
    if dim:
        group.add_argument("--action-dim", type=int, metavar="N",
                           help="the width of the action vector the adapter reads (adapter.config.dim)")


def apply_data_options(config: Any, options: DataOptions, *, what: str = "the config") -> Any:
    """``config`` (an :class:`~workbench.train.config.ExperimentConfig`) with ``options`` set in its data and
    adapter blocks, validated as a config file would be."""
    from workbench.registry import resolve
    from workbench.train.config import experiment_to_dict, parse_experiment

    fields = options.dataset()
    if not fields and options.action_dim is None:
        return config
    data = experiment_to_dict(config)
    if fields:
        if config.data is None:
            raise ConfigError(f"{', '.join(_flag(k) for k in fields)}: {what} has no data: block to set "
                              f"{'it' if len(fields) == 1 else 'them'} in. "
                              f"Add one (e.g. data: {{type: lerobot, config: {{root: DIR}}}}).")
        data["data"] = {**data["data"], "config": {**(data["data"].get("config") or {}), **fields}}
        _check_fields("dataset", data["data"]["type"], fields, what, resolve)
    if options.action_dim is not None:
        _check_fields("adapter", data["adapter"]["type"], {"dim": options.action_dim}, what, resolve)
        data["adapter"] = {**data["adapter"], "config": {**(data["adapter"].get("config") or {}),
                                                         "dim": options.action_dim}}
    return parse_experiment(data, source=f"{what} with {' '.join(options.flags())}")


def _flag(name: str) -> str:
    return "--action-dim" if name == "dim" else f"--{name}"


def _check_fields(kind: str, name: str, values: dict[str, Any], what: str, resolve: Any) -> None:
    cls = resolve(kind, name, where=f"{'data' if kind == 'dataset' else kind}.type")
    config_class = getattr(cls, "config_class", None)
    have = [f.name for f in dataclasses.fields(config_class)] if config_class else []
    for key in values:
        if key not in have:
            example = "the lerobot dataset" if kind == "dataset" else "latent_residual"
            raise ConfigError(f"{_flag(key)}: the {kind} of {what} is {name!r}, which has no {key!r} setting "
                              f"(its settings: {listing(have)}). Leave {_flag(key)} out, "
                              f"or use a {kind} that has it (e.g. {example}).")


__all__ = ["DataOptions", "add_data_arguments", "apply_data_options"]
