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


TESTING_SNAPSHOT = ["PROMISES", "ConformanceError", "ConformanceReport", "Finding", "ProbeAdapter", "check_backbone",
                    "counting_base_calls"]


def test_the_conformance_kit_is_a_frozen_documented_submodule():
    import workbench.testing
    from workbench.testing import check_backbone

    assert sorted(workbench.testing.__all__) == sorted(TESTING_SNAPSHOT), "update TESTING_SNAPSHOT deliberately"
    assert callable(check_backbone) and list(workbench.testing.PROMISES) == [
        "card", "to", "provides", "encode_decode", "identity", "constrain", "recording", "fork", "training",
        "state_dict"]
