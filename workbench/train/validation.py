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
    mine = list(range(batches)) if dist is None else list(range(dist.rank, batches, dist.world_size))
    # Under FSDP every forward gathers the sharded parameters from all ranks, so every rank runs as many
    # forwards as the busiest one: a rank short of a batch runs one it read again, its score discarded.
    rounds = (-(-batches // dist.world_size) if dist is not None and dist.config.strategy == "fsdp"
              else len(mine))
    if dist is not None and is_map_dataset(source):  # each rank loads only its own batches
        n = len(source) // batch_size
        reads = mine or [0]  # (a rank with no batch of its own still loads one for those forwards)
        source = torch.utils.data.Subset(source, [(i % n) * batch_size + j for i in reads
                                                  for j in range(batch_size)])
    else:
        reads = list(range(batches)) if dist is not None else mine
    stream = DataStream(source, batch_size=batch_size, seed=seed, shuffle=False, num_workers=num_workers)
    was = model.training
    model.train(False)
    losses = torch.zeros(2, batches, device=device)  # adapted, base
    objective = model.objective

    def score(raw: Any, i: int) -> torch.Tensor:
        batch = prepare(raw)
        x_t, t, target = model.noised(batch, noise_generator(device, seed, i))
        pred = model.predict(x_t, t, batch)
        return torch.stack([objective.loss(pred.composed, target, batch.loss_mask),
                            objective.loss(pred.base, target, batch.loss_mask)])

    try:
        first = None  # the first batch read: the one a rank short of batches runs again
        for i in reads:
            raw = stream.next()
            first = first or (raw, i)
            if i in mine:
                losses[:, i] = score(raw, i)
        for _ in range(rounds - len(mine)):
            score(*first)
    finally:
        model.train(was)
    if dist is not None:  # each batch was evaluated by one rank; the others hold zeros there
        dist.sum_(losses)
    adapted, base = float(losses[0].mean()), float(losses[1].mean())
    return {"loss": adapted, "base_loss": base, "improvement": base - adapted, "batches": batches}
