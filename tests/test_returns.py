"""Returns math against a plain Python loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flexibuff_envs.index.returns import discounted_returns, episode_returns, gae, segmented_scan
from flexibuff_envs.testing.reference import plain_returns

rewards_st = arrays(np.float64, st.integers(0, 300), elements=st.floats(-100, 100))
gamma_st = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]) | st.floats(0, 1)


@settings(max_examples=200, deadline=None)
@given(rewards=rewards_st, gamma=gamma_st, bootstrap=st.floats(-50, 50))
def test_episode_returns_equal_a_plain_loop(rewards: np.ndarray, gamma: float, bootstrap: float) -> None:
    expected = plain_returns(list(rewards), gamma, bootstrap)
    np.testing.assert_allclose(
        episode_returns(rewards[None], gamma, np.array([bootstrap]))[0], expected, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(discounted_returns(rewards, gamma, bootstrap=bootstrap), expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), gamma=gamma_st, data=st.data())
def test_segmented_returns_equal_a_loop_per_episode(lengths: list[int], gamma: float, data: st.DataObject) -> None:
    total = sum(lengths)
    rewards = data.draw(arrays(np.float64, total, elements=st.floats(-10, 10)))
    boots = data.draw(arrays(np.float64, len(lengths), elements=st.floats(-10, 10)))
    ends = np.zeros(total, dtype=bool)
    ends[np.cumsum(lengths) - 1] = True
    bootstrap = np.zeros(total)
    bootstrap[ends] = boots
    expected: list[float] = []
    start = 0
    for length, boot in zip(lengths, boots):
        expected += plain_returns(list(rewards[start : start + length]), gamma, boot)
        start += length
    np.testing.assert_allclose(
        discounted_returns(rewards, gamma, ends=ends, bootstrap=bootstrap), expected, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(segmented_scan(rewards + gamma * bootstrap, gamma, ends), expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    gamma=st.sampled_from([0.9, 0.99, 0.999]),
    data=st.data(),
)
def test_many_long_episodes_back_to_back_stay_precise(lengths: list[int], gamma: float, data: st.DataObject) -> None:
    """The vector recorder's path: thousands of episodes, some long enough to take the scan."""
    rewards = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).normal(5.0, 3.0, sum(lengths))
    boots = np.linspace(-20, 20, len(lengths))
    ends = np.zeros(rewards.size, dtype=bool)
    ends[np.cumsum(lengths) - 1] = True
    bootstrap = np.zeros(rewards.size)
    bootstrap[ends] = boots
    got = segmented_scan(rewards + gamma * bootstrap, gamma, ends)
    start = 0
    for length, boot in zip(lengths, boots):
        np.testing.assert_allclose(
            got[start : start + length],
            plain_returns(list(rewards[start : start + length]), gamma, boot),
            rtol=1e-7,
            atol=1e-7,
        )
        start += length


def test_long_episode_with_small_gamma_takes_the_stable_path() -> None:
    rewards = np.ones((1, 5000))
    returns = episode_returns(rewards, 0.5)
    assert np.isfinite(returns).all()
    np.testing.assert_allclose(returns[0, :10], 2.0)
    assert returns[0, -1] == 1.0


def test_empty_episode_and_bad_gamma() -> None:
    assert discounted_returns(np.zeros(0), 0.9).shape == (0,)
    for gamma in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            discounted_returns(np.ones(3), gamma)


def plain_scan(x: np.ndarray, c: float, ends: np.ndarray) -> list[float]:
    out, acc = [0.0] * len(x), 0.0
    for t in range(len(x) - 1, -1, -1):
        acc = x[t] + (0.0 if ends[t] or not c else c * acc)
        out[t] = acc
    return out


#: mostly ordinary rewards, with NaN and infinities among them
wild_st = st.one_of(
    st.floats(-10, 10), st.floats(-10, 10), st.floats(-10, 10), st.sampled_from([np.nan, np.inf, -np.inf])
)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(1, 400), c=gamma_st)
def test_nan_and_inf_stay_inside_their_own_episode(data: st.DataObject, n: int, c: float) -> None:
    x = data.draw(arrays(np.float64, n, elements=wild_st))
    ends = data.draw(arrays(bool, n))
    ends[-1] = True
    expected = plain_scan(x, c, ends)  # a cut multiplies by nothing, so nothing crosses it
    with np.errstate(invalid="raise"):  # and the library says nothing about the user's data
        np.testing.assert_allclose(segmented_scan(x, c, ends), expected, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(discounted_returns(x, c, ends=ends), expected, rtol=1e-7, atol=1e-7)
        advantages, _ = gae(x, np.zeros(n), ends, c, 1.0)
        np.testing.assert_allclose(advantages, expected, rtol=1e-7, atol=1e-7)
        starts = np.concatenate([[0], np.flatnonzero(ends)[:-1] + 1])
        for start, end in zip(starts, np.flatnonzero(ends) + 1):
            np.testing.assert_allclose(
                episode_returns(x[None, start:end], c)[0], expected[start:end], rtol=1e-6, atol=1e-6
            )


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n=st.integers(1, 400), c=gamma_st)
def test_segmented_scan_equals_a_plain_loop(data: st.DataObject, n: int, c: float) -> None:
    x = data.draw(arrays(np.float64, n, elements=st.floats(-100, 100)))
    ends = data.draw(arrays(bool, n))
    np.testing.assert_allclose(segmented_scan(x, c, ends), plain_scan(x, c, ends), rtol=1e-7, atol=1e-7)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 300), gamma=gamma_st, lam=gamma_st)
def test_batch_gae_equals_a_plain_loop(data: st.DataObject, n: int, gamma: float, lam: float) -> None:
    rewards = data.draw(arrays(np.float64, n, elements=st.floats(-10, 10)))
    values = data.draw(arrays(np.float64, n, elements=st.floats(-10, 10)))
    ends = data.draw(arrays(bool, n))
    bootstrap = data.draw(arrays(np.float64, n, elements=st.floats(-10, 10)))
    expected, acc = [0.0] * n, 0.0
    for t in range(n - 1, -1, -1):
        following = bootstrap[t] if ends[t] else (values[t + 1] if t + 1 < n else 0.0)
        acc = rewards[t] + gamma * following - values[t] + (0.0 if ends[t] else gamma * lam * acc)
        expected[t] = acc
    advantages, returns = gae(rewards, values, ends, gamma, lam, bootstrap)
    np.testing.assert_allclose(advantages, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(returns, np.array(expected) + values, rtol=1e-6, atol=1e-6)
    out = (np.empty(n, np.float32), np.empty(n, np.float32))
    gae(rewards, values, ends, gamma, lam, bootstrap, out=out)
    np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-4)
