"""Driving a world model by hand: the logic of the Drive view, without widgets.

:class:`DriveState` holds a :class:`~workbench.inspect.recording.rollouts.Rollout` that grows one chunk per
step: set the next chunk's action (from slider values, :meth:`DriveState.set_action`, or a key,
:meth:`DriveState.press`), :meth:`~DriveState.step` predicts the chunk from the last frame(s) the
model itself produced, :meth:`~DriveState.undo` drops the last chunk, :meth:`~DriveState.branch`
forks the episode at a chunk with the current action (the old line is kept, and
:meth:`~DriveState.switch` goes back to it), and :meth:`~DriveState.save` writes the driven
episode as a clip file that :class:`workbench.data.metaworld.MetaWorldClips` reads. The path (a
readout of every predicted frame: by default the state reader's own, e.g. the hand probe's, in cm)
is what the view draws over the frames; :meth:`~DriveState.trajectory` is chunk ``k``'s recorded
sampling run, for the Stepper.

Examples:
    >>> drive = DriveState(model, start=val[0], steps=4, state="probe")   # its first frame; the hand probe
    ...                                                                   # reads the state and the path
    >>> drive.press("ArrowRight")                          # the next chunk's action: dx = +1
    array([1., 0., 0., 0.], dtype=float32)
    >>> drive.step().frames                                # chunk 0: the frames it predicted
    range(1, 16)
    >>> drive.step([0, 1, 0, 0]).frames                    # chunk 1 continues from chunk 0's last frame
    range(16, 31)
    >>> drive.path().shape                                 # the hand the probe reads off each frame, cm
    (31, 3)
    >>> drive.save("outputs/driven.h5")                    # MetaWorldClips(path=..., split="all") reads it
    PosixPath('outputs/driven.h5')
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.core.composed import ComposedModel
from workbench.inspect.common import InspectError, check_model
from workbench.metrics import to_uint8_video

#: What each key does to the next chunk's action: ``(dimension, value)`` pairs; the motion keys set
#: one direction of the hand (the other motion dimensions go to zero), the gripper keys its effort.
KEYS: dict[str, tuple[tuple[int, float], ...]] = {
    "ArrowRight": ((0, 1.0), (1, 0.0), (2, 0.0)),
    "ArrowLeft": ((0, -1.0), (1, 0.0), (2, 0.0)),
    "ArrowUp": ((0, 0.0), (1, 1.0), (2, 0.0)),
    "ArrowDown": ((0, 0.0), (1, -1.0), (2, 0.0)),
    "PageUp": ((0, 0.0), (1, 0.0), (2, 1.0)),
    "PageDown": ((0, 0.0), (1, 0.0), (2, -1.0)),
    ".": ((0, 0.0), (1, 0.0), (2, 0.0)),
    "c": ((3, 1.0),),
    "o": ((3, -1.0),),
}
#: What the keys mean, for a view to print.
KEY_HELP = ("← → dx, ↑ ↓ dy, PageUp / PageDown dz (one chunk each, at the speed set), "
            ". holds the hand still, c closes and o opens the gripper")
DIM_NAMES = ("dx", "dy", "dz", "grip")


@dataclass(frozen=True)
class ChunkTiming:
    """What predicting one chunk cost: wall time, this process's CPU time, and the sampling steps."""

    chunk: int
    wall_s: float
    cpu_s: float
    steps: int


class DriveState:
    """A rollout driven one chunk at a time.

    Args:
        model: the :class:`~workbench.core.composed.ComposedModel` to drive
            (an experiment's is ``exp.model``).
        start: one raw clip (``{"video": (3, T, H, W), "action": (T, D), ...}``, as a clip source
            serves it): the episode starts at its first frame and its state there; nothing later is read.
        steps: sampling steps per chunk (fewer: faster, coarser; the view says how many).
        seed: chunk ``k`` samples with a seed mixed from ``(seed, k)``.
        readout: frames → positions (:class:`workbench.inspect.Readout`) for the path; ``"state"`` (default):
            the state reader's own readout (:meth:`~workbench.inspect.StateReader.readout`: the hand probe's
            draws the hand in cm), or no path where there is none or it cannot read the frames
            (:attr:`readout_note` says why); ``None``: no path.
        speed: the magnitude a key sets (actions are in [-1, 1]).
        state: where a chunk's state comes from, as :func:`workbench.inspect.rollout` takes it (default
            None: no state; ``"probe"``: the world-model wing's hand probe).
        gate_scale: sample with the adapter's learned gate times this (as the demo samples: 2).
        dim_names: a name per action dimension (default ``dx, dy, dz, grip``).
    """

    def __init__(self, model: ComposedModel, start: Mapping[str, Any], *, steps: int = 8, seed: int = 0,
                 readout: Any = "state", speed: float = 1.0, state: Any = None,
                 gate_scale: float | None = None, dim_names: Sequence[str] | None = None):
        model = check_model(model, "DriveState")
        if not isinstance(start, Mapping) or "video" not in start or "action" not in start:
            got = sorted(start) if isinstance(start, Mapping) else type(start).__name__
            raise InspectError(f"start must be one raw clip with 'video' (3, T, H, W) and 'action' (T, D), "
                               f"as a clip source serves it (e.g. MetaWorldClips(...)[i]); got {got}.")
        video = torch.as_tensor(start["video"])
        if video.ndim != 4 or video.shape[0] != 3:
            raise InspectError(f"start['video'] must be one clip (3, T, H, W), "
                               f"got shape {tuple(video.shape)}; pass clips[i], not a collated batch.")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InspectError(f"steps must be a positive int (sampling steps per chunk), got {steps!r}.")
        if not (isinstance(speed, (int, float)) and 0 < speed <= 1):
            raise InspectError(f"speed must be in (0, 1] (actions are in [-1, 1]), got {speed!r}.")
        self.model = model
        self.start = dict(start)
        self.steps, self.seed, self.speed = steps, seed, float(speed)
        self.state_source, self.gate_scale = state, gate_scale
        self.dims = int(torch.as_tensor(start["action"]).shape[-1])
        names = tuple(dim_names) if dim_names is not None else DIM_NAMES[:self.dims]
        if len(names) != self.dims:
            names = tuple(f"a{d}" for d in range(self.dims))
        self.dim_names = names
        self.frame_size = (int(video.shape[-2]), int(video.shape[-1]))
        self.readout, self.readout_note = _readout(readout, state, to_uint8_video(video[:, :1]))
        self.action = np.zeros(self.dims, np.float32)
        self.rollout: Any = None  # the current line: a Rollout, or None before the first chunk
        self.branches: list[Any] = []  # other lines kept by branch() (each a Rollout)
        self.timings: list[ChunkTiming] = []
        self._paths: dict[tuple, tuple] = {}  # (run, frames) -> (the run, the readout of those frames)

    # -- the next chunk's action ---------------------------------------------------------------
    def set_action(self, values: Sequence[float] | Mapping[str, float]) -> np.ndarray:
        """Set the next chunk's action from slider values (a value per dimension, or ``{name: value}``)."""
        action = self.action.copy()
        if isinstance(values, Mapping):
            unknown = sorted(set(values) - set(self.dim_names))
            if unknown:
                raise InspectError(f"unknown action dimension(s) {unknown}; this model's actions are "
                                   f"{list(self.dim_names)}.")
            for name, value in values.items():
                action[self.dim_names.index(name)] = value
        else:
            given = np.asarray(values, np.float32).reshape(-1)
            if given.shape != (self.dims,):
                raise InspectError(f"an action needs {self.dims} values ({', '.join(self.dim_names)}), got "
                                   f"{given.shape[0]}.")
            action = given
        if not np.isfinite(action).all() or np.abs(action).max() > 1:
            raise InspectError(f"action values must be finite and in [-1, 1], got {action.tolist()}.")
        self.action = action.astype(np.float32)
        return self.action.copy()

    def press(self, key: str) -> np.ndarray:
        """The action a key sets for the next chunk (see :data:`KEYS`); returns it."""
        if key not in KEYS:
            raise InspectError(f"key {key!r} drives nothing; the keys are {', '.join(KEYS)} ({KEY_HELP}).")
        action = self.action.copy()
        for dim, value in KEYS[key]:
            if dim < self.dims:
                action[dim] = value * (self.speed if dim < 3 else 1.0)
        self.action = action
        return action.copy()

    # -- the episode -------------------------------------------------------------------------------
    @property
    def chunks(self) -> int:
        return 0 if self.rollout is None else len(self.rollout.chunks)

    @property
    def frames(self) -> int:
        return 0 if self.rollout is None else int(self.rollout.frame_count)

    def video(self) -> np.ndarray:
        """uint8 ``[F, H, W, 3]``: every frame of the episode so far
        (the start frame alone before a chunk)."""
        if self.rollout is None:
            return to_uint8_video(torch.as_tensor(self.start["video"][:, :1]))
        return np.asarray(self.rollout.video)

    def _chunk_actions(self, action: np.ndarray, count: int) -> torch.Tensor:
        return torch.from_numpy(np.tile(np.asarray(action, np.float32), (count, 1)))

    def step(self, action: Sequence[float] | None = None):
        """Predict one more chunk with ``action`` (default: the one set) held on each of its frames; returns
        the new :class:`~workbench.inspect.recording.rollouts.RolloutChunk`."""
        from workbench.inspect.recording.rollouts import rollout

        if action is not None:
            self.set_action(action)
        wall, cpu = time.perf_counter(), time.process_time()
        if self.rollout is None:
            count = self.window
            self.rollout = rollout(self.model, self.start, self._chunk_actions(self.action, count),
                                   steps=self.steps, seed=self.seed, state=self.state_source,
                                   gate_scale=self.gate_scale)
        else:
            self.rollout = self.rollout.extend(self._chunk_actions(self.action, self.stride))
        self._timed(len(self.rollout.chunks) - 1, wall, cpu)
        return self.rollout.chunks[-1]

    @property
    def window(self) -> int:
        """Frames of the first chunk: the backbone's clip length."""
        return int(self.model.base.clip().frames)

    @property
    def stride(self) -> int:
        """New frames each later chunk adds."""
        if self.rollout is not None:
            return int(self.rollout.stride)
        return self.window - self.context_frames

    @property
    def context_frames(self) -> int:
        return int(getattr(self.model.base.card, "context_frames", None) or 1)

    def undo(self) -> bool:
        """Drop the last chunk (the start frame stays); False when there is none."""
        if self.rollout is None:
            return False
        n = len(self.rollout.chunks)
        self.rollout = self.rollout.head(n - 1) if n > 1 else None
        return True

    def branch(self, chunk: int | None = None, at: int = 0, action: Sequence[float] | None = None):
        """Fork the episode at ``chunk`` (default: the last) with ``action`` (default: the one set) on that
        chunk's frames, from its recorded sampling step ``at`` (steps before it are replayed, not recomputed);
        the later chunks are rolled again from the fork's output. The current line is kept in
        :attr:`branches`; returns the new line. :meth:`branch_steps` does the same one chunk at a time."""
        for _ in self.branch_steps(chunk, at, action):
            pass
        return self.rollout

    def branch_steps(self, chunk: int | None = None, at: int = 0,
                     action: Sequence[float] | None = None) -> Iterator[tuple[int, int]]:
        """:meth:`branch`, one chunk at a time: the arguments are checked at once; the returned iterator keeps
        the current line in :attr:`branches`, samples the forked chunk, then each later chunk again, and
        after each one yields ``(chunk, last)``: the chunk just sampled and the last one to sample.
        :attr:`rollout` is the new line so far, so a view can show it growing; stopping early (not
        iterating further) leaves the new line shorter than the old one, which stays kept.

        The finished line equals :meth:`Rollout.fork` of the old line at the same chunk, bit for bit.
        """
        if self.rollout is None:
            raise InspectError("nothing to branch yet: step() at least one chunk first.")
        n = len(self.rollout.chunks)
        k = n - 1 if chunk is None else chunk
        if isinstance(k, bool) or not isinstance(k, int) or not -n <= k < n:
            raise InspectError(f"chunk={chunk!r} is not a chunk of this episode; it has {n} (0..{n - 1}).")
        k %= n
        if action is not None:
            self.set_action(action)
        return self._branching(self.rollout, k, at, self._chunk_actions(self.action, self.rollout.window))

    def _branching(self, old: Any, k: int, at: int, actions: torch.Tensor) -> Iterator[tuple[int, int]]:
        self.branches.append(old)
        last = len(old.chunks) - 1
        later = torch.as_tensor(old.actions)  # the old line's actions, kept for the chunks after the fork
        wall, cpu = time.perf_counter(), time.process_time()
        # chunks 0..k kept, chunk k forked with the new action on its window's frames
        self.rollout = old.head(k + 1).fork(chunk=k, at=at, cond={"action": actions})
        # as the rollout labels its chunks' runs (what the Stepper shows), and what this one was branched with
        self.rollout.chunks[k].trajectory.label = (f"chunk {k} (frames {self.rollout.chunks[k].start}..), "
                                                   f"branched: {self.action_text()}")
        self._timed(k, wall, cpu)
        yield k, last
        for j in range(k + 1, last + 1):
            wall, cpu = time.perf_counter(), time.process_time()
            self.rollout = self.rollout.extend(later[self.rollout.frame_count:old.chunks[j].frames.stop])
            self._timed(j, wall, cpu)
            yield j, last

    def _timed(self, chunk: int, wall: float, cpu: float) -> None:
        self.timings.append(ChunkTiming(chunk, time.perf_counter() - wall, time.process_time() - cpu,
                                        self.steps))

    def switch(self, branch: int) -> None:
        """Drive on from a line kept by :meth:`branch`
        (the current one takes its place in :attr:`branches`)."""
        if not 0 <= branch < len(self.branches):
            raise InspectError(f"branch={branch!r} is not a kept line; there are {len(self.branches)}.")
        self.branches[branch], self.rollout = self.rollout, self.branches[branch]

    def line_labels(self) -> list[str]:
        """A label per line kept in :attr:`branches` that tells it from the current line and the other kept
        ones: the first chunk where it differs from the current line, with its action there, and its
        length, e.g. ``"line 0 · chunk 2: dx=+1 · 16 chunks, 241 frames"`` (``all 0`` where that action is
        zero; a kept line that is the start of the current one: ``"line 1 · this line's first 3 chunks"``)."""
        current = [] if self.rollout is None else [c.trajectory for c in self.rollout.chunks]
        labels = []
        for i, line in enumerate(self.branches):
            mine = [c.trajectory for c in line.chunks]
            j = next((j for j, (a, b) in enumerate(zip(mine, current)) if a is not b),
                     min(len(mine), len(current)))
            if j == len(mine):
                labels.append(f"line {i} · this line's first {j} chunk{'s' if j != 1 else ''}")
                continue
            # the action held on the chunk (its first frame: a fork of the next chunk rewrites its last one)
            action = torch.as_tensor(line.actions)[line.chunks[j].frames.start]
            moved = [f"{name}={float(v):+.2g}" for name, v in zip(self.dim_names, action) if float(v) != 0]
            labels.append(f"line {i} · chunk {j}: {', '.join(moved) or 'all 0'} · {len(mine)} "
                          f"chunk{'s' if len(mine) != 1 else ''}, {line.frame_count} frames")
        return labels

    def action_text(self, action: Sequence[float] | None = None) -> str:
        """An action by its dimensions' names, e.g. ``"dx=+1.00, dy=+0.00, dz=+0.00, grip=+0.00"``
        (default: the next chunk's)."""
        values = self.action if action is None else action
        return ", ".join(f"{n}={float(v):+.2f}" for n, v in zip(self.dim_names, values))

    def trajectory(self, chunk: int):
        """Chunk ``chunk``'s recorded sampling run (a :class:`~workbench.inspect.Trajectory`),
        for the Stepper."""
        if self.rollout is None or not -len(self.rollout.chunks) <= chunk < len(self.rollout.chunks):
            raise InspectError(f"chunk={chunk!r} is not a chunk of this episode; it has {self.chunks} "
                               f"(0..{self.chunks - 1})." if self.chunks else "no chunk yet: step() first.")
        return self.rollout.chunks[chunk].trajectory

    def chunk_of(self, frame: int) -> int:
        return int(self.rollout.chunk_of(frame))

    def actions(self) -> np.ndarray:
        """float32 ``[F, D]``: the action at each frame of the episode so far."""
        if self.rollout is None:
            return np.zeros((0, self.dims), np.float32)
        a = torch.as_tensor(self.rollout.actions)
        return a.reshape(-1, a.shape[-1])[:self.frames].float().numpy()

    # -- the hand's path ----------------------------------------------------------------------
    def path(self) -> np.ndarray | None:
        """The readout of every frame so far, ``[F, D]`` in its unit (the hand in cm),
        or None without a readout.

        Each chunk's frames are read once (chunks are immutable), so a step reads only the new frames."""
        if self.readout is None:
            return None
        video = self.video()
        if self.rollout is None:
            return np.asarray(self.readout(video), np.float64)
        first = self.rollout.chunks[0].frames.start  # the given start frame(s) precede chunk 0's frames
        spans = {("start", 0, first): (None, range(0, first))}
        spans.update({(id(c.trajectory), c.frames.start, c.frames.stop): (c.trajectory, c.frames)
                      for c in self.rollout.chunks})  # keyed by the recorded run and the frames taken from it
        for key, (run, frames) in spans.items():
            if key not in self._paths:
                read = self.readout(video[frames.start:frames.stop]) if len(frames) else np.zeros((0, 0))
                self._paths[key] = (run, np.asarray(read, np.float64).reshape(len(frames), -1))
        self._paths = {k: self._paths[k] for k in spans}  # undone chunks free their runs
        return np.concatenate([v[1] for v in self._paths.values() if len(v[1])])

    def path_pixels(self) -> np.ndarray | None:
        """The path projected into the picture, pixel coordinates ``[F, 2]`` (u right, v down), or None where
        there is no readout in metres-convertible units or no camera calibration (``start["camera"]``)."""
        path = self.path()
        camera = self.start.get("camera")
        if path is None or camera is None or getattr(self.readout, "unit", "") not in ("cm", "m"):
            return None
        from workbench.data.camera import project

        metres = path / (100.0 if self.readout.unit == "cm" else 1.0)
        uv, depth = project(np.asarray(camera, np.float64).reshape(3, 4), metres)
        height, width = self.frame_size
        return uv * np.array([width, height])

    # -- saving -----------------------------------------------------------------------------------
    def save(self, path: str | Path, task: str | None = None) -> Path:
        """Write the driven episode as a Meta-World HDF5 clip file
        (schema of :mod:`workbench.data.metaworld`).

        ``frames``: the predicted frames (the start frame first), ``actions``: the actions driven,
        ``ee_pos``: the hand position the readout found on each predicted frame (metres; it is no measurement:
        the attribute ``ee_pos_source`` says so), ``proprio``: width 0 (nothing measures the joints of an
        imagined episode), ``task``: the start clip's task (or ``task``). The camera calibration of the start
        clip is recovered from its ``camera`` vector. Read it back with
        ``MetaWorldClips(path=..., window=..., split="all")``.
        """
        from workbench.extras import require

        require("data", what="saving a driven episode", modules=("h5py",))
        import h5py

        if self.rollout is None:
            raise InspectError("nothing to save yet: step() at least one chunk first.")
        out = Path(path).expanduser()
        if out.suffix not in (".h5", ".hdf5"):
            raise InspectError(f"save writes an HDF5 clip file; the path must end in .h5 or .hdf5, "
                               f"got {str(out)!r}.")
        frames = self.video()
        n = len(frames)
        actions = self.actions()
        path_cm = self.path()
        if path_cm is not None and getattr(self.readout, "unit", "") in ("cm", "m") and path_cm.shape[1] == 3:
            ee_pos = (path_cm / (100.0 if self.readout.unit == "cm" else 1.0)).astype(np.float32)
            source = (f"{getattr(self.readout, 'name', 'readout')} read off the predicted frames "
                      f"(not measured)")
        else:
            ee_pos = np.repeat(np.asarray(self.start.get("ee_pos", np.zeros((1, 3))), np.float32)[:1],
                               n, axis=0)
            source = "the start clip's measured position at frame 0, held (no readout in metres)"
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with h5py.File(partial, "w") as f:
            def put(name: str, data: np.ndarray) -> None:
                data = np.ascontiguousarray(data)[None]
                f.create_dataset(name, data=data, compression="gzip" if data.size else None,
                                 chunks=data.shape if data.size else None)

            put("frames", frames.astype(np.uint8))
            put("actions", actions.astype(np.float32))
            put("ee_pos", ee_pos)
            put("proprio", np.zeros((n, 0), np.float32))
            f.create_dataset("task",
                             data=np.array([task or str(self.start.get("task", "driven"))], dtype=object),
                             dtype=h5py.string_dtype())
            f.attrs["schema_version"] = 1
            f.attrs["frames"] = n
            f.attrs["episodes"] = 1
            f.attrs["size"] = self.frame_size[0]
            f.attrs["driven"] = True
            f.attrs["ee_pos_source"] = source
            f.attrs["sampling_steps"] = self.steps
            f.attrs["seed"] = self.seed
            f.attrs["chunks"] = self.chunks
            f.attrs["model"] = self.model.base.card.model_id
            fps = self.model.base.card.sampling.fps
            if fps:
                f.attrs["fps"] = float(fps)
            camera = self.start.get("camera")
            if camera is not None:
                height, width = self.frame_size
                for key, value in calibration_from_vector(np.asarray(camera), width,
                                                          height).to_attrs().items():
                    f.attrs[key] = value
        partial.replace(out)
        return out

    # -- what the view prints -------------------------------------------------------------------
    def describe(self) -> str:
        """A one-line summary (the view's plain-text form)."""
        action = self.action_text()
        where = (f"{self.chunks} chunk{'s' if self.chunks != 1 else ''}, {self.frames} frames"
                 if self.rollout is not None else "the start frame")
        text = f"{where}; next action {action}; {self.steps} sampling steps per chunk"
        if self.timings:
            text += f"; last chunk {self.timings[-1].wall_s:.2f} s"
        return text


def calibration_from_vector(vector: np.ndarray, width: int, height: int):
    """The :class:`~workbench.data.camera.CameraCalibration` whose ``vector()`` is ``vector``
    (a normalised 3x4 projection, as clips carry it as ``"camera"``), for frames ``width`` × ``height``:
    ``K`` and ``[R | t]`` by an RQ decomposition of the projection (``K`` with a positive diagonal and
    ``K[2, 2] = 1``)."""
    from workbench.data.camera import CameraCalibration

    p = np.asarray(vector, np.float64).reshape(3, 4) * np.array([[width], [height], [1.0]])
    m = p[:, :3]
    # RQ of m via QR of the row-reversed transpose
    flip = np.eye(3)[::-1]
    q, r = np.linalg.qr((flip @ m).T)
    k = flip @ r.T @ flip
    rot = flip @ q.T
    signs = np.diag(np.sign(np.diag(k)))
    k, rot = k @ signs, signs @ rot
    t = np.linalg.solve(k, p[:, 3])
    if np.linalg.det(rot) < 0:
        raise InspectError("the camera vector is not the projection of a camera in front of the scene "
                           "(its 3x3 part has a negative determinant); "
                           "pass the clip's own 'camera' as a clip source serves it.")
    extrinsics = np.eye(4)
    extrinsics[:3, :3], extrinsics[:3, 3] = rot, t  # K/k22 [R | t] = P/k22: the same projection
    scale = k[2, 2]
    return CameraCalibration(k / scale, extrinsics, int(width), int(height))


def _readout(readout: Any, state: Any, start_frame: np.ndarray) -> tuple[Any, str]:
    """The readout to draw the path with, and why there is none (or "")."""
    if readout is None:
        return None, "no path: no readout given"
    if isinstance(readout, str):
        if readout != "state":
            raise InspectError(f"readout={readout!r}: pass 'state' (the state reader's own readout), "
                               f"a Readout, or None.")
        from workbench.errors import DataError
        from workbench.inspect.recording.state import resolve_state

        reader, mode = resolve_state(state, "DriveState")
        if reader is None:
            return None, f"no path: state={state!r} reads nothing off the frames (pass readout=)"
        name = mode if isinstance(state, str) else reader.name
        hand = reader.readout()
        if hand is None:
            return None, f"no path: the state reader {name!r} offers no readout (pass readout=)"
        try:
            hand(start_frame)
        except (DataError, InspectError, ValueError) as err:
            return None, f"no path: the state reader {name!r} cannot read these frames ({err})"
        return hand, ""
    from workbench.inspect.probes.readout import check_readout

    return check_readout(readout), ""


__all__ = ["DIM_NAMES", "KEYS", "KEY_HELP", "ChunkTiming", "DriveState", "calibration_from_vector"]
