"""Camera calibration: projection against MuJoCo's own rendering, storage in both data formats, the errors."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from workbench.data.camera import CAMERA_DIM, CameraCalibration, missing_calibration, project, quat_to_mat
from workbench.errors import DataError

h5py = pytest.importorskip("h5py")

from test_data_metaworld import write_file  # noqa: E402

torch.set_num_threads(1)
SAMPLE_CAMERA = {"camera": "corner2_close", "camera_model_name": "corner2", "camera_pos": [0.695, 0.173, 1.049],
                 "camera_quat": [0.81960013, 0.33938838, 0.17660035, 0.42647798], "camera_fovy": 45.0,
                 "image_transform": "none"}


def test_look_at_projects_its_target_to_the_centre_and_depth_is_the_distance():
    cam = CameraCalibration.look_at((1.0, -1.0, 1.5), (0.0, 0.5, 0.2), fovy=45.0, width=96, height=64)
    uv, depth = cam.project(np.array([0.0, 0.5, 0.2]))
    assert np.allclose(uv, [48.0, 32.0], atol=1e-9)
    assert math.isclose(float(depth), math.dist((1.0, -1.0, 1.5), (0.0, 0.5, 0.2)), rel_tol=1e-12)
    # a point above the target is higher in the picture (smaller v); one to the camera's right, larger u
    fwd = np.subtract((0.0, 0.5, 0.2), (1.0, -1.0, 1.5))
    right = np.cross(fwd, [0, 0, 1.0])
    (u_up, v_up), _ = cam.project(np.array([0.0, 0.5, 0.3]))
    (u_r, v_r), _ = cam.project(np.array([0.0, 0.5, 0.2]) + 0.1 * right / np.linalg.norm(right))
    assert v_up < 32.0 and u_r > 48.0
    # the vertical field of view: a point at the edge of fovy/2 lands on the top edge
    f = cam.intrinsics[1][1]
    assert math.isclose(f, 32.0 / math.tan(math.radians(22.5)), rel_tol=1e-12)


def test_normalized_projection_is_the_projection_in_fractions_of_the_image():
    cam = CameraCalibration.look_at((0.7, 0.2, 1.0), (0.0, 0.66, 0.2), 45.0, 64, 48)
    points = np.random.default_rng(0).uniform([-0.3, 0.4, 0.05], [0.3, 0.9, 0.4], size=(20, 3))
    uv, _ = cam.project(points)
    uvn, _ = project(cam.vector().reshape(3, 4), points)
    assert cam.vector().shape == (CAMERA_DIM,) and cam.vector().dtype == np.float32
    assert np.allclose(uvn * [64, 48], uv, atol=1e-4)


def test_rot180_turns_the_pixels_about_the_centre():
    xmat = quat_to_mat(SAMPLE_CAMERA["camera_quat"])
    plain = CameraCalibration.from_mujoco(SAMPLE_CAMERA["camera_pos"], xmat, 45.0, 64, 64)
    turned = CameraCalibration.from_mujoco(SAMPLE_CAMERA["camera_pos"], xmat, 45.0, 64, 64, "rot180")
    p = np.array([[0.1, 0.6, 0.2], [-0.2, 0.8, 0.1]])
    assert np.allclose(turned.project(p)[0], 64.0 - plain.project(p)[0], atol=1e-9)
    with pytest.raises(DataError, match="image_transform 'flip'.*allowed: 'none', 'rot180'"):
        CameraCalibration.from_mujoco(SAMPLE_CAMERA["camera_pos"], xmat, 45.0, 64, 64, "flip")


def test_quaternion_to_matrix_is_a_rotation():
    r = quat_to_mat([0.3, -0.2, 0.5, 0.7])
    assert np.allclose(r @ r.T, np.eye(3), atol=1e-12) and math.isclose(np.linalg.det(r), 1.0, rel_tol=1e-12)
    assert np.allclose(quat_to_mat([1, 0, 0, 0]), np.eye(3))


def test_invalid_calibration_says_what_is_wrong():
    with pytest.raises(DataError, match=r"intrinsics must be a finite 3x3 matrix, got shape \[2, 2\]"):
        CameraCalibration(np.eye(2), np.eye(4), 8, 8)
    with pytest.raises(DataError, match="image size must be positive, got 0x8"):
        CameraCalibration(np.eye(3), np.eye(4), 0, 8)


# ---------------------------------------------------------------------------- against MuJoCo's picture
def _needs_simulator():
    for name in ("metaworld", "mujoco"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install './[data]' in a clone)")


@pytest.mark.parametrize("camera", ["corner2_close", "corner3"])
def test_projection_lands_where_mujoco_draws_the_point(camera):
    """A small sphere added to MuJoCo's scene at known world points: the centroid of the pixels it changes
    is where the calibration projects its centre, within a pixel (and the rendered frame's orientation,
    rot180 for Meta-World's own corner cameras, is accounted for)."""
    _needs_simulator()
    import mujoco

    from workbench.worldmodel.sim import RenderingUnavailable, TaskEnv

    size = 128
    try:
        env = TaskEnv("reach-v3", size, camera, 10)
    except RenderingUnavailable as err:
        pytest.skip(str(err))
    try:
        env.env.reset()
        cam = env.calibration
        plain = env.render().astype(np.int32)
        points = np.array([[0.0, 0.6, 0.1], [0.15, 0.75, 0.25], [-0.15, 0.55, 0.15], [0.05, 0.85, 0.3]])
        for point in points:
            renderer = env.renderer
            renderer.update_scene(env.env.data, camera=env.camera_name)
            scene = renderer.scene
            mujoco.mjv_initGeom(scene.geoms[scene.ngeom], mujoco.mjtGeom.mjGEOM_SPHERE, np.array([0.015, 0, 0]),
                                point, np.eye(3).reshape(-1), np.array([1.0, 0.0, 1.0, 1.0], np.float32))
            scene.ngeom += 1
            image = renderer.render()
            if env.image_transform == "rot180":
                image = image[::-1, ::-1]
            changed = np.abs(image.astype(np.int32) - plain).sum(-1) > 30
            rows, cols = np.nonzero(changed)
            assert len(rows) >= 4, f"the marker at {point} is not visible from {camera}"
            seen = np.array([cols.mean() + 0.5, rows.mean() + 0.5])  # pixel centres, from the top-left corner
            (u, v), depth = cam.project(point)
            assert depth > 0
            assert np.hypot(*(seen - (u, v))) < 1.0, (point, seen, (u, v))
    finally:
        env.close()


def test_generator_calibration_equals_the_one_rebuilt_from_old_attributes():
    """``workbench data calibrate`` on a file made before calibration was recorded gives what the generator
    records today for the same camera."""
    _needs_simulator()
    from workbench.worldmodel.generate import calibration_from_attrs
    from workbench.worldmodel.sim import RenderingUnavailable, TaskEnv

    try:
        env = TaskEnv("reach-v3", 64, "corner2_close", 10)
    except RenderingUnavailable as err:
        pytest.skip(str(err))
    try:
        rebuilt = calibration_from_attrs({**SAMPLE_CAMERA, "size": 64}, "old.h5")
        assert np.allclose(rebuilt.projection(), env.calibration.projection(), atol=1e-6)
    finally:
        env.close()


# ---------------------------------------------------------------------------- both formats
def test_hdf5_calibrate_adds_it_and_the_reader_serves_it(tmp_path):
    from workbench.data.metaworld import MetaWorldClips
    from workbench.worldmodel.generate import calibrate

    path = write_file(tmp_path / "old.h5", attrs={**SAMPLE_CAMERA, "size": 8})
    old = MetaWorldClips(path=str(path), window=4, split="all")
    assert old.calibration is None and "camera" not in old[0]
    old.close()
    cam = calibrate(path)
    clips = MetaWorldClips(path=str(path), window=4, split="all")
    assert clips.calibration == cam
    assert torch.equal(clips[0]["camera"], torch.from_numpy(cam.vector()))
    with h5py.File(path, "r") as f:
        assert list(f.attrs["camera_image_size"]) == [8, 8]
        assert np.array_equal(f.attrs["camera_intrinsics"], np.asarray(cam.intrinsics))
    # the sample ships calibrated: the camera of the sample, at its 64x64 frames
    from workbench.data.metaworld import sample_path

    sample = MetaWorldClips(path=str(sample_path()), window=16, split="val")
    rebuilt = CameraCalibration.look_at(SAMPLE_CAMERA["camera_pos"], (0.0, 0.66, 0.2), 45.0, 64, 64)
    assert np.allclose(sample.calibration.projection(), rebuilt.projection(), atol=1e-6)


def test_calibration_round_trips_through_lerobot(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    from workbench.data.lerobot import LeRobotClips
    from workbench.data.metaworld import MetaWorldClips
    from workbench.worldmodel.generate import calibrate, metaworld_to_lerobot

    path = write_file(tmp_path / "rollouts.h5", n=2, t=8, hw=16, attrs={**SAMPLE_CAMERA, "size": 16})
    cam = calibrate(path)
    root = metaworld_to_lerobot(path, tmp_path / "lerobot")
    info = json.loads((root / "meta" / "info.json").read_text())
    stored = info["features"]["observation.images.corner2_close"]["calibration"]
    assert stored["width"] == 16 and stored["height"] == 16 and "OpenCV" in stored["convention"]
    clips = LeRobotClips(root=str(root), window=4, split="all")
    assert clips.calibration == cam
    ref = MetaWorldClips(path=str(path), window=4, split="all")
    assert torch.equal(clips[0]["camera"], ref[0]["camera"])
    # a dataset written without it: calibrate adds it from the camera preset in the feature's name
    del info["features"]["observation.images.corner2_close"]["calibration"]
    (root / "meta" / "info.json").write_text(json.dumps(info))
    assert LeRobotClips(root=str(root), window=4, split="all").calibration is None
    calibrate(root)
    again = LeRobotClips(root=str(root), window=4, split="all").calibration
    assert np.allclose(again.projection(), cam.projection(), atol=1e-6)


def test_missing_calibration_error_says_what_received_allowed_and_fix(tmp_path):
    from workbench.worldmodel.generate import calibrate

    path = write_file(tmp_path / "bare.h5", attrs={"size": 8})
    with pytest.raises(DataError) as err:
        calibrate(path)
    text = str(err.value)
    assert "has no camera calibration" in text
    assert "Received: schema_version, size" in text
    assert "allowed: HDF5 attributes camera_intrinsics, camera_extrinsics, camera_image_size" in text
    assert "Fix: it lacks ['camera_pos', 'camera_quat', 'camera_fovy']" in text
    moving = write_file(tmp_path / "gripper.h5", attrs={**SAMPLE_CAMERA, "camera_model_name": "gripperPOV", "size": 8})
    with pytest.raises(DataError, match="'gripperPOV' rides on the gripper, so it has no fixed calibration"):
        calibrate(moving)
    assert "workbench data calibrate FILE" in str(missing_calibration("x.h5", []))
    with h5py.File(path, "r+") as f:
        f.attrs["camera_intrinsics"] = np.eye(3)
    from workbench.data.metaworld import MetaWorldClips

    with pytest.raises(DataError, match=r"calibration is incomplete: attribute\(s\) \['camera_extrinsics', "
                                        r"'camera_image_size'\] missing"):
        MetaWorldClips(path=str(path), window=4, split="all")


def test_calibrate_command(tmp_path):
    from workbench.cli import main

    path = write_file(tmp_path / "old.h5", attrs={**SAMPLE_CAMERA, "size": 8})
    assert main(["data", "calibrate", str(path)]) == 0
    with h5py.File(path, "r") as f:
        assert "camera_extrinsics" in f.attrs
