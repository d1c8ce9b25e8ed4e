"""AdapterExperiment: the training loop around a ComposedModel.

    exp = AdapterExperiment(base=TinyVideo.from_pretrained(), adapter=LatentResidual(),
                            composer=GatedResidual(), training=TrainingConfig(steps=200))
    exp.fit(loader, steps=100)      # 100 more steps; calling again continues
    exp.evaluate(val_loader, batches=4)
    exp.save("outputs/run")         # AdapterExperiment.load("outputs/run") restores it exactly

The loop is here; what it stands on has a module of its own: the data it reads and how far it has
read (:class:`~workbench.train.data.DataFeed`, ``exp.feed``), the callbacks it calls
(:mod:`workbench.train.hooks`), the checkpoints it writes and resumes from
(:mod:`workbench.train.checkpoint`, :mod:`workbench.train.resume`) and the processes it runs on
(:mod:`workbench.train.distributed`). The frozen base computed a step ahead in a second process
(:mod:`workbench.train.ahead`) stands on this module, never the reverse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from workbench.config import block_of
from workbench.core import platform
from workbench.core.adapter import Adapter
from workbench.core.backbone import BaseVideoModel, backbone_callbacks
from workbench.core.callbacks import Callback
from workbench.core.composed import ComposedModel
from workbench.core.composers import Composer, GatedResidual, Replace
from workbench.core.conditions import Batch
from workbench.core.objectives import Objective
from workbench.errors import CompositionError, ConfigError, NonFiniteLossError
from workbench.loop import SigintGuard
from workbench.train.checkpoint import LoadedCheckpoint, load_checkpoint, print_notes, save_checkpoint
from workbench.train.config import ExperimentConfig, TrainingConfig, experiment_to_dict, load_yaml
from workbench.train.context import ContextSource
from workbench.train.data import DataFeed, DataStream
from workbench.train.distributed import Distributed, local_device, shard_base
from workbench.train.hooks import Hooks
from workbench.train.placement import base_config_on, check_base_dtype
from workbench.train.provenance import BaseDigest, base_digest, check_base
from workbench.train.resume import (
    Change,
    capture_state,
    clip_ids,
    config_changes,
    config_of,
    describe_clips,
    load_optimizer_state,
    non_finite_message,
    override_names,
    record_changes,
    refuse_unless_allowed,
    restore_state,
)
from workbench.train.runlock import RunLock, hold_run
from workbench.train.seeds import StepNoise


def resolve_device(name: str) -> torch.device:
    """``training.device`` as a torch device (``auto``: the best visible, see
    :mod:`workbench.core.platform`)."""
    return platform.resolve_device(name, where="training.device")


def _on_device(batch: Batch, device: torch.device) -> bool:
    for v in (batch.latents, batch.loss_mask, *batch.cond.values()):  # (a plain loop: this runs every step)
        if isinstance(v, torch.Tensor) and v.device != device:
            return False
    return True


def autocast(amp_dtype: str | None, device: torch.device):
    """The autocast context a training step runs in.

    The frozen base's half computed ahead in a second process (:mod:`workbench.train.ahead`) runs in the
    same one, so its values are those the training process computes.

    Args:
        amp_dtype: ``training.amp_dtype``: ``"bf16"``, ``"fp16"`` or None.
        device: The device the step runs on.

    Returns:
        ``torch.autocast`` to that dtype, or a context that does nothing when ``amp_dtype`` is None.
    """
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[amp_dtype]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class AdapterExperiment:
    """A frozen base, an adapter, a composer and an objective, with the loop that trains them.

    ``fit(data, steps=N)`` runs N *more* optimizer steps; a second call continues the step count,
    the LR schedule and the data order. Callbacks passed to one ``fit`` do not leak into the next.

    Args:
        base: The frozen backbone.
        adapter: The trainable adapter.
        composer: How the adapter's output and the base's prediction combine (default: ``Replace`` for an
            inside adapter, whose adapted base is the prediction, else ``GatedResidual``).
        objective: The training objective (default: the backbone's ``default_objective()``).
        training: How to train (default: ``TrainingConfig()``).
        callbacks: Callbacks for every ``fit`` of this experiment.
        name: The run's name, in reports and the default output directory ``outputs/NAME``.
        eval_data: What periodic evaluation reads.
        config: The :class:`ExperimentConfig` it was built from (:meth:`from_config` passes it), saved with
            checkpoints so a run can be rebuilt.

    Raises:
        CompositionError: When the parts do not fit together, or nothing is trainable.
        ConfigError: When the base's dtype does not run on the chosen device.
    """

    def __init__(self, base: BaseVideoModel, adapter: Adapter, composer: Composer | None = None,
                 objective: Objective | None = None, training: TrainingConfig | None = None,
                 callbacks: Iterable[Callback] = (), name: str = "run", eval_data: Any = None,
                 config: ExperimentConfig | None = None):
        self.training = training or TrainingConfig()
        self.name = name
        self.device = resolve_device(self.training.device)
        self.dist = Distributed.setup(self.training.distributed, self.device)  # None on one process
        self._micro = self.training.grad_accum  # micro-batches per step on this process
        if self.dist is not None:
            self.device = self.dist.device
            self._micro = self.dist.split_micro_batches(self.training.grad_accum)
        if composer is None:  # an inside adapter's adapted base is the prediction
            composer = Replace() if adapter.inside else GatedResidual()
        objective = objective if objective is not None else base.default_objective()
        check_base_dtype(base, self.device)
        # A base read from files is hashed now, before anything could write them again; one without files
        # (a random init) when a checkpoint first needs its digest (see base_digest).
        self._base_digest: BaseDigest | None = base_digest(base) if base.weight_files() else None
        self.model = ComposedModel(base, adapter, composer, objective).to(self.device)
        adapter.condition_seed = self.training.seed
        self.model.checkpoint_adapter = self.training.gradient_checkpointing
        self.model.trained_context = self.training.context.label()
        params = self.model.trainable_parameters()  # fixed for the experiment's lifetime
        self._config = config
        if self.dist is not None:
            self.dist.agree_on_config(self.resolved_config())
            self.dist.broadcast_(params)  # every rank starts from rank 0's trainable weights
            if self.training.distributed.shard_base:
                self._base_digest = self.base_digest  # of whole tensors: a sharded base holds a piece of each
                shard_base(self.model.base, self.dist)
        self._params = params
        if not params:
            raise CompositionError("The adapter and composer have no trainable parameters; "
                                   "nothing would train.")
        t = self.training
        # built on first use (see ``optimizer``): an experiment loaded to sample or evaluate never needs one
        self._optimizer: torch.optim.Optimizer | None = None
        self._optimizer_state: tuple[Path, dict] | None = None  # a restored state, loaded when it is built
        if t.amp_dtype is not None:  # refuse autocast to a dtype this device cannot compute in
            platform.resolve_dtype({"bf16": "bfloat16", "fp16": "float16"}[t.amp_dtype], self.device,
                                   where="training.amp_dtype")
        self.scaler = (torch.amp.GradScaler("cuda") if t.amp_dtype == "fp16" and self.device.type == "cuda"
                       else None)
        self._noise = StepNoise(t.seed, self.device)
        #: Where the training windows' context comes from (``training.context``); ``None``: as recorded.
        self.context: ContextSource | None = (ContextSource(t.context, self.model, t.seed) if t.context.active
                                              else None)
        self.step = 0
        self.loss_history: list[float] = []
        self._pending: list[tuple[int, torch.Tensor]] = []
        # step -> what its micro-batches say of their clips (for a NaN's message)
        self._clips: dict[int, list] = {}
        self.eval_data = eval_data
        self.output_dir = Path(t.output_dir or Path("outputs") / name)
        self.last_checkpoint: Path | None = None
        self.interrupted = False
        self._run_holds: list[RunLock] | None = None  # while a fit runs: the run directories it holds
        #: What an interrupted fit prints after saying where it stopped (the CLI prints its own advice).
        self.resume_hint: str | None = "Call fit() again to continue from there."
        #: The command that continues this run from its latest checkpoint (the CLI sets it), for advice.
        self.resume_command: str | None = None
        #: Config changes made on resumes of this run: field, from, to, the step, whether bit-exact.
        self.config_changes: list[dict] = []
        self._resumed: tuple[Path, int, bool, int] | None = None  # checkpoint, step, verified, losses known
        #: The run's data as the loop reads it: streams, latent caches, the position a checkpoint records.
        self.feed = DataFeed(t, self.model, data_block=config.data if config is not None else None,
                             dist=self.dist, micro=self._micro, device=self.device)
        self.callbacks: list[Callback] = list(callbacks)
        if t.checkpoint_every:
            from workbench.train.callbacks import Checkpoint

            self.callbacks.append(Checkpoint(every_n_steps=t.checkpoint_every, keep_last=t.keep_last))
        self.component_callbacks: list[Callback] = [
            *backbone_callbacks(base), *adapter.callbacks(), *composer.callbacks(), *objective.callbacks()]

    # -- construction from configs -----------------------------------------------------------
    @classmethod
    def from_config(cls, config: ExperimentConfig, **overrides) -> AdapterExperiment:
        from workbench.config import build

        # Random inits are a function of training.seed, so a config means the same run in any process.
        device = local_device(resolve_device(config.training.device))  # (each rank loads onto its own GPU)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.training.seed)
            base = build("backbone", config.base["type"], base_config_on(config.base, device), where="base")
            adapter = build("adapter", config.adapter["type"], config.adapter.get("config"), where="adapter")
            composer = build("composer", config.composer["type"], config.composer.get("config"),
                             where="composer")
            objective = (build("objective", config.objective["type"], config.objective.get("config"),
                               where="objective") if config.objective else None)
        callbacks = [build("callback", c["type"], c.get("config"), where=f"callbacks[{i}]")
                     for i, c in enumerate(config.callbacks)]
        if config.evaluation is not None and "eval_data" not in overrides:
            block = config.evaluation.block(config.data)
            overrides["eval_data"] = build("dataset", block["type"], block.get("config"),
                                           where="evaluation.data")
        exp = cls(base=base, adapter=adapter, composer=composer, objective=objective,
                  training=config.training, callbacks=callbacks, name=config.name, config=config, **overrides)
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
            out = {"name": self.name, "base": block_of(m.base, "backbone"),
                   "adapter": block_of(m.adapter, "adapter"), "composer": block_of(m.composer, "composer"),
                   "objective": block_of(m.objective, "objective"),
                   "training": experiment_to_dict(ExperimentConfig(base={}, adapter={},
                                                                   training=self.training))["training"]}
        return out

    # -- data --------------------------------------------------------------------------------
    def default_data(self) -> Any:
        """The dataset of the config's ``data:`` block (``None`` without one): what ``fit()`` reads
        when given no data."""
        return self.feed.default()

    def prepare(self, raw: Any) -> Batch:
        batch = self.model.base.prepare_batch(raw)
        return batch if _on_device(batch, self.device) else batch.to(self.device)

    # -- callbacks ---------------------------------------------------------------------------
    def _hooks(self, extra: Iterable[Callback] = ()) -> Hooks:
        """The callbacks of a fit: the components' own, the experiment's, then ``extra``, each once."""
        return Hooks([*self.component_callbacks, *self.callbacks, *extra], main=self.is_main)

    @property
    def base_digest(self) -> BaseDigest:
        """The digest of the frozen base this experiment trains (what its checkpoints record, and what a
        checkpoint restored into it must have recorded; see :mod:`workbench.train.provenance`)."""
        if self._base_digest is None:
            own = [*self.model.adapter.state_dict(keep_vars=True).values(),
                   *self.model.composer.state_dict(keep_vars=True).values()]
            self._base_digest = base_digest(self.model.base, exclude=own)
        return self._base_digest

    @property
    def is_main(self) -> bool:
        """True on the process that logs and writes checkpoints (rank 0; the only one without torchrun)."""
        return self.dist is None or self.dist.is_main

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The AdamW optimizer of the trainable parameters, with the restored checkpoint's state.

        Built on first use: creating a torch optimizer imports ``torch._dynamo`` (seconds of CPU time), which
        an experiment loaded only to sample or evaluate never needs.
        """
        if self._optimizer is None:
            t = self.training
            self._optimizer = torch.optim.AdamW(self._params, lr=t.learning_rate, betas=tuple(t.betas),
                                                weight_decay=t.weight_decay)
        if self._optimizer_state is not None:
            path, state = self._optimizer_state
            self._optimizer_state = None
            load_optimizer_state(self._optimizer, state, path)
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer, self._optimizer_state = optimizer, None

    # -- the loop ----------------------------------------------------------------------------
    def _autocast(self):
        return autocast(self.training.amp_dtype, self.device)

    @property
    def synced_step(self) -> int:
        """The step whose loss is the last one in ``loss_history`` (losses are read back every
        ``training.sync_every`` steps, so this can trail ``step`` by up to that many)."""
        return self._pending[0][0] - 1 if self._pending else self.step

    def _sync(self) -> None:
        """Read pending losses back from the device; stop on the first non-finite one."""
        if not self._pending:
            return
        values = torch.stack([v for _, v in self._pending]).float()
        if self.dist is not None:  # a step's loss is the mean over every rank's micro-batches
            self.dist.mean_(values)
        values = values.cpu().tolist()
        clips, self._clips = self._clips, {}
        for (step, _), value in zip(self._pending, values):
            if not math.isfinite(value):
                self._pending = []
                raise NonFiniteLossError(self._non_finite_message(value, step, clips.get(step)))
            self.loss_history.append(value)
        self._pending = []

    def _non_finite_message(self, value: float, step: int, clips: list | None = None) -> str:
        right_after = self._resumed is not None and len(self.loss_history) == self._resumed[3]
        last, run_dir = self.last_checkpoint, self.output_dir
        if last is not None and not last.exists():  # deleted or set aside since: the newest left in its run
            from workbench.train.checkpoint import latest_checkpoint

            run_dir = last.parent
            last = latest_checkpoint(run_dir)
        return non_finite_message(value, step, last_checkpoint=last,
                                  resumed=self._resumed[:3] if right_after else None,
                                  clips=describe_clips(clips), run_dir=run_dir, command=self.resume_command)

    def _run_step(self, stream: DataStream, hooks: Hooks, guard: SigintGuard) -> None:
        # The hot path: anything done here per step beyond the work itself is overhead a short
        # interactive fit feels, so hooks nobody overrides are skipped, nothing is read back from
        # the device outside _sync, and nothing is allocated that a step does not need.
        t = self.training
        step = self.step
        mark = stream.mark()
        rng = torch.get_rng_state()  # (a copy of a few kB: what a Ctrl-C mid-step restores)
        try:
            if hooks.on_step_start:
                hooks.call("on_step_start", self, step)
            lr = t.lr_at(step)
            optimizer = self.optimizer
            for group in optimizer.param_groups:
                group["lr"] = lr
            total = None
            accum = self._micro  # this process's micro-batches of the step
            first = self.dist.rank * accum if self.dist is not None else 0
            training_loss, scaler = self.model.training_loss, self.scaler
            context = self.context
            clips = []
            for micro in range(accum):
                raw = stream.next()
                clips.append(clip_ids(raw))
                # The frozen base's half: computed ahead by the stream (workbench.train.ahead), or here
                # from the micro-batch's own noise draws (a pure function of the seed, step and micro).
                half = stream.base_half(step, first + micro)
                if context is None:
                    batch = self.prepare(raw)
                else:
                    if half is not None:
                        raise ConfigError(
                            f"training.context: source {context.config.source} changes the batches the "
                            f"frozen base sees, but this stream computed the base's half ahead from the "
                            f"recorded batches. Train without the base computed ahead, "
                            f"or set training.context.source: recorded.")
                    batch = self._with_context(context, stream, raw, step, first + micro)
                generator = None if half is not None else self._noise.generator(step, first + micro)
                if t.amp_dtype is None:  # (no autocast context to enter and leave)
                    loss, _ = training_loss(batch, generator=generator, step=step, base_half=half)
                else:
                    with self._autocast():
                        loss, _ = training_loss(batch, generator=generator, step=step, base_half=half)
                # (a division by 1 would be one more op, same values)
                scaled = loss / accum if accum > 1 else loss
                (scaler.scale(scaled) if scaler else scaled).backward()
                total = loss.detach() if total is None else total + loss.detach()
            step_loss = total / accum if accum > 1 else total
            if self.dist is not None:
                self.dist.average_gradients_(self._params)
            if hooks.on_after_backward:
                hooks.call("on_after_backward", self, step)
            guard.holding = True  # a Ctrl-C from here on waits until the update is complete
            try:
                if scaler:
                    scaler.unscale_(optimizer)
                if t.clip_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(self._params, t.clip_grad_norm)
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                self.step = step + 1
                stream.commit()
                self._pending.append((step + 1, step_loss))
                self._clips[step + 1] = clips
            except BaseException:
                guard.holding = False
                raise
            guard.release()  # raises the Ctrl-C held during the update, if one came
        except KeyboardInterrupt:
            if self.step == step:  # the step did not complete: undo it entirely
                self.optimizer.zero_grad(set_to_none=True)
                stream.rollback(mark)
                torch.set_rng_state(rng)
            raise
        done = step + 1
        if done % t.sync_every == 0:
            self._sync()
        if hooks.on_step_end:
            due = [cb for cb in hooks.on_step_end if cb.due(done)]
            if due:
                # what the callbacks see is the run's loss (every rank has the same list)
                if self.dist is not None:
                    step_loss = self.dist.mean_(step_loss.clone())
                metrics = {"loss": step_loss, "lr": lr, "step": done}
                hooks.call("on_step_end", self, done, metrics, callbacks=due)

    def _with_context(self, context: ContextSource, stream: DataStream, raw: Any, step: int,
                      micro: int) -> Batch:
        """The prepared micro-batch with the context ``training.context`` says."""
        context.bind(stream.source)
        raw, level = context.apply(raw, step, micro)
        return context.finish(self.prepare(raw), level)

    def fit(self, data: Any = None, steps: int | None = None, callbacks: Iterable[Callback] = (),
            progress: bool | None = None) -> AdapterExperiment:
        """Train for ``steps`` more optimizer steps (default: up to ``training.steps`` in total).

        ``data``: a DataLoader / iterable of raw batch dicts, or a map-style dataset (batched with
        seeded, resumable shuffling); defaults to the config's ``data:`` block. A KeyboardInterrupt
        stops cleanly after the last completed step; call ``fit`` again to continue.

        Losses are read back from the device every ``training.sync_every`` steps (and when the
        fit ends) into ``loss_history``; ``on_step_end`` callbacks receive the step's loss as a
        device tensor, so a callback that reads it every step makes every step wait for the device.
        """
        if steps is None:
            steps = max(0, self.training.steps - self.step)
        if not isinstance(steps, int) or steps < 0:
            raise ConfigError(f"fit(steps=...) must be a non-negative int, got {steps!r}.")
        stream = self.feed.stream(data)
        hooks = self._hooks(callbacks)
        target = self.step + steps
        self._run_holds = []  # the runs this fit writes, held from its first checkpoint on (save_checkpoint)
        try:
            self._fit(stream, hooks, steps, target, progress)
        finally:
            holds, self._run_holds = self._run_holds, None
            for held in holds:
                held.release()
        return self

    def _fit(self, stream: DataStream, hooks: Hooks, steps: int, target: int, progress: bool | None) -> None:
        show = (self.training.progress if progress is None else progress) and self.is_main
        bar = None
        if show and steps:
            from tqdm.auto import tqdm

            bar = tqdm(total=steps, desc=self.name, unit="step", leave=True)
        self.interrupted = False
        self.model.train()
        hooks.call("on_fit_start", self)
        try:
            with SigintGuard() as guard:
                while self.step < target:
                    before = self.step
                    self._run_step(stream, hooks, guard)
                    if bar is not None:
                        bar.update(self.step - before)
                        if self.step % self.training.sync_every == 0 and self.loss_history:
                            bar.set_postfix(loss=f"{self.loss_history[-1]:.4f}")
        except KeyboardInterrupt:
            self.interrupted = True
            if bar is not None:  # the message goes on a line of its own, under the finished bar
                bar.close()
                bar = None
            self._sync()
            hint = f" {self.resume_hint}" if self.resume_hint else ""
            print(f"Interrupted: stopped cleanly after step {self.step} "
                  f"(a partial step was discarded).{hint}",
                  flush=True)
        finally:
            if bar is not None:
                bar.close()
            self.model.train(False)
        self._sync()
        hooks.call("on_fit_end", self)

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, data: Any, batches: int = 4, seed: int = 0) -> dict[str, float]:
        """Mean adapted and base-only loss over ``batches`` batches, on fixed noise draws (see
        :func:`workbench.train.validation.validation_loss`); the ``on_eval`` callbacks get the result."""
        from workbench.train.validation import validation_loss

        t = self.training
        metrics = validation_loss(self.model, self.feed.cached(data), prepare=self.prepare,
                                  batch_size=t.batch_size, device=self.device, batches=batches, seed=seed,
                                  num_workers=t.num_workers, dist=self.dist)
        self._hooks().call("on_eval", self, self.step, metrics)
        return metrics

    # -- sampling (hands off to the inspection layer) -------------------------------------------
    def sample(self, batch_or_cond: Any, steps: int | None = None, seed: int = 0, record: bool = True,
               on_step=None, **kwargs):
        """Run the backbone's own sampler with the adapter injected; returns a Trajectory."""
        from workbench.inspect.recording.trajectory import record as record_trajectory

        batch = batch_or_cond if isinstance(batch_or_cond, Batch) else self.prepare(batch_or_cond)
        return record_trajectory(self.model, batch, steps=steps, seed=seed, record=record, on_step=on_step,
                                 **kwargs)

    def export_lora(self, path: str | Path) -> Path:
        """Write the adapter's LoRA where diffusers' pipelines load it (``pipe.load_lora_weights(path)``)."""
        export = getattr(self.model.adapter, "export_lora", None)
        if export is None:
            raise CompositionError(f"{type(self.model.adapter).__name__} has no LoRA to export; "
                                   f"exporting a LoRA needs adapter type lora, "
                                   f"or action_modulation with a lora: block.")
        return export(path)

    # -- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, run_dir: str | Path | None = None, keep_last: int | None = None) -> Path:
        """Write a checkpoint of the current step into ``run_dir`` (default: the output directory)."""
        import yaml

        self._sync()  # never save past a non-finite loss
        run_dir = Path(run_dir or self.output_dir)
        if not self.is_main:  # rank 0 writes; the others hold the same state
            return run_dir
        if self._run_holds is not None and all(held.run_dir != run_dir for held in self._run_holds):
            # A fit keeps the run it writes from its first checkpoint to its end: another process that
            # starts writing there meanwhile is refused (see workbench.train.runlock).
            self._run_holds.append(hold_run(run_dir, then="then call fit() again"))
        path = save_checkpoint(
            run_dir, self.step, trainable=self.model.trainable_state_dict(),
            state=capture_state(self.optimizer, self.step, scaler=self.scaler, data=self.feed.position()),
            config_yaml=yaml.safe_dump(self.resolved_config(), sort_keys=False),
            meta={"name": self.name, "loss_history": self.loss_history,
                  "metrics": {"loss": self.loss_history[-1] if self.loss_history else None},
                  "config_changes": self.config_changes, "base": self.base_digest.record()},
            keep_last=keep_last if keep_last is not None else self.training.keep_last,
        )
        self.last_checkpoint = path
        return path

    def save(self, path: str | Path) -> Path:
        """Save the experiment (a checkpoint in the run directory ``path``)."""
        return self.save_checkpoint(path)

    def load_checkpoint(self, path: str | Path) -> AdapterExperiment:
        """Restore weights, optimizer, RNG and data position into this experiment.

        The checkpoint is verified first (see :func:`~workbench.train.checkpoint.load_checkpoint`):
        a damaged file is refused, naming the newest checkpoint of the run that verifies.
        """
        return self._restore(load_checkpoint(path))

    def _restore(self, ckpt: LoadedCheckpoint) -> AdapterExperiment:
        note = check_base(ckpt.path, ckpt.meta, self.base_digest)  # refused before anything is loaded
        if note is not None:
            ckpt.notes.append(note)
        print_notes(ckpt)
        restored = restore_state(ckpt, self.model, self._optimizer, scaler=self.scaler, device=self.device)
        if restored.optimizer_state is not None:
            self._optimizer_state = (restored.path, restored.optimizer_state)
        self.step = restored.step
        self.loss_history = restored.loss_history
        self.config_changes = restored.config_changes
        self._pending = []
        self._clips = {}
        self.feed.restore(restored.data_state)
        self.last_checkpoint = restored.path
        self._resumed = (restored.path, restored.step, restored.verified, len(self.loss_history))
        return self

    @classmethod
    def load(cls, path: str | Path, *, use: str | None = None, **overrides) -> AdapterExperiment:
        """Rebuild an experiment from a checkpoint's own config, then restore its state.

        ``training=TrainingConfig(...)`` replaces the saved training settings (e.g. more steps); the
        fields it changes are recorded in ``config_changes`` (and the checkpoints' ``meta.json``).
        To check a whole config against the run's, the way ``workbench train --resume`` does, use
        :meth:`resume`. ``use``: what a damaged checkpoint's error advises doing with the newest one
        that verifies (a format string of ``{checkpoint}``; default: continuing the run from it).
        """
        ckpt = load_checkpoint(path, use=use)
        config = config_of(ckpt)
        changes: list[Change] = []
        if overrides.get("training") is not None:  # e.g. more steps, or another world size's settings
            wanted = dataclasses.replace(config, training=overrides.pop("training"))
            changes, config = config_changes(config, wanted), wanted
        exp = cls.from_config(config, **overrides)._restore(ckpt)
        exp._record(changes, saved=ckpt)
        return exp

    @classmethod
    def resume(cls, path: str | Path, config: ExperimentConfig, *, override: Iterable[str] = (),
               source: str = "the config", flags: dict[str, str] | None = None,
               **overrides) -> AdapterExperiment:
        """Continue the run of the checkpoint ``path`` (a run directory: its latest) with ``config``.

        ``config`` is compared with the config the checkpoint was saved with. Identical: the run
        continues bit-exactly. Different: a :class:`ConfigError` lists every differing field with
        both values, unless each is a field that may change (see
        :data:`workbench.train.resume.RESUMABLE`) named in ``override`` (``training.learning_rate``
        or ``learning_rate``); the changes are then recorded in ``config_changes``.

        Examples:
            >>> from workbench.train.config import load_yaml
            >>> config = load_yaml("examples/configs/tiny.yaml")      # training.steps: 20
            >>> first = AdapterExperiment.from_config(config)
            >>> first.fit(steps=2, progress=False).save_checkpoint("outputs/tiny").name
            'step-0000002'
            >>> config.training = dataclasses.replace(config.training, steps=40)
            >>> exp = AdapterExperiment.resume("outputs/tiny", config, override=["training.steps"])
            >>> exp.step, exp.config_changes
            (2, [{'step': 2, 'field': 'training.steps', 'from': 20, 'to': 40, 'bit_exact': True}])
        """
        ckpt = load_checkpoint(path)
        saved = config_of(ckpt)
        changes = config_changes(saved, config)
        refuse_unless_allowed(changes, override_names(override), run=str(ckpt.path), source=source,
                              flags=flags)
        exp = cls.from_config(config, **overrides)._restore(ckpt)
        exp._record(changes, saved=ckpt, saved_config=saved)
        return exp

    def _record(self, changes: list[Change], saved: LoadedCheckpoint,
                saved_config: ExperimentConfig | None = None) -> None:
        if not changes:
            return
        if saved_config is None:
            saved_config = config_of(saved)
        self.config_changes = [*self.config_changes,
                               *record_changes(changes, self.step, saved_config.training, self.training)]
