"""``workbench demo | eval | train | cache-latents | data | pretrain | probe | doctor``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.errors import WorkbenchError


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
    import importlib.metadata as md
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
    for group in KINDS.values():
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


def _data(args: argparse.Namespace) -> int:
    from workbench.data import metaworld_gen

    return metaworld_gen.run(args)


def _demo(args: argparse.Namespace) -> int:
    from workbench.demo import run

    return run(args)


def _cache_latents(args: argparse.Namespace) -> int:
    from workbench.train.latent_store import run

    return run(args)


def _pretrain(args: argparse.Namespace) -> int:
    from workbench.train.pretrain import run

    return run(args)


def _eval(args: argparse.Namespace) -> int:
    from workbench.evaluate import run

    return run(args)


def _probe(args: argparse.Namespace) -> int:
    from workbench.hand_probe import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
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

    data = sub.add_parser("data", help="generate data sets")
    data_sub = data.add_subparsers(dest="dataset", required=True)
    mw = data_sub.add_parser("metaworld", help="Meta-World rollouts rendered with MuJoCo, as HDF5")
    try:
        from workbench.data import metaworld_gen

        metaworld_gen.add_arguments(mw)
    except ImportError:  # pragma: no cover - the data extra is missing
        pass
    mw.set_defaults(func=_data)

    demo = sub.add_parser("demo", help="the world-model demo on the embedded model")
    demo.add_argument("--quick", action="store_true", help="a reduced budget (for CI)")
    demo.add_argument("--output", default="outputs/demo")
    demo.add_argument("--steps", type=int)
    demo.add_argument("--data", default="sample",
                      help="rollouts to train and evaluate on: 'sample' (default), an .h5 file from `workbench data "
                           "metaworld`, or a LeRobot dataset directory (v2.1 / v3.0)")
    demo.add_argument("--camera", help="with a LeRobot --data of several cameras: the video feature to use, e.g. "
                                       "observation.images.front")
    demo.add_argument("--from-scratch", action="store_true",
                      help="train the from-scratch baseline (same parameters, clips, steps; no pretrained denoiser)")
    demo.set_defaults(func=_demo)

    evaluate = sub.add_parser("eval", help="evaluate an adapter checkpoint as a world model on Meta-World clips")
    from workbench import evaluate as evaluate_module

    evaluate_module.add_arguments(evaluate)
    evaluate.set_defaults(func=_eval)

    pretrain = sub.add_parser("pretrain", help="pretrain the tiny_video backbone on Meta-World clips (no actions)")
    from workbench.train import pretrain as pretrain_module

    pretrain_module.add_arguments(pretrain)
    pretrain.set_defaults(func=_pretrain)

    probe = sub.add_parser("probe", help="the hand-position probe that scores action error")
    from workbench import hand_probe

    hand_probe.add_arguments(probe)
    probe.set_defaults(func=_probe)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
