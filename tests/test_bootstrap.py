"""bootstrap_fn receives exactly what a batch shows as the truncated row's ``obs_``, for every
recorder kind, including observations stored as category indices (FrozenLake, rps)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe

pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")
from pettingzoo.classic import rps_v2

Seen = list[tuple[np.ndarray, Any]]


def gym_env(seen: Seen) -> Any:
    env = fe.record(
        gym.make("FrozenLake-v1", max_episode_steps=3),
        num_steps=100,
        bootstrap_fn=lambda obs_: seen.append((obs_, None)) or 1.0,
    )
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(40):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return env


def vector_env(seen: Seen) -> Any:
    envs = fe.record(
        gym.make_vec("FrozenLake-v1", num_envs=2, max_episode_steps=3),
        num_steps=100,
        bootstrap_fn=lambda obs_: seen.append((obs_, None)) or 1.0,
    )
    envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(20):
        envs.step(envs.action_space.sample())
    return envs


def parallel_env(seen: Seen) -> Any:
    env = fe.record(
        rps_v2.parallel_env(max_cycles=3),
        num_steps=100,
        bootstrap_fn=lambda obs_, agent: seen.append((obs_, agent)) or 1.0,
    )
    for episode in range(3):
        env.reset(seed=episode)
        while env.agents:
            env.step({a: env.action_space(a).sample() for a in env.agents})
    return env


def aec_env(seen: Seen) -> Any:
    env = fe.record(
        rps_v2.env(max_cycles=3), num_steps=100, bootstrap_fn=lambda obs_, agent: seen.append((obs_, agent)) or 1.0
    )
    for episode in range(3):
        env.reset(seed=episode)
        for agent in env.agent_iter():
            _, _, terminated, truncated, _ = env.last()
            env.step(None if terminated or truncated else env.action_space(agent).sample())
    return env


@pytest.mark.parametrize("make", [gym_env, vector_env, parallel_env, aec_env])
def test_bootstrap_fn_gets_the_batch_obs_of_the_truncated_row(make: Callable[[Seen], Any]) -> None:
    seen: Seen = []
    env = make(seen)
    buffer = env.buffer
    (batch,) = buffer.minibatches(len(buffer), shuffle=False)  # every recorded row
    cut = batch.truncated & ~batch.terminated  # truncated only: bootstrapped
    truncated = np.flatnonzero(cut.reshape(-1, len(buffer)).any(axis=0))
    assert len(seen) == truncated.size * (1 if buffer.spec.n_agents == 1 else buffer.spec.n_agents) > 0
    expected = batch.obs_[:, truncated] if buffer.spec.n_agents > 1 else batch.obs_[None, truncated]
    given = np.array([obs_ for obs_, _ in seen])
    assert given.dtype == batch.obs_.dtype == np.float32 and given.shape[-1] == batch.obs_.shape[-1]
    # one-hot rows, not stored indices; each call got one of the truncated rows' obs_
    assert (given.sum(axis=-1) == 1).all()
    flat = expected.reshape(-1, expected.shape[-1])
    for obs_ in given:
        assert (flat == obs_).all(axis=-1).any()
    # bootstrap 1.0 reached G: the truncated rows' G is r + gamma * 1
    g = batch.G.reshape(-1, len(buffer))[:, truncated]
    r = batch.individual_rewards.reshape(-1, len(buffer))[:, truncated]
    np.testing.assert_allclose(g, r + buffer.gamma, rtol=1e-6)
