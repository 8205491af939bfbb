"""Bad input anywhere a user gives it: a clear error naming the culprit, and the buffer loses nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import flexibuff_envs as fe
from tests.envs import ToyEnv


def recorded() -> fe.GymRecorder:
    env = fe.record(gym.make("CartPole-v1"), num_steps=500, gamma=0.9)
    env.reset(seed=0)
    for t in range(120):
        env.annotate(values=0.5)
        _, _, terminated, truncated, _ = env.step(t % 2)
        if terminated or truncated:
            env.reset()
    return env


def fingerprint(buffer: fe.FlexibleBuffer) -> tuple[Any, ...]:
    return (
        len(buffer),
        buffer.n_episodes,
        sorted(name for name, _ in buffer._store),
        {name: array.tobytes() for name, array in buffer._store},
    )


BAD_CALLS: dict[str, tuple[Callable[[fe.GymRecorder, Path], Any], type[Exception], str]] = {
    "annotate unknown field": (lambda env, _: env.annotate(value=1.0), ValueError, "value"),
    "annotate wrong shape": (lambda env, _: env.annotate(values=np.ones(3)), ValueError, "values"),
    "sample 0 transitions": (lambda env, _: env.buffer.sample_transitions(0), ValueError, "batch_size"),
    "sample rows that are not rows": (
        lambda env, _: env.buffer.sample_transitions(idx=np.array([3, 9999])),
        ValueError,
        "idx",
    ),
    "sample float rows": (lambda env, _: env.buffer.sample_transitions(idx=np.array([0.5])), ValueError, "idx"),
    "more episodes than held": (
        lambda env, _: env.buffer.sample_episodes(n_episodes=10_000),
        fe.EmptyBufferError,
        "10000 whole episodes",
    ),
    "sequences of length 0": (lambda env, _: env.buffer.sample_sequences(4, 0), ValueError, "seq_len"),
    "minibatches of 0": (lambda env, _: next(env.buffer.minibatches(0)), ValueError, "batch_size"),
    "weights of the wrong shape": (
        lambda env, _: env.buffer.set_memory_weights(np.arange(3), np.ones(4)),
        ValueError,
        "weights",
    ),
    "negative weights": (lambda env, _: env.buffer.set_memory_weights(np.arange(3), -1.0), ValueError, "weights"),
    "feedback on a step never taken": (lambda env, _: env.add_feedback(1.0, step=10_000), ValueError, "step=10000"),
    "a recorder with another env's buffer": (
        lambda env, _: fe.record(gym.make("Pendulum-v1"), buffer=env.buffer),
        fe.SpecMismatchError,
        "obs_size",
    ),
    "a recorder with another gamma": (
        lambda env, _: fe.record(gym.make("CartPole-v1"), buffer=env.buffer, gamma=0.5),
        fe.SpecMismatchError,
        "gamma",
    ),
    "save onto a directory": (lambda env, tmp: env.buffer.save(tmp), fe.BufferSaveError, "is a directory"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_a_bad_call_names_the_culprit_and_the_buffer_keeps_everything(name: str, tmp_path: Path) -> None:
    env = recorded()
    before = fingerprint(env.buffer)
    call, error, words = BAD_CALLS[name]
    with pytest.raises(error, match=words):
        call(env, tmp_path)
    assert fingerprint(env.buffer) == before
    env.step(0)  # and recording goes on
    assert len(env.buffer) == before[0] + 1


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: fe.FlexibleBuffer(num_steps=0), "num_steps"),
        (lambda: fe.FlexibleBuffer(gamma=1.5), "gamma"),
        (lambda: fe.FlexibleBuffer(gae_lambda=-0.1), "gae_lambda"),
        (lambda: fe.FlexibleBuffer(n_agents=2, agent_ids=["a"]), "agent_ids"),
        (lambda: fe.FlexibleBuffer(discrete_action_cardinalities=[3, 0]), "discrete_action_cardinalities"),
        (lambda: fe.record(gym.make("CartPole-v1"), num_steps=-5), "num_steps"),
        (lambda: fe.record(gym.make("CartPole-v1"), gamma=float("nan")), "gamma"),
        (lambda: fe.record(ToyEnv(spaces.Text(5))), "Text"),
        (
            lambda: fe.record(
                ToyEnv(action_space=spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(2)))))
            ),
            "Sequence",
        ),
    ],
)
def test_bad_settings_are_refused_by_name(make: Callable[[], Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()


@pytest.mark.parametrize("target", ["CartPole-v1", gym.spaces.Discrete(3), None, gym.make])
def test_record_names_the_kinds_it_accepts(target: Any) -> None:
    with pytest.raises(TypeError, match="gymnasium.Env.*VectorEnv.*ParallelEnv.*AECEnv"):
        fe.record(target)


def test_an_empty_buffer_says_it_is_empty() -> None:
    buffer = fe.FlexibleBuffer(obs_size=3, discrete_action_cardinalities=[2])
    for sample in (
        lambda: buffer.sample_transitions(4),
        lambda: buffer.sample_episodes(),
        lambda: buffer.sample_sequences(2, 2),
        lambda: next(buffer.minibatches(2)),
    ):
        with pytest.raises(fe.EmptyBufferError, match="holds no rows|holds 0"):
            sample()


class OddValues(gym.Env):
    """Box((3,)) observations and rewards as a test hands them out: the k-th step returns
    ``values[k]`` (an observation, a reward)."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, values: list[tuple[Any, Any]]) -> None:
        self.values, self.k = values, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward = self.values[self.k]
        self.k += 1
        return obs, reward, self.k == len(self.values), False, {}


GOOD = (np.full(3, 0.5, np.float32), 1.0)
KEPT: dict[str, tuple[Any, Any, np.ndarray, float]] = {  # obs, reward -> what a batch shows
    "outside the bounds": (np.full(3, 7.0, np.float32), 1.0, np.full(3, 7.0, np.float32), 1.0),
    "NaN": (np.array([np.nan, 0, 0], np.float32), 1.0, np.array([np.nan, 0, 0], np.float32), 1.0),
    "float64": (np.array([0.1, 0.2, 0.3]), 1.0, np.array([0.1, 0.2, 0.3], np.float32), 1.0),
    "int": (np.array([1, 0, -1]), 1.0, np.array([1, 0, -1], np.float32), 1.0),
    "a list": ([0.25, 0.5, 0.75], 1.0, np.array([0.25, 0.5, 0.75], np.float32), 1.0),
    "a 0-d array reward": (np.zeros(3, np.float32), np.array(2.5), np.zeros(3, np.float32), 2.5),
    "an integer reward": (np.zeros(3, np.float32), np.int64(3), np.zeros(3, np.float32), 3.0),
}
REFUSED: dict[str, tuple[Any, Any, str]] = {  # obs, reward -> what the error names
    "a scalar observation": (0.5, 1.0, r"shape \(3,\), got shape \(\)"),
    "a wrong shape": (np.zeros(4, np.float32), 1.0, r"got shape \(4,\)"),
    "a None observation": (None, 1.0, "numbers of shape"),
    "a text observation": ("0.1 0.2 0.3", 1.0, "numbers of shape"),
    "a text reward": (np.zeros(3, np.float32), "1.0", "reward must be a number"),
    "a None reward": (np.zeros(3, np.float32), None, "reward must be a number"),
}


@pytest.mark.parametrize("case", list(KEPT))
def test_odd_numbers_from_the_env_are_recorded_as_given(case: str) -> None:
    obs, reward, shown, shown_reward = KEPT[case]
    env = fe.record(OddValues([GOOD, (obs, reward), GOOD]), num_steps=10)
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.obs_[1], shown)
    np.testing.assert_array_equal(batch.obs[2], shown)
    assert batch.individual_rewards[1] == shown_reward and env.buffer.n_episodes == 1


@pytest.mark.parametrize("case", list(REFUSED))
def test_values_the_space_cannot_hold_are_refused_and_the_episode_kept(case: str) -> None:
    obs, reward, says = REFUSED[case]
    env = fe.record(OddValues([GOOD, GOOD, (obs, reward), GOOD]), num_steps=10)
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    with pytest.raises(fe.EnvValueError, match=says):
        env.step(0)
    (episode,) = env.buffer.sample_episodes(n_episodes=1)  # the two whole steps, ended as truncated
    assert len(episode) == 2 and episode.truncated[-1] and len(env.buffer) == 2
    np.testing.assert_array_equal(episode.obs_, [GOOD[0], GOOD[0]])


def test_a_ring_that_cannot_be_reserved_names_num_steps_and_what_fits() -> None:
    """pistonball's frames are 9 MB a row: a ring this machine cannot reserve is one error that
    says how many rows would fit, not numpy's MemoryError about bytes."""
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import pistonball_v6

    with pytest.raises(fe.BufferMemoryError, match=r"num_steps=1,000,000,000 rows .* rows per lane fit .*num_steps"):
        fe.record(pistonball_v6.parallel_env(), num_steps=10**9)
    assert issubclass(fe.BufferMemoryError, MemoryError)
