"""Play a recorded env with uniformly random legal actions until a budget of episodes or steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces


@dataclass(frozen=True)
class Budget:
    """Stop after ``episodes`` ended episodes, or after ``steps`` env steps (one is None)."""

    episodes: int | None = None
    steps: int | None = None

    @property
    def total(self) -> int:
        return self.episodes if self.episodes is not None else self.steps or 0

    def spent(self, episodes: int, steps: int) -> bool:
        return episodes >= self.episodes if self.episodes is not None else steps >= (self.steps or 0)


@dataclass(frozen=True)
class Rollout:
    """What a run did: episodes ended, env steps (``step`` calls, x sub-envs), wall seconds."""

    episodes: int
    steps: int
    seconds: float
    interrupted: bool = False


#: called with the running (episodes, steps) whenever an episode ends
Progress = Callable[[int, int], None]


def legal_sample(space: spaces.Space, obs: Any, info: Mapping[str, Any]) -> Any:
    """A uniformly random action of ``space``, among the legal ones when the env gives a mask.

    The mask is ``info["action_mask"]`` or ``obs["action_mask"]`` (PettingZoo classic games).
    """
    mask = info.get("action_mask")
    if mask is None and isinstance(obs, Mapping):
        mask = obs.get("action_mask")
    if mask is None or not isinstance(space, spaces.Discrete):
        return space.sample()
    return space.sample(mask=np.asarray(mask, dtype=np.int8))


def _legal_draws(rng: np.random.Generator, masks: np.ndarray, given: np.ndarray | None) -> np.ndarray:
    """One uniformly random legal action index per sub-env (``masks`` is ``[num_envs, n]``).

    A sub-env whose info had no mask this step (``given`` False there) draws from all its actions.
    """
    if given is not None:
        masks = masks | ~np.asarray(given, dtype=bool)[:, None]
    keys = np.where(masks, rng.random(masks.shape), -1.0)  # the largest key among the legal ones wins
    return keys.argmax(axis=1)


def play(env: Any, api: str, *, seed: int, budget: Budget, progress: Progress) -> Rollout:
    """Run ``env`` (a recorder of kind ``api``) until ``budget`` is spent or Ctrl-C is pressed.

    A Ctrl-C stops the run early and keeps what was recorded: the recorder ends the step it
    interrupted cleanly (see `LaneRecorder.abandon`).
    """
    loop = {"gymnasium": _gymnasium, "vector": _vector, "parallel": _parallel, "aec": _aec}[api]
    counts = [0, 0]  # episodes, steps: kept outside the loop so an interrupt keeps them
    start = time.perf_counter()
    try:
        loop(env, seed, budget, counts, progress)
    except KeyboardInterrupt:
        return Rollout(counts[0], counts[1], time.perf_counter() - start, interrupted=True)
    return Rollout(counts[0], counts[1], time.perf_counter() - start)


def _gymnasium(env: Any, seed: int, budget: Budget, counts: list[int], progress: Progress) -> None:
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    while not budget.spent(*counts):
        obs, _, terminated, truncated, info = env.step(legal_sample(env.action_space, obs, info))
        counts[1] += 1
        if terminated or truncated:
            counts[0] += 1
            progress(*counts)
            obs, info = env.reset()


def _vector(env: Any, seed: int, budget: Budget, counts: list[int], progress: Progress) -> None:
    single = env.single_action_space
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    while not budget.spent(*counts):
        masks = info.get("action_mask")
        if masks is None or not isinstance(single, spaces.Discrete):
            actions = env.action_space.sample()
        else:
            actions = _legal_draws(rng, np.asarray(masks, dtype=bool), info.get("_action_mask")) + single.start
        _, _, terminated, truncated, info = env.step(actions)
        counts[1] += env.num_envs
        ended = int(np.count_nonzero(terminated | truncated))
        if ended:
            counts[0] += ended
            progress(*counts)


def _parallel(env: Any, seed: int, budget: Budget, counts: list[int], progress: Progress) -> None:
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    obs, infos = env.reset(seed=seed)
    while not budget.spent(*counts):
        actions = {a: legal_sample(env.action_space(a), obs[a], infos.get(a, {})) for a in env.agents}
        obs, _, terminated, truncated, infos = env.step(actions)
        counts[1] += 1
        if not env.agents or all(terminated[a] or truncated[a] for a in terminated):
            counts[0] += 1
            progress(*counts)
            obs, infos = env.reset()


def _aec(env: Any, seed: int, budget: Budget, counts: list[int], progress: Progress) -> None:
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    env.reset(seed=seed)
    while not budget.spent(*counts):
        for agent in env.agent_iter():
            obs, _, terminated, truncated, info = env.last()
            env.step(None if terminated or truncated else legal_sample(env.action_space(agent), obs, info))
            counts[1] += 1
            if env.agents and budget.spent(*counts):
                return  # mid-episode; an episode whose last step this was is still counted below
        counts[0] += 1
        progress(*counts)
        env.reset()
