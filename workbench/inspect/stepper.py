"""The step-through view's state: which step, frame, view and decode, and which branches (no widgets).

    state = StepperState(traj, view="x0")       # traj from exp.sample(...)
    state.seek(10); state.set_frame(3)
    panels = state.panels()                    # one Panel per branch at step 10, frame 3
    state.fork_here(cond={"action": pushed})   # a second branch, side by side from now on
    state.export("outputs/steps.mp4")          # rows: steps, columns: branches

Views (``VIEWS``, see :mod:`workbench.inspect.views`):

* ``x_t`` — the noisy latents entering the step;
* ``x0`` — the clean-sample estimate from the composed prediction (what the sampler uses);
* ``base`` — the clean-sample estimate from the frozen base's prediction alone;
* ``adapter`` — the adapter's raw output (a latent correction), through the linear part of
  the preview, mean over RGB: signed;
* ``composed`` — the composed prediction itself, rendered as if it were latents;
* ``adapter-base`` — ``x0`` minus ``base``: where and how the adapter changes the predicted
  video, mean over RGB: signed;
* ``gate`` — the composer's effective gate at each latent position (see
  :func:`~workbench.inspect.views.effective_gate_map`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from workbench.core.composers import Composer
from workbench.core.conditions import Batch
from workbench.inspect.cache import LRUCache
from workbench.inspect.common import InspectError, check_choice, check_frame
from workbench.inspect.previews.decoding import DECODE_HINT
from workbench.inspect.previews.pictures import Panel, ViewImage, shared_limit
from workbench.inspect.previews.preview import DECODES
from workbench.inspect.recording.export import default_steps, write_grid
from workbench.inspect.recording.trajectory import Trajectory
from workbench.inspect.views import VIEW_LABELS, VIEW_NEEDS, available_views, normalise_view, view_image


class StepperState:
    """Where a step-through view is: which step, frame, view and decode, and which branches.

    ``frame`` defaults to the last frame (where a predicted video has moved furthest).
    ``branches[0]`` is the trajectory given; :meth:`fork_here` adds forks of it (or of another
    branch), shown side by side. Pictures are cached per (branch, step, view, decode), so
    scrubbing back and forth or moving the frame does not recompute them.
    """

    CACHE_SIZE = 64

    def __init__(self, trajectory: Trajectory, view: str = "x0", decode: str = "preview", index: int = 0,
                 frame: int | None = None):
        if not isinstance(trajectory, Trajectory):
            raise InspectError(f"StepperState needs a Trajectory (exp.sample(...) returns one), got "
                               f"{type(trajectory).__name__}.")
        if not trajectory.stored:
            raise InspectError("This trajectory stored no steps (record=False?); "
                               "sample with record=True to step through it.")
        b = trajectory.batch.batch_size
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < b:
            raise InspectError(f"index={index!r} is not a batch element; this batch has {b} (0..{b - 1}).")
        self.branches: list[Trajectory] = [trajectory]
        self.index = index
        self.view = "gate"
        self.set_view(view)
        check_choice(decode, DECODES, "decode")
        self.decode = decode
        self.step = trajectory.position if trajectory.position in trajectory.stored else trajectory.stored[0]
        self._cache: LRUCache[ViewImage] = LRUCache(self.CACHE_SIZE)
        self.frame = 0
        self.set_frame(self.frames - 1 if frame is None else frame)  # default: the last frame

    # -- navigation ------------------------------------------------------------------------
    @property
    def trajectory(self) -> Trajectory:
        return self.branches[0]

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps the view can show: those the first trajectory stored."""
        return self.trajectory.stored

    @property
    def frames(self) -> int:
        """Frames of the rendered video at the current step (and view)."""
        return len(self._shown(0))

    def seek(self, step: int) -> int:
        """Show step ``step`` (negative counts from the end); it must be a stored step."""
        self.step = self.trajectory.seek(step).index  # raises StepError naming the stored steps
        return self.step

    def step_by(self, delta: int) -> int:
        """Move ``delta`` stored steps forward (negative: back), stopping at the ends."""
        i = self.steps.index(self.step)
        return self.seek(self.steps[min(max(i + int(delta), 0), len(self.steps) - 1)])

    def set_frame(self, frame: int) -> int:
        self.frame = check_frame(frame, self.frames)
        return self.frame

    def set_view(self, view: str) -> str:
        view = normalise_view(view)
        if view not in self.views:
            needs = ", ".join(VIEW_NEEDS[view])
            raise InspectError(f"view={view!r} needs the fields {needs}, which this trajectory did "
                               f"not store (StoragePolicy fields={self.trajectory.storage.fields}); "
                               f"available views: {', '.join(self.views)}.")
        self.view = view
        return self.view

    @property
    def views(self) -> tuple[str, ...]:
        """The views the first trajectory's stored fields allow."""
        return available_views(self.trajectory)

    def fidelity(self) -> dict[str, float | None]:
        """Held-out PSNR (dB against the full decode) of each decode: the linear preview's, the tiny
        preview's (``None`` until one is distilled or cached) and ``inf`` for the full decode."""
        from workbench.inspect.previews.latent_space import is_pixel_space
        from workbench.inspect.previews.linear_preview import preview_for
        from workbench.inspect.previews.tiny_preview import cached_tiny_preview

        base = self.trajectory.model.base
        rec = self.trajectory[self.step]
        latents = next((v for v in (rec.x_t, rec.x0, rec.composed, rec.base) if v is not None), None)
        if latents is None:
            return {"preview": None, "tiny": None, "full": math.inf}
        shape = tuple(latents.shape[1:])
        if is_pixel_space(base, shape[0]):
            return {"preview": math.inf, "tiny": None, "full": math.inf}
        tiny = cached_tiny_preview(base)
        return {"preview": preview_for(base, shape).psnr, "tiny": None if tiny is None else tiny.psnr,
                "full": math.inf}

    def set_decode(self, decode: str) -> str:
        check_choice(decode, DECODES, "decode", DECODE_HINT)
        self.decode = decode
        return self.decode

    # -- pictures --------------------------------------------------------------------------
    def view_image(self, branch: int = 0, step: int | None = None, view: str | None = None,
                   frame: int | None = None) -> ViewImage:
        """The picture of one branch, step and view (all frames; with ``frame``, only that frame where
        the backbone decodes frames alone: see :func:`~workbench.inspect.views.view_image`)."""
        traj = self.branches[branch]
        step = self.step if step is None else step
        view = self.view if view is None else normalise_view(view)
        key = (id(traj), step, view, self.decode, self.index, frame)
        return self._cache.get(key, lambda: view_image(traj, step, view, self.decode, self.index, frame))

    def _shown(self, branch: int, step: int | None = None, view: str | None = None,
               frame: int | None = None) -> ViewImage:
        """The picture holding frame ``frame`` (default: the current one), decoding no more than it needs."""
        frame = self.frame if frame is None else frame
        whole = (id(self.branches[branch]), self.step if step is None else step,
                 self.view if view is None else normalise_view(view), self.decode, self.index, None)
        if whole in self._cache:
            return self._cache.get(whole, lambda: None)
        image = self.view_image(branch, step, view, frame)
        if image.partial and not image.start <= frame < image.start + image.frames.shape[0]:
            return self.view_image(branch, step, view)
        return image

    def panels(self) -> list[Panel]:
        """One panel per branch at the current step and frame; float maps share one colour range."""
        images = [self._shown(b) for b in range(len(self.branches))]
        limit = shared_limit(images)
        return [im.frame(min(self.frame, len(im) - 1), limit) for im in images]

    def compare(self, views: Sequence[str] = ("x_t", "x0", "base", "adapter-base"), step: int | None = None,
                frame: int | None = None, branch: int = 0) -> list[Panel]:
        """Several views of one step and frame side by side, each titled by what it shows."""
        step = self.step if step is None else self.branches[branch][step].index
        frame = self.frame if frame is None else frame
        out = []
        for view in views:
            image = self._shown(branch, step, view, frame)
            panel = image.frame(min(frame, len(image) - 1))
            panel.title = VIEW_LABELS[normalise_view(view)]
            out.append(panel)
        return out

    def over_steps(self, steps: Sequence[int], view: str | None = None, frame: int | None = None,
                   branch: int = 0) -> list[Panel]:
        """One view of one frame at several steps (e.g. how the x0 estimate sharpens), titled by step."""
        frame = self.frame if frame is None else frame
        traj, out = self.branches[branch], []
        images = [self._shown(branch, traj[s].index, view, frame) for s in steps]
        limit = shared_limit(images)
        for s, image in zip(steps, images):
            panel = image.frame(min(frame, len(image) - 1), limit)
            k = traj[s].index
            panel.title = f"step {k} · noise {float(traj.noise_levels[k]):.2f}"
            out.append(panel)
        return out

    def caption(self) -> str:
        """What the panels show: view, step, noise level and frame."""
        image = self._shown(0)
        return f"{image.caption} · {image.frame_name(min(self.frame, len(image) - 1))}"

    # -- branches --------------------------------------------------------------------------
    def fork_here(self, cond: Mapping[str, Any] | Batch | None = None, with_adapter: bool | None = None,
                  composer: Composer | None = None, gate_override: float | torch.Tensor | None = None,
                  branch: int = 0, label: str | None = None) -> Trajectory:
        """Fork ``branches[branch]`` at the current step (:meth:`Trajectory.fork`) and show it alongside."""
        parent = self.branches[branch]
        fork = parent.fork(at=self.step, cond=cond, with_adapter=with_adapter, composer=composer,
                           gate_override=gate_override, label=label)
        self.branches.append(fork)
        return fork

    def remove_branch(self, branch: int) -> None:
        if branch == 0 or not 0 < branch < len(self.branches):
            raise InspectError(f"branch={branch!r}: only forks (1..{len(self.branches) - 1}) can be removed; "
                               f"branch 0 is the trajectory being stepped through.")
        self.branches.pop(branch)

    # -- export ----------------------------------------------------------------------------
    def default_export_steps(self) -> list[int]:
        """Up to four steps every branch stored, spread over the run."""
        return default_steps(self.branches)

    def export(self, path: str | Path, steps: Sequence[int] | None = None, fps: float | None = None,
               scale: int = 2) -> Path:
        """Write the current view as an MP4 / GIF grid: one row per step, one column per branch.

        Every frame of the video plays; ``steps`` default to four stored steps spread over the run.
        Float maps share one colour range over the whole grid.
        """
        steps = list(steps) if steps is not None else self.default_export_steps()
        images = [[self.view_image(b, s) for b in range(len(self.branches))] for s in steps]
        limit = shared_limit([im for row in images for im in row])
        rows = [[im.colored(limit) for im in row] for row in images]
        return write_grid(path, self.branches, steps, rows, fps=fps, scale=scale)

    def describe(self) -> str:
        """A one-line summary (the view's plain-text form)."""
        noise = float(self.trajectory.noise_levels[self.step])
        names = ", ".join(b.label for b in self.branches)
        return (f"step {self.step} of {self.trajectory.steps} (noise {noise:.2f}), frame {self.frame} of "
                f"{self.frames}, view {self.view}, {self.decode} decode; branches: {names}")


__all__ = ["StepperState"]
