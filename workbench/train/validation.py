"""The validation loss of an experiment: the adapted and the base-only loss on fixed noise draws.

Under torchrun each rank scores its own share of the batches and the sums are combined, so every
rank returns what one process computes.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.train.data import DataStream, is_map_dataset


def noise_generator(exp, seed: int, index: int) -> torch.Generator:
    """The generator of batch ``index``'s noise draw: fixed by ``seed`` and the index alone."""
    from workbench.train.experiment import mix_seed

    return torch.Generator(device=exp.device).manual_seed(mix_seed(seed, 10**9 + index))


@torch.no_grad()
def validation_loss(exp, data: Any, batches: int = 4, seed: int = 0) -> dict[str, float]:
    """Mean adapted and base-only loss of ``exp`` over ``batches`` batches of ``data``."""
    dist = exp.dist
    mine = range(batches) if dist is None else range(dist.rank, batches, dist.world_size)
    source = exp._cached(data)
    if dist is not None and is_map_dataset(source):  # each rank loads only its own batches
        b, n = exp.training.batch_size, len(source) // exp.training.batch_size
        source = torch.utils.data.Subset(source, [(i % n) * b + j for i in mine for j in range(b)])
        reads = list(mine)
    else:
        reads = list(range(batches)) if dist is not None else list(mine)
    stream = DataStream(source, batch_size=exp.training.batch_size, seed=seed, shuffle=False,
                        num_workers=exp.training.num_workers)
    model = exp.model
    was = model.training
    model.train(False)
    losses = torch.zeros(2, batches, device=exp.device)  # adapted, base
    try:
        objective = model.objective
        for i in reads:
            raw = stream.next()
            if i not in mine:
                continue
            batch = exp.prepare(raw)
            x_t, t, target = model.noised(batch, noise_generator(exp, seed, i))
            pred = model.predict(x_t, t, batch)
            losses[0, i] = objective.loss(pred.composed, target, batch.loss_mask)
            losses[1, i] = objective.loss(pred.base, target, batch.loss_mask)
    finally:
        model.train(was)
    if dist is not None:  # each batch was evaluated by one rank; the others hold zeros there
        dist.sum_(losses)
    adapted, base = float(losses[0].mean()), float(losses[1].mean())
    return {"loss": adapted, "base_loss": base, "improvement": base - adapted, "batches": batches}
