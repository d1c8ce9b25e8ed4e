"""The world-model wing: the Meta-World study built *on* the library, not part of it.

It turns the frozen embedded backbone into an action-conditioned world model of a robot arm and
measures whether the predictions follow the actions:

* :mod:`~workbench.worldmodel.sim` and :mod:`~workbench.worldmodel.generate`: Meta-World rollouts
  rendered with MuJoCo, written as HDF5 or a LeRobot dataset (``workbench data metaworld``);
* :mod:`~workbench.worldmodel.pretrain`: pretraining the embedded ``tiny_video`` on them
  (``workbench pretrain``);
* :mod:`~workbench.worldmodel.probe`: the hand-position probe and the action error it scores
  (``workbench probe``);
* :mod:`~workbench.worldmodel.evaluate`: predicting held-out clips three ways and scoring them
  (``workbench eval``);
* :mod:`~workbench.worldmodel.rollout_eval`: whole held-out episodes rolled out chunk by chunk and scored
  per chunk (``workbench eval RUN --rollout``);
* :mod:`~workbench.worldmodel.policies`: policies recorded in the simulator, replayed as rollouts and
  ranked against it (``workbench eval RUN --policies --open-loop``);
* :mod:`~workbench.worldmodel.scripted`, :mod:`~workbench.worldmodel.closed_loop_eval` and
  :mod:`~workbench.worldmodel.simulator_twin`: the shipped policies (and yours) acting closed loop in the
  world model and in the simulator under one decision rule, ranked (``workbench eval RUN --policies``);
* :mod:`~workbench.worldmodel.demo`: the whole study in one command (``workbench demo``), which ends with
  :func:`~workbench.worldmodel.summary.first_table`.

The library (core, train, inspect, widgets, adapters, backbones, data, testing, the ``workbench``
command) never imports this package; its commands register through the ``workbench.commands``
entry-point group as a plugin's would. It uses only what the library offers a researcher, so it is
also the template for a study of your own on your own data.

Names resolve on first access; nothing heavy is imported here.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "generate_lerobot": "workbench.worldmodel.generate",
    "metaworld_to_lerobot": "workbench.worldmodel.generate",
    "Perturbation": "workbench.worldmodel.sim",
    "PretrainConfig": "workbench.worldmodel.pretrain",
    "HandProbe": "workbench.worldmodel.probe",
    "action_error": "workbench.worldmodel.probe",
    "hand_error_cm": "workbench.worldmodel.probe",
    "clip_source": "workbench.worldmodel.common",
    "evaluate_run": "workbench.worldmodel.evaluate",
    "evaluate_world_model": "workbench.worldmodel.evaluate",
    "load_run": "workbench.worldmodel.common",
    "LONG_PATH": "workbench.worldmodel.rollout_eval",
    "long_episodes": "workbench.worldmodel.rollout_eval",
    "evaluate_rollouts": "workbench.worldmodel.rollout_eval",
    "load_policies": "workbench.worldmodel.policies",
    "imagine": "workbench.worldmodel.policies",
    "evaluate_policies": "workbench.worldmodel.policies",
    "rank_agreement": "workbench.worldmodel.policies",
    "ScriptedPolicy": "workbench.worldmodel.scripted",
    "family": "workbench.worldmodel.scripted",
    "StartStates": "workbench.worldmodel.closed_loop_eval",
    "fresh_starts": "workbench.worldmodel.closed_loop_eval",
    "simulate": "workbench.worldmodel.simulator_twin",
    "evaluate_closed_loop": "workbench.worldmodel.closed_loop_eval",
    "DemoConfig": "workbench.worldmodel.demo",
    "TRAINED_ADAPTER": "workbench.worldmodel.demo",
    "DRIFT_ADAPTER": "workbench.worldmodel.demo",
    "run_demo": "workbench.worldmodel.demo",
    "SCRATCH_MODEL": "workbench.worldmodel.demo",
    "first_table": "workbench.worldmodel.summary",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}; names: {', '.join(__all__)}.")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
