"""Small custom envs for cases the real ones do not exercise."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import flexibuff_envs as fe


class ToyEnv(gym.Env):
    """Random observations of any space, any action space, episodes of chosen lengths.

    Episode ``k`` (counted from the last seeded reset) lasts ``lengths[k % len(lengths)]`` steps and then terminates (or truncates when
    ``truncate`` is set). Rewards are random; ``info["action_mask"]`` is given when ``mask_info``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
        lengths: tuple[int, ...] = (5,),
        truncate: bool = False,
        mask_info: bool = False,
    ) -> None:
        self.observation_space = spaces.Box(-1, 1, (3,), np.float32) if observation_space is None else observation_space
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
        return (
            self.observation_space.sample(),
            reward,
            done and not self.truncate,
            done and self.truncate,
            self._info(),
        )


def recorded_spread(max_cycles: int, steps: int, num_steps: int = 200) -> Any:
    """The buffer of mpe2's simple_spread_v3 (3 agents) recorded for ``steps`` parallel steps."""
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=max_cycles), num_steps=num_steps)
    env.reset(seed=0)
    for _ in range(steps):
        env.step({agent: 1 for agent in env.agents})
        if not env.agents:
            env.reset()
    return env.buffer


#: the discount `recorded` records with
RECORDED_GAMMA = 0.9


def _parallel(env: Any, steps: int, seed: int = 0, first: int | None = None) -> fe.FlexibleBuffer:
    """``env`` recorded for ``steps`` steps, agents cycling through their actions (or the first
    agent playing ``first``, the others noop)."""
    recorder = fe.record(env, num_steps=2000, gamma=RECORDED_GAMMA)
    recorder.reset(seed=seed)
    for t in range(steps):
        recorder.step(
            {
                agent: (t + i) % recorder.action_space(agent).n
                if first is None
                else first
                if agent == recorder.possible_agents[0]
                else 5
                for i, agent in enumerate(recorder.agents)
            }
        )
        if not recorder.agents:
            recorder.reset()
    return recorder.buffer


def recorded(kind: str) -> fe.FlexibleBuffer:
    """A buffer of ``kind``: global state, agents of different sizes, agents dying, agents
    spawning late, frames, images of floats, turns with masks (AEC), one agent."""
    if kind == "spread":  # global state
        from mpe2 import simple_spread_v3

        return _parallel(simple_spread_v3.parallel_env(max_cycles=10), 60)
    if kind == "adversary":  # agents of different observation sizes
        from mpe2 import simple_adversary_v3

        return _parallel(simple_adversary_v3.parallel_env(max_cycles=10), 60)
    if kind == "dying":
        from pettingzoo.butterfly import knights_archers_zombies_v11

        return _parallel(
            knights_archers_zombies_v11.parallel_env(line_death=True, spawn_delay=1000, max_cycles=30),
            70,
            seed=2,
            first=1,
        )  # it walks over the line
    if kind == "spawning":
        from tests.test_pettingzoo_parallel import ScriptedParallel

        return _parallel(ScriptedParallel(spawn={"a": 0, "b": 3}, end={"a": 5, "b": 8}), 40)
    if kind == "pistonball":  # frames: each piston's view and the state a picture of the whole
        from pettingzoo.butterfly import pistonball_v6

        return _parallel(pistonball_v6.parallel_env(n_pistons=3, continuous=False, max_cycles=6), 14)
    if kind == "pursuit":  # images of floats; evaders caught and removed
        from pettingzoo.sisl import pursuit_v5

        return _parallel(pursuit_v5.parallel_env(n_pursuers=3, n_evaders=4, max_cycles=12), 30)
    if kind == "connect_four":
        from pettingzoo.classic import connect_four_v3

        recorder = fe.record(connect_four_v3.env(), num_steps=2000, gamma=RECORDED_GAMMA)
        random_games(recorder, 6)
        return recorder.buffer
    recorder = fe.record(gym.make("CartPole-v1"), num_steps=2000, gamma=RECORDED_GAMMA)
    recorder.reset(seed=0)
    for t in range(300):
        if any(recorder.step(t % 3 % 2)[2:4]):
            recorder.reset()
    return recorder.buffer


RECORDED_KINDS = ["spread", "adversary", "dying", "spawning", "pistonball", "pursuit", "connect_four", "cartpole"]


def random_games(env: Any, games: int, seed: int = 0) -> None:
    """``games`` games of an AEC env with masks (connect four), each reset with its number as the
    seed, every move a random legal one."""
    rng = np.random.default_rng(seed)
    for game in range(games):
        env.reset(seed=game)
        for _ in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            env.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"]))))


def toy() -> ToyEnv:
    """A `ToyEnv` made by hand, as ``--env tests.envs:toy`` makes it (no id says how)."""
    return ToyEnv(lengths=(4, 7))


class Unseeded(ToyEnv):
    """A `ToyEnv` whose observations come from fresh entropy, whatever its seed: not deterministic."""

    def step(self, action: Any):
        _, *rest = super().step(action)
        return np.random.default_rng().random(3).astype(np.float32), *rest


def parallel_games(env: Any, seeds: list[int | None]) -> None:
    """An episode of a parallel env per seed (None: reset without one), random actions, each
    played to its end."""
    for seed in seeds:
        env.reset(seed=seed)
        while env.agents:
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
