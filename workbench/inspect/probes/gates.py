"""Gates: where the composer lets the adapter act — over noise levels, over training, in space.

* :func:`gate_statistics` — the composer's gates and its effective adapter weight across noise
  levels; :func:`gate_history` — ``GateStatistics`` rows over training as arrays (and
  :func:`find_gate_history`, an experiment's own). The map at one step is the ``gate`` view
  (:func:`workbench.inspect.views.effective_gate_map`).
* :func:`noise_gates` / :func:`noise_band` — the composer's ``NoiseGated`` wrappers and their
  band; :func:`open_noise_gates` lets every noise level through for a probe.
* :class:`GatesState` — the plain state behind the ``Gates`` widget.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from workbench.core.callbacks import GateStatistics
from workbench.core.composed import ComposedModel
from workbench.core.composers import (
    ComposeContext,
    Composer,
    Diagnostics,
    NoiseGated,
    composer_tree,
    composition_of,
)
from workbench.core.conditions import Batch
from workbench.inspect.common import (
    DEFAULT_LEVELS,
    InspectError,
    check_frame,
    check_levels,
    masked_rms,
    model_lock,
    prepare,
    seeded_noise,
    t_tensor,
)
from workbench.inspect.previews.pictures import Panel
from workbench.inspect.recording.settings import Settings, applied
from workbench.inspect.recording.trajectory import Trajectory
from workbench.inspect.views import view_image


# -- noise bands -----------------------------------------------------------------------------
def noise_gates(composer: Composer) -> list[NoiseGated]:
    """Every ``NoiseGated`` in ``composer``'s tree, outermost first."""
    return [c for c in composer_tree(composer) if isinstance(c, NoiseGated)]


def noise_band(composer: Composer) -> tuple[float, float] | None:
    """``(lo, hi)`` of the outermost ``NoiseGated`` in ``composer``, or ``None`` when it has none."""
    gates = noise_gates(composer)
    return (gates[0].lo, gates[0].hi) if gates else None


@contextmanager
def open_noise_gates(composer: Composer) -> Iterator[Composer]:
    """Inside the block every ``NoiseGated`` in ``composer`` lets all noise levels through.

    The sensitivity probes measure the adapter where a band would *not* let it act, which is
    what recommending a band needs.
    """
    gates = noise_gates(composer)
    saved = [(g.lo, g.hi, g.ramp) for g in gates]
    try:
        for g in gates:
            g.lo, g.hi, g.ramp = 0.0, 1.0, 0.0
        yield composer
    finally:
        for g, (lo, hi, ramp) in zip(gates, saved):
            g.lo, g.hi, g.ramp = lo, hi, ramp


# -- over noise levels and over training -----------------------------------------------------
def _summarise(prefix: str, value: torch.Tensor) -> dict[str, float]:
    v = value.detach().float()
    if v.numel() == 1:
        return {prefix: float(v)}
    return {f"{prefix}_mean": float(v.mean()), f"{prefix}_min": float(v.min()),
            f"{prefix}_max": float(v.max())}


def _summarise_diagnostics(d: Diagnostics) -> dict[str, float]:
    """The gate, mask and noise weight a composer applied, then its extras, each summarised."""
    named = (("gate", d.gate), ("mask", d.mask), ("noise_weight", d.noise_weight), *d.extra.items())
    return {k: v for name, value in named if value is not None for k, v in _summarise(name, value).items()}


def _channels(composer: Composer) -> int:
    config = getattr(composer_tree(composer)[-1], "config", None)
    return int(getattr(config, "channels", None) or 1)


def gate_statistics(model_or_composer: ComposedModel | Composer, levels: Sequence[float] = DEFAULT_LEVELS,
                    batch: Mapping[str, Any] | Batch | None = None, seed: int = 0) -> list[dict[str, float]]:
    """The composer's diagnostics across noise levels, one row per level.

    With a model and a ``batch``: the composed prediction at each level (one noise draw),
    its diagnostics summarised (``gate``, ``mask_mean`` / ``_min`` / ``_max``,
    ``noise_weight``, ...) and ``weight``: ``RMS(composed - base) / RMS(adapter)`` over the
    predicted frames (loss mask > 0), how much of the adapter's output reaches the prediction.
    With a bare composer (or no batch): the composer on ``base = 0``, ``adapter = 1`` probes,
    where the composed value *is* the
    adapter's weight (``weight_mean`` / ``_min`` / ``_max`` over channels). Every row also has
    ``level`` and the composer's ``gate_values()``.
    """
    if isinstance(model_or_composer, ComposedModel):
        composer, model = model_or_composer.composer, model_or_composer
    elif isinstance(model_or_composer, Composer):
        composer, model = model_or_composer, None
    else:
        raise InspectError(f"gate_statistics needs a ComposedModel or a Composer, got "
                           f"{type(model_or_composer).__name__}.")
    if batch is not None and model is None:
        raise InspectError("gate_statistics with a batch needs the ComposedModel "
                           "(the batch goes through its base).")
    lv = check_levels(levels)
    with model_lock(model) if model is not None else nullcontext():
        return _gate_rows(composer, model, lv, batch, seed)


def _gate_rows(composer: Composer, model: ComposedModel | None, lv: np.ndarray, batch: Any,
               seed: int) -> list[dict[str, float]]:
    rows = []
    was_training = composer.training
    composer.train(False)
    try:
        with torch.no_grad():
            if batch is not None:
                rows = _gates_on_batch(model, prepare(model, batch), lv, seed)
            else:
                device = next((p.device for p in composer.parameters()), torch.device("cpu"))
                c = _channels(composer)
                zeros, ones = (torch.zeros(1, c, 1, 1, 1, device=device),
                               torch.ones(1, c, 1, 1, 1, device=device))
                for level in lv:
                    s = torch.full((1,), float(level), device=device)
                    composition = composition_of(composer, zeros, ones,
                                                 ComposeContext(x_t=zeros, t=s, noise_level=s))
                    rows.append({"level": float(level), **_summarise("weight", composition.prediction),
                                 **_summarise_diagnostics(composition)})
    finally:
        composer.train(was_training)
    gates = composer.gate_values()
    return [{**row, **gates} for row in rows]


def _gates_on_batch(model: ComposedModel, batch: Batch, lv: np.ndarray, seed: int) -> list[dict[str, float]]:
    obj, noise, rows = model.objective, seeded_noise(batch, seed), []
    with applied(model, Settings()):
        for level in lv:
            t = t_tensor(obj, level, batch.batch_size, batch.latents.device)
            x_t = obj.add_noise(batch.latents, noise, t)
            pred = model.predict(x_t, t, batch, with_adapter=True)
            # over the predicted frames: what a backbone fixes by construction (a given frame) never moves
            size = masked_rms(pred.adapter, batch.loss_mask)
            moved = masked_rms(pred.composed - pred.base, batch.loss_mask)
            rows.append({"level": float(level), "weight": moved / size if size > 0 else float("nan"),
                         **_summarise_diagnostics(pred.diagnostics)})
    return rows


def gate_history(callback: GateStatistics | Sequence[Mapping[str, float]]) -> dict[str, np.ndarray]:
    """``GateStatistics.history`` (or its rows) as arrays by column:
    ``{"step": (N,), "gate_mean": (N,), ...}``.

    A column missing from some rows is NaN there.
    """
    rows = callback.history if isinstance(callback, GateStatistics) else callback
    if not isinstance(rows, Sequence) or any(not isinstance(r, Mapping) for r in rows):
        raise InspectError(f"gate_history needs a GateStatistics callback or its history rows, got "
                           f"{type(callback).__name__}.")
    columns = list(dict.fromkeys(["step", *(k for r in rows for k in r)]))
    return {k: np.array([float(r.get(k, np.nan)) for r in rows], dtype=np.float64) for k in columns}


def find_gate_history(exp: Any) -> dict[str, np.ndarray] | None:
    """The gate history an experiment's gated composer recorded during training (``None`` if none).

    Reads the :class:`GateStatistics` callback the composer declared (``exp.component_callbacks``)
    or one the user added (``exp.callbacks``), through :func:`gate_history`.
    """
    for cb in [*getattr(exp, "component_callbacks", ()), *getattr(exp, "callbacks", ())]:
        if isinstance(cb, GateStatistics):
            return gate_history(cb) if cb.history else None
    return None


# -- the state behind the Gates widget -------------------------------------------------------
class GatesState:
    """Where the composer lets the adapter act, for one model: the plain state a ``Gates`` view draws.

    ``source``: an experiment (its gate history is read) or a :class:`ComposedModel`. ``rows``:
    :func:`gate_statistics` at ``levels`` (on ``batch`` when given); ``history``: the training
    gate history (``history`` given, else the experiment's own, else ``None``); ``band``: the
    ``NoiseGated`` band; with a ``trajectory``, :meth:`map_panel` is the effective gate map at
    ``step`` and ``frame``.

    Examples:
        >>> state = GatesState(exp, batch=raw, trajectory=traj)
        >>> len(state.rows)                    # gate statistics per noise level
        9
        >>> state.seek(6)                       # the step shown
        6
        >>> panel = state.map_panel()           # the effective gate map at step 6
        >>> panel.kind, panel.image.shape
        ('gate', (16, 16))
    """

    def __init__(self, source: Any, batch: Any = None, trajectory: Trajectory | None = None,
                 levels: Sequence[float] = DEFAULT_LEVELS, index: int = 0, step: int | None = None,
                 frame: int | None = None, history: Any = None):
        model = source if isinstance(source, ComposedModel) else getattr(source, "model", None)
        if not isinstance(model, ComposedModel):
            raise InspectError(f"Gates needs an AdapterExperiment or a ComposedModel, "
                               f"got {type(source).__name__}.")
        self.source, self.model, self.batch, self.levels = source, model, batch, tuple(levels)
        self.trajectory, self.index, self._history = trajectory, index, history
        self.step = self.frame = None
        if trajectory is not None:
            stored = trajectory.stored
            self.seek(step if step is not None else stored[len(stored) // 2])
            self.set_frame(min(1, self.frames - 1) if frame is None else frame)
        self.recompute()

    @property
    def band(self) -> tuple[float, float] | None:
        return noise_band(self.model.composer)

    def recompute(self) -> None:
        """Probe the composer again and re-read the training history (after more training)."""
        self.rows = gate_statistics(self.model, self.levels, batch=self.batch)
        self.history = self._history if self._history is not None else find_gate_history(self.source)

    @property
    def weight(self) -> np.ndarray:
        """The effective adapter weight at each level ``(len(levels),)``."""
        column = "weight" if "weight" in self.rows[0] else "weight_mean"
        return np.array([r.get(column, np.nan) for r in self.rows], dtype=np.float64)

    def _require_trajectory(self) -> Trajectory:
        if self.trajectory is None:
            raise InspectError("This Gates state has no trajectory, so no gate map; "
                               "pass trajectory=exp.sample(...).")
        return self.trajectory

    @property
    def frames(self) -> int:
        """Frames of the gate map at the current step."""
        return len(view_image(self._require_trajectory(), self.step, "gate", index=self.index))

    def seek(self, step: int) -> int:
        """Show the map at stored step ``step`` (negative counts from the end)."""
        self.step = self._require_trajectory()[step].index  # raises StepError naming the stored steps
        return self.step

    def set_frame(self, frame: int) -> int:
        self.frame = check_frame(frame, self.frames, "the gate map")
        return self.frame

    def map_panel(self) -> Panel | None:
        """The effective gate map at the current step and frame, titled by step, noise level and frame."""
        if self.trajectory is None:
            return None
        image = view_image(self.trajectory, self.step, "gate", index=self.index)
        frame = min(self.frame, len(image) - 1)
        panel = image.frame(frame)
        rec = self.trajectory[self.step]
        panel.title = (f"gate map · step {rec.index} of {rec.steps}\nnoise level "
                       f"{float(rec.noise_level[0]):.2f} · {image.frame_name(frame)}")
        return panel

    def describe(self) -> str:
        weights = ", ".join(f"{lv:.1f}: {w:.3f}" for lv, w in zip(self.levels, self.weight))
        gates = ", ".join(f"{k}={v:.4f}" for k, v in self.model.composer.gate_values().items()) or "no gate"
        where = "" if self.trajectory is None else f"; map at step {self.step}, frame {self.frame}"
        return f"adapter weight by noise level {{{weights}}}; {gates}{where}"


__all__ = ["GatesState", "find_gate_history", "gate_history", "gate_statistics", "noise_band", "noise_gates",
           "open_noise_gates"]
