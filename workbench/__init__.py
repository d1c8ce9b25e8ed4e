"""workbench: train small adapters on frozen video models, and see what they do.

    prediction = compose(base(x_t, t, cond), adapter(x_t, t, cond, base_output))

The public API lives here; ``tests/test_public_api.py`` freezes it.
"""

from workbench._version import __version__ as __version__
from workbench.config import build
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
    Composition,
    Condition,
    Conditioning,
    Diffusion,
    FlowMatching,
    GatedResidual,
    InsideAdapter,
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
    SideAdapter,
    StepRecord,
)
from workbench.registry import register
from workbench.train import AdapterExperiment, ContextConfig, ExperimentConfig, TrainingConfig

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
    "Composition",
    "Condition",
    "Conditioning",
    "ContextConfig",
    "Diffusion",
    "ExperimentConfig",
    "FlowMatching",
    "GatedResidual",
    "InsideAdapter",
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
    "SideAdapter",
    "StepRecord",
    "TrainingConfig",
    "build",
    "register",
]
