"""AdapterExperiment: the training loop around a ComposedModel.

    exp = AdapterExperiment(base=TinyVideo.from_pretrained(), adapter=LatentResidual(),
                            composer=GatedResidual(), training=TrainingConfig(steps=200))
    exp.fit(loader, steps=100)      # 100 more steps; calling again continues
    exp.evaluate(val_loader, batches=4)
    exp.save("outputs/run")         # AdapterExperiment.load("outputs/run") restores it exactly
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from workbench.core.adapter import Adapter
from workbench.core.backbone import BaseVideoModel
from workbench.core.callbacks import Callback
from workbench.core.composed import ComposedModel
from workbench.core.composers import Composer, GatedResidual, Replace
from workbench.core.conditions import Batch
from workbench.core.objectives import Objective
from workbench.errors import CallbackError, CheckpointError, CompositionError, ConfigError, NonFiniteLossError
from workbench.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from workbench.train.config import ExperimentConfig, TrainingConfig, experiment_to_dict, load_yaml
from workbench.train.data import DataStream, LatentCache, is_map_dataset

HOOKS = ("on_fit_start", "on_step_start", "on_after_backward", "on_step_end", "on_eval", "on_fit_end")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device: 'cuda' was requested but no CUDA device is visible. "
                          "Use device: auto or cpu.")
    return torch.device(name)


def _mix_seed(*parts: int) -> int:
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value ^ (int(p) + 0x632BE59BD9B4E019 + (value << 6) + (value >> 2))) & (2**63 - 1)
    return value


@contextlib.contextmanager
def _defer_sigint():
    """Hold a Ctrl-C (the notebook stop button) until the block has finished."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *_: received.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def describe(obj: Any, kind: str) -> dict:
    """A ``{type, config}`` block for a component built in Python (best effort)."""
    from workbench.config import to_dict
    from workbench.registry import name_of

    cls = type(obj)
    name = name_of(kind, cls)
    block: dict[str, Any] = {"type": name or f"{cls.__module__}:{cls.__qualname__}"}
    config = getattr(obj, "config", None)
    if dataclasses.is_dataclass(config):
        block["config"] = to_dict(config)
    if kind == "composer" and hasattr(obj, "inner"):
        block.setdefault("config", {})["inner"] = describe(obj.inner, "composer")
        for attr in ("lo", "hi", "ramp", "steps"):
            if hasattr(obj, attr):
                block["config"][attr] = getattr(obj, attr)
    return block


class AdapterExperiment:
    """A frozen base, an adapter, a composer and an objective, with the loop that trains them.

    ``fit(data, steps=N)`` runs N *more* optimizer steps; a second call continues the step count,
    the LR schedule and the data order. Callbacks passed to one ``fit`` do not leak into the next.
    """

    def __init__(self, base: BaseVideoModel, adapter: Adapter, composer: Composer | None = None,
                 objective: Objective | None = None, training: TrainingConfig | None = None,
                 callbacks: Iterable[Callback] = (), name: str = "run", eval_data: Any = None,
                 config: ExperimentConfig | None = None):
        self.training = training or TrainingConfig()
        self.name = name
        self.device = resolve_device(self.training.device)
        if composer is None:  # an inside adapter's adapted base is the prediction
            composer = Replace() if adapter.inside else GatedResidual()
        objective = objective if objective is not None else base.default_objective()
        self.model = ComposedModel(base, adapter, composer, objective).to(self.device)
        adapter.condition_seed = self.training.seed
        params = self.model.trainable_parameters()  # fixed for the experiment's lifetime
        self._params = params
        if not params:
            raise CompositionError("The adapter and composer have no trainable parameters; nothing would train.")
        t = self.training
        self.optimizer = torch.optim.AdamW(params, lr=t.learning_rate, betas=tuple(t.betas),
                                           weight_decay=t.weight_decay)
        self.scaler = torch.amp.GradScaler("cuda") if t.amp_dtype == "fp16" and self.device.type == "cuda" else None
        self.step = 0
        self.loss_history: list[float] = []
        self._pending: list[tuple[int, torch.Tensor]] = []
        self.eval_data = eval_data
        self.output_dir = Path(t.output_dir or Path("outputs") / name)
        self.last_checkpoint: Path | None = None
        self.interrupted = False
        self._config = config
        self._stream: DataStream | None = None
        self._data_state: dict | None = None
        self._latent_caches: list[tuple[Any, LatentCache]] = []
        self.callbacks: list[Callback] = list(callbacks)
        if t.checkpoint_every:
            from workbench.train.callbacks import Checkpoint

            self.callbacks.append(Checkpoint(t.checkpoint_every, t.keep_last))
        self.component_callbacks: list[Callback] = [
            *base.callbacks(), *adapter.callbacks(), *composer.callbacks(), *objective.callbacks()]

    # -- construction from configs -----------------------------------------------------------
    @classmethod
    def from_config(cls, config: ExperimentConfig, **overrides) -> AdapterExperiment:
        from workbench.registry import build

        # Random inits are a function of training.seed, so a config means the same run in any process.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.training.seed)
            base = build("backbone", config.base["type"], config.base.get("config"), where="base")
            adapter = build("adapter", config.adapter["type"], config.adapter.get("config"), where="adapter")
            composer = build("composer", config.composer["type"], config.composer.get("config"), where="composer")
            objective = (build("objective", config.objective["type"], config.objective.get("config"),
                               where="objective") if config.objective else None)
        callbacks = [build("callback", c["type"], c.get("config"), where=f"callbacks[{i}]")
                     for i, c in enumerate(config.callbacks)]
        exp = cls(base=base, adapter=adapter, composer=composer, objective=objective, training=config.training,
                  callbacks=callbacks, name=config.name, config=config, **overrides)
        return exp

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> AdapterExperiment:
        """Build from a YAML file; every config problem is reported in one ConfigError."""
        return cls.from_config(load_yaml(path), **overrides)

    def resolved_config(self) -> dict:
        """The fully resolved config (what a checkpoint stores as ``config.yaml``)."""
        if self._config is not None:
            out = experiment_to_dict(dataclasses.replace(self._config, training=self.training))
        else:
            m = self.model
            out = {"name": self.name, "base": describe(m.base, "backbone"), "adapter": describe(m.adapter, "adapter"),
                   "composer": describe(m.composer, "composer"), "objective": describe(m.objective, "objective"),
                   "training": experiment_to_dict(ExperimentConfig(base={}, adapter={}, training=self.training))[
                       "training"]}
        return out

    # -- data --------------------------------------------------------------------------------
    def default_data(self) -> Any:
        if self._config is None or self._config.data is None:
            return None
        from workbench.registry import build

        block = self._config.data
        return build("dataset", block["type"], block.get("config"), where="data")

    def _cached(self, data: Any) -> Any:
        """``data`` behind its latent cache when ``training.cache_latents`` is on (one cache per dataset)."""
        if not self.training.cache_latents or not is_map_dataset(data):
            return data
        for source, cache in self._latent_caches:
            if source is data:
                return cache
        cache = LatentCache(data, self.model.base)
        self._latent_caches.append((data, cache))
        return cache

    def _stream_for(self, data: Any) -> DataStream:
        if data is None:
            if self._stream is not None:
                return self._stream
            data = self.default_data()
        data = self._cached(data)
        if self._stream is not None and self._stream.source is data:
            return self._stream
        t = self.training
        stream = DataStream(data, batch_size=t.batch_size, seed=t.seed, shuffle=t.shuffle,
                            num_workers=t.num_workers, pin_memory=self.device.type == "cuda")
        if self._data_state is not None:
            stream.load_state_dict(self._data_state)
            self._data_state = None
        self._stream = stream
        return stream

    def prepare(self, raw: Any) -> Batch:
        batch = self.model.base.prepare_batch(raw)
        return batch.to(self.device)

    # -- callbacks ---------------------------------------------------------------------------
    def _collect(self, extra: Iterable[Callback]) -> list[Callback]:
        seen, out = set(), []
        for cb in [*self.component_callbacks, *self.callbacks, *extra]:
            if not isinstance(cb, Callback):
                raise CompositionError(f"Callbacks must subclass workbench.Callback, got {type(cb).__name__}.")
            if cb.key() in seen:
                continue
            seen.add(cb.key())
            out.append(cb)
        return out

    def _call(self, callbacks: list[Callback], hook: str, *args) -> None:
        for cb in callbacks:
            if hook == "on_step_end" and not cb.due(args[0]):
                continue
            try:
                getattr(cb, hook)(self, *args)
            except (KeyboardInterrupt, NonFiniteLossError, CallbackError):
                raise
            except Exception as err:
                raise CallbackError(
                    f"Callback {type(cb).__name__} raised in {hook} at step {self.step}: "
                    f"{type(err).__name__}: {err}"
                ) from err

    # -- the loop ----------------------------------------------------------------------------
    def _generator(self, step: int, micro: int) -> torch.Generator:
        # Noise and t are a pure function of (seed, step, micro-batch): resumable, rank-independent.
        return torch.Generator(device=self.device).manual_seed(_mix_seed(self.training.seed, step, micro))

    def _autocast(self):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[self.training.amp_dtype]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _sync(self) -> None:
        """Read pending losses back from the device; stop on the first non-finite one."""
        if not self._pending:
            return
        values = torch.stack([v for _, v in self._pending]).float().cpu().tolist()
        for (step, _), value in zip(self._pending, values):
            if not math.isfinite(value):
                self._pending = []
                good = f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint else \
                    "no checkpoint was saved in this run yet"
                raise NonFiniteLossError(
                    f"Loss became {value} at step {step}; training stopped. The weights in memory are no longer "
                    f"trustworthy; {good} (left intact). Lower training.learning_rate, set clip_grad_norm, or "
                    f"check the data for NaNs, then AdapterExperiment.load(...) the checkpoint to continue."
                )
            self.loss_history.append(value)
        self._pending = []

    def _run_step(self, stream: DataStream, callbacks: list[Callback]) -> None:
        t = self.training
        step = self.step
        mark = stream.mark()
        rng = torch.get_rng_state()
        try:
            self._call(callbacks, "on_step_start", step)
            lr = t.lr_at(step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            total = None
            for micro in range(t.grad_accum):
                batch = self.prepare(stream.next())
                with self._autocast():
                    loss, _ = self.model.training_loss(batch, generator=self._generator(step, micro), step=step)
                scaled = loss / t.grad_accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                total = loss.detach() if total is None else total + loss.detach()
            self._call(callbacks, "on_after_backward", step)
            params = self._params
            with _defer_sigint():
                if self.scaler:
                    self.scaler.unscale_(self.optimizer)
                if t.clip_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, t.clip_grad_norm)
                if self.scaler:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step = step + 1
                stream.commit()
        except KeyboardInterrupt:
            if self.step == step:  # the step did not complete: undo it entirely
                self.optimizer.zero_grad(set_to_none=True)
                stream.rollback(mark)
                torch.set_rng_state(rng)
            raise
        step_loss = total / t.grad_accum
        self._pending.append((self.step, step_loss))
        if self.step % t.sync_every == 0:
            self._sync()
        self._call(callbacks, "on_step_end", self.step, {"loss": step_loss, "lr": lr, "step": self.step})

    def fit(self, data: Any = None, steps: int | None = None, callbacks: Iterable[Callback] = (),
            progress: bool | None = None) -> AdapterExperiment:
        """Train for ``steps`` more optimizer steps (default: up to ``training.steps`` in total).

        ``data``: a DataLoader / iterable of raw batch dicts, or a map-style dataset (batched with
        seeded, resumable shuffling); defaults to the config's ``data:`` block. A KeyboardInterrupt
        stops cleanly after the last completed step; call ``fit`` again to continue.
        """
        if steps is None:
            steps = max(0, self.training.steps - self.step)
        if not isinstance(steps, int) or steps < 0:
            raise ConfigError(f"fit(steps=...) must be a non-negative int, got {steps!r}.")
        stream = self._stream_for(data)
        cbs = self._collect(callbacks)
        target = self.step + steps
        show = self.training.progress if progress is None else progress
        bar = None
        if show and steps:
            from tqdm.auto import tqdm

            bar = tqdm(total=steps, desc=self.name, unit="step", leave=True)
        self.interrupted = False
        self.model.train()
        self._call(cbs, "on_fit_start")
        try:
            while self.step < target:
                before = self.step
                self._run_step(stream, cbs)
                if bar is not None:
                    bar.update(self.step - before)
                    if self.step % self.training.sync_every == 0 and self.loss_history:
                        bar.set_postfix(loss=f"{self.loss_history[-1]:.4f}")
        except KeyboardInterrupt:
            self.interrupted = True
            self._sync()
            print(f"Interrupted: stopped cleanly after step {self.step} (a partial step was discarded). "
                  f"Call fit() again to continue from there.")
        finally:
            if bar is not None:
                bar.close()
            self.model.train(False)
        self._sync()
        self._call(cbs, "on_fit_end")
        return self

    # -- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, data: Any, batches: int = 4, seed: int = 0) -> dict[str, float]:
        """Mean adapted and base-only loss over ``batches`` batches, on fixed noise draws."""
        stream = DataStream(self._cached(data), batch_size=self.training.batch_size, seed=seed, shuffle=False,
                            num_workers=self.training.num_workers)
        was = self.model.training
        self.model.train(False)
        adapted, base = [], []
        try:
            objective = self.model.objective
            for i in range(batches):
                batch = self.prepare(stream.next())
                x_t, t, target = self.model.noised(batch, self._eval_generator(seed, i))
                pred = self.model.predict(x_t, t, batch)
                adapted.append(objective.loss(pred.composed, target, batch.loss_mask))
                base.append(objective.loss(pred.base, target, batch.loss_mask))
        finally:
            self.model.train(was)
        a = float(torch.stack(adapted).mean())
        b = float(torch.stack(base).mean())
        metrics = {"loss": a, "base_loss": b, "improvement": b - a, "batches": batches}
        self._call(self._collect(()), "on_eval", self.step, metrics)
        return metrics

    def _eval_generator(self, seed: int, index: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(_mix_seed(seed, 10**9 + index))

    # -- sampling (hands off to the inspection layer) -------------------------------------------
    def sample(self, batch_or_cond: Any, steps: int | None = None, seed: int = 0, record: bool = True,
               on_step=None, **kwargs):
        """Run the backbone's own sampler with the adapter injected; returns a Trajectory."""
        from workbench.inspect.trajectory import record as record_trajectory

        batch = batch_or_cond if isinstance(batch_or_cond, Batch) else self.prepare(batch_or_cond)
        return record_trajectory(self.model, batch, steps=steps, seed=seed, record=record, on_step=on_step, **kwargs)

    def export_lora(self, path: str | Path) -> Path:
        """Write the adapter's LoRA where diffusers' pipelines load it (``pipe.load_lora_weights(path)``)."""
        export = getattr(self.model.adapter, "export_lora", None)
        if export is None:
            raise CompositionError(f"{type(self.model.adapter).__name__} has no LoRA to export; exporting a LoRA "
                                   f"needs adapter type lora, or action_modulation with a lora: block.")
        return export(path)

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "rng_cpu": torch.get_rng_state(),
                                 "step": self.step}
        if torch.cuda.is_available():
            state["rng_cuda"] = torch.cuda.get_rng_state_all()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self._stream is not None:
            state["data"] = self._stream.state_dict()
        elif self._data_state is not None:
            state["data"] = dict(self._data_state)
        return state

    def save_checkpoint(self, run_dir: str | Path | None = None, keep_last: int | None = None,
                        _pause_between_files: float = 0.0) -> Path:
        """Write a checkpoint of the current step into ``run_dir`` (default: the output directory)."""
        import yaml

        self._sync()  # never save past a non-finite loss
        path = save_checkpoint(
            run_dir or self.output_dir, self.step, trainable=self.model.trainable_state_dict(), state=self._state(),
            config_yaml=yaml.safe_dump(self.resolved_config(), sort_keys=False),
            meta={"name": self.name, "loss_history": self.loss_history,
                  "metrics": {"loss": self.loss_history[-1] if self.loss_history else None}},
            keep_last=keep_last if keep_last is not None else self.training.keep_last,
            _pause_between_files=_pause_between_files,
        )
        self.last_checkpoint = path
        return path

    def save(self, path: str | Path) -> Path:
        """Save the experiment (a checkpoint in the run directory ``path``)."""
        return self.save_checkpoint(path)

    def load_checkpoint(self, path: str | Path) -> AdapterExperiment:
        """Restore weights, optimizer, RNG and data position into this experiment."""
        ckpt = load_checkpoint(path)
        ours = self.model.trainable_state_dict()
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
        self.model.load_trainable_state_dict({k: v.to(self.device) for k, v in ckpt["trainable"].items()})
        state = ckpt["state"]
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng_cpu"])
        if "rng_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.step = int(ckpt["meta"]["step"])
        self.loss_history = list(ckpt["meta"].get("loss_history", []))
        self._pending = []
        self._stream = None
        self._data_state = state.get("data")
        self.last_checkpoint = ckpt["path"]
        return self

    @classmethod
    def load(cls, path: str | Path, **overrides) -> AdapterExperiment:
        """Rebuild an experiment from a checkpoint's own config, then restore its state."""
        import yaml

        from workbench.train.config import parse_experiment

        ckpt_dir = Path(path)
        if not (ckpt_dir / "meta.json").exists():
            ckpt_dir = latest_checkpoint(path) or ckpt_dir
        config_file = ckpt_dir / "config.yaml"
        if not config_file.exists():
            load_checkpoint(path)  # raises the precise error
        config = parse_experiment(yaml.safe_load(config_file.read_text()), source=str(config_file))
        return cls.from_config(config, **overrides).load_checkpoint(ckpt_dir)
