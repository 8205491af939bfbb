"""annotate / add_feedback on the recorders, and GAE against a plain loop."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from tests.envs import ToyEnv

warnings.filterwarnings("ignore", module="pettingzoo")


def plain_gae(rewards: list[float], values: list[float], gamma: float, lam: float, last: float) -> list[float]:
    out, acc = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        following = values[t + 1] if t + 1 < len(rewards) else last
        acc = rewards[t] + gamma * following - values[t] + gamma * lam * acc
        out[t] = acc
    return out


def test_annotations_land_on_the_row_of_the_step_they_precede() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=100)
    env.reset(seed=0)
    env.annotate(values=0.5, discrete_log_probs=[-0.7], memory_weights=3.0)
    env.step(0)
    env.step(1)  # not annotated: NaN / weight 1, never a stale value
    env.annotate(values=1.5, continuous_log_probs=[-1.0, -2.0])
    env.step(0)
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.values, [0.5, np.nan, 1.5])
    np.testing.assert_allclose(batch.discrete_log_probs[:, 0], [-0.7, np.nan, np.nan])
    np.testing.assert_array_equal(batch.memory_weights, [3.0, 1.0, 1.0])
    np.testing.assert_array_equal(batch.continuous_log_probs[2], [-1.0, -2.0])
    assert np.isnan(batch.continuous_log_probs[:2]).all()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"value": 1.0}, "unknown field 'value'"),
        ({"values": [1.0, 2.0]}, "values of agent 'agent_0' must have 1 value"),
        ({"discrete_log_probs": [0.1, 0.2]}, "discrete_log_probs of agent 'agent_0' must have 1 value"),
        ({"memory_weights": -1.0}, "memory_weights must be finite and >= 0"),
    ],
)
def test_bad_annotations_are_refused_by_name_and_nothing_is_lost(fields: dict, named: str) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=100)
    env.reset(seed=0)
    env.step(0)
    before = env.buffer.sample_transitions(idx=np.arange(1))
    with pytest.raises(ValueError, match=named):
        env.annotate(**fields)
    assert len(env.buffer) == 1
    np.testing.assert_array_equal(env.buffer.sample_transitions(idx=np.arange(1)).obs, before.obs)


def test_gae_and_returns_equal_a_plain_loop_at_termination_truncation_and_cut() -> None:
    gamma, lam = 0.9, 0.8
    env = fe.record(ToyEnv(lengths=(4, 6, 50), truncate=False), num_steps=200, gamma=gamma)
    env.buffer.gae_lambda = lam
    rng = np.random.default_rng(0)
    env.reset(seed=1)
    values: list[float] = []
    for _ in range(4 + 6 + 5):  # two whole episodes, then 5 steps of a third
        v = float(rng.normal())
        values.append(v)
        env.annotate(values=v)
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()
    env.buffer.finish_path(last_values=2.5)
    batch = env.buffer.sample_transitions(idx=np.arange(15))
    rewards = batch.individual_rewards.tolist()
    expected = (
        plain_gae(rewards[:4], values[:4], gamma, lam, 0.0)
        + plain_gae(rewards[4:10], values[4:10], gamma, lam, 0.0)
        + plain_gae(rewards[10:], values[10:], gamma, lam, 2.5)
    )
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.returns, np.array(expected) + values, rtol=1e-5, atol=1e-5)


def test_truncation_uses_bootstrap_fn_for_gae() -> None:
    env = fe.record(ToyEnv(lengths=(3,), truncate=True), num_steps=20, gamma=0.5, bootstrap_fn=lambda obs: 4.0)
    env.buffer.gae_lambda = 1.0
    env.reset(seed=0)
    for v in (1.0, 2.0, 3.0):
        env.annotate(values=v)
        env.step(0)
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    expected = plain_gae(batch.individual_rewards.tolist(), [1.0, 2.0, 3.0], 0.5, 1.0, 4.0)
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5)


def test_feedback_lands_on_exactly_that_row_and_adds_up() -> None:
    env = fe.record(ToyEnv(lengths=(5,)), num_steps=50)
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    env.add_feedback(1.0)  # the latest step (row 2)
    env.add_feedback(0.5, step=0)  # the episode's first step
    env.add_feedback(0.25, step=0)
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.individual_auxiliary_rewards, [0.75, 0, 1.0])
    np.testing.assert_array_equal(batch.global_auxiliary_rewards, [0.75, 0, 1.0])
    env.step(0)
    env.step(0)  # the episode ends
    env.reset()
    env.add_feedback(-1.0)  # right after the reset: the episode that just ended
    assert env.buffer.sample_transitions(idx=np.array([4])).individual_auxiliary_rewards[0] == -1.0
    with pytest.raises(ValueError, match="step=7"):
        env.add_feedback(1.0, step=7)


def test_multi_agent_annotations_and_feedback_per_agent() -> None:
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=5), num_steps=50)
    env.reset(seed=0)
    for i, agent in enumerate(env.agents):
        env.annotate(agent, values=float(i), discrete_log_probs=[-float(i)])
    env.step({a: 0 for a in env.agents})
    env.add_feedback(2.0, agent="agent_1")
    batch = env.buffer.sample_transitions(idx=np.arange(1))
    np.testing.assert_array_equal(batch.values[:, 0], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(batch.individual_auxiliary_rewards[:, 0], [0.0, 2.0, 0.0])
    with pytest.raises(ValueError, match="agent must be one of"):
        env.annotate("nobody", values=1.0)


def test_minibatches_can_normalize_advantages() -> None:
    env = fe.record(ToyEnv(lengths=(5,)), num_steps=100)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="no advantages were recorded"):
        env.step(0)
        next(env.buffer.minibatches(4, normalize_advantages=True))
    for _ in range(40):
        env.annotate(values=0.3)
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()
    for batch in env.buffer.minibatches(16, normalize_advantages=True, drop_last=True):
        finite = batch.advantages[~np.isnan(batch.advantages)]
        assert abs(finite.mean()) < 1e-5 and abs(finite.std() - 1) < 1e-3


def test_a_refused_annotation_allocates_nothing() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=100)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="unknown field 'value'"):
        env.annotate(values=1.0, value=2.0)  # the good field must not slip in beside the bad one
    env.step(0)
    assert env.buffer.sample_transitions(1).values is None
