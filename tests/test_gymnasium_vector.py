"""The vector recorder gives the same rows as one single-env recorder per sub-env."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import iterate
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from tests.envs import ToyEnv

N = 3
FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "truncated")
ENVS: dict[str, Callable[[], gym.Env]] = {
    "CartPole-v1": lambda: gym.make("CartPole-v1", max_episode_steps=30),
    "masks-in-info": lambda: ToyEnv(gym.spaces.Discrete(5), gym.spaces.Discrete(4), lengths=(4, 7, 2), mask_info=True),
}


def follow(singles: list[Any], actions: Any, done: np.ndarray, resetting: np.ndarray, mode: AutoresetMode) -> None:
    """Each single-env recorder does what its sub-env of the vector env did this step: the reset
    that follows an episode's end (the next step under NEXT_STEP, the same one otherwise), or
    the step. ``resetting`` (per sub-env, updated): the next step only resets."""
    for i, single in enumerate(singles):
        if resetting[i]:
            single.reset()
            resetting[i] = False
            continue
        single.step(actions[i])
        if done[i]:
            if mode == AutoresetMode.NEXT_STEP:
                resetting[i] = True
            else:
                single.reset()


def run(make: Callable[[], gym.Env], mode: AutoresetMode, vectorization: str, steps: int = 60) -> tuple[Any, list]:
    vec = fe.record(
        gym.vector.SyncVectorEnv([make] * N, autoreset_mode=mode)
        if vectorization == "sync"
        else gym.vector.AsyncVectorEnv([make] * N, autoreset_mode=mode),
        num_steps=200,
        gamma=0.9,
    )
    singles = [fe.record(make(), num_steps=200, gamma=0.9) for _ in range(N)]
    rng = np.random.default_rng(0)
    vec.reset(seed=10)
    for i, single in enumerate(singles):
        single.reset(seed=10 + i)
    resetting = np.zeros(N, dtype=bool)
    for _ in range(steps):
        actions = rng.integers(0, 2, N)
        _, _, terminated, truncated, _ = vec.step(actions)
        done = terminated | truncated
        follow(singles, actions, done, resetting, mode)
        if mode == AutoresetMode.DISABLED and done.any():
            vec.reset(options={"reset_mask": done})
    vec.close()
    return vec, singles


@pytest.mark.parametrize("vectorization", ["sync", "async"])
@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("name", list(ENVS))
def test_each_lane_equals_a_single_env_recorder(name: str, mode: AutoresetMode, vectorization: str) -> None:
    vec, singles = run(ENVS[name], mode, vectorization)
    assert vec.buffer_spec.n_envs == N
    total = 0
    for i, single in enumerate(singles):
        n = len(single.buffer)
        total += n
        mine = vec.buffer.sample_transitions(idx=i * 200 + np.arange(n))
        theirs = single.buffer.sample_transitions(idx=np.arange(n))
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(mine, field), getattr(theirs, field), err_msg=f"lane {i} {field}")
        # G of many episodes is one pass over all of them (float32 storage: within an ulp or two)
        np.testing.assert_allclose(mine.G, theirs.G, rtol=1e-6, err_msg=f"lane {i} G")
        if single.buffer_spec.action_mask:
            np.testing.assert_array_equal(mine.action_mask[0], theirs.action_mask[0])
            np.testing.assert_array_equal(mine.action_mask_[0], theirs.action_mask_[0])
    assert len(vec.buffer) == total
    assert vec.buffer.n_episodes == sum(s.buffer.n_episodes for s in singles)


def test_vector_annotations_and_feedback_are_per_sub_env() -> None:
    env = fe.record(gym.make_vec("CartPole-v1", num_envs=2), num_steps=50)
    env.reset(seed=0)
    env.annotate(values=np.array([1.0, 2.0]), discrete_log_probs=np.array([[-0.1], [-0.2]]))
    env.step(np.array([0, 1]))
    env.add_feedback(5.0, lane=1)
    lane0 = env.buffer.sample_transitions(idx=np.array([0]))
    lane1 = env.buffer.sample_transitions(idx=np.array([50]))
    assert (lane0.values[0], lane1.values[0]) == (1.0, 2.0)
    assert lane1.individual_auxiliary_rewards[0] == 5.0 and lane0.individual_auxiliary_rewards[0] == 0.0
    with pytest.raises(ValueError, match="leading axis of 2 sub-envs"):
        env.annotate(values=1.0)
    with pytest.raises(ValueError, match="discrete_log_probs of a sub-env must have 1 value"):
        env.annotate(discrete_log_probs=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="memory_weights must be finite and >= 0"):
        env.annotate(memory_weights=np.array([1.0, -1.0]))
    env.buffer.finish_path(np.array([0.5, 0.25]))
    assert not np.isnan(env.buffer.sample_transitions(idx=np.array([0, 50])).G).any()


def test_vector_recorders_claim_a_lane_per_sub_env_of_a_shared_buffer() -> None:
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    shared = fe.FlexibleBuffer.from_spec(spec, num_steps=50, n_envs=4)
    first = fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared)
    second = fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared)
    assert first.lanes == [0, 1] and second.lanes == [2, 3]
    with pytest.raises(fe.SpecMismatchError, match="needs 2"):
        fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared)
    first.close()
    assert fe.record(gym.make_vec("CartPole-v1", num_envs=2), buffer=shared).lanes == [0, 1]


BLOCK_ENVS: dict[str, Callable[[], gym.Env]] = {
    "CartPole-v1": lambda: gym.make("CartPole-v1", max_episode_steps=30),
    "masks-truncated": lambda: ToyEnv(
        gym.spaces.Discrete(5), gym.spaces.Discrete(4), lengths=(4, 26, 2, 9), truncate=True, mask_info=True
    ),
}
ALL_FIELDS = (*FIELDS, "G", "values", "advantages", "returns", "individual_auxiliary_rewards")


def whole_episodes(buffer: fe.FlexibleBuffer, lane: int, num_steps: int) -> list[Any]:
    return [e for e in buffer.episodes() if int(e.idx[0]) // num_steps == lane]


def assert_same_episode(mine: Any, theirs: Any, where: str) -> None:
    for field in ALL_FIELDS:
        a, b = getattr(mine, field), getattr(theirs, field)
        if field == "individual_auxiliary_rewards" and (a is None) != (b is None):  # no feedback in one of them
            a, b = (np.zeros_like(b) if a is None else a), (np.zeros_like(a) if b is None else b)
        if field in ("G", "advantages", "returns"):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{where} {field}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{where} {field}")
    if mine.action_mask is not None:
        np.testing.assert_array_equal(mine.action_mask[0], theirs.action_mask[0], err_msg=f"{where} action_mask")
        np.testing.assert_array_equal(mine.action_mask_[0], theirs.action_mask_[0], err_msg=f"{where} action_mask_")


def record_side_by_side(
    make: Callable[[], gym.Env],
    mode: AutoresetMode,
    num_steps: int,
    *,
    n: int = 3,
    steps: int = 400,
    resets: Collection[int] = (150, 151, 290),
    reads: Collection[int] = (),
    seed: int = 1,
) -> None:
    """A vector recorder and one single-env recorder per sub-env, same actions, annotations,
    feedback, bootstraps and user resets, the buffer read at ``reads`` (mid-block): each lane's
    whole episodes equal its single recorder's, and so does every row while nothing was forgotten."""

    def boot(obs_: np.ndarray) -> float:
        return float(np.sum(obs_)) + 0.5

    vec = fe.record(
        gym.vector.SyncVectorEnv([make] * n, autoreset_mode=mode), num_steps=num_steps, gamma=0.9, bootstrap_fn=boot
    )
    singles = [fe.record(make(), num_steps=num_steps, gamma=0.9, bootstrap_fn=boot) for _ in range(n)]
    rng = np.random.default_rng(seed)
    vec.reset(seed=10)
    for i, single in enumerate(singles):
        single.reset(seed=10 + i)
    resetting = np.zeros(n, dtype=bool)
    for t in range(steps):
        if t in resets:  # the user resets every sub-env mid-episode
            vec.reset()
            for single in singles:
                single.reset()
            resetting[:] = False
        actions = rng.integers(0, 2, n)
        values, log_probs = rng.normal(size=n), rng.normal(size=(n, 1))
        if t % 7:  # some steps are not annotated
            vec.annotate(values=values, discrete_log_probs=log_probs)
            for i, single in enumerate(singles):
                if not resetting[i]:
                    single.annotate(values=values[i], discrete_log_probs=log_probs[i])
        _, _, terminated, truncated, _ = vec.step(actions)
        done = terminated | truncated
        follow(singles, actions, done, resetting, mode)
        if mode == AutoresetMode.DISABLED and done.any():
            vec.reset(options={"reset_mask": done})
        if t in reads:  # a read in the middle of a block writes it
            assert vec.buffer.n_episodes <= sum(s.buffer.n_episodes for s in singles)
        if t % 41 == 5:
            lane = int(rng.integers(n))
            vec.add_feedback(float(t), lane=lane)
            singles[lane].add_feedback(float(t))
    whole = num_steps >= steps  # nothing was forgotten
    for i, single in enumerate(singles):
        mine, theirs = whole_episodes(vec.buffer, i, num_steps), whole_episodes(single.buffer, 0, num_steps)
        # the vector lane may forget its oldest episodes a little early (it makes room an eighth of
        # its ring at a time, and with it the episode that room cuts into); those it keeps are the newest
        early = theirs[: len(theirs) - len(mine)]
        assert len(mine) <= len(theirs)
        assert sum(len(e) for e in early) <= num_steps // 8 + max((len(e) for e in theirs), default=0)
        for k, (a, b) in enumerate(zip(mine, theirs[len(theirs) - len(mine) :])):
            assert_same_episode(a, b, f"lane {i} episode {k}")
        if whole:
            assert len(mine) == len(theirs)
            rows = np.arange(len(single.buffer))
            assert_same_episode(
                vec.buffer.sample_transitions(idx=i * num_steps + rows),
                single.buffer.sample_transitions(idx=rows),
                f"lane {i} rows",
            )


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("name", list(BLOCK_ENVS))
@pytest.mark.parametrize("num_steps", [500, 37, 20])
def test_blocks_of_steps_equal_single_env_recorders_across_wraps_reads_and_resets(
    name: str, mode: AutoresetMode, num_steps: int
) -> None:
    """Several blocks of staged steps, reads in the middle of blocks, rings that wrap (and a
    running episode longer than its ring), user resets mid-episode, annotations, feedback and
    bootstraps."""
    record_side_by_side(BLOCK_ENVS[name], mode, num_steps, reads=range(0, 400, 53))


# CI replays the same examples (derandomized); FLEXIBUFF_EXAMPLES=400 explores new ones
@settings(
    max_examples=int(os.environ.get("FLEXIBUFF_EXAMPLES", "40")),
    deadline=None,
    derandomize="FLEXIBUFF_EXAMPLES" not in os.environ,
)
@given(
    mode=st.sampled_from(list(AutoresetMode)),
    n=st.integers(1, 4),
    num_steps=st.integers(8, 300),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    truncate=st.booleans(),
    reads=st.sets(st.integers(0, 199), max_size=30),
    resets=st.sets(st.integers(0, 199), max_size=4),
    seed=st.integers(0, 1000),
)
def test_any_blocks_reads_and_resets_equal_single_env_recorders(
    mode: AutoresetMode,
    n: int,
    num_steps: int,
    lengths: list[int],
    truncate: bool,
    reads: set[int],
    resets: set[int],
    seed: int,
) -> None:
    """Block recording against single-env recorders for any episode lengths, ring size (wrapping
    or not), sub-env count, autoreset mode, and moments of reads and user resets."""

    def make() -> gym.Env:
        return ToyEnv(
            gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2), lengths=tuple(lengths), truncate=truncate
        )

    record_side_by_side(make, mode, num_steps, n=n, steps=200, resets=resets, reads=reads, seed=seed)


def test_native_vector_env_records_what_the_bare_vector_env_returns() -> None:
    """gymnasium's natively vectorized CartPole (one numpy step for all sub-envs), recorded in
    blocks, against a plain loop over the bare vector env with the same seed and actions."""
    n, steps = 16, 300
    make = lambda: gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")
    env, bare = fe.record(make(), num_steps=steps, gamma=0.97), make()
    actions = np.random.default_rng(0).integers(0, 2, (steps, n))
    obs, _ = env.reset(seed=3)
    held, _ = bare.reset(seed=3)
    np.testing.assert_array_equal(obs, held)  # a drop-in: the wrapped env returns what the bare one does
    expected: list[list[tuple[Any, ...]]] = [[] for _ in range(n)]
    resetting = np.zeros(n, dtype=bool)
    for a in actions:
        got = env.step(a)
        obs_, reward, terminated, truncated, _ = bare.step(a)
        np.testing.assert_array_equal(got[0], obs_)
        for i in np.flatnonzero(~resetting):
            expected[i].append((held[i], a[i], obs_[i], reward[i], terminated[i], truncated[i]))
        resetting = terminated | truncated
        held = obs_
    for i in range(n):
        rows = env.buffer.sample_transitions(idx=i * steps + np.arange(len(expected[i])))
        obs_i, a_i, next_i, r_i, te_i, tr_i = (np.array(x) for x in zip(*expected[i]))
        np.testing.assert_array_equal(rows.obs, obs_i.astype(np.float32))
        np.testing.assert_array_equal(rows.obs_, next_i.astype(np.float32))
        np.testing.assert_array_equal(rows.discrete_actions[:, 0], a_i)
        np.testing.assert_array_equal(rows.individual_rewards, r_i.astype(np.float32))
        np.testing.assert_array_equal(rows.terminated, te_i)
        np.testing.assert_array_equal(rows.truncated, tr_i)
        ends = np.flatnonzero(te_i | tr_i)
        for first, last in zip(np.r_[0, ends[:-1] + 1], ends):  # G of each ended episode, by a plain loop
            g, want = 0.0, []
            for r in r_i[first : last + 1][::-1]:
                g = r + 0.97 * g
                want.append(g)
            np.testing.assert_allclose(rows.G[first : last + 1], want[::-1], rtol=1e-5)
    assert len(env.buffer) == sum(len(e) for e in expected)


class BadRewardAt(gym.vector.VectorWrapper):
    """Returns text for the rewards at step ``at`` (counted from the first step)."""

    def __init__(self, env: gym.vector.VectorEnv, at: int) -> None:
        super().__init__(env)
        self.at, self.t = at, 0

    def step(self, actions: Any) -> Any:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.t += 1
        return obs, (np.array(["x"] * self.num_envs) if self.t == self.at else rewards), terminated, truncated, info


def test_a_step_that_cannot_be_recorded_keeps_every_earlier_step_and_recording_resumes_at_reset() -> None:
    n = 4
    env = fe.record(BadRewardAt(gym.make_vec("CartPole-v1", n, vectorization_mode="sync"), at=71), num_steps=500)
    reference = fe.record(gym.make_vec("CartPole-v1", n, vectorization_mode="sync"), num_steps=500)
    env.reset(seed=0)
    reference.reset(seed=0)
    for _ in range(70):  # more than a block, and the next block partly staged
        env.step(np.ones(n, dtype=np.int64))
        reference.step(np.ones(n, dtype=np.int64))
    recorded = len(reference.buffer)
    with pytest.raises(fe.EnvValueError, match="rewards must be 4 numbers") as caught:
        env.step(np.ones(n, dtype=np.int64))
    assert any("not recorded" in note for note in getattr(caught.value, "__notes__", []))
    assert len(env.buffer) == recorded  # every step before the failing one is kept
    for lane in range(n):  # every running episode ends at its last whole step, as truncated
        episodes = [e for e in env.buffer.episodes() if int(e.idx[0]) // 500 == lane]
        assert episodes and episodes[-1].truncated[-1] | episodes[-1].terminated[-1]
    before = len(env.buffer)
    env.step(np.ones(n, dtype=np.int64))  # no episode runs: nothing is recorded until a reset
    assert len(env.buffer) == before
    env.reset()
    env.step(np.ones(n, dtype=np.int64))
    assert len(env.buffer) == before + n


def composite() -> gym.Env:  # spaces of its own: a space samples (and is seeded) by its own generator
    return ToyEnv(
        gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "room": gym.spaces.Discrete(3)}),
        gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1, 1, (2,), np.float32))),
        lengths=(3, 5),
        truncate=True,
    )


SPACES: dict[str, Callable[[], gym.Env]] = {
    "Pendulum-v1 (Box actions)": lambda: gym.make("Pendulum-v1", max_episode_steps=7),
    "FrozenLake-v1 (Discrete observations)": lambda: gym.make("FrozenLake-v1", max_episode_steps=9),
    "MultiDiscrete both": lambda: ToyEnv(
        gym.spaces.MultiDiscrete([3, 4], start=[1, -1]), gym.spaces.MultiDiscrete([2, 5]), lengths=(4, 6)
    ),
    "MultiBinary both": lambda: ToyEnv(gym.spaces.MultiBinary(5), gym.spaces.MultiBinary(3), lengths=(2, 5)),
    "Dict observations, Tuple actions (one by one)": composite,
}


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("name", list(SPACES))
def test_every_batch_encoding_gives_a_single_env_recorder_s_rows(name: str, mode: AutoresetMode) -> None:
    """Each space kind's batch encoding (Box and category observations; Box, MultiDiscrete and
    MultiBinary actions) and the one-by-one fallback (a Dict, a Tuple; SAME_STEP's final
    observations) write what one recorder per sub-env writes."""
    make = SPACES[name]
    vec = fe.record(gym.vector.SyncVectorEnv([make] * 3, autoreset_mode=mode), num_steps=100, gamma=0.9)
    singles = [fe.record(make(), num_steps=100, gamma=0.9) for _ in range(3)]
    vec.reset(seed=2)
    for i, single in enumerate(singles):
        single.reset(seed=2 + i)
    vec.action_space.seed(1)
    resetting = np.zeros(3, dtype=bool)
    for _ in range(30):
        actions = vec.action_space.sample()
        _, _, terminated, truncated, _ = vec.step(actions)
        done = terminated | truncated
        follow(singles, list(iterate(vec.action_space, actions)), done, resetting, mode)
        if mode == AutoresetMode.DISABLED and done.any():
            vec.reset(options={"reset_mask": done})
    for i, single in enumerate(singles):
        rows = np.arange(len(single.buffer))
        mine, theirs = vec.buffer.sample_transitions(idx=i * 100 + rows), single.buffer.sample_transitions(idx=rows)
        for field in (*FIELDS, "continuous_actions"):
            np.testing.assert_array_equal(getattr(mine, field), getattr(theirs, field), err_msg=f"lane {i} {field}")
        np.testing.assert_allclose(mine.G, theirs.G, rtol=1e-6, err_msg=f"lane {i} G")  # one scan: within an ulp
