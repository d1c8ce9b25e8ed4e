"""Data sets, e.g. Meta-World robot-arm video with actions.

* :mod:`workbench.data.metaworld_gen` renders episodes into an HDF5 file (``workbench data metaworld``),
  with :mod:`workbench.data.metaworld_sim` (cameras, the action perturbation, one rollout).
* :mod:`workbench.data.metaworld` reads them as clips: the ``metaworld`` dataset.

Nothing heavy is imported here: h5py, MuJoCo and Meta-World load only when a file is generated
or read, and the names below are resolved on first access.
"""

from __future__ import annotations

from workbench._lazy import lazy_exports

_LAZY = {
    "MetaWorldClips": "workbench.data.metaworld",
    "MetaWorldConfig": "workbench.data.metaworld",
    "sample_path": "workbench.data.metaworld",
    "split_episodes": "workbench.data.metaworld",
    "generate": "workbench.data.metaworld_gen",
    "Perturbation": "workbench.data.metaworld_sim",
}

__all__, __getattr__, __dir__ = lazy_exports("workbench.data", _LAZY, "names")
