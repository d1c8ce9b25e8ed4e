"""Your own videos in: `workbench data import`, the writer it uses, and pretraining on the result.

The guide's walk-through (docs/guides/your-own-data.md, from a folder of MP4s to a trained, evaluated
adapter and a view) runs as written in tests/test_docs_examples.py, which checks what it leaves. Here:
what the import reads, its refusals as a table (each names the file and the fix, and nothing is written),
the writer's, and pretraining on a LeRobot dataset of episodes of several lengths.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import cli

from workbench.errors import DataError

ROOT = Path(__file__).resolve().parents[1]


def test_pretrain_reads_a_lerobot_dataset_of_episodes_of_several_lengths(tmp_path, capsys):
    import lerobot_fixture

    from workbench.backbones.tiny_video import TinyVideo

    root = lerobot_fixture.write(tmp_path / "robot", "v3.0")  # episodes of 12, 9 and 15 frames, two cameras
    out = tmp_path / "base.safetensors"
    status, _, err = cli(capsys, "pretrain", "--data", root, "--from", "scratch", "--camera",
                         "observation.images.front", "--size", 16, "--window", 8, "--ae-steps", 2, "--steps", 2,
                         "--batch-size", 2, "--ae-batch-size", 2, "--width", 8, "--depth", 1, "--ae-width", 8,
                         "--out", out, "--no-progress")
    assert status == 0, err
    base = TinyVideo.from_pretrained(out)
    assert (base.config.image_size, base.config.frames) == (16, 8)
    assert base.card.recipe.trained_on.startswith("robot (a LeRobot dataset; tasks: open the drawer, pick up the red "
                                                  "block): 3 episodes of at least 9 frames, no actions")
    assert base.provenance["validation"]["data"] == str(root)  # its own validation split
    assert base.provenance["validation"]["camera"] == "observation.images.front"


# -- import: what it reads ---------------------------------------------------------------------------------------------
def video(path: Path, frames: int, size: tuple[int, int] = (16, 16), fps: float = 10, value: int = 0) -> Path:
    from workbench.data.video_io import H264Writer

    writer = H264Writer(path, fps, *size)
    writer.write(np.full((frames, *size, 3), value, np.uint8) + np.arange(frames, dtype=np.uint8)[:, None, None,
                                                                                                   None] * 8)
    writer.close()
    return path


def test_import_reads_csv_parquet_frame_folders_state_and_tasks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from workbench.data.importer import import_folder
    from workbench.data.lerobot import LeRobotClips

    src = tmp_path / "src"
    src.mkdir()
    video(src / "a.mp4", 6)
    (src / "a.csv").write_text("d_0,d_1,grip\n" + "\n".join(f"{t},{-t},0.5" for t in range(6)) + "\n")
    np.save(src / "a.state.npy", np.arange(12, dtype=np.float32).reshape(6, 2))
    (src / "a.txt").write_text("push the block\n")
    (src / "b").mkdir()
    for t in range(7):
        Image.fromarray(np.full((16, 16, 3), 30 * t, np.uint8)).save(src / "b" / f"frame_{t}.png")
    grip_b, d_b = np.linspace(-1, 1, 7).astype(np.float32), np.arange(14, dtype=np.float32).reshape(7, 2) / 4
    # a scalar column and a fixed-size list column (its names: d_0, d_1), in another order than a.csv's
    pq.write_table(pa.table({"grip": pa.array(grip_b),
                             "d": pa.FixedSizeListArray.from_arrays(pa.array(d_b.reshape(-1)), 2),
                             "note": pa.array(["text is not a per-frame number"] * 7)}), src / "b.parquet")
    np.save(src / "b.state.npy", np.zeros((7, 2), np.float32))
    report = import_folder(src, tmp_path / "out", fps=10, window=4)
    assert (report.episodes, report.frames, report.action_dim, report.state_dim) == (2, 13, 3, 2)
    info = json.loads((tmp_path / "out" / "meta" / "info.json").read_text())
    assert info["features"]["action"]["names"] == ["d_0", "d_1", "grip"]
    clips = LeRobotClips(root=str(tmp_path / "out"), window=4, stride=3, split="all")
    first = clips[0]
    assert first["task"] == "push the block" and clips.task_names == ["push the block", "src"]
    assert np.array_equal(first["action"].numpy(), np.array([[t, -t, 0.5] for t in range(4)], np.float32))
    assert np.array_equal(first["proprio"].numpy(), np.arange(8, dtype=np.float32).reshape(4, 2))
    last = clips[len(clips) - 1]  # episode b, frames 3..6: its parquet's values, as written above
    assert (last["episode"], last["start"]) == (1, 3)
    assert np.array_equal(last["action"].numpy(), np.concatenate([d_b, grip_b[:, None]], axis=1)[3:7])
    frames_b = clips[len(clips) - 2]["video"]  # the folder of .png frames, in name order: 30 * t
    assert abs(float(frames_b[0, 1].mean() - frames_b[0, 0].mean()) * 127.5 - 30) < 3


def _tables(src: Path, names: list[str], values: np.ndarray, kind: str, stem: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind == "csv":
        (src / f"{stem}.csv").write_text(",".join(names) + "\n"
                                         + "".join(",".join(f"{v:g}" for v in row) + "\n" for row in values))
    elif kind == "parquet":
        pq.write_table(pa.table({n: pa.array(values[:, i]) for i, n in enumerate(names)}), src / f"{stem}.parquet")
    else:
        np.save(src / f"{stem}.npy", values)


def test_columns_are_matched_by_name_whatever_their_order_in_each_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from workbench.data.importer import import_folder
    from workbench.data.lerobot import LeRobotClips

    src = tmp_path / "src"
    src.mkdir()
    order = ["dx", "dy", "dz", "grip"]
    recorded = {}  # each episode's actions in dx, dy, dz, grip order, each column its own range of values
    for e, (stem, kind) in enumerate([("a", "csv"), ("b", "parquet"), ("c", "parquet")]):
        video(src / f"{stem}.mp4", 6)
        recorded[e] = (np.arange(24, dtype=np.float32).reshape(6, 4) % 6 + 10 * np.arange(4) + 100 * e)
        if stem != "c":
            _tables(src, order, recorded[e], kind, stem)
    t = pa.table({n: pa.array(recorded[2][:, i]) for i, n in enumerate(order)})
    pq.write_table(t.select(["grip", "dz", "dy", "dx"]), src / "c.parquet")
    import_folder(src, tmp_path / "out", window=6)
    info = json.loads((tmp_path / "out" / "meta" / "info.json").read_text())
    assert info["features"]["action"]["names"] == order
    assert info["features"]["action"]["names_from"].startswith("column names: every episode's table named these")
    clips = LeRobotClips(root=str(tmp_path / "out"), window=6, stride=6, split="all")
    for i in range(len(clips)):
        item = clips[i]
        assert np.array_equal(item["action"].numpy(), recorded[item["episode"]]), item["episode"]
    assert float(clips[2]["action"][0, 0]) == 200.0  # c's dx (200..205), not its grip (230..235)


def test_tables_without_names_go_by_position_and_the_dataset_says_so(tmp_path):
    from workbench.data.importer import import_folder

    src = tmp_path / "src"
    src.mkdir()
    _two(src)
    import_folder(src, tmp_path / "out")
    action = json.loads((tmp_path / "out" / "meta" / "info.json").read_text())["features"]["action"]
    assert action["names"] == ["a0", "a1"]
    assert action["names_from"] == ("position: the source tables (.npy, or .csv without a header line) name no "
                                    "columns, so a0, a1, ... are their columns in stored order")


NAME_REFUSALS = [
    ("renamed", ["dx", "dy", "DZ"], "parquet",
     r"{src}/b\.parquet: the actions columns are \[dx, dy, DZ\], but a\.csv's are \[dx, dy, dz\] \(missing here: "
     r"\[dz\]; not in a\.csv: \[DZ\]\)\. Every episode's actions name the same columns \(in any order: they are "
     r"matched by name\)\. Rename or drop the columns of one of the two files"),
    ("missing", ["dz", "dx"], "csv",
     r"{src}/b\.csv: the actions columns are \[dz, dx\], but a\.csv's are \[dx, dy, dz\] "
     r"\(missing here: \[dy\]; not in a\.csv: \[\]\)"),
    ("extra", ["dx", "dy", "dz", "grip"], "parquet", r"\(missing here: \[\]; not in a\.csv: \[grip\]\)"),
    ("repeated", ["dx", "dx", "dz"], "csv",
     r"{src}/b\.csv: the actions name the column 'dx' twice \(columns \[dx, dx, dz\]\)"),
    ("no names among named", None, "npy",
     r"{src}/b\.npy: the actions name no columns \(a \.npy file, or a \.csv without a header line\), but a\.csv names "
     r"them \[dx, dy, dz\]\. .* save it with the same names \(a \.csv whose first line is dx,dy,dz, or a \.parquet\)"),
]


@pytest.mark.parametrize("case, names, kind, message", NAME_REFUSALS, ids=[r[0] for r in NAME_REFUSALS])
def test_columns_that_do_not_match_by_name_are_refused_showing_both_lists(tmp_path, case, names, kind, message):
    from workbench.data.importer import import_folder

    src = tmp_path / "src"
    src.mkdir()
    video(src / "a.mp4", 6)
    _tables(src, ["dx", "dy", "dz"], np.zeros((6, 3), np.float32), "csv", "a")
    video(src / "b.mp4", 6)
    _tables(src, names or [], np.zeros((6, len(names or "xyz")), np.float32), kind, "b")
    with pytest.raises(DataError, match=message.format(src=re.escape(str(src)))):
        import_folder(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_import_resamples_to_fps_and_resizes(tmp_path):
    from workbench.data.importer import import_folder
    from workbench.data.lerobot import LeRobotClips

    src = tmp_path / "src"
    src.mkdir()
    video(src / "a.mp4", 20, size=(16, 24), fps=20)
    np.save(src / "a.npy", np.arange(20, dtype=np.float32)[:, None])
    video(src / "b.mp4", 10, size=(16, 24), fps=10)
    np.save(src / "b.npy", np.arange(10, dtype=np.float32)[:, None])
    report = import_folder(src, tmp_path / "out", fps=10, size=(8, 12), window=2)
    assert report.fps == 10 and report.size == (8, 12) and report.frames == 20
    assert report.notes == ["1 episode(s) resampled from 20 to 10 fps (nearest frame, with its action and state)"]
    clips = LeRobotClips(root=str(tmp_path / "out"), window=10, stride=10, split="all")
    by_episode = {clips[i]["episode"]: clips[i] for i in range(len(clips))}
    assert by_episode[0]["action"][:, 0].tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]  # every other frame
    assert tuple(by_episode[0]["video"].shape) == (3, 10, 8, 12)


# -- import: what it refuses (every case names the file and the fix, and writes nothing) ------------------------------
def _two(src: Path, **override) -> None:
    video(src / "a.mp4", 6)
    np.save(src / "a.npy", np.zeros((6, 2), np.float32))
    video(src / "b.mp4", 6)
    np.save(src / "b.npy", np.zeros((6, 2), np.float32))
    for make in override.values():
        make(src)


def _bad_value(value):
    def make(src):
        actions = np.zeros((6, 2), np.float32)
        actions[4, 1] = value
        np.save(src / "b.npy", actions)
    return make


REFUSALS = [
    ("no actions", {"x": lambda s: (s / "b.npy").unlink()},
     r"{src}: 1 of 2 videos have no actions beside them \(first: 'b'; looked for b\.npy, b\.csv, b\.parquet\)\. "
     r"Add them"),
    ("a table without a video", {"x": lambda s: np.save(s / "c.npy", np.zeros((6, 2)))},
     r"{src}: c\.npy has no video of the same name .* add it, rename the table, or move it out of the folder"),
    ("two tables", {"x": lambda s: (s / "a.csv").write_text("0,0\n" * 6)},
     r"{src}: episode 'a' has 2 tables of the same values: a\.npy, a\.csv\. Keep one of them"),
    ("fewer actions than frames", {"x": lambda s: np.save(s / "b.npy", np.zeros((5, 2), np.float32))},
     r"{src}/b\.npy: 5 rows of actions, but b\.mp4 has 6 frames\. Row t holds the actions at frame t, so an episode "
     r"has one row per frame\. Fix the file .* or pass --trim"),
    ("more actions than frames", {"x": lambda s: np.save(s / "b.npy", np.zeros((7, 2), np.float32))},
     r"{src}/b\.npy: 7 rows of actions, but b\.mp4 has 6 frames"),
    ("NaN", {"x": _bad_value(np.nan)},
     r"{src}/b\.npy: actions at frame 4, column 1 is NaN \(1 such value\(s\) in all\)\. .* Fix or drop that frame"),
    ("inf", {"x": _bad_value(-np.inf)}, r"{src}/b\.npy: actions at frame 4, column 1 is infinite"),
    ("1e30", {"x": _bad_value(1e30)}, r"{src}/b\.npy: actions at frame 4, column 1 is 1e\+30, beyond ±1e\+06"),
    ("NaN in a csv", {"x": lambda s: ((s / "b.npy").unlink(), (s / "b.csv").write_text("0,0\n" * 3 + "0,nan\n" * 3))},
     r"{src}/b\.csv: actions at frame 3, column 1 is NaN"),
    ("text in a csv", {"x": lambda s: ((s / "b.npy").unlink(), (s / "b.csv").write_text("0,0\n" * 5 + "0,up\n"))},
     r"{src}/b\.csv: line 6, column 1 is 'up', not a number"),
    ("widths differ", {"x": lambda s: np.save(s / "b.npy", np.zeros((6, 3), np.float32))},
     r"{src}/b\.npy: the actions have 3 values a frame, but a\.npy has 2\. Every episode's actions have the same "
     r"width"),
    ("one state missing", {"x": lambda s: np.save(s / "a.state.npy", np.zeros((6, 1), np.float32))},
     r"{src}: 1 of 2 episodes have a state table but 'b' has none"),
    ("rates differ", {"x": lambda s: video(s / "b.mp4", 6, fps=20)},
     r"{src}/b\.mp4 runs at 20 fps, but other videos run at 10 fps\. Pass --fps F"),
    ("sizes differ", {"x": lambda s: video(s / "b.mp4", 6, size=(16, 32))},
     r"{src}/b\.mp4 is 32x16 pixels, but a\.mp4 is 16x16\. Pass --size H W"),
    ("shorter than the window", {"window": 8}, r"{src}/a\.mp4: 6 frames at 10 fps, fewer than --window 8 \(2 of 2 "
                                               r"episodes are\)\. .* use --window 6 or less"),
    ("frames without a rate", {"x": lambda s: ((s / "b.mp4").unlink(), (s / "b").mkdir(),
                                               [(s / "b" / f"{t}.png").write_bytes(_png()) for t in range(6)])},
     r"{src}/b: an episode stored as frames has no frame rate\. Pass --fps"),
]


def _png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buffer, format="png")
    return buffer.getvalue()


@pytest.mark.parametrize("case, change, message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_import_refuses_naming_the_file_and_the_fix_and_writes_nothing(tmp_path, case, change, message):
    from workbench.data.importer import import_folder

    src = tmp_path / "src"
    src.mkdir()
    _two(src, **{k: v for k, v in change.items() if k != "window"})
    with pytest.raises(DataError, match=message.format(src=re.escape(str(src)))):
        import_folder(src, tmp_path / "out", window=change.get("window", 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no output, no partial directory


def test_import_trims_with_trim_and_says_so(tmp_path):
    from workbench.data.importer import import_folder

    src = tmp_path / "src"
    src.mkdir()
    _two(src, x=lambda s: np.save(s / "b.npy", np.zeros((5, 2), np.float32)))
    report = import_folder(src, tmp_path / "out", trim=True)
    assert report.frames == 11 and report.notes == ["b: cut to 5 frames (--trim)"]


def test_a_larger_max_abs_lets_real_large_values_through(tmp_path):
    from workbench.data.importer import import_folder

    src = tmp_path / "src"
    src.mkdir()
    _two(src, x=_bad_value(3e6))  # e.g. encoder ticks: large, and real
    with pytest.raises(DataError, match=r"is 3e\+06, beyond ±1e\+06 .* needs a larger --max-abs"):
        import_folder(src, tmp_path / "out")
    assert import_folder(src, tmp_path / "out", max_abs=1e7).episodes == 2


def test_the_import_command_prints_what_it_wrote_and_refuses_an_existing_output(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _two(src)
    status, out, err = cli(capsys, "data", "import", src, "--out", tmp_path / "out", "--size", "8", "--no-progress")
    assert status == 0, err
    assert f"wrote {tmp_path / 'out'}: 2 episodes, 12 frames at 10 fps, 8x8 pixels as observation.images.main, " \
           f"action (2); the shortest episode has 6 frames" in out
    status, _, err = cli(capsys, "data", "import", src, "--out", tmp_path / "out", "--no-progress")
    assert status == 2 and f"error: {tmp_path / 'out'} exists and is not empty: the import writes a new dataset " \
                           f"directory. Choose another output" in err


def test_the_imports_next_step_runs_as_printed_and_fills_the_config_from_the_dataset(tmp_path, capsys, monkeypatch):
    import shlex

    import yaml

    src = tmp_path / "my videos"
    src.mkdir()
    for stem in ("a", "b"):
        video(src / f"{stem}.mp4", 12, size=(16, 24))
        np.save(src / f"{stem}.npy", np.zeros((12, 3), np.float32))
    monkeypatch.chdir(tmp_path)
    status, out, err = cli(capsys, "data", "import", "my videos", "--out", "my data", "--window", 10, "--size", 16,
                           "--no-progress")
    assert status == 0, err
    line = out.splitlines()[-1]
    assert line == "Next, a training config for it (its data block, the adapter's dim 3): " \
                   "workbench init own_videos --data 'my data'"
    command = shlex.split(line.split(": ", 1)[1])
    assert command[0] == "workbench"
    status, out, err = cli(capsys, *command[1:])
    assert status == 0, err
    assert out.splitlines()[0] == "wrote examples/configs/own_videos.yaml for my data: the adapter's dim 3 " \
                                  "(its 'action'), window 10, frames of 16x16"
    assert "fine-tune the shipped base on the dataset first: workbench pretrain --data " \
           "'my data' --size 16 --window 10 --out outputs/own_base.safetensors" in out
    from workbench.cli import _pretrain_hint, build_parser

    pretrain = shlex.split(out.split("dataset first: ")[1].splitlines()[0])
    parsed = build_parser().parse_args(pretrain[1:])  # its flags exist
    assert (parsed.command, parsed.init, parsed.width) == ("pretrain", "pretrained", None)
    # a config that names an architecture of its own gets that architecture, from scratch (the shipped
    # weights have another, and fine-tuning them refuses other sizes)
    own = {"base": {"config": {"weights": "b.safetensors", "width": 16, "depth": 1, "ae_width": 8}}}
    hint = _pretrain_hint("my data", "b.safetensors", 10, 16, own)
    assert hint.endswith("pretrain it on the dataset first (the architecture the config names, from scratch): "
                         "workbench pretrain --data 'my data' --size 16 --window 10 --from scratch --width 16 "
                         "--depth 1 --ae-width 8 --out b.safetensors")
    parsed = build_parser().parse_args(shlex.split(hint.split("scratch): ")[1])[1:])
    assert (parsed.init, parsed.width, parsed.depth, parsed.ae_width) == ("scratch", 16, 1, 8)
    config = yaml.safe_load((tmp_path / "examples/configs/own_videos.yaml").read_text())
    data = config["data"]["config"]
    assert (data["root"], data["window"], data["size"]) == ("my data", 10, [16, 16])
    assert config["adapter"]["config"]["dim"] == 3
    assert (config["base"]["config"]["image_size"], config["base"]["config"]["frames"]) == (16, 10)
    assert out.splitlines()[-1] == "Train one with: workbench train examples/configs/own_videos.yaml"


def test_init_for_a_dataset_fills_in_the_shipped_example_and_keeps_one_the_user_edited(tmp_path, capsys,
                                                                                       monkeypatch):
    import lerobot_fixture

    monkeypatch.chdir(tmp_path)
    lerobot_fixture.write(tmp_path / "robot", "v3.0")  # 5-D actions; episodes of 9 frames and more; 24x32 frames
    (tmp_path / "examples/configs").mkdir(parents=True)
    shipped = (ROOT / "examples/configs/own_videos.yaml").read_text()
    (tmp_path / "examples/configs/own_videos.yaml").write_text(shipped)  # as in a clone of the repository
    status, out, err = cli(capsys, "init", "own_videos", "--data", "robot")
    assert status == 0, err
    assert out.splitlines()[:3] == [
        "wrote examples/configs/own_videos.yaml for robot: the adapter's dim 5 (its 'action'), window 8, frames of "
        "24x32",  # no import recorded a window: the config's, as no episode is shorter
        "  note: the dataset has 2 cameras (observation.images.front, observation.images.wrist); add camera: NAME to "
        "the config's data block (the size above is observation.images.front's)",
        "  note: its base reads square frames; import the videos again with --size S S (the base's image_size) to "
        "train on them"]
    filled = (tmp_path / "examples/configs/own_videos.yaml").read_text()
    assert filled.startswith("# Filled in for robot by") and "root: robot" in filled and "size: [24, 32]" in filled
    (tmp_path / "examples/configs/own_videos.yaml").write_text("# mine\n")
    status, out, _ = cli(capsys, "init", "own_videos", "--data", "robot")
    assert status == 0 and "--data robot changed none of them: delete the file, or write it elsewhere with --dir" in out
    assert (tmp_path / "examples/configs/own_videos.yaml").read_text() == "# mine\n"


def test_init_for_a_dataset_refuses_what_it_cannot_fill_in(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "videos").mkdir()
    status, _, err = cli(capsys, "init", "--data", "videos")
    assert status == 2 and "error: --data fills in a config for the dataset: name it, e.g. `workbench init " \
                           "own_videos --data videos`." in err
    video(tmp_path / "videos" / "a.mp4", 2)
    status, _, err = cli(capsys, "init", "own_videos", "--data", "videos")
    assert status == 2 and "error: videos holds videos (1, e.g. a.mp4) but is not a LeRobot dataset (no meta/" \
                           "info.json). Convert it first: `workbench data import videos --out videos_dataset`" in err
    status, _, err = cli(capsys, "init", "own_videos", "--data", "sample")
    assert status == 2 and "error: --data sample: Meta-World rollouts (HDF5), not a LeRobot dataset directory" in err
    import lerobot_fixture

    lerobot_fixture.write(tmp_path / "robot", "v3.0")
    status, _, err = cli(capsys, "init", "tiny", "--data", "robot")
    assert status == 2 and "error: --data fills in a config that reads a LeRobot dataset (data: type: lerobot): " \
                           "lerobot_world_model, own_videos; tiny reads 'synthetic_moves' data." in err
    assert not (tmp_path / "examples").exists()


def test_sub_folders_are_imported_with_each_episode_named_by_its_path(tmp_path):
    from workbench.data.importer import import_folder
    from workbench.data.lerobot import LeRobotClips

    src = tmp_path / "src"
    for k, where in enumerate(["", "session A", "session_B", "session_B/day 2", ".hidden"]):
        (src / where).mkdir(parents=True, exist_ok=True)
        video(src / where / "take 1.mp4", 6)
        np.save(src / where / "take 1.npy", np.full((6, 2), k, np.float32))
    report = import_folder(src, src / "dataset", window=2)  # the output inside the folder is never read
    assert report.episodes == 4
    extra = json.loads((src / "dataset" / "meta" / "workbench.json").read_text())
    assert [e["source"] for e in extra["episodes"]] == ["session A/take 1", "session_B/day 2/take 1",
                                                        "session_B/take 1", "take 1"]
    clips = LeRobotClips(root=str(src / "dataset"), window=6, stride=6, split="all")
    assert [float(clips[i]["action"][0, 0]) for i in range(4)] == [1, 3, 2, 0]  # each its own actions
    assert clips.task_names == ["src"] * 4
    assert import_folder(src, tmp_path / "again", window=2).episodes == 4  # a rerun skips the dataset inside
    np.save(src / "session A" / "take 2.npy", np.zeros((6, 2), np.float32))
    with pytest.raises(DataError, match=rf"{re.escape(str(src))}: session A/take 2\.npy has no video of the same "
                                        rf"name \(1 table\(s\) without one\)\. .*take 2\.mp4 or a folder of frames, "
                                        rf"in the same folder\)"):
        import_folder(src, tmp_path / "third")


def _faststart(path: Path, frames: int) -> None:
    """An H.264 MP4 with its index at the start (as phones and web exports write them)."""
    import fractions

    import av

    with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        for k in range(frames):
            image = np.random.default_rng(k).integers(0, 256, (16, 16, 3), dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = k, fractions.Fraction(1, 10)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_a_truncated_faststart_video_is_blamed_on_the_video_and_the_fix_it_gives_works(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _two(src)
    _faststart(src / "c.mp4", 30)
    np.save(src / "c.npy", np.zeros((30, 2), np.float32))
    data = (src / "c.mp4").read_bytes()
    (src / "c.mp4").write_bytes(data[:len(data) * 6 // 10])  # the copy stopped early
    status, _, err = cli(capsys, "data", "import", src, "--out", tmp_path / "out", "--no-progress")
    assert status == 2
    assert re.search(rf"error: {re.escape(str(src / 'c.mp4'))}: the video is cut short: its index lists 30 frames "
                     rf"but the file holds \d+ \(a copy or a recording that stopped early\)\. Copy or export the "
                     rf"video again from its source; or move c\.mp4 and c\.npy out of the folder to import the other "
                     rf"episodes without it\.", err), err
    assert "c.npy:" not in err and "--trim" not in err
    (tmp_path / "aside").mkdir()
    for name in ("c.mp4", "c.npy"):  # the fix, as the message gives it
        (src / name).rename(tmp_path / "aside" / name)
    status, out, err = cli(capsys, "data", "import", src, "--out", tmp_path / "out", "--no-progress")
    assert status == 0 and "2 episodes" in out, err


def test_data_at_a_folder_of_videos_says_how_to_convert_it(tmp_path, capsys):
    src = tmp_path / "videos"
    src.mkdir()
    _two(src)
    status, _, err = cli(capsys, "eval", ROOT / "workbench" / "worldmodel" / "weights" / "metaworld_action",
                         "--data", src, "--out", tmp_path / "eval")
    assert status == 2
    assert f"{src} holds videos (2, e.g. a.mp4) but is not a LeRobot dataset (no meta/info.json). Convert it first: " \
           f"`workbench data import {src} --out {src}_dataset`" in err


# -- the writer --------------------------------------------------------------------------------------------------------
def _writer(root: Path):
    from workbench.data.lerobot_write import LeRobotWriter

    return LeRobotWriter(root, 10, {"action": ("float32", ["dx", "dy"])}, ["observation.images.main"])


def _episode(frames: int = 4, actions: int = 4, value: float = 0.0):
    images = {"observation.images.main": np.zeros((frames, 8, 8, 3), np.uint8)}
    data = {"action": np.full((actions, 2), value, np.float32)}
    return images, data


def test_the_writer_refuses_float_pictures_and_a_new_size(tmp_path):
    with _writer(tmp_path / "a") as writer:
        images, data = _episode()
        with pytest.raises(DataError, match=r"camera 'observation\.images\.main' has float64 pictures; they must be "
                                            r"uint8 \(T, H, W, 3\) RGB in 0\.\.255 \(floats in \[0, 1\]: "):
            writer.add_episode({"observation.images.main": images["observation.images.main"] / 255.0}, data, "t")
        writer.add_episode(images, data, "t")
        with pytest.raises(DataError, match=r"pictures are 16x16 pixels, the earlier episodes' 8x8"):
            writer.add_episode({"observation.images.main": np.zeros((4, 16, 16, 3), np.uint8)}, data, "t")
    assert (tmp_path / "a" / "meta" / "info.json").is_file()  # the good episode was written whole


def test_a_partial_dataset_left_behind_is_removed_and_a_non_empty_root_advises_no_flag(tmp_path):
    root = tmp_path / "data"
    writer = _writer(root)
    writer.add_episode(*_episode(), task="t")  # then the process dies: neither closed nor aborted
    assert (tmp_path / "data.partial").is_dir() and not root.exists()
    with _writer(root) as again:  # the next writer clears what was left
        again.add_episode(*_episode(), task="t")
    assert not (tmp_path / "data.partial").exists() and (root / "meta" / "info.json").is_file()
    with pytest.raises(DataError) as info:
        _writer(root)
    assert str(info.value) == (f"{root} exists and is not empty; LeRobotWriter writes a new dataset there. Pass a root "
                               f"that does not exist yet (or an empty directory); nothing was written.")
    (tmp_path / "other.partial").mkdir()
    (tmp_path / "other.partial" / "mine.txt").write_text("not the writer's")
    with pytest.raises(DataError, match=r"other\.partial exists and is not a LeRobotWriter's unfinished output"):
        _writer(tmp_path / "other")
