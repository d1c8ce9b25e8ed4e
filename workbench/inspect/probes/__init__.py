"""Probes: what the adapter reads, where it acts, and what an edited condition changes.

Condition and noise-level sensitivity (:mod:`~workbench.inspect.probes.sensitivity`), gates
(:mod:`~workbench.inspect.probes.gates`), readouts of predicted frames
(:mod:`~workbench.inspect.probes.readout`) and condition ablation (:mod:`~workbench.inspect.probes.ablation`).
The names users need are exported by :mod:`workbench.inspect`.
"""
