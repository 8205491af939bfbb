"""A state per agent (HARL's "FP" state): ``fe.record(env, agent_state=fn)`` against a plain loop
over the bare env with the same seeds and actions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.testing.pz_reference import play_aec, play_parallel, replay_aec, replay_parallel

pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")
from mpe2 import simple_spread_v3
from pettingzoo.butterfly import knights_archers_zombies_v11


def summed(env: Any, agent: str, obs: Any) -> np.ndarray:
    """A state that depends on the observation and the agent: what the reference can recompute."""
    return np.array([np.sum(obs, dtype=np.float64), env.possible_agents.index(agent)])


def from_rows(obs: np.ndarray) -> np.ndarray:
    """`summed` of stored (flattened, zero-padded) observations ``[n_agents, rows, obs_size]``."""
    agents = np.broadcast_to(np.arange(len(obs))[:, None], obs.shape[:2])
    return np.stack([obs.astype(np.float64).sum(axis=-1), agents], axis=-1)


PARALLEL: dict[str, tuple[Callable[[], Any], int, int]] = {  # make, seed, steps
    "simple_spread_v3": (lambda: simple_spread_v3.parallel_env(max_cycles=15), 0, 40),
    "knights_archers_zombies_v11 (agents die)": (
        lambda: knights_archers_zombies_v11.parallel_env(line_death=True, spawn_delay=1000, max_cycles=100),
        2,
        40,
    ),
}


@pytest.mark.parametrize("name", list(PARALLEL))
def test_parallel_agent_state_is_fn_at_each_observation(name: str) -> None:
    make, seed, steps = PARALLEL[name]
    expected, _ = play_parallel(make(), seed=seed, steps=steps)
    env = fe.record(make(), num_steps=200, agent_state=summed, agent_state_size=2)
    replay_parallel(env, seed, expected.actions[:steps])
    batch = env.buffer.sample_transitions(idx=np.arange(expected.rewards.shape[1]))
    active = expected.active
    assert batch.agent_state.shape == (len(env.possible_agents), len(batch), 2)
    np.testing.assert_allclose(batch.agent_state[active], from_rows(expected.obs)[active], rtol=1e-5)
    np.testing.assert_allclose(batch.agent_state_[active], from_rows(expected.obs_)[active], rtol=1e-5)
    assert np.isnan(batch.agent_state[~active]).all()  # a dead agent's rows hold no state


def test_aec_agent_state_is_taken_at_each_turn_and_the_next() -> None:
    def make() -> Any:
        return simple_spread_v3.env(max_cycles=6)

    expected = play_aec(make(), seed=3, episodes=2)
    env = fe.record(make(), num_steps=100, agent_state=summed, agent_state_size=2)
    replay_aec(env, 3, 2, expected.actions)
    batch = env.buffer.sample_transitions(idx=np.arange(expected.rewards.shape[1]))
    active = expected.active
    np.testing.assert_allclose(batch.agent_state[active], from_rows(expected.obs)[active], rtol=1e-5)
    np.testing.assert_allclose(batch.agent_state_[active], from_rows(expected.obs_)[active], rtol=1e-5)


def harl_fp(env: Any, agent: str, obs: Any) -> np.ndarray:
    """HARL's feature-pruned state: the global state, then the agent's one-hot id."""
    return np.concatenate([env.state(), np.eye(len(env.possible_agents))[env.possible_agents.index(agent)]])


def test_the_state_can_come_from_the_env_and_reaches_every_sampling_mode_and_files(tmp_path: Path) -> None:
    bare = simple_spread_v3.parallel_env(max_cycles=10)
    env = fe.record(
        simple_spread_v3.parallel_env(max_cycles=10), num_steps=100, agent_state=harl_fp, agent_state_size=57
    )
    env.reset(seed=1)
    bare.reset(seed=1)
    states = [[harl_fp(bare, a, None) for a in bare.possible_agents]]
    for t in range(10):
        actions = {a: (t + k) % 5 for k, a in enumerate(bare.agents)}
        env.step(actions)
        bare.step(actions)
        states.append([harl_fp(bare, a, None) for a in bare.possible_agents])
    reference = np.swapaxes(np.array(states, dtype=np.float32), 0, 1)  # [agents, 11 moments, 57]
    buffer = env.buffer
    (episode,) = buffer.sample_episodes(n_episodes=1)
    np.testing.assert_array_equal(episode.agent_state, reference[:, :-1])
    np.testing.assert_array_equal(episode.agent_state_, reference[:, 1:])
    # HARL's FP layout, (n_agents * batch, state_dim), is the agent axis folded into the batch
    assert episode.agent_state.reshape(-1, 57).shape == (30, 57)
    window = buffer.sample_sequences(4, 5)
    assert window.agent_state.shape == (3, 4, 5, 57)
    (minibatch,) = buffer.minibatches(10, shuffle=False)
    np.testing.assert_array_equal(minibatch.agent_state_, reference[:, 1:])
    path = tmp_path / "fp.fbuf"
    buffer.save(path)
    loaded = fe.FlexibleBuffer.load(path)
    (again,) = loaded.sample_episodes(n_episodes=1)
    np.testing.assert_array_equal(again.agent_state, reference[:, :-1])
    learner = fe.FlexibleBuffer.from_spec(buffer.spec, num_steps=50, gamma=buffer.gamma, gae_lambda=buffer.gae_lambda)
    assert learner.extend(buffer.take_episodes()) == 1
    (chunk_episode,) = learner.sample_episodes(n_episodes=1)
    np.testing.assert_array_equal(chunk_episode.agent_state_, reference[:, 1:])


def test_a_wrong_state_is_refused_naming_the_agent_and_keeps_the_steps_before() -> None:
    calls = {"n": 0}

    def broken(env: Any, agent: str, obs: Any) -> list[float]:
        calls["n"] += 1
        return [1.0, 2.0] if calls["n"] <= 6 else [1.0]  # 3 at the reset, 3 in the first step

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=10), agent_state=broken, agent_state_size=2)
    env.reset(seed=0)
    env.step(dict.fromkeys(env.agents, 0))
    with pytest.raises(fe.FlexibuffError, match="agent_state of agent 'agent_0' must hold agent_state_size=2"):
        env.step(dict.fromkeys(env.agents, 0))
    assert len(env.buffer) == 1  # the first step, whole
    np.testing.assert_array_equal(env.buffer.sample_transitions(idx=np.array([0])).agent_state_[:, 0], [[1, 2]] * 3)


def test_agent_state_is_checked_when_the_recorder_is_made() -> None:
    with pytest.raises(TypeError, match="agent_state_size"):
        fe.record(simple_spread_v3.parallel_env(), agent_state=summed)
    with pytest.raises(TypeError, match="PettingZoo"):
        fe.record(gym.make("CartPole-v1"), agent_state=summed, agent_state_size=2)
    with pytest.raises(ValueError, match="'agent_state' is where agent_state is recorded"):
        fe.record(
            simple_spread_v3.parallel_env(), agent_state=summed, agent_state_size=2, extra_fields={"agent_state": (2,)}
        )
    with pytest.raises(fe.SpecMismatchError):  # a given buffer must hold the fields
        fe.record(
            simple_spread_v3.parallel_env(),
            fe.record(simple_spread_v3.parallel_env()).buffer,
            agent_state=summed,
            agent_state_size=2,
        )
