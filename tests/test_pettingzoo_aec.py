"""The AEC recorder against a plain loop over the bare env with the same seeds and actions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.testing.pz_reference import play_aec, replay_aec

pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")
from mpe2 import simple_speaker_listener_v4, simple_spread_v3
from pettingzoo.classic import (
    connect_four_v3,
    hanabi_v5,
    leduc_holdem_v4,
    rps_v2,
    texas_holdem_no_limit_v6,
    tictactoe_v3,
)
from pettingzoo.test import api_test
from pettingzoo.utils import BaseWrapper

from flexibuff_envs.testing import same

GAMMA = 0.9
CASES: dict[str, tuple[Callable[[], Any], int]] = {  # make, episodes
    "tictactoe_v3": (tictactoe_v3.env, 6),
    "connect_four_v3": (connect_four_v3.env, 4),
    "leduc_holdem_v4": (leduc_holdem_v4.env, 8),
    "texas_holdem_no_limit_v6": (texas_holdem_no_limit_v6.env, 12),
    "rps_v2": (lambda: rps_v2.env(num_actions=3, max_cycles=5), 3),
    "simple_speaker_listener_v4": (lambda: simple_speaker_listener_v4.env(max_cycles=6), 2),
}


@pytest.mark.parametrize("call_last", [True, False], ids=["last", "no-last"])
@pytest.mark.parametrize("name", list(CASES))
def test_every_recorded_field_equals_the_reference(name: str, call_last: bool) -> None:
    make, episodes = CASES[name]
    expected = play_aec(make(), seed=3, episodes=episodes)
    env = fe.record(make(), num_steps=500, gamma=GAMMA)
    replay_aec(env, 3, episodes, expected.actions, call_last=call_last)
    buffer = env.buffer
    rows = expected.rewards.shape[1]
    assert len(buffer) == rows and buffer.n_episodes == episodes
    batch = buffer.sample_transitions(idx=np.arange(rows))
    np.testing.assert_array_equal(batch.active, expected.active)
    np.testing.assert_array_equal(batch.obs, expected.obs)
    np.testing.assert_array_equal(batch.obs_, expected.obs_)
    np.testing.assert_array_equal(batch.discrete_actions, expected.discrete)
    np.testing.assert_allclose(batch.individual_rewards, expected.rewards)
    np.testing.assert_allclose(batch.global_rewards, expected.rewards.sum(axis=0), atol=1e-6)
    np.testing.assert_array_equal(batch.terminated, expected.terminated)
    np.testing.assert_array_equal(batch.truncated, expected.truncated)
    if expected.mask is not None:
        np.testing.assert_array_equal(np.concatenate(batch.action_mask, axis=-1), expected.mask)
        np.testing.assert_array_equal(np.concatenate(batch.action_mask_, axis=-1), expected.mask_)
    np.testing.assert_allclose(batch.G, expected.G(GAMMA), rtol=1e-5, atol=1e-5)
    episodes_out = buffer.sample_episodes(n_episodes=episodes)
    assert [len(e) for e in episodes_out] == [end - start for start, end in expected.episodes]


def test_tictactoe_winner_and_loser_rewards_land_on_their_last_moves() -> None:
    env = fe.record(tictactoe_v3.env())
    env.reset(seed=0)
    # player_1 takes the left column (0, 1, 2); player_2 plays 3 and 4
    moves = iter([0, 3, 1, 4, 2])
    for agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else next(moves))
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert len(episode) == 3  # player_1 moved three times, player_2 twice
    p1, p2 = env.buffer_spec.agent_ids.index("player_1"), env.buffer_spec.agent_ids.index("player_2")
    assert episode.individual_rewards[p1].tolist() == [0, 0, 1]
    assert episode.individual_rewards[p2].tolist() == [0, -1, 0]
    assert episode.active[p2].tolist() == [True, True, False]
    assert episode.terminated[p1, 2] and episode.terminated[p2, 1]
    assert episode.discrete_actions[p1, :, 0].tolist() == [0, 1, 2]
    np.testing.assert_allclose(episode.G[p1], [0.99**2, 0.99, 1])
    np.testing.assert_allclose(episode.G[p2, :2], [-0.99, -1])
    # the mask after player_1's first move no longer allows square 0 (taken)
    assert not episode.action_mask_[0][p1, 0, 0] and episode.action_mask[0][p1, 0, 0]


def test_rps_has_no_state_and_records_fine() -> None:
    env = fe.record(rps_v2.env())
    assert env.buffer_spec.state_size is None
    env.reset(seed=0)
    for agent in env.agent_iter(max_iter=6):
        env.step(1)
    assert len(env.buffer) == 2


def test_aec_state_rows_chain() -> None:
    env = fe.record(simple_spread_v3.env(max_cycles=4), num_steps=50)
    env.reset(seed=0)
    first = env.state()
    for agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else 0)
    batch = env.buffer.sample_transitions(idx=np.arange(len(env.buffer)))
    np.testing.assert_array_equal(batch.state[0], first)
    np.testing.assert_array_equal(batch.state[1:], batch.state_[:-1])


@pytest.mark.parametrize(
    "make",
    [
        tictactoe_v3.env,
        connect_four_v3.env,
        leduc_holdem_v4.env,
        rps_v2.env,
        simple_spread_v3.env,
        simple_speaker_listener_v4.env,
    ],
)
def test_api_test_passes_on_the_wrapped_env(make: Callable[[], Any]) -> None:
    env = fe.record(make(), num_steps=5000)
    api_test(env, num_cycles=200)
    assert len(env.buffer) > 0


def bare_totals(make: Callable[[], Any], episodes: int) -> tuple[np.ndarray, list[Any], int]:
    """A plain loop: per episode and agent, the sum of env.rewards after every step; the actions
    taken (random legal ones); and how many agents were rewarded before their first turn."""
    bare, rng = make(), np.random.default_rng(0)
    totals, actions, early = [], [], 0
    for episode in range(episodes):
        bare.reset(seed=episode)
        total = dict.fromkeys(bare.possible_agents, 0.0)
        acted: set[str] = set()
        for agent in bare.agent_iter():
            obs, _, terminated, truncated, _ = bare.last()
            early += agent not in acted and total[agent] != 0.0
            action = None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"])))
            if action is not None:
                acted.add(agent)
            actions.append(action)
            bare.step(action)
            for a, r in bare.rewards.items():
                total[a] += r
        totals.append([total[a] for a in bare.possible_agents])
    return np.array(totals), actions, early


@pytest.mark.parametrize(
    ("make", "episodes"),
    [(texas_holdem_no_limit_v6.env, 100), (lambda: hanabi_v5.env(players=2), 30)],
    ids=["texas_holdem_no_limit_v6", "hanabi_v5"],
)
def test_no_reward_is_lost_rewards_before_a_first_turn_included(make: Callable[[], Any], episodes: int) -> None:
    """Poker: some hands are folded before a player ever acts, and its winnings must still be in
    the buffer. Hanabi: a teammate's successful play lands before one's first turn. Per episode
    and agent, the recorded rewards sum to what the bare loop's env.rewards summed to."""
    totals, actions, early = bare_totals(make, episodes)
    assert early > 0  # the case this test is about happens
    env = fe.record(make(), num_steps=20_000)
    replay_aec(env, 0, episodes, actions)
    np.testing.assert_allclose(env.buffer.episode_stats()["returns"], totals, atol=1e-5)
    for episode in env.buffer.sample_episodes(n_episodes=episodes):
        assert np.isnan(episode.G[~episode.active]).all()  # a reward kept without a turn is no transition
        first = episode.G[:, 0]  # G from each agent's first turn includes what came before it
        plain = [
            sum(r * 0.99**k for k, r in enumerate(rewards[active]))
            for rewards, active in zip(episode.individual_rewards, episode.active)
        ]
        np.testing.assert_allclose(first[episode.active[:, 0]], np.array(plain)[episode.active[:, 0]], rtol=1e-5)


class TenfoldRewards(BaseWrapper):
    """A user's inner wrapper whose last() changes the reward."""

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().last(observe)
        return obs, 10 * reward, terminated, truncated, info


class NoInfos(BaseWrapper):
    """A user's inner wrapper that hides the env's infos (last() reads them through it)."""

    @property
    def infos(self) -> dict:
        return {agent: {"wrapped": True} for agent in self.env.possible_agents}


class ShapedInStep(BaseWrapper):
    """A user's inner wrapper that keeps rewards of its own, assigned in reset() and step() (as
    SuperSuit's reward_lambda_v0 does): the attributes exist only once the env was reset."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        super().reset(seed=seed, options=options)
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}

    def step(self, action: Any) -> None:
        acting = self.agent_selection
        super().step(action)
        self.rewards = {agent: 10 * reward + 0.5 for agent, reward in self.env.rewards.items()}
        self._cumulative_rewards[acting] = 0.0
        for agent, reward in self.rewards.items():
            self._cumulative_rewards[agent] = self._cumulative_rewards.get(agent, 0.0) + reward


def supersuit_shaped(env: Any) -> Any:
    ss = pytest.importorskip("supersuit")
    return ss.reward_lambda_v0(env, lambda reward: 10 * reward + 0.5)


@pytest.mark.parametrize("wrapper", [TenfoldRewards, NoInfos, ShapedInStep, supersuit_shaped])
def test_inner_wrappers_are_honoured(wrapper: Callable[[Any], Any]) -> None:
    expected = play_aec(wrapper(tictactoe_v3.env()), seed=1, episodes=4)
    env = fe.record(wrapper(tictactoe_v3.env()), num_steps=100, gamma=GAMMA)
    bare = wrapper(tictactoe_v3.env())
    taken, mirrored = iter(expected.actions), iter(expected.actions)
    for episode in range(4):  # the recorded env's last() is the wrapped bare env's
        env.reset(seed=1 + episode)
        bare.reset(seed=1 + episode)
        for agent, other in zip(env.agent_iter(), bare.agent_iter()):
            assert agent == other
            assert same(env.last(), bare.last())
            env.step(next(taken))
            bare.step(next(mirrored))
    batch = env.buffer.sample_transitions(idx=np.arange(expected.rewards.shape[1]))
    np.testing.assert_allclose(batch.individual_rewards, expected.rewards)
    np.testing.assert_allclose(batch.G, expected.G(GAMMA), rtol=1e-5, atol=1e-6)
    if wrapper is TenfoldRewards:
        assert np.abs(batch.individual_rewards).max() == 10
    if wrapper in (ShapedInStep, supersuit_shaped):  # the shaped rewards (+0.5 a step) were recorded
        assert (batch.individual_rewards[batch.active] % 1 == 0.5).any()
