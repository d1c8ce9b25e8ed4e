"""Resuming a run: what a checkpoint holds besides the weights, putting it back, and what may change.

:func:`capture_state` is what ``state.pt`` carries (optimizer, random generators, step, loss
scaler, data position); :func:`restore_state` loads a
:class:`~workbench.train.checkpoint.LoadedCheckpoint` into a model and optimizer built for it and
returns the loop's own position (:class:`Restored`).

**The resume rules.** A resume continues *the run the checkpoint belongs to*: the config it is
resumed with is compared with the config the checkpoint was saved with (:func:`config_changes`).
Identical: the continuation is bit-exact. Different: refused, each differing field listed with both
values — unless every difference is in a field that may change (:data:`RESUMABLE`) and was named
(``workbench train --resume --override FIELD``); the change is then recorded in the run (``meta.json``
``config_changes``: field, both values, the step it took effect, whether the continuation stays
bit-exact). ``training.output_dir`` and ``training.progress`` say where and how a run shows itself,
not what it computes, and are never compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.errors import CheckpointError, ConfigError
from workbench.train.checkpoint import LoadedCheckpoint, checkpoint_problem, fallback_hint, load_checkpoint

# -- what state.pt holds -------------------------------------------------------------------------


def capture_state(optimizer: torch.optim.Optimizer, step: int, *, scaler: Any = None,
                  data: Mapping[str, int] | None = None) -> dict[str, Any]:
    """``state.pt``: the optimizer, the random generators, the step, the loss scaler, the data position."""
    state: dict[str, Any] = {"optimizer": optimizer.state_dict(), "rng_cpu": torch.get_rng_state(),
                             "step": step}
    if torch.cuda.is_available():
        state["rng_cuda"] = torch.cuda.get_rng_state_all()
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if data is not None:
        state["data"] = dict(data)
    return state


@dataclass
class Restored:
    """Where the loop stands after :func:`restore_state`: what the experiment takes back."""

    path: Path
    step: int
    loss_history: list[float]
    data_state: dict | None
    config_changes: list[dict]
    verified: bool
    #: The optimizer state still to load (restored without an optimizer), else None.
    optimizer_state: dict | None = None


def restore_state(ckpt: LoadedCheckpoint, model: Any, optimizer: torch.optim.Optimizer | None, *,
                  scaler: Any = None, device: torch.device | str = "cpu") -> Restored:
    """Load ``ckpt`` into ``model`` (a :class:`~workbench.core.composed.ComposedModel`), ``optimizer``
    and ``scaler``, and set the random generators; returns the loop's position.

    With ``optimizer`` None (an experiment that has not built its optimizer yet), the optimizer state is
    checked against the model's trainable parameters and returned in :attr:`Restored.optimizer_state`, for
    :func:`load_optimizer_state` once an optimizer is built.

    The trainable weights must be exactly the model's (names and shapes); otherwise a
    :class:`CheckpointError` lists the differences and points at ``AdapterExperiment.load``.
    """
    ours = model.trainable_state_dict()
    theirs = ckpt.trainable
    shapes = [f"{k} {tuple(theirs[k].shape)} vs {tuple(v.shape)}" for k, v in ours.items()
              if k in theirs and theirs[k].shape != v.shape]
    if set(ours) != set(theirs) or shapes:
        raise CheckpointError(
            f"Checkpoint {ckpt.path} does not fit this experiment: {_what_differs(ckpt, model, theirs)}. "
            f"Build the experiment the checkpoint was saved with instead: "
            f"AdapterExperiment.load({str(ckpt.path)!r}) reads its config.yaml. "
            f"(Weights missing from the checkpoint: {sorted(set(ours) - set(theirs))[:5]}; "
            f"not in this experiment: {sorted(set(theirs) - set(ours))[:5]}; "
            f"shapes (saved vs built): {shapes[:3]}.)"
        )
    state = ckpt.state
    if optimizer is not None:
        load_optimizer_state(optimizer, state.get("optimizer"), ckpt.path)
    else:
        _check_optimizer_state(state.get("optimizer"), [len(list(model.trainable_parameters()))], ckpt.path)
    model.load_trainable_state_dict({k: v.to(device) for k, v in theirs.items()})
    torch.set_rng_state(state["rng_cpu"])
    if "rng_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    return Restored(path=ckpt.path, step=ckpt.step, loss_history=list(ckpt.meta.get("loss_history", [])),
                    data_state=state.get("data"), config_changes=list(ckpt.meta.get("config_changes", [])),
                    verified=ckpt.verified,
                    optimizer_state=None if optimizer is not None else state["optimizer"])


def _unfit(path: Path, why: object) -> CheckpointError:
    return CheckpointError(f"Checkpoint {path}: the optimizer state in state.pt does not fit this "
                           f"experiment's parameters ({why}). Build the experiment from the checkpoint's "
                           f"config.yaml (AdapterExperiment.load).")


def _check_optimizer_state(saved: Any, group_sizes: list[int], path: Path) -> None:
    """What loading ``saved`` into an optimizer of ``group_sizes`` parameters per group would refuse, refused
    now, before the optimizer exists."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not isinstance(saved.get("state"), dict):
        raise _unfit(path, f"expected an optimizer state dict with 'state' and 'param_groups', got "
                           f"{type(saved).__name__}{sorted(saved) if isinstance(saved, dict) else ''}")
    saved_sizes = [len(group.get("params", ())) if isinstance(group, dict) else -1 for group in groups]
    if saved_sizes != group_sizes:
        raise _unfit(path, f"parameters per group: saved {saved_sizes}, this experiment {group_sizes}")


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: Any, path: Path) -> None:
    """Load a checkpoint's optimizer state into ``optimizer``.

    Args:
        optimizer: The experiment's optimizer.
        saved: The ``optimizer`` entry of the checkpoint's ``state.pt``.
        path: The checkpoint, named in the error.

    Raises:
        CheckpointError: When the state does not fit the optimizer's parameters.
    """
    _check_optimizer_state(saved, [len(group["params"]) for group in optimizer.param_groups], path)
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise _unfit(path, err) from None


def _what_differs(ckpt: LoadedCheckpoint, model: Any, weights: Mapping[str, Any]) -> str:
    """In words: the checkpoint's adapter and composer (type and settings) against the model's, for each
    whose weights do not fit."""
    import yaml

    from workbench.config import block_of

    try:
        saved = yaml.safe_load(ckpt.config_yaml) or {}
    except yaml.YAMLError:
        saved = {}
    parts = []
    ours_weights = model.trainable_state_dict()
    for key, kind, module in (("adapter", "adapter", model.adapter),
                              ("composer", "composer", model.composer)):
        mine = {k: tuple(v.shape) for k, v in ours_weights.items() if k.startswith(f"{key}.")}
        saved_weights = {k: tuple(v.shape) for k, v in weights.items() if k.startswith(f"{key}.")}
        if mine == saved_weights:
            continue
        theirs = saved.get(key) or {}
        ours = block_of(module, kind)
        if theirs.get("type") != ours.get("type"):
            parts.append(f"it holds the weights of {kind} {theirs.get('type')!r}, this experiment has {kind} "
                         f"{ours.get('type')!r}")
            continue
        a, b = _filled(kind, theirs), ours.get("config") or {}
        changed = [f"{k}: {a.get(k)!r} saved, {b.get(k)!r} here" for k in sorted(set(a) | set(b))
                   if a.get(k) != b.get(k)]
        if changed:
            parts.append(f"its {kind} {ours.get('type')!r} was configured otherwise "
                         f"({'; '.join(changed[:4])})")
    return "; ".join(parts) or "its weights were saved for another adapter or composer configuration"


def _filled(kind: str, block: Mapping[str, Any]) -> dict:
    """A saved ``{type, config}`` block's config with its defaults filled in
    (as the built component has it)."""
    from workbench.config import to_dict
    from workbench.registry import resolve

    given = dict(block.get("config") or {})
    try:
        return to_dict(resolve(kind, block["type"]).config_class(**given))
    except Exception:  # a block that no longer builds: compare it as saved
        return given


def config_of(ckpt: LoadedCheckpoint):
    """The :class:`ExperimentConfig` a (verified) checkpoint was saved with."""
    import yaml

    from workbench.train.config import parse_experiment

    source = str(ckpt.path / "config.yaml")
    try:
        data = yaml.safe_load(ckpt.config_yaml)
    except yaml.YAMLError as err:
        raise CheckpointError(f"Checkpoint {ckpt.path}: config.yaml is not valid YAML ({err}).") from None
    return parse_experiment(data, source=source)


def saved_config(path: str | Path):
    """``(checkpoint directory, parsed ExperimentConfig)`` of a checkpoint or of a run directory's latest
    (verified first: a damaged checkpoint is refused before its config is read)."""
    ckpt = load_checkpoint(path)
    return ckpt.path, config_of(ckpt)


# -- what a resume may change ----------------------------------------------------------------------

#: Never compared: where a run writes and whether it draws a progress bar.
IGNORED = ("training.output_dir", "training.progress")

#: Fields a resume may change when named with ``--override``: field → what the change does. A
#: field listed as a prefix (``callbacks``) covers everything under it.
RESUMABLE: dict[str, str] = {
    "name": "the run's label only",
    "training.steps": "the run's length; bit-exact unless the learning-rate schedule depends on it (cosine)",
    "training.learning_rate": "the learning rate from this step on (not bit-exact)",
    "training.warmup_steps": ("the learning-rate warmup "
                              "(bit-exact only when no remaining step's rate changes)"),
    "training.schedule": "the learning-rate schedule (bit-exact only when no remaining step's rate changes)",
    "training.min_lr_ratio": ("the cosine schedule's floor "
                              "(bit-exact only when no remaining step's rate changes)"),
    "training.sync_every": "how often losses are read back: bit-exact",
    "training.checkpoint_every": "checkpoint cadence: bit-exact",
    "training.keep_last": "how many checkpoints are kept: bit-exact",
    "training.num_workers": "data-loading processes: bit-exact (the order is the sampler's)",
    "training.cache_latents": ("where encoded items come from: "
                               "bit-exact (the cache holds the encoder's output)"),
    "training.gradient_checkpointing": "memory for recomputation: bit-exact",
    "training.device": "the device (not bit-exact: another device rounds differently)",
    "training.distributed": "how ranks share the work (not bit-exact across strategies and world sizes)",
    "training.context": ("where the training windows' context frames come from, "
                         "from this step on (not bit-exact)"),
    "callbacks": "logging and periodic evaluation: bit-exact for the built-in callbacks",
    "evaluation": "what periodic evaluation reads: bit-exact",
}

#: Why the other fields cannot change, by prefix (the first that matches).
FIXED: dict[str, str] = {
    "base": "the frozen base the checkpoint's weights were trained on",
    "adapter": "the adapter the checkpoint's weights belong to",
    "composer": "the composer the checkpoint's weights belong to",
    "objective": "what the run's loss means",
    "data": "the data the run reads (its position in the data belongs to it)",
    "training.seed": "the run's noise draws and data order",
    "training.batch_size": "the run's batches (its data position counts them)",
    "training.grad_accum": "the micro-batches of every step",
    "training.shuffle": "the run's data order",
    "training.betas": "the optimizer's arithmetic (the saved optimizer state carries the run's)",
    "training.weight_decay": "the optimizer's arithmetic (the saved optimizer state carries the run's)",
    "training.clip_grad_norm": "every update's clipping",
    "training.amp_dtype": "the precision every step computes in",
}


@dataclass(frozen=True)
class Change:
    """One field that differs between a run's saved config and the config it is resumed with."""

    field: str
    saved: Any
    wanted: Any

    def rule(self) -> str | None:
        """The :data:`RESUMABLE` entry covering this field, or ``None`` when it may not change."""
        return _covering(self.field, RESUMABLE)

    def why_fixed(self) -> str:
        return FIXED.get(_covering(self.field, FIXED) or "", "what the run computes")


def _covering(field: str, table: Mapping[str, str]) -> str | None:
    for key in table:
        if field == key or field.startswith(key + ".") or field.startswith(key + "["):
            return key
    return None


def _normalised(config: Any) -> dict:
    """An :class:`ExperimentConfig` as plain data with every component's defaults filled in, so two
    configs that build the same run compare equal."""
    from workbench.train.config import experiment_to_dict

    data = experiment_to_dict(config)
    for key, kind in (("base", "backbone"), ("adapter", "adapter"), ("composer", "composer"),
                      ("objective", "objective"), ("data", "dataset")):
        if data.get(key):
            data[key] = _with_defaults(kind, data[key])
    if data.get("callbacks"):
        data["callbacks"] = [_with_defaults("callback", block) for block in data["callbacks"]]
    return data


def _with_defaults(kind: str, block: Mapping) -> dict:
    from workbench.config import Problems, to_dict, validate
    from workbench.registry import resolve

    config_class = getattr(resolve(kind, block["type"]), "config_class", None)
    config = dict(block.get("config") or {})
    if config_class is None:
        return {"type": block["type"], "config": config}
    problems = Problems()
    built = validate(config_class, config, "config", problems)
    if built is None:
        return {"type": block["type"], "config": config}
    filled = to_dict(built)
    for f in dataclasses.fields(config_class):  # nested component blocks (e.g. noise_gated's inner)
        kind_of = f.metadata.get("component_kind")
        if kind_of and isinstance(filled.get(f.name), Mapping) and "type" in filled[f.name]:
            filled[f.name] = _with_defaults(kind_of, filled[f.name])
    return {"type": block["type"], "config": filled}


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            _flatten(item, f"{path}.{key}" if path else str(key), out)
    else:
        out[path] = value


def config_changes(saved: Any, wanted: Any) -> list[Change]:
    """Every field where the config ``wanted`` differs from the run's ``saved`` config (both
    :class:`ExperimentConfig`), defaults filled in; ``callbacks`` is compared as one list."""
    a, b = _normalised(saved), _normalised(wanted)
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    for key in sorted(set(a) | set(b)):
        if key == "callbacks":
            flat_a[key], flat_b[key] = a.get(key) or [], b.get(key) or []
            continue
        _flatten(a.get(key), key, flat_a)
        _flatten(b.get(key), key, flat_b)
    changes = []
    for key in sorted(set(flat_a) | set(flat_b)):
        if key in IGNORED:
            continue
        if _plain(flat_a.get(key)) != _plain(flat_b.get(key)):
            changes.append(Change(key, flat_a.get(key), flat_b.get(key)))
    return changes


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def override_names(names: Iterable[str]) -> set[str]:
    """``--override`` arguments as full field names: ``learning_rate`` means ``training.learning_rate``;
    an unknown name is a :class:`ConfigError` listing the fields that may change."""
    out, unknown = set(), []
    for name in names:
        for part in str(name).split(","):
            part = part.strip()
            if not part:
                continue
            full = (part if part in RESUMABLE
                    else f"training.{part}" if f"training.{part}" in RESUMABLE else None)
            if full is None:
                unknown.append(part)
            else:
                out.add(full)
    if unknown:
        from workbench.errors import did_you_mean

        names = sorted(RESUMABLE) + sorted(k.removeprefix("training.") for k in RESUMABLE if "." in k)
        hint = did_you_mean(unknown[0], names)
        raise ConfigError(f"--override {', '.join(unknown)}: not a field a resume may change.{hint} "
                          f"Fields that may change: {', '.join(sorted(RESUMABLE))} "
                          f"(training.* also by their short name, e.g. learning_rate).")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "(not set)"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def refuse_unless_allowed(changes: list[Change], allowed: Iterable[str], *, run: str, source: str,
                          flags: Mapping[str, str] | None = None) -> None:
    """Raise a :class:`ConfigError` listing every change unless each is in a field that may change
    and is named in ``allowed`` (full names). ``flags`` maps fields to the command-line flag that
    sets them (``training.steps`` → ``--steps``), named in the advice."""
    allowed = set(allowed)
    flags = dict(flags or {})
    blocked = [c for c in changes if c.rule() not in allowed]
    if not blocked:
        return
    lines = []
    for c in changes:
        both = f"{_show(c.saved)} in the run, {_show(c.wanted)} in {source}"
        rule = c.rule()
        if rule is None:
            lines.append(f"  - {c.field}: {both} — cannot change on resume ({c.why_fixed()})")
        elif rule in allowed:
            lines.append(f"  - {c.field}: {both} — allowed by --override {rule.removeprefix('training.')}")
        else:
            how = f"{flags[rule]} or --override {rule.removeprefix('training.')}" if rule in flags else \
                f"--override {rule.removeprefix('training.')}"
            lines.append(f"  - {c.field}: {both} — may change with {how} ({RESUMABLE[rule]})")
    fixed = [c for c in blocked if c.rule() is None]
    may = sorted({c.rule().removeprefix("training.") for c in blocked if c.rule() is not None})
    advice = []
    if may:
        advice.append(f"to change {', '.join(may)}, pass --override {' '.join(may)}")
    if fixed:
        advice.append(f"to change {', '.join(c.field for c in fixed)}, start a new run (--output NEW_DIR) "
                      f"or put {source} back as the run has it (the run's config: {run}/config.yaml)")
    count = len(changes)
    raise ConfigError(
        f"--resume: {source} differs from the config the run was saved with ({run}) in {count} "
        f"field{'s' if count != 1 else ''}:\n" + "\n".join(lines) + "\nNothing was changed; "
        + "; ".join(advice) + "."
    )


def lr_unchanged(old: Any, new: Any, from_step: int) -> bool:
    """Whether every remaining step (from ``from_step`` to the end of either run) gets the same
    learning rate under the training settings ``old`` and ``new``."""
    end = max(old.steps, new.steps)
    return all(old.lr_at(s) == new.lr_at(s) for s in range(from_step, end))


def record_changes(changes: list[Change], step: int, old_training: Any, new_training: Any) -> list[dict]:
    """The entries ``meta.json`` keeps for ``changes`` made at ``step``: field, both values, and
    whether the continuation stays bit-exact."""
    lr_fields = ("training.steps", "training.learning_rate", "training.warmup_steps", "training.schedule",
                 "training.min_lr_ratio")
    exact_lr = lr_unchanged(old_training, new_training, step)
    out = []
    for c in changes:
        rule = c.rule()
        if rule in lr_fields:
            exact = exact_lr
        else:
            exact = rule not in ("training.device", "training.distributed", "training.context")
        out.append({"step": step, "field": c.field, "from": _plain(c.saved), "to": _plain(c.wanted),
                    "bit_exact": exact})
    return out


# -- what a non-finite loss says about the run's checkpoints ---------------------------------------


def clip_ids(raw: Any) -> tuple[Any, Any] | None:
    """What a raw batch says about its clips, kept per step for a non-finite loss's message: its
    ``episode`` and ``start`` entries as they are (read only when a loss turns out non-finite)."""
    if (not (type(raw) is dict or isinstance(raw, Mapping))  # (dict: no ABC check)
            or raw.get("episode") is None):
        return None
    return raw.get("episode"), raw.get("start")


def describe_clips(clips: list | None) -> str | None:
    """``"episode 3 (from frame 8), episode 7 (from frame 0)"`` for the micro-batches of a step, or None."""
    if not clips or any(c is None for c in clips):
        return None
    parts = []
    for episodes, starts in clips:
        episodes = torch.as_tensor(episodes).reshape(-1).tolist()
        starts = (torch.as_tensor(starts).reshape(-1).tolist() if starts is not None
                  else [None] * len(episodes))
        parts += [f"episode {e}" + (f" (from frame {s})" if s is not None else "")
                  for e, s in zip(episodes, starts)]
    return ", ".join(dict.fromkeys(parts))


def non_finite_message(value: float, step: int, *, last_checkpoint: Path | None,
                       resumed: tuple[Path, int, bool] | None = None, clips: str | None = None,
                       run_dir: Path | None = None, command: str | None = None) -> str:
    """What a non-finite loss at ``step`` means, in words.

    ``resumed`` is ``(checkpoint, step, verified)`` when the loss came right after a resume (no
    finite loss since): that checkpoint is checked first, because damaged weights are not a learning
    rate problem. Otherwise ``last_checkpoint`` (the newest that exists) is verified before it is
    called good. ``clips`` names the clips of the step's batch (see :func:`describe_clips`);
    ``command`` continues the run from its latest checkpoint (``workbench train ... --resume``).
    """
    head = (f"Loss became {value} at step {step}; training stopped. "
            f"The weights in memory are no longer trustworthy")
    batch = (f"The batch of step {step} held {clips}: look there first for values that are NaN, infinite "
             f"or far out of range (the dataset readers refuse those in the files they read)." if clips else
             f"The batch of step {step} does not say which clips it held (no 'episode' in it).")
    cures = f"{batch} If the data is sound, lower training.learning_rate or set clip_grad_norm."

    def go_on(path: Path) -> str:
        if command:
            return f"then continue from it with `{command}` (add --override learning_rate after lowering it)"
        return (f"then continue from it with AdapterExperiment.load({str(path)!r}) "
                f"(pass training=... with the lower rate) and fit() again")

    if resumed is not None:
        path, at, verified = resumed
        problem = checkpoint_problem(path)
        if problem is not None:
            return (f"{head}, and so is the checkpoint this run resumed from: {path} ({problem}). "
                    f"The cause is that file, not the learning rate. {fallback_hint(path)}")
        if verified:
            return (f"{head}. It diverged right after resuming from {path} (step {at}), whose files verify "
                    f"against their digests and whose weights are finite: the checkpoint was loaded intact, "
                    f"so the cause is the training itself (left intact). {cures} Fix that, {go_on(path)}.")
        return (f"{head}. It diverged right after resuming from {path} (step {at}), which has no digests "
                f"(written by an older workbench): its weights are finite, but damage in their low bits "
                f"cannot be ruled out. Resume from an earlier checkpoint (--from step-N) to tell the two "
                f"apart, or: {cures}")
    if last_checkpoint is None:
        where = f" (none in {run_dir})" if run_dir is not None else ""
        return (f"{head}. No checkpoint of this run exists yet{where}, so there is nothing to go back to: "
                f"find the cause, then start the run again. {cures}")
    problem = checkpoint_problem(last_checkpoint)
    if problem is None:
        return (f"{head}; the last checkpoint is {last_checkpoint} (it verifies; left intact). {cures} "
                f"Fix that, {go_on(last_checkpoint)}.")
    return (f"{head}, and the last checkpoint {last_checkpoint} does not verify ({problem}). "
            f"{fallback_hint(last_checkpoint)} {cures}")
