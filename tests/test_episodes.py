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
from flexibuff_envs.episodes import Ended, Episode

ENDED_OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("extend"), st.lists(st.integers(1, 5), max_size=40)),
    st.tuples(st.just("drop"), st.integers(0, 30)),
    st.tuples(st.just("running"), st.integers(0, 5)),
    st.tuples(st.just("clear"),),
), max_size=60)


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
            del model[:op[1]]
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
