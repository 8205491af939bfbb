"""The parallel recorder against a plain loop over the bare env with the same seeds and actions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.testing import same
from flexibuff_envs.testing.pz_reference import Expected, play_parallel, replay_parallel

pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")
from mpe2 import (
    simple_adversary_v3,
    simple_speaker_listener_v4,
    simple_spread_v3,
    simple_world_comm_v3,
)
from pettingzoo.butterfly import knights_archers_zombies_v11, pistonball_v6
from pettingzoo.sisl import multiwalker_v9
from pettingzoo.test import parallel_api_test

GAMMA = 0.9
CASES: dict[str, tuple[Callable[[], Any], int, int]] = {  # make, seed, steps
    "simple_spread_v3": (lambda: simple_spread_v3.parallel_env(max_cycles=15), 0, 40),
    "simple_adversary_v3": (lambda: simple_adversary_v3.parallel_env(max_cycles=15), 0, 40),
    "simple_speaker_listener_v4": (lambda: simple_speaker_listener_v4.parallel_env(max_cycles=15), 0, 40),
    "simple_world_comm_v3": (lambda: simple_world_comm_v3.parallel_env(max_cycles=10), 0, 25),
    "knights_archers_zombies_v11": (lambda: knights_archers_zombies_v11.parallel_env(
        line_death=True, spawn_delay=1000, max_cycles=100), 2, 40),
    "multiwalker_v9": (lambda: multiwalker_v9.parallel_env(max_cycles=20), 0, 45),
    "pistonball_v6": (lambda: pistonball_v6.parallel_env(n_pistons=4, max_cycles=5), 0, 7),
}


def run(name: str) -> tuple[Expected, list, list, Any]:
    make, seed, steps = CASES[name]
    expected, bare_returned = play_parallel(make(), seed=seed, steps=steps)
    env = fe.record(make(), num_steps=200, gamma=GAMMA)
    return expected, bare_returned, replay_parallel(env, seed, expected.actions[:steps]), env


@pytest.mark.parametrize("name", list(CASES))
def test_every_recorded_field_equals_the_reference(name: str) -> None:
    expected, bare, wrapped, env = run(name)
    assert same(bare, wrapped)  # drop-in: exactly what the bare env returns
    buffer = env.buffer
    rows = expected.rewards.shape[1]
    assert len(buffer) == rows
    batch = buffer.sample_transitions(idx=np.arange(rows))
    np.testing.assert_array_equal(batch.active, expected.active)
    np.testing.assert_array_equal(batch.obs, expected.obs)
    np.testing.assert_array_equal(batch.obs_, expected.obs_)
    assert batch.obs.dtype == expected.obs.dtype
    np.testing.assert_allclose(batch.individual_rewards, expected.rewards, rtol=1e-6)
    np.testing.assert_allclose(batch.global_rewards, expected.rewards.sum(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batch.terminated, expected.terminated)
    np.testing.assert_array_equal(batch.truncated, expected.truncated)
    if expected.discrete is not None:
        np.testing.assert_array_equal(batch.discrete_actions, expected.discrete)
    if expected.continuous is not None:
        np.testing.assert_allclose(batch.continuous_actions, expected.continuous)
    if expected.mask is None:
        assert batch.action_mask is None
    else:
        np.testing.assert_array_equal(np.concatenate(batch.action_mask, axis=-1), expected.mask)
        np.testing.assert_array_equal(np.concatenate(batch.action_mask_, axis=-1), expected.mask_)
    np.testing.assert_allclose(batch.G, expected.G(GAMMA), rtol=1e-5, atol=1e-5)


def test_agents_die_on_their_own_and_get_their_own_G() -> None:
    expected, _, _, env = run("knights_archers_zombies_v11")
    start, end = expected.episodes[0]
    (batch,) = env.buffer.sample_episodes(n_episodes=1)  # the first episode, whole
    assert len(batch) == end - start
    last_active = [int(np.flatnonzero(a)[-1]) for a in batch.active]
    assert len(set(last_active)) > 1  # knights and archers died at different steps
    for agent, last in enumerate(last_active):
        assert batch.terminated[agent, last]
        assert np.isnan(batch.G[agent, last + 1:]).all() and not np.isnan(batch.G[agent, : last + 1]).any()


def test_global_state_is_the_state_before_and_after_each_step() -> None:
    make, seed, _ = CASES["simple_spread_v3"]
    bare = make()
    bare.reset(seed=seed)
    env = fe.record(make(), num_steps=100)
    env.reset(seed=seed)
    for agent in env.possible_agents:
        bare.action_space(agent).seed(3)
    before = bare.state()
    for _ in range(3):
        actions = {a: bare.action_space(a).sample() for a in bare.agents}
        bare.step(actions)
        env.step(actions)
    after = bare.state()
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.state[0], before)
    np.testing.assert_array_equal(batch.state_[2], after)
    np.testing.assert_array_equal(batch.state[1:], batch.state_[:-1])


def test_heterogeneous_agents_share_one_buffer_with_padding_masked_out() -> None:
    env = fe.record(simple_speaker_listener_v4.parallel_env())
    spec = env.buffer_spec
    assert spec.agent_ids == ("speaker_0", "listener_0")
    assert spec.obs_size == 11 and spec.agent_obs_sizes == (3, 11)
    assert spec.discrete_action_cardinalities == (5,)
    assert spec.agent_discrete_action_cardinalities == ((3,), (5,))
    assert spec.action_mask
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    batch = env.buffer.sample_transitions(idx=np.array([0]))
    assert batch.action_mask[0][0, 0].tolist() == [True, True, True, False, False]
    assert (batch.obs[0, 0, 3:] == 0).all()


def test_structurally_different_agents_are_refused_with_the_agents_named() -> None:
    from gymnasium import spaces
    from pettingzoo.utils.env import ParallelEnv

    class Mixed(ParallelEnv):
        metadata: ClassVar[dict] = {"name": "mixed"}
        possible_agents: ClassVar[list[str]] = ["pusher", "steerer"]

        def observation_space(self, agent: str) -> spaces.Space:
            return spaces.Box(-1, 1, (2,))

        def action_space(self, agent: str) -> spaces.Space:
            return spaces.Discrete(3) if agent == "pusher" else spaces.Box(-1, 1, (2,))

    with pytest.raises(ValueError, match="'pusher'.*'steerer'.*own recorder"):
        fe.record(Mixed())


@pytest.mark.parametrize("global_reward", ["mean", "none", lambda rewards, active: float(rewards.max())])
def test_team_reward_is_configurable(global_reward: Any) -> None:
    env = fe.record(simple_adversary_v3.parallel_env(max_cycles=5), global_reward=global_reward)
    replay_parallel(env, 0, [{a: 1 for a in env.possible_agents}] * 4)
    batch = env.buffer.sample_transitions(idx=np.arange(4))
    if global_reward == "none":
        assert batch.global_rewards is None
    elif global_reward == "mean":
        np.testing.assert_allclose(batch.global_rewards, batch.individual_rewards.mean(axis=0), rtol=1e-6)
    else:
        np.testing.assert_allclose(batch.global_rewards, batch.individual_rewards.max(axis=0))


def test_truncation_bootstraps_each_agent_with_its_own_value() -> None:
    values = {"agent_0": 1.0, "agent_1": 2.0, "agent_2": 3.0}
    env = fe.record(simple_spread_v3.parallel_env(max_cycles=3), gamma=0.5,
                    bootstrap_fn=lambda obs_, agent: values[agent] + float(obs_[0]))
    env.reset(seed=0)
    while env.agents:
        env.step({a: 0 for a in env.agents})
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert episode.truncated[:, -1].all()
    for i, agent in enumerate(env.possible_agents):
        expected = episode.individual_rewards[i, -1] + 0.5 * (values[agent] + episode.obs_[i, -1, 0])
        assert episode.G[i, -1] == pytest.approx(expected, rel=1e-5)


def test_state_recording_can_be_turned_off() -> None:
    env = fe.record(simple_spread_v3.parallel_env(), record_state=False)
    assert env.buffer_spec.state_size is None
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    assert env.buffer.sample_transitions(1).state is None


def test_rps_parallel_has_no_state_and_does_not_crash() -> None:
    from pettingzoo.classic import rps_v2

    env = fe.record(rps_v2.parallel_env())
    assert env.buffer_spec.state_size is None
    env.reset(seed=0)
    env.step({a: 1 for a in env.agents})
    assert env.buffer.sample_transitions(1).state is None


@pytest.mark.parametrize("make", [
    lambda: simple_spread_v3.parallel_env(), lambda: simple_speaker_listener_v4.parallel_env(),
    lambda: simple_world_comm_v3.parallel_env(), lambda: multiwalker_v9.parallel_env(),
    lambda: knights_archers_zombies_v11.parallel_env(),
])
def test_parallel_api_test_passes_on_the_wrapped_env(make: Callable[[], Any]) -> None:
    env = fe.record(make(), num_steps=2000)
    parallel_api_test(env, num_cycles=200)
    assert len(env.buffer) > 0


def test_a_failing_env_state_is_recorded_as_missing_with_one_warning() -> None:
    env = fe.record(multiwalker_v9.parallel_env(max_cycles=500), num_steps=600)
    env.reset(seed=0)
    for agent in env.possible_agents:
        env.action_space(agent).seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while env.agents:  # random walkers fall; multiwalker's state() then breaks
            env.step({a: env.action_space(a).sample() for a in env.agents})
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning) and "state() of multiwalker" in str(w.message)]
    assert len(ours) == 1
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert np.isnan(episode.state_[-1]).all() and not np.isnan(episode.state[0]).any()


def test_finish_path_leaves_agents_that_already_died_alone() -> None:
    make, seed, _ = CASES["knights_archers_zombies_v11"]
    expected, _, _, _ = run("knights_archers_zombies_v11")
    env = fe.record(make(), num_steps=200, gamma=GAMMA)
    replay_parallel(env, seed, expected.actions[:21])  # the knights died at step 20; the archers play on
    batch = env.buffer.sample_transitions(idx=np.arange(21))
    dead = [i for i in range(4) if batch.terminated[i].any()]
    alive = [i for i in range(4) if i not in dead]
    assert dead and alive
    before = batch.G[dead].copy()
    env.buffer.finish_path(last_values=100.0)
    after = env.buffer.sample_transitions(idx=np.arange(21)).G
    np.testing.assert_array_equal(after[dead], before)  # their own termination's G, no bootstrap
    assert not np.isnan(after[alive]).any()
    last = batch.individual_rewards[alive[0], -1] + GAMMA * 100.0
    assert after[alive[0], -1] == pytest.approx(last, rel=1e-5)


def test_sequences_keep_the_agent_axis_first() -> None:
    env = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=100)
    replay_parallel(env, 0, [{a: 0 for a in env.possible_agents}] * 25)
    batch = env.buffer.sample_sequences(7, 4)
    assert batch.obs.shape == (3, 7, 4, 18) and batch.individual_rewards.shape == (3, 7, 4)
    assert batch.state.shape == (7, 4, 54) and batch.valid.shape == (7, 4)
    torch_batch = env.buffer.sample_sequences(7, 4, as_torch=True)
    assert tuple(torch_batch.valid.shape) == (7, 4)
