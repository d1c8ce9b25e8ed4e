"""The simulator twin of a closed loop: a policy acting in Meta-World under the decision rule of a closed loop
in a world model (:mod:`~workbench.worldmodel.closed_loop_eval` ranks the world model's outcomes against it).

At each chunk boundary the policy sees the frame the simulator rendered there, rendered as the training data
were (camera, size), the probes' readings of it and the start state's goal: what it would see in imagination,
but for the world model. The environments are built once per process and closed at exit (:func:`close_envs`).
MuJoCo and Meta-World are imported when :func:`simulate` first runs, never at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def _reading(reader: Any, frames: np.ndarray) -> np.ndarray:
    value = np.asarray(reader(frames), np.float64)
    return value[:, -1] if value.ndim == 3 else value


def simulate(policy: Callable[[Any], Any], starts: Any, *, frames: int, window: int,
             context: int) -> dict[str, Any]:
    """Run ``policy`` in Meta-World from each start state under the decision rule of a closed loop in a world
    model that takes ``window``-frame chunks continuing from ``context`` frames: at each chunk boundary
    (:func:`~workbench.inspect.recording.closed_loop.chunk_schedule`) the policy sees the frame the simulator
    rendered there (as the data were rendered), the probes' readings of it and the start state's goal, and
    returns the actions of the frames that chunk adds.

    Args:
        policy: A callable of an :class:`~workbench.inspect.recording.closed_loop.Observation`.
        starts: Where the episodes start (a :class:`~workbench.worldmodel.closed_loop_eval.StartStates`).
        frames: The episode's length in frames.
        window: The world model's chunk length in frames.
        context: The frames each chunk continues from.

    Returns:
        ``distance`` (the outcome at the last frame, metres, the simulator's own), ``final_frames`` (uint8
        ``(S, H, W, 3)``) and ``actions`` (``(S, frames, 4)``).
    """
    from workbench.inspect.recording.closed_loop import Observation, act, chunk_schedule, describe_policy
    from workbench.inspect.recording.state import state_reader
    from workbench.worldmodel.policies import OUTCOME, _reset
    from workbench.worldmodel.scripted import READERS
    from workbench.worldmodel.sim import import_simulator

    import_simulator()
    schedule = chunk_schedule(window, context, frames)
    asked_at = {seen: (k, asked) for k, (seen, asked) in enumerate(schedule)}
    render_at = {f for seen, _ in schedule for f in range(seen - context + 1, seen + 1)} | {frames - 1}
    readers = [state_reader(r) for r in READERS]
    name = describe_policy(policy)
    repeat = int(starts.meta["action_repeat"])
    distance = np.full(len(starts), np.nan)
    final = np.zeros((len(starts), *starts.frame.shape[1:]), np.uint8)
    actions = np.zeros((len(starts), frames, 4), np.float32)
    for task in starts.tasks:
        env = environment(task, int(starts.meta["size"]), starts.meta["camera"], (frames + 40) * repeat)
        for row in np.flatnonzero(starts.task == task):
            state, _ = _reset(env, starts.meta["seed"], int(starts.task_index[row]), int(starts.index[row]))
            goal = {"task": starts.task[row:row + 1], "position": starts.goal[row:row + 1]}
            rendered: dict[int, np.ndarray] = {}
            for t in range(frames):
                if t in render_at:
                    rendered[t] = env.render()
                if t in asked_at:
                    k, asked = asked_at[t]
                    seen = np.stack([rendered[f] for f in range(t - context + 1, t + 1)])[None]
                    obs = Observation(frame=seen[:, -1], goal=goal, chunk=k, frame_index=t, frames=asked,
                                      state={key: _reading(r, seen) for r in readers for key in r.keys},
                                      action_dim=4, batched=True)
                    actions[row, asked.start:asked.stop] = act(policy, obs, name=name)[0]
                if t < frames - 1:
                    for _ in range(repeat):
                        state, *_ = env.env.step(actions[row, t])
            body = state[:3] if OUTCOME[task] == "hand" else state[4:7]
            distance[row] = float(np.linalg.norm(body - state[-3:]))
            final[row] = rendered[frames - 1]
    return {"distance": distance, "final_frames": final, "actions": actions}


_ENVS: dict[tuple, Any] = {}  # (task, size, camera) -> TaskEnv, built once per process (a CPU second each)


def environment(task: str, size: int, camera: str, steps: int) -> Any:
    """The Meta-World environment of ``task``, rendered at ``size`` from ``camera``, able to run ``steps``
    steps: built on first use in this process and kept open until :func:`close_envs`."""
    from workbench.worldmodel.sim import TaskEnv

    key = (task, size, camera)
    if key not in _ENVS:
        first = not _ENVS
        _ENVS[key] = TaskEnv(task, size, camera, max_steps=steps)
        if first:  # registered after the renderer's own exit handler, so that it runs before it
            import atexit

            atexit.register(close_envs)
    env = _ENVS[key]
    env.env.max_path_length = max(int(env.env.max_path_length), steps + 1)
    return env


def close_envs() -> None:
    """Close the simulator environments :func:`simulate` keeps open in this process."""
    while _ENVS:
        _ENVS.popitem()[1].close()


__all__ = ["close_envs", "environment", "simulate"]
