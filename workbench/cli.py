"""The ``workbench`` command: ``train``, ``cache-latents`` and ``doctor``, plus every registered command.

Other packages add commands through the ``workbench.commands`` entry-point group: each entry point
names a :class:`Command`. The world-model wing registers ``data``, ``demo``, ``eval``, ``pretrain``
and ``probe`` this way (see ``pyproject.toml``); a plugin does the same in its own. The library never
imports them: they are found at run time, like the components in the registry.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import sys
from collections.abc import Callable
from pathlib import Path

from workbench.errors import WorkbenchError

#: The entry-point group that adds subcommands to ``workbench``.
COMMANDS = "workbench.commands"
#: The commands the library itself defines (no registration may take these names).
BUILT_IN = ("train", "cache-latents", "doctor")


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
                                 f"Uninstall one of them, or rename the command in one package's entry point.")
        found[ep.name] = (command, ep.value)
    return [command for command, _ in found.values()]


def _train(args: argparse.Namespace) -> int:
    from workbench.train.checkpoint import latest_checkpoint
    from workbench.train.config import load_yaml, replace_training
    from workbench.train.experiment import AdapterExperiment

    config = load_yaml(args.config)
    changes = {}
    if args.steps is not None:
        changes["steps"] = args.steps
    output = Path(args.output) if args.output else Path("outputs") / config.name
    changes["output_dir"] = str(output)
    if args.quiet:
        changes["progress"] = False
    config = replace_training(config, **changes)
    existing = latest_checkpoint(output)
    if args.resume:
        if existing is None:
            raise WorkbenchError(f"--resume: no checkpoint in {output}. Run without --resume to start the run.")
        exp = AdapterExperiment.load(existing, training=config.training)
        say = print if exp.is_main else _quiet
        say(f"Resuming {config.name} from {existing} (step {exp.step}) up to step {config.training.steps}.")
    else:
        if existing is not None:
            raise WorkbenchError(
                f"{output} already holds checkpoints (latest {existing.name}). Pass --resume to continue that "
                f"run, or --output DIR to start a new one; nothing was overwritten."
            )
        exp = AdapterExperiment.from_config(config)
        say = print if exp.is_main else _quiet
    try:
        exp.fit(steps=max(0, config.training.steps - exp.step))
        path = exp.save_checkpoint()
    finally:
        if exp.dist is not None:
            exp.dist.close()
    loss = exp.loss_history[-1] if exp.loss_history else float("nan")
    ranks = f" on {exp.dist.world_size} ranks" if exp.dist is not None else ""
    say(f"Finished {config.name} at step {exp.step}{ranks}: loss {loss:.5f}. Checkpoint: {path}")
    return 0


def _quiet(*_args, **_kwargs) -> None:
    """What ranks other than 0 print: nothing."""


def _doctor(args: argparse.Namespace) -> int:
    import platform

    import torch

    import workbench
    from workbench.registry import KINDS

    print(f"workbench {workbench.__version__}  python {platform.python_version()}  torch {torch.__version__}")
    print(_platform_report())
    for name in ("numpy", "safetensors", "PyYAML", "h5py", "pyarrow", "av", "metaworld", "mujoco", "diffusers",
                 "ipywidgets"):
        try:
            print(f"  {name:<12} {md.version(name)}")
        except md.PackageNotFoundError:
            print(f"  {name:<12} (not installed)")
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
        f"dtype: auto on {device} takes the card's precision for {device} where the device supports it: {table}",
        f"  tiny_video -> {auto(TINY)}; diffusers backbones (card precision {DIFFUSERS}) -> {auto(DIFFUSERS)}",
    ])


def _cache_latents(args: argparse.Namespace) -> int:
    from workbench.train.latent_store import run

    return run(args)



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train an adapter from a YAML config")
    train.add_argument("config", help="YAML experiment config")
    train.add_argument("--steps", type=int, help="the run's total number of optimizer steps")
    train.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output")
    train.add_argument("--output", help="run directory (default outputs/<name>)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_train)

    cache = sub.add_parser("cache-latents", help="encode a config's data once through its frozen backbone, to disk")
    cache.add_argument("config", help="YAML experiment config (its base: and data: blocks are used)")
    cache.add_argument("--out", required=True, help="cache directory (resumes if it holds part of this cache)")
    cache.add_argument("--shard-size", type=int, default=256, help="items per safetensors shard")
    cache.set_defaults(func=_cache_latents)

    doctor = sub.add_parser("doctor", help="versions, devices and what auto resolves to, plugins and entry points")
    doctor.set_defaults(func=_doctor)

    for command in registered_commands():
        cmd_parser = sub.add_parser(command.name, help=command.help)
        command.add_arguments(cmd_parser)
        cmd_parser.set_defaults(func=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
