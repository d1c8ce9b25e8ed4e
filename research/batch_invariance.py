"""Rollouts whose frames do not depend on how the episodes were batched (a prototype).

Two things make a rollout's frames depend on the batch an episode is rolled out in:

1. **The noise.** A chunk's initial noise is one ``torch.randn((B, ...), generator)`` from the chunk's
   seed, so an episode's noise is the slot of the batch it sits in: the same episode in another batch
   (another size, another offset, another process) starts from other noise.
2. **The kernels.** On a CPU, a convolution or a matrix product picks its kernel (and its blocking,
   so its order of summation) from the shapes, the batch size included: the same sample's output
   differs in the last bits between batch sizes (see ``batch_ops.py``), and 8 sampling steps over 4+
   chunks grow those bits into grey levels of the decoded frames.

The remedy, inside :func:`invariant` (a context manager over a ``ComposedModel``):

* every sample draws its noise from its own generator, seeded by the chunk's seed mixed with the
  sample's **own seed** (:func:`sample_seeds` gives each episode one from the run's seed and its index
  in the whole set), so an episode's noise is the same in any batch and any process;
* every network call that a rollout makes per sample is made on a **fixed micro-batch layout**:
  the denoiser, the adapter and the hand probe run ``micro`` samples at a time (the last
  micro-batch padded with copies of its last sample, whose outputs are dropped); the autoencoder is
  already invariant for two frames or more per call (its CPU slicing keeps every call at 2..16
  frames, and ``ChunkFrames.span`` never decodes a single frame), which ``batch_ops.py`` checks.

With ``micro=1`` (per-sample calls) a sample's every call has one shape whatever the batch, so its
values are fixed by its own inputs; a larger ``micro`` keeps some batching if the kernels give a
sample the same values at every position of a micro-batch of that size (``batch_ops.py`` measures it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from workbench.core.conditions import Conditioning
from workbench.core.seeds import chunk_seed


def sample_seeds(seed: int, indices: Sequence[int]) -> list[int]:
    """One seed per episode from the run's ``seed`` and each episode's index in the whole set."""
    return [chunk_seed(seed, 1_000_003 + int(i)) for i in indices]


def _mix(chunk: int, own: int) -> int:
    return chunk_seed(own, 1 + (chunk % (2**40)))


def _pieces(n: int, micro: int) -> list[tuple[torch.Tensor, int]]:
    """Index tensors of micro-batches of exactly ``micro`` rows (the last padded with its last row), and how
    many of each are real."""
    out = []
    for lo in range(0, n, micro):
        real = min(micro, n - lo)
        idx = torch.arange(lo, lo + real)
        if real < micro:
            idx = torch.cat([idx, idx[-1:].expand(micro - real)])
        out.append((idx, real))
    return out


def _rows(value: Any, idx: torch.Tensor, n: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == n:
        return value[idx].contiguous()
    return value


def _split_conditioning(cond: Conditioning, idx: torch.Tensor, n: int) -> Conditioning:
    prepared = {k: _rows(v, idx, n) for k, v in cond._prepared.items()}
    raw = {k: _rows(v, idx, n) for k, v in cond._raw.items()}
    dropped = {k: _rows(v, idx, n) for k, v in cond._dropped.items()}
    return Conditioning(prepared, raw, cond._info, dropped, cond._owner)


def _by_micro(fn, micro: int):
    """``fn(x, *args)`` over the batch axis in fixed micro-batches; outputs concatenated."""
    def call(*args):
        n = args[0].shape[0]
        if n == micro:
            return fn(*args)
        outs = []
        for idx, real in _pieces(n, micro):
            part = [(_split_conditioning(a, idx, n) if isinstance(a, Conditioning) else
                     {k: _rows(v, idx, n) for k, v in a.items()} if isinstance(a, dict) else _rows(a, idx, n))
                    for a in args]
            outs.append(fn(*part)[:real])
        return torch.cat(outs)
    return call


@contextlib.contextmanager
def invariant(model: Any, seeds: Sequence[int], *, micro: int = 1, probe: Any = None):
    """Within: ``model``'s samplers draw each sample's noise from ``seeds[i]`` (and the chunk's seed), and
    its denoiser, adapter (and ``probe``, when given) run in micro-batches of ``micro`` samples (``micro=0``:
    as one call, the noise alone made per sample). ``seeds``:
    one per sample of every batch sampled inside (the batch being rolled out)."""
    base, adapter = model.base, model.adapter
    seeds = [int(s) for s in seeds]
    plain_sampler = base.run_sampler
    plain_denoise = base.denoise
    plain_adapter = adapter.forward

    def run_sampler(batch, *, steps, sampler, generator, compose_fn, on_step, initial_noise=None):
        if initial_noise is None:
            shape = batch.latents.shape
            if shape[0] != len(seeds):
                raise ValueError(f"invariant(): {len(seeds)} seeds for a batch of {shape[0]}")
            chunk = generator.initial_seed()
            initial_noise = torch.stack([
                torch.randn(shape[1:], generator=torch.Generator(device=batch.latents.device)
                            .manual_seed(_mix(chunk, s)), device=batch.latents.device, dtype=batch.latents.dtype)
                for s in seeds])
        return plain_sampler(batch, steps=steps, sampler=sampler, generator=generator, compose_fn=compose_fn,
                             on_step=on_step, initial_noise=initial_noise)

    base.run_sampler = run_sampler
    split = micro > 0
    if split:
        base.denoise = _by_micro(plain_denoise, micro)
        adapter.forward = _by_micro(plain_adapter, micro)
        if probe is not None:
            probe.forward = _by_micro(probe.forward, micro)
    try:
        yield
    finally:
        del base.run_sampler
        if split:
            del base.denoise, adapter.forward
            if probe is not None:
                del probe.forward


def imagine_invariant(model: Any, episodes: Any, *, steps: int = 8, seed: int = 0, gate_scale: float | None = 2.0,
                      batch: int = 24, micro: int = 1, state: Any = "probe") -> dict[str, Any]:
    """:func:`workbench.worldmodel.policies.imagine` with batch-invariant rollouts: the same final frames
    and distances for any ``batch``."""
    import time

    import numpy as np

    from workbench.inspect.recording.rollouts import rollout
    from workbench.worldmodel.policies import outcome_distance, start_clips
    from workbench.worldmodel.probe import shipped_object_probe, shipped_probe

    clips = start_clips(episodes)
    actions = torch.from_numpy(np.clip(episodes.actions, -1.0, 1.0).astype(np.float32))
    hand, obj = shipped_probe(), shipped_object_probe()
    finals = []
    started = time.process_time()
    for lo in range(0, len(episodes), batch):
        part = {k: v[lo:lo + batch] for k, v in clips.items()}
        n = part["video"].shape[0]
        with invariant(model, sample_seeds(seed, range(lo, lo + n)), micro=micro, probe=hand):
            ro = rollout(model, part, actions[lo:lo + n], steps=steps, seed=seed, state=state,
                         gate_scale=gate_scale, store=False)
            finals.append(ro.frame(-1))
    cpu = time.process_time() - started
    final = np.concatenate(finals)
    with contextlib.ExitStack() as stack:
        for p in (hand, obj) if micro > 0 else ():
            plain = p.forward
            p.forward = _by_micro(plain, micro)
            stack.callback(delattr, p, "forward")
        distance = outcome_distance(final, episodes, hand_probe=hand, object_probe=obj)
    return {"distance": distance, "final_frames": final, "cpu_seconds": cpu}


__all__ = ["imagine_invariant", "invariant", "sample_seeds"]
