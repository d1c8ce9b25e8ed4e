"""Scenes like a user's own footage, rendered: folders of MP4 clips with 4-D actions to import.

Each scene is a small procedural world that 4-D actions drive, drawn with anti-aliased shapes and
written as a user's recording would be: one H.264 MP4 per episode (96×96 by default, episodes of
32–60 frames) with its actions beside it (``NAME.npy``, ``.csv`` or ``.parquet``), the layout
``workbench data import`` reads (:mod:`workbench.data.importer`). Row ``t`` of the actions is the
action taken at frame ``t``; its result shows in frame ``t + 1``. Everything is a pure function of
the seed.

* ``blob``: a coloured blob that the actions move over a wooden table, past a blue cube that stays
  where it is. ``dx, dy`` move the blob, ``dz`` grows or shrinks it, the fourth value shifts its hue.
* ``pusher``: a two-finger gripper seen from above and a puck it pushes when it is low enough.
  ``dx, dy`` move the gripper, ``dz`` raises or lowers it (a lowered gripper looks smaller and its
  shadow comes closer), the fourth value opens or closes the fingers.
* ``camera``: a camera over a table covered with objects. ``dx, dy`` pan it, ``dz`` zooms, the
  fourth value rolls it: every pixel moves, nothing in the world does.

The actions are smooth (a mean-reverting random walk, clipped to [-1, 1]); in ``pusher`` they head
for the puck part of the time, as a demonstrator's would, so most episodes show a push.

Examples:
    >>> video, actions = render_episode("blob", frames=6, size=48, seed=3)
    >>> video.shape, video.dtype, actions.shape
    ((6, 48, 48, 3), dtype('uint8'), (6, 4))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from workbench.errors import DataError, did_you_mean, listing

#: The action's meaning in each scene (the names the ``.csv`` and ``.parquet`` tables give the columns).
ACTION_NAMES: dict[str, tuple[str, str, str, str]] = {
    "blob": ("dx", "dy", "dz", "hue"),
    "pusher": ("dx", "dy", "dz", "grip"),
    "camera": ("pan_x", "pan_y", "zoom", "roll"),
}
SCENES = tuple(ACTION_NAMES)
#: The frame rate each scene is written at by default (the user's clips came at 10 and 15 fps).
FPS = {"blob": 10, "pusher": 15, "camera": 12}
TABLE_FORMATS = ("npy", "csv", "parquet")


# -- drawing ------------------------------------------------------------------------------------------------
class _Canvas:
    """An RGB picture in [0, 1] of ``size`` x ``size`` pixels drawn in the coordinates of a 96-pixel frame,
    so a scene looks the same at every size (shapes scale, edges stay anti-aliased)."""

    def __init__(self, size: int):
        self.scale = size / 96.0
        centres = (np.arange(size, dtype=np.float32) + 0.5) / self.scale
        self.y, self.x = np.meshgrid(centres, centres, indexing="ij")  # (H, W) in 96-pixel units
        self.image = np.zeros((size, size, 3), np.float32)

    def coverage(self, distance: np.ndarray, soft: float = 0.0) -> np.ndarray:
        """The share of each pixel inside a shape, from the signed distance to its edge (negative inside,
        in 96-pixel units): one pixel of anti-aliasing, ``soft`` pixels more of blur."""
        return np.clip(0.5 - distance * self.scale / (1.0 + soft * self.scale), 0.0, 1.0)

    def paint(self, cover: np.ndarray, colour) -> None:
        cover = cover[..., None]
        self.image = self.image * (1 - cover) + np.asarray(colour, np.float32) * cover

    def shade(self, cover: np.ndarray, strength: float) -> None:
        self.image = self.image * (1 - strength * cover[..., None])

    def disc(self, cx: float, cy: float, r: float) -> np.ndarray:
        return np.hypot(self.x - cx, self.y - cy) - r

    def box(self, cx: float, cy: float, half_w: float, half_h: float, angle: float = 0.0) -> np.ndarray:
        c, s = np.cos(angle), np.sin(angle)
        u, v = self.x - cx, self.y - cy
        qx, qy = np.abs(c * u + s * v) - half_w, np.abs(-s * u + c * v) - half_h
        outside = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0))
        return outside + np.minimum(np.maximum(qx, qy), 0)

    def polygon(self, points) -> np.ndarray:
        """Signed distance (exact inside, a close bound outside) to a convex polygon listed clockwise
        on screen (y down)."""
        pts = np.asarray(points, np.float32)
        out = None
        for (x0, y0), (x1, y1) in zip(pts, np.roll(pts, -1, axis=0)):
            ex, ey = x1 - x0, y1 - y0
            d = ((self.x - x0) * ey - (self.y - y0) * ex) / np.hypot(ex, ey)  # > 0 outside this edge
            out = d if out is None else np.maximum(out, d)
        return out

    def to_uint8(self) -> np.ndarray:
        return np.round(np.clip(self.image, 0, 1) * 255).astype(np.uint8)


def _table(canvas: _Canvas, light: float) -> None:
    """A wooden table top under a grey wall, lit from the upper left."""
    x, y = canvas.x, canvas.y
    grain = 0.035 * np.sin(0.45 * y + 2.2 * np.sin(0.07 * x)) + 0.02 * np.sin(1.3 * y + 0.3 * x)
    wood = np.stack([0.58 + grain, 0.43 + 0.8 * grain, 0.30 + 0.5 * grain], axis=-1)
    wall = np.broadcast_to(np.array([0.74, 0.75, 0.78], np.float32), wood.shape)
    horizon = canvas.coverage(y - 18.0)[..., None]  # 1 above the table's back edge
    image = wall * horizon + wood * (1 - horizon)
    image = image - 0.12 * canvas.coverage(np.abs(y - 18.5) - 0.6)[..., None]  # the table's edge
    falloff = 1.0 - 0.0018 * np.hypot(x - 10, y - 10)
    canvas.image = (image * (light * falloff)[..., None]).astype(np.float32)


def _cube(canvas: _Canvas, x: float, y: float, side: float, colour) -> None:
    """A cube standing on the table: its front, top and right faces, with a shadow on the table."""
    depth = 0.45 * side
    canvas.shade(canvas.coverage(canvas.box(x + side / 2 + 3, y + 2, side / 2 + 2, 3), soft=3), 0.35)
    colour = np.asarray(colour, np.float32)
    back, far = y - side - depth, x + side + depth  # the top face's back edge, the right face's far edge
    front = [(x, y), (x, y - side), (x + side, y - side), (x + side, y)]
    top = [(x, y - side), (x + depth, back), (far, back), (x + side, y - side)]
    right = [(x + side, y - side), (far, back), (far, y - depth), (x + side, y)]
    canvas.paint(canvas.coverage(canvas.polygon(front)), colour)
    canvas.paint(canvas.coverage(canvas.polygon(top)), np.minimum(colour * 1.35 + 0.08, 1))
    canvas.paint(canvas.coverage(canvas.polygon(right)), colour * 0.62)


def _hue(h: float) -> np.ndarray:
    """A saturated colour on the hue circle (``h`` in turns)."""
    k = (np.array([5.0, 3.0, 1.0]) + 6.0 * h) % 6.0
    return (0.92 - 0.75 * np.clip(np.minimum(k, 4 - k), 0, 1)).astype(np.float32)


# -- actions ------------------------------------------------------------------------------------------------
def smooth_actions(frames: int, rng: np.random.Generator, *, smoothness: float = 0.85,
                   scale: float = 0.7, width: int = 4) -> np.ndarray:
    """``(frames, width)`` actions in [-1, 1]: a mean-reverting random walk (each step keeps
    ``smoothness`` of the last value), ``scale`` its spread before clipping."""
    out = np.empty((frames, width), np.float32)
    a = rng.normal(0.0, scale, size=width)
    for t in range(frames):
        out[t] = np.clip(a, -1, 1)
        a = smoothness * a + np.sqrt(1 - smoothness ** 2) * rng.normal(0.0, scale, size=width)
    return out


# -- the scenes ---------------------------------------------------------------------------------------------
def _blob(frames: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    actions = smooth_actions(frames, rng)
    light = rng.uniform(0.92, 1.05)
    pos = rng.uniform([14, 34], [82, 84])
    radius, hue = rng.uniform(7.5, 10.0), rng.uniform(-0.03, 0.06)
    video = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        canvas = _Canvas(size)
        _table(canvas, light)
        _cube(canvas, 54.0, 56.0, 20.0, (0.16, 0.30, 0.78))
        canvas.shade(canvas.coverage(canvas.disc(pos[0] + 3, pos[1] + 4, radius), soft=4), 0.4)
        canvas.paint(canvas.coverage(canvas.disc(*pos, radius)), _hue(hue))
        # a highlight, so the blob reads as a ball and not a hole
        shine = canvas.disc(pos[0] - radius / 3, pos[1] - radius / 3, radius / 3.5)
        canvas.paint(0.5 * canvas.coverage(shine, soft=2), (1, 1, 1))
        video[t] = canvas.to_uint8()
        dx, dy, dz, dh = actions[t]
        pos = np.clip(pos + 3.0 * np.array([dx, dy]), [10, 28], [86, 88])
        radius = float(np.clip(radius * (1 + 0.04 * dz), 5.5, 13.0))
        hue = float(np.clip(hue + 0.01 * dh, -0.08, 0.14))
    return video, actions


def _pusher(frames: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    noise = smooth_actions(frames, rng, scale=0.6)
    light = rng.uniform(0.92, 1.05)
    hand = rng.uniform([16, 30], [80, 84])
    puck = rng.uniform([24, 36], [72, 78])
    puck_r, height, grip = 8.0, rng.uniform(0.2, 0.9), rng.uniform(0.2, 1.0)
    seek = rng.random(frames + 8) < 0.55  # the demonstrator heads for the puck part of the time
    video = np.empty((frames, size, size, 3), np.uint8)
    actions = np.empty((frames, 4), np.float32)
    for t in range(frames):
        canvas = _Canvas(size)
        _table(canvas, light)
        canvas.shade(canvas.coverage(canvas.disc(*(puck + 2.5), puck_r), soft=3), 0.35)
        canvas.paint(canvas.coverage(canvas.disc(*puck, puck_r)), (0.95, 0.55, 0.10))
        canvas.paint(canvas.coverage(canvas.disc(*puck, puck_r * 0.45)), (0.98, 0.80, 0.35))
        scale = 0.8 + 0.35 * height  # a raised gripper is nearer the camera
        shadow = hand + 3.0 + 9.0 * height
        spread = 3.5 + 6.0 * grip
        canvas.shade(canvas.coverage(canvas.box(*shadow, 9 * scale, 5 * scale), soft=4), 0.3)
        canvas.paint(canvas.coverage(canvas.box(hand[0], hand[1] - 4 * scale, 9 * scale, 4 * scale)),
                     (0.32, 0.33, 0.36))
        for side in (-1, 1):
            canvas.paint(canvas.coverage(canvas.box(hand[0] + side * spread * scale, hand[1] + 4 * scale,
                                                    1.8 * scale, 6 * scale)), (0.62, 0.64, 0.68))
        video[t] = canvas.to_uint8()
        action = noise[t].copy()
        if seek[t]:  # toward the puck, low, fingers half open: a push follows
            to_puck = (puck - hand) / max(np.hypot(*(puck - hand)), 1e-6)
            action[:2] = np.clip(0.5 * action[:2] + 0.8 * to_puck, -1, 1)
            action[2] = np.clip(0.5 * action[2] - 0.6, -1, 1)
        actions[t] = action
        move = 3.0 * action[:2]
        hand = np.clip(hand + move, [8, 26], [88, 90])
        height = float(np.clip(height + 0.12 * action[2], 0.0, 1.0))
        grip = float(np.clip(grip + 0.15 * action[3], 0.0, 1.0))
        reach = puck_r + 7.0
        gap = puck - hand
        distance = float(np.hypot(*gap))
        if height < 0.45 and distance < reach:  # the low gripper shoves the puck out of its way
            puck = hand + gap / max(distance, 1e-6) * reach
            puck = np.clip(puck, [12, 28], [84, 88])
    return video, actions


def _camera(frames: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    actions = smooth_actions(frames, rng, scale=0.6)
    # the world: a table 240 pixels wide strewn with discs and boxes, seen through a 96-pixel window
    count = 40
    kinds = rng.integers(2, size=count)
    centres = rng.uniform(-120, 120, size=(count, 2))
    sizes = rng.uniform(6, 16, size=count)
    angles = rng.uniform(0, np.pi, size=count)
    colours = np.stack([_hue(h) for h in rng.uniform(0, 1, size=count)]) * rng.uniform(0.6, 1.0, (count, 1))
    cam, zoom, roll = rng.uniform(-50, 50, size=2), rng.uniform(0.85, 1.15), rng.uniform(-0.2, 0.2)
    video = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        canvas = _Canvas(size)
        c, s = np.cos(roll), np.sin(roll)
        u, v = (canvas.x - 48) / zoom, (canvas.y - 48) / zoom
        world = _Canvas(size)  # its coordinates replaced by the world's under this camera
        world.x, world.y = cam[0] + c * u - s * v, cam[1] + s * u + c * v
        world.scale = canvas.scale * zoom
        # soft tiles: a pattern that moves with the camera and does not alias at small sizes
        tiles = np.tanh(3 * np.sin(np.pi * world.x / 24) * np.sin(np.pi * world.y / 24))[..., None]
        world.image = np.float32([0.56, 0.485, 0.39]) + np.float32([0.04, 0.035, 0.03]) * tiles
        for k in range(count):
            shape = (world.disc(*centres[k], sizes[k] * 0.7) if kinds[k] == 0
                     else world.box(*centres[k], sizes[k] * 0.6, sizes[k] * 0.4, angles[k]))
            world.shade(world.coverage(shape - 2.0, soft=3), 0.3)
            world.paint(world.coverage(shape), colours[k])
        video[t] = world.to_uint8()
        px, py, dz, dr = actions[t]
        cam = np.clip(cam + 3.0 * np.array([px, py]) / zoom, -80, 80)
        zoom = float(np.clip(zoom * (1 + 0.04 * dz), 0.7, 1.4))
        roll = float(np.clip(roll + 0.04 * dr, -0.6, 0.6))
    return video, actions


_RENDER: dict[str, Callable[[int, int, np.random.Generator], tuple[np.ndarray, np.ndarray]]] = {
    "blob": _blob, "pusher": _pusher, "camera": _camera}


def _check_scene(scene: str) -> None:
    if scene not in _RENDER:
        raise DataError(f"No scene called {scene!r}. The scenes: {listing(SCENES)}."
                        f"{did_you_mean(scene, list(SCENES))}")


def render_episode(scene: str, *, frames: int, size: int = 96,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One episode of ``scene``: uint8 frames ``(frames, size, size, 3)`` and float32 actions
    ``(frames, 4)`` in [-1, 1] (see :data:`ACTION_NAMES`); a pure function of its arguments."""
    _check_scene(scene)
    if frames < 2 or size < 8:
        raise DataError(f"An episode needs frames >= 2 and size >= 8 pixels, "
                        f"got frames={frames}, size={size}.")
    return _RENDER[scene](frames, size, np.random.default_rng([seed, SCENES.index(scene)]))


def _write_table(path: Path, actions: np.ndarray, names: tuple[str, ...]) -> None:
    if path.suffix == ".npy":
        np.save(path, actions)
    elif path.suffix == ".csv":
        rows = [",".join(names)] + [",".join(f"{v:.6f}" for v in row) for row in actions]
        path.write_text("\n".join(rows) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({n: actions[:, i] for i, n in enumerate(names)}), path)


def write_scene_folder(out: str | Path, scene: str = "blob", *, episodes: int = 48,
                       frames: tuple[int, int] | int = (32, 60), size: int = 96, fps: float | None = None,
                       seed: int = 0, table: str = "npy", crf: int = 20) -> Path:
    """A folder of ``episodes`` clips of ``scene`` as a user records them, for ``workbench data import``:
    ``episode_NNN.mp4`` (H.264, ``size`` x ``size``, ``fps``: the scene's :data:`FPS` by default) and its
    actions as ``episode_NNN.<table>`` (``npy``, ``csv`` with a header of :data:`ACTION_NAMES`, or
    ``parquet`` with named columns). ``frames``: each episode's length, or the range ``(shortest,
    longest)`` lengths are drawn from. Deterministic given ``seed``.
    """
    from workbench.data.video_io import H264Writer

    _check_scene(scene)
    if table not in TABLE_FORMATS:
        raise DataError(f"table must be one of {listing(TABLE_FORMATS)}, got {table!r}.")
    low, high = (frames, frames) if isinstance(frames, int) else frames
    if not 2 <= low <= high or episodes < 1:
        raise DataError(f"Need episodes >= 1 and 2 <= shortest <= longest frames; "
                        f"got episodes={episodes}, frames={frames}.")
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out} exists and is not empty; the scene is written into a new folder. "
                        f"Choose another one (nothing was written).")
    out.mkdir(parents=True, exist_ok=True)
    lengths = np.random.default_rng([seed, 7]).integers(low, high + 1, size=episodes)
    for e, length in enumerate(lengths):
        video, actions = render_episode(scene, frames=int(length), size=size, seed=seed * 100_003 + e)
        name = f"episode_{e:03d}"
        writer = H264Writer(out / f"{name}.mp4", fps or FPS[scene], size, size, crf=crf)
        writer.write(video)
        writer.close()
        _write_table(out / f"{name}.{table}", actions, ACTION_NAMES[scene])
    return out


__all__ = ["ACTION_NAMES", "FPS", "SCENES", "render_episode", "smooth_actions", "write_scene_folder"]
