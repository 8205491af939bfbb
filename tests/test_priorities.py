"""Prioritized replay: rows drawn in proportion to priority ** alpha, importance weights by the
formula, new rows at the highest priority, forgotten rows never drawn."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe


def filled(rows: int, lanes: int = 1, episode: int = 5, **options: object) -> fe.FlexibleBuffer:
    buffer = fe.FlexibleBuffer(rows, 2, [2], n_envs=lanes, seed=0, **options)
    for lane in range(lanes):
        for _ in range(rows // episode):
            buffer.begin_episode(lane)
            for _ in range(episode):
                buffer.claim_row(lane)
            buffer.end_episode(lane)
    return buffer


def live(buffer: fe.FlexibleBuffer) -> np.ndarray:
    return np.sort(np.concatenate([b.idx for b in buffer.minibatches(1000, shuffle=False)]))


def test_rows_are_drawn_in_proportion_to_priority_to_the_alpha() -> None:
    buffer = filled(40, lanes=2, alpha=0.7)
    rows = live(buffer)
    priorities = np.random.default_rng(1).uniform(0.1, 5.0, rows.size)
    buffer.update_priorities(rows, priorities)
    drawn = buffer.sample_transitions(200_000, prioritized=True).idx
    counts = np.bincount(drawn, minlength=80)[rows]
    expected = priorities**0.7 / (priorities**0.7).sum() * drawn.size
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 2 * rows.size + 30  # a proportion to priority itself (alpha 1) adds thousands


def test_importance_weights_follow_the_formula_over_the_live_rows() -> None:
    buffer = filled(20, alpha=0.6)
    rows = live(buffer)
    priorities = np.linspace(0.5, 3.0, rows.size)
    buffer.update_priorities(rows, priorities)
    batch = buffer.sample_transitions(500, prioritized=True, beta=0.4)
    p = priorities**0.6 / (priorities**0.6).sum()
    w = (rows.size * p) ** -0.4
    expected = dict(zip(rows.tolist(), (w / w.max()).tolist()))
    assert batch.weights.dtype == np.float32
    np.testing.assert_allclose(batch.weights, [expected[r] for r in batch.idx.tolist()], rtol=1e-5)


def test_new_rows_take_the_highest_priority_given_so_far() -> None:
    buffer = fe.FlexibleBuffer(40, 2, [2], seed=0, alpha=1.0)
    for _ in range(2):
        buffer.begin_episode()
        for _ in range(10):
            buffer.claim_row()
        buffer.end_episode()
    old = live(buffer)
    buffer.update_priorities(old, np.where(old < 5, 8.0, 0.5))  # 5 rows at 8, the rest at 0.5
    buffer.begin_episode()
    for _ in range(10):
        buffer.claim_row()
    buffer.end_episode()
    new = np.setdiff1d(live(buffer), old)
    batch = buffer.sample_transitions(100_000, prioritized=True, beta=1.0)
    share = np.isin(batch.idx, new).mean()
    assert share == pytest.approx(10 * 8 / (5 * 8 + 15 * 0.5 + 10 * 8), abs=0.01)
    weights = dict(zip(batch.idx.tolist(), batch.weights.tolist()))
    assert weights[int(new[0])] == pytest.approx(weights[0]) == pytest.approx(0.5 / 8)


def test_forgotten_and_overwritten_rows_are_never_drawn_nor_revived() -> None:
    buffer = fe.FlexibleBuffer(10, 2, [2], n_envs=2, seed=0)
    for lane in range(2):
        buffer.begin_episode(lane)
        for _ in range(6):
            buffer.claim_row(lane)
        buffer.end_episode(lane)
    first = live(buffer)
    buffer.update_priorities(first, 1e-3)  # the first episodes: hardly ever drawn
    for _ in range(2):  # lane 0 wraps: its first episode is forgotten, its rows reused
        buffer.begin_episode(0)
        for _ in range(4):
            buffer.claim_row(0)
        buffer.end_episode(0)
    now = live(buffer)
    gone = np.setdiff1d(first, now)
    assert gone.tolist() == [4, 5]  # lane 0's first episode was rows 0-5; rows 0-3 hold new steps
    buffer.update_priorities(gone, 100.0)  # forgotten rows are not revived
    drawn = buffer.sample_transitions(50_000, prioritized=True).idx
    assert set(np.unique(drawn)) == set(now)
    fresh = np.setdiff1d(now, first[first >= 10])  # lane 0's rows now: all new, at the highest priority
    # 8 new rows at priority 1 (the highest so far) against lane 1's 6 rows kept at 1e-3 (alpha 0.6)
    assert np.isin(drawn, fresh).mean() == pytest.approx(8 / (8 + 6 * 1e-3**0.6), abs=0.003)


def test_prioritized_batches_of_every_agent_and_torch_weights() -> None:
    pytest.importorskip("pettingzoo")
    pytest.importorskip("mpe2")
    from tests.envs import recorded_spread

    buffer = recorded_spread(max_cycles=10, steps=30)
    batch = buffer.sample_transitions(16, prioritized=True)
    assert batch.obs.shape == (3, 16, 18) and batch.weights.shape == (16,)
    torch = pytest.importorskip("torch")
    assert buffer.sample_transitions(16, prioritized=True, as_torch=True).weights.dtype == torch.float32


def test_bad_priorities_and_alpha_are_refused_naming_them() -> None:
    buffer = filled(10)
    for bad in (-1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match="priorities must be finite and non-negative"):
            buffer.update_priorities(np.array([0]), bad)
    with pytest.raises(ValueError, match="alpha"):
        fe.FlexibleBuffer(10, 2, alpha=-0.5)
    with pytest.raises(ValueError, match="weighted=True .* or prioritized=True"):
        buffer.sample_transitions(4, weighted=True, prioritized=True)
    for beta in (-0.1, float("nan"), "0.4"):
        with pytest.raises(ValueError, match="beta"):
            buffer.sample_transitions(4, prioritized=True, beta=beta)  # type: ignore[arg-type]
    buffer.update_priorities(live(buffer), 0.0)
    with pytest.raises(ValueError, match="positive priority"):
        buffer.sample_transitions(4, prioritized=True)


def test_a_recorded_vector_env_samples_by_priority() -> None:
    env = fe.record(gym.make_vec("CartPole-v1", num_envs=3), num_steps=100)
    env.reset(seed=0)
    for _ in range(40):
        env.step(np.ones(3, dtype=np.int64))
    batch = env.buffer.sample_transitions(64, prioritized=True)
    env.buffer.update_priorities(batch.idx, np.abs(batch.individual_rewards) + 1.0)
    assert np.isin(env.buffer.sample_transitions(64, prioritized=True).idx, live(env.buffer)).all()


def test_a_seeded_buffer_draws_the_same_prioritized_rows() -> None:
    draws = []
    for _ in range(2):
        buffer = filled(20, lanes=2)
        rows = live(buffer)
        buffer.update_priorities(rows, np.linspace(0.1, 2.0, rows.size))
        batch = buffer.sample_transitions(64, prioritized=True)
        draws.append((batch.idx, batch.weights))
    np.testing.assert_array_equal(draws[0][0], draws[1][0])
    np.testing.assert_array_equal(draws[0][1], draws[1][1])


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
def test_save_and_load_keep_priorities_alpha_and_the_highest_priority(tmp_path, mmap: bool) -> None:  # type: ignore[no-untyped-def]
    env = fe.record(gym.make("CartPole-v1"), num_steps=60, alpha=0.7, seed=0)
    env.reset(seed=0)
    for _ in range(150):  # the ring wraps: the file holds every row, as a mapped load needs
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    buffer = env.buffer
    rows = live(buffer)
    buffer.update_priorities(rows, np.linspace(0.1, 9.0, rows.size))
    loaded = fe.FlexibleBuffer.load(buffer.save(tmp_path / "per.fbuf"), mmap=mmap)
    assert loaded.alpha == 0.7
    a, b = (x.sample_transitions(2000, prioritized=True, beta=0.5) for x in (buffer, loaded))
    np.testing.assert_array_equal(a.idx, b.idx)  # same rng state, same trees: the same draw
    np.testing.assert_array_equal(a.weights, b.weights)
    for x in (buffer, loaded):  # a new row takes the highest priority given before the save: 9
        x.begin_episode()
        x.claim_row()
        x.end_episode()
    np.testing.assert_array_equal(
        buffer.sample_transitions(500, prioritized=True).weights,
        loaded.sample_transitions(500, prioritized=True).weights,
    )


def test_a_buffer_that_never_used_priorities_saves_none_and_starts_them_at_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    buffer = filled(20)
    loaded = fe.FlexibleBuffer.load(buffer.save(tmp_path / "plain.fbuf"))
    batch = loaded.sample_transitions(100, prioritized=True, beta=1.0)
    np.testing.assert_array_equal(batch.weights, 1.0)


def test_record_takes_alpha_and_a_given_buffer_must_agree() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=10, alpha=0.3)
    assert env.buffer.alpha == 0.3
    with pytest.raises(fe.SpecMismatchError, match="alpha"):
        fe.record(gym.make("CartPole-v1"), env.buffer, alpha=0.5)
    with pytest.raises(ValueError, match="alpha must be a finite number"):  # not a mismatch: no alpha at all
        fe.record(gym.make("CartPole-v1"), env.buffer, alpha=-1.0)
    vector = fe.record(gym.make_vec("CartPole-v1", num_envs=2), num_steps=10, alpha=1.0)
    assert vector.buffer.alpha == 1.0


def test_many_updates_keep_weights_exact_as_the_smallest_priority_rises_and_leaves() -> None:
    """Thousands of updates (the sums are rebuilt exactly along the way) and the row holding the
    smallest priority raised, then forgotten: weights stay the formula over the rows held now."""
    buffer = filled(40, lanes=2, alpha=0.5)
    rows = live(buffer)
    rng = np.random.default_rng(3)
    current = dict.fromkeys(rows.tolist(), 1.0)
    given = []
    for _ in range(300):  # rows drawn twice in one call keep their last priority
        idx = rng.choice(rows, 16)
        values = rng.uniform(0.5, 4.0, 16)
        given += values.tolist()
        buffer.update_priorities(idx, values)
        current.update(zip(idx.tolist(), values.tolist()))
    lowest = rows[0]
    buffer.update_priorities(np.array([lowest]), 0.01)  # the minimum, held by one row
    current[int(lowest)] = 0.01

    def check() -> None:
        batch = buffer.sample_transitions(400, prioritized=True, beta=0.6)
        p = np.array([current[r] for r in live(buffer).tolist()]) ** 0.5
        smallest = p.min()
        expected = [(current[r] ** 0.5 / smallest) ** -0.6 for r in batch.idx.tolist()]
        np.testing.assert_allclose(batch.weights, expected, rtol=1e-5)

    check()
    buffer.update_priorities(np.array([lowest]), 2.0)  # the minimum rises: found again among the rest
    current[int(lowest)] = 2.0
    check()
    buffer.update_priorities(np.array([rows[1]]), 0.02)
    current[int(rows[1])] = 0.02
    buffer.begin_episode(0)  # lane 0 wraps: its first episode (rows 0-4, the new minimum among them) goes
    new = buffer.claim_rows(5, 0)
    buffer.end_episode(0)
    assert 1 in new.tolist()
    current.update(dict.fromkeys(new.tolist(), max(given)))  # new steps: the highest priority given so far
    check()


def test_the_minimum_is_found_again_across_blocks_of_leaves_after_falls_and_rises() -> None:
    """1,000 rows (blocks of 128 leaves): a row falling below its block's smallest priority, then
    the overall minimum (in another block) rising. The weights are normalised by the true
    smallest priority each time it has to be searched for."""
    buffer = filled(1000, alpha=1.0, episode=50)
    rows = live(buffer)
    current = np.full(rows.size, 4.0)
    buffer.update_priorities(rows, current)

    def give(row: int, priority: float) -> None:
        buffer.update_priorities(np.array([row]), priority)
        current[row] = priority
        batch = buffer.sample_transitions(64, prioritized=True, beta=1.0)
        np.testing.assert_allclose(batch.weights, current.min() / current[batch.idx], rtol=1e-6)

    give(300, 3.0)  # block 2's smallest falls
    give(0, 1.0)  # the minimum, in block 0
    give(0, 10.0)  # it rises: searched again, 3.0 in block 2
    give(0, 1.0)
    give(301, 2.0)  # block 2's smallest falls again, while the minimum is elsewhere
    give(0, 10.0)  # searched again: 2.0, which block 2 must already know
    give(301, 10.0)  # block 2's smallest rises: 3.0
    give(300, 10.0)  # and again: every row left at 4.0


def test_a_large_tree_draws_in_proportion_through_its_searched_top_and_its_descent() -> None:
    """5,000 rows: a draw searches the tree's top levels at once, then descends the rest. Every
    row's share of 400,000 draws matches its priority; rows at priority 0 are never drawn and
    leave the importance weights finite."""
    buffer = filled(5000, alpha=1.0, episode=50)
    rows = live(buffer)
    priorities = (rows % 7 + 1.0) * (rows % 97 != 0)  # neighbours differ; every 97th row at 0
    buffer.update_priorities(rows, priorities)
    rng = type(buffer.rng.bit_generator)()
    rng.state = buffer.rng.bit_generator.state  # the uniform draws the sample is about to make
    batch = buffer.sample_transitions(400_000, prioritized=True, beta=1.0)
    assert (priorities[batch.idx] > 0).all()
    # in the order drawn: the k-th row is where the k-th uniform draw falls among the priorities
    cumulative = np.cumsum(priorities)
    expected = np.searchsorted(cumulative, np.random.Generator(rng).random(batch.idx.size) * cumulative[-1], "right")
    assert np.mean(batch.idx == rows[expected]) > 0.9999  # a draw on a boundary may round either way
    counts = np.bincount(batch.idx, minlength=rows.size)[priorities > 0]
    expected = (priorities / priorities.sum() * batch.idx.size)[priorities > 0]
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < counts.size + 6 * np.sqrt(2 * counts.size)  # chi-square, one degree of freedom a row
    np.testing.assert_allclose(batch.weights, 1.0 / priorities[batch.idx], rtol=1e-5)  # (p_i / p_min) ** -1


def test_torch_tensors_go_straight_back_as_priorities() -> None:
    torch = pytest.importorskip("torch")
    buffer = filled(20)
    batch = buffer.sample_transitions(idx=np.arange(8), as_torch=True)  # idx a torch tensor, rows distinct
    td = torch.linspace(0.5, 4.0, 8, requires_grad=True) * 2.0  # a loss's TD errors, still in the graph
    buffer.update_priorities(batch.idx, td.abs() + 1e-6)
    buffer.set_memory_weights(batch.idx, td.abs())
    np.testing.assert_allclose(
        buffer.sample_transitions(idx=np.arange(8)).memory_weights, td.detach().numpy(), rtol=1e-6
    )
    priority = np.concatenate([td.detach().numpy() + 1e-6, np.ones(12)]) ** 0.6  # rows 8-19 kept their 1
    drawn = buffer.sample_transitions(2_000, prioritized=True, beta=1.0)
    np.testing.assert_allclose(drawn.weights, priority.min() / priority[drawn.idx], rtol=1e-5)
    with pytest.raises(ValueError, match="priorities must be finite"):
        buffer.update_priorities(batch.idx, torch.full((8,), float("nan")))


def test_priorities_of_another_shape_than_idx_are_refused_naming_both() -> None:
    buffer = filled(10)
    with pytest.raises(ValueError, match=r"priorities has shape \(4, 1\) but idx has \(4,\)"):
        buffer.update_priorities(np.arange(4), np.ones((4, 1)))
    buffer.update_priorities(np.arange(4), 2.0)  # one number for all of them


LANE_ROWS = 2500  # two lanes, 5,000 rows: 8,192 leaves, so draws search level 11 and descend 2 more; 64 blocks
PRIORITY = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 7.0])  # few values: ties, and rows at 0
TREE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.integers(0, 1), st.integers(1, 1200)),  # an episode; the ring wraps
        st.tuples(
            st.just("update"),
            st.lists(st.tuples(st.integers(0, 10**6), PRIORITY), min_size=1, max_size=40),
            st.booleans(),
        ),  # rows picked among the live ones (repeats too), and maybe a forgotten one
    ),
    min_size=3,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(TREE_OPS)
def test_priorities_follow_a_plain_model_through_records_wraps_and_updates(ops: list[tuple[Any, ...]]) -> None:
    """After each operation a prioritized draw takes only live rows of positive priority, and its
    weights (beta 1, alpha 1) are the smallest positive live priority over the row's: the sum tree,
    the kept minimum and its count, and the block minima agree with a dict of priorities."""
    buffer = fe.FlexibleBuffer(LANE_ROWS, 2, [2], n_envs=2, seed=0, alpha=1.0)
    current: dict[int, float] = {}
    forgotten: list[int] = []
    highest = 1.0
    buffer.begin_episode(0)
    buffer.claim_rows(1, 0)
    buffer.end_episode(0)
    buffer.sample_transitions(1, prioritized=True)  # priorities from here on
    current[0] = 1.0
    for op in ops:
        if op[0] == "record":
            buffer.begin_episode(op[1])
            new = buffer.claim_rows(op[2], op[1])
            buffer.end_episode(op[1])
            held = set(live(buffer).tolist())
            forgotten += [row for row in current if row not in held]
            current = {row: p for row, p in current.items() if row in held}
            current.update(dict.fromkeys(new.tolist(), highest))
        else:
            rows = sorted(current)
            idx = [rows[i % len(rows)] for i, _ in op[1]]
            values = [p for _, p in op[1]]
            if op[2] and forgotten:  # a row no longer held: left out
                idx.append(forgotten[-1])
                values.append(9.0)
            buffer.update_priorities(np.array(idx), np.array(values))
            given = dict(zip(idx, values))  # of a row given twice, the last
            given = {row: p for row, p in given.items() if row in current}
            current.update(given)
            highest = max(highest, *given.values())
        positive = {row: p for row, p in current.items() if p > 0}
        if not positive:
            with pytest.raises(ValueError, match="positive priority"):
                buffer.sample_transitions(8, prioritized=True)
            continue
        batch = buffer.sample_transitions(64, prioritized=True, beta=1.0)
        assert set(batch.idx.tolist()) <= set(positive)
        np.testing.assert_allclose(
            batch.weights, [min(positive.values()) / positive[r] for r in batch.idx.tolist()], rtol=1e-6
        )
    assert buffer.max_priority == highest


def test_a_draw_that_meets_stale_sums_draws_again_and_keeps_the_order_drawn() -> None:
    """Sums that lag their leaves (what float rounding can leave) lead a descent to a leaf at 0:
    the sums are rebuilt and only those rows drawn again, in their places, never a row at 0."""
    from flexibuff_envs.sampling.priorities import PriorityTree

    tree = PriorityTree(4096, 1, alpha=1.0)
    rows = np.arange(4096)
    tree._set(rows, np.ones(4096), live=True)
    tree.sums[tree.leaves + rows[1::2]] = 0.0  # half the leaves emptied behind the sums' back
    drawn, weights = tree.draw(np.random.default_rng(0), 4096, beta=1.0)
    assert (drawn % 2 == 0).all() and (weights == 1).all()
    assert np.diff(drawn).min() < 0  # the order drawn, not sorted
