"""Faults: an env that raises, returns what its spaces forbid, or gives NaN rewards never leaves the
buffer inconsistent; earlier episodes sample as recorded and recording resumes at the next reset."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3
from pettingzoo.classic import connect_four_v3
from pettingzoo.utils import BaseParallelWrapper

import flexibuff_envs as fe
from flexibuff_envs.testing.reference import plain_returns

GAMMA = 0.9


class Flaky(gym.Wrapper):
    """CartPole that fails on chosen calls: ``step`` number ``fail_step`` raises (or returns an
    observation of the wrong shape with ``bad_obs``), ``reset`` number ``fail_reset`` raises."""

    def __init__(self, fail_step: int = -1, fail_reset: int = -1, bad_obs: bool = False) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.fail_step, self.fail_reset, self.bad_obs = fail_step, fail_reset, bad_obs
        self.steps = self.resets = 0

    def reset(self, **kwargs: Any) -> Any:
        self.resets += 1
        if self.resets == self.fail_reset:
            raise RuntimeError("simulator crashed in reset")
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.steps += 1
        result = self.env.step(action)
        if self.steps == self.fail_step:
            if not self.bad_obs:
                raise RuntimeError("simulator crashed in step")
            return (np.zeros(7, np.float32), *result[1:])
        return result


def episodes_of(buffer: fe.FlexibleBuffer) -> list[fe.FlexiBatch]:
    return list(buffer.episodes())


def assert_consistent(buffer: fe.FlexibleBuffer) -> None:
    """Every episode is whole: one end flag, at its last row, and G equal to a plain loop."""
    for episode in episodes_of(buffer):
        flags = episode.terminated | episode.truncated
        assert flags[-1] and not flags[:-1].any()
        np.testing.assert_allclose(
            episode.G, plain_returns(list(episode.individual_rewards), GAMMA), rtol=1e-5, atol=1e-5
        )


def failing_bootstrap(obs_: np.ndarray) -> float:
    """A value function that fails on the third episode's truncation (step 30)."""
    failing_bootstrap.calls += 1  # type: ignore[attr-defined]
    if failing_bootstrap.calls == 3:  # type: ignore[attr-defined]
        raise RuntimeError("value network failed")
    return 0.0


def run_with_fault(fault: str) -> tuple[fe.FlexibleBuffer, list[tuple[list, list]], int, list[str]]:
    """120 steps; on a fault, reset and go on as a training loop would. Returns the buffer, the
    ended episodes' observations and rewards as the env gave them, the running episode's steps,
    and the notes on the errors. The "bootstrap" fault fails after the step's observation was
    written: the row is given back and the previous row's next observation must survive."""
    if fault == "bootstrap":
        failing_bootstrap.calls = 0  # type: ignore[attr-defined]
        env = fe.record(
            gym.make("CartPole-v1", max_episode_steps=10), num_steps=1000, gamma=GAMMA, bootstrap_fn=failing_bootstrap
        )
    else:
        env = fe.record(Flaky(fail_step=30, bad_obs=fault == "bad_obs"), num_steps=1000, gamma=GAMMA)
    notes: list[str] = []
    episodes: list[tuple[list, list]] = []
    obs, _ = env.reset(seed=0)
    current: tuple[list, list] = ([obs], [])
    for t in range(120):
        try:
            obs, reward, terminated, truncated, _ = env.step(t % 2)
        except (RuntimeError, ValueError) as error:
            notes += getattr(error, "__notes__", [])
            episodes.append(current)  # kept up to its last whole step
            obs, _ = env.reset()
            current = ([obs], [])
            continue
        current[0].append(obs)
        current[1].append(reward)
        if terminated or truncated:
            episodes.append(current)
            obs, _ = env.reset()
            current = ([obs], [])
    return env.buffer, episodes, len(current[1]), notes


@pytest.mark.parametrize("fault", ["raise", "bad_obs", "bootstrap"])
def test_the_buffer_holds_exactly_the_steps_that_happened(fault: str) -> None:
    buffer, episodes, running, notes = run_with_fault(fault)
    recorded = episodes_of(buffer)
    assert len(recorded) == len(episodes)
    for batch, (obs, rewards) in zip(recorded, episodes):
        np.testing.assert_array_equal(batch.obs, np.array(obs[:-1]))
        np.testing.assert_array_equal(batch.obs_, np.array(obs[1:]))
        np.testing.assert_allclose(batch.individual_rewards, rewards)
    assert_consistent(buffer)
    assert len(buffer) == sum(len(r) for _, r in episodes) + running
    # the interrupted episode ends as truncated at its last good step
    interrupted = recorded[
        next(i for i, (_, r) in enumerate(episodes) if sum(len(x) for _, x in episodes[: i + 1]) >= 29)
    ]
    assert interrupted.truncated[-1] and not interrupted.terminated[-1]
    if fault != "raise":  # the recorder's own error says what happened to the episode
        assert any("not recorded" in note and "next reset" in note for note in notes)


def test_a_failing_reset_changes_nothing() -> None:
    env = fe.record(Flaky(fail_reset=3), num_steps=1000, gamma=GAMMA)
    env.reset(seed=0)
    for t in range(200):
        _, _, terminated, truncated, _ = env.step(t % 2)
        if terminated or truncated:
            try:
                env.reset()
            except RuntimeError:
                break
    before = (len(env.buffer), env.buffer.n_episodes)
    assert before[1] == 2
    env.reset()
    env.step(0)
    assert env.buffer.n_episodes == 2 and len(env.buffer) == before[0] + 1
    assert_consistent(env.buffer)


def test_nan_and_inf_rewards_are_kept_and_poison_no_other_episode() -> None:
    given = iter([1.0, np.nan, 1.0, 2.0, np.inf] + [1.0] * 1000)
    env = fe.record(
        gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: next(given)), num_steps=1000, gamma=GAMMA
    )
    env.reset(seed=0)
    for t in range(200):
        _, _, terminated, truncated, _ = env.step(t % 2)
        if terminated or truncated:
            env.reset()
    first, *others = episodes_of(env.buffer)
    assert np.isnan(first.individual_rewards[1]) and np.isinf(first.individual_rewards[4])
    assert np.isnan(first.G[:2]).all() and np.isinf(first.G[2:5]).all() and np.isfinite(first.G[5:]).all()
    for episode in others:
        np.testing.assert_allclose(episode.G, plain_returns(list(episode.individual_rewards), GAMMA), rtol=1e-5)


class FlakyParallel(BaseParallelWrapper):
    """simple_spread whose ``fail``-th step gives one agent an observation of the wrong size."""

    def __init__(self, fail: int) -> None:
        super().__init__(simple_spread_v3.parallel_env(max_cycles=10))
        self.fail, self.calls = fail, 0

    def step(self, actions: dict) -> Any:
        self.calls += 1
        obs, *rest = self.env.step(actions)
        if self.calls == self.fail:
            obs = {**obs, "agent_1": np.zeros(3, np.float32)}
        return (obs, *rest)


def test_a_parallel_step_that_fails_for_one_agent_leaves_no_half_row() -> None:
    env = fe.record(FlakyParallel(fail=14), num_steps=500, gamma=GAMMA)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    failures = 0
    for _ in range(40):
        actions = {a: int(rng.integers(5)) for a in env.agents}
        try:
            env.step(actions)
        except ValueError:
            failures += 1
            env.reset()
            continue
        if not env.agents:
            env.reset()
    assert failures == 1
    # episodes of 10 steps: the first whole, the second cut after 3 good steps, then whole ones
    episodes = episodes_of(env.buffer)
    assert [e.active.shape[1] for e in episodes][:3] == [10, 3, 10]
    assert episodes[1].truncated[:, -1].all() and not episodes[1].terminated.any()
    assert np.isfinite(episodes[1].G).all() and episodes[1].active.all()


def test_an_aec_step_that_raises_starts_no_transition() -> None:
    env = fe.record(connect_four_v3.env(), num_steps=500, gamma=GAMMA)
    env.reset(seed=0)
    env.step(3)  # player_0
    env.step(3)  # player_1
    with pytest.raises(Exception):  # noqa: B017 (whatever the env raises for an impossible column)
        env.step(99)
    env.step(4)  # player_0 plays a legal move instead
    for agent in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        mask = obs["action_mask"]
        env.step(None if terminated or truncated else int(np.flatnonzero(mask)[0]))
    episode = env.buffer.sample_episodes(n_episodes=1)[0]
    # player_0's second transition is the move that happened (column 4), not the refused one
    assert episode.discrete_actions[0, 1, 0] == 4
    assert (episode.terminated | episode.truncated)[:, -1].any()
