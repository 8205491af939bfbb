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
    return (len(buffer), buffer.n_episodes, sorted(name for name, _ in buffer._storage),
            {name: array.tobytes() for name, array in buffer._storage})


BAD_CALLS: dict[str, tuple[Callable[[fe.GymRecorder, Path], Any], type[Exception], str]] = {
    "annotate unknown field": (lambda env, _: env.annotate(value=1.0), ValueError, "value"),
    "annotate wrong shape": (lambda env, _: env.annotate(values=np.ones(3)), ValueError, "values"),
    "sample 0 transitions": (lambda env, _: env.buffer.sample_transitions(0), ValueError, "batch_size"),
    "sample rows that are not rows": (lambda env, _: env.buffer.sample_transitions(idx=np.array([3, 9999])),
                                      ValueError, "idx"),
    "sample float rows": (lambda env, _: env.buffer.sample_transitions(idx=np.array([0.5])), ValueError, "idx"),
    "more episodes than held": (lambda env, _: env.buffer.sample_episodes(n_episodes=10_000), fe.EmptyBufferError,
                                "10000 whole episodes"),
    "sequences of length 0": (lambda env, _: env.buffer.sample_sequences(4, 0), ValueError, "seq_len"),
    "minibatches of 0": (lambda env, _: next(env.buffer.minibatches(0)), ValueError, "batch_size"),
    "weights of the wrong shape": (lambda env, _: env.buffer.set_memory_weights(np.arange(3), np.ones(4)),
                                   ValueError, "weights"),
    "negative weights": (lambda env, _: env.buffer.set_memory_weights(np.arange(3), -1.0), ValueError, "weights"),
    "feedback on a step never taken": (lambda env, _: env.add_feedback(1.0, step=10_000), ValueError, "step=10000"),
    "a recorder with another env's buffer": (lambda env, _: fe.record(gym.make("Pendulum-v1"), buffer=env.buffer),
                                             fe.SpecMismatchError, "obs_size"),
    "a recorder with another gamma": (lambda env, _: fe.record(gym.make("CartPole-v1"), buffer=env.buffer, gamma=0.5),
                                      fe.SpecMismatchError, "gamma"),
    "save onto a directory": (lambda env, tmp: env.buffer.save(tmp), IsADirectoryError, "Is a directory"),
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


@pytest.mark.parametrize(("make", "words"), [
    (lambda: fe.FlexibleBuffer(num_steps=0), "num_steps"),
    (lambda: fe.FlexibleBuffer(gamma=1.5), "gamma"),
    (lambda: fe.FlexibleBuffer(gae_lambda=-0.1), "gae_lambda"),
    (lambda: fe.FlexibleBuffer(n_agents=2, agent_ids=["a"]), "agent_ids"),
    (lambda: fe.FlexibleBuffer(discrete_action_cardinalities=[3, 0]), "discrete_action_cardinalities"),
    (lambda: fe.record(gym.make("CartPole-v1"), num_steps=-5), "num_steps"),
    (lambda: fe.record(gym.make("CartPole-v1"), gamma=float("nan")), "gamma"),
    (lambda: fe.record(ToyEnv(spaces.Text(5))), "Text"),
    (lambda: fe.record(ToyEnv(action_space=spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(2)))))),
     "Sequence"),
])
def test_bad_settings_are_refused_by_name(make: Callable[[], Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()


@pytest.mark.parametrize("target", ["CartPole-v1", gym.spaces.Discrete(3), None, gym.make])
def test_record_names_the_kinds_it_accepts(target: Any) -> None:
    with pytest.raises(TypeError, match="gymnasium.Env.*VectorEnv.*ParallelEnv.*AECEnv"):
        fe.record(target)


def test_an_empty_buffer_says_it_is_empty() -> None:
    buffer = fe.FlexibleBuffer(obs_size=3, discrete_action_cardinalities=[2])
    for sample in (lambda: buffer.sample_transitions(4), lambda: buffer.sample_episodes(),
                   lambda: buffer.sample_sequences(2, 2), lambda: next(buffer.minibatches(2))):
        with pytest.raises(fe.EmptyBufferError, match="holds no rows|holds 0"):
            sample()
