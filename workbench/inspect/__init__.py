"""The instruments: recorded trajectories, forks, latent previews and probes.

Imported on demand (``import workbench`` does not load it). Needs only torch and numpy at
import time; writing videos (``Trajectory.export``) loads imageio when called.

The names a notebook reaches for are exported here. The rest import from their own modules: the
results the probes return, settings and the sampler hooks (:mod:`~workbench.inspect.recording`,
:mod:`~workbench.inspect.probes`), the previews' machinery (:mod:`~workbench.inspect.previews`), and
the errors and warnings, which live in :mod:`workbench.errors` with every other.

Examples:
    >>> from workbench.inspect import record
    >>> traj = record(model, raw, steps=8, seed=0)      # what exp.sample(raw, steps=8, seed=0) returns
    >>> alt = traj.fork(at=4, cond={"action": -raw["action"]})
    >>> alt.frames(-1, kind="x0").shape                # uint8 [T, H, W, 3]
    (16, 64, 64, 3)
"""

from workbench.inspect.drive import DriveState
from workbench.inspect.previews.decoding import render
from workbench.inspect.previews.preview import clear_preview_cache, fit_preview
from workbench.inspect.probes.ablation import Ablation, ConditionEdit, swap_conditions
from workbench.inspect.probes.gates import GatesState, gate_history, gate_statistics
from workbench.inspect.probes.readout import Readout, compare_paths
from workbench.inspect.probes.sensitivity import (
    action_sensitivity,
    condition_plots,
    condition_table,
    sigma_sensitivity,
)
from workbench.inspect.recording.clips import predict_clips
from workbench.inspect.recording.closed_loop import closed_loop
from workbench.inspect.recording.recorder import StopSampling
from workbench.inspect.recording.rollouts import Rollout, rollout
from workbench.inspect.recording.state import StateReader
from workbench.inspect.recording.step import TrajectoryStep
from workbench.inspect.recording.storage import StoragePolicy, estimate_memory
from workbench.inspect.recording.trajectory import Trajectory, record
from workbench.inspect.stepper import StepperState
from workbench.inspect.views import VIEWS, view_image

__all__ = [
    # record a run, step through it, fork it
    "StopSampling", "StoragePolicy", "Trajectory", "TrajectoryStep", "estimate_memory", "record",
    # whole episodes and whole clips; a policy acting in them, closed loop
    "Rollout", "StateReader", "closed_loop", "predict_clips", "rollout",
    # what the views show, and the state behind the Stepper and Drive views
    "VIEWS", "DriveState", "StepperState", "clear_preview_cache", "fit_preview", "render", "view_image",
    # probes: what the adapter reads, where it acts, what an edit changes
    "Ablation", "ConditionEdit", "GatesState", "Readout", "action_sensitivity", "compare_paths",
    "condition_plots", "condition_table", "gate_history", "gate_statistics", "sigma_sensitivity",
    "swap_conditions",
]
