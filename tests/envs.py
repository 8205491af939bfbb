"""Small custom envs for cases the real ones do not exercise."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ToyEnv(gym.Env):
    """Random observations of any space, any action space, episodes of chosen lengths.

    Episode ``k`` (counted from the last seeded reset) lasts ``lengths[k % len(lengths)]`` steps and then terminates (or truncates when
    ``truncate`` is set). Rewards are random; ``info["action_mask"]`` is given when ``mask_info``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, observation_space: spaces.Space | None = None, action_space: spaces.Space | None = None,
                 lengths: tuple[int, ...] = (5,), truncate: bool = False, mask_info: bool = False) -> None:
        self.observation_space = (spaces.Box(-1, 1, (3,), np.float32) if observation_space is None
                                  else observation_space)
        self.action_space = spaces.Discrete(2) if action_space is None else action_space
        self.lengths, self.truncate, self.mask_info = lengths, truncate, mask_info
        self._episode = -1
        self._t = 0

    def _info(self) -> dict[str, Any]:
        if not self.mask_info:
            return {}
        mask = self.np_random.integers(0, 2, self.action_space.n).astype(np.int8)
        mask[0] = 1
        return {"action_mask": mask}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self._episode = 0 if seed is not None else self._episode + 1  # a seeded reset starts over
        self._t = 0
        return self.observation_space.sample(), self._info()

    def step(self, action: Any):
        self._t += 1
        done = self._t >= self.lengths[self._episode % len(self.lengths)]
        reward = float(self.np_random.normal())
        return (self.observation_space.sample(), reward, done and not self.truncate,
                done and self.truncate, self._info())



def recorded_spread(max_cycles: int, steps: int, num_steps: int = 200) -> Any:
    """The buffer of mpe2's simple_spread_v3 (3 agents) recorded for ``steps`` parallel steps."""
    from mpe2 import simple_spread_v3

    import flexibuff_envs as fe

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=max_cycles), num_steps=num_steps)
    env.reset(seed=0)
    for _ in range(steps):
        env.step({agent: 1 for agent in env.agents})
        if not env.agents:
            env.reset()
    return env.buffer
