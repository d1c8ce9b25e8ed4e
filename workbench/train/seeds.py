"""Seeds that are a pure function of integers: the run seed, the step, the micro-batch, a batch index.

Tying every random draw to such a seed (never to a rank or to how often a generator was used
before) is what makes a resumed run and a K-rank run equal a single uninterrupted process.
"""

from __future__ import annotations

import torch


def mix_seed(*parts: int) -> int:
    """One 63-bit seed from several integers (the run seed, the step, the micro-batch, ...)."""
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value ^ (int(p) + 0x632BE59BD9B4E019 + (value << 6) + (value >> 2))) & (2**63 - 1)
    return value


class StepNoise:
    """The generator each training micro-batch draws its noise and ``t`` from, on ``device``.

    Its draws are a pure function of ``(seed, step, micro)``, where ``micro`` is the micro-batch's
    place among the step's micro-batches of all ranks: the same in a resumed run, on any number of
    ranks, and in the second process of :mod:`workbench.train.ahead`. One generator re-seeded for
    each micro-batch draws what a fresh one would, without allocating one every step.

    Examples:
        >>> noise = StepNoise(seed=0, device="cpu")
        >>> a = torch.randn(3, generator=noise.generator(step=5, micro=1))
        >>> torch.equal(a, torch.randn(3, generator=StepNoise(0, "cpu").generator(5, 1)))
        True
    """

    def __init__(self, seed: int, device: torch.device | str):
        self.seed = seed
        self._generator = torch.Generator(device=device)

    def generator(self, step: int, micro: int) -> torch.Generator:
        """The generator of micro-batch ``micro`` of step ``step``, seeded afresh."""
        return self._generator.manual_seed(mix_seed(self.seed, step, micro))
