"""Experiment configs: the fixed outer YAML schema and the training settings.

```yaml
name: my-run
base:      {type: tiny_video, config: {weights: pretrained}}
adapter:   {type: latent_residual, config: {width: 32}}
composer:  {type: gated_residual}
objective: {type: flow_matching}          # optional: the backbone's own objective
training:  {steps: 200, learning_rate: 1.0e-3}
callbacks: [{type: jsonl, config: {every_n_steps: 10}}]
data:      {type: metaworld, config: {path: ..., window: 16, stride: 4}}
evaluation: {split: val}                  # optional: eval_data, read by periodic_eval
```

Every ``config:`` block is validated by its component's own dataclass; all problems are
reported in one :class:`~workbench.errors.ConfigError`, each with its path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workbench.config import (
    Problems,
    check,
    component_field,
    raise_problems,
    validate,
    validate_component_block,
)
from workbench.errors import ConfigError, did_you_mean, listing
from workbench.loop import LRSchedule
from workbench.train.context import ContextConfig
from workbench.train.distributed import DistributedConfig


@dataclass
class TrainingConfig:
    """How to train. Steps are optimizer steps (each of ``grad_accum`` micro-batches).

    Attributes:
        steps: Optimizer steps of a run.
        learning_rate: The peak learning rate (AdamW).
        weight_decay: AdamW's weight decay.
        betas: AdamW's betas, each in [0, 1).
        grad_accum: Micro-batches per step, counted over all ranks of a distributed run (each of K ranks
            takes ``grad_accum / K``), so one config means the same training at any world size.
        clip_grad_norm: The gradient norm clipped to, or null for no clipping.
        warmup_steps: Steps of linear learning-rate warmup.
        schedule: The learning rate after warmup, ``constant`` or ``cosine`` (:meth:`lr_schedule`).
        min_lr_ratio: Where ``cosine`` ends, as a fraction of ``learning_rate``, in [0, 1].
        amp_dtype: Autocast dtype (``bf16`` / ``fp16``) or null.
        seed: The seed of the adapter's init, the noise, the timesteps and the data order.
        batch_size: Clips per micro-batch.
        num_workers: DataLoader worker processes.
        cache_latents: Encode each item of a map-style dataset through the frozen base once and reuse it
            (the base's ``encode_item``): the encoder is frozen, so this only saves time, often most of a
            small adapter's step. ``true`` needs ``num_workers: 0`` (the cache lives in this process); a
            directory reads a cache ``workbench cache-latents`` wrote.
        shuffle: Shuffle the data (seeded and resumable).
        sync_every: How often the loop reads values back from the device (loss logging, NaN/inf checks);
            between those the hot path never synchronises.
        checkpoint_every: Save a checkpoint every this many steps (null: no periodic checkpoints).
        keep_last: How many checkpoints to keep.
        output_dir: Where checkpoints and the run's files go (null: ``outputs/NAME``, the run's name).
        device: ``auto`` = the best visible device (CUDA, else MPS, else CPU); a backbone whose config
            leaves its own ``device`` on ``auto`` is loaded there, in its card's precision for it.
        progress: Show a progress bar.
        gradient_checkpointing: Recompute the adapter's activations in backward instead of keeping them
            (less memory for one more adapter forward; the result is the same).
        distributed: How a ``torchrun`` launch splits the work (see :class:`DistributedConfig`).
        context: Where the training windows' context frames come from: recorded (the default), corrupted
            or the model's own (:class:`~workbench.train.context.ContextConfig`, training against drift).

    Raises:
        ConfigError: Every value out of range at once, each with its field.
    """

    steps: int = 1000
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_accum: int = 1
    clip_grad_norm: float | None = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    amp_dtype: Literal["bf16", "fp16"] | None = None
    seed: int = 0
    batch_size: int = 4
    num_workers: int = 0
    cache_latents: bool | str = False
    shuffle: bool = True
    sync_every: int = 10
    checkpoint_every: int | None = None
    keep_last: int = 3
    output_dir: str | None = None
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    progress: bool = True
    gradient_checkpointing: bool = False
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    context: ContextConfig = field(default_factory=ContextConfig)

    def __post_init__(self):
        problems = Problems()
        positive = ("steps", "grad_accum", "batch_size", "sync_every", "keep_last")
        for name in positive:
            if getattr(self, name) < 1:
                problems.add(name, f"must be >= 1, got {getattr(self, name)}.")
        if not self.learning_rate > 0:
            problems.add("learning_rate", f"must be > 0, got {self.learning_rate}.")
        if self.weight_decay < 0:
            problems.add("weight_decay", f"must be >= 0, got {self.weight_decay}.")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            problems.add("clip_grad_norm", f"must be > 0 or null, got {self.clip_grad_norm}.")
        if self.warmup_steps < 0:
            problems.add("warmup_steps", f"must be >= 0, got {self.warmup_steps}.")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.add("min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}.")
        if self.num_workers < 0:
            problems.add("num_workers", f"must be >= 0, got {self.num_workers}.")
        if self.cache_latents is True and self.num_workers:
            problems.add("cache_latents", f"needs num_workers: 0 (the cache lives in the training process), "
                                          f"got num_workers: {self.num_workers}. Set one of them off, "
                                          f"or write the cache to disk with `workbench cache-latents` "
                                          f"and set cache_latents: DIR.")
        if isinstance(self.cache_latents, str) and not self.cache_latents:
            problems.add("cache_latents", "must be true, false or a cache directory, got an empty string.")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            problems.add("checkpoint_every", f"must be >= 1 or null, got {self.checkpoint_every}.")
        if not all(0 <= b < 1 for b in self.betas):
            problems.add("betas", f"each must be in [0, 1), got {list(self.betas)}.")
        raise_problems(problems)

    def lr_schedule(self) -> LRSchedule:
        """The learning rate at each step, as :class:`~workbench.loop.LRSchedule` (the schedule every loop
        uses)."""
        return _lr_schedule(self.learning_rate, self.steps, self.warmup_steps, self.schedule,
                            self.min_lr_ratio)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based)."""
        return self.lr_schedule().lr_at(step)


@functools.lru_cache(maxsize=16)
def _lr_schedule(peak: float, steps: int, warmup: int, shape: str, floor: float) -> LRSchedule:
    # built once per setting: lr_at runs on the training loop's hot path
    return LRSchedule(peak=peak, steps=steps, warmup=warmup, shape=shape, floor=floor)


@dataclass
class EvaluationConfig:
    """What the run is evaluated on: the experiment's ``eval_data``, which ``periodic_eval`` reads.

    Exactly one of ``data`` (a dataset block of its own) or ``split`` (the training ``data:``
    block with its config's ``split`` set to this, e.g. ``val``):

    ```yaml
    evaluation: {split: val}
    evaluation: {data: {type: metaworld, config: {path: sample, window: 16, split: val}}}
    ```
    """

    data: dict | None = component_field("dataset", None)
    split: str | None = None

    def __post_init__(self):
        check((self.data is None) != (self.split is None), "data",
              "give exactly one of data (a {type, config} dataset block) "
              "or split (the training data's split, "
              f"e.g. val); got data={self.data!r}, split={self.split!r}.")

    def block(self, training_data: dict | None) -> dict:
        """The dataset block to build: ``data``, or the training data's block at ``split``."""
        if self.data is not None:
            return self.data
        return {"type": training_data["type"],
                "config": {**(training_data.get("config") or {}), "split": self.split}}


@dataclass
class ExperimentConfig:
    """The outer schema: fixed and small; components bring their own config dataclasses.

    Attributes:
        base: The backbone's ``{type, config}`` block.
        adapter: The adapter's ``{type, config}`` block.
        name: The run's name, in reports and saved runs.
        composer: The composer's ``{type, config}`` block (default: ``gated_residual``).
        objective: The objective's ``{type, config}`` block (null: the backbone's default objective).
        training: How to train.
        callbacks: Callback blocks, ``{type, config}`` each.
        data: The training dataset's ``{type, config}`` block (null: data is passed to ``fit``).
        evaluation: What the run is evaluated on (null: nothing).

    Raises:
        ConfigError: Every problem at once, each with its path.
    """

    base: dict = component_field("backbone")
    adapter: dict = component_field("adapter")
    name: str = "run"
    composer: dict = component_field("composer", {"type": "gated_residual"})
    objective: dict | None = None
    training: TrainingConfig = field(default_factory=TrainingConfig)
    callbacks: list = field(default_factory=list)
    data: dict | None = None
    evaluation: EvaluationConfig | None = None

    def __post_init__(self):
        problems = Problems()
        if not (isinstance(self.name, str) and self.name and "/" not in self.name):
            problems.add("name", f"must be a non-empty name without '/', got {self.name!r}.")
        evaluation = self.evaluation
        if evaluation is not None and evaluation.split is not None:
            if self.data is None:
                problems.add("evaluation.split", f"split: {evaluation.split} takes the training data at that "
                                                 f"split, but the config has no data: block. "
                                                 f"Add one, or give evaluation.data.")
            else:
                from workbench.registry import resolve

                dataset = resolve("dataset", self.data["type"], where="data.type")
                fields = [f.name for f in dataclasses.fields(dataset.config_class)] if getattr(
                    dataset, "config_class", None) else []
                if "split" not in fields:
                    problems.add("evaluation.split", f"dataset {self.data['type']!r} has no split setting "
                                                     f"(its config fields: {listing(fields)}); "
                                                     f"give evaluation.data, "
                                                     f"a dataset block of its own, instead.")
        for i, block in enumerate(self.callbacks):
            if block.get("type") == "periodic_eval" and evaluation is None:
                problems.add(f"callbacks[{i}]", "periodic_eval needs evaluation data, "
                                                "and the config names none: add `evaluation: {split: val}` "
                                                "(the training data's validation split) "
                                                "or `evaluation: {data: {type: ..., config: ...}}`.")
        raise_problems(problems)


OUTER_KEYS = ("name", "base", "adapter", "composer", "objective", "training", "callbacks", "data",
              "evaluation")
KINDS = {"base": "backbone", "adapter": "adapter", "composer": "composer", "objective": "objective",
         "data": "dataset"}


def parse_experiment(data: Any, source: str | None = None) -> ExperimentConfig:
    """Validate a loaded YAML mapping; every problem is reported in one ConfigError."""
    problems = Problems()
    header = f"Invalid config {source}" if source else "Invalid config"
    if not isinstance(data, Mapping):
        raise_problems([("", f"the config must be a mapping with keys {listing(OUTER_KEYS)}, "
                             f"got {type(data).__name__}.")], header=header)
    for key in data:
        if key not in OUTER_KEYS:
            hint = did_you_mean(key, OUTER_KEYS)
            problems.add(str(key), f"unknown top-level key. Allowed: {listing(OUTER_KEYS)}.{hint}")
    for key in ("base", "adapter"):
        if data.get(key) is None:
            problems.add(key, f"missing required block {{type: ..., config: {{...}}}} for the {KINDS[key]}.")
    values: dict[str, Any] = {}
    for key, kind in KINDS.items():
        if key in data and data[key] is not None:
            block = validate_component_block(kind, data[key], key, problems)
            if block is not None:
                values[key] = block
    if "name" in data:
        if isinstance(data["name"], str):
            values["name"] = data["name"]
        else:
            problems.add("name", f"expected str, got {type(data['name']).__name__} {data['name']!r}.")
    training = validate(TrainingConfig, data.get("training") or {}, "training", problems)
    if data.get("evaluation") is not None:
        values["evaluation"] = validate(EvaluationConfig, data["evaluation"], "evaluation", problems)
    callbacks = data.get("callbacks") or []
    if not isinstance(callbacks, list):
        problems.add("callbacks", f"expected a list of {{type, config}} blocks, "
                                  f"got {type(callbacks).__name__}.")
        callbacks = []
    blocks = [validate_component_block("callback", c, f"callbacks[{i}]", problems)
              for i, c in enumerate(callbacks)]
    raise_problems(problems, header=header)
    try:
        return ExperimentConfig(**values, training=training, callbacks=[b for b in blocks if b])
    except ConfigError as err:
        raise_problems(getattr(err, "problems", [("", str(err))]), header=header)
        raise


def load_yaml(path: str | Path) -> ExperimentConfig:
    """Read and validate a YAML experiment config (``yaml.safe_load`` only).

    Args:
        path: The YAML file.

    Returns:
        The validated :class:`ExperimentConfig`.

    Raises:
        ConfigError: When the file is missing or not YAML, or the config has problems; every problem at
            once, each with its path.
    """
    import yaml

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Config file not found: {path}. Pass the path of a YAML file such as "
                          f"examples/configs/tiny.yaml.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from err
    return parse_experiment(data, source=str(path))


def experiment_to_dict(config: ExperimentConfig) -> dict:
    from workbench.config import to_dict

    out = to_dict(config)
    out["training"]["betas"] = list(config.training.betas)
    return {k: v for k, v in out.items() if v is not None}


def replace_training(config: ExperimentConfig, **changes) -> ExperimentConfig:
    return dataclasses.replace(config, training=dataclasses.replace(config.training, **changes))


def check_extras(config: ExperimentConfig, what: str) -> None:
    """Refuse, before any work, a config whose components need an optional extra that is not
    installed (a component class declares them as ``requires_extras = {"data": ("h5py",)}``)."""
    from workbench.extras import require
    from workbench.registry import resolve

    blocks: list[tuple[str, str, dict | None]] = [(path, kind, getattr(config, key)) for path, kind, key in (
        ("base", "backbone", "base"), ("adapter", "adapter", "adapter"), ("composer", "composer", "composer"),
        ("objective", "objective", "objective"), ("data", "dataset", "data"))]
    if config.evaluation is not None:
        blocks.append(("evaluation.data", "dataset", config.evaluation.block(config.data) if config.data or
                       config.evaluation.data else None))
    blocks += [(f"callbacks[{i}]", "callback", block) for i, block in enumerate(config.callbacks)]
    for path, kind, block in blocks:
        if not block:
            continue
        cls = resolve(kind, block["type"], where=f"{path}.type")
        for extra, modules in (getattr(cls, "requires_extras", None) or {}).items():
            require(extra, what=f"{what} ({path}: {block['type']})", modules=modules)
