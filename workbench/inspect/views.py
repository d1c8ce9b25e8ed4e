"""What the step-through view shows: plain state and the pictures it computes (no widgets).

    state = StepperState(traj, view="x0")       # traj from exp.sample(...)
    state.seek(10); state.set_frame(3)
    panels = state.panels()                    # one Panel per branch at step 10, frame 3
    state.fork_here(cond={"action": pushed})   # a second branch, side by side from now on
    state.export("outputs/steps.mp4")          # rows: steps, columns: branches

A :class:`ViewImage` holds every frame of one view of one step, ready to draw: RGB frames
(uint8) for the pictures, float maps for signed differences (drawn with a diverging colour
map centred on zero) and for gates. The widgets in ``workbench.widgets`` only draw these.

Views (``VIEWS``):

* ``x_t`` — the noisy latents entering the step;
* ``x0`` — the clean-sample estimate from the composed prediction (what the sampler uses);
* ``base`` — the clean-sample estimate from the frozen base's prediction alone;
* ``adapter`` — the adapter's raw output (a latent correction), through the linear part of
  the preview, mean over RGB: signed;
* ``composed`` — the composed prediction itself, rendered as if it were latents;
* ``adapter-base`` — ``x0`` minus ``base``: where and how the adapter changes the predicted
  video, mean over RGB: signed;
* ``gate`` — the composer's effective gate at each latent position (see :func:`effective_gate_map`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from workbench.core.callbacks import GateStatistics
from workbench.core.composers import Composer
from workbench.core.conditions import Batch
from workbench.inspect.colors import colorize
from workbench.inspect.common import InspectError, StepError, check_choice
from workbench.inspect.preview import DECODES, decode_chunked, preview_for, time_layout
from workbench.inspect.probes import gate_history
from workbench.inspect.trajectory import Trajectory, TrajectoryStep
from workbench.metrics import to_uint8_video

VIEWS = ("x_t", "x0", "base", "adapter", "composed", "adapter-base", "gate")
VIEW_LABELS = {
    "x_t": "x_t (noisy input)",
    "x0": "x0 estimate",
    "base": "base alone (x0)",
    "adapter": "adapter output",
    "composed": "composed prediction",
    "adapter-base": "adapter − base (x0)",
    "gate": "gate",
}
_VIEW_ALIASES = {"adapter - base": "adapter-base", "adapter − base": "adapter-base", "adapter_base": "adapter-base",
                 "xt": "x_t"}
Kind = Literal["rgb", "signed", "gate"]


_NEEDS = {"x_t": ("x_t",), "x0": ("x0",), "base": ("x_t", "base"), "adapter": ("adapter",),
          "composed": ("composed",), "adapter-base": ("x_t", "base", "composed"), "gate": ()}


def available_views(traj: Trajectory) -> tuple[str, ...]:
    """The views this trajectory's stored fields allow (``StoragePolicy.fields`` may keep fewer)."""
    return tuple(v for v in VIEWS if set(_NEEDS[v]) <= set(traj.storage.fields))


def normalise_view(view: str) -> str:
    """The canonical name of ``view`` (``"adapter − base"`` → ``"adapter-base"``), checked."""
    view = _VIEW_ALIASES.get(view, view) if isinstance(view, str) else view
    check_choice(view, VIEWS, "view", "x0 is the model's current guess of the clean video.")
    return view


# -- pictures --------------------------------------------------------------------------------
@dataclass
class Panel:
    """One picture: ``image`` is uint8 ``[H, W, 3]`` (``kind="rgb"``) or float ``[H, W]``.

    Float maps are drawn with ``cmap`` over ``[-limit, limit]`` (signed) or ``[0, limit]`` (gate);
    ``label`` says what the colours measure.
    """

    title: str
    kind: Kind
    image: np.ndarray
    label: str = ""
    limit: float = 1.0

    @property
    def cmap(self) -> str | None:
        return {"rgb": None, "signed": "diverging", "gate": "sequential"}[self.kind]

    @property
    def vrange(self) -> tuple[float, float]:
        return (-self.limit, self.limit) if self.kind == "signed" else (0.0, self.limit)

    def colored(self) -> np.ndarray:
        """uint8 ``[H, W, 3]``: the picture as drawn."""
        if self.kind == "rgb":
            return self.image
        return colorize(self.image, self.cmap, *self.vrange)


@dataclass
class ViewImage:
    """Every frame of one view of one step.

    ``title`` names the picture (the branch); ``caption`` what it shows (view, step, noise).
    ``frames``: uint8 ``[T, H, W, 3]`` (``rgb``) or float32 ``[T, H, W]`` (``signed`` / ``gate``).
    ``limit``: the colour range of a float map, the same for every frame (so scrubbing frames
    does not rescale the colours). ``given``: per frame, True where the frame is given to the
    model rather than predicted (the backbone's loss mask is 0 there), when that is known.
    """

    view: str
    title: str
    kind: Kind
    frames: np.ndarray
    label: str = ""
    limit: float = 1.0
    given: tuple[bool, ...] = ()
    caption: str = ""

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    def frame(self, i: int, limit: float | None = None) -> Panel:
        """Frame ``i`` as a :class:`Panel` (``limit`` overrides the colour range, e.g. to share it)."""
        if not 0 <= i < len(self):
            raise StepError(f"frame={i} is out of range: this view has {len(self)} frames (0..{len(self) - 1}).")
        return Panel(self.title, self.kind, self.frames[i], self.label, self.limit if limit is None else limit)

    def frame_name(self, i: int) -> str:
        """``"frame 3"``, or ``"frame 0 (given)"`` for a frame the model is given."""
        return f"frame {i}" + (" (given)" if i < len(self.given) and self.given[i] else "")

    def colored(self, limit: float | None = None) -> np.ndarray:
        """uint8 ``[T, H, W, 3]``: every frame as drawn."""
        if self.kind == "rgb":
            return self.frames
        return np.stack([self.frame(i, limit).colored() for i in range(len(self))])


def _limit(values: np.ndarray) -> float:
    """The symmetric colour range of a signed map: its largest magnitude (1 for an all-zero map)."""
    peak = float(np.abs(values).max()) if values.size else 0.0
    return peak if peak > 0 else 1.0


def render_float(base: Any, latents: torch.Tensor, decode: str = "preview", index: int = 0) -> np.ndarray:
    """Latents ``(B, C, T', h, w)`` → float frames ``[T, H, W, 3]`` in [-1, 1] of batch element ``index``."""
    check_choice(decode, DECODES, "decode", "Use 'preview' (fast, linear) or 'full' (the backbone's decoder).")
    z = latents[index:index + 1].to(device=base.device, dtype=base.dtype)
    video = decode_chunked(base, z) if decode == "full" else preview_for(base, tuple(z.shape[1:]))(z)
    return video[0].float().clamp(-1, 1).permute(1, 2, 3, 0).cpu().numpy()


def _uint8(frames: np.ndarray) -> np.ndarray:
    return to_uint8_video(np.moveaxis(frames, -1, 0))


def effective_gate_map(step: TrajectoryStep, index: int = 0) -> np.ndarray:
    """How much of the adapter's output reached the prediction at each latent position: ``[T, h, w]``.

    The product of what the composer reported in ``step.diagnostics``: a spatial ``mask``
    (``MaskMix``), a ``gate`` (``GatedResidual``; a per-channel gate is averaged over channels)
    and a ``noise_weight`` (``NoiseGated``). A composer that reports none of these (``Add``)
    passes the adapter through whole (1 everywhere); a step with the adapter off is 0 everywhere.
    """
    shape = next((v.shape for v in (step.x_t, step.x0, step.base, step.composed) if v is not None), None)
    if shape is None:
        raise InspectError(f"Step {step.index} stored no latent field, so its gate map has no shape; record with "
                           f"at least one of x_t, x0, base, composed in StoragePolicy.fields.")
    t, h, w = shape[2:]
    out = np.ones((t, h, w), dtype=np.float32)
    if "adapter" in step.stored and step.adapter is None:
        return np.zeros_like(out)
    d = step.diagnostics
    if "mask" in d:
        mask = d["mask"].float()
        mask = mask[index if mask.shape[0] > 1 else 0].mean(dim=0) if mask.ndim == 5 else mask.mean()
        out = out * np.broadcast_to(mask.cpu().numpy(), out.shape)
    if "gate" in d:
        out = out * float(d["gate"].float().mean())
    if "noise_weight" in d:
        weight = d["noise_weight"].float().reshape(-1)
        out = out * float(weight[index if weight.numel() > 1 else 0])
    return out


def find_gate_history(exp: Any) -> dict[str, np.ndarray] | None:
    """The gate history an experiment's gated composer recorded during training (``None`` if none).

    Reads the :class:`GateStatistics` callback the composer declared (``exp.component_callbacks``)
    or one the user added (``exp.callbacks``), through :func:`gate_history`.
    """
    for cb in [*getattr(exp, "component_callbacks", ()), *getattr(exp, "callbacks", ())]:
        if isinstance(cb, GateStatistics):
            return gate_history(cb) if cb.history else None
    return None


def condition_plots(model_or_adapter: Any, raw_or_batch: Mapping[str, Any] | Batch, step: int | None = None,
                    index: int = 0) -> dict[str, dict[str, Any]]:
    """What to plot for each declared condition, exactly as the adapter sees it (``adapter.view``).

    Returns ``{name: {"kind", "title", "values"}}`` for clip ``index``: ``"series"`` (per-frame
    values ``[T, D]``), ``"vector"`` (``[D]``), ``"image"`` (a latent frame ``(C, h, w)`` through
    the backbone's decoder, uint8 ``[H, W, 3]``, when a ``ComposedModel`` is given; otherwise
    the channel mean as a grey picture), ``"missing"`` (an absent optional condition, with a
    ``note``). ``step=k`` shows training step ``k``'s view (dropout included, in train mode).
    """
    from workbench.core.adapter import Adapter
    from workbench.core.composed import ComposedModel

    model = model_or_adapter if isinstance(model_or_adapter, ComposedModel) else None
    adapter = model.adapter if model is not None else model_or_adapter
    if not isinstance(adapter, Adapter):
        raise InspectError(f"condition_plots needs an Adapter or a ComposedModel, got "
                           f"{type(model_or_adapter).__name__}.")
    view = adapter.view(raw_or_batch, step=step)
    out: dict[str, dict[str, Any]] = {}
    for name, info in view.info.items():
        value = view.declared.get(name)
        title = name if info.key in (None, name) else f"{name} (from {info.key!r})"
        if not isinstance(value, torch.Tensor):
            out[name] = {"kind": "missing", "title": title, "values": None, "note": "missing (optional, None)"}
            continue
        v = value.detach().float().cpu()
        v = v[index if v.shape[0] > 1 else 0]
        if v.ndim == 2:
            out[name] = {"kind": "series", "title": f"{title}, per frame", "values": v.numpy()}
        elif v.ndim <= 1:
            out[name] = {"kind": "vector", "title": title, "values": v.reshape(-1).numpy()}
        elif v.ndim == 3:
            image = None
            if model is not None:
                try:  # a latent frame of the backbone: its preview
                    image = _uint8(render_float(model.base, v[None, :, None].to(value.dtype), "full"))[0]
                except InspectError:  # not shaped like the backbone's latents
                    image = None
            if image is None:
                grey = v.mean(dim=0).numpy()
                grey = (grey - grey.min()) / max(float(np.ptp(grey)), 1e-8)
                image = np.repeat((grey * 255).round().astype(np.uint8)[..., None], 3, axis=-1)
            out[name] = {"kind": "image", "title": title, "values": image}
        else:
            out[name] = {"kind": "missing", "title": title, "values": None,
                         "note": f"shape {tuple(v.shape)}: not plotted"}
    return out


def _given(batch: Batch, index: int, frames: int, causal: bool | None = True) -> tuple[bool, ...]:
    """Per shown frame, whether the model is given it (its latent frame has loss-mask 0).

    Shown frames map onto latent frames one to one, or as :func:`time_layout` lays them out
    (``causal``: the backbone's ``causal_latents``; by default the causal layout of the plugins'
    video VAEs); no labels where neither fits.
    """
    mask = batch.loss_mask
    if mask is None:
        return ()
    given = [bool(v == 0) for v in mask[index if mask.shape[0] > 1 else 0].tolist()]
    if len(given) == frames:
        return tuple(given)
    try:
        r, causal = time_layout(len(given), frames, causal)
    except InspectError:
        return ()
    if causal:
        return tuple(given[0 if j == 0 else 1 + (j - 1) // r] for j in range(frames))
    return tuple(given[j // r] for j in range(frames))


def _given_frames(traj: Trajectory, index: int, frames: int) -> tuple[bool, ...]:
    """:func:`_given` for ``traj``'s batch element ``index``, laid out as its backbone declares."""
    return _given(traj.batch, index, frames, getattr(traj.model.base, "causal_latents", None))


def view_image(traj: Trajectory, step: int, view: str, decode: str = "preview", index: int = 0) -> ViewImage:
    """One view (see the module docstring) of ``traj``'s step ``step`` for batch element ``index``."""
    view = normalise_view(view)
    rec = traj[step]
    base = traj.model.base
    title = traj.label
    caption = f"{VIEW_LABELS[view]} · step {rec.index} of {rec.steps} · noise level {float(rec.noise_level[0]):.2f}"
    if view == "gate":
        frames = effective_gate_map(rec, index)
        signed = bool((frames < 0).any())
        return ViewImage(view, title, "signed" if signed else "gate", frames, "effective gate",
                         _limit(frames) if signed else max(1.0, float(frames.max())),
                         _given_frames(traj, index, frames.shape[0]), caption)
    if view == "adapter":
        z = rec.get("adapter")[index:index + 1].to(device=base.device, dtype=base.dtype)
        preview = preview_for(base, tuple(z.shape[1:]))
        frames = preview.linear(z)[0].float().mean(dim=0).cpu().numpy()
        return ViewImage(view, title, "signed", frames, "adapter output (linear preview, mean RGB)", _limit(frames),
                         _given_frames(traj, index, frames.shape[0]), caption)
    obj = traj.model.objective
    if view in ("base", "adapter-base"):
        x_t, b = rec.get("x_t"), rec.get("base")
        base_x0 = obj.x0_from_prediction(b.to(x_t.dtype), x_t, rec.t.to(x_t.device))
        if view == "base":
            frames = _uint8(render_float(base, base_x0, decode, index))
            return ViewImage(view, title, "rgb", frames, given=_given_frames(traj, index, frames.shape[0]),
                             caption=caption)
        composed_x0 = obj.x0_from_prediction(rec.get("composed").to(x_t.dtype), x_t, rec.t.to(x_t.device))
        diff = (render_float(base, composed_x0, decode, index) - render_float(base, base_x0, decode, index)).mean(-1)
        return ViewImage(view, title, "signed", diff.astype(np.float32), "x0 difference (mean RGB, [-1, 1] units)",
                         _limit(diff), _given_frames(traj, index, diff.shape[0]), caption)
    frames = _uint8(render_float(base, rec.get(view), decode, index))
    return ViewImage(view, title, "rgb", frames, given=_given_frames(traj, index, frames.shape[0]), caption=caption)


# -- the stepper's state ---------------------------------------------------------------------
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
            raise InspectError("This trajectory stored no steps (record=False?); sample with record=True to step "
                               "through it.")
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
        self._cache: OrderedDict[tuple, ViewImage] = OrderedDict()
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
        return len(self.view_image(0))

    def seek(self, step: int) -> int:
        """Show step ``step`` (negative counts from the end); it must be a stored step."""
        self.step = self.trajectory.seek(step).index  # raises StepError naming the stored steps
        return self.step

    def step_by(self, delta: int) -> int:
        """Move ``delta`` stored steps forward (negative: back), stopping at the ends."""
        i = self.steps.index(self.step)
        return self.seek(self.steps[min(max(i + int(delta), 0), len(self.steps) - 1)])

    def set_frame(self, frame: int) -> int:
        n = self.frames
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)) or not 0 <= frame < n:
            raise StepError(f"frame={frame!r} is out of range: the video has {n} frames (0..{n - 1}).")
        self.frame = int(frame)
        return self.frame

    def set_view(self, view: str) -> str:
        view = normalise_view(view)
        if view not in self.views:
            raise InspectError(f"view={view!r} needs the fields {', '.join(_NEEDS[view])}, which this trajectory did "
                               f"not store (StoragePolicy fields={self.trajectory.storage.fields}); available views: "
                               f"{', '.join(self.views)}.")
        self.view = view
        return self.view

    @property
    def views(self) -> tuple[str, ...]:
        """The views the first trajectory's stored fields allow."""
        return available_views(self.trajectory)

    def set_decode(self, decode: str) -> str:
        check_choice(decode, DECODES, "decode", "Use 'preview' (fast, linear) or 'full' (the backbone's decoder).")
        self.decode = decode
        return self.decode

    # -- pictures --------------------------------------------------------------------------
    def view_image(self, branch: int = 0, step: int | None = None, view: str | None = None) -> ViewImage:
        traj = self.branches[branch]
        step = self.step if step is None else step
        view = self.view if view is None else normalise_view(view)
        key = (id(traj), step, view, self.decode, self.index)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        image = view_image(traj, step, view, self.decode, self.index)
        self._cache[key] = image
        while len(self._cache) > self.CACHE_SIZE:
            self._cache.popitem(last=False)
        return image

    def panels(self) -> list[Panel]:
        """One panel per branch at the current step and frame; float maps share one colour range."""
        images = [self.view_image(b) for b in range(len(self.branches))]
        limit = max(im.limit for im in images)
        return [im.frame(min(self.frame, len(im) - 1), limit) for im in images]

    def compare(self, views: Sequence[str] = ("x_t", "x0", "base", "adapter-base"), step: int | None = None,
                frame: int | None = None, branch: int = 0) -> list[Panel]:
        """Several views of one step and frame side by side, each titled by what it shows."""
        step = self.step if step is None else self.branches[branch][step].index
        frame = self.frame if frame is None else frame
        out = []
        for view in views:
            image = self.view_image(branch, step, view)
            panel = image.frame(min(frame, len(image) - 1))
            panel.title = VIEW_LABELS[normalise_view(view)]
            out.append(panel)
        return out

    def over_steps(self, steps: Sequence[int], view: str | None = None, frame: int | None = None,
                   branch: int = 0) -> list[Panel]:
        """One view of one frame at several steps (e.g. how the x0 estimate sharpens), titled by step."""
        frame = self.frame if frame is None else frame
        traj, out = self.branches[branch], []
        images = [self.view_image(branch, traj[s].index, view) for s in steps]
        limit = max(im.limit for im in images)
        for s, image in zip(steps, images):
            panel = image.frame(min(frame, len(image) - 1), limit)
            k = traj[s].index
            panel.title = f"step {k} · noise {float(traj.noise_levels[k]):.2f}"
            out.append(panel)
        return out

    def caption(self) -> str:
        """What the panels show: view, step, noise level and frame."""
        image = self.view_image(0)
        return f"{image.caption} · {image.frame_name(min(self.frame, len(image) - 1))}"

    # -- branches --------------------------------------------------------------------------
    def fork_here(self, cond: Mapping[str, Any] | Batch | None = None, adapter: Any = None,
                  composer: Composer | None = None, gate_override: float | torch.Tensor | None = None,
                  branch: int = 0, label: str | None = None) -> Trajectory:
        """Fork ``branches[branch]`` at the current step (:meth:`Trajectory.fork`) and show it alongside."""
        parent = self.branches[branch]
        fork = parent.fork(at=self.step, cond=cond, adapter=adapter, composer=composer,
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
        common = sorted(set.intersection(*(set(b.stored) for b in self.branches)))
        if len(common) <= 4:
            return common
        return list(dict.fromkeys(common[round(i * (len(common) - 1) / 3)] for i in range(4)))

    def export(self, path: str | Path, steps: Sequence[int] | None = None, fps: float | None = None,
               scale: int = 2) -> Path:
        """Write the current view as an MP4 / GIF grid: one row per step, one column per branch.

        Every frame of the video plays; ``steps`` default to four stored steps spread over the run.
        Float maps share one colour range over the whole grid.
        """
        from workbench.media import label_grid, write_video

        steps = list(steps) if steps is not None else self.default_export_steps()
        if not steps:
            raise InspectError("export has no steps to show: the branches share no stored step.")
        images = [[self.view_image(b, s) for b in range(len(self.branches))] for s in steps]
        limit = max(im.limit for row in images for im in row)
        rows = [[im.colored(limit) for im in row] for row in images]
        noise = self.trajectory.noise_levels
        row_labels = [f"step {s}\nnoise {float(noise[s]):.2f}" for s in steps]
        col_labels = [b.label for b in self.branches]
        grid = label_grid(rows, row_labels=row_labels, col_labels=col_labels, scale=scale)
        fps = fps or self.trajectory.model.base.card.sampling.fps or 10
        return write_video(path, grid, fps=fps)

    def describe(self) -> str:
        """A one-line summary (the view's plain-text form)."""
        noise = float(self.trajectory.noise_levels[self.step])
        names = ", ".join(b.label for b in self.branches)
        return (f"step {self.step} of {self.trajectory.steps} (noise {noise:.2f}), frame {self.frame} of "
                f"{self.frames}, view {self.view}, {self.decode} decode; branches: {names}")


__all__ = ["VIEWS", "VIEW_LABELS", "Panel", "StepperState", "ViewImage", "available_views", "condition_plots",
           "effective_gate_map",
           "find_gate_history", "normalise_view", "render_float", "view_image"]
