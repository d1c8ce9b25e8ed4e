"""Built-in callbacks: console, JSON-lines metrics, checkpoints, periodic evaluation, gradient
norm and loss history. Gate statistics are declared by gated composers themselves
(:class:`workbench.core.callbacks.GateStatistics`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.config import check, config_from
from workbench.core.callbacks import Callback, GateStatistics
from workbench.errors import ConfigError
from workbench.registry import register

__all__ = ["Callback", "Checkpoint", "Console", "GateStatistics", "GradNorm", "JsonlLogger", "LossHistory",
           "PeriodicEval"]


@dataclass
class EveryConfig:
    """The cadence every built-in callback takes."""

    every_n_steps: int = 10

    def __post_init__(self):
        check(self.every_n_steps >= 1, "every_n_steps", f"must be >= 1, got {self.every_n_steps}.")


class Configured(Callback):
    """A built-in callback: ``Callback(config=None, **overrides)`` like every component, the
    validated config kept as ``self.config`` (its ``every_n_steps`` sets the cadence)."""

    config_class: type = EveryConfig

    def __init__(self, config=None, **overrides):
        self.config = config_from(type(self), config, overrides)
        self.every_n_steps = self.config.every_n_steps

    @classmethod
    def from_config(cls, config):
        return cls(config)


def _plain(metrics: dict) -> dict:
    return {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in metrics.items()}


@register("callback", "console")
class Console(Configured):
    """Prints step, loss and learning rate every ``every_n_steps`` steps."""

    main_process_only = True

    def __init__(self, config: EveryConfig | None = None, **overrides):
        super().__init__(config, **overrides)

    def on_step_end(self, exp, step, metrics):
        m = _plain(metrics)
        print(f"step {step:>6d}  loss {m['loss']:.5f}  lr {m['lr']:.2e}", flush=True)


@dataclass
class JsonlConfig(EveryConfig):
    path: str | None = None


@register("callback", "jsonl")
class JsonlLogger(Configured):
    """Appends ``{"step", "loss", "lr", ...}`` rows (and ``{"step", "eval"}`` rows) to ``metrics.jsonl``
    in the run directory, or to ``path``."""

    config_class = JsonlConfig
    main_process_only = True

    def __init__(self, config: JsonlConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.path = Path(self.config.path) if self.config.path else None

    def _file(self, exp) -> Path:
        path = self.path or Path(exp.output_dir) / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _write(self, exp, row):
        with open(self._file(exp), "a") as f:
            f.write(json.dumps(row) + "\n")

    def on_step_end(self, exp, step, metrics):
        self._write(exp, {"step": step, **_plain(metrics)})

    def on_eval(self, exp, step, metrics):
        self._write(exp, {"step": step, "eval": _plain(metrics)})


@dataclass
class CheckpointConfig(EveryConfig):
    every_n_steps: int = 100
    keep_last: int = 3

    def __post_init__(self):
        super().__post_init__()
        check(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}.")


@register("callback", "checkpoint")
class Checkpoint(Configured):
    """Saves a checkpoint every ``every_n_steps`` steps into the run directory."""

    config_class = CheckpointConfig

    def __init__(self, config: CheckpointConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.keep_last = self.config.keep_last

    def key(self):
        return (type(self),)

    def on_step_end(self, exp, step, metrics):
        exp.save_checkpoint(keep_last=self.keep_last)


@dataclass
class EvalConfig(EveryConfig):
    every_n_steps: int = 100
    batches: int = 2

    def __post_init__(self):
        super().__post_init__()
        check(self.batches >= 1, "batches", f"must be >= 1, got {self.batches}.")


@register("callback", "periodic_eval")
class PeriodicEval(Configured):
    """Runs ``exp.evaluate(data, batches)`` every ``every_n_steps`` steps, on ``data`` or else the
    experiment's evaluation data (``eval_data=``, or the config's ``evaluation:`` block).

    Without either, ``fit`` refuses to start: an evaluation that silently never runs is a bug.
    """

    config_class = EvalConfig

    def __init__(self, config: EvalConfig | None = None, *, data: Any = None, **overrides):
        super().__init__(config, **overrides)
        self.batches = self.config.batches
        self.data = data
        self.history: list[dict] = []

    def on_fit_start(self, exp):
        if self.data is None and exp.eval_data is None:
            raise ConfigError(
                "periodic_eval has no evaluation data, so it would never evaluate. "
                "In YAML add an evaluation block: `evaluation: {split: val}` "
                "(the training data's validation split) or `evaluation: {data: {type: ..., config: ...}}`; "
                "in Python pass AdapterExperiment(..., eval_data=...) or PeriodicEval(data=...)."
            )

    def on_step_end(self, exp, step, metrics):
        data = self.data if self.data is not None else exp.eval_data
        result = exp.evaluate(data, batches=self.batches)
        self.history.append({"step": step, **result})


@register("callback", "grad_norm")
class GradNorm(Configured):
    """Records the global gradient norm (before clipping) every ``every_n_steps`` steps."""

    def __init__(self, config: EveryConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.history: list[dict] = []
        self._pending = None

    def on_after_backward(self, exp, step):
        if self.due(step + 1):
            grads = [p.grad.detach().float().norm() for p in exp.model.trainable_parameters()
                     if p.grad is not None]
            self._pending = torch.stack(grads).norm() if grads else None

    def on_step_end(self, exp, step, metrics):
        if self._pending is not None:
            self.history.append({"step": step, "grad_norm": float(self._pending)})
            self._pending = None


@dataclass
class LossHistoryConfig(EveryConfig):
    every_n_steps: int = 1


@register("callback", "loss_history")
class LossHistory(Configured):
    """Keeps ``(step, loss)`` rows every ``every_n_steps`` steps; the notebook live plot reads it."""

    config_class = LossHistoryConfig

    def __init__(self, config: LossHistoryConfig | None = None, **overrides):
        super().__init__(config, **overrides)
        self.steps: list[int] = []
        self.losses: list[float] = []

    def on_step_end(self, exp, step, metrics):
        self.steps.append(step)
        self.losses.append(float(metrics["loss"]))

    @property
    def smoothed(self) -> list[float]:
        out, avg = [], math.nan
        for v in self.losses:
            avg = v if math.isnan(avg) else 0.9 * avg + 0.1 * v
            out.append(avg)
        return out
