"""Notebook views: ipywidgets + matplotlib on top of the instruments in :mod:`workbench.inspect`.

Views: :class:`Stepper` (step through a trajectory and its forks), :class:`ConditionProbe`
(what ``adapter.view()`` sees), :class:`AblationSliders` (one slider per condition dimension),
:class:`Gates` (gate values over noise levels, over training, and as a map),
:class:`ActionSensitivity` (sensitivity per action dimension × noise level) and :class:`Fit`
(a training run with a live loss plot, stop and resume, that leaves the notebook responsive) and
:class:`Drive` (drive a world model by hand, one chunk per key press, with undo, branches and save).

Each view is an ``ipywidgets.VBox``: its controls only call the logic in ``workbench.inspect``
and the pure render functions in :mod:`workbench.widgets.render`. Displayed where no front end
runs the widgets (nbconvert, nbval, a notebook viewer), a view shows a PNG of its current
picture and a one-line text summary. ``import workbench.widgets`` itself loads neither
ipywidgets nor matplotlib; each view's module does, when first used.

Examples:
    >>> from workbench.widgets import Stepper
    >>> view = Stepper(traj)      # scrub, play, fork, export (traj = exp.sample(raw, steps=20, seed=0))
"""

from __future__ import annotations

from workbench._lazy import lazy_exports

_VIEWS = {
    "Stepper": "workbench.widgets.stepper",
    "ConditionProbe": "workbench.widgets.probe",
    "AblationSliders": "workbench.widgets.ablation",
    "Gates": "workbench.widgets.gates",
    "ActionSensitivity": "workbench.widgets.sensitivity",
    "Fit": "workbench.widgets.fit",
    "Drive": "workbench.widgets.drive",
}

__all__, __getattr__, __dir__ = lazy_exports("workbench.widgets", _VIEWS, "views")
