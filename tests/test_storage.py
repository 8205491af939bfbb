"""Each observation is stored once: ``obs_`` is read from the next row, only final observations
are kept apart, and batches are what the env gave."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import flexibuff_envs as fe
from flexibuff_envs.spec.observations import obs_codec
from flexibuff_envs.storage.fields import one_hot, pack_mask, unpack_mask
from tests.envs import ToyEnv

FRAME = spaces.Box(0, 255, (32, 32, 4), np.uint8)


def frames(truncate: bool) -> ToyEnv:
    return ToyEnv(FRAME, spaces.Discrete(3), lengths=(30, 45, 61), truncate=truncate)


def plain_episodes(env: gym.Env, steps: int, actions: np.ndarray) -> list[list[np.ndarray]]:
    """Each ended episode's observations (its reset's and every step's), from a bare loop."""
    episodes, obs = [], [env.reset(seed=0)[0]]
    for t in range(steps):
        o, _, terminated, truncated, _ = env.step(int(actions[t]))
        obs.append(o)
        if terminated or truncated:
            episodes.append(obs)
            obs = [env.reset()[0]]
    return episodes


@pytest.mark.parametrize("truncate", [False, True])
def test_an_image_transition_costs_one_frame_and_samples_as_the_env_gave_it(truncate: bool) -> None:
    actions = np.random.default_rng(1).integers(0, 3, 3000)
    env = fe.record(frames(truncate), num_steps=1000)
    recorded = plain_episodes(env, 3000, actions)  # the ring wraps three times
    reference = plain_episodes(frames(truncate), 3000, actions)
    assert all(len(a) == len(b) for a, b in zip(recorded, reference))

    buffer = env.buffer
    assert buffer.nbytes <= 1.10 * 1000 * FRAME.shape[0] * FRAME.shape[1] * FRAME.shape[2]
    kept = list(buffer.episodes())
    for batch, obs in zip(kept, reference[-len(kept) :]):
        np.testing.assert_array_equal(batch.obs, np.reshape(obs[:-1], (len(obs) - 1, -1)))
        np.testing.assert_array_equal(batch.obs_, np.reshape(obs[1:], (len(obs) - 1, -1)))
        assert (batch.truncated[-1], batch.terminated[-1]) == (truncate, not truncate)


def hand_filled(rows: int = 1000, width: int = 64) -> tuple[fe.FlexibleBuffer, np.ndarray]:
    """Episodes of 50 steps written through `field`, FlexiBuff style; returns the trajectory."""
    buffer = fe.FlexibleBuffer(rows, width, [2], individual_reward=True, seed=0)
    trajectory = np.random.default_rng(0).normal(size=(rows + 1, width)).astype(np.float32)
    for start in range(0, rows, 50):
        buffer.begin_episode()
        for t in range(start, start + 50):
            row = buffer.claim_row()
            buffer.field("obs")[0, row] = trajectory[t]
            # the episode's last step ends in a final observation of its own
            buffer.field("obs_")[0, row] = trajectory[t + 1] if t < start + 49 else -trajectory[t + 1]
        buffer.end_episode()
    return buffer, trajectory


def test_next_observations_filled_by_hand_are_kept_and_compact_stores_them_once() -> None:
    buffer, trajectory = hand_filled()
    before = buffer.sample_transitions(idx=np.arange(1000)).obs_
    expected = trajectory[1:].copy()
    expected[49::50] *= -1
    np.testing.assert_array_equal(before, expected)
    full = buffer.nbytes
    buffer.compact()
    np.testing.assert_array_equal(buffer.sample_transitions(idx=np.arange(1000)).obs_, expected)
    assert "obs_" in buffer.fields and full - buffer.nbytes >= 0.9 * 1000 * 64 * 4


def test_next_observations_written_an_episode_at_a_time_are_stored_once() -> None:
    """`write_next`, what imports use: the same next values as `field` and `compact` give, with
    no column of them written out, and a ring that wraps in the middle of an episode."""
    _, trajectory = hand_filled()
    expected = trajectory[1:].copy()
    expected[49::50] *= -1
    buffer = fe.FlexibleBuffer(1000, 64, [2], individual_reward=True, seed=0)
    buffer.begin_episode()
    buffer.claim_rows(30)  # the next episodes wrap around the ring's end
    buffer.end_episode()
    for start in range(0, 1000, 50):
        buffer.begin_episode()
        rows = buffer.claim_rows(50)
        buffer.field("obs")[0, rows] = trajectory[start : start + 50]
        buffer.write_next("obs_", rows, expected[None, start : start + 50])
        buffer.end_episode()
    assert buffer.nbytes < 1000 * 64 * 4 * 1.2  # obs once, not obs and obs_
    batch = buffer.sample_transitions(idx=(np.arange(1000) + 30) % 1000)  # in recording order
    np.testing.assert_array_equal(batch.obs_, expected)
    with pytest.raises(ValueError, match="'obs' is none of the next-value fields"):
        buffer.write_next("obs", np.arange(2), expected[None, :2])


def test_obs__cannot_be_taken_apart_while_a_recorder_writes_it() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=50)
    with pytest.raises(ValueError, match=r"obs_ is stored once, in the next row of obs"):
        env.buffer.field("obs_")


def test_discrete_observations_are_stored_as_indices_and_sampled_one_hot() -> None:
    env = fe.record(gym.make("Taxi-v4"), num_steps=500)
    states = [env.reset(seed=0)[0]]
    env.action_space.seed(0)
    for _ in range(150):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        states.append(obs)
        assert not (terminated or truncated)  # Taxi truncates at 200; random moves rarely deliver
    batch = env.buffer.sample_transitions(idx=np.arange(150))
    np.testing.assert_array_equal(batch.obs, np.eye(500, dtype=np.float32)[states[:-1]])
    np.testing.assert_array_equal(batch.obs_, np.eye(500, dtype=np.float32)[states[1:]])
    # a step costs tens of bytes, not the 4,000 of two one-hot float rows
    assert env.buffer.nbytes_per_row < 64


def test_a_legal_action_mask_costs_a_bit_per_action() -> None:
    def per_row(masked: bool) -> int:
        return fe.FlexibleBuffer(10, 4, [4672], action_mask=masked, n_agents=2).nbytes_per_row

    # chess: 4,672 moves; masks and next masks were 2 x 4,672 bools per agent
    assert per_row(True) - per_row(False) == 2 * (4672 // 8 + 4)  # bits, plus the next mask's index


def test_obs_categories_must_add_up_to_obs_size() -> None:
    with pytest.raises(ValueError, match=r"obs_categories \(3, 4\) sum to 7, but obs_size is 8"):
        fe.FlexibleBuffer(10, 8, [2], obs_categories=[3, 4])
    buffer = fe.FlexibleBuffer(10, 7, [2], obs_categories=[3, 4])
    buffer.begin_episode()
    buffer.field("obs")[0, buffer.claim_row()] = [3, 1]  # stored as index + 1
    assert buffer.sample_transitions(idx=np.array([0])).obs.tolist() == [[0, 0, 1, 1, 0, 0, 0]]


# ----------------------------------------------------------------------------- encodings, any value


@settings(max_examples=200, deadline=None)
@given(data=st.data(), width=st.integers(1, 70), rows=st.integers(0, 9))
def test_mask_bits_give_back_every_flag(data: st.DataObject, width: int, rows: int) -> None:
    flags = data.draw(arrays(bool, (rows, width)))
    bits = pack_mask(flags)
    assert bits.shape == (rows, -(-width // 8)) and bits.dtype == np.uint8
    np.testing.assert_array_equal(unpack_mask(bits, width), flags)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), nvec=st.lists(st.integers(1, 9), min_size=1, max_size=5), start=st.integers(-3, 3))
def test_category_indices_give_back_gymnasium_s_one_hot(data: st.DataObject, nvec: list[int], start: int) -> None:
    """Observations made of categories are stored as one index per category and batched as the
    flattening Gymnasium gives, for any values (Discrete with a start, MultiDiscrete, a Tuple)."""
    space = spaces.Tuple([spaces.Discrete(nvec[0], start=start), spaces.MultiDiscrete(nvec)])
    space.seed(data.draw(st.integers(0, 2**31 - 1)))
    values = [space.sample() for _ in range(data.draw(st.integers(1, 6)))]
    codec = obs_codec(space)
    stored = np.stack([codec.indices(v) for v in values]).astype(codec.compact().dtype)  # type: ignore[misc]
    expected = np.stack([spaces.flatten(space, v) for v in values]).astype(np.float32)
    np.testing.assert_array_equal(one_hot(stored, codec.categories), expected)
    assert not one_hot(np.zeros_like(stored), codec.categories).any()  # index 0: no observation
