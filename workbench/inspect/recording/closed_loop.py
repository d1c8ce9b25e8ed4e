"""Closed-loop evaluation: a policy acting on the frames a world model produces, chunk by chunk.

    def policy(obs):                                   # obs: an Observation
        return np.zeros((len(obs.frames), 4))          # the actions at the frames obs.frames
    run = closed_loop(model, clip, policy, chunks=3, steps=4, state="probe")
    run.rollout.video                                  # the imagined episode, as a rollout shows it
    run.actions                                        # (N, D): the action the policy chose at every frame
    run.observations[1].frame                          # what it saw before chunk 1

A **policy** is any callable from an :class:`Observation` to the actions of the next chunk (the
:class:`Policy` protocol). :func:`closed_loop` alternates it with :func:`~workbench.inspect.rollout`: before
each chunk it shows the policy the last frame the model produced, the state that the state readers
(:mod:`~workbench.inspect.recording.state`) read off it and the episode's goal, then samples the chunk
with the actions it returned and shows it the chunk's last frame, until the episode is long enough.

**Which actions a policy returns.** A rollout's chunks share their boundary frame: chunk ``k + 1`` starts
at the frame chunk ``k`` ended on (:attr:`~workbench.inspect.Rollout.stride` frames later) and, like every
chunk, is given the action at each frame of its window, its first frame's included. So chunk 0 asks for the
actions at every frame of its window (``0 .. W-1``, the start frame's included), and each later chunk for
the actions at the frames it adds (``t + 1 .. t + stride`` for the frame ``t`` the policy sees); the action
at the frame it sees was chosen before, with the previous chunk. :func:`chunk_schedule` gives the frames
seen and asked for; :attr:`Observation.frames` says it to the policy. Every chunk is thus sampled with
exactly the actions the episode took, and a closed loop is the open-loop rollout of the actions it chose, bit
for bit: ``rollout(model, start, run.actions, ...)`` (same steps, seed and state) gives the same frames.

A policy that raises, returns another shape or returns a non-finite action is stopped with a
:class:`~workbench.errors.PolicyError` naming it (its name and where it was defined), the chunk, what it
returned and what is allowed; the chunks done before are kept in the error's ``result``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from workbench.core.composed import ComposedModel
from workbench.core.rows import DEFAULT_MICRO_BATCH, in_micro_batches
from workbench.errors import PolicyError, did_you_mean, listing
from workbench.inspect.common import InspectError, check_model
from workbench.inspect.recording.rollouts import Rollout, _consumed, _start, rollout
from workbench.inspect.recording.settings import check_with_adapter
from workbench.inspect.recording.state import RECORDED, StateReader, resolve_state


@dataclass(frozen=True, eq=False)
class Observation:
    """What a policy sees before a chunk: the last frame the model produced and what was read off it.

    ``frame``: uint8 ``[B, H, W, 3]`` (``[H, W, 3]`` for one episode): the last frame produced so far (the
    start frame before chunk 0); :attr:`image` is the same frame as a float tensor. ``state``: each state
    reader's reading of it, by the condition names the reader fills (``{"ee_pos": [B, 3]}`` for the hand
    probe; ``[D]`` rows for one episode). ``goal``: what the episode's start gave as its goal
    (``start["goal"]``, any object, passed on as given; None when it gave none). ``chunk``: the index of the
    chunk about to be sampled. ``frame_index``: the episode frame ``frame`` is. ``frames``: the episode frames
    whose actions the policy returns (see the module docstring). ``action_dim``: the width of an action the
    model reads (None when its adapter does not say). ``batched``: whether the observation holds a batch of
    episodes (the start was a batch): then the policy returns ``(B, len(frames), D)``, else
    ``(len(frames), D)``.
    """

    frame: np.ndarray
    state: Mapping[str, np.ndarray]
    goal: Any
    chunk: int
    frame_index: int
    frames: range
    action_dim: int | None
    batched: bool

    @property
    def episodes(self) -> int:
        """How many episodes the observation holds (1 for one episode)."""
        return int(self.frame.shape[0]) if self.batched else 1

    @property
    def image(self) -> torch.Tensor:
        """:attr:`frame` as float ``(B, 3, H, W)`` (``(3, H, W)``) in [-1, 1], as the model reads frames."""
        x = torch.from_numpy(np.ascontiguousarray(self.frame)).float().div(127.5).sub(1.0)
        return x.movedim(-1, -3)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """The shape of the actions to return: ``(B, n, D)`` (``(n, D)``); ``D`` is -1 when not known."""
        d = -1 if self.action_dim is None else self.action_dim
        return (self.episodes, len(self.frames), d) if self.batched else (len(self.frames), d)

    def rows(self) -> list[Observation]:
        """One observation per episode (unbatched), e.g. for a policy written for one episode:
        ``np.stack([mine(o) for o in obs.rows()])``."""
        if not self.batched:
            return [self]
        b = self.episodes
        return [replace(self, frame=self.frame[i], state={k: v[i] for k, v in self.state.items()},
                        goal=_row(self.goal, i, b), batched=False) for i in range(b)]


def _row(value: Any, i: int, b: int) -> Any:
    """Row ``i`` of a per-episode value (an array or sequence of length ``b``, or a mapping of them)."""
    if isinstance(value, Mapping):
        return {k: _row(v, i, b) for k, v in value.items()}
    if isinstance(value, (np.ndarray, torch.Tensor, list, tuple)) and len(value) == b:
        return value[i]
    return value


@runtime_checkable
class Policy(Protocol):
    """What :func:`closed_loop` calls: ``policy(observation) -> actions``.

    Any callable fits: a function, a class with ``__call__``, a ``functools.partial``. It is given an
    :class:`Observation` and returns the actions at the frames ``observation.frames``, one row per frame:
    ``(n, D)`` for one episode, ``(B, n, D)`` for a batch (a numpy array, a tensor or nested lists of
    finite numbers). A policy may keep state between calls; :func:`closed_loop` calls it once per chunk, in
    order. A ``name`` attribute (a string), where it has one, is the name errors and reports give it.
    """

    def __call__(self, observation: Observation) -> Any: ...


@dataclass(frozen=True, eq=False)
class ClosedLoop:
    """The result of :func:`closed_loop`: the ``rollout`` (its chunks, frames and the actions at every
    frame), the ``observations`` the policy was given (one per chunk) and the ``policy``'s description."""

    rollout: Rollout
    observations: list[Observation]
    policy: str

    @property
    def actions(self) -> torch.Tensor:
        """The action the policy chose at every frame, ``(B, N, D)`` (``(N, D)`` for one episode)."""
        return self.rollout.actions

    def __repr__(self) -> str:
        return f"ClosedLoop({self.policy}, {len(self.rollout.chunks)} chunks: {self.rollout!r})"


# -- naming and loading policies -------------------------------------------------------------------
def describe_policy(policy: Any) -> str:
    """How errors and reports name a policy: its name, its qualified name and where it was defined, e.g.
    ``'reach_it' (my_policies.reach_it, my_policies.py:12)``."""
    target = policy
    while isinstance(target, functools.partial):
        target = target.func
    own = getattr(policy, "name", None)
    code = target if inspect.isfunction(target) or inspect.ismethod(target) else type(target)
    module = getattr(code, "__module__", None) or "?"
    qual = f"{module}.{getattr(code, '__qualname__', type(target).__name__)}"
    name = own if isinstance(own, str) and own else getattr(target, "__name__", None) or type(target).__name__
    try:
        where = inspect.getsourcefile(code)
        line = inspect.getsourcelines(code)[1] if where else None
    except (TypeError, OSError):  # built in, or defined where no source is kept (a console)
        where, line = None, None
    place = f", {where}:{line}" if where else ""
    return f"{name!r} ({qual}{place})"


def _module_of_file(path: Path) -> Any:
    """The module already loaded from the file ``path`` (imported by its own name, or by an earlier
    :func:`load_policy`), else None: a file is run once, under one name."""
    real = path.resolve()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and Path(file).name == real.name and Path(file).resolve() == real:
            return module
    return None


def _own_name(path: Path) -> str | None:
    """The dotted name ``path`` is imported by from ``sys.path`` (an entry holds it, through regular packages
    only), when importing that name finds this very file; else None."""
    real = path.resolve()
    for entry in sys.path:
        root = Path(entry or ".").resolve()
        if not real.is_relative_to(root):
            continue
        parts = real.relative_to(root).with_suffix("").parts
        folders = [root.joinpath(*parts[:i]) for i in range(1, len(parts))]
        packages = all((folder / "__init__.py").is_file() for folder in folders)
        if not packages or not all(p.isidentifier() for p in parts):
            continue
        name = ".".join(parts)
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if found is not None and found.origin and Path(found.origin).resolve() == real:
            return name
    return None


def _run_as_module(spec: str, path: Path) -> Any:
    """Run the file ``path`` as the module ``workbench_policy_<stem>`` (``_2``, ``_3``, ... after the stem
    when another file of that stem holds the name), registered in ``sys.modules`` so that a dataclass or a
    pickled object of the file finds its module."""
    name = base = f"workbench_policy_{path.stem}"
    count = 1
    while name in sys.modules:
        count += 1
        name = f"{base}_{count}"
    loader = importlib.util.spec_from_file_location(name, path)
    if loader is None or loader.loader is None:
        raise PolicyError(f"policy {spec!r}: {str(path)!r} cannot be loaded as Python; give a .py file.")
    module = sys.modules[name] = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_file(spec: str, path: Path) -> Any:
    """The module of the file ``path``: imported by its own name when ``sys.path`` reaches it (one import path
    per module: a later ``import`` of that name is the same module), else run under a name of its own
    (:func:`_run_as_module`)."""
    own = _own_name(path)
    try:
        return importlib.import_module(own) if own is not None else _run_as_module(spec, path)
    except PolicyError:
        raise
    except Exception as err:
        raise PolicyError(f"policy {spec!r}: running {str(path)!r} raised {type(err).__name__}: {err}. "
                          f"Fix the file and run again.") from err


def load_policy(spec: str) -> Callable[[Observation], Any]:
    """The policy ``spec`` names: ``"package.module:name"`` (imported, so on ``sys.path``) or
    ``"path/to/file.py:name"`` (loaded from the file). ``name`` may be dotted (``Class.method``,
    ``POLICIES.expert``); it must name a callable.

    Examples:
        >>> load_policy("numpy:zeros_like").__name__
        'zeros_like'
    """
    if not isinstance(spec, str) or ":" not in spec.strip(":") or spec.endswith(":"):
        raise PolicyError(f"policy {spec!r}: give MODULE:NAME (a module on the path, e.g. "
                          f"my_policies:reach_it) or FILE.py:NAME (e.g. policies/reach.py:reach_it), "
                          f"the callable after the colon.")
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise PolicyError(f"policy {spec!r}: no file {str(path)!r} (from {Path.cwd()}). "
                              f"Give the path of a .py file that defines {attr!r}.")
        module = _module_of_file(path) or _load_file(spec, path)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            if err.name != where and not where.startswith(f"{err.name}."):
                raise PolicyError(f"policy {spec!r}: importing {where!r} needs {err.name!r}, which is not "
                                  f"installed.") from err
            raise PolicyError(f"policy {spec!r}: no module {where!r} on the path (from {Path.cwd()}). "
                              f"Run from the folder that holds it, add that folder to PYTHONPATH, or give "
                              f"the file: {where.replace('.', '/')}.py:{attr}.") from err
        except Exception as err:
            raise PolicyError(f"policy {spec!r}: importing {where!r} raised "
                              f"{type(err).__name__}: {err}.") from err
    target: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(target, part):
            owner = ".".join([module.__name__, *attr.split(".")[:i]])
            names = sorted(n for n in dir(target) if not n.startswith("_") and callable(getattr(target, n)))
            raise PolicyError(f"policy {spec!r}: {owner} has no {part!r}. Its callables: {listing(names)}."
                              f"{did_you_mean(part, names)}")
        target = getattr(target, part)
    if not callable(target):
        raise PolicyError(f"policy {spec!r} names a {type(target).__name__}, which is not callable; a policy "
                          f"is a function (or an object with __call__) of an Observation.")
    return target


# -- asking a policy -------------------------------------------------------------------------------
def chunk_schedule(window: int, context: int, frames: int) -> list[tuple[int, range]]:
    """When a policy acts in an episode of ``frames`` frames chunked as a rollout chunks it (``window``
    frames per chunk, continuing from ``context``): per chunk, the frame the policy sees and the frames
    whose actions it returns. Chunk 0 sees the last start frame and returns its whole window; each later
    chunk sees the last frame produced so far and returns the ``window - context`` frames after it (fewer
    at the episode's end).

    Examples:
        >>> chunk_schedule(16, 1, 40)
        [(0, range(0, 16)), (15, range(16, 31)), (30, range(31, 40))]
    """
    stride = window - context
    if context < 1 or stride < 1 or frames < context + 1:
        raise InspectError(f"chunk_schedule(window={window}, context={context}, frames={frames}): needs "
                           f"1 <= context < window and frames >= context + 1.")
    out = [(context - 1, range(0, min(window, frames)))]
    done = out[0][1].stop
    while done < frames:
        out.append((done - 1, range(done, min(done + stride, frames))))
        done = out[-1][1].stop
    return out


def act(policy: Callable[[Observation], Any], observation: Observation, *,
        name: str | None = None) -> np.ndarray:
    """``policy(observation)``, checked: float32 ``(B, n, D)`` (``(n, D)`` for one episode), finite, one row
    per frame of ``observation.frames``. A policy that raises or returns anything else is stopped with a
    :class:`~workbench.errors.PolicyError` that names it (``name``, default :func:`describe_policy`'s).

    Examples:
        >>> obs = Observation(frame=np.zeros((8, 8, 3), np.uint8), state={}, goal=None, chunk=0,
        ...                   frame_index=0, frames=range(0, 3), action_dim=2, batched=False)
        >>> act(lambda o: np.ones((3, 2)), obs).dtype
        dtype('float32')
    """
    name = name or describe_policy(policy)
    o = observation
    span = (f"frame {o.frames.start}" if len(o.frames) == 1
            else f"frames {o.frames.start}..{o.frames.stop - 1}")
    at = (f"at chunk {o.chunk} (it saw frame {o.frame_index} and was asked for the actions at {span})")
    want = _shape_text(o)
    try:
        out = policy(o)
    except Exception as err:
        raise PolicyError(f"The policy {name} raised {type(err).__name__}: {err} {at}. Fix the policy and "
                          f"run again.", observation=o) from err
    got = _described(out)
    if isinstance(out, torch.Tensor):
        out = out.detach().cpu().numpy()
    try:
        array = np.asarray(out)
    except (ValueError, TypeError):  # ragged nested lists
        array = np.asarray(None)
    if array.dtype.kind not in "fiu" or array.ndim != len(o.action_shape) or any(
            w not in (-1, g) for w, g in zip(o.action_shape, array.shape, strict=True)):
        raise PolicyError(f"The policy {name} returned {got} {at}; it must return {want}.", observation=o)
    array = array.astype(np.float32)
    bad = ~np.isfinite(array)
    if bad.any():
        where = np.argwhere(bad.any(axis=-1))[:3]
        rows = [(f"episode {int(w[0])}, frame {o.frames[int(w[1])]}" if o.batched
                 else f"frame {o.frames[int(w[0])]}") for w in where]
        raise PolicyError(f"The policy {name} returned {int(bad.sum())} non-finite value(s) (NaN or inf) "
                          f"{at}: {'; '.join(rows)}{' ...' if bad.any(axis=-1).sum() > 3 else ''}. "
                          f"Actions must be finite numbers: {want}.", observation=o)
    return array


def _shape_text(o: Observation) -> str:
    d = "D" if o.action_dim is None else str(o.action_dim)
    n = len(o.frames)
    if o.batched:
        return (f"an array of shape ({o.episodes}, {n}, {d}): for each of the {o.episodes} episodes of the "
                f"observation, one row of {d} finite numbers per frame asked for")
    return f"an array of shape ({n}, {d}): one row of {d} finite numbers per frame asked for"


def _described(value: Any) -> str:
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return f"a {type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        try:
            shape = np.asarray(value).shape
        except (ValueError, TypeError):
            return f"a ragged {type(value).__name__} of length {len(value)}"
        return f"a {type(value).__name__} of shape {shape}"
    return f"{type(value).__name__} {value!r}"[:120]


def _readers(observe: Any, state: Any) -> list[StateReader]:
    if observe is None:
        reader, _ = resolve_state(state, "closed_loop")
        return [reader] if reader is not None else []
    items = [observe] if isinstance(observe, (str, StateReader)) else list(observe)
    readers = []
    for item in items:
        if item == RECORDED:
            raise InspectError("closed_loop: observe='recorded' is not a reading: a policy sees what readers "
                               "read off the frames the model produced. Pass a registered reader's name or a "
                               "StateReader.")
        reader, _ = resolve_state(item, "closed_loop(observe=...)")
        readers.append(reader)
    keys = [k for r in readers for k in r.keys]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise InspectError(f"closed_loop: observe= gives {listing(twice)} from two readers; "
                           f"each state name must come from one reader.")
    return readers


def _reading(reader: StateReader, frames: np.ndarray, micro_batch: int | None) -> np.ndarray:
    def read(rows: np.ndarray) -> np.ndarray:
        value = np.asarray(reader(rows), dtype=np.float64)
        if value.ndim == 3:
            value = value[:, -1]
        if value.ndim != 2 or value.shape[0] != rows.shape[0]:
            raise InspectError(f"The state reader {reader.name!r} returned shape {value.shape} for frames "
                               f"{rows.shape}; it must return [B, D] (or [B, T, D]) with B={rows.shape[0]}.")
        return value

    # in the rollout's micro-batches, so a policy sees the same reading of an episode in any batch
    return in_micro_batches(read, micro_batch, frames.shape[0], frames)


def closed_loop(model: ComposedModel, start: Mapping[str, Any], policy: Callable[[Observation], Any], *,
                frames: int | None = None, chunks: int | None = None, steps: int | None = None, seed: int = 0,
                state: str | StateReader | None = None, observe: Any = None, gate_scale: float | None = None,
                store: Any = None, with_adapter: bool = True, episodes: Sequence[int] | None = None,
                micro_batch: int | None = DEFAULT_MICRO_BATCH, **sampler_kwargs: Any) -> ClosedLoop:
    """Run ``policy`` in the world model ``model``, closed loop: each chunk's actions chosen by the policy
    from the last frame the model produced (see the module docstring).

    Args:
        model: the :class:`~workbench.core.composed.ComposedModel` (an experiment's is ``exp.model``).
        start: a start clip as :func:`~workbench.inspect.rollout` takes it (or a batch); its ``"goal"``
            (any object) is the policy's alone and goes to :attr:`Observation.goal`, never to the model.
        policy: a callable of an :class:`Observation` (:class:`Policy`).
        frames: the episode's length in frames (give it or ``chunks``, one of the two).
        chunks: the episode's length in chunks.
        steps: sampling steps per chunk, as :func:`~workbench.inspect.rollout` takes them.
        seed: the rollout's seed, as :func:`~workbench.inspect.rollout` takes it.
        state: what the adapter reads at a chunk's first frame, as :func:`~workbench.inspect.rollout` takes
            it.
        gate_scale: as :func:`~workbench.inspect.rollout` takes it.
        store: as :func:`~workbench.inspect.rollout` takes it.
        with_adapter: ``True`` (base + adapter) or ``False`` (the frozen base alone).
        episodes: the episode number of each start clip, as :func:`~workbench.inspect.rollout` takes it
            (default ``0 .. B-1``): give each its index in the whole set for the same frames in any batch.
        micro_batch: episodes per network and state-reader call, as :func:`~workbench.inspect.rollout` takes
            it.
        sampler_kwargs: passed to every chunk's sampler, as :func:`~workbench.inspect.rollout` passes them.
        observe: the state readers whose readings the policy sees (:attr:`Observation.state`): a registered
            reader's name, a :class:`~workbench.inspect.StateReader`, or a sequence of them. Default: the
            reader of ``state`` (none when ``state`` is None).

    Returns:
        A :class:`ClosedLoop`: the rollout, the observations, the actions the policy chose.

    Examples:
        >>> def go_right(obs):                       # the hand's x at +1, whatever it sees
        ...     return np.tile([1.0, 0.0, 0.0, 0.0], (len(obs.frames), 1))
        >>> run = closed_loop(model, val[10], go_right, chunks=2, steps=2, state="probe")
        >>> run.actions.shape, [o.frame_index for o in run.observations], sorted(run.observations[1].state)
        (torch.Size([31, 4]), [0, 15], ['ee_pos'])
    """
    model = check_model(model, "closed_loop")
    if not callable(policy):
        raise InspectError(f"closed_loop: policy must be a callable of an Observation, got "
                           f"{type(policy).__name__}. Pass a function, or load one with "
                           f"load_policy('module:name').")
    check_with_adapter(with_adapter, who="closed_loop: ")
    name = describe_policy(policy)
    base = model.base
    window = int(base.clip().frames)
    context = int(getattr(base.card, "context_frames", 1))
    if (frames is None) == (chunks is None):
        raise InspectError(f"closed_loop: give the episode's length as frames= or as chunks=, one of the two "
                           f"(got frames={frames!r}, chunks={chunks!r}).")
    if chunks is not None:
        if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1:
            raise InspectError(f"closed_loop: chunks must be an int >= 1, got {chunks!r}.")
        frames = window + (int(chunks) - 1) * (window - context)
    if isinstance(frames, bool) or not isinstance(frames, (int, np.integer)) or frames < context + 1:
        raise InspectError(f"closed_loop: frames must be an int >= {context + 1} (the start frame(s) and "
                           f"one new frame), got {frames!r}.")
    readers = _readers(observe, state)
    start = dict(start) if isinstance(start, Mapping) else start
    goal = start.pop("goal", None) if isinstance(start, dict) else None
    given, batched = _start(base, start, context)
    from workbench.metrics import to_uint8_video

    start_frames = to_uint8_video(given)  # (B, c, H, W, 3): what chunk 0 continues from
    consumer = _consumed(model).get("action") if with_adapter is True else None
    action_dim = getattr(consumer, "dim", None)
    run: Rollout | None = None
    observations: list[Observation] = []
    for k, (seen, asked) in enumerate(chunk_schedule(window, context, int(frames))):
        if run is None:
            context_frames = start_frames
        else:  # read as the next chunk will read them (decoded once, then cached): (B, c, H, W, 3)
            last = run.chunks[-1]
            lo = seen - context + 1 - last.start
            context_frames = last.decoded.span(lo, lo + context)
        reading = {key: _reading(r, context_frames, micro_batch) for r in readers for key in r.keys}
        obs = Observation(frame=context_frames[:, -1] if batched else context_frames[0, -1],
                          state=reading if batched else {k_: v[0] for k_, v in reading.items()},
                          goal=goal, chunk=k, frame_index=seen, frames=asked, action_dim=action_dim,
                          batched=batched)
        try:
            chosen = torch.from_numpy(act(policy, obs, name=name))
        except PolicyError as err:
            err.result = None if run is None else ClosedLoop(run, observations, name)
            raise
        action_dim = int(chosen.shape[-1])  # every later chunk takes actions of the first one's width
        observations.append(obs)
        if run is None:
            run = rollout(model, start, chosen, steps=steps, seed=seed, state=state, gate_scale=gate_scale,
                          store=store, with_adapter=with_adapter, episodes=episodes, micro_batch=micro_batch,
                          **sampler_kwargs)
        else:
            run = run.extend(chosen)
    return ClosedLoop(run, observations, name)


__all__ = ["ClosedLoop", "Observation", "Policy", "act", "chunk_schedule", "closed_loop", "describe_policy",
           "load_policy"]
