"""The instruments: recorded trajectories, forks, latent previews and probes.

Imported on demand (``import workbench`` does not load it). Needs only torch and numpy at
import time; writing videos (``Trajectory.export``) loads imageio when called.

Examples:
    >>> from workbench.inspect import record
    >>> traj = record(model, raw, steps=8, seed=0)      # what exp.sample(raw, steps=8, seed=0) returns
    >>> alt = traj.fork(at=4, cond={"action": -raw["action"]})
    >>> alt.frames(-1, kind="x0").shape                # uint8 [T, H, W, 3]
    (16, 64, 64, 3)
"""

from workbench.errors import PolicyError
from workbench.inspect.common import InspectError, StepError, StorageWarning, t_for_noise_level
from workbench.inspect.drive import DriveState
from workbench.inspect.previews.decoding import render, render_float
from workbench.inspect.previews.latent_space import decode_chunked
from workbench.inspect.previews.linear_preview import LatentPreview
from workbench.inspect.previews.pictures import Panel, ViewImage
from workbench.inspect.previews.preview import clear_preview_cache, fit_preview
from workbench.inspect.previews.preview_cache import backbone_identity, cache_dir
from workbench.inspect.probes.ablation import Ablation, ConditionEdit, Propagation, swap_conditions
from workbench.inspect.probes.gates import GatesState, find_gate_history, gate_history, gate_statistics
from workbench.inspect.probes.readout import FrameReadout, PathComparison, Readout, compare_paths
from workbench.inspect.probes.sensitivity import (
    ActionSensitivityResult,
    BandRecommendation,
    SigmaSensitivity,
    action_sensitivity,
    condition_plots,
    condition_table,
    sigma_sensitivity,
)
from workbench.inspect.recording.clips import generation_request, predict_clips
from workbench.inspect.recording.closed_loop import (
    ClosedLoop,
    Observation,
    Policy,
    act,
    chunk_schedule,
    closed_loop,
    describe_policy,
    load_policy,
)
from workbench.inspect.recording.recorder import StopSampling
from workbench.inspect.recording.rollouts import Rollout, RolloutChunk, rollout
from workbench.inspect.recording.settings import Settings
from workbench.inspect.recording.state import StateReader
from workbench.inspect.recording.step import TrajectoryStep
from workbench.inspect.recording.storage import StoragePolicy, estimate_memory
from workbench.inspect.recording.trajectory import Trajectory, record
from workbench.inspect.stepper import StepperState
from workbench.inspect.views import VIEWS, effective_gate_map, view_image

# The module paths before the subpackages (workbench.inspect.trajectory, ...) keep importing: each names its
# module's new home (recording/, previews/, probes/).
_MOVED = {"trajectory": "recording", "recorder": "recording", "step": "recording", "storage": "recording",
          "settings": "recording", "rollouts": "recording", "clips": "recording", "export": "recording",
          "preview": "previews", "linear_preview": "previews", "tiny_preview": "previews",
          "preview_cache": "previews",
          "decoding": "previews", "pictures": "previews", "latent_space": "previews", "colors": "previews",
          "readout": "probes", "gates": "probes", "ablation": "probes"}


def _alias_moved_modules() -> None:
    import importlib
    import sys

    for name, package in _MOVED.items():
        sys.modules.setdefault(f"{__name__}.{name}", importlib.import_module(f"{__name__}.{package}.{name}"))


_alias_moved_modules()

__all__ = [
    "VIEWS", "Ablation", "ActionSensitivityResult", "BandRecommendation", "ClosedLoop", "ConditionEdit",
    "DriveState", "FrameReadout", "GatesState", "InspectError", "LatentPreview", "Observation", "Panel",
    "PathComparison", "Policy", "PolicyError", "Propagation", "Readout", "Rollout", "RolloutChunk",
    "Settings",
    "SigmaSensitivity", "StateReader", "StepError", "StepperState", "StopSampling", "StoragePolicy",
    "StorageWarning",
    "Trajectory", "TrajectoryStep", "ViewImage",
    "act", "action_sensitivity", "backbone_identity", "cache_dir", "chunk_schedule", "clear_preview_cache",
    "closed_loop", "compare_paths",
    "condition_plots", "condition_table", "decode_chunked", "describe_policy", "effective_gate_map",
    "estimate_memory",
    "find_gate_history", "fit_preview", "gate_history", "gate_statistics", "generation_request",
    "load_policy", "predict_clips",
    "record", "render", "render_float", "rollout",
    "sigma_sensitivity", "swap_conditions", "t_for_noise_level", "view_image",
]
