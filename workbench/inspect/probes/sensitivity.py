"""Probes: what the adapter reads, how it responds to its conditions, and where in noise it helps.

Pure functions returning plain dataclasses, dicts and numpy arrays, so a notebook can print
them and a widget can plot them without knowing about models:

* :func:`condition_table` — one row per declared condition, as the adapter sees it.
* :func:`action_sensitivity` — how far the adapter output and the x0 estimate move per unit
  of each action dimension, per noise level, and how much a wrong (swapped) action changes them;
  with a readout (e.g. a hand probe), how far the position it reads moves, in its unit.
* :func:`sigma_sensitivity` — base / adapted / wrong-condition loss per noise level on one
  noise draw, and :meth:`SigmaSensitivity.recommend_band` for a ``NoiseGated`` band.
* :func:`condition_plots` — what to plot for each declared condition, as the adapter sees it.

Gate statistics live in :mod:`workbench.inspect.probes.gates`.

Every model evaluation runs in eval mode under ``no_grad`` on the model's device; losses use
the objective's own masked loss. Image metrics live in :mod:`workbench.metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from workbench.core.adapter import Adapter
from workbench.core.backbone import causal_latents
from workbench.core.composed import ComposedModel
from workbench.core.composers import Composer, NoiseGated
from workbench.core.conditions import Batch
from workbench.inspect.common import (
    DEFAULT_LEVELS,
    InspectError,
    check_levels,
    check_model,
    condition_key,
    masked_rms,
    model_lock,
    prepare,
    rolled_conditions,
    seeded_noise,
    t_for_noise_level,
    t_tensor,
)
from workbench.inspect.previews.decoding import as_uint8, render_float
from workbench.inspect.probes.gates import open_noise_gates
from workbench.inspect.recording.settings import Settings, applied


# -- condition table -------------------------------------------------------------------------
def condition_table(adapter: Adapter | ComposedModel, raw_or_batch: Mapping[str, Any] | Batch,
                    step: int | None = None) -> list[dict[str, Any]]:
    """One row per declared condition, exactly as the adapter receives it (``adapter.view``).

    Columns: ``name``, ``key`` (the backbone key it matched), ``alias`` (True when that key is
    an alias), ``shape`` / ``dtype`` (after frame reduction), ``frames`` (``keep`` / ``mean`` /
    ``sum`` / ``per-sample``), ``dropout`` (rate), ``dropout_applied``, ``dropped`` (samples),
    ``min`` / ``mean`` / ``max`` (``None`` for a missing optional condition). ``step=k`` (with
    the adapter in train mode) gives training step ``k``'s view, dropout included.

    Examples:
        >>> for row in condition_table(model, raw):
        ...     print(row["name"], row["shape"])
        action (2, 16, 4)
        first_frame (2, 4, 16, 16)
        ee_pos (2, 16, 3)
        camera (2, 12)
    """
    if isinstance(adapter, ComposedModel):
        adapter = adapter.adapter
    if not isinstance(adapter, Adapter):
        raise InspectError(f"condition_table needs an Adapter or a ComposedModel, "
                           f"got {type(adapter).__name__}.")
    view = adapter.view(raw_or_batch, step=step)
    rows = []
    for name, info in view.info.items():
        value = view.declared.get(name)
        stats = {"min": None, "mean": None, "max": None}
        if isinstance(value, torch.Tensor) and value.numel():
            v = value.detach().float()
            stats = {"min": float(v.min()), "mean": float(v.mean()), "max": float(v.max())}
        rows.append({
            "name": name, "key": info.key, "alias": info.key is not None and info.key != name,
            "shape": info.shape, "dtype": info.dtype, "frames": info.per_frame or "per-sample",
            "dropout": info.dropout, "dropout_applied": info.dropout_applied, "dropped": info.dropped,
            **stats,
        })
    return rows


# -- shared evaluation -----------------------------------------------------------------------
def _with_value(batch: Batch, key: str, value: torch.Tensor) -> Batch:
    return Batch(latents=batch.latents, cond={**batch.cond, key: value}, loss_mask=batch.loss_mask,
                 per_frame=batch.per_frame, meta=batch.meta)


# -- action sensitivity ----------------------------------------------------------------------
@dataclass
class ActionSensitivityResult:
    """Per noise level (rows) and action dimension (columns): RMS change per unit of action.

    ``adapter[l, d]`` / ``x0[l, d]``: RMS of ``d(adapter output) / d(action_d)`` and of
    ``d(x0 estimate) / d(action_d)`` (central differences, step ``eps``, the action moved on every
    frame), over the predicted frames. ``swap_gap["adapter"|"x0"][l]``: RMS difference between
    the true actions and actions rolled in from another clip. ``adapter_scale[l]``: RMS adapter
    output with the true actions, for scale.

    With a readout (:func:`action_sensitivity` ``readout=``): ``readout["adapter"|"base"][l, d]``,
    how far the position the readout finds in the x0 estimate's frames moves per unit of
    ``action_d`` (central differences, step ``readout_eps``; the mean distance over clips and
    predicted frames, in ``readout_unit``), with the adapter and for the frozen base alone; and
    ``readout_swap_gap[l]``, how far apart the positions are with the true and the swapped actions.
    """

    condition: str
    levels: np.ndarray
    t: np.ndarray
    eps: float
    adapter: np.ndarray
    x0: np.ndarray
    swap_gap: dict[str, np.ndarray]
    adapter_scale: np.ndarray
    readout: dict[str, np.ndarray] | None = None
    readout_swap_gap: np.ndarray | None = None
    readout_name: str = ""
    readout_unit: str = ""
    readout_eps: float = 0.0

    def rows(self) -> list[dict[str, float]]:
        """One row per (level, dimension), for a table."""
        out = []
        for i, (lv, t) in enumerate(zip(self.levels, self.t)):
            for d in range(self.adapter.shape[1]):
                row = {"level": float(lv), "t": float(t), "dim": d, "adapter": float(self.adapter[i, d]),
                       "x0": float(self.x0[i, d]), "swap_gap_x0": float(self.swap_gap["x0"][i])}
                if self.readout is not None:
                    row.update({f"{self.readout_name}_adapter": float(self.readout["adapter"][i, d]),
                                f"{self.readout_name}_base": float(self.readout["base"][i, d])})
                out.append(row)
        return out


def _frames_of(model: ComposedModel, x0: torch.Tensor, decode: str) -> list[np.ndarray]:
    """The x0 estimate of every clip as uint8 frames ``[T, H, W, 3]``."""
    return [as_uint8(render_float(model.base, x0, decode, i)) for i in range(x0.shape[0])]


class _ReadoutProbe:
    """Reads positions off x0 estimates for :func:`action_sensitivity`: per clip ``[T, D]``, predicted
    frames only."""

    def __init__(self, model: ComposedModel, batch: Batch, readout: Any, decode: str):
        self.model, self.batch, self.readout, self.decode = model, batch, readout, decode
        self.frames: list[list[int]] | None = None

    def positions(self, x0: torch.Tensor) -> list[np.ndarray]:
        from workbench.inspect.probes.readout import read_positions
        from workbench.inspect.views import given_frames

        videos = _frames_of(self.model, x0, self.decode)
        if self.frames is None:
            self.frames = []
            for i, video in enumerate(videos):
                given = given_frames(self.batch, i, len(video), causal_latents(self.model.base))
                self.frames.append([f for f in range(len(video)) if not (f < len(given) and given[f])]
                                   or list(range(len(video))))
        return [read_positions(self.readout, v)[f] for v, f in zip(videos, self.frames)]

    @staticmethod
    def distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        """Mean distance between two readings, over clips and frames."""
        return float(np.mean([np.linalg.norm(x - y, axis=-1).mean() for x, y in zip(a, b)]))


def action_sensitivity(model: ComposedModel, batch: Mapping[str, Any] | Batch,
                       levels: Sequence[float] = (0.2, 0.5, 0.8), condition: str = "action",
                       eps: float = 0.05, seed: int = 0, readout: Any = None, readout_eps: float = 0.25,
                       decode: str = "tiny") -> ActionSensitivityResult:
    """How much the adapter output and the x0 estimate move per unit change of each action dimension.

    One noise draw (``seed``) is shared by every level and perturbation; the base runs once per
    level (its output is reused when the adapter allows). ``swap_gap`` needs a batch of at
    least two clips. ``NoiseGated`` bands are opened for the probe (see :func:`open_noise_gates`).

    ``readout`` (a :class:`~workbench.inspect.probes.readout.Readout`, e.g. the world-model wing's hand
    probe): also decode each x0 estimate (``decode``) and read positions off its frames, to say
    how far the readout moves per unit of each action dimension, with the adapter and for the
    frozen base alone (the base runs with the moved actions too; where its prediction does not
    change, its readout does not either and is not decoded).

    Examples:
        >>> sens = action_sensitivity(model, raw, levels=(0.3, 0.7))
        >>> sens.x0.shape        # (levels, action dims)
        (2, 4)
        >>> from workbench.worldmodel.probe import HandProbe
        >>> readout = HandProbe.from_pretrained().readout()
        >>> sens = action_sensitivity(model, raw, levels=(0.5,), readout=readout)
        >>> sens.readout["adapter"].shape     # cm per unit of each action dimension, per level
        (1, 4)
    """
    from workbench.inspect.probes.readout import check_readout

    model = check_model(model, "action_sensitivity")
    if not (isinstance(eps, (int, float)) and eps > 0):
        raise InspectError(f"eps must be a positive step for the finite differences, got {eps!r}.")
    if not (isinstance(readout_eps, (int, float)) and readout_eps > 0):
        raise InspectError(f"readout_eps must be a positive step for the finite differences, "
                           f"got {readout_eps!r}.")
    readout = check_readout(readout)
    batch = prepare(model, batch)
    key = condition_key(model, batch, condition)
    action = batch.cond[key]
    lv = check_levels(levels)
    obj, x0_clean, mask = model.objective, batch.latents, batch.loss_mask
    noise = seeded_noise(batch, seed)
    dims = action.shape[-1]
    sens_a, sens_x = np.zeros((lv.size, dims)), np.zeros((lv.size, dims))
    gap_a, gap_x, scale, ts = np.zeros(lv.size), np.zeros(lv.size), np.zeros(lv.size), np.zeros(lv.size)
    moved = {"adapter": np.zeros((lv.size, dims)), "base": np.zeros((lv.size, dims))}
    gap_r = np.zeros(lv.size)
    probe = None if readout is None else _ReadoutProbe(model, batch, readout, decode)
    swapped = rolled_conditions(model, batch, condition)

    def bumped(d: int, by: float) -> Batch:
        bump = torch.zeros_like(action)
        bump[..., d] = by
        return _with_value(batch, key, action + bump)

    with model_lock(model), applied(model, Settings()), open_noise_gates(model.composer), torch.no_grad():
        for i, level in enumerate(lv):
            t = t_tensor(obj, level, batch.batch_size, batch.latents.device)
            ts[i] = float(t[0])
            x_t = obj.add_noise(x0_clean, noise, t)
            base_out = model.base_prediction(x_t, t, batch)

            def run(b: Batch, x_t=x_t, t=t, base_out=base_out) -> tuple[torch.Tensor, torch.Tensor]:
                p = model.predict(x_t, t, b, with_adapter=True, base_output=base_out)
                return p.adapter, obj.x0_from_prediction(p.composed, x_t, t)

            true_a, true_x = run(batch)
            scale[i] = masked_rms(true_a, mask)
            for d in range(dims):
                (ap, xp), (am, xm) = run(bumped(d, eps)), run(bumped(d, -eps))
                sens_a[i, d] = masked_rms((ap - am) / (2 * eps), mask)
                sens_x[i, d] = masked_rms((xp - xm) / (2 * eps), mask)
            sa, sx = run(swapped)
            gap_a[i], gap_x[i] = masked_rms(true_a - sa, mask), masked_rms(true_x - sx, mask)
            if probe is None:
                continue
            gap_r[i] = probe.distance(probe.positions(true_x), probe.positions(sx))
            for d in range(dims):
                plus, minus = bumped(d, readout_eps), bumped(d, -readout_eps)
                read = [probe.positions(run(b)[1]) for b in (plus, minus)]
                moved["adapter"][i, d] = probe.distance(*read) / (2 * readout_eps)
                base_plus, base_minus = (model.base_prediction(x_t, t, b) for b in (plus, minus))
                if not torch.equal(base_plus, base_minus):  # a base that reads the condition itself
                    read = [probe.positions(obj.x0_from_prediction(p, x_t, t))
                            for p in (base_plus, base_minus)]
                    moved["base"][i, d] = probe.distance(*read) / (2 * readout_eps)
    extra = {} if readout is None else {
        "readout": moved, "readout_swap_gap": gap_r, "readout_name": readout.name,
        "readout_unit": readout.unit, "readout_eps": float(readout_eps)}
    return ActionSensitivityResult(condition, lv, ts, float(eps), sens_a, sens_x,
                                   {"adapter": gap_a, "x0": gap_x}, scale, **extra)


# -- sigma sensitivity -----------------------------------------------------------------------
@dataclass
class BandRecommendation:
    """A noise band ``[lo, hi]`` for ``NoiseGated`` and the matching training ``t`` range.

    ``t_range`` is in the objective's units (flow matching: equal to the band; diffusion:
    timesteps). ``levels``: the probed levels inside the band; ``mean_gain``: mean
    ``base - adapted`` loss over them.
    """

    lo: float
    hi: float
    t_range: tuple[float, float]
    levels: np.ndarray
    mean_gain: float
    margin: float

    def composer(self, inner: Composer) -> NoiseGated:
        """``NoiseGated(inner, lo, hi)`` with this band."""
        return NoiseGated(inner, lo=self.lo, hi=self.hi)


@dataclass
class SigmaSensitivity:
    """Losses per noise level on the same noise draw(s): ``base``, ``adapted``, ``swapped`` (wrong
    condition)."""

    condition: str
    levels: np.ndarray
    t: np.ndarray
    base: np.ndarray
    adapted: np.ndarray
    swapped: np.ndarray
    objective: Any = field(repr=False, default=None)

    @property
    def gain(self) -> np.ndarray:
        """``base - adapted``: how much the adapter lowers the loss at each level."""
        return self.base - self.adapted

    def rows(self) -> list[dict[str, float]]:
        return [{"level": float(lv), "t": float(t), "base": float(b), "adapted": float(a),
                 "swapped": float(s)}
                for lv, t, b, a, s in zip(self.levels, self.t, self.base, self.adapted, self.swapped)]

    def recommend_band(self, margin: float = 0.02) -> BandRecommendation | None:
        """The band of noise levels where the adapter helps most, or ``None`` where it helps nowhere.

        A level qualifies when the adapted loss beats the base loss *and* the swapped-condition
        loss, each by ``margin`` times the base loss (so the gain comes from the condition,
        not from a generic correction). Of the contiguous runs of qualifying levels, the one
        with the largest summed gain wins; its edges reach halfway to the neighbouring probed
        levels (or to 0 / 1).
        """
        order = np.argsort(self.levels)
        lv, base, adapted, swapped = (a[order] for a in (self.levels, self.base, self.adapted, self.swapped))
        ok = (base - adapted > margin * base) & (swapped - adapted > margin * base)
        runs, start = [], None
        for i, flag in enumerate([*ok, False]):
            if flag and start is None:
                start = i
            elif not flag and start is not None:
                runs.append((start, i - 1))
                start = None
        if not runs:
            return None
        gain = base - adapted
        first, last = max(runs, key=lambda r: gain[r[0]:r[1] + 1].sum())
        lo = 0.0 if first == 0 else float((lv[first - 1] + lv[first]) / 2)
        hi = 1.0 if last == len(lv) - 1 else float((lv[last] + lv[last + 1]) / 2)
        t_lo, t_hi = (t_for_noise_level(self.objective, x) for x in (lo, hi)) if self.objective else (lo, hi)
        return BandRecommendation(lo, hi, (t_lo, t_hi), lv[first:last + 1],
                                  float(gain[first:last + 1].mean()), float(margin))


def sigma_sensitivity(model: ComposedModel, batch: Mapping[str, Any] | Batch,
                      levels: Sequence[float] = DEFAULT_LEVELS, seed: int = 0, condition: str = "action",
                      draws: int = 1) -> SigmaSensitivity:
    """Base, adapted and wrong-condition (actions rolled across the batch) loss per noise level.

    Each level uses the same ``draws`` noise draws (from ``seed``) for all three, so their
    differences are the adapter's and the condition's doing. ``NoiseGated`` bands in the composer
    are opened for the probe (see :func:`open_noise_gates`). Needs clean targets (a batch from
    video, not from a single image) and at least two clips.

    Examples:
        >>> sens = sigma_sensitivity(model, raw, levels=(0.2, 0.5, 0.8))
        >>> band = sens.recommend_band()      # BandRecommendation(lo=..., hi=..., t_range=...) or None
    """
    model = check_model(model, "sigma_sensitivity")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise InspectError(f"draws must be an int >= 1, got {draws!r}.")
    batch = prepare(model, batch)
    if batch.meta.get("has_target") is False:
        raise InspectError("sigma_sensitivity needs clean targets: "
                           "this batch was prepared from a single image. "
                           "Pass a raw batch with the full video.")
    condition_key(model, batch, condition)
    lv = check_levels(levels)
    obj, x0 = model.objective, batch.latents
    swapped = rolled_conditions(model, batch, condition)
    noises = [seeded_noise(batch, seed + k) for k in range(draws)]
    losses = np.zeros((3, lv.size))
    ts = np.zeros(lv.size)
    with model_lock(model), applied(model, Settings()), open_noise_gates(model.composer), torch.no_grad():
        for i, level in enumerate(lv):
            t = t_tensor(obj, level, batch.batch_size, x0.device)
            ts[i] = float(t[0])
            for noise in noises:
                x_t = obj.add_noise(x0, noise, t)
                target = obj.target(x0, noise, t)
                base_out = model.base_prediction(x_t, t, batch)
                adapted = model.predict(x_t, t, batch, with_adapter=True, base_output=base_out).composed
                wrong = model.predict(x_t, t, swapped, with_adapter=True, base_output=base_out).composed
                for j, pred in enumerate((base_out, adapted, wrong)):
                    losses[j, i] += float(obj.loss(pred, target, batch.loss_mask)) / draws
    return SigmaSensitivity(condition, lv, ts, losses[0], losses[1], losses[2], objective=obj)


# -- condition plots -------------------------------------------------------------------------
def condition_plots(model_or_adapter: Any, raw_or_batch: Mapping[str, Any] | Batch, step: int | None = None,
                    index: int = 0) -> dict[str, dict[str, Any]]:
    """What to plot for each declared condition, exactly as the adapter sees it (``adapter.view``).

    Returns ``{name: {"kind", "title", "values"}}`` for clip ``index``: ``"series"`` (per-frame
    values ``[T, D]``), ``"vector"`` (``[D]``), ``"image"`` (a latent frame ``(C, h, w)`` through
    the backbone's decoder, uint8 ``[H, W, 3]``, when a ``ComposedModel`` is given; otherwise
    the channel mean as a grey picture), ``"missing"`` (an absent optional condition, with a
    ``note``). ``step=k`` shows training step ``k``'s view (dropout included, in train mode).
    """
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
            out[name] = {"kind": "missing", "title": title, "values": None,
                         "note": "missing (optional, None)"}
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
                    image = as_uint8(render_float(model.base, v[None, :, None].to(value.dtype), "full"))[0]
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


__all__ = ["DEFAULT_LEVELS", "ActionSensitivityResult", "BandRecommendation", "SigmaSensitivity",
           "action_sensitivity", "condition_plots", "condition_table", "sigma_sensitivity"]
