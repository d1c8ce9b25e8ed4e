"""Seeds that are a pure function of integers: the run seed, the step, the micro-batch, a batch index.

Tying every random draw to such a seed (never to a rank or to how often a generator was used
before) is what makes a resumed run and a K-rank run equal a single uninterrupted process.
"""

from __future__ import annotations


def mix_seed(*parts: int) -> int:
    """One 63-bit seed from several integers (the run seed, the step, the micro-batch, ...)."""
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value ^ (int(p) + 0x632BE59BD9B4E019 + (value << 6) + (value >> 2))) & (2**63 - 1)
    return value
