"""The shipped policy family as closed-loop policies: the Meta-World scripted expert, the expert with Gaussian
action noise, and a random policy, each a callable of an
:class:`~workbench.inspect.recording.closed_loop.Observation`.

The scripted policies of ``metaworld.policies`` map a state vector (the hand, the object, the goal) to one
action. :class:`ScriptedPolicy` builds that vector from what an observation holds: the hand from the hand
probe's reading (``state["ee_pos"]``, the state reader ``"probe"``), the object from the object probe's
(``state["object_pos"]``, ``"object_probe"``), the goal and the task from the episode's start
(``goal["position"]``, ``goal["task"]``). Asked for the actions of a whole chunk, it plans them by dead
reckoning: after each action it moves its estimate of the hand as the simulator moves the hand's target
(:data:`HAND_STEP` metres per frame at a full action), and the object with the hand once the expert pushes it
(push-v3: the hand at the puck, by the expert's own test), and asks the expert again. The next chunk starts
from a fresh reading. The same policy acts in imagination (the probes read the frames the model produced) and
in the simulator twin (the probes read the frames the simulator rendered), so the two differ only in the world
model.

Noise and the random policy's actions are drawn from a generator seeded by the policy, the chunk and the
episode's goal (its task and position), never by an episode's place in a batch: an episode gets the same
draws in imagination and in the simulator, in any batch, on any process.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from workbench.errors import ConfigError, listing

#: Metres the hand's target moves per frame at a full action (Meta-World moves it by action / 100 per
#: simulator step; the recordings take two steps per frame).
HAND_STEP = 0.02
#: The state readers a scripted policy reads: the hand and the object.
READERS = ("probe", "object_probe")
#: Tasks whose expert the family knows how to feed (the state vector's layout is the task's).
TASKS = ("reach-v3", "push-v3")
OBS_SIZE = 39  # Meta-World v3's observation: hand (3), gripper (1), objects (14), their past (18), goal (3)


class ScriptedPolicy:
    """One policy of the family: the expert (``noise=0``), the expert with Gaussian noise of std ``noise``
    added to each action (clipped to [-1, 1]), or uniformly random actions (``noise=None``).

    Called with an :class:`~workbench.inspect.recording.closed_loop.Observation` (one episode or a batch),
    it returns float32 actions ``(n, 4)`` (``(B, n, 4)``) for the frames ``observation.frames``.

    Args:
        noise: The standard deviation of the Gaussian noise added to the expert's actions (0: the expert),
            or None for uniformly random actions.
        seed: Mixed into every draw.

    Raises:
        ConfigError: When ``noise`` is neither a number >= 0 nor None.

    Examples:
        >>> from workbench.inspect.recording.closed_loop import Observation
        >>> obs = Observation(frame=np.zeros((64, 64, 3), np.uint8), chunk=0, frame_index=0,
        ...                   state={"ee_pos": np.array([0.0, 0.6, 0.2]), "object_pos": np.zeros(3)},
        ...                   goal={"task": "reach-v3", "position": np.array([0.1, 0.6, 0.2])},
        ...                   frames=range(0, 3), action_dim=4, batched=False)
        >>> ScriptedPolicy(0.0)(obs).round(2)      # 5 x (goal - hand), clipped; the hand nears the goal
        array([[0.5 , 0.  , 0.  , 0.  ],
               [0.45, 0.  , 0.  , 0.  ],
               [0.4 , 0.  , 0.  , 0.  ]], dtype=float32)
    """

    def __init__(self, noise: float | None = 0.0, *, seed: int = 0):
        if noise is not None and not (isinstance(noise, (int, float)) and noise >= 0):
            raise ConfigError(f"ScriptedPolicy(noise={noise!r}): the noise std must be a number >= 0, "
                              f"or None for the random policy.")
        self.noise, self.seed = noise, int(seed)
        self.name = "random" if noise is None else ("expert" if noise == 0 else f"expert+noise{noise:g}")
        self._experts: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"ScriptedPolicy({self.name!r}, seed={self.seed})"

    def __call__(self, obs: Any) -> np.ndarray:
        rows = obs.rows()
        out = np.stack([self._chunk(row) for row in rows])
        return out if obs.batched else out[0]

    def _chunk(self, obs: Any) -> np.ndarray:
        goal = obs.goal if isinstance(obs.goal, dict) else {}
        task, position = goal.get("task"), goal.get("position")
        if task not in TASKS or position is None:
            raise ConfigError(f"{self.name}: the observation's goal must be {{'task': one of "
                              f"{listing(TASKS)}, 'position': (3,) metres}}, as the world-model wing's start "
                              f"states give it; got {obs.goal!r}.")
        missing = [k for k in ("ee_pos", "object_pos") if k not in obs.state]
        if missing:
            raise ConfigError(f"{self.name}: the observation holds no {listing(missing)}; read them with the "
                              f"state readers {listing(READERS)} (closed_loop(..., observe={READERS})).")
        position = np.asarray(position, np.float64)
        rng = self._rng(obs.chunk, str(task), position)
        hand = np.asarray(obs.state["ee_pos"], np.float64).copy()
        thing = np.asarray(obs.state["object_pos"], np.float64).copy()
        out = np.zeros((len(obs.frames), 4), np.float32)
        for j in range(len(out)):
            if self.noise is None:
                action = rng.uniform(-1.0, 1.0, size=4)
            else:
                action = self._expert(str(task), hand, thing, position)
                if self.noise:
                    action = action + rng.normal(0.0, self.noise, size=4)
            action = np.clip(action, -1.0, 1.0)
            out[j] = action
            step = action[:3] * HAND_STEP
            if task == "push-v3" and _pushing(hand, thing):
                thing[:2] += step[:2]
            hand = hand + step
        return out

    def _rng(self, chunk: int, task: str, position: np.ndarray) -> np.random.Generator:
        key = np.asarray(position, np.float32).view(np.uint32).tolist()
        return np.random.default_rng([self.seed, zlib.crc32(self.name.encode()), int(chunk),
                                      zlib.crc32(task.encode()), *key])

    def _expert(self, task: str, hand: np.ndarray, thing: np.ndarray, goal: np.ndarray) -> np.ndarray:
        if task not in self._experts:
            from workbench.worldmodel.sim import import_simulator

            import_simulator()
            from metaworld.policies import ENV_POLICY_MAP

            self._experts[task] = ENV_POLICY_MAP[task]()
        state = np.zeros(OBS_SIZE)
        state[:3], state[4:7], state[-3:] = hand, thing, goal
        with warnings.catch_warnings():  # the scripted policies warn about their own action class
            warnings.simplefilter("ignore")
            return np.asarray(self._experts[task].get_action(state), np.float64)


def _pushing(hand: np.ndarray, thing: np.ndarray) -> bool:
    """Whether push-v3's expert is moving the puck: the hand over it within 2 cm and within 4 cm in height
    (its own test before it heads for the goal)."""
    return bool(np.linalg.norm(hand[:2] - thing[:2]) <= 0.02 and abs(hand[2] - thing[2]) <= 0.04)


def family(noise_levels: Sequence[float] | None = None, *, seed: int = 0) -> dict[str, ScriptedPolicy]:
    """The shipped family of policies, best first by design.

    Args:
        noise_levels: The noise levels of the noisy experts (default
            :data:`~workbench.worldmodel.policies.NOISE_LEVELS`).
        seed: Mixed into every policy's draws.

    Returns:
        The policies by name: ``expert``, ``expert+noise0.1`` ... (one per level), ``random``.
    """
    from workbench.worldmodel.policies import NOISE_LEVELS

    levels = NOISE_LEVELS if noise_levels is None else tuple(noise_levels)
    policies = [ScriptedPolicy(0.0, seed=seed), *[ScriptedPolicy(s, seed=seed) for s in levels],
                ScriptedPolicy(None, seed=seed)]
    return {p.name: p for p in policies}


__all__ = ["HAND_STEP", "READERS", "ScriptedPolicy", "family"]
