"""Probes: what the adapter reads, where it acts, and what an edited condition changes.

Condition and noise-level sensitivity (:mod:`~workbench.inspect.probes.sensitivity`), gates
(:mod:`~workbench.inspect.probes.gates`), readouts of predicted frames
(:mod:`~workbench.inspect.probes.readout`) and condition ablation (:mod:`~workbench.inspect.probes.ablation`).
The names users need are exported by :mod:`workbench.inspect`; the sensitivity probes are importable from
here too, where they lived before.
"""

from workbench.inspect.probes.sensitivity import *  # noqa: F403 - the module's __all__
from workbench.inspect.probes.sensitivity import __all__  # noqa: F401
