"""Imagination throughput: a policy closed loop in the embedded world model (the adapter ``workbench demo`` ships,
64x64, 16-frame chunks, 8 sampling steps), in chunks per CPU-second, against a plain hand loop of ``generate`` calls.

``closed_loop`` shows the policy the last frame of each chunk and the hand probe's reading of it, asks it for the
next chunk's actions and samples the chunk (a rollout's chunk: the hand probe's reading as the adapter's state).
The hand loop does the same work with none of the machinery: per chunk it reads the hand off the last frame, builds
the generation request, calls ``model.generate`` with each episode's own noise and decodes the last latent frame.
The two give the same frames (checked). Judged: closed loop / hand loop in CPU time (target <= 1.10); printed:
chunks per CPU-second of each. ``--quick``: 2 episodes, 2 chunks, 2 steps, one round.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import torch
from _bench import finish, interleaved, judge, median, ratio, scaled, start

from workbench import AdapterExperiment
from workbench.core.backbone import generation_inputs
from workbench.core.seeds import chunk_seed, noise_seed
from workbench.inspect import closed_loop
from workbench.metrics import to_uint8_video
from workbench.worldmodel.demo import TRAINED_ADAPTER
from workbench.worldmodel.policies import load_policies
from workbench.worldmodel.probe import shipped_probe


def forward(obs):
    """A policy of the observation: the hand pushed away from where the probe reads it, per episode."""
    away = np.sign(0.6 - np.atleast_2d(obs.state["ee_pos"])[:, 1:2])             # [B, 1]
    row = np.concatenate([np.zeros_like(away), away, np.zeros((len(away), 2))], axis=1)
    return np.repeat(row[:, None].astype(np.float32), len(obs.frames), axis=1)


def by_hand(model, clip, chunks: int, steps: int) -> np.ndarray:
    """The closed loop as plain calls: read the hand, choose, request, generate, decode the last frame."""
    base, probe = model.base, shipped_probe()
    window = base.clip().frames
    context = clip["video"][:, :, :1]                                             # (B, 3, 1, H, W)
    last_action = None
    for k in range(chunks):
        seen = to_uint8_video(context)                                            # (B, 1, H, W, 3)
        read = probe.positions(seen[:, -1])                                       # what the policy sees
        # the adapter's hand: at the start frame the start's own (known there), later the probe's reading
        hand = clip["ee_pos"][:, 0] if k == 0 else torch.as_tensor(read, dtype=torch.float32)
        seen_by_policy = SimpleNamespace(state={"ee_pos": read}, frames=range(window if k == 0 else window - 1))
        actions = torch.from_numpy(forward(seen_by_policy))
        if last_action is not None:  # a later chunk's first action is the one the previous chunk ended on
            actions = torch.cat([last_action, actions], dim=1)
        last_action = actions[:, -1:]
        video = torch.cat([context, context.expand(-1, -1, window - 1, -1, -1)], dim=2)
        request = {**generation_inputs(base, video), "action": actions,
                   "ee_pos": hand[:, None].expand(-1, window, -1).contiguous(), "camera": clip["camera"]}
        batch = base.prepare_batch(request)
        shape = tuple(batch.latents.shape[1:])
        noise = torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(noise_seed(0, e, k)))
                             for e in range(len(actions))])                  # each episode its own noise
        latents = model.generate(batch, steps=steps, generator=torch.Generator().manual_seed(chunk_seed(0, k)),
                                 initial_noise=noise)
        with torch.no_grad():
            last = to_uint8_video(base.decode(latents[:, :, -1:]))
        context = torch.from_numpy(last).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)
    return last[:, -1]


def main(argv: list[str] | None = None) -> int:
    start(argv, __doc__)
    model = AdapterExperiment.load(TRAINED_ADAPTER).model
    episodes, chunks, steps = scaled(8, 2), scaled(3, 2), scaled(8, 2)
    from workbench.worldmodel.closed_loop_eval import starts_from_recording

    starts = starts_from_recording(load_policies())
    clip = {k: v[:episodes] for k, v in starts.clips().items() if k != "goal"}   # the recording's start states

    def loop():
        # one call over the batch, as the hand loop makes it (the default micro-batches of 4 would make the
        # frames independent of the batch, and the hand loop would then have to cut it the same way)
        return closed_loop(model, clip, forward, chunks=chunks, steps=steps, state="probe", store=False,
                           micro_batch=None)

    same = np.array_equal(loop().rollout.frame(-1), by_hand(model, clip, chunks, steps))
    print(f"closed loop == hand loop, bit for bit (the last frames of {episodes} episodes): {same}")
    t = interleaved({"closed_loop": loop, "by_hand": lambda: by_hand(model, clip, chunks, steps)}, repeats=5)
    work = episodes * chunks
    for name in t:
        print(f"{name}: {median(t[name]):.2f} CPU s for {episodes} episodes x {chunks} chunks at {steps} steps, "
              f"{work / median(t[name]):.2f} chunks per CPU-second")
    judge("closed loop / hand loop", ratio(t, "closed_loop", "by_hand"), 1.10)
    return finish() if same else 1


if __name__ == "__main__":
    sys.exit(main())
