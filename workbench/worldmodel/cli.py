"""The wing's commands: ``workbench data import | example | metaworld | calibrate``, ``demo``, ``eval``,
``pretrain``, ``probe``.

Each is a :class:`workbench.cli.Command` registered under the ``workbench.commands`` entry-point
group (see ``pyproject.toml``), exactly as a plugin would register one: the ``workbench`` command
finds them without the library importing the wing.
"""

from __future__ import annotations

import argparse
import os
import shlex

from workbench.cli import Command


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    datasets = parser.add_subparsers(dest="dataset", required=True)
    from workbench.worldmodel import generate

    generate.add_arguments(datasets.add_parser("metaworld", help="Meta-World rollouts rendered with MuJoCo, "
                                                                 "as HDF5 or a LeRobot dataset"))
    own = datasets.add_parser(
        "import",
        help="your own videos with per-episode actions (.npy / .csv / .parquet) as a LeRobot dataset",
        description="Write a folder of episodes as a LeRobot v3.0 dataset. "
                    "Each episode is a video (NAME.mp4, or a folder NAME/ of .png / .jpg frames) "
                    "with its actions beside it as NAME.npy, NAME.csv or NAME.parquet (one row per frame), "
                    "optionally NAME.state.npy (or .csv / .parquet) and its task in NAME.txt; sub-folders "
                    "in the same layout too (episode session_2/NAME). Columns that the files name (a .csv "
                    "header, a .parquet) are matched by name. "
                    "Everything is checked before a frame is decoded.")
    own.add_argument("source", help="the folder of videos and action files")
    own.add_argument("--out", required=True, help="the dataset directory to write (new)")
    own.add_argument("--fps", type=float, help="resample every episode to this frame rate "
                                               "(default: the videos' own; needed for folders of frames)")
    own.add_argument("--size", type=int, nargs="+", metavar="PIXELS",
                     help="resize the frames: H W, or one number for square frames "
                          "(default: as recorded; the embedded tiny_video reads 64 64)")
    own.add_argument("--window", type=int,
                     help="the clip length you will train on, in frames: the shortest episode allowed "
                          "(tiny_video: 16; default: any of 2 frames or more); "
                          "`workbench init --data` reads it")
    own.add_argument("--trim", action="store_true",
                     help="cut each episode to the shorter of its frames and its action rows "
                          "instead of refusing a mismatch")
    own.add_argument("--task", help="the task of episodes without a NAME.txt (default: the folder's name)")
    own.add_argument("--camera", default="main", help="the camera's name: the video feature is "
                                                      "observation.images.CAMERA (default: %(default)s)")
    own.add_argument("--max-abs", type=float, default=1e6,
                     help="refuse action and state values beyond this magnitude, as NaN and infinities are "
                          "(default: %(default)g)")
    own.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    example = datasets.add_parser("example", help="a folder of MP4 clips with their actions to try "
                                                  "`workbench data import` on: a square moved by 2-D "
                                                  "actions, or a rendered scene with 4-D actions")
    example.add_argument("out", help="the folder to write (new)")
    example.add_argument("--scene", default="square", choices=("square", "blob", "pusher", "camera"),
                         help="square: a square moved by 2-D actions; blob: a coloured blob moved over "
                              "a table past a cube; pusher: a gripper that pushes a puck; camera: a camera "
                              "panning, zooming and rolling over a table of objects (the scenes have 4-D "
                              "actions, see workbench.data.scenes; default: %(default)s)")
    example.add_argument("--episodes", type=int, default=12, help="clips to write (default: %(default)s)")
    example.add_argument("--frames", type=int, nargs="+", metavar="N",
                         help="frames per clip, or the shortest and the longest "
                              "(default: 24 for the square, 32 60 for a scene)")
    example.add_argument("--size", type=int,
                         help="pixels per side (default: 32 for the square, 96 for a scene)")
    calibrate = datasets.add_parser("calibrate", help="add the camera calibration to a data set "
                                                      "made before it was recorded "
                                                      "(an .h5 file or a LeRobot dataset)")
    calibrate.add_argument("path", help="an .h5 file of `workbench data metaworld` "
                                        "or a LeRobot dataset directory")
    calibrate.add_argument("--like", help="for a LeRobot dataset: "
                                          "the .h5 file it was converted from (its camera)")


def _data(args: argparse.Namespace) -> int:
    from workbench.extras import require_all

    if args.dataset == "import":
        from workbench.data.importer import import_folder
        from workbench.errors import DataError

        size = args.size
        if size is not None and len(size) not in (1, 2):
            raise DataError(f"--size takes a height and a width, or one number for square frames; "
                            f"got {size}.")
        report = import_folder(args.source, args.out, fps=args.fps, size=(size * 2)[:2] if size else None,
                               window=args.window, trim=args.trim, task=args.task, camera=args.camera,
                               max_abs=args.max_abs, progress=not args.no_progress)
        print(report.summary())
        print(f"Next, a training config for it (its data block, the adapter's dim {report.action_dim}): "
              f"workbench init own_videos --data {shlex.quote(str(report.root))}")
        return 0
    if args.dataset == "example":
        return _example(args)
    from workbench.worldmodel import generate

    if args.dataset == "metaworld":  # (the other subcommands read and write LeRobot only)
        require_all({"data": SIMULATION}, what="workbench data metaworld")
    if args.dataset == "calibrate":
        calibration = generate.calibrate(args.path, like=args.like)
        fx = calibration.intrinsics[0][0]
        print(f"calibrated {args.path}: {calibration.width}x{calibration.height} pixels, "
              f"focal length {fx:.2f} px; the readers now serve it as 'camera'")
        return 0
    return generate.run(args)


def _example(args: argparse.Namespace) -> int:
    from workbench.errors import DataError

    frames = args.frames or ([24] if args.scene == "square" else [32, 60])
    if len(frames) > 2:
        raise DataError(f"--frames takes one length, or the shortest and the longest; got {frames}.")
    if args.scene == "square":
        from workbench.data.importer import write_example_folder

        if len(frames) != 1:
            raise DataError(f"--frames: the square's clips have one length; got {frames}. "
                            f"Give one number (or --scene blob, pusher or camera for lengths that vary).")
        size = args.size or 32
        out = write_example_folder(args.out, episodes=args.episodes, frames=frames[0], size=size)
        what = (f"{args.episodes} MP4 clips of {frames[0]} frames ({size}x{size}, 10 fps), "
                f"each with its 2-D actions")
    else:
        from workbench.data.scenes import ACTION_NAMES, FPS, write_scene_folder

        size = args.size or 96
        out = write_scene_folder(args.out, args.scene, episodes=args.episodes, frames=(frames[0], frames[-1]),
                                 size=size)
        what = (f"{args.episodes} MP4 clips of the {args.scene} scene, {frames[0]}-{frames[-1]} frames "
                f"({size}x{size}, {FPS[args.scene]} fps), each with its 4-D actions "
                f"({', '.join(ACTION_NAMES[args.scene])})")
    print(f"wrote {out}: {what} as .npy. Next: workbench data import {out} --out DATASET_DIR")
    return 0


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a reduced budget (for CI)")
    parser.add_argument("--output", default="outputs/demo")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--data", default="sample",
                        help="rollouts to train and evaluate on: 'sample' (default), "
                             "an .h5 file from `workbench data metaworld`, "
                             "or a LeRobot dataset directory (v2.1 / v3.0)")
    from workbench.train.options import add_data_arguments

    add_data_arguments(parser)
    parser.add_argument("--from-scratch", action="store_true",
                        help="train the from-scratch baseline "
                             "(same parameters, clips, steps; no pretrained denoiser)")
    parser.add_argument("--processes", type=int, choices=(1, 2),
                        default=2 if (os.cpu_count() or 1) >= 2 else 1,
                        help="2 (the default on two cores or more): "
                             "a second process runs the frozen base's half of each training step ahead "
                             "and predicts half the clips, with the same results as 1")


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
# `data metaworld` renders and writes
SIMULATION = ("h5py", "metaworld", "mujoco", "packaging", "pyarrow", "av")
VIDEOS = ("imageio", "imageio_ffmpeg", "PIL")  # the side-by-side MP4 / GIF

data = Command("data", "make data sets: import your videos and actions, or render Meta-World rollouts",
               _data_arguments, _data, extras={"data": ("pyarrow", "av", "PIL")})
demo = Command("demo", "the world-model demo on the embedded model", _demo_arguments, _demo,
               extras={"data": (*READS, *VIDEOS), "widgets": ("matplotlib",)})
evaluate = Command("eval", "evaluate an adapter checkpoint as a world model on held-out clips",
                   _eval_arguments, _eval, extras={"data": (*READS, *VIDEOS)})
pretrain = Command("pretrain", "pretrain or fine-tune the tiny_video backbone on videos alone (no actions): "
                               "Meta-World clips or a LeRobot dataset, and check that it carries them",
                   _pretrain_arguments, _pretrain, extras={"data": (*READS, "PIL")})
probe = Command("probe", "the hand-position probe that scores action error", _probe_arguments, _probe,
                extras={"data": READS})
