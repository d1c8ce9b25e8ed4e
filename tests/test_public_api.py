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


TESTING_SNAPSHOT = ["INSIDE_PROMISES", "PROMISES", "ConformanceError", "ConformanceReport", "Finding", "ProbeAdapter",
                    "check_backbone", "check_inside_adapter", "counting_base_calls"]


def test_the_conformance_kit_is_a_frozen_documented_submodule():
    import workbench.testing
    from workbench.testing import check_backbone

    assert sorted(workbench.testing.__all__) == sorted(TESTING_SNAPSHOT), "update TESTING_SNAPSHOT deliberately"
    assert callable(check_backbone) and list(workbench.testing.PROMISES) == [
        "card", "to", "provides", "encode_decode", "identity", "constrain", "recording", "fork", "clip", "rollout",
        "training", "state_dict"]


WIDGETS_SNAPSHOT = ["AblationSliders", "ActionSensitivity", "ConditionProbe", "Drive", "Fit", "Gates", "Stepper"]


def test_the_views_are_a_frozen_submodule_and_no_view_shares_a_name_with_an_instrument():
    """A view (``workbench.widgets``) and the logic or result it shows (``workbench.inspect``) have distinct
    names: ``ActionSensitivity`` is the view, ``ActionSensitivityResult`` what ``action_sensitivity`` returns."""
    import workbench.inspect
    import workbench.widgets

    assert sorted(workbench.widgets.__all__) == WIDGETS_SNAPSHOT, "update WIDGETS_SNAPSHOT deliberately"
    assert set(workbench.widgets.__all__).isdisjoint(workbench.inspect.__all__)
    assert "ActionSensitivityResult" in workbench.inspect.__all__
    assert {"Readout", "FrameReadout", "Propagation", "PathComparison"} <= set(workbench.inspect.__all__)
    assert "DriveState" in workbench.inspect.__all__  # the logic of the Drive view


def test_the_rollout_api_is_frozen():
    """Rollouts are what Drive and the policy evaluation build on, and closed loops what a policy of yours sees:
    their names and arguments are a contract."""
    import workbench.inspect
    from workbench.inspect import Rollout, RolloutChunk, rollout

    assert {"rollout", "Rollout", "RolloutChunk"} <= set(workbench.inspect.__all__)
    assert list(inspect.signature(rollout).parameters) == [
        "model", "start", "actions", "steps", "seed", "state", "gate_scale", "stride", "store", "adapter",
        "sampler_kwargs"]
    assert list(inspect.signature(Rollout.fork).parameters) == [
        "self", "chunk", "at", "cond", "adapter", "gate_override", "storage"]
    assert {"video", "frame_count", "actions", "states", "extend", "head", "chunk_of"} <= set(dir(Rollout))
    from workbench.inspect import Observation, closed_loop

    assert list(inspect.signature(closed_loop).parameters) == [
        "model", "start", "policy", "frames", "chunks", "steps", "seed", "state", "observe", "gate_scale", "store",
        "adapter", "sampler_kwargs"]
    assert [f.name for f in dataclasses.fields(Observation)] == [
        "frame", "state", "goal", "chunk", "frame_index", "frames", "action_dim", "batched"]
    assert {f.name for f in dataclasses.fields(RolloutChunk)} >= {"trajectory", "start", "frames", "conditions",
                                                                  "state"}


def test_inspect_is_cut_by_concept_and_the_old_module_paths_still_import():
    """recording/, previews/, probes/ beside the views' state (common, views, stepper, drive, cache); a module
    path from before the cut names the same module object in its new home."""
    import importlib
    import pkgutil

    import workbench.inspect as inspect

    top = {m.name for m in pkgutil.iter_modules(inspect.__path__)}
    assert top == {"recording", "previews", "probes", "common", "views", "stepper", "drive", "cache"}
    for old, package in inspect._MOVED.items():
        assert importlib.import_module(f"workbench.inspect.{old}") is importlib.import_module(
            f"workbench.inspect.{package}.{old}"), old
    from workbench.inspect.trajectory import record  # noqa: F401 - the 0.3 path

    from workbench.inspect.probes import action_sensitivity  # the sensitivity probes, where they were

    assert action_sensitivity is importlib.import_module("workbench.inspect.probes.sensitivity").action_sensitivity
    assert record is inspect.record
