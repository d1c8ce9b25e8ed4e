"""The public API is frozen: a change here is a deliberate, reviewed change of the contract."""

import dataclasses
import inspect
from collections.abc import Mapping

from torch import nn

import workbench
from workbench.core.composers import Composer
from workbench.core.objectives import Objective

# name -> what it is: the base class it must derive from, "dataclass", or "function"
SNAPSHOT = {
    "Adapter": nn.Module,
    "AdapterExperiment": object,
    "Add": Composer,
    "BaseVideoModel": nn.Module,
    "Batch": "dataclass",
    "Callback": object,
    "ClipSpec": "dataclass",
    "ComponentSpec": "dataclass",
    "ComposeContext": "dataclass",
    "ComposedModel": nn.Module,
    "Composer": nn.Module,
    "Composition": "dataclass",
    "Condition": "dataclass",
    "Conditioning": Mapping,
    "ContextConfig": "dataclass",
    "Diffusion": Objective,
    "ExperimentConfig": "dataclass",
    "FlowMatching": Objective,
    "GatedResidual": Composer,
    "InsideAdapter": nn.Module,
    "InsideSpec": "dataclass",
    "MaskMix": Composer,
    "ModelCard": "dataclass",
    "NoiseGated": Composer,
    "Objective": object,
    "Prediction": "dataclass",
    "PretrainWarmup": Composer,
    "RecipeSpec": "dataclass",
    "Replace": Composer,
    "SamplingDefaults": "dataclass",
    "SideAdapter": nn.Module,
    "StepRecord": "dataclass",
    "TrainingConfig": "dataclass",
    "build": "function",
    "register": "function",
}


def test_public_surface_is_frozen():
    assert sorted(workbench.__all__) == sorted(SNAPSHOT), "update SNAPSHOT deliberately if this change is intended"


def test_every_public_name_is_what_the_snapshot_says():
    wrong = []
    for name, kind in SNAPSHOT.items():
        obj = getattr(workbench, name)
        if kind == "function":
            ok = inspect.isfunction(obj) and obj.__name__ == name
        elif kind == "dataclass":
            ok = inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__name__ == name
        else:
            ok = inspect.isclass(obj) and issubclass(obj, kind) and obj.__name__ == name
        if not ok or not obj.__module__.startswith("workbench."):
            wrong.append(f"{name}: {obj!r} from {getattr(obj, '__module__', '?')} is not a {kind}")
    assert wrong == []


def test_public_functions_keep_their_signatures():
    assert list(inspect.signature(workbench.build).parameters) == ["kind", "name", "config", "where"]
    assert list(inspect.signature(workbench.register).parameters) == ["kind", "name"]
    assert isinstance(workbench.build("composer", "add"), workbench.Add)


def test_the_top_level_names_are_the_submodules_own():
    from workbench.core import composers
    from workbench.train import experiment

    assert workbench.GatedResidual is composers.GatedResidual
    assert workbench.AdapterExperiment is experiment.AdapterExperiment


TESTING_SNAPSHOT = ["CAPABILITY_PROMISES", "INSIDE_PROMISES", "PROMISES", "ConformanceError", "ConformanceReport",
                    "Finding", "ProbeAdapter", "check_backbone", "check_inside_adapter", "counting_base_calls"]


def test_the_conformance_kit_is_a_frozen_documented_submodule():
    import workbench.testing
    from workbench.testing import check_backbone

    assert sorted(workbench.testing.__all__) == sorted(TESTING_SNAPSHOT), "update TESTING_SNAPSHOT deliberately"
    assert callable(check_backbone) and list(workbench.testing.PROMISES) == [
        "card", "to", "provides", "encode_decode", "identity", "given_frames", "recording", "fork", "clip", "rollout",
        "training", "produced_context", "state_dict", "latent_cache", "inside", "compile", "memory_plan", "previews",
        "callbacks"]
    assert {name: c.__name__ for name, c in workbench.testing.CAPABILITY_PROMISES.items()} == {
        "latent_cache": "CachesLatents", "inside": "InsideAccess", "compile": "Compilable",
        "memory_plan": "MemoryPlanning", "previews": "Previews", "callbacks": "TrainingCallbacks"}


CAPABILITIES_SNAPSHOT = ["CAPABILITIES", "CachesLatents", "Compilable", "DECODER_MODULES", "GivenFrames",
                         "InsideAccess", "KeepsFloat32", "LatentLayout", "MemoryPlanning", "Previews",
                         "SamplingOptions", "TrainingCallbacks", "declared", "members", "must_write", "undeclared",
                         "unwritten"]
# the base class: what every backbone writes (the required part) and what callers use; everything else is a capability
BASE_SNAPSHOT = {"methods": ["clip", "config_from", "decode", "default_objective", "denoise", "encode", "example_batch",
                             "generate", "prepare_batch", "provides", "run_sampler", "weight_files"],
                 "attributes": ["card", "config", "config_class", "device", "dtype", "is_compiled"]}


def test_the_backbone_contract_is_a_small_base_class_and_capabilities_beside_it():
    """``BaseVideoModel`` is frozen at its required part; the optional members live in ``workbench.core.capabilities``
    (counted as ``tools/public_surface.py`` counts them)."""
    import sys
    from pathlib import Path

    import workbench.core.capabilities as capabilities

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    try:
        from public_surface import members
    finally:
        sys.path.pop(0)
    methods, attributes = members(workbench.BaseVideoModel)
    assert {"methods": methods, "attributes": attributes} == BASE_SNAPSHOT, "update BASE_SNAPSHOT deliberately"
    assert sorted(capabilities.__all__) == sorted(CAPABILITIES_SNAPSHOT), "update CAPABILITIES_SNAPSHOT deliberately"
    assert [c.__name__ for c in capabilities.CAPABILITIES] == [
        "GivenFrames", "SamplingOptions", "LatentLayout", "Previews", "CachesLatents", "InsideAccess", "Compilable",
        "MemoryPlanning", "KeepsFloat32", "TrainingCallbacks"]


WIDGETS_SNAPSHOT = ["AblationSliders", "ActionSensitivity", "ConditionProbe", "Drive", "Fit", "Gates", "Stepper"]

INSPECT_SNAPSHOT = [
    "Ablation", "ConditionEdit", "DriveState", "GatesState", "Readout", "Rollout", "StateReader", "StepperState",
    "StopSampling", "StoragePolicy", "Trajectory", "TrajectoryStep", "VIEWS", "action_sensitivity",
    "clear_preview_cache", "closed_loop", "compare_paths", "condition_plots", "condition_table", "estimate_memory",
    "fit_preview", "gate_history", "gate_statistics", "predict_clips", "record", "render", "rollout",
    "sigma_sensitivity", "swap_conditions", "view_image"]


def test_the_instruments_export_at_most_30_names_each_from_its_own_module():
    """``workbench.inspect`` exports what a notebook reaches for (at most 30 names); every other name imports from
    its own module only, and the errors from ``workbench.errors`` only."""
    import importlib
    import pkgutil

    import workbench.errors
    import workbench.inspect

    assert sorted(workbench.inspect.__all__) == sorted(INSPECT_SNAPSHOT), "update INSPECT_SNAPSHOT deliberately"
    assert len(workbench.inspect.__all__) <= 30
    public = {name for name in vars(workbench.inspect) if not name.startswith("_")}
    submodules = {m.name for m in pkgutil.iter_modules(workbench.inspect.__path__)}
    assert public - submodules == set(workbench.inspect.__all__)  # nothing else rides along
    for name in workbench.inspect.__all__:  # each is its home module's own object (VIEWS, a tuple: views')
        obj = getattr(workbench.inspect, name)
        home = importlib.import_module(getattr(obj, "__module__", "workbench.inspect.views"))
        assert home.__name__.startswith("workbench.inspect.") and getattr(home, name) is obj, name
    for name in ("ActionSensitivityResult", "RolloutChunk", "Settings", "Propagation", "InspectError", "StepError"):
        assert not hasattr(workbench.inspect, name), name
    assert issubclass(workbench.errors.StepError, workbench.errors.InspectError)


def test_the_views_are_a_frozen_submodule_and_no_view_shares_a_name_with_an_instrument():
    """A view (``workbench.widgets``) and the logic or result it shows (``workbench.inspect``) have distinct
    names: ``ActionSensitivity`` is the view, ``ActionSensitivityResult`` what ``action_sensitivity`` returns."""
    import workbench.inspect
    import workbench.widgets
    from workbench.inspect.probes.sensitivity import ActionSensitivityResult

    assert sorted(workbench.widgets.__all__) == WIDGETS_SNAPSHOT, "update WIDGETS_SNAPSHOT deliberately"
    assert set(workbench.widgets.__all__).isdisjoint(workbench.inspect.__all__)
    assert ActionSensitivityResult.__name__ not in workbench.widgets.__all__
    assert "DriveState" in workbench.inspect.__all__  # the logic of the Drive view


def test_the_rollout_api_is_frozen():
    """Rollouts are what Drive and the policy evaluation build on, and closed loops what a policy of yours sees:
    their names and arguments are a contract."""
    import workbench.inspect
    from workbench.inspect import Rollout, rollout
    from workbench.inspect.recording.rollouts import RolloutChunk

    assert {"rollout", "Rollout"} <= set(workbench.inspect.__all__)
    assert list(inspect.signature(rollout).parameters) == [
        "model", "start", "actions", "steps", "seed", "state", "gate_scale", "stride", "store", "with_adapter",
        "episodes", "micro_batch", "sampler_kwargs"]
    assert list(inspect.signature(Rollout.fork).parameters) == [
        "self", "chunk", "at", "cond", "with_adapter", "gate_override", "storage"]
    assert {"video", "frame_count", "actions", "states", "extend", "head", "chunk_of"} <= set(dir(Rollout))
    from workbench.inspect import closed_loop
    from workbench.inspect.recording.closed_loop import Observation

    assert list(inspect.signature(closed_loop).parameters) == [
        "model", "start", "policy", "frames", "chunks", "steps", "seed", "state", "observe", "gate_scale", "store",
        "with_adapter", "episodes", "micro_batch", "sampler_kwargs"]
    assert [f.name for f in dataclasses.fields(Observation)] == [
        "frame", "state", "goal", "chunk", "frame_index", "frames", "action_dim", "batched"]
    assert {f.name for f in dataclasses.fields(RolloutChunk)} >= {"trajectory", "start", "frames", "conditions",
                                                                  "state"}


def test_inspect_is_cut_by_concept_and_each_module_has_one_path():
    """recording/, previews/, probes/ beside the views' state (common, views, stepper, drive, cache); a module
    is importable from its own path only: the flat paths from before the cut are gone, not aliased."""
    import importlib
    import pkgutil
    import sys

    import pytest

    import workbench.inspect as inspect

    top = {m.name for m in pkgutil.iter_modules(inspect.__path__)}
    assert top == {"recording", "previews", "probes", "common", "views", "stepper", "drive", "cache"}
    for old in ("trajectory", "rollouts", "preview", "gates", "ablation"):
        with pytest.raises(ModuleNotFoundError, match=f"workbench.inspect.{old}"):
            importlib.import_module(f"workbench.inspect.{old}")
    assert not [name for name in sys.modules if name.startswith("workbench.inspect.")
                and sys.modules[name].__name__ != name]
    assert not hasattr(importlib.import_module("workbench.inspect.probes"), "action_sensitivity")
    assert inspect.record is importlib.import_module("workbench.inspect.recording.trajectory").record
