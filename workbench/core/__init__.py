"""The contract: backbones, adapters, conditions, composers, objectives, and their composition."""

from workbench.core.adapter import Adapter, InsideAdapter, SideAdapter
from workbench.core.backbone import BaseVideoModel, StepRecord
from workbench.core.callbacks import Callback
from workbench.core.card import ClipSpec, ComponentSpec, ModelCard, RecipeSpec, SamplingDefaults
from workbench.core.composed import ComposedModel, Prediction
from workbench.core.composers import (
    Add,
    ComposeContext,
    Composer,
    Composition,
    Diagnostics,
    GatedResidual,
    MaskMix,
    NoiseGated,
    PretrainWarmup,
    Replace,
)
from workbench.core.conditions import Batch, Condition, Conditioning
from workbench.core.inside import InsideSpec
from workbench.core.objectives import Diffusion, FlowMatching, Objective

__all__ = [
    "Adapter", "Add", "BaseVideoModel", "Batch", "Callback", "ClipSpec", "ComponentSpec", "ComposeContext",
    "ComposedModel", "Composer", "Composition", "Condition", "Conditioning", "Diagnostics", "Diffusion",
    "FlowMatching", "GatedResidual", "InsideAdapter", "InsideSpec", "MaskMix", "ModelCard", "NoiseGated",
    "Objective", "Prediction", "PretrainWarmup", "RecipeSpec", "Replace", "SamplingDefaults", "SideAdapter",
    "StepRecord",
]
