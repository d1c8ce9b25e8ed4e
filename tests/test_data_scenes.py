"""The rendered scenes (workbench.data.scenes): what the actions do in each, and a folder that imports."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.data.scenes import ACTION_NAMES, SCENES, render_episode, smooth_actions, write_scene_folder
from workbench.errors import DataError


def centroid(mask: np.ndarray) -> np.ndarray:
    """(x, y) of the True pixels of a (H, W) mask, in pixels."""
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()]) + 0.5


@pytest.mark.parametrize("scene", SCENES)
def test_an_episode_is_a_pure_function_of_its_seed(scene):
    video, actions = render_episode(scene, frames=5, size=32, seed=4)
    again = render_episode(scene, frames=5, size=32, seed=4)
    other = render_episode(scene, frames=5, size=32, seed=5)
    assert video.shape == (5, 32, 32, 3) and video.dtype == np.uint8
    assert actions.shape == (5, 4) and actions.dtype == np.float32
    assert np.array_equal(video, again[0]) and np.array_equal(actions, again[1])
    assert not np.array_equal(video, other[0]) and not np.array_equal(actions, other[1])


def test_the_actions_are_smooth_and_bounded():
    actions = smooth_actions(4000, np.random.default_rng(0))
    assert actions.min() >= -1 and actions.max() <= 1 and actions.std() > 0.4
    steps = np.abs(np.diff(actions, axis=0)).mean()
    shuffled = np.abs(np.diff(np.random.default_rng(1).permutation(actions), axis=0)).mean()
    assert steps < 0.5 * shuffled  # neighbours are much closer than random pairs of rows


def test_the_blob_moves_by_its_actions_and_the_cube_stays():
    video, actions = render_episode("blob", frames=12, size=96, seed=1)
    red = (video[..., 0].astype(int) - video[..., 2] > 90) & (video[..., 0] > 150)  # the blob, not the wood
    blue = (video[..., 2].astype(int) - video[..., 0] > 60)  # the cube
    moves = np.array([centroid(red[t + 1]) - centroid(red[t]) for t in range(11)])
    expected = 3.0 * actions[:11, :2]  # pixels per frame at 96x96
    where = np.array([centroid(m) for m in red[:11]])
    inside = np.all((where > 14) & (where < 82), axis=1)  # away from the edges, where the blob is stopped
    assert inside.sum() >= 10
    np.testing.assert_allclose(moves[inside], expected[inside], atol=0.6)
    # away from every place the blob (and its shadow) has been, no pixel changes, the cube's included
    yy, xx = np.mgrid[0:96, 0:96] + 0.5
    far = np.all([np.hypot(xx - x, yy - y) > 22 for x, y in (centroid(m) for m in red)], axis=0)
    assert (blue[0] & far).sum() > 700  # nearly all of the cube
    assert all(np.array_equal(video[t][far], video[0][far]) for t in range(12))


def test_the_gripper_follows_its_actions_and_the_camera_moves_every_pixel():
    video, actions = render_episode("pusher", frames=10, size=96, seed=1)
    v = video.astype(int)
    grey = (v.max(axis=-1) - v.min(axis=-1) < 20) & (v.max(axis=-1) < 120)  # the dark grey palm
    moves = np.array([centroid(grey[t + 1]) - centroid(grey[t]) for t in range(9)])
    np.testing.assert_allclose(moves[:, 0], 3.0 * actions[:9, 0], atol=0.6)  # (its height moves it in y)
    # the share of pixels that differ from the first frame by the end: the whole picture when the camera moves
    changed = lambda v: (np.abs(v[-1].astype(int) - v[0]).max(axis=-1) > 10).mean()  # noqa: E731
    for seed in range(3):
        camera, blob = (render_episode(scene, frames=10, size=48, seed=seed)[0] for scene in ("camera", "blob"))
        assert changed(blob) < 0.1 and changed(camera) > 0.45


def test_a_scene_folder_imports_as_written(tmp_path):
    import pyarrow.parquet as pq

    from workbench.data.importer import import_folder
    from workbench.data.lerobot import LeRobotClips

    folder = write_scene_folder(tmp_path / "videos", "pusher", episodes=3, frames=(6, 9), size=32, table="csv",
                                seed=1)
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"episode_00{e}.{s}" for e in range(3) for s in ("csv", "mp4")]
    header = (folder / "episode_000.csv").read_text().splitlines()[0]
    assert header == ",".join(ACTION_NAMES["pusher"])
    report = import_folder(folder, tmp_path / "dataset", window=6)
    assert report.fps == 15 and report.action_dim == 4
    clips = LeRobotClips(root=str(tmp_path / "dataset"), window=6, stride=1, split="all", state=None)
    lengths = [clips.served_length(e) for e in range(3)]
    assert all(6 <= n <= 9 for n in lengths) and len(set(lengths)) > 1
    for item in (clips[i] for i in range(len(clips))):
        e, start = int(item["episode"]), int(item["start"])
        _, actions = render_episode("pusher", frames=lengths[e], size=32, seed=1 * 100_003 + e)
        np.testing.assert_allclose(item["action"], actions[start:start + 6], atol=1e-6)  # the csv's 6 decimals
    parquet = write_scene_folder(tmp_path / "parquet", "camera", episodes=1, frames=4, size=16, table="parquet")
    assert pq.read_table(parquet / "episode_000.parquet").column_names == list(ACTION_NAMES["camera"])


@pytest.mark.parametrize("call, pattern", [
    (lambda tmp: render_episode("blobb", frames=4), r"No scene called 'blobb'\. The scenes: 'blob', 'camera', "
                                                    r"'pusher'\. Did you mean 'blob'\?"),
    (lambda tmp: render_episode("blob", frames=1), r"frames >= 2 and size >= 8 pixels, got frames=1, size=96"),
    (lambda tmp: write_scene_folder(tmp, "blob", table="xlsx"), r"table must be one of 'csv', 'npy', 'parquet', "
                                                                 r"got 'xlsx'"),
    (lambda tmp: write_scene_folder(tmp, "blob", frames=(9, 4)), r"2 <= shortest <= longest frames; got episodes=48, "
                                                                  r"frames=\(9, 4\)"),
])
def test_bad_requests_say_what_is_allowed(tmp_path, call, pattern):
    with pytest.raises(DataError, match=pattern):
        call(tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_folder_in_use_is_never_written_into(tmp_path):
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "mine.mp4").write_bytes(b"x")
    with pytest.raises(DataError, match=r"videos exists and is not empty; the scene is written into a new folder"):
        write_scene_folder(tmp_path / "videos", "blob", episodes=1, frames=4, size=16)
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["mine.mp4"]
