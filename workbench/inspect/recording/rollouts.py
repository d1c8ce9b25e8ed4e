"""Rollouts: whole episodes predicted chunk by chunk, each chunk a recorded :class:`Trajectory`.

    ro = rollout(model, clip, actions, steps=8, seed=0)    # model: exp.model; actions (N, D): frames 0..N-1
    ro.video                                               # uint8 [N, H, W, 3]; frame 0 is the given one
    ro.chunks[3].trajectory                                # step through chunk 3 (the Stepper opens it)
    alt = ro.fork(chunk=3, at=4, cond={"action": other})   # chunk 3 forked at step 4, chunks 4.. re-rolled
    more = ro.extend(next_actions)                         # more frames; ro.head(2) keeps two chunks

Chunk 0 is predicted from the start clip's first ``card.context_frames`` frames (1 for an
image-to-video backbone) and the actions of its window; chunk ``k + 1`` from the last
``context_frames`` frames chunk ``k`` **produced** (as uint8 frames, exactly what
:attr:`Rollout.video` shows) and its own window of actions. One chunk is one window of the
backbone's clip (:meth:`~workbench.core.backbone.BaseVideoModel.clip`, 16 frames on the
embedded model) and adds ``stride`` (default ``W - context_frames``) new frames. A last chunk
that reaches past the episode holds its last action for the missing frames and keeps only the
frames of the episode.

Nothing recorded after the start frame(s) is read: a state the adapter reads at a chunk's first frame
(e.g. the action path's ``ee_pos``) is read off the frames the model produced, by a **state reader**
(:class:`~workbench.inspect.recording.state.StateReader`, which names the conditions it fills):
``state=NAME`` builds the reader registered under that name (the world-model wing registers its hand
probe as ``"probe"``), ``state=StateReader(fn, keys=(...))`` uses one of your own, ``state="start"``
gives every chunk the start clip's recorded value at frame 0 (known when the episode starts, held),
``state="recorded"`` gives the start clip's recorded value at each chunk's first frame (a ceiling for
measurements, not a world model), and ``state=None`` (the default) gives none. Chunk 0 is given the start
clip's state at frame 0 when it carries one (known at the first frame). Chunk ``k`` samples with
:func:`~workbench.core.seeds.chunk_seed` ``(seed, k)``.

**The same frames in any batch.** An episode's frames depend only on the episode, the seed and the
settings, not on the batch (or the process) it is rolled out in: row ``i`` of the start clips is episode
``episodes[i]`` (default: its row), and chunk ``k`` of episode ``e`` starts from noise of its own, drawn
with :func:`~workbench.core.seeds.noise_seed` ``(seed, e, k)``; the base, the adapter and the state
reader run on micro-batches of exactly ``micro_batch`` episodes (default
:data:`~workbench.core.rows.DEFAULT_MICRO_BATCH`, the last one padded with copies whose outputs are
dropped), because a CPU's kernels round a sample differently in batches of other sizes. So the episodes
3..5 of a set, rolled out as a batch of three with ``episodes=[3, 4, 5]`` or one at a time with
``episodes=[3]`` and so on, give the frames (bit for bit) that they get in a batch of all of them.
``micro_batch=None`` makes one call per network over the whole batch (faster on large batches, and the
frames then depend on the batch size in their last bits). A backbone whose sampler takes no
``initial_noise`` (:func:`~workbench.core.backbone.takes_initial_noise`; the diffusers pipelines, which also
make the base's call themselves, on the whole batch) draws the batch's noise in one piece from the chunk's
seed and runs as one call; its rollouts say so (:attr:`Rollout.batch_invariant` is False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from workbench.core.backbone import (
    decodes_frames_alone,
    generation_inputs,
    max_generate_batch,
    takes_initial_noise,
)
from workbench.core.card import IMAGE_MODES, TEXT_MODES
from workbench.core.composed import ComposedModel
from workbench.core.composers import scaled_gate
from workbench.core.rows import DEFAULT_MICRO_BATCH, check_micro_batch, in_micro_batches
from workbench.core.seeds import chunk_seed, noise_seed
from workbench.errors import listing
from workbench.inspect.common import InspectError, check_model, prepare
from workbench.inspect.recording.recorder import generator_state
from workbench.inspect.recording.settings import Settings, check_with_adapter
from workbench.inspect.recording.state import RECORDED, START, StateReader, resolve_state
from workbench.inspect.recording.storage import StoragePolicy
from workbench.inspect.recording.trajectory import Trajectory, run
from workbench.registry import registered


# -- the result ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RolloutChunk:
    """One chunk of a :class:`Rollout`: a window of the backbone's clip, sampled as one recorded run.

    ``trajectory``: the recorded :class:`Trajectory` (open it in the Stepper, fork it). ``start``:
    the episode frame its first (given) frame is. ``frames``: the episode frames :attr:`Rollout.video`
    takes from it. ``conditions``: the raw request it was sampled from (CPU tensors; ``image`` is the
    frame it continues from). ``state``: the state it was given (``[B, D]``: the value of the first state
    condition it was given) or None. ``decoded``: its
    frames, decoded when first read (:attr:`produced`). ``padded``: how many of its frames lie past the
    episode (their action held). ``seed``: its seed.
    """

    index: int
    start: int
    frames: range
    trajectory: Trajectory
    conditions: dict[str, Any]
    state: torch.Tensor | None
    decoded: ChunkFrames = field(repr=False)
    padded: int = 0
    seed: int = 0

    @property
    def produced(self) -> np.ndarray:
        """Every frame it made, uint8 ``[B, W, H, W, 3]`` (frame 0 is its context frame, re-encoded)."""
        return self.decoded.all()

    @property
    def window(self) -> range:
        """The episode frames of the chunk's window (its context frame(s) included, padding excluded)."""
        return range(self.start, self.start + self.decoded.count - self.padded)


class ChunkFrames:
    """A chunk's frames, uint8 ``[B, W, H, W, 3]``, decoded from its last latents when first read. On a
    backbone whose ``decode`` makes each frame from its own latent frame alone
    (:func:`~workbench.core.backbone.decodes_frames_alone`), reading some frames decodes
    only those: the next chunk needs its context frame, a policy's outcome the episode's last frame."""

    def __init__(self, base: Any, latents: torch.Tensor):
        self._base, self._latents = base, latents
        self._all: np.ndarray | None = None
        self._some: dict[int, np.ndarray] = {}

    @property
    def count(self) -> int:
        """How many frames the chunk made (one per latent frame where frames decode alone)."""
        return int(self._latents.shape[2]) if decodes_frames_alone(self._base) else self.all().shape[1]

    def _alone(self) -> bool:
        return self._all is None and decodes_frames_alone(self._base)

    def all(self) -> np.ndarray:
        if self._all is None:
            self._all = _uint8(self._base, self._latents)
            self._some.clear()
        return self._all

    def span(self, lo: int, hi: int) -> np.ndarray:
        """Frames ``lo .. hi - 1``, uint8 ``[B, hi - lo, H, W, 3]``: the values of ``all()[:, lo:hi]``."""
        if not self._alone():
            return self.all()[:, lo:hi]
        missing = [i for i in range(lo, hi) if i not in self._some]
        if missing:
            a, b = missing[0], missing[-1] + 1
            if self._latents.shape[0] * (b - a) < 2:
                # A convolution over one frame takes other kernels than over several, and rounds differently:
                # one clip's single frame is decoded beside a neighbour, as all() would decode it.
                a, b = (a - 1, b) if a > 0 else (a, b + 1)
            got = _uint8(self._base, self._latents[:, :, a:b])
            self._some.update({i: got[:, i - a] for i in range(a, b)})
        return np.stack([self._some[i] for i in range(lo, hi)], axis=1)


@dataclass(frozen=True, eq=False)
class _Plan:
    model: ComposedModel
    settings: Settings
    steps: int
    sampler: str
    seed: int
    window: int
    context: int
    stride: int
    storage: StoragePolicy
    keep: bool
    reader: StateReader | None
    state_mode: str
    state_keys: tuple[str, ...]
    recorded_state: dict[str, torch.Tensor]
    static: dict[str, Any]
    start_video: torch.Tensor      # (B, 3, c, H, W) float, the given context frames
    start_frames: np.ndarray       # (B, c, H, W, 3) uint8
    batched: bool
    episodes: tuple[int, ...] = ()
    micro_batch: int | None = DEFAULT_MICRO_BATCH
    own_noise: bool = True         # each episode draws its own noise (the backbone takes initial_noise)
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)


class Rollout:
    """An autoregressive prediction of an episode (see the module docstring). Immutable: :meth:`extend`,
    :meth:`head` and :meth:`fork` return new rollouts sharing the chunks they keep.

    :func:`rollout` makes one; the constructor takes what it passes.

    Args:
        plan: How every chunk is sampled (the model, the sampling settings, the window and stride).
        actions: The action at every frame of the episode, ``(N, D)`` (``(B, N, D)`` for a batch).
        chunks: The chunks sampled so far, in order, each a :class:`RolloutChunk`.
    """

    def __init__(self, plan: _Plan, actions: torch.Tensor, chunks: Sequence[RolloutChunk]):
        self._plan = plan
        self._actions = actions
        self.chunks: list[RolloutChunk] = list(chunks)
        self._video: np.ndarray | None = None  # assembled when first read

    def __repr__(self) -> str:
        p = self._plan
        return (f"Rollout({self.frame_count} frames, {len(self.chunks)} chunks of {p.window} frames, stride "
                f"{p.stride}, context {p.context}, {p.steps} steps, seed {p.seed}, state {p.state_mode}, "
                f"micro-batch {p.micro_batch})")

    @property
    def video(self) -> np.ndarray:
        """Every frame, uint8 ``[B, F, H, W, 3]`` (``[F, H, W, 3]`` when the start clip was unbatched)."""
        if self._video is None:
            self._video = _assemble(self._plan, self.frame_count, self.chunks)
        return self._video if self._plan.batched else self._video[0]

    def frame(self, index: int) -> np.ndarray:
        """Frame ``index`` of the episode, uint8 ``[B, H, W, 3]`` (``[H, W, 3]`` unbatched): what
        ``video[:, index]`` shows, decoding only that frame where the backbone decodes frames alone (a
        policy's outcome reads the last frame only)."""
        chunk = self.chunks[self.chunk_of(index)]  # checks the index
        index = int(index) % self.frame_count
        if self._video is not None:
            out = self._video[:, index]
        elif index < self._plan.context:
            out = self._plan.start_frames[:, index]
        else:
            out = chunk.decoded.span(index - chunk.start, index - chunk.start + 1)[:, 0]
        return out if self._plan.batched else out[0]

    @property
    def frame_count(self) -> int:
        return int(self._actions.shape[1])

    @property
    def actions(self) -> torch.Tensor:
        """The action at every frame, ``(B, F, D)`` (``(F, D)`` unbatched)."""
        return self._actions if self._plan.batched else self._actions[0]

    @property
    def states(self) -> list[torch.Tensor | None]:
        """The state each chunk was given (``[B, D]``, ``[D]`` unbatched; None when the adapter reads
        none)."""
        return [c.state if c.state is None or self._plan.batched else c.state[0] for c in self.chunks]

    @property
    def context_frames(self) -> int:
        return self._plan.context

    @property
    def model(self) -> ComposedModel:
        return self._plan.model

    @property
    def steps(self) -> int:
        """Sampling steps of every chunk."""
        return self._plan.steps

    @property
    def seed(self) -> int:
        """The rollout's seed (chunk ``k`` samples with ``chunk_seed(seed, k)``)."""
        return self._plan.seed

    @property
    def episodes(self) -> tuple[int, ...]:
        """The episode number of each row (its noise is drawn from ``(seed, episode, chunk)``)."""
        return self._plan.episodes

    @property
    def micro_batch(self) -> int | None:
        """Episodes per network call (``None``: the whole batch in one call)."""
        return self._plan.micro_batch

    @property
    def batch_invariant(self) -> bool:
        """Whether each episode's frames are what it gets in any other batch: its own noise (the backbone's
        sampler takes ``initial_noise``) and a fixed micro-batch."""
        return self._plan.own_noise and self._plan.micro_batch is not None

    @property
    def state_mode(self) -> str:
        """Where chunks after the first get their state: a registered reader's name (``probe``), ``reader``
        (a :class:`~workbench.inspect.recording.state.StateReader` given), ``start``, ``recorded`` or
        ``none``."""
        return self._plan.state_mode

    @property
    def stride(self) -> int:
        return self._plan.stride

    @property
    def window(self) -> int:
        return self._plan.window

    def chunk_of(self, frame: int) -> int:
        """The index of the chunk whose output :attr:`video` shows at ``frame`` (0 for the given start
        frames)."""
        n = self.frame_count
        if isinstance(frame, bool) or not isinstance(frame, (int, np.integer)) or not -n <= frame < n:
            raise InspectError(f"chunk_of({frame!r}): frame must be an int in 0..{n - 1} "
                               f"(this rollout has {n} frames).")
        frame = int(frame) % n
        for chunk in self.chunks:
            if frame in chunk.frames:
                return chunk.index
        return 0

    def head(self, n_chunks: int) -> Rollout:
        """The first ``n_chunks`` chunks (frames up to the last one's window), e.g. to undo chunks."""
        if (isinstance(n_chunks, bool) or not isinstance(n_chunks, (int, np.integer))
                or not 1 <= n_chunks <= len(self.chunks)):
            raise InspectError(f"head({n_chunks!r}): n_chunks must be an int in 1..{len(self.chunks)} "
                               f"(this rollout has {len(self.chunks)} chunks).")
        kept = self.chunks[:n_chunks]
        frames = kept[-1].window.stop
        chunks = [replace(c, frames=f)
                  for c, f in zip(kept, _written(self._plan, frames, len(kept)), strict=True)]
        return Rollout(self._plan, self._actions[:, :frames], chunks)

    def extend(self, actions: Any) -> Rollout:
        """This rollout continued by ``len(actions)`` frames: ``actions`` ``(M, D)`` (``(B, M, D)`` batched),
        the action at each new frame. Equal to a one-shot rollout of all the actions (a last chunk that was
        padded is sampled again with the real actions)."""
        more = _check_actions(self._plan.model, actions, self._plan.batched, self._actions.shape[0],
                              who="extend", minimum=1)
        if more.shape[-1] != self._actions.shape[-1]:
            raise InspectError(f"extend: actions have width {more.shape[-1]}, but this rollout's have "
                               f"{self._actions.shape[-1]}. Give ({'B, ' if self._plan.batched else ''}M, "
                               f"{self._actions.shape[-1]}) actions.")
        total = torch.cat([self._actions, more.to(self._actions.dtype)], dim=1)
        keep = [c for c in self.chunks if c.padded == 0]
        return _continue(self._plan, total, keep)

    def fork(self, chunk: int, at: int, cond: Mapping[str, Any] | None = None, *,
             with_adapter: bool | None = None, gate_override: float | torch.Tensor | None = None,
             storage: StoragePolicy | None = None) -> Rollout:
        """Chunks before ``chunk`` kept, chunk ``chunk`` forked from its recorded step ``at`` (steps before
        ``at`` replayed without model calls, see :meth:`Trajectory.fork`) with ``cond`` (e.g.
        ``{"action": (W, D)}`` for the chunk's window), later chunks sampled again from the fork's frames
        (with the rollout's settings and the edited actions). ``with_adapter`` / ``gate_override`` apply to
        the forked chunk only."""
        n = len(self.chunks)
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or not 0 <= chunk < n:
            raise InspectError(f"fork(chunk={chunk!r}): chunk must be an int in 0..{n - 1} "
                               f"(this rollout has {n} chunks).")
        plan, old = self._plan, self.chunks[chunk]
        actions = self._actions.clone()
        overrides: dict[str, Any] = {}
        for key, value in dict(cond or {}).items():
            value = torch.as_tensor(value)
            if not plan.batched and value.ndim >= 1 and key != "camera":
                value = value[None]
            if key in ("action", "actions"):
                key = "action"
                want = (actions.shape[0], plan.window, actions.shape[2])
                if tuple(value.shape) != want:
                    shape, got = ((want, tuple(value.shape)) if plan.batched
                                  else (want[1:], tuple(value.shape[1:])))
                    raise InspectError(f"fork(cond={{'action': ...}}): chunk {chunk}'s window takes actions "
                                       f"of shape {shape} (one per frame of its window, frames {old.start}.."
                                       f"{old.start + plan.window - 1}), got {got}.")
                real = plan.window - old.padded
                actions[:, old.start:old.start + real] = value[:, :real].to(actions.dtype)
            overrides[key] = value
        traj = old.trajectory.fork(at, cond=overrides or None, with_adapter=with_adapter,
                                   gate_override=gate_override, storage=storage)
        conditions = {**old.conditions, **{k: v.detach().cpu() for k, v in overrides.items()}}
        forked = replace(old, trajectory=traj, conditions=conditions,
                         decoded=ChunkFrames(plan.model.base, traj.final))
        return _continue(plan, actions, [*self.chunks[:chunk], forked])


# -- sampling --------------------------------------------------------------------------------------
def _uint8(base: Any, latents: torch.Tensor) -> np.ndarray:
    from workbench.metrics import to_uint8_video

    with torch.no_grad():
        return to_uint8_video(base.decode(latents))


def _starts(plan: _Plan, frames: int) -> list[int]:
    """The first frame of every chunk an episode of ``frames`` frames needs."""
    count = 1 + max(0, -(-(frames - plan.window) // plan.stride))
    return [k * plan.stride for k in range(count)]


def _written(plan: _Plan, frames: int, count: int) -> list[range]:
    """The frames the video takes from each of ``count`` chunks (a later chunk's frames win an overlap)."""
    starts = [k * plan.stride for k in range(count)]
    out = []
    for k, s in enumerate(starts):
        stop = min(s + plan.window, frames)
        if k + 1 < count:
            stop = min(stop, starts[k + 1] + plan.context)
        out.append(range(s + plan.context, stop))
    return out


def _assemble(plan: _Plan, frames: int, chunks: Sequence[RolloutChunk]) -> np.ndarray:
    b, c, h, w, _ = plan.start_frames.shape
    video = np.zeros((b, frames, h, w, 3), np.uint8)
    video[:, :c] = plan.start_frames
    for chunk in chunks:
        if len(chunk.frames):
            lo, hi = chunk.frames.start - chunk.start, chunk.frames.stop - chunk.start
            video[:, chunk.frames.start:chunk.frames.stop] = chunk.produced[:, lo:hi]
    return video


def _to_float(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[B, T, H, W, 3]`` → float ``(B, 3, T, H, W)`` in [-1, 1], the inverse of
    ``to_uint8_video``."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def _read_state(plan: _Plan, frames: np.ndarray, frame: int, first: bool) -> dict[str, torch.Tensor]:
    """The state conditions a chunk starting at episode ``frame`` is given: the recorded values at frame 0
    (known; ``state="start"`` for every chunk), the recorded values at ``frame`` (``state="recorded"``), or
    the reader's reading of the context ``frames``."""
    if not plan.state_keys:
        return {}
    if (first or plan.reader is None) and all(k in plan.recorded_state for k in plan.state_keys):
        at = frame if plan.state_mode == RECORDED else 0
        return {k: plan.recorded_state[k][:, at].float() for k in plan.state_keys}

    def read(rows: np.ndarray) -> torch.Tensor:
        value = torch.as_tensor(np.asarray(plan.reader(rows)), dtype=torch.float32)
        if value.ndim == 3:
            value = value[:, -1]
        if value.ndim != 2 or value.shape[0] != rows.shape[0]:
            raise InspectError(f"The state reader {plan.reader.name!r} returned shape {tuple(value.shape)} "
                               f"for frames {rows.shape}; it must return [B, D] (or [B, T, D]) "
                               f"with B={rows.shape[0]}.")
        return value

    # (in the rollout's micro-batches: a reader's network rounds a frame as it would in any other batch)
    value = in_micro_batches(read, plan.micro_batch, frames.shape[0], frames)
    return {k: value for k in plan.state_keys}


def _sample_chunk(plan: _Plan, k: int, start: int, actions: torch.Tensor, context: torch.Tensor,
                  context_frames: np.ndarray) -> RolloutChunk:
    """Chunk ``k``: its window from episode frame ``start``, continuing from ``context`` (B, 3, c, H, W)."""
    w, c = plan.window, plan.context
    window = actions[:, start:start + w]
    padded = w - window.shape[1]
    if padded:
        window = torch.cat([window, window[:, -1:].expand(-1, padded, -1)], dim=1)
    video = torch.cat([context, context[:, :, -1:].expand(-1, -1, w - c, -1, -1)], dim=2)
    base = plan.model.base
    request: dict[str, Any] = dict(generation_inputs(base, video))
    request["action"] = window.float()
    state = _read_state(plan, context_frames, start, k == 0)
    for key, value in state.items():
        request[key] = value[:, None].expand(-1, w, -1).contiguous()
    request.update(plan.static)
    conditions = {key: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for key, v in request.items()}
    batch = prepare(plan.model, request)
    seed = chunk_seed(plan.seed, k)
    sampler_kwargs = dict(plan.sampler_kwargs)
    if plan.own_noise:
        sampler_kwargs["initial_noise"] = _episode_noise(plan, k, batch.latents)
    traj = run(plan.model, batch, steps=plan.steps, sampler=plan.sampler, sampler_kwargs=sampler_kwargs,
               generator_state=generator_state(None, seed, batch.latents.device), seed=seed,
               storage=plan.storage, settings=plan.settings, keep=plan.keep, on_step=None,
               label=f"chunk {k} (frames {start}..)")
    return RolloutChunk(index=k, start=start, frames=range(0), trajectory=traj, conditions=conditions,
                        state=next(iter(state.values()), None),
                        decoded=ChunkFrames(plan.model.base, traj.final), padded=padded, seed=seed)


def _episode_noise(plan: _Plan, k: int, latents: torch.Tensor) -> torch.Tensor:
    """Chunk ``k``'s initial noise, ``latents``' shape: each row drawn from its own episode's seed
    (:func:`~workbench.core.seeds.noise_seed`), whatever the other rows are."""
    device, dtype, shape = latents.device, latents.dtype, tuple(latents.shape[1:])
    return torch.stack([
        torch.randn(shape, generator=torch.Generator(device=device).manual_seed(noise_seed(plan.seed, e, k)),
                    device=device, dtype=dtype)
        for e in plan.episodes])


def _continue(plan: _Plan, actions: torch.Tensor, chunks: list[RolloutChunk]) -> Rollout:
    """``chunks`` (the first ones, kept) continued until the ``actions.shape[1]`` frames are covered."""
    frames = actions.shape[1]
    starts = _starts(plan, frames)
    chunks = list(chunks[:len(starts)])
    for k in range(len(chunks), len(starts)):
        s = starts[k]
        if k == 0:
            context, context_frames = plan.start_video, plan.start_frames
        else:
            prev = chunks[-1]
            lo = s - prev.start
            context_frames = prev.decoded.span(lo, lo + plan.context)
            context = _to_float(context_frames)
        chunk = _sample_chunk(plan, k, s, actions, context, context_frames)
        chunks.append(chunk)
    written = _written(plan, frames, len(chunks))
    chunks = [replace(c, frames=f) for c, f in zip(chunks, written, strict=True)]
    return Rollout(plan, actions, chunks)


# -- checks ----------------------------------------------------------------------------------------
def _consumed(model: ComposedModel) -> dict[str, Any]:
    return {key: c for c in getattr(model.adapter, "consumes", ()) for key in (c.name, *c.keys)}


def _check_state_given(consumed: dict[str, Any], per_frame: list[str], state_keys: tuple[str, ...],
                       state: Any) -> None:
    """Refuse a rollout in which the adapter reads a state the start clip records per frame (other than the
    actions) that nothing fills: after chunk 0 it is known only as read off the frames the model produced."""
    filled = {consumed[k] for k in state_keys}
    for key in per_frame:
        condition = consumed.get(key)
        if condition is None or condition in filled or not condition.required:
            continue
        given = "no state reader" if state is None else f"state={state!r}, which fills none of its names"
        raise InspectError(
            f"rollout: the adapter reads {key!r} at each chunk's first frame, which start records per frame; "
            f"after chunk 0 a rollout knows it only as read off the frames the model produced, and got "
            f"{given}. Pass a state reader that fills {key!r}: a registered one by name "
            f"(registered: {listing(registered('state_reader'))}), or StateReader(fn, keys=({key!r},)); "
            f"or state='start' (the value recorded at frame 0, held for every chunk), "
            f"or state='recorded' (the recorded value: a ceiling, for measurements).")


def _check_actions(model: ComposedModel, actions: Any, batched: bool, batch: int, *, who: str,
                   minimum: int) -> torch.Tensor:
    if not isinstance(actions, (torch.Tensor, np.ndarray)):
        raise InspectError(f"{who}: actions must be a tensor of shape "
                           f"{'(B, N, D)' if batched else '(N, D)'}, got {type(actions).__name__}.")
    a = torch.as_tensor(actions)
    want = 3 if batched else 2
    if a.ndim != want or not a.is_floating_point():
        shape = "(B, N, D) for a batch of start clips" if batched else "(N, D) for one start clip"
        raise InspectError(f"{who}: actions must be a float tensor {shape} (the action at every frame), got "
                           f"{tuple(a.shape)} {a.dtype}.")
    if not batched:
        a = a[None]
    if a.shape[0] != batch:
        raise InspectError(f"{who}: actions have batch size {a.shape[0]}, but there are {batch} start clips; "
                           f"give one action sequence per start clip ((B, N, D) with B={batch}).")
    if a.shape[1] < minimum:
        raise InspectError(f"{who}: too few actions: got {a.shape[1]} frames of actions, "
                           f"at least {minimum} are needed (the action at every frame to predict, "
                           f"one per frame: {minimum} gives the given start frame(s) and one new frame).")
    consumer = _consumed(model).get("action")
    dim = getattr(consumer, "dim", None)
    if dim is not None and a.shape[-1] != dim:
        raise InspectError(f"{who}: actions have width {a.shape[-1]}, but the adapter reads {dim}-D actions "
                           f"(its 'action' condition). Give ({'B, ' if batched else ''}N, {dim}) actions.")
    return a.detach().cpu().float()


def _check_episodes(episodes: Any, b: int, batched: bool) -> tuple[int, ...]:
    if episodes is None:
        return tuple(range(b))
    what = f"{b} start clip{'s' if b != 1 else ''}" if batched else "one (unbatched) start clip"
    if isinstance(episodes, (np.ndarray, torch.Tensor)):
        episodes = episodes.tolist()
    values = None if isinstance(episodes, str) or not isinstance(episodes, Sequence) else list(episodes)
    if (values is None or len(values) != b
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 for v in values)):
        got = repr(episodes) if values is None or len(values) <= 8 else f"{len(values)} values"
        raise InspectError(f"rollout: episodes={got}; give one episode number (an int >= 0) per "
                           f"start clip: {b} for {what}, e.g. episodes=range({b}) (the default), or each "
                           f"episode's index in the whole set you roll out, so it draws the same noise in "
                           f"any batch.")
    return tuple(int(v) for v in values)


def _start(base, start: Mapping[str, Any], context: int) -> tuple[torch.Tensor, bool]:
    if not isinstance(start, Mapping) or "video" not in start:
        got = sorted(start) if isinstance(start, Mapping) else type(start).__name__
        raise InspectError(f"rollout: start must be a clip dict with 'video' (3, T, H, W) in [-1, 1] "
                           f"(or a batch (B, 3, T, H, W)), as the clip sources give it; got {got}.")
    video = torch.as_tensor(start["video"])
    if video.ndim not in (4, 5) or video.shape[-4] != 3 or not video.is_floating_point():
        raise InspectError(f"rollout: start['video'] must be float (3, T, H, W) or (B, 3, T, H, W) "
                           f"in [-1, 1], got {tuple(video.shape)} {video.dtype}.")
    batched = video.ndim == 5
    video = video if batched else video[None]
    if video.shape[2] < context:
        raise InspectError(f"rollout: {type(base).__name__} continues from {context} frames "
                           f"(card.context_frames), but start['video'] has {video.shape[2]}.")
    return video[:, :, :context].detach().cpu().float(), batched


def rollout(model: ComposedModel, start: Mapping[str, Any], actions: Any, *, steps: int | None = None,
            seed: int = 0, state: str | StateReader | None = None, gate_scale: float | None = None,
            stride: int | None = None, store: StoragePolicy | bool | None = None, with_adapter: bool = True,
            episodes: Sequence[int] | None = None, micro_batch: int | None = DEFAULT_MICRO_BATCH,
            **sampler_kwargs: Any) -> Rollout:
    """Predict frames ``0 .. N-1`` of an episode chunk by chunk (see the module docstring).

    Args:
        model: the :class:`ComposedModel` to roll out (an experiment's is ``exp.model``).
        start: a clip ``{"video": (3, T, H, W), "camera": ..., "ee_pos": (T, 3), "task": ...}`` (or a batch
            of them, with a leading ``B``): its first ``card.context_frames`` frames, its per-clip conditions
            (``camera``; text for a text mode) and its state at frame 0 are used. Recorded state of later
            frames is read only with ``state="recorded"``.
        actions: ``(N, D)`` (``(B, N, D)``): the action at every frame of the episode.
        steps: sampling steps (default: the card's).
        seed: chunk ``k`` samples with ``chunk_seed(seed, k)``.
        state: where a state the adapter reads at a chunk's first frame comes from: None (default: no state),
            the name of a registered state reader (``"probe"``: the world-model wing's hand probe), a
            :class:`~workbench.inspect.recording.state.StateReader`, ``"start"`` (the start clip's recorded
            value at frame 0, for every chunk: known when the episode starts) or ``"recorded"`` (the start
            clip's recorded value at each chunk's first frame: a ceiling). A reader fills the conditions of
            its ``keys`` that the adapter reads; an adapter that reads a state the start clip records per
            frame, which nothing fills, is refused.
        gate_scale: sample with the adapter's learned gate times this.
        stride: frames between chunk starts, ``1 .. W - context_frames`` (default ``W - context_frames``).
        store: a :class:`StoragePolicy` for each chunk's trajectory; ``False`` keeps only the final latents
            (no stepping or forks, much less memory); the frames are the same either way.
        with_adapter: ``True`` (default: base + adapter) or ``False`` (the frozen base alone).
        episodes: the episode number of each start clip (ints >= 0, one per clip; default ``0 .. B-1``):
            episode ``e`` draws chunk ``k``'s noise from ``noise_seed(seed, e, k)``, so it gets the same
            frames in any batch that gives it the same number (its index in the whole set). Rows that share
            a number share their noise: one start state under several action sequences, on the same draws.
        micro_batch: episodes per call of the base, the adapter and the state reader (default
            :data:`~workbench.core.rows.DEFAULT_MICRO_BATCH`; the frames do not depend on the batch), or
            ``None`` (one call over the whole batch: the frames then depend on the batch size in their last
            bits).
        **sampler_kwargs: passed to the backbone's ``generate`` for every chunk (e.g. ``guidance_scale``).

    Returns:
        The :class:`Rollout`: its frames (``video``) and one :class:`RolloutChunk` per chunk.

    Raises:
        InspectError: When ``start``, ``actions``, ``stride`` or ``seed`` is not what is allowed (the
            message says what was received and what fits), the backbone's mode takes no frame a chunk
            could continue from, or the adapter reads a state nothing fills.

    Examples:
        >>> clip = val[10]                                             # a 16-frame clip of a held-out episode
        >>> actions = torch.cat([clip["action"], clip["action"][1:]])  # 31 frames of actions: two chunks
        >>> ro = rollout(model, clip, actions, steps=4, state="probe")  # chunk 1's hand: the probe's reading
        >>> ro.video.shape, [list(c.frames)[:2] for c in ro.chunks]
        ((31, 64, 64, 3), [[1, 2], [16, 17]])
        >>> ro.chunks[1].conditions["image"].shape                    # chunk 0's last frame, as it was
        ...                                                           # produced
        torch.Size([1, 3, 64, 64])
    """
    model = check_model(model, "rollout")
    base = model.base
    card = base.card
    context = int(getattr(card, "context_frames", 1))
    name = getattr(card, "model_id", type(base).__name__)
    if context == 0:
        raise InspectError(
            f"{name!r} (mode {card.serving!r}) cannot be rolled out: its card says context_frames=0, "
            f"it generates from no frame that a chunk could continue from "
            f"(an interpolation mode also needs a future frame, which a rollout does not know). "
            f"Use an image-to-video mode of the backbone.")
    clip = base.clip()
    w = clip.frames
    probe_video = torch.zeros(1, 3, w, clip.height, clip.width)
    if card.serving not in IMAGE_MODES and "image" not in generation_inputs(base, probe_video):
        raise InspectError(
            f"{name!r} serves {card.serving!r}, which generates from no image: "
            f"a rollout chains chunks through the last frame a chunk produced, "
            f"so it needs an image-to-video mode ({', '.join(IMAGE_MODES)}).")
    given, batched = _start(base, start, context)
    b = given.shape[0]
    limit = max_generate_batch(base)
    if limit is not None and b > limit:
        raise InspectError(f"rollout: {b} start clips, but {type(base).__name__} generates at most {limit} "
                           f"at a time (max_generate_batch). Roll out at most {limit} episodes per call.")
    a = _check_actions(model, actions, batched, b, who="rollout", minimum=context + 1)
    stride = w - context if stride is None else stride
    if (isinstance(stride, bool) or not isinstance(stride, (int, np.integer))
            or not 1 <= stride <= w - context):
        raise InspectError(f"rollout: stride={stride!r}; chunks of {w} frames continuing from "
                           f"{context} frame(s) need a stride in 1..{w - context} "
                           f"(frames between chunk starts; {w - context} leaves no overlap).")
    steps, sampler = card.resolve_steps(steps)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InspectError(f"rollout: seed must be an int >= 0, got {seed!r}.")
    check_with_adapter(with_adapter, who="rollout: ")
    micro_batch = check_micro_batch(micro_batch, "rollout", InspectError)
    episodes = _check_episodes(episodes, b, batched)
    if "initial_noise" in sampler_kwargs:
        raise InspectError("rollout: initial_noise is not a sampler option here: a rollout draws each "
                           "episode's noise from (seed, episode, chunk). Choose the noise with seed= and "
                           "episodes=.")
    own_noise = takes_initial_noise(base)
    if not own_noise:
        # (a pipeline that draws its own noise also makes the base's call itself, on the whole batch)
        micro_batch = None
    gate = None if gate_scale is None or not with_adapter else scaled_gate(model.composer, gate_scale)
    settings = Settings(with_adapter=with_adapter, gate_override=gate, micro_batch=micro_batch)
    if store is False:
        storage, keep = StoragePolicy(), False
    elif store is None or store is True:
        storage, keep = StoragePolicy(), True
    elif isinstance(store, StoragePolicy):
        storage, keep = store, True
    else:
        raise InspectError(f"rollout: store={store!r}; pass a StoragePolicy, True (record everything) "
                           f"or False (keep only each chunk's final latents).")
    reader, state_mode = resolve_state(state, "rollout")
    consumed = _consumed(model) if with_adapter else {}
    per_frame = [key for key, value in start.items() if key not in ("video", "action", "actions")
                 and isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == (3 if batched else 2)]
    if reader is not None:
        state_keys = tuple(k for k in reader.keys if k in consumed)
    elif state_mode in (START, RECORDED):
        state_keys = tuple(k for k in per_frame if k in consumed)
    else:
        state_keys = ()
    _check_state_given(consumed, per_frame, state_keys, state)
    recorded = {}
    for key in state_keys:
        if key in start:
            value = torch.as_tensor(start[key]).detach().cpu()
            recorded[key] = value if batched else value[None]
    if state_mode == RECORDED:
        short = [k for k in state_keys if recorded[k].shape[1] < a.shape[1]]
        if short:
            raise InspectError(
                f"state='recorded' reads the recorded {short[0]!r} at every chunk's first frame, "
                f"so start must carry it for all {a.shape[1]} frames; "
                f"it carries {recorded[short[0]].shape[1]}. "
                f"Pass the whole episode as start, or a state reader.")
    reads_text = card.serving in TEXT_MODES
    static: dict[str, Any] = {}
    for key, value in start.items():
        if key == "video" or key in per_frame or key in ("action", "actions"):
            continue
        if isinstance(value, str) and reads_text:
            static[key] = [value]
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], str) and reads_text:
            static[key] = list(value)
        elif (isinstance(value, torch.Tensor) and value.is_floating_point()
                and value.ndim == (2 if batched else 1)):
            static[key] = value if batched else value[None]  # a per-clip vector (camera): known at frame 0
    from workbench.metrics import to_uint8_video

    plan = _Plan(model=model, settings=settings, steps=steps, sampler=sampler, seed=int(seed), window=w,
                 context=context, stride=int(stride), storage=storage, keep=keep, reader=reader,
                 state_mode=state_mode,
                 state_keys=state_keys, recorded_state=recorded, static=static, start_video=given,
                 start_frames=to_uint8_video(given), batched=batched, episodes=episodes,
                 micro_batch=micro_batch, own_noise=own_noise,
                 sampler_kwargs=dict(sampler_kwargs))
    return _continue(plan, a, [])


__all__ = ["Rollout", "RolloutChunk", "rollout"]
