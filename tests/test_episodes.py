"""A lane's ended episodes kept as arrays (`Ended`) against a plain list, and a buffer's episode
index through thousands of short episodes in a ring that wraps."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from flexibuff_envs.index.ended import Ended, Episode
from flexibuff_envs.index.lanes import span_rows

ENDED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5), st.booleans()),
        st.tuples(st.just("extend"), st.lists(st.integers(1, 5), max_size=40)),
        st.tuples(st.just("drop"), st.integers(0, 30)),
        st.tuples(st.just("running"), st.integers(0, 5)),
        st.tuples(
            st.just("clear"),
        ),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ENDED_OPS)
def test_ended_episodes_hold_what_a_list_holds_as_they_grow_shift_and_drop(ops: list[tuple[Any, ...]]) -> None:
    ended, model, end = Ended(), [], 0
    for op in ops:
        if op[0] == "append":
            ended.append(Episode(end, end + op[1], op[2]))
            model.append((end, end + op[1], op[2]))
            end += op[1]
        elif op[0] == "extend":
            ends = end + np.cumsum(op[1], dtype=np.int64)
            ended.extend(ends - np.array(op[1], dtype=np.int64), ends)
            model += [(int(e - n), int(e), True) for e, n in zip(ends, op[1])]
            end = int(ends[-1]) if op[1] else end
        elif op[0] == "drop":
            ended.drop(op[1])
            del model[: op[1]]
        elif op[0] == "running":  # the running episode after the newest, as a lane's bounds show it
            starts, ends_ = ended.with_running(Episode(end, end + op[1]))
            assert starts.tolist() == [s for s, _, _ in model] + [end]
            assert ends_.tolist() == [e for _, e, _ in model] + [end + op[1]]
        else:
            ended.clear()
            model = []
        assert [(e.start, e.end, e.whole) for e in ended] == model
        assert len(ended) == len(model) and bool(ended) == bool(model)
        if model:
            assert (ended[0].start, ended[-1].end) == (model[0][0], model[-1][1])
        assert ended.starts.tolist() == [s for s, _, _ in model]
        assert ended.whole.tolist() == [w for _, _, w in model]
    with pytest.raises(IndexError):
        ended[len(model)]


def test_thousands_of_short_episodes_through_a_wrapping_ring_keep_the_index_right() -> None:
    """CartPole episodes into a 500-row ring, 40 times over: the buffer's episodes are the
    newest whole ones, each the rows its steps were recorded in, and nothing older."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=500)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    lengths = []
    steps = 0
    while steps < 20_000:
        _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        steps += 1
        if terminated or truncated:
            lengths.append(steps - sum(lengths))
            env.reset()
    held = [len(e) for e in env.buffer.episodes()]
    kept = []
    for n in reversed(lengths):  # the newest ones that fit beside the running episode's rows
        if sum(kept) + n > 500 - (steps - sum(lengths)):
            break
        kept.insert(0, n)
    assert held == kept
    assert env.buffer.n_episodes == len(kept)


def test_episode_stats_are_the_rewards_the_env_gave_each_agent_over_the_episodes_held() -> None:
    """simple_spread's three agents, episodes of 10 steps into a 45-row ring that wraps: lengths
    and per-agent returns of the held episodes equal sums a plain loop took from the env."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=45, record_state=False)
    returns = []
    for episode in range(9):
        env.reset(seed=episode)
        total = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            _, rewards, _, _, _ = env.step({a: env.action_space(a).sample() for a in env.agents})
            for agent, reward in rewards.items():
                total[agent] += float(np.float32(reward))  # as stored
        returns.append([total[a] for a in env.possible_agents])
    stats = env.buffer.episode_stats()
    assert stats["lengths"].tolist() == [10] * 4  # the newest that fit 45 rows
    np.testing.assert_allclose(stats["returns"], returns[-4:], rtol=1e-6)


def test_sample_episodes_keeps_within_max_batch_size_with_whole_episodes_in_recording_order() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=5_000, seed=3)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(3_000):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        if terminated or truncated:
            env.reset()
    held = {int(e.idx[0]): len(e) for e in env.buffer.episodes()}
    for budget in (1, 60, 300):
        episodes = env.buffer.sample_episodes(max_batch_size=budget)
        total = sum(len(e) for e in episodes)
        assert total <= budget or len(episodes) == 1
        assert len({int(e.idx[0]) for e in episodes}) == len(episodes)
        firsts = [int(e.idx[0]) for e in episodes]
        assert firsts == sorted(firsts)  # in recording order (this ring has not wrapped)
        for e in episodes:
            assert held[int(e.idx[0])] == len(e) and (np.diff(e.idx) == 1).all()
            assert e.terminated[-1] or e.truncated[-1]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(-3, 9)), max_size=12))
def test_span_rows_are_each_ranges_rows_in_time_order_across_the_lanes_end(
    capacity: int, ranges: list[tuple[int, int, int]]
) -> None:
    """Ranges of lane positions (some wrapping around their lane's end, some empty) as buffer rows,
    against a plain loop over the positions."""
    lanes = np.array([lane for lane, _, _ in ranges], dtype=np.int64)
    starts = np.array([start for _, start, _ in ranges], dtype=np.int64)
    ends = starts + np.array([min(length, capacity) for _, _, length in ranges], dtype=np.int64)
    expected = [lane * capacity + p % capacity for lane, s, e in zip(lanes, starts, ends) for p in range(s, e)]
    assert span_rows(lanes * capacity, capacity, starts, ends).tolist() == expected
