"""Experiment trackers as callbacks: TensorBoard event files and Weights & Biases runs.

Both import their library only when a fit starts (TensorBoard comes with the optional extra
``logging``; Weights & Biases is installed on its own), read metrics only on the steps they log (the
loop's other steps never synchronise for them), and log from rank 0 alone when the run is distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from workbench.config import check
from workbench.errors import CallbackError
from workbench.extras import extra_of, install_hint
from workbench.registry import register
from workbench.train.callbacks import Configured


def _scalars(metrics: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if key == "step":
            continue
        if (isinstance(value, torch.Tensor) and value.numel() == 1
                or isinstance(value, (int, float)) and not isinstance(value, bool)):
            out[f"{prefix}{key}"] = float(value)
    return out


def _missing(package: str, callback: str) -> CallbackError:
    return CallbackError(f"The {callback} callback needs the '{package}' package, which is not installed. "
                         f"Install it with `{_install(package)}`, or remove the callback from the config.")


def _install(package: str) -> str:
    extra = extra_of(package)
    return install_hint([extra]) if extra else f"pip install {package}"


@dataclass
class TensorBoardConfig:
    """``log_dir``: where event files go (default: ``<run dir>/tensorboard``)."""

    every_n_steps: int = 10
    log_dir: str | None = None

    def __post_init__(self):
        check(self.every_n_steps >= 1, "every_n_steps", f"must be >= 1, got {self.every_n_steps}.")


@register("callback", "tensorboard")
class TensorBoard(Configured):
    """Writes loss, learning rate and evaluation metrics as TensorBoard scalars (``train/``, ``eval/``)."""

    config_class = TensorBoardConfig
    requires_extras = {"logging": ("tensorboard",)}
    main_process_only = True

    def __init__(self, config: TensorBoardConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.writer = None

    def on_fit_start(self, exp) -> None:
        if self.writer is not None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise _missing("tensorboard", "tensorboard") from err
        log_dir = Path(self.config.log_dir) if self.config.log_dir else Path(exp.output_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def _write(self, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def on_step_end(self, exp, step, metrics) -> None:
        self._write(_scalars(metrics, "train/"), step)

    def on_eval(self, exp, step, metrics) -> None:
        self._write(_scalars(metrics, "eval/"), step)
        if self.writer is not None:
            self.writer.flush()

    def on_fit_end(self, exp) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass
class WandbConfig:
    """``mode``: ``offline`` (default: nothing leaves the machine; ``wandb sync`` uploads later),
    ``online`` (needs a key) or ``disabled``. ``project`` / ``name`` / ``dir`` as in ``wandb.init``."""

    every_n_steps: int = 10
    project: str = "workbench"
    name: str | None = None
    mode: Literal["offline", "online", "disabled"] = "offline"
    dir: str | None = None

    def __post_init__(self):
        check(self.every_n_steps >= 1, "every_n_steps", f"must be >= 1, got {self.every_n_steps}.")


@register("callback", "wandb")
class Wandb(Configured):
    """Logs loss, learning rate and evaluation metrics to a Weights & Biases run (offline unless
    configured)."""

    config_class = WandbConfig
    main_process_only = True

    def __init__(self, config: WandbConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.run: Any = None

    def on_fit_start(self, exp) -> None:
        if self.run is not None:
            return
        try:
            import wandb
        except ImportError as err:
            raise _missing("wandb", "wandb") from err
        c = self.config
        self.run = wandb.init(project=c.project, name=c.name or exp.name, mode=c.mode,
                              dir=c.dir or str(exp.output_dir), config=exp.resolved_config())

    def on_step_end(self, exp, step, metrics) -> None:
        if self.run is not None:
            self.run.log(_scalars(metrics, "train/"), step=step)

    def on_eval(self, exp, step, metrics) -> None:
        if self.run is not None:
            self.run.log(_scalars(metrics, "eval/"), step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
