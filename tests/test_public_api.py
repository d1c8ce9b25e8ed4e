"""The public API is frozen: a change here is a deliberate, reviewed change of the contract."""

import workbench

SNAPSHOT = [
    "Adapter",
    "AdapterExperiment",
    "Add",
    "BaseVideoModel",
    "Batch",
    "Callback",
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


def test_public_surface_is_frozen():
    assert sorted(workbench.__all__) == sorted(SNAPSHOT), "update SNAPSHOT deliberately if this change is intended"


def test_every_public_name_resolves():
    for name in workbench.__all__:
        assert getattr(workbench, name) is not None
