"""The instruments: recorded trajectories, forks, latent previews and probes.

    from workbench.inspect import record
    traj = record(model, batch, steps=20, seed=0)   # what exp.sample(...) returns
    alt = traj.fork(at=10, cond={"action": pushed})
    frames = alt.frames(-1, kind="x0")              # uint8 [T, H, W, 3]

Imported on demand (``import workbench`` does not load it). Needs only torch and numpy at
import time; writing videos (``Trajectory.export``) loads imageio when called.
"""

from workbench.inspect.ablation import Ablation, ConditionEdit, swap_conditions
from workbench.inspect.common import InspectError, StepError, StorageWarning, t_for_noise_level
from workbench.inspect.preview import (
    LatentPreview,
    backbone_identity,
    cache_dir,
    clear_preview_cache,
    decode_chunked,
    fit_preview,
    render,
)
from workbench.inspect.probes import (
    ActionSensitivity,
    BandRecommendation,
    SigmaSensitivity,
    action_sensitivity,
    condition_table,
    gate_history,
    gate_statistics,
    sigma_sensitivity,
)
from workbench.inspect.trajectory import (
    Settings,
    StopSampling,
    StoragePolicy,
    Trajectory,
    TrajectoryStep,
    estimate_memory,
    record,
)
from workbench.inspect.views import (
    VIEWS,
    Panel,
    StepperState,
    ViewImage,
    effective_gate_map,
    find_gate_history,
    render_float,
    view_image,
)
from workbench.metrics import moving_psnr, per_clip, psnr, ssim

__all__ = [
    "VIEWS", "Ablation", "ActionSensitivity", "BandRecommendation", "ConditionEdit", "InspectError",
    "LatentPreview", "Panel", "Settings", "SigmaSensitivity", "StepError", "StepperState", "StopSampling",
    "StorageWarning", "StoragePolicy", "Trajectory", "TrajectoryStep", "ViewImage", "action_sensitivity",
    "backbone_identity", "cache_dir", "clear_preview_cache", "condition_table", "decode_chunked",
    "effective_gate_map", "estimate_memory", "find_gate_history", "fit_preview", "gate_history", "gate_statistics",
    "moving_psnr", "per_clip", "psnr", "record", "render", "render_float", "sigma_sensitivity", "ssim",
    "swap_conditions", "t_for_noise_level", "view_image",
]
