"""What an experiment's checkpoint holds besides the trainable weights, and putting it back.

:func:`training_state` is what ``state.pt`` carries (optimizer, random generators, step, loss
scaler, data position); :func:`restore` loads a read checkpoint into an experiment built for it;
:func:`saved_config` finds the config a checkpoint was saved with, to build that experiment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.errors import CheckpointError
from workbench.train.checkpoint import latest_checkpoint, load_checkpoint


def training_state(exp) -> dict[str, Any]:
    """The optimizer, random generators, step, loss scaler and data position of ``exp``."""
    state: dict[str, Any] = {"optimizer": exp.optimizer.state_dict(), "rng_cpu": torch.get_rng_state(),
                             "step": exp.step}
    if torch.cuda.is_available():
        state["rng_cuda"] = torch.cuda.get_rng_state_all()
    if exp.scaler is not None:
        state["scaler"] = exp.scaler.state_dict()
    if exp._stream is not None:
        state["data"] = exp._stream.state_dict()
    elif exp._data_state is not None:
        state["data"] = dict(exp._data_state)
    return state


def restore(exp, ckpt: dict[str, Any]) -> None:
    """Load a checkpoint read by :func:`~workbench.train.checkpoint.load_checkpoint` into ``exp``.

    The trainable weights must be exactly the experiment's (names and shapes); otherwise a
    :class:`CheckpointError` lists the differences and points at ``AdapterExperiment.load``.
    """
    ours = exp.model.trainable_state_dict()
    theirs = ckpt["trainable"]
    shapes = [f"{k} {tuple(theirs[k].shape)} vs {tuple(v.shape)}" for k, v in ours.items()
              if k in theirs and theirs[k].shape != v.shape]
    if set(ours) != set(theirs) or shapes:
        raise CheckpointError(
            f"Checkpoint {ckpt['path']} does not fit this experiment: "
            f"missing {sorted(set(ours) - set(theirs))[:5]}, "
            f"unexpected {sorted(set(theirs) - set(ours))[:5]}, shape mismatches (saved vs built) {shapes[:3]}. "
            f"It was saved for a different adapter/composer configuration; build the experiment from the "
            f"checkpoint's config.yaml (AdapterExperiment.load) instead."
        )
    exp.model.load_trainable_state_dict({k: v.to(exp.device) for k, v in theirs.items()})
    state = ckpt["state"]
    exp.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng_cpu"])
    if "rng_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    if exp.scaler is not None and "scaler" in state:
        exp.scaler.load_state_dict(state["scaler"])
    exp.step = int(ckpt["meta"]["step"])
    exp.loss_history = list(ckpt["meta"].get("loss_history", []))
    exp._pending = []
    exp._stream = None
    exp._data_state = state.get("data")
    exp.last_checkpoint = ckpt["path"]


def saved_config(path: str | Path):
    """``(checkpoint directory, parsed ExperimentConfig)`` of a checkpoint or of a run directory's latest."""
    import yaml

    from workbench.train.config import parse_experiment

    ckpt_dir = Path(path)
    if not (ckpt_dir / "meta.json").exists():
        ckpt_dir = latest_checkpoint(path) or ckpt_dir
    config_file = ckpt_dir / "config.yaml"
    if not config_file.exists():
        load_checkpoint(path)  # raises the precise error
    return ckpt_dir, parse_experiment(yaml.safe_load(config_file.read_text()), source=str(config_file))
