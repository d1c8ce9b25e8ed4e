"""The views of one recorded step: what each shows, and the :class:`ViewImage` it computes.

    image = view_image(traj, step=10, view="adapter-base")   # every frame, ready to draw
    image.frame(3)                                           # one Panel

The step-through state that scrubs and forks over these is
:class:`~workbench.inspect.stepper.StepperState`; pictures are defined in
:mod:`workbench.inspect.previews.pictures`.

Views (``VIEWS``):

* ``x_t`` — the noisy latents entering the step;
* ``x0`` — the clean-sample estimate from the composed prediction (what the sampler uses);
* ``base`` — the clean-sample estimate from the frozen base's prediction alone;
* ``adapter`` — the adapter's raw output (a latent correction), through the linear part of
  the preview, mean over RGB: signed;
* ``composed`` — the composed prediction itself (what the sampler is handed: a velocity for
  flow matching, noise for eps-prediction), through the linear part of the preview, mean over
  RGB: signed;
* ``adapter-base`` — ``x0`` minus ``base``: where and how the adapter changes the predicted
  video, mean over RGB: signed;
* ``gate`` — the composer's effective gate at each latent position (see :func:`effective_gate_map`).

Where the adapter does not act at a step — switched off for the branch, or outside a
``NoiseGated`` band — the views that concern it say so (:func:`adapter_note`) instead of failing
or showing a gate that does not apply.
"""

from __future__ import annotations

import numpy as np

from workbench.core.backbone import causal_latents
from workbench.core.composers import NoiseGated, composer_tree
from workbench.core.conditions import Batch
from workbench.inspect.common import InspectError, check_choice
from workbench.inspect.previews.decoding import as_uint8, render_float, render_float_frame
from workbench.inspect.previews.latent_space import time_layout
from workbench.inspect.previews.linear_preview import preview_for
from workbench.inspect.previews.pictures import ViewImage, signed_limit
from workbench.inspect.recording.step import TrajectoryStep
from workbench.inspect.recording.trajectory import Trajectory

VIEWS = ("x_t", "x0", "base", "adapter", "composed", "adapter-base", "gate")
"""The names of the step-through views, in the order the Stepper offers them (see the module docstring)."""
VIEW_LABELS = {
    "x_t": "x_t (noisy input)",
    "x0": "x0 estimate",
    "base": "base alone (x0)",
    "adapter": "adapter output",
    "composed": "composed prediction",
    "adapter-base": "adapter − base (x0)",
    "gate": "gate",
}
VIEW_ALIASES = {"adapter - base": "adapter-base", "adapter − base": "adapter-base",
                "adapter_base": "adapter-base", "xt": "x_t"}


VIEW_NEEDS = {"x_t": ("x_t",), "x0": ("x0",), "base": ("x_t", "base"), "adapter": ("adapter",),
              "composed": ("composed",), "adapter-base": ("x_t", "base", "composed"), "gate": ()}


def available_views(traj: Trajectory) -> tuple[str, ...]:
    """The views this trajectory's stored fields allow (``StoragePolicy.fields`` may keep fewer)."""
    return tuple(v for v in VIEWS if set(VIEW_NEEDS[v]) <= set(traj.storage.fields))


def normalise_view(view: str) -> str:
    """The canonical name of ``view`` (``"adapter − base"`` → ``"adapter-base"``), checked."""
    view = VIEW_ALIASES.get(view, view) if isinstance(view, str) else view
    check_choice(view, VIEWS, "view", "x0 is the model's current guess of the clean video.")
    return view


def effective_gate_map(step: TrajectoryStep, index: int = 0) -> np.ndarray:
    """How much of the adapter's output reached the prediction at each latent position: ``[T, h, w]``.

    The product of what the composer reported in ``step.diagnostics``: a spatial ``mask``
    (``MaskMix``), a ``gate`` (``GatedResidual``; a per-channel gate is averaged over channels)
    and a ``noise_weight`` (``NoiseGated``). A composer that reports none of these (``Add``)
    passes the adapter through whole (1 everywhere); a step with the adapter off is 0 everywhere.
    """
    shape = next((v.shape for v in (step.x_t, step.x0, step.base, step.composed) if v is not None), None)
    if shape is None:
        raise InspectError(f"Step {step.index} stored no latent field, so its gate map has no shape; "
                           f"record with at least one of x_t, x0, base, composed in StoragePolicy.fields.")
    t, h, w = shape[2:]
    out = np.ones((t, h, w), dtype=np.float32)
    if "adapter" in step.stored and step.adapter is None:
        return np.zeros_like(out)
    d = step.diagnostics
    if d.mask is not None:
        mask = d.mask.float()
        mask = mask[index if mask.shape[0] > 1 else 0].mean(dim=0) if mask.ndim == 5 else mask.mean()
        out = out * np.broadcast_to(mask.cpu().numpy(), out.shape)
    if d.gate is not None:
        out = out * float(d.gate.float().mean())
    if d.noise_weight is not None:
        weight = d.noise_weight.float().reshape(-1)
        out = out * float(weight[index if weight.numel() > 1 else 0])
    return out


def adapter_note(traj: Trajectory, step: TrajectoryStep, index: int = 0) -> str:
    """Why the adapter does not act at ``step`` of ``traj`` for clip ``index``, or ``""`` where it does.

    ``"adapter off here (this branch runs the base alone)"`` for a run or fork with the adapter
    off; ``"adapter off here (NoiseGated band 0.30–1.00, noise level 0.05)"`` where the noise
    level is outside the composer's band (the adapter ran, but its output has weight 0).
    """
    if "adapter" in step.stored and step.adapter is None:
        if traj.settings.with_adapter is False:
            return "adapter off here (this branch runs the base alone)"
        return "adapter off here (the model's adapter is disabled)"
    weight = step.diagnostics.noise_weight
    if weight is not None:
        w = weight.float().reshape(-1)
        if float(w[index if w.numel() > 1 else 0]) == 0:
            composer = traj.settings.composer if traj.settings.composer is not None else traj.model.composer
            gates = [c for c in composer_tree(composer) if isinstance(c, NoiseGated)]
            noise = step.noise_level.reshape(-1)
            level = float(noise[index if noise.numel() > 1 else 0])
            band = f"band {gates[0].lo:.2f}–{gates[0].hi:.2f}, " if gates else ""
            return f"adapter off here (NoiseGated {band}noise level {level:.2f})"
    return ""


def given_frames(batch: Batch, index: int, frames: int, causal: bool | None = True) -> tuple[bool, ...]:
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


def view_image(traj: Trajectory, step: int, view: str, decode: str = "preview", index: int = 0,
               frame: int | None = None) -> ViewImage:
    """One view (see :mod:`workbench.inspect.stepper` for what each shows) of ``traj``'s step ``step`` for
    batch element ``index``.

    ``frame``: render only that frame where the backbone's frames decode one latent frame at a time
    (``image.start == frame``, ``len(image)`` still the whole video's length); every frame otherwise.
    Signed maps are always rendered whole, so their colour range is the clip's.
    """
    view = normalise_view(view)
    rec = traj[step]
    base = traj.model.base
    title = traj.label
    caption = (f"{VIEW_LABELS[view]} · step {rec.index} of {rec.steps} · "
               f"noise level {float(rec.noise_level[0]):.2f}")
    off = adapter_note(traj, rec, index)

    def given(frames: int) -> tuple[bool, ...]:
        return given_frames(traj.batch, index, frames, causal_latents(base))

    def linear(z) -> np.ndarray:  # latents through the linear preview, mean over RGB: [T, H, W]
        z = z[index:index + 1].to(device=base.device, dtype=base.dtype)
        return preview_for(base, tuple(z.shape[1:])).linear(z)[0].float().mean(dim=0).cpu().numpy()

    if view == "gate":
        frames = effective_gate_map(rec, index)
        signed = bool((frames < 0).any())
        note = f"effective weight {float(frames.mean()):.2f}" + (f" · {off}" if off else "")
        return ViewImage(view, title, "signed" if signed else "gate", frames,
                         "effective gate (adapter weight)",
                         signed_limit(frames) if signed else max(1.0, float(frames.max())),
                         given(frames.shape[0]), caption, note=note)
    if view == "adapter":
        if rec.adapter is None and "adapter" in rec.stored:  # nothing ran: an empty map that says so
            like = next((v for v in (rec.x_t, rec.x0, rec.base, rec.composed) if v is not None), None)
            if like is None:
                raise InspectError(f"Step {rec.index}: {off}, "
                                   f"and no latent field was stored to size an empty map.")
            frames = np.zeros_like(linear(like))
        else:
            frames = linear(rec.get("adapter"))
        return ViewImage(view, title, "signed", frames, "adapter output (linear preview, mean RGB)",
                         signed_limit(frames), given(frames.shape[0]), caption, note=off)
    if view == "composed":
        frames = linear(rec.get("composed"))
        kind = traj.model.objective.prediction_type or "prediction"
        return ViewImage(view, title, "signed", frames,
                         f"composed prediction ({kind}; linear preview, mean RGB)",
                         signed_limit(frames), given(frames.shape[0]), caption, note=off)
    start, total = 0, None

    def pictures(latents) -> np.ndarray:  # float [T, H, W, 3], or the one frame asked for
        nonlocal start, total
        if frame is not None:
            one = render_float_frame(base, latents, frame, decode, index)
            if one is not None:
                start, total = frame, one[1]
                return one[0]
        return render_float(base, latents, decode, index)

    def length(frames: np.ndarray) -> int:
        return frames.shape[0] if total is None else total

    obj = traj.model.objective
    if view in ("base", "adapter-base"):
        x_t, b = rec.get("x_t"), rec.get("base")
        base_x0 = obj.x0_from_prediction(b.to(x_t.dtype), x_t, rec.t.to(x_t.device))
        if view == "base":
            frames = as_uint8(pictures(base_x0))
            return ViewImage(view, title, "rgb", frames, given=given(length(frames)), caption=caption,
                             start=start, total=total)
        composed_x0 = obj.x0_from_prediction(rec.get("composed").to(x_t.dtype), x_t, rec.t.to(x_t.device))
        # every frame, so that the colour range is the clip's and scrubbing frames does not rescale it
        diff = (render_float(base, composed_x0, decode, index)
                - render_float(base, base_x0, decode, index)).mean(-1)
        return ViewImage(view, title, "signed", diff.astype(np.float32),
                         "x0 difference (mean RGB, [-1, 1] units)",
                         signed_limit(diff), given(diff.shape[0]), caption, note=off)
    frames = as_uint8(pictures(rec.get(view)))
    return ViewImage(view, title, "rgb", frames, given=given(length(frames)), caption=caption, start=start,
                     total=total)


__all__ = ["VIEWS", "VIEW_ALIASES", "VIEW_LABELS", "VIEW_NEEDS", "adapter_note", "available_views",
           "effective_gate_map", "given_frames", "normalise_view", "view_image"]
