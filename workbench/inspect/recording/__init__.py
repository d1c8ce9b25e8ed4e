"""Recording: sampling runs kept step by step, forked, resumed, and rolled out over whole episodes.

:mod:`~workbench.inspect.recording.trajectory` (``record``, ``Trajectory``), the per-step record
(:mod:`~workbench.inspect.recording.step`), what is kept (:mod:`~workbench.inspect.recording.storage`), how
live steps evaluate (:mod:`~workbench.inspect.recording.settings`), the sampler hooks
(:mod:`~workbench.inspect.recording.recorder`), rollouts (:mod:`~workbench.inspect.recording.rollouts`),
closed-loop evaluation of a policy (:mod:`~workbench.inspect.recording.closed_loop`), whole-clip
predictions (:mod:`~workbench.inspect.recording.clips`) and video export
(:mod:`~workbench.inspect.recording.export`). The names users need are exported by :mod:`workbench.inspect`.
"""
