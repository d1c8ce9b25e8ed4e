"""Where an experiment's frozen base lives: its device and dtype follow the run's device.

``training.device`` decides; a backbone whose own ``device`` is ``auto`` is loaded there (so its
``dtype: auto`` resolves for that device), and a base built elsewhere whose auto dtype was
resolved for another device type is refused rather than moved into the wrong precision.
"""

from __future__ import annotations

import dataclasses

import torch

from workbench.core import platform
from workbench.core.backbone import BaseVideoModel
from workbench.errors import ConfigError
from workbench.registry import resolve


def base_config_on(block: dict, device: torch.device) -> dict:
    """The base's config with ``device: auto`` pinned to the run's device, so its weights load there
    (and in the dtype the card wants there) instead of on the best device of the machine."""
    config = dict(block.get("config") or {})
    config_class = getattr(resolve("backbone", block["type"], where="base.type"), "config_class", None)
    fields = ({f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class)
              else ())
    if "device" in fields and config.get("device", "auto") == "auto":
        config["device"] = str(device)
    return config


def check_base_dtype(base: BaseVideoModel, device: torch.device) -> None:
    """Refuse to move a base whose ``dtype: auto`` was resolved for another device type, where its
    card wants another dtype (e.g. bfloat16 weights loaded for a GPU, trained on the CPU)."""
    if getattr(getattr(base, "config", None), "dtype", None) != "auto" or base.device.type == device.type:
        return
    want = platform.resolve_dtype("auto", device, precision=base.card.precision)
    have = base.dtype
    if have != want:
        def name(dtype: torch.dtype) -> str:
            return str(dtype).removeprefix("torch.")

        raise ConfigError(
            f"training.device is {device.type}, but the backbone was loaded on {base.device.type} "
            f"in {name(have)} (its dtype: auto, resolved for {base.device.type}); "
            f"on {device.type} its card runs {name(want)}. "
            f"Moving it would train in {name(have)} on {device.type}. "
            f"Build the backbone with device: {device.type} (in a YAML config, leave its device on auto: "
            f"it follows training.device), or give its dtype explicitly."
        )
