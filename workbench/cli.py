"""The ``workbench`` command: ``train``, ``cache-latents``, ``doctor``, ``plan`` and ``init``, plus every
registered command.

Other packages add commands through the ``workbench.commands`` entry-point group: each entry point
names a :class:`Command`. The world-model wing registers ``data``, ``demo``, ``eval``, ``pretrain``
and ``probe`` this way (see ``pyproject.toml``); a plugin does the same in its own. The library never
imports them: they are found at run time, like the components in the registry.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.metadata as md
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from workbench.errors import WorkbenchError

#: The entry-point group that adds subcommands to ``workbench``.
COMMANDS = "workbench.commands"
#: The commands the library itself defines (no registration may take these names).
BUILT_IN = ("train", "cache-latents", "doctor", "plan", "init")
#: Items per latent-cache shard unless --shard-size says otherwise.
SHARD_SIZE = 256


@dataclasses.dataclass(frozen=True)
class Command:
    """A ``workbench`` subcommand: its name, one line of help, what adds its arguments, what runs it.

    ``run(args)`` returns the exit status; a :class:`~workbench.errors.WorkbenchError` it raises is
    printed as ``error: ...`` with status 2. Register one in a package's ``pyproject.toml``::

        [project.entry-points."workbench.commands"]
        mycommand = "mypackage.cli:mycommand"     # a Command("mycommand", ...)
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    #: The optional extras the command needs, and which of their modules: ``{"data": ("h5py",)}``.
    #: ``workbench`` checks them before the command starts and names the extra to install.
    extras: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict, hash=False)


def registered_commands() -> list[Command]:
    """The commands other packages register, by name; a broken or clashing registration is an error."""
    found: dict[str, tuple[Command, str]] = {}
    for ep in sorted(md.entry_points(group=COMMANDS), key=lambda e: e.name):
        command = ep.load()
        if not isinstance(command, Command) or command.name != ep.name:
            raise WorkbenchError(f"The {COMMANDS} entry point {ep.name!r} = {ep.value!r} must name a "
                                 f"workbench.cli.Command called {ep.name!r}; it names {command!r}. Fix the "
                                 f"registering package's entry point.")
        if ep.name in BUILT_IN or ep.name in found:
            other = "workbench itself" if ep.name in BUILT_IN else found[ep.name][1]
            raise WorkbenchError(f"Two packages register the command {ep.name!r}: {ep.value} and {other}. "
                                 f"Uninstall one of them, "
                                 f"or rename the command in one package's entry point.")
        found[ep.name] = (command, ep.value)
    return [command for command, _ in found.values()]


def _train(args: argparse.Namespace) -> int:
    from workbench.train.checkpoint import latest_checkpoint
    from workbench.train.config import check_extras, load_yaml, replace_training
    from workbench.train.distributed import launched_rank
    from workbench.train.options import DataOptions, apply_data_options
    from workbench.train.runlock import hold_run

    config = apply_data_options(load_yaml(args.config), DataOptions.from_args(args), what=args.config)
    changes = {}
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.grad_accum is not None:
        changes["grad_accum"] = args.grad_accum
    output = Path(args.output) if args.output else Path("outputs") / config.name
    changes["output_dir"] = str(output)
    if args.quiet:
        changes["progress"] = False
    config = replace_training(config, **changes)
    check_extras(config, what=f"workbench train {args.config}")
    if launched_rank() != 0:  # rank 0 holds the run for every rank (only it writes there)
        return _train_run(args, config, output)
    if args.resume and not output.is_dir():
        raise _nothing_to_resume(output)
    if not output.is_dir():  # a new run: its fit holds it from the first checkpoint on
        return _train_run(args, config, output)
    then = (f"then continue the run with `{continue_train(args, output)}`" if latest_checkpoint(output)
            else "then try again")
    with hold_run(output, then=then):  # before anything of the run is read
        return _train_run(args, config, output)


def _nothing_to_resume(output: Path) -> WorkbenchError:
    return WorkbenchError(f"--resume: no checkpoint in {output}. Run without --resume to start the run.")


def _train_run(args: argparse.Namespace, config, output: Path) -> int:
    from workbench.train.checkpoint import latest_checkpoint, set_aside_after
    from workbench.train.experiment import AdapterExperiment
    from workbench.train.resume import override_names

    existing = latest_checkpoint(output)
    if args.resume:
        if existing is None:
            raise _nothing_to_resume(output)
        start = _pick_checkpoint(output, args.start) if args.start else existing
        override = override_names(args.override or [])
        if args.steps is not None:  # --steps N says, on its own, that the run's length changes
            override.add("training.steps")
        exp = AdapterExperiment.resume(start, config, override=override, source=args.config,
                                       flags={"training.steps": "--steps"})
        say = print if exp.is_main else _quiet
        if start != existing and exp.is_main:
            moved = set_aside_after(output, start)
            say(f"Resuming from {start.name}: the {len(moved)} later checkpoint(s) were moved to "
                f"{output / 'superseded'} (kept, not deleted).")
        say(f"Resuming {config.name} from {start} (step {exp.step}) up to step {config.training.steps}.")
        for change in exp.config_changes:
            if change["step"] == exp.step:
                exact = ("the continuation stays bit-exact" if change["bit_exact"]
                         else "not bit-exact from here")
                say(f"  changed {change['field']}: {change['from']} -> {change['to']} from step {exp.step} "
                    f"({exact}; recorded in the run's meta.json)")
    else:
        if args.start or args.override:
            flag = "--from" if args.start else "--override"
            raise WorkbenchError(f"{flag} goes with --resume (it says how to continue a run); "
                                 f"add --resume, or leave {flag} out to start a new run.")
        if existing is not None:
            raise WorkbenchError(
                f"{output} already holds checkpoints (latest {existing.name}). "
                f"Pass --resume to continue that run, or --output DIR to start a new one; "
                f"nothing was overwritten."
            )
        exp = AdapterExperiment.from_config(config)
        say = print if exp.is_main else _quiet
    exp.resume_hint = None  # the advice below is the command line's
    exp.resume_command = continue_train(args, output)
    try:
        exp.fit(steps=max(0, config.training.steps - exp.step))
        path = exp.save_checkpoint()
    finally:
        if exp.dist is not None:
            exp.dist.close()
    interrupted, step, dist = exp.interrupted, exp.step, exp.dist
    loss = exp.loss_history[-1] if exp.loss_history else float("nan")
    if dist is not None:  # a sharded model holds the closed group; let its threads stop before exit
        del exp
        gc.collect()
    if interrupted:
        say(f"Saved the run at step {step}: {path}")
        say(f"Continue with: {continue_train(args, output)}")
        return _interrupted_status()
    ranks = f" on {dist.world_size} ranks" if dist is not None else ""
    say(f"Finished {config.name} at step {step}{ranks}: loss {loss:.5f}. Checkpoint: {path}")
    say(next_after_train(config, output))
    return 0


def next_after_train(config, output: Path) -> str:
    """What to do with a finished run: ``workbench eval`` where the run's data are robot clips it scores (a
    LeRobot dataset, Meta-World rollouts) and the command is installed; else loading it in Python."""
    import shlex

    block = config.data or {}
    options = block.get("config") or {}
    if block.get("type") in ("lerobot", "metaworld") and "eval" in {c.name for c in registered_commands()}:
        parts = ["workbench", "eval", str(output), "--out", f"{output}_eval"]
        if options.get("control"):
            parts += ["--control", str(options["control"])]
        return f"Evaluate it with: {' '.join(shlex.quote(p) for p in parts)}"
    return f"Load it in Python with: AdapterExperiment.load({str(output)!r})"


def continue_train(args: argparse.Namespace, output: Path | str | None = None) -> str:
    """The command that continues the run ``workbench train`` was started with: its own arguments (the config,
    ``--output``, ``--steps``, ``--grad-accum``, the data options, ``--quiet``) and ``--resume``; never
    ``--from`` (which would set later checkpoints aside again) nor ``--override`` (the checkpoints carry the
    changed fields by then)."""
    import shlex

    from workbench.train.options import DataOptions

    parts = ["workbench", "train", str(args.config)]
    if output is not None or args.output:
        parts += ["--output", str(output if output is not None else args.output)]
    if args.steps is not None:
        parts += ["--steps", str(args.steps)]
    if args.grad_accum is not None:
        parts += ["--grad-accum", str(args.grad_accum)]
    parts += DataOptions.from_args(args).flags()
    parts.append("--resume")
    if args.quiet:
        parts.append("--quiet")
    return " ".join(shlex.quote(p) for p in parts)


def continue_cache(args: argparse.Namespace) -> str:
    """The command that finishes the cache ``workbench cache-latents`` was writing (the same arguments)."""
    import shlex

    from workbench.train.options import DataOptions

    parts = ["workbench", "cache-latents", str(args.config), "--out", str(args.out)]
    if args.shard_size != SHARD_SIZE:
        parts += ["--shard-size", str(args.shard_size)]
    parts += DataOptions.from_args(args).flags()
    if args.quiet:
        parts.append("--quiet")
    return " ".join(shlex.quote(p) for p in parts)


def _pick_checkpoint(output: Path, start: str) -> Path:
    """``--from``: a checkpoint of the run in ``output``, as ``step-N``, ``N`` or its directory's path."""
    from workbench.train.checkpoint import checkpoint_name, list_checkpoints

    found = {p.resolve(): p for p in list_checkpoints(output)}
    text = start.strip()
    number = text.removeprefix("step-")
    path = output / checkpoint_name(int(number)) if number.isdigit() else Path(text)
    if not number.isdigit() and not path.exists():
        path = output / text
    if path.resolve() not in found:
        have = ", ".join(p.name for p in found.values()) or "(none)"
        example = list(found.values())[-1].name if found else "step-N"
        raise WorkbenchError(f"--from {start}: not a checkpoint of the run in {output}. "
                             f"Its checkpoints: {have}. Pass one of them, e.g. --from {example}.")
    return found[path.resolve()]


def _quiet(*_args, **_kwargs) -> None:
    """What ranks other than 0 print: nothing."""


# SIGTERM (a scheduler stopping the job, `kill`) stops a run the way Ctrl-C does: after the current
# update, with the run saved. The exit status says which signal it was (128 + its number).
_STOPPED_BY = {"signal": signal.SIGINT}


def _on_sigterm(signum, frame) -> None:
    _STOPPED_BY["signal"] = signal.SIGTERM
    signal.raise_signal(signal.SIGINT)  # taken by the loop's Ctrl-C handling (held during an update)


def _interrupted_status() -> int:
    return 128 + int(_STOPPED_BY["signal"])


def _doctor(args: argparse.Namespace) -> int:
    import platform

    import torch

    import workbench
    from workbench import extras
    from workbench.registry import KINDS

    print(f"workbench {workbench.__version__}  python {platform.python_version()}  torch {torch.__version__}")
    print(_platform_report())
    for name in ("numpy", "safetensors", "PyYAML", "h5py", "pyarrow", "av", "metaworld", "mujoco",
                 "diffusers", "ipywidgets"):
        try:
            print(f"  {name:<12} {md.version(name)}")
        except md.PackageNotFoundError:
            print(f"  {name:<12} (not installed)")
    print("extras (pip install \"grafted-workbench[EXTRA]\"):")
    commands = registered_commands()
    for extra in extras.EXTRAS:
        absent = extras.missing(extra)
        state = "installed" if not absent else f"missing {', '.join(absent)}"
        users = [f"workbench {c.name}" for c in commands if extra in c.extras]
        serves = extras.SERVES.get(extra, "")
        print(f"  {extra:<10} {state} - {serves}{'; commands: ' + ', '.join(users) if users else ''}")
    plugins = sorted({d.metadata["Name"] for d in md.distributions() if (d.metadata["Name"] or "").startswith(
        "workbench-")})
    print(f"plugins installed: {', '.join(plugins) if plugins else '(none)'}")
    for group in (*KINDS.values(), COMMANDS):
        eps = sorted(f"{e.name} ({e.value.split(':')[0]})" for e in md.entry_points(group=group))
        print(f"{group}: {', '.join(eps) if eps else '(none)'}")
    return 0


def _platform_report() -> str:
    """The devices and what they support, then what ``device: auto`` / ``dtype: auto`` resolve to."""
    from workbench.backbones.diffusers_bridge import PRECISION as DIFFUSERS
    from workbench.backbones.tiny_video import PRECISION as TINY
    from workbench.core import platform

    found = platform.detect()
    device = found.best.type

    def auto(precision) -> str:
        return str(platform.resolve_dtype("auto", device, precision=precision)).removeprefix("torch.")

    table = ", ".join(f"{name} -> {auto({device: name})}" for name in platform.DTYPE_NAMES)
    return "\n".join([
        "platform:", platform.report(found),
        f"dtype: auto on {device} takes the card's precision for {device} "
        f"where the device supports it: {table}",
        f"  tiny_video -> {auto(TINY)}; "
        f"diffusers backbones (card precision {DIFFUSERS}) -> {auto(DIFFUSERS)}",
    ])


def _plan(args: argparse.Namespace) -> int:
    import json

    from workbench.train.memory import memory_plan

    plan = memory_plan(args.config, device=args.device, memory=args.memory, steps=args.steps)
    print(json.dumps(plan.as_dict(), indent=1) if args.json else plan.table())
    return 0


def _init(args: argparse.Namespace) -> int:
    from workbench.examples import write_examples

    texts, said = {}, {}
    if args.data is not None:
        texts, said = _configs_for_dataset(args.names, args.data)
    written, kept = write_examples(args.names or None, into=args.dir, texts=texts)
    for path in written:
        print(f"wrote {path}{' ' + said[path.stem][0] if path.stem in said else ''}")
        for line in said.get(path.stem, [])[1:]:
            print(line)
    if kept:
        print(f"kept {len(kept)} that were there already (never overwritten): "
              f"{', '.join(p.name for p in kept)}")
        if any(p.stem in texts for p in kept):
            print(f"  --data {args.data} changed none of them: "
                  f"delete the file, or write it elsewhere with --dir")
    first = (written or kept)[0]
    print(f"Train one with: workbench train {first}")
    return 0


def _configs_for_dataset(names: list[str], data: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The example configs ``names`` filled in for the LeRobot dataset ``data``: the data block's root,
    window and size, the adapter's dim, and the base's frame size and frames where it names them; and,
    for each, what to tell the user (a description of the values, then notes and the next step)."""
    import json
    import shlex

    import yaml

    from workbench.data.lerobot_format import EXTRA_META, LeRobotMeta
    from workbench.data.sources import data_kind
    from workbench.errors import ConfigError, DataError
    from workbench.examples import example_configs, fill_config

    if not names:
        raise ConfigError(f"--data fills in a config for the dataset: name it, "
                          f"e.g. `workbench init own_videos --data {shlex.quote(data)}`.")
    shipped = example_configs()
    texts = {}
    if data_kind(data) != "lerobot":  # (a folder that is not a dataset is refused there, with the fix)
        raise DataError(f"--data {data}: Meta-World rollouts (HDF5), not a LeRobot dataset directory; "
                        f"the example configs that read such files name them already. `workbench data import "
                        f"FOLDER --out DATASET` writes a LeRobot dataset from your videos and action files.")
    meta = LeRobotMeta(data)
    extra_path = meta.root / EXTRA_META
    recorded = json.loads(extra_path.read_text()) if extra_path.is_file() else {}
    said: dict[str, list[str]] = {}
    for name in [n.removesuffix(".yaml") for n in names]:
        if name not in shipped:
            continue  # write_examples names it, with the examples there are
        config = yaml.safe_load(shipped[name])
        block = (config.get("data") or {})
        if block.get("type") != "lerobot":
            readers = sorted(n for n, t in shipped.items()
                             if (yaml.safe_load(t).get("data") or {}).get("type") == "lerobot")
            raise ConfigError(f"--data fills in a config that reads a LeRobot dataset (data: type: lerobot): "
                              f"{', '.join(readers)}; {name} reads {block.get('type')!r} data.")
        options = block.get("config") or {}
        actions = options.get("actions", "action")
        if actions not in meta.features:
            numeric = sorted(k for k, f in meta.features.items() if f.get("dtype") not in ("video", "image"))
            raise DataError(f"--data {data}: the dataset has no feature {actions!r} (the config's actions); "
                            f"its features: {', '.join(numeric)}. Set `actions:` in the config's data block.")
        camera = options.get("camera") or (meta.video_keys[0] if meta.video_keys else None)
        if camera not in meta.video_keys:
            raise DataError(f"--data {data}: no camera {camera!r} stored as video; cameras: "
                            f"{', '.join(meta.video_keys) or '(none)'}.")
        height, width = (int(v) for v in meta.features[camera]["shape"][:2])
        shortest = min(e.length for e in meta.episodes)
        window = int(recorded.get("window") or min(int(options.get("window", 16)), shortest))
        values = {"data": {"root": data, "window": window, "size": [height, width]},
                  "adapter": {"dim": meta.width(actions)}}
        base = {"frames": window}
        if height == width:
            base["image_size"] = height
        values["base"] = base
        filled = fill_config(shipped[name], values, optional=("base.frames", "base.image_size"))
        header = f"# Filled in for {data} by `workbench init {name} --data {shlex.quote(data)}`.\n"
        texts[name] = header + (filled.split("\n", 1)[1] if filled.startswith("# Filled in for ") else filled)
        said[name] = lines = [f"for {data}: the adapter's dim {meta.width(actions)} (its {actions!r}), "
                              f"window {window}, frames of {height}x{width}"]
        base_config = (config.get("base") or {}).get("config") or {}
        if len(meta.video_keys) > 1 and not options.get("camera"):
            lines.append(f"  note: the dataset has {len(meta.video_keys)} cameras "
                        f"({', '.join(meta.video_keys)}); add camera: NAME to the config's data block "
                        f"(the size above is {camera}'s)")
        if height != width and "image_size" in base_config:
            lines.append("  note: its base reads square frames; import the videos again with --size S S "
                        "(the base's image_size) to train on them")
        weights = str(base_config.get("weights", ""))
        if weights.endswith(".safetensors") and not Path(weights).is_file():
            lines.append(_pretrain_hint(data, weights, window, height, config))
    return texts, said


def _pretrain_hint(data: str, weights: str, window: int, size: int, config: dict) -> str:
    """The command that pretrains the base a config names (its architecture flags from the config)."""
    import shlex

    base = (config.get("base") or {}).get("config") or {}
    parts = ["workbench", "pretrain", "--data", data, "--size", str(size), "--window", str(window)]
    for key, flag in (("width", "--width"), ("depth", "--depth"), ("ae_width", "--ae-width")):
        if key in base:
            parts += [flag, str(base[key])]
    parts += ["--out", weights]
    return (f"Its base, {weights}, is not there yet; pretrain it on the dataset first "
            f"(the architecture the config names): {' '.join(shlex.quote(p) for p in parts)}")


def _cache_latents(args: argparse.Namespace) -> int:
    from workbench.train.latent_store import run

    return run(args)



def build_parser() -> argparse.ArgumentParser:
    from workbench.train.options import add_data_arguments

    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train an adapter from a YAML config")
    train.add_argument("config", help="YAML experiment config")
    train.add_argument("--steps", type=int, help="the run's total number of optimizer steps")
    train.add_argument("--grad-accum", type=int,
                       help="micro-batches per step over all ranks (training.grad_accum; "
                            "under torchrun a multiple of the number of ranks)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --output from its latest checkpoint; "
                            "the config must be the run's own (see --override)")
    train.add_argument("--from", dest="start", metavar="step-N",
                       help="with --resume: continue from this checkpoint of the run instead of the latest "
                            "(later ones are moved to superseded/)")
    train.add_argument("--override", nargs="+", metavar="FIELD",
                       help="with --resume: fields of the config that may differ from the run's "
                            "and are taken from the config (steps, learning_rate, warmup_steps, schedule, "
                            "min_lr_ratio, sync_every, checkpoint_every, keep_last, num_workers, "
                            "cache_latents, gradient_checkpointing, device, distributed, callbacks, "
                            "evaluation, name); recorded in the run")
    train.add_argument("--output", help="run directory (default outputs/<name>)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    add_data_arguments(train)
    train.set_defaults(func=_train)

    cache = sub.add_parser("cache-latents",
                           help="encode a config's data once through its frozen backbone, to disk")
    cache.add_argument("config", help="YAML experiment config (its base: and data: blocks are used)")
    cache.add_argument("--out", required=True, help="cache directory (a rerun verifies the shards there, "
                                                    "keeps the intact ones and rewrites the rest)")
    cache.add_argument("--shard-size", type=int, default=SHARD_SIZE, help="items per safetensors shard")
    cache.add_argument("--quiet", action="store_true", help="no progress bar")
    add_data_arguments(cache, dim=False)
    cache.set_defaults(func=_cache_latents)

    init = sub.add_parser("init", help="write the example configs into this folder (examples/configs/), "
                                       "so the documented commands run here",
                          description="Write the example configs that ship with workbench into "
                                      "examples/configs/ (or --dir), so commands such as "
                                      "`workbench train examples/configs/tiny.yaml` "
                                      "run outside a clone. Files already there are kept.")
    init.add_argument("names", nargs="*", metavar="NAME",
                      help="the examples to write (default: all), e.g. tiny")
    init.add_argument("--dir", default="examples/configs", help="where to write them (default: %(default)s)")
    init.add_argument("--data", metavar="DATASET",
                      help="a LeRobot dataset (what `workbench data import` wrote): fill in the named config "
                           "for it (the data block's root, window and size, the adapter's dim, the base's "
                           "frame size and frames)")
    init.set_defaults(func=_init)

    doctor = sub.add_parser("doctor",
                            help="versions, devices and what auto resolves to, plugins and entry points")
    doctor.set_defaults(func=_doctor)

    plan = sub.add_parser("plan", help="a config's memory plan on a device: weights, training state, "
                                       "activations with and without gradient checkpointing, a recording")
    plan.add_argument("config", help="YAML experiment config (its base: block is planned)")
    plan.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                      help="the device to plan for (its dtype: the card's precision there)")
    plan.add_argument("--memory", help="the device's memory, e.g. 80GiB or 24GB: says whether a step fits")
    plan.add_argument("--steps", type=int, help="sampling steps of the recording (default: the card's)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=_plan)

    for command in registered_commands():
        cmd_parser = sub.add_parser(command.name, help=command.help)
        command.add_arguments(cmd_parser)
        cmd_parser.set_defaults(func=command.run, needs=dict(command.extras))
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``workbench`` command; returns its exit status. Output cut off by its reader (``workbench ... |
    head``) ends the command quietly, with the status of a process a closed pipe stopped (141)."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit: a pipe closed meanwhile is an error this function handles
        return status
    except BrokenPipeError:
        # what is still buffered, and the interpreter's flush at exit, would fail again: write them nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # a stream without a descriptor
                os.dup2(devnull, stream.fileno())
        os.close(devnull)
        return 128 + int(getattr(signal, "SIGPIPE", 13))


def _main(argv: list[str] | None) -> int:
    try:
        parser = build_parser()
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    command = " ".join(a for a in (args.command, getattr(args, "dataset", None)) if a)
    _STOPPED_BY["signal"] = signal.SIGINT
    previous = _install(signal.SIGTERM, _on_sigterm)
    try:
        require_all(getattr(args, "needs", None) or {}, what=f"workbench {command}")
        return args.func(args)
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # an optional package missing: name the extra that brings it
        from workbench.extras import missing_module_error

        clean = missing_module_error(err, f"workbench {command}")
        if clean is None:
            raise
        print(f"error: {clean}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # (a run interrupted inside its training loop returns 130 from _train itself)
        print(f"\nInterrupted (workbench {command}).", file=sys.stderr)
        if command == "train":
            print(f"Every checkpoint written is complete (saves are atomic). "
                  f"Continue with: {continue_train(args)}",
                  file=sys.stderr)
        elif command == "cache-latents":
            print(f"The shards written are complete (each is written whole). "
                  f"Continue with: {continue_cache(args)}",
                  file=sys.stderr)
        return _interrupted_status()
    finally:
        _install(signal.SIGTERM, previous)


def require_all(needs: Mapping[str, tuple[str, ...]], what: str) -> None:
    from workbench.extras import require_all as check

    check(needs, what=what)


def _install(signum: int, handler):
    """Install a signal handler where that is possible (the main thread); returns the one replaced."""
    import threading

    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
