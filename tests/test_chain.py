"""The chain (next values stored once) against a plain model that keeps ``obs`` and ``obs_`` of
every row apart, for any sequence of holds, writes, sat-out steps, given-back rows, episode ends
and ring wraps, over two lanes of two agents. As in a recorder, a step given back ends its
episode and the next one begins (a reset). What it holds then goes through the stored form: a
file, read and mapped, and its whole episodes moved to another buffer."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from flexibuff_envs.index import episode_table
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.sampling.samplers import live_rows
from flexibuff_envs.spec.observations import obs_codec

AGENTS, LANES, CAPACITY, WIDTH = 2, 2, 7, 3

STEP = st.tuples(st.just("step"), st.integers(0, LANES - 1), st.lists(st.booleans(), min_size=AGENTS, max_size=AGENTS))
OPS = st.lists(
    st.one_of(  # steps most often; "end" closes the episode and begins the next
        STEP,
        STEP,
        STEP,
        st.tuples(st.just("sit"), st.integers(0, LANES - 1), st.integers(0, AGENTS - 1)),
        st.tuples(st.just("undo"), st.integers(0, LANES - 1)),
        st.tuples(st.just("end"), st.integers(0, LANES - 1)),
    ),
    min_size=10,
    max_size=80,
)


class Model:
    """What each row's obs and obs_ are, kept apart, per agent."""

    def __init__(self) -> None:
        self.obs: dict[tuple[int, int], np.ndarray] = {}
        self.obs_: dict[tuple[int, int], np.ndarray] = {}
        self.held: dict[tuple[int, int], np.ndarray] = {}  # (lane, agent) -> value held
        self.last: dict[tuple[int, int], int] = {}  # (lane, agent) -> its latest row this episode


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_chain_reads_every_live_row_as_a_plain_model_does(ops: list[tuple[Any, ...]]) -> None:
    buffer = fe.FlexibleBuffer(CAPACITY, WIDTH, n_agents=AGENTS, n_envs=LANES)  # small: rings wrap
    codec = obs_codec(spaces.Box(-1e9, 1e9, (WIDTH,), np.float32))
    writer = Writer(buffer, buffer)  # what a recorder writes through
    holders = {(lane, a): writer.holder("obs_", codec, a, lane) for lane in range(LANES) for a in range(AGENTS)}
    model, running, counter = Model(), [False] * LANES, iter(range(1, 10**6))
    undo: list[Any] = [None] * LANES  # what the lane's last step changed, to give it back

    def fresh() -> np.ndarray:
        return np.full(WIDTH, next(counter), dtype=np.float32)

    for op in [("begin", 0), ("begin", 1), *ops]:
        kind, lane = op[0], op[1]
        if kind == "end":
            buffer.end_episode(lane)
            kind = "begin"
        if kind == "begin":
            buffer.begin_episode(lane)
            for a in range(AGENTS):
                value = fresh()
                holders[lane, a].hold(value)
                model.held[lane, a] = value
                model.last.pop((lane, a), None)
            running[lane], undo[lane] = True, None
        elif kind == "step" and running[lane]:
            row = writer.claim_cleared_row(lane)
            for a in range(AGENTS):  # a row the ring hands out again is no agent's last row any more
                if model.last.get((lane, a)) == row:
                    del model.last[lane, a]
            before = (
                {k: v for k, v in model.held.items() if k[0] == lane},
                {k: v for k, v in model.last.items() if k[0] == lane},
            )
            for a in range(AGENTS):
                model.obs[row, a] = model.obs_[row, a] = np.zeros(WIDTH, np.float32)  # a cleared row
                if op[2][a]:
                    value = fresh()
                    holders[lane, a].write(row, value)
                    model.obs[row, a], model.obs_[row, a] = model.held[lane, a], value
                    model.held[lane, a], model.last[lane, a] = value, row
            undo[lane] = (row, [a for a in range(AGENTS) if op[2][a]], *before)
        elif kind == "sit" and running[lane] and (lane, op[2]) in model.last:
            value, a = fresh(), op[2]
            holders[lane, a].replace(value)  # its last transition runs on: this is its obs_ now
            model.obs_[model.last[lane, a], a] = model.held[lane, a] = value
            undo[lane] = None  # a sit-out is not given back
        elif kind == "undo" and running[lane] and undo[lane] is not None:
            row, wrote, held_before, last_before = undo[lane]
            for a in wrote:
                holders[lane, a].undo(row)
            writer.unclaim_row(lane)
            model.held.update(held_before)
            for a in range(AGENTS):
                model.last.pop((lane, a), None)
            model.last.update(last_before)
            undo[lane] = None
            buffer.end_episode(lane)  # as a recorder does after a step it gives back; a reset follows
            for a in range(AGENTS):
                value = fresh()
                holders[lane, a].hold(value)
                model.held[lane, a] = value
                model.last.pop((lane, a), None)
            buffer.begin_episode(lane)
    if not len(buffer):
        return
    rows = live_rows(buffer._index.read())
    batch = buffer.gather(rows)
    for k, row in enumerate(rows.tolist()):
        for a in range(AGENTS):
            np.testing.assert_array_equal(batch.obs[a, k], model.obs[row, a], err_msg=f"obs row {row} agent {a}")
            np.testing.assert_array_equal(batch.obs_[a, k], model.obs_[row, a], err_msg=f"obs_ row {row} agent {a}")
    chain = buffer._store.chains["obs_"]
    named = chain.index[..., rows].ravel()
    named = named[named > 0]
    assert np.unique(named).size == named.size  # no stored slot read by two rows
    # the stored form carries every row as it was: a file, read and mapped, then whole episodes moved
    with tempfile.TemporaryDirectory() as directory:
        path = buffer.save(os.path.join(directory, "chain.fbuf"))
        for mmap in (False, True):
            loaded = fe.FlexibleBuffer.load(path, mmap=mmap).gather(rows)
            np.testing.assert_array_equal(loaded.obs, batch.obs)
            np.testing.assert_array_equal(loaded.obs_, batch.obs_)
    ended = episode_table(buffer._index.read()).all_rows()[0]
    chunk = buffer.take_episodes()
    learner = fe.FlexibleBuffer(100, WIDTH, n_agents=AGENTS)
    assert learner.extend(chunk) == chunk.n_episodes
    moved = learner.gather(live_rows(learner._index.read()))
    for k, row in enumerate(ended.tolist()):
        for a in range(AGENTS):
            np.testing.assert_array_equal(moved.obs[a, k], model.obs[row, a], err_msg=f"moved obs row {row} agent {a}")
            np.testing.assert_array_equal(
                moved.obs_[a, k], model.obs_[row, a], err_msg=f"moved obs_ row {row} agent {a}"
            )
