"""Moving whole episodes between buffers: `take_episodes` on one side, `extend` on the other."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from itertools import islice
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3
from pettingzoo.classic import connect_four_v3

import flexibuff_envs as fe
from flexibuff_envs.recording.rollout import Annotated, steps
from flexibuff_envs.spec.env_kinds import env_kind
from tests.batches import assert_same_batches, filled_by_hand, key, whole_episodes
from tests.envs import ToyEnv

KINDS: dict[str, Callable[[], Any]] = {
    "cartpole": lambda: gym.make("CartPole-v1"),
    "taxi vector (masks in info)": lambda: gym.make_vec("Taxi-v4", 3, vectorization_mode="sync"),
    "simple_spread parallel (state)": lambda: simple_spread_v3.parallel_env(max_cycles=20),
    "connect four AEC (masks)": lambda: connect_four_v3.env(),
}


def learner_for(buffer: fe.FlexibleBuffer, num_steps: int) -> fe.FlexibleBuffer:
    return fe.FlexibleBuffer.from_spec(
        dataclasses.replace(buffer.spec, n_envs=1),
        num_steps=num_steps,
        gamma=buffer.gamma,
        global_reward=False,
        individual_reward=False,
    )


def play(env: Any, seed: int, n: int, policy: Any = None) -> Any:
    """``steps`` of ``env`` with ``seed``, stepped ``n`` step calls at a time by ``next``."""
    played = steps(env, str(env_kind(env)), seed=seed, policy=policy)
    return lambda: list(islice(played, n))


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_episodes_moved_chunk_by_chunk_equal_one_recording(make: Callable[[], Any]) -> None:
    worker, reference = fe.record(make(), num_steps=2_000), fe.record(make(), num_steps=50_000)
    learner = learner_for(worker.buffer, 50_000)
    step_worker, step_reference = play(worker, 3, 333), play(reference, 3, 333)
    for _ in range(6):
        step_worker()
        step_reference()
        held = len(worker.buffer)
        chunk = worker.buffer.take_episodes()
        assert learner.extend(chunk) == chunk.n_episodes > 0
        # the worker keeps only its running episodes
        assert worker.buffer.n_episodes == 0 and len(worker.buffer) == held - chunk.rows
    moved, recorded = whole_episodes(learner), whole_episodes(reference.buffer)
    assert len(moved) == len(recorded) == learner.n_episodes
    if reference.buffer.spec.n_envs > 1:  # episodes of sub-envs arrive in another order
        moved.sort(key=key)
        recorded.sort(key=key)
    for a, b in zip(moved, recorded):
        assert_same_batches(a, b)


def test_a_small_learner_keeps_the_newest_whole_episodes_and_samples_them() -> None:
    worker = fe.record(gym.make("CartPole-v1"), num_steps=2_000)
    reference = fe.record(gym.make("CartPole-v1"), num_steps=50_000)
    learner = learner_for(worker.buffer, 300)
    step_worker, step_reference = play(worker, 0, 250), play(reference, 0, 250)
    for _ in range(8):  # 2,000 steps through a 300-row ring: wraps several times, mid-episode too
        step_worker()
        step_reference()
        learner.extend(worker.buffer.take_episodes())
    kept = whole_episodes(learner)
    newest = whole_episodes(reference.buffer)[-len(kept) :]
    assert 0 < len(learner) <= 300 and len(kept) == learner.n_episodes
    for a, b in zip(kept, newest):
        assert_same_batches(a, b)
    for episode in learner.sample_episodes(n_episodes=len(kept)):
        assert episode.terminated[-1] or episode.truncated[-1]
        assert not (episode.terminated[:-1] | episode.truncated[:-1]).any()
    batch = learner.sample_transitions(512)
    assert not np.isnan(batch.G).any()


def test_a_chunk_bigger_than_the_lane_appends_its_newest_episodes_that_fit() -> None:
    worker = fe.record(ToyEnv(lengths=(30, 50, 20)), num_steps=1_000)
    play(worker, 0, 100)()  # episodes of 30, 50, 20 steps
    learner = learner_for(worker.buffer, 75)
    recorded = whole_episodes(worker.buffer)
    assert learner.extend(worker.buffer.take_episodes()) == 2
    for a, b in zip(whole_episodes(learner), recorded[1:]):
        assert_same_batches(a, b)
    assert len(learner) == 70
    chain = learner._store.chains["obs_"]  # the dropped episode took no slot of the next-value store
    named = chain.index[chain.index > 0]
    assert named.size == len(set(named.tolist())) == chain.fresh - 1 - chain._n_free == 2


def test_annotations_gae_feedback_and_weights_travel_with_the_episode() -> None:
    def policy(obs: np.ndarray, info: dict) -> Annotated:
        return Annotated(
            int(obs[2] > 0),
            {"values": float(obs[0]), "discrete_log_probs": [-0.7], "memory_weights": 1.0 + abs(float(obs[1]))},
        )

    worker = fe.record(gym.make("CartPole-v1"), num_steps=2_000, gamma=0.9)
    step = play(worker, 1, 1, policy)
    for t in range(400):
        step()
        if t % 7 == 0:
            worker.add_feedback(0.25)
    recorded = whole_episodes(worker.buffer)
    learner = learner_for(worker.buffer, 1_000)
    learner.extend(worker.buffer.take_episodes())
    moved = whole_episodes(learner)
    assert len(moved) == len(recorded) > 5
    for a, b in zip(moved, recorded):
        assert_same_batches(a, b)
    assert moved[0].advantages is not None and not np.isnan(moved[0].advantages).any()
    assert moved[0].individual_auxiliary_rewards.sum() > 0


def test_masks_are_switched_on_by_the_first_chunk_that_has_them() -> None:
    unmasked = fe.record(ToyEnv(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(11), lengths=(4,)), num_steps=100)
    masked = fe.record(
        ToyEnv(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(11), lengths=(4,), mask_info=True), num_steps=100
    )
    play(unmasked, 0, 8)()
    play(masked, 0, 8)()
    learner = learner_for(unmasked.buffer, 100)
    learner.extend(unmasked.buffer.take_episodes())
    recorded = whole_episodes(masked.buffer)
    learner.extend(masked.buffer.take_episodes())
    before, after = whole_episodes(learner)[:2], whole_episodes(learner)[2:]
    for episode in before:  # episodes recorded without masks: every action legal, now and next
        assert all(m.all() for m in episode.action_mask + episode.action_mask_)
    for a, b in zip(after, recorded):
        assert_same_batches(a, b)
        assert not all(m.all() for m in a.action_mask)


def test_masks_switched_on_give_every_row_held_before_all_actions_legal_running_episodes_too() -> None:
    """Masks arrive with a chunk appended to lane 1 while lane 0 runs an episode of 5 steps and
    holds an ended one: every row recorded before, running or ended, has all actions legal, now
    and next."""
    masked = fe.record(
        ToyEnv(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(11), lengths=(4,), mask_info=True), num_steps=100
    )
    play(masked, 0, 8)()
    learner = fe.FlexibleBuffer.from_spec(
        dataclasses.replace(masked.buffer.spec, n_envs=2, action_mask=False), num_steps=50, gamma=masked.buffer.gamma
    )
    learner.begin_episode(0)
    ended = learner.claim_rows(3, 0)
    learner.end_episode(0)
    learner.begin_episode(0)
    running = learner.claim_rows(5, 0)
    learner.extend(masked.buffer.take_episodes(), lane=1)
    batch = learner.sample_transitions(idx=np.concatenate([ended, running]))
    assert all(m.all() for m in batch.action_mask + batch.action_mask_)


def test_next_values_filled_by_hand_travel_too_even_chained_across_episodes() -> None:
    """A hand-filled ``obs_`` equal to the next episode's first ``obs`` is stored chained to it
    (`compact`); the chunk must still carry that value, as the next episode may not follow."""
    buffer = filled_by_hand()
    first, second = whole_episodes(buffer)
    chunk = buffer.take_episodes()
    learner = fe.FlexibleBuffer(20, obs_size=2, discrete_action_cardinalities=[2])
    learner.extend(chunk[:1])  # the first episode alone
    (moved,) = whole_episodes(learner)
    assert_same_batches(moved, first)
    np.testing.assert_array_equal(moved.obs_[-1], [6.0, 7.0])
    assert second.obs_[-1].tolist() == [-1.0, -1.0]


def test_a_loaded_file_hands_out_its_episodes(tmp_path: Any) -> None:
    worker = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=200)
    play(worker, 0, 75)()
    recorded = whole_episodes(worker.buffer)
    path = worker.buffer.save(tmp_path / "run.fbuf")
    for mmap in (False, True):
        learner = learner_for(worker.buffer, 200)
        learner.extend(fe.FlexibleBuffer.load(path, mmap=mmap).take_episodes())
        moved = whole_episodes(learner)
        assert len(moved) == len(recorded) == 7
        for a, b in zip(moved, recorded):
            assert_same_batches(a, b)


def fingerprint(buffer: fe.FlexibleBuffer) -> tuple[Any, ...]:
    return (
        len(buffer),
        buffer.n_episodes,
        {name: array.tobytes() for name, array in buffer._store},
        {name: (chain.index.tobytes(), chain.tail.tobytes()) for name, chain in buffer._store.chains.items()},
    )


def test_a_chunk_that_does_not_fit_is_refused_by_name_and_the_buffer_keeps_everything() -> None:
    cartpole = fe.record(gym.make("CartPole-v1"), num_steps=500, gamma=0.9)
    play(cartpole, 0, 60)()
    learner = learner_for(cartpole.buffer, 500)
    learner.extend(cartpole.buffer.take_episodes())
    acrobot = fe.record(gym.make("Acrobot-v1"), num_steps=600)
    play(acrobot, 0, 520)()
    other_gamma = fe.record(gym.make("CartPole-v1"), num_steps=500)
    play(other_gamma, 0, 60)()
    before = fingerprint(learner)
    with pytest.raises(fe.SpecMismatchError, match="the chunk does not match the buffer: obs_size is 6 there but 4"):
        learner.extend(acrobot.buffer.take_episodes())
    with pytest.raises(fe.SpecMismatchError, match="gamma=0.99 but the buffer's gamma is 0.9"):
        learner.extend(other_gamma.buffer.take_episodes())
    with pytest.raises(ValueError, match="lane must be in"):
        learner.extend(other_gamma.buffer.take_episodes(), lane=1)
    with pytest.raises(TypeError, match="expected a Chunk"):
        learner.extend(whole_episodes(cartpole.buffer))  # type: ignore[arg-type]
    assert fingerprint(learner) == before
    with pytest.raises(ValueError, match="lane 0 has a running episode"):
        cartpole.buffer.extend(learner.take_episodes())


def test_a_chunk_sliced_by_episode_moves_exactly_those_episodes_and_only_their_bytes() -> None:
    worker = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=500)
    play(worker, 2, 95)()
    recorded = whole_episodes(worker.buffer)
    chunk = worker.buffer.take_episodes()
    assert chunk.n_episodes == len(recorded) == 9
    for part, episodes in ((chunk[2:5], recorded[2:5]), (chunk[-2:], recorded[-2:]), (chunk.newest(25), recorded[-2:])):
        learner = learner_for(worker.buffer, 500)
        assert learner.extend(part) == len(episodes)
        for a, b in zip(whole_episodes(learner), episodes, strict=True):
            assert_same_batches(a, b)
        assert part.nbytes < chunk.nbytes * (len(episodes) + 1) / len(recorded)  # its tail keeps only its slots
    assert chunk[5:2].n_episodes == 0 == learner_for(worker.buffer, 500).extend(chunk[5:2])
    one = learner_for(worker.buffer, 500)
    assert one.extend(chunk[-1]) == 1
    assert_same_batches(whole_episodes(one)[0], recorded[-1])
    with pytest.raises(ValueError, match="step 1, got step 2"):
        chunk[::2]
    with pytest.raises(IndexError, match="episode 9 of a chunk of 9"):
        chunk[9]
    with pytest.raises(TypeError, match="indexed by episode"):
        chunk["obs"]  # type: ignore[index]


def test_a_chunk_whose_next_values_name_slots_it_lacks_is_refused_by_name() -> None:
    worker = fe.record(gym.make("CartPole-v1"), num_steps=500)
    play(worker, 0, 60)()
    chunk = worker.buffer.take_episodes()
    learner = learner_for(worker.buffer, 500)
    before = fingerprint(learner)
    index = next(part for part in chunk.parts if part.key == ("obs_", "index"))
    bad = index.whole().copy()
    bad[0, 3] = 10_000
    crafted = dataclasses.replace(
        chunk, parts=tuple(dataclasses.replace(part, pieces=(bad,)) if part is index else part for part in chunk.parts)
    )
    with pytest.raises(ValueError, match=r"next-value field 'obs_' of the chunk does not fit .* up to 10000 of"):
        learner.extend(crafted)
    no_tail = dataclasses.replace(chunk, parts=tuple(part for part in chunk.parts if part.part != "tail"))
    with pytest.raises(ValueError, match="'obs_' of the chunk needs both its index and tail"):
        learner.extend(no_tail)
    assert fingerprint(learner) == before
