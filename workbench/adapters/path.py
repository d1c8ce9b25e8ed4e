"""The action path: where the commanded motion takes the hand, drawn into every frame.

For delta-position actions (Meta-World's: ``dx, dy, dz`` move the hand's target), the path is
built from the hand's **measured position at the first frame** and the **actions** only:

* the commanded target starts at the measured hand position and moves by ``scale`` metres per unit
  of action per frame: ``target[t] = target[t-1] + scale * action[t-1, xyz]``;
* the hand follows its target with a first-order lag: ``hand[t] = hand[t-1] + response *
  (target[t] - hand[t-1])`` (``response: 1`` puts the hand on its target);
* each frame's hand point is projected into the picture with the camera's calibration (the
  ``camera`` condition, a 3x4 projection to normalised image coordinates; see
  :mod:`workbench.data.camera`) and drawn as a Gaussian of ``sigma`` latent pixels on the latent
  grid; a second map marks the first frame's point (where the arm starts, in every frame).

Frame ``t`` shows the result of actions ``0 .. t-1``, so nothing of a later frame is read: neither
its picture nor its measured state. The path is computed inside the adapter's forward from the
``action`` condition, so an edit of the actions (a slider, a fork with other actions) moves it.

Used through the ``path:`` option of ``latent_residual`` and ``controlnet`` (see their configs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from workbench.config import check
from workbench.errors import CompositionError, ConfigError, DataError, did_you_mean, listing

#: The condition holding the calibration and its width: the 3x4 projection to normalised image coordinates
#: that the data readers serve (the same as :data:`workbench.data.camera.CAMERA_KEY` / ``CAMERA_DIM``).
CAMERA_KEY = "camera"
CAMERA_DIM = 12


@dataclasses.dataclass
class PathConfig:
    """``xyz``: which action dimensions move the hand along world x, y, z. ``scale``: metres the target moves
    per unit of action per frame (Meta-World: 0.01 per simulator step times the frames' ``action_repeat``;
    the shipped data holds each action for 2 steps, so 0.02). ``response``: the fraction of the gap to its
    target the hand closes per frame (0.25 fits the shipped data: 3.8 cm mean error of the path against the
    measured hand over 16 frames, 4.8 cm with the hand on its target). ``sigma``: the Gaussian's width in
    latent pixels. ``state``: the per-frame condition holding the measured hand position (its first
    frame is read). ``camera``: the per-sample condition with the calibration.

    ``translate`` (``latent_residual`` with ``use_first_frame``): also give the first frame's latent moved,
    in each frame, by the path's displacement in the picture since the first frame — what the arm near
    the start point looks like where the path says it is now (perspective and the arm's bending aside).

    ``measured``: draw the *recorded* hand position of every frame instead of the path the actions imply.
    That reads the future (the state of frames the model predicts), so it is not a world model: it is the
    ceiling a perfect path would reach, for measurements only."""

    xyz: tuple[int, int, int] = (0, 1, 2)
    scale: float = 0.02
    response: float = 0.25
    sigma: float = 1.0
    state: str = "ee_pos"
    camera: str = CAMERA_KEY
    translate: bool = True
    measured: bool = False

    def __post_init__(self):
        self.xyz = tuple(int(i) for i in self.xyz)
        check(len(self.xyz) == 3 and min(self.xyz) >= 0, "path.xyz",
              f"must be three action dimensions (dx, dy, dz), got {list(self.xyz)}.")
        check(self.scale > 0, "path.scale",
              f"must be > 0 (metres per unit action per frame), got {self.scale}.")
        check(0 < self.response <= 1, "path.response", f"must be in (0, 1], got {self.response}.")
        check(self.sigma > 0, "path.sigma", f"must be > 0 latent pixels, got {self.sigma}.")
        check(self.state.isidentifier() and self.camera.isidentifier(), "path",
              f"state and camera must be condition names, got {self.state!r}, {self.camera!r}.")

    @classmethod
    def coerce(cls, value: Any) -> PathConfig | None:
        """``None`` → no path; a mapping → its fields (``{}``: the defaults); a PathConfig as is."""
        if value is None or isinstance(value, PathConfig):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"path: must be a mapping of "
                              f"{listing([f.name for f in dataclasses.fields(cls)])} "
                              f"(or {{}} for the defaults), or null; got {type(value).__name__}.")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ConfigError(f"path: unknown option(s) {listing(unknown)}. Allowed: {listing(names)}."
                              f"{did_you_mean(unknown[0], names)}")
        return cls(**value)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "xyz": list(self.xyz)}

    @classmethod
    def checked(cls, value: Any, dim: int) -> dict[str, Any]:
        """An adapter config's ``path:`` (not ``None``) in full, checked against its action width ``dim``."""
        path = cls.coerce(value).as_dict()
        check(max(path["xyz"]) < dim, "path", f"reads action dimensions {path['xyz']}, but the condition has "
                                              f"dim: {dim}.")
        return path


#: Maps the path draws per frame: the hand's point now, and where it started.
PATH_CHANNELS = 2
#: Numbers per frame the path adds to a per-frame signal: the point (u, v) and its motion since frame 0.
PATH_SIGNAL = 4


def hand_path(action: torch.Tensor, start: torch.Tensor, cfg: PathConfig) -> torch.Tensor:
    """The hand positions ``(B, T, 3)`` the actions ``(B, T, A)`` imply from ``start`` ``(B, 3)``."""
    delta = action[..., list(cfg.xyz)].to(start.dtype) * cfg.scale  # (B, T, 3)
    target, hand = start, start
    points = [start]
    for t in range(1, action.shape[1]):
        target = target + delta[:, t - 1]
        hand = hand + cfg.response * (target - hand)
        points.append(hand)
    return torch.stack(points, dim=1)


def project_points(points: torch.Tensor, camera: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """World points ``(B, T, 3)`` through normalised projections ``(B, 12)``: ``(u, v)`` in [0, 1] across the
    image ``(B, T, 2)`` and whether each is in front of the camera ``(B, T)``."""
    matrix = camera.reshape(-1, 3, 4).to(points.dtype)
    hom = torch.einsum("bij,btj->bti", matrix[:, :, :3], points) + matrix[:, None, :, 3]
    depth = hom[..., 2]
    front = depth > 1e-6
    return hom[..., :2] / torch.where(front, depth, torch.ones_like(depth))[..., None], front


def path_heatmap(uv: torch.Tensor, front: torch.Tensor, height: int, width: int,
                 sigma: float) -> torch.Tensor:
    """Gaussians at ``uv`` ``(B, T, 2)`` (normalised) on a
    ``height`` x ``width`` grid: ``(B, T, height, width)``."""
    ys = (torch.arange(height, device=uv.device, dtype=uv.dtype) + 0.5) / height
    xs = (torch.arange(width, device=uv.device, dtype=uv.dtype) + 0.5) / width
    dx = (xs.view(1, 1, 1, width) - uv[..., 0, None, None]) * width  # latent pixels
    dy = (ys.view(1, 1, height, 1) - uv[..., 1, None, None]) * height
    heat = torch.exp(-(dx.square() + dy.square()) / (2 * sigma**2))
    return heat * front[..., None, None].to(heat.dtype)


class ActionPath:
    """Renders the action path of a :class:`PathConfig` from an adapter's conditioning."""

    def __init__(self, config: PathConfig, owner: str):
        self.config, self.owner = config, owner

    def conditions(self, existing: tuple[str, ...] = ()) -> tuple:
        """The conditions it reads beyond the actions: the start state (unless already read) and the
        camera."""
        from workbench.core.conditions import Condition

        c = self.config
        state = () if c.state in existing else (Condition(c.state, dim=3, per_frame="keep"),)
        return (*state, Condition(c.camera, dim=CAMERA_DIM, required=False))

    def check_base(self, base: Any) -> None:
        """Refuse, when the adapter is composed with ``base``, a backbone that does not pass the
        calibration on to adapters (the path could never be drawn)."""
        provided = tuple(base.provides())
        camera = self.config.camera
        if camera not in provided:
            name = type(base).__name__
            raise CompositionError(
                f"{self.owner} with path: draws the hand's path through the camera's calibration "
                f"(the '{camera}' condition), but {name} does not pass it on to adapters: "
                f"its provides() lists {listing(provided)}. "
                f"The path runs on a backbone that supplies '{camera}' "
                f"(tiny_video does; the diffusers plugins do not yet). "
                f"With {name}, leave path: out (the adapter then reads the actions alone).")

    def points(self, cond: Any, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(u, v)`` ``(B, T, 2)`` of the hand on the path and whether it is in front of the camera
        ``(B, T)``."""
        c = self.config
        camera = getattr(cond, c.camera, None)
        if camera is None:
            received = [k for k in ("action", c.state) if getattr(cond, k, None) is not None]
            raise DataError(
                f"{self.owner} draws the action path into the picture and needs the camera's calibration, "
                f"but the batch has no '{c.camera}'. Received: {', '.join(received)}; "
                f"allowed: '{c.camera}', a ({CAMERA_DIM},) vector per clip "
                f"(the 3x4 projection to normalised image coordinates, CameraCalibration.vector()). "
                f"Fix: read data whose files record the calibration "
                f"(the metaworld and lerobot datasets then serve '{c.camera}'); "
                f"`workbench data calibrate FILE` adds it to files made before it was recorded.")
        state = getattr(cond, c.state).to(action.dtype)
        # (measured: every frame, the future)
        points = state if c.measured else hand_path(action, state[:, 0], c)
        return project_points(points, camera.to(action.dtype))

    def render(self, cond: Any, action: torch.Tensor, height: int,
               width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The maps ``(B, 2, T, height, width)`` (the point now, the start point) and the per-frame signal
        ``(B, T, 4)`` (``u - 0.5, v - 0.5`` and their change since frame 0, as fractions of the picture)."""
        uv, front = self.points(cond, action)
        uv = uv.clamp(-1.0, 2.0)  # (a point far outside the picture draws nothing either way)
        frames = uv.shape[1]
        heat = path_heatmap(uv, front, height, width, self.config.sigma)  # (B, T, h, w)
        start = heat[:, :1].expand(-1, frames, -1, -1)
        maps = torch.stack([heat, start], dim=1)  # (B, 2, T, h, w)
        signal = torch.cat([uv - 0.5, uv - uv[:, :1]], dim=-1) * front[..., None].to(uv.dtype)
        return maps, signal


def translated(first: torch.Tensor, along: torch.Tensor) -> torch.Tensor:
    """``first`` ``(B, C, h, w)`` moved in each frame by the path's displacement since frame 0
    (``along[..., 2:]``, fractions of the picture, from :meth:`ActionPath.render`): ``(B, C, T, h, w)``,
    the border repeated."""
    b, c, h, w = first.shape
    frames = along.shape[1]
    def centres(n: int) -> torch.Tensor:  # pixel centres in grid_sample's [-1, 1] (align_corners=False)
        return (torch.arange(n, device=first.device, dtype=first.dtype) + 0.5) * (2.0 / n) - 1.0

    ys, xs = torch.meshgrid(centres(h), centres(w), indexing="ij")
    grid = torch.stack([xs, ys], dim=-1)  # (h, w, 2), x first as grid_sample expects
    shift = along[..., 2:].to(first.dtype) * 2.0  # fractions of the picture -> grid_sample's [-1, 1] units
    grid = grid - shift[:, :, None, None, :]  # (B, T, h, w, 2): read from where the point came from
    source = first[:, None].expand(b, frames, c, h, w).reshape(-1, c, h, w)
    moved = sample_border(source, grid.reshape(-1, h, w, 2), align_corners=False)
    return moved.view(b, frames, c, h, w).transpose(1, 2)


def sample_border(source: torch.Tensor, grid: torch.Tensor, *, align_corners: bool) -> torch.Tensor:
    """``grid_sample`` (bilinear, border padding) of ``source`` ``(N, C, h, w)`` at ``grid`` ``(N, h, w, 2)``,
    safe for any grid: coordinates are clamped to the picture ([-1, 1]) and NaN is taken as its centre.

    With border padding a coordinate outside the picture reads the border, so clamping changes neither
    the result nor a gradient, bit for bit. A NaN or infinite coordinate (from a NaN action) would make
    grid_sample's backward write outside its buffer on the CPU (a segmentation fault); here it reads the
    centre instead, and the NaN still reaches the loss through the adapter's other inputs, where the
    loop reports it.
    """
    safe = torch.nan_to_num(grid, nan=0.0, posinf=1.0, neginf=-1.0).clamp(-1.0, 1.0)
    return torch.nn.functional.grid_sample(source, safe, mode="bilinear", padding_mode="border",
                                           align_corners=align_corners)


__all__ = ["sample_border", "translated", "PATH_CHANNELS", "PATH_SIGNAL", "ActionPath", "PathConfig",
           "hand_path", "path_heatmap", "project_points"]
