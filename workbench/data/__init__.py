"""Data sets the library reads, e.g. Meta-World robot-arm video with actions.

* :mod:`workbench.data.metaworld` reads the clip HDF5 schema (the files ``workbench data metaworld``
  of the world-model wing, :mod:`workbench.worldmodel.generate`, renders): the ``metaworld`` dataset.
* :mod:`workbench.data.lerobot` reads LeRobot datasets (v2.1, v3.0) as clips: the ``lerobot`` dataset;
  :mod:`workbench.data.lerobot_write` writes v3.0.
* :func:`open_clips` opens either kind from a path (an ``.h5`` file or a LeRobot directory).
* :mod:`workbench.data.control` derives control videos from clips (``edges``), for ``controlnet``.
* :mod:`workbench.data.scenes` renders folders of clips with 4-D actions like a user's recordings (a blob,
  a gripper pushing a puck, a moving camera), to try ``workbench data import`` and the own-data recipe on.

Nothing heavy is imported here: h5py, pyarrow and PyAV load only when a file is read, and the names
below are resolved on first access.
"""

from __future__ import annotations

from workbench._lazy import lazy_exports

_LAZY = {
    "MetaWorldClips": "workbench.data.metaworld",
    "MetaWorldConfig": "workbench.data.metaworld",
    "sample_path": "workbench.data.metaworld",
    "split_episodes": "workbench.data.metaworld",
    "LeRobotClips": "workbench.data.lerobot",
    "LeRobotConfig": "workbench.data.lerobot",
    "LeRobotWriter": "workbench.data.lerobot_write",
    "open_clips": "workbench.data.sources",
    "edges": "workbench.data.control",
}

__all__, __getattr__, __dir__ = lazy_exports("workbench.data", _LAZY, "names")
