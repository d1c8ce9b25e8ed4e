"""The wing's commands: ``workbench data metaworld | calibrate``, ``demo``, ``eval``, ``pretrain``, ``probe``.

Each is a :class:`workbench.cli.Command` registered under the ``workbench.commands`` entry-point
group (see ``pyproject.toml``), exactly as a plugin would register one: the ``workbench`` command
finds them without the library importing the wing.
"""

from __future__ import annotations

import argparse

from workbench.cli import Command


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    datasets = parser.add_subparsers(dest="dataset", required=True)
    from workbench.worldmodel import generate

    generate.add_arguments(datasets.add_parser("metaworld", help="Meta-World rollouts rendered with MuJoCo, as HDF5 "
                                                                 "or a LeRobot dataset"))
    calibrate = datasets.add_parser("calibrate", help="add the camera calibration to a data set made before it "
                                                      "was recorded (an .h5 file or a LeRobot dataset)")
    calibrate.add_argument("path", help="an .h5 file of `workbench data metaworld` or a LeRobot dataset directory")
    calibrate.add_argument("--like", help="for a LeRobot dataset: the .h5 file it was converted from (its camera)")


def _data(args: argparse.Namespace) -> int:
    from workbench.worldmodel import generate

    if args.dataset == "calibrate":
        calibration = generate.calibrate(args.path, like=args.like)
        fx = calibration.intrinsics[0][0]
        print(f"calibrated {args.path}: {calibration.width}x{calibration.height} pixels, focal length {fx:.2f} px; "
              f"the readers now serve it as 'camera'")
        return 0
    return generate.run(args)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a reduced budget (for CI)")
    parser.add_argument("--output", default="outputs/demo")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--data", default="sample",
                        help="rollouts to train and evaluate on: 'sample' (default), an .h5 file from `workbench data "
                             "metaworld`, or a LeRobot dataset directory (v2.1 / v3.0)")
    parser.add_argument("--camera", help="with a LeRobot --data of several cameras: the video feature to use, e.g. "
                                         "observation.images.front")
    parser.add_argument("--from-scratch", action="store_true",
                        help="train the from-scratch baseline (same parameters, clips, steps; no pretrained denoiser)")


def _demo(args: argparse.Namespace) -> int:
    from workbench.worldmodel.demo import run

    return run(args)


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    from workbench.worldmodel.evaluate import add_arguments

    add_arguments(parser)


def _eval(args: argparse.Namespace) -> int:
    from workbench.worldmodel.evaluate import run

    return run(args)


def _pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    from workbench.worldmodel.pretrain import add_arguments

    add_arguments(parser)


def _pretrain(args: argparse.Namespace) -> int:
    from workbench.worldmodel.pretrain import run

    return run(args)


def _probe_arguments(parser: argparse.ArgumentParser) -> None:
    from workbench.worldmodel.probe import add_arguments

    add_arguments(parser)


def _probe(args: argparse.Namespace) -> int:
    from workbench.worldmodel.probe import run

    return run(args)


# What each command needs beyond the core (checked before it starts; `workbench doctor` lists them).
READS = ("h5py",)  # the Meta-World HDF5 files
VIDEOS = ("imageio", "imageio_ffmpeg", "PIL")  # the side-by-side MP4 / GIF

data = Command("data", "generate data sets", _data_arguments, _data,
               extras={"data": ("h5py", "metaworld", "mujoco", "packaging", "pyarrow", "av")})
demo = Command("demo", "the world-model demo on the embedded model", _demo_arguments, _demo,
               extras={"data": (*READS, *VIDEOS), "widgets": ("matplotlib",)})
evaluate = Command("eval", "evaluate an adapter checkpoint as a world model on Meta-World clips", _eval_arguments,
                   _eval, extras={"data": (*READS, *VIDEOS)})
pretrain = Command("pretrain", "pretrain the tiny_video backbone on Meta-World clips (no actions)",
                   _pretrain_arguments, _pretrain, extras={"data": READS})
probe = Command("probe", "the hand-position probe that scores action error", _probe_arguments, _probe,
                extras={"data": READS})
