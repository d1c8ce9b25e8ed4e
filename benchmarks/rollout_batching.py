"""Rollouts whose frames do not depend on the batch, against a plain one-call batch.

A rollout gives every episode its own noise and runs the base and the adapter on micro-batches of
``DEFAULT_MICRO_BATCH`` episodes (the last padded), so that an episode gets the same frames in any batch.
Timed here: a two-chunk rollout of 24 episodes on the benchmark model, in CPU time, with the default micro-
batch, with one episode per call (``micro_batch=1``) and with one call over the whole batch
(``micro_batch=None``, whose frames depend on the batch size in their last bits). Judged: the default within
1.5x the one-call batch on this small model (32x32, where a call's fixed cost weighs more; on the embedded
64x64 world model it costs 0.9-1.2x per sampling step of 24 episodes). Printed first: whether the same
episodes rolled out in batches of 24, 5 and 1 give the same frames, bit for bit (they must, for the default;
``--quick``: 6 episodes at 2 steps, three of them alone).
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from _bench import finish, interleaved, judge, ratio, scaled, setup, start

from workbench.core.rows import DEFAULT_MICRO_BATCH
from workbench.inspect import rollout


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    episodes, steps = scaled(24, 6), scaled(10, 2)
    model, batch = setup()
    base = model.base
    clip = base.clip()
    g = torch.Generator().manual_seed(0)
    frames = 2 * clip.frames - 1  # two chunks
    start_clips = {"video": torch.rand(episodes, 3, 1, clip.height, clip.width, generator=g) * 2 - 1}
    actions = torch.rand(episodes, frames, batch.cond["action"].shape[-1], generator=g) * 2 - 1

    def roll(lo: int, hi: int, micro: int | None = DEFAULT_MICRO_BATCH) -> np.ndarray:
        rows = {k: v[lo:hi] for k, v in start_clips.items()}
        return rollout(model, rows, actions[lo:hi], steps=steps, store=False, episodes=range(lo, hi),
                       micro_batch=micro).video

    whole = roll(0, episodes)
    fives = np.concatenate([roll(lo, min(lo + 5, episodes)) for lo in range(0, episodes, 5)])
    alone = np.concatenate([roll(e, e + 1) for e in range(scaled(episodes, 3))])
    print(f"the same frames in batches of {episodes} and 5: {np.array_equal(whole, fives)}; "
          f"and alone: {np.array_equal(whole[:len(alone)], alone)}")
    plain = roll(0, episodes, None)
    print(f"one call over the batch (micro_batch=None): largest difference from the default "
          f"{int(np.abs(plain.astype(int) - whole.astype(int)).max())} grey levels")
    t = interleaved({"default": lambda: roll(0, episodes),
                     "one episode per call": lambda: roll(0, episodes, 1),
                     "one call": lambda: roll(0, episodes, None)}, repeats=scaled(7, 1))
    print(f"{episodes} episodes, {frames} frames (2 chunks), {steps} steps; micro-batch {DEFAULT_MICRO_BATCH}")
    print(f"one episode per call / one call = {ratio(t, 'one episode per call', 'one call'):.3f}")
    judge(f"micro-batch {DEFAULT_MICRO_BATCH} / one call", ratio(t, "default", "one call"), 1.5)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
