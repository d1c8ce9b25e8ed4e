"""The Fit view draws its loss plot for someone to see: live while it is displayed, once at the end before."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_base

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from workbench import AdapterExperiment, GatedResidual, TrainingConfig  # noqa: E402
from workbench.adapters.latent_residual import LatentResidual  # noqa: E402
from workbench.data.synthetic import SyntheticMoves  # noqa: E402
from workbench.widgets import Fit, render  # noqa: E402


@pytest.fixture
def drawn(monkeypatch):
    """The steps of every loss plot drawn, in order."""
    steps: list[list[int]] = []
    loss_figure = render.loss_figure
    monkeypatch.setattr(render, "loss_figure", lambda *a, **k: (steps.append(list(a[0])), loss_figure(*a, **k))[1])
    return steps


def test_a_run_before_the_view_is_displayed_draws_the_plot_once_when_it_ends_and_live_after(drawn):
    torch.manual_seed(0)
    exp = AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=8, depth=1), composer=GatedResidual(),
                            training=TrainingConfig(learning_rate=1e-3, batch_size=2, sync_every=1))
    data = SyntheticMoves(items=4, frames=4, size=16)
    fit = Fit(exp, data, steps=3, plot_every=0)  # a redraw after every step while anyone can see it
    assert drawn == [[]]  # the empty plot the view opens with
    fit.run()  # `Fit(...).run()` in a cell: the view shows only once the run is over
    assert drawn == [[], [1, 2, 3]]
    assert "image/png" in fit._repr_mimebundle_()  # displayed, as the cell's result is
    fit.run(2)
    assert drawn[2:] == [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]  # each step, then the end
