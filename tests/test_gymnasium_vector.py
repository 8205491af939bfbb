"""The vector recorder gives the same rows as one single-env recorder per sub-env."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import flexibuff_envs as fe
from tests.envs import ToyEnv

N = 3
FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "truncated")
ENVS: dict[str, Callable[[], gym.Env]] = {
    "CartPole-v1": lambda: gym.make("CartPole-v1", max_episode_steps=30),
    "masks-in-info": lambda: ToyEnv(gym.spaces.Discrete(5), gym.spaces.Discrete(4), lengths=(4, 7, 2),
                                    mask_info=True),
}


def run(make: Callable[[], gym.Env], mode: AutoresetMode, vectorization: str, steps: int = 60) -> tuple[Any, list]:
    vec = fe.record(gym.vector.SyncVectorEnv([make] * N, autoreset_mode=mode) if vectorization == "sync"
                    else gym.vector.AsyncVectorEnv([make] * N, autoreset_mode=mode), num_steps=200, gamma=0.9)
    singles = [fe.record(make(), num_steps=200, gamma=0.9) for _ in range(N)]
    rng = np.random.default_rng(0)
    vec.reset(seed=10)
    for i, single in enumerate(singles):
        single.reset(seed=10 + i)
    resetting = np.zeros(N, dtype=bool)
    for _ in range(steps):
        actions = rng.integers(0, 2, N)
        _, _, terminated, truncated, _ = vec.step(actions)
        done = terminated | truncated
        for i, single in enumerate(singles):
            if resetting[i]:
                single.reset()
                resetting[i] = False
                continue
            single.step(int(actions[i]))
            if done[i]:
                if mode == AutoresetMode.NEXT_STEP:
                    resetting[i] = True
                else:
                    single.reset()
        if mode == AutoresetMode.DISABLED and done.any():
            vec.reset(options={"reset_mask": done})
    vec.close()
    return vec, singles


@pytest.mark.parametrize("vectorization", ["sync", "async"])
@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("name", list(ENVS))
def test_each_lane_equals_a_single_env_recorder(name: str, mode: AutoresetMode, vectorization: str) -> None:
    vec, singles = run(ENVS[name], mode, vectorization)
    assert vec.buffer_spec.n_envs == N
    total = 0
    for i, single in enumerate(singles):
        n = len(single.buffer)
        total += n
        mine = vec.buffer.sample_transitions(idx=i * 200 + np.arange(n))
        theirs = single.buffer.sample_transitions(idx=np.arange(n))
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(mine, field), getattr(theirs, field), err_msg=f"lane {i} {field}")
        # G of many episodes is one pass over all of them (float32 storage: within an ulp or two)
        np.testing.assert_allclose(mine.G, theirs.G, rtol=1e-6, err_msg=f"lane {i} G")
        if single.buffer_spec.action_mask:
            np.testing.assert_array_equal(mine.action_mask[0], theirs.action_mask[0])
            np.testing.assert_array_equal(mine.action_mask_[0], theirs.action_mask_[0])
    assert len(vec.buffer) == total
    assert vec.buffer.n_episodes == sum(s.buffer.n_episodes for s in singles)


def test_vector_annotations_and_feedback_are_per_sub_env() -> None:
    env = fe.record(gym.make_vec("CartPole-v1", num_envs=2), num_steps=50)
    env.reset(seed=0)
    env.annotate(values=np.array([1.0, 2.0]), discrete_log_probs=np.array([[-0.1], [-0.2]]))
    env.step(np.array([0, 1]))
    env.add_feedback(5.0, lane=1)
    lane0 = env.buffer.sample_transitions(idx=np.array([0]))
    lane1 = env.buffer.sample_transitions(idx=np.array([50]))
    assert (lane0.values[0], lane1.values[0]) == (1.0, 2.0)
    assert lane1.individual_auxiliary_rewards[0] == 5.0 and lane0.individual_auxiliary_rewards[0] == 0.0
    with pytest.raises(ValueError, match="leading axis of 2 sub-envs"):
        env.annotate(values=1.0)
    env.buffer.finish_path(np.array([0.5, 0.25]))
    assert not np.isnan(env.buffer.sample_transitions(idx=np.array([0, 50])).G).any()


def test_vector_recorders_claim_a_lane_per_sub_env_of_a_shared_buffer() -> None:
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    shared = fe.FlexibleBuffer.from_spec(spec, num_steps=50, n_envs=4)
    first = fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared)
    second = fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared)
    assert first.lanes == [0, 1] and second.lanes == [2, 3]
    with pytest.raises(fe.SpecMismatchError, match="needs 2"):
        fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared)
    first.close()
    assert fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared).lanes == [0, 1]
