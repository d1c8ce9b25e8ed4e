"""The validation loss: the adapted and the base-only loss of a model on fixed noise draws.

Under torchrun each rank scores its own share of the batches and the sums are combined, so every
rank returns what one process computes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from workbench.core.composed import ComposedModel
from workbench.core.conditions import Batch
from workbench.train.data import DataStream, is_map_dataset
from workbench.train.seeds import mix_seed


def noise_generator(device: torch.device | str, seed: int, index: int) -> torch.Generator:
    """The generator of batch ``index``'s noise draw: fixed by ``seed`` and the index alone."""
    return torch.Generator(device=device).manual_seed(mix_seed(seed, 10**9 + index))


@torch.no_grad()
def validation_loss(model: ComposedModel, source: Any, *, prepare: Callable[[Any], Batch], batch_size: int,
                    device: torch.device | str, batches: int = 4, seed: int = 0, num_workers: int = 0,
                    dist: Any = None) -> dict[str, float]:
    """Mean adapted and base-only loss of ``model`` over ``batches`` batches of ``source``.

    ``prepare`` turns a raw batch into a :class:`Batch` on ``device`` (the backbone's
    ``prepare_batch``); ``dist`` is the run's :class:`~workbench.train.distributed.Distributed`
    (``None`` on one process).
    """
    mine = range(batches) if dist is None else range(dist.rank, batches, dist.world_size)
    if dist is not None and is_map_dataset(source):  # each rank loads only its own batches
        n = len(source) // batch_size
        source = torch.utils.data.Subset(source, [(i % n) * batch_size + j for i in mine for j in range(batch_size)])
        reads = list(mine)
    else:
        reads = list(range(batches)) if dist is not None else list(mine)
    stream = DataStream(source, batch_size=batch_size, seed=seed, shuffle=False, num_workers=num_workers)
    was = model.training
    model.train(False)
    losses = torch.zeros(2, batches, device=device)  # adapted, base
    try:
        objective = model.objective
        for i in reads:
            raw = stream.next()
            if i not in mine:
                continue
            batch = prepare(raw)
            x_t, t, target = model.noised(batch, noise_generator(device, seed, i))
            pred = model.predict(x_t, t, batch)
            losses[0, i] = objective.loss(pred.composed, target, batch.loss_mask)
            losses[1, i] = objective.loss(pred.base, target, batch.loss_mask)
    finally:
        model.train(was)
    if dist is not None:  # each batch was evaluated by one rank; the others hold zeros there
        dist.sum_(losses)
    adapted, base = float(losses[0].mean()), float(losses[1].mean())
    return {"loss": adapted, "base_loss": base, "improvement": base - adapted, "batches": batches}
