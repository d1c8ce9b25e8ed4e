"""Camera calibration of recorded clips: where a 3-D point of the world lands in the picture.

A :class:`CameraCalibration` holds a pinhole camera: ``intrinsics`` ``K`` (3x3, pixels of an image
``width`` x ``height``) and ``extrinsics`` (4x4, world → camera, OpenCV convention: x right, y down,
z forward, metres). Pixel coordinates are continuous with ``(0, 0)`` at the top-left corner of the
image, so the centre of pixel ``(col, row)`` is ``(col + 0.5, row + 0.5)``.

Where it is stored:

* HDF5 clip files (``workbench data metaworld``, schema of :mod:`workbench.data.metaworld`): the
  file attributes ``camera_intrinsics`` (3x3), ``camera_extrinsics`` (4x4) and
  ``camera_image_size`` (``[width, height]``).
* LeRobot datasets: ``meta/info.json``, under the video feature it belongs to:
  ``features["observation.images.NAME"]["calibration"] = {"intrinsics", "extrinsics", "width",
  "height", "convention"}``.

Readers serve it with every item as ``"camera"``: a float32 vector of 12, the 3x4 projection
matrix in *normalised* image coordinates (``u / width``, ``v / height``), row-major
(:meth:`CameraCalibration.normalized_projection`). Normalised coordinates do not change when the
frames are resized, so the same vector serves the frames at any size. A file without it gets it with
``workbench data calibrate FILE``.

Only numpy is needed here; MuJoCo is not.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.data.checks import MAX_ABS
from workbench.errors import DataError

#: The key of the calibration in dataset items and batches.
CAMERA_KEY = "camera"
#: Width of the ``camera`` vector of an item: a 3x4 projection, row-major.
CAMERA_DIM = 12
CONVENTION = ("OpenCV pinhole: extrinsics map world (metres) to camera (x right, y down, z forward); "
              "pixels from the image's top-left corner")
ATTRS = ("camera_intrinsics", "camera_extrinsics", "camera_image_size")
RECALIBRATE = "Rewrite it with `workbench data calibrate FILE` (or fix the values where the dataset was made)"


def look_at_matrix(pos: Sequence[float], target: Sequence[float]) -> np.ndarray:
    """The orientation (3x3, columns: right, up, backward; MuJoCo's camera ``xmat``) of an upright camera
    (world z up) at ``pos`` looking at ``target``."""
    pos_a, target_a = np.asarray(pos, np.float64), np.asarray(target, np.float64)
    fwd = target_a - pos_a
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, fwd)
    return np.stack([right, up, -fwd], axis=1)


@dataclasses.dataclass(frozen=True)
class CameraCalibration:
    """A pinhole camera: ``intrinsics`` (3x3), ``extrinsics`` (4x4 world → camera), image ``width`` x
    ``height``."""

    intrinsics: tuple[tuple[float, ...], ...]
    extrinsics: tuple[tuple[float, ...], ...]
    width: int
    height: int

    def __post_init__(self) -> None:
        k = np.asarray(self.intrinsics, np.float64)
        e = np.asarray(self.extrinsics, np.float64)
        problems = []
        for name, m, shape in (("intrinsics", k, (3, 3)), ("extrinsics", e, (4, 4))):
            if m.shape != shape:
                problems.append(f"{name} must be a finite {shape[0]}x{shape[1]} matrix, "
                                f"got shape {list(m.shape)}")
                continue
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(m) | (np.abs(m) > MAX_ABS)
            if bad.any():
                r, c = (int(v) for v in np.argwhere(bad)[0])
                problems.append(f"{name}[{r}][{c}] is {float(m[r, c])!r} "
                                f"(a calibration holds finite values of at most {MAX_ABS:g} in magnitude: "
                                f"pixels and metres)")
        if int(self.width) < 1 or int(self.height) < 1:
            problems.append(f"the image size must be positive, got {self.width}x{self.height}")
        if problems:
            raise DataError("Invalid camera calibration: " + "; ".join(problems) + ".")
        object.__setattr__(self, "intrinsics", tuple(map(tuple, k.tolist())))
        object.__setattr__(self, "extrinsics", tuple(map(tuple, e.tolist())))
        object.__setattr__(self, "width", int(self.width))
        object.__setattr__(self, "height", int(self.height))

    # ------------------------------------------------------------------ building
    @classmethod
    def look_at(cls, pos: Sequence[float], lookat: Sequence[float], fovy: float, width: int,
                height: int) -> CameraCalibration:
        """An upright camera (world z up) at ``pos`` aimed at ``lookat`` with a vertical field of view of
        ``fovy`` degrees (MuJoCo's convention)."""
        return cls.from_mujoco(np.asarray(pos, np.float64), look_at_matrix(pos, lookat), fovy, width, height)

    @classmethod
    def from_mujoco(cls, pos: Sequence[float], xmat: Any, fovy: float, width: int, height: int,
                    image_transform: str = "none") -> CameraCalibration:
        """The calibration of a MuJoCo camera at world position ``pos`` with orientation ``xmat`` (3x3, its
        columns the camera's x, y, z axes in the world: MuJoCo looks along -z with y up, as
        ``data.cam_xmat``), vertical field of view ``fovy`` degrees, rendered at ``width`` x ``height``.
        ``image_transform="rot180"``: the stored frames are the render turned by 180 degrees."""
        rot = np.asarray(xmat, np.float64).reshape(3, 3)
        world_to_cam = np.diag([1.0, -1.0, -1.0]) @ rot.T  # MuJoCo (x right, y up, -z forward) → OpenCV
        if image_transform == "rot180":
            world_to_cam = np.diag([-1.0, -1.0, 1.0]) @ world_to_cam
        elif image_transform != "none":
            raise DataError(f"image_transform {image_transform!r} is not one this calibration knows; "
                            f"allowed: 'none', 'rot180'.")
        extrinsics = np.eye(4)
        extrinsics[:3, :3] = world_to_cam
        extrinsics[:3, 3] = -world_to_cam @ np.asarray(pos, np.float64)
        f = 0.5 * height / math.tan(math.radians(float(fovy)) / 2)  # MuJoCo: square pixels, fovy vertical
        intrinsics = np.array([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])
        return cls(intrinsics, extrinsics, width, height)

    # ------------------------------------------------------------------ use
    def projection(self) -> np.ndarray:
        """The 3x4 matrix ``K [R | t]`` from homogeneous world points to homogeneous pixels."""
        return np.asarray(self.intrinsics) @ np.asarray(self.extrinsics)[:3]

    def normalized_projection(self) -> np.ndarray:
        """The 3x4 projection to normalised image coordinates (``u / width``, ``v / height``), float32."""
        scale = np.diag([1.0 / self.width, 1.0 / self.height, 1.0])
        return (scale @ self.projection()).astype(np.float32)

    def vector(self) -> np.ndarray:
        """What a dataset item carries as ``"camera"``: :meth:`normalized_projection`, row-major (12,)."""
        return self.normalized_projection().reshape(CAMERA_DIM)

    def project(self, points: Any) -> tuple[np.ndarray, np.ndarray]:
        """World points ``(..., 3)`` (metres) → pixels ``(..., 2)`` (u right, v down) and depth ``(...)``."""
        return project(self.projection(), points)

    # ------------------------------------------------------------------ storage
    def to_attrs(self) -> dict[str, np.ndarray]:
        """The HDF5 file attributes that store it."""
        return {"camera_intrinsics": np.asarray(self.intrinsics),
                "camera_extrinsics": np.asarray(self.extrinsics),
                "camera_image_size": np.array([self.width, self.height], np.int64)}

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], where: str = "the file") -> CameraCalibration | None:
        """The calibration stored in HDF5 attributes, or ``None`` when there is none."""
        present = [a for a in ATTRS if a in attrs]
        if not present:
            return None
        if len(present) != len(ATTRS):
            missing = [a for a in ATTRS if a not in attrs]
            raise DataError(f"{where}: camera calibration is incomplete: attribute(s) {missing} missing (has "
                            f"{present}). Rewrite it with `workbench data calibrate FILE`.")
        try:
            width, height = (int(v) for v in np.asarray(attrs["camera_image_size"]).reshape(-1)[:2])
            return cls(np.asarray(attrs["camera_intrinsics"]), np.asarray(attrs["camera_extrinsics"]),
                       width, height)
        except (DataError, ValueError, TypeError, OverflowError) as err:
            raise DataError(f"{where}: the camera calibration in its attributes is unusable: {err} "
                            f"{RECALIBRATE}.") from None

    def to_json(self) -> dict[str, Any]:
        """The ``calibration`` entry of a LeRobot video feature in ``meta/info.json``."""
        return {"intrinsics": [list(r) for r in self.intrinsics],
                "extrinsics": [list(r) for r in self.extrinsics],
                "width": self.width, "height": self.height, "convention": CONVENTION}

    @classmethod
    def from_json(cls, value: Any, where: str = "meta/info.json") -> CameraCalibration:
        if not isinstance(value, Mapping) or any(k not in value for k in ("intrinsics", "extrinsics", "width",
                                                                           "height")):
            raise DataError(f"{where}: a camera calibration needs 'intrinsics', 'extrinsics', 'width' and "
                            f"'height', got {json.dumps(value)[:200]}. "
                            f"Rewrite it with `workbench data calibrate DIR`.")
        try:
            return cls(value["intrinsics"], value["extrinsics"], int(value["width"]), int(value["height"]))
        except (DataError, ValueError, TypeError, OverflowError) as err:
            raise DataError(f"{where}: the camera calibration is unusable: {err} {RECALIBRATE}.") from None


def quat_to_mat(quat: Sequence[float]) -> np.ndarray:
    """A unit quaternion ``(w, x, y, z)`` (MuJoCo's order) as a 3x3 rotation matrix."""
    w, x, y, z = np.asarray(quat, np.float64) / np.linalg.norm(quat)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def project(matrix: Any, points: Any) -> tuple[np.ndarray, np.ndarray]:
    """Points ``(..., 3)`` through a 3x4 projection ``matrix``: image coordinates ``(..., 2)`` and depth
    ``(...)``."""
    p = np.asarray(points, np.float64)
    hom = np.concatenate([p, np.ones((*p.shape[:-1], 1))], axis=-1) @ np.asarray(matrix, np.float64).T
    depth = hom[..., 2]
    return hom[..., :2] / depth[..., None], depth


def missing_calibration(where: str, received: Sequence[str], fix: str | None = None) -> DataError:
    """The error for a reader of a dataset that has no camera calibration, when one is needed."""
    return DataError(
        f"{where} has no camera calibration: the action path is projected into the picture with the camera's "
        f"intrinsics and extrinsics. Received: {', '.join(received) if received else 'nothing'}; "
        f"allowed: HDF5 attributes {', '.join(ATTRS)}, "
        f"or a LeRobot video feature's 'calibration' in meta/info.json. Fix: "
        + (fix or "`workbench data calibrate FILE` adds it to files made by `workbench data metaworld` (it "
           "needs their camera_pos / camera_quat / camera_fovy attributes or a known camera preset).")
    )


__all__ = ["ATTRS", "CAMERA_DIM", "CAMERA_KEY", "CONVENTION", "CameraCalibration", "look_at_matrix",
           "missing_calibration", "project"]
