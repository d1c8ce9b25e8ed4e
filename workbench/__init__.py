"""workbench: train small adapters on frozen video models, and see what they do.

    prediction = compose(base(x_t, t, cond), adapter(x_t, t, cond, base_output))

The public API lives here; ``tests/test_public_api.py`` freezes it.
"""

from workbench.core import (
    Adapter,
    Add,
    BaseVideoModel,
    Batch,
    Callback,
    ClipSpec,
    ComponentSpec,
    ComposeContext,
    ComposedModel,
    Composer,
    Condition,
    Conditioning,
    Diffusion,
    FlowMatching,
    GatedResidual,
    InsideSpec,
    MaskMix,
    ModelCard,
    NoiseGated,
    Objective,
    Prediction,
    PretrainWarmup,
    RecipeSpec,
    Replace,
    SamplingDefaults,
    StepRecord,
)
from workbench.registry import build, register
from workbench.train import AdapterExperiment, ExperimentConfig, TrainingConfig

__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "AdapterExperiment",
    "Add",
    "BaseVideoModel",
    "Batch",
    "Callback",
    "ClipSpec",
    "ComponentSpec",
    "ComposeContext",
    "ComposedModel",
    "Composer",
    "Condition",
    "Conditioning",
    "Diffusion",
    "ExperimentConfig",
    "FlowMatching",
    "GatedResidual",
    "InsideSpec",
    "MaskMix",
    "ModelCard",
    "NoiseGated",
    "Objective",
    "Prediction",
    "PretrainWarmup",
    "RecipeSpec",
    "Replace",
    "SamplingDefaults",
    "StepRecord",
    "TrainingConfig",
    "build",
    "register",
]
