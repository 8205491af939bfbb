"""The Gymnasium recorder against a plain loop over the bare env with the same seed and actions."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import flexibuff_envs as fe
from flexibuff_envs.testing import same
from flexibuff_envs.testing.reference import Log, play
from tests.envs import ToyEnv

GAMMA = 0.9

CASES: dict[str, tuple[Callable[[], gym.Env], int]] = {
    "CartPole-v1": (lambda: gym.make("CartPole-v1"), 300),
    "Pendulum-v1": (lambda: gym.make("Pendulum-v1", max_episode_steps=40), 130),
    "Blackjack-v1": (lambda: gym.make("Blackjack-v1"), 60),
    "Taxi-v4": (lambda: gym.make("Taxi-v4", max_episode_steps=30), 100),
    "FrozenLake-v1": (lambda: gym.make("FrozenLake-v1"), 120),
    "CarRacing-v3": (lambda: gym.make("CarRacing-v3", max_episode_steps=12), 25),
    "tuple-discrete-box-actions": (
        lambda: ToyEnv(
            spaces.Box(-1, 1, (2, 3), np.float64),
            spaces.Tuple((spaces.Discrete(3, start=-1), spaces.Box(-2, 2, (2,), np.float32))),
            lengths=(3, 7),
        ),
        40,
    ),
    "multidiscrete-actions": (
        lambda: ToyEnv(
            spaces.Dict({"pos": spaces.Discrete(4), "bits": spaces.MultiBinary(3)}),
            spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[0, 1], [-1, 0]])),
            lengths=(4, 2, 6),
        ),
        40,
    ),
    "dict-mixed-actions": (
        lambda: ToyEnv(
            spaces.Box(0, 255, (4, 4), np.uint8),
            spaces.Dict({"move": spaces.MultiBinary(2), "aim": spaces.Box(-1, 1, (3,), np.float32)}),
            lengths=(5,),
            truncate=True,
        ),
        30,
    ),
    "info-mask": (lambda: ToyEnv(spaces.Discrete(6), spaces.Discrete(4), lengths=(6, 3), mask_info=True), 40),
}


def recorded_run(name: str) -> tuple[Log, Log, fe.GymRecorder]:
    make, steps = CASES[name]
    reference = play(make(), seed=7, steps=steps)
    env = fe.record(make(), num_steps=1000, gamma=GAMMA)
    replay = play(env, seed=7, steps=steps, actions=reference.actions)
    return reference, replay, env


@pytest.mark.parametrize("name", list(CASES))
def test_wrapped_env_returns_exactly_what_the_bare_env_returns(name: str) -> None:
    reference, replay, _ = recorded_run(name)
    assert len(reference.returned) == len(replay.returned)
    for bare, wrapped in zip(reference.returned, replay.returned):
        assert same(bare, wrapped)


@pytest.mark.parametrize("name", list(CASES))
def test_every_recorded_field_equals_the_reference_log(name: str) -> None:
    reference, _, env = recorded_run(name)
    buffer = env.buffer
    n = len(reference.reward)
    assert len(buffer) == n
    batch = buffer.sample_transitions(idx=np.arange(n))
    expected_obs = np.stack(reference.obs)
    assert batch.obs.dtype == expected_obs.dtype
    np.testing.assert_array_equal(batch.obs, expected_obs)
    np.testing.assert_array_equal(batch.obs_, np.stack(reference.obs_))
    if buffer.spec.discrete_action_cardinalities:
        np.testing.assert_array_equal(batch.discrete_actions, np.array(reference.discrete))
    else:
        assert batch.discrete_actions is None
    if buffer.spec.continuous_action_dimension:
        np.testing.assert_allclose(batch.continuous_actions, np.array(reference.continuous, dtype=np.float32))
    else:
        assert batch.continuous_actions is None
    np.testing.assert_allclose(batch.individual_rewards, np.array(reference.reward, dtype=np.float32))
    np.testing.assert_allclose(batch.global_rewards, np.array(reference.reward, dtype=np.float32))
    np.testing.assert_array_equal(batch.terminated, reference.terminated)
    np.testing.assert_array_equal(batch.truncated, reference.truncated)
    assert batch.active.all()
    np.testing.assert_allclose(batch.G, reference.G(GAMMA), rtol=1e-5, atol=1e-5)
    if reference.mask[0] is None:
        assert batch.action_mask is None and not buffer.spec.action_mask
    else:
        np.testing.assert_array_equal(np.concatenate(batch.action_mask, axis=-1), np.stack(reference.mask))
        np.testing.assert_array_equal(np.concatenate(batch.action_mask_, axis=-1), np.stack(reference.mask_))
    episodes = buffer.sample_episodes(n_episodes=len(reference.episodes))
    assert [len(e) for e in episodes] == [end - start for start, end in reference.episodes]


def test_masks_follow_the_mask_source() -> None:
    for name in ("Taxi-v4", "info-mask"):
        _, _, env = recorded_run(name)
        assert env.buffer_spec.action_mask
    _, _, env = recorded_run("CartPole-v1")
    assert not env.buffer_spec.action_mask
    assert env.buffer.sample_transitions(4).action_mask is None


def test_car_racing_images_stay_one_byte_per_value() -> None:
    _, _, env = recorded_run("CarRacing-v3")
    assert env.buffer_spec.obs_dtype == "uint8"
    assert env.buffer_spec.obs_size == 96 * 96 * 3
    assert env.buffer.field("obs").itemsize == 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Taxi-v4", "Blackjack-v1", "Pendulum-v1"])
def test_check_env_passes_on_the_wrapped_env(env_id: str) -> None:
    env = fe.record(gym.make(env_id).unwrapped, num_steps=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # check_env's own notes about seeding/rendering
        check_env(env, skip_render_check=True)
    assert len(env.buffer) > 0


def test_spec_make_rebuilds_the_recorder_with_a_fresh_buffer() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=123, gamma=0.5)
    env.reset(seed=0)
    env.step(0)
    rebuilt = env.spec.make()
    assert isinstance(rebuilt, fe.GymRecorder)
    assert rebuilt.buffer is not env.buffer and len(rebuilt.buffer) == 0
    assert rebuilt.buffer.num_steps == 123 and rebuilt.buffer.gamma == 0.5


def test_buffer_reachable_through_outer_wrappers() -> None:
    inner = fe.record(gym.make("CartPole-v1"), num_steps=50)
    outer = gym.wrappers.RecordEpisodeStatistics(gym.wrappers.ClipReward(inner, -0.5, 0.5))
    assert outer.get_wrapper_attr("buffer") is inner.buffer
    assert outer.get_wrapper_attr("buffer_spec") == inner.buffer_spec
    outer.reset(seed=1)
    outer.step(1)
    assert inner.buffer.sample_transitions(1).individual_rewards[0] == 1.0  # the env's own reward


def test_truncation_bootstraps_with_bootstrap_fn() -> None:
    env = fe.record(
        ToyEnv(lengths=(4,), truncate=True), num_steps=50, gamma=0.5, bootstrap_fn=lambda obs: 10.0 + float(obs.sum())
    )
    env.reset(seed=3)
    for _ in range(4):
        last = env.step(0)
    batch = env.buffer.sample_transitions(idx=np.arange(4))
    expected = last[1] + 0.5 * (10.0 + float(np.asarray(last[0], np.float32).sum()))
    assert batch.truncated[-1] and not batch.terminated[-1]
    assert batch.G[-1] == pytest.approx(expected, rel=1e-5)
    assert batch.G[0] == pytest.approx(batch.individual_rewards[0] + 0.5 * batch.G[1], rel=1e-5)


def test_reset_before_the_end_closes_the_episode_as_truncated() -> None:
    env = fe.record(ToyEnv(lengths=(10,)), num_steps=50, gamma=0.5)
    env.reset(seed=0)
    for _ in range(3):
        env.step(1)
    env.reset()
    assert env.buffer.n_episodes == 1
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert episode.truncated.tolist() == [False, False, True]
    assert not np.isnan(episode.G).any()


def test_step_after_the_end_without_reset_is_not_a_row() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=600)
    env.reset(seed=0)
    terminated = truncated = False
    while not (terminated or truncated):
        _, _, terminated, truncated, _ = env.step(0)
    rows = len(env.buffer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium warns about the stray step itself
        env.step(0)
    assert len(env.buffer) == rows


def test_steps_waiting_to_be_written_are_in_every_read() -> None:
    """Steps are written a run at a time (when the episode ends, when 256 wait, or when the
    buffer is read): every read sees each step recorded so far, and an episode longer than a
    run (600 steps), read in its middle, equals a plain loop over the bare env."""
    steps = 700
    actions = [k % 2 for k in range(steps)]
    reference = play(ToyEnv(lengths=(600, 7, 3)), seed=0, steps=steps, actions=actions)
    env = fe.record(ToyEnv(lengths=(600, 7, 3)), num_steps=1000, gamma=GAMMA)
    env.reset(seed=0)
    reads = {*range(0, steps, 37), 255, 256, 257, 599, 600}
    for t, action in enumerate(actions):
        _, _, terminated, truncated, _ = env.step(action)
        if t in reads:
            assert len(env.buffer) == t + 1
            newest = env.buffer.sample_transitions(idx=np.array([t]))  # one lane, no wrap: row t
            np.testing.assert_array_equal(newest.obs_[0], reference.obs_[t])
        if terminated or truncated:
            env.reset()
    batch = env.buffer.sample_transitions(idx=np.arange(steps))
    np.testing.assert_array_equal(batch.obs, np.stack(reference.obs))
    np.testing.assert_array_equal(batch.obs_, np.stack(reference.obs_))
    np.testing.assert_allclose(batch.individual_rewards, np.array(reference.reward, dtype=np.float32))
    np.testing.assert_array_equal(batch.terminated, reference.terminated)
    ended = reference.episodes[-1][1]
    np.testing.assert_allclose(batch.G[:ended], reference.G(GAMMA)[:ended], rtol=1e-5, atol=1e-5)


def test_large_observations_wait_a_few_at_a_time() -> None:
    """4 MiB observations: the steps waiting to be written hold at most 16 MiB of them (256 would
    take 1 GiB beside the ring), and every step reads back as the env returned it."""
    from flexibuff_envs.recording.single_agent import STAGE_BYTES

    space = spaces.Box(0, 255, (1024, 1024, 4), np.uint8)
    reference = play(ToyEnv(space, lengths=(7,)), seed=0, steps=12, actions=[0] * 12)
    env = fe.record(ToyEnv(space, lengths=(7,)), num_steps=20)
    staged = env.get_wrapper_attr("_recorder")._staged
    assert staged.obs.nbytes <= STAGE_BYTES + space.shape[0] * space.shape[1] * space.shape[2]
    env.reset(seed=0)
    for _ in range(12):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            env.reset()
    batch = env.buffer.sample_transitions(idx=np.arange(12))
    np.testing.assert_array_equal(batch.obs_, np.stack(reference.obs_))


def test_user_buffer_must_match_the_env() -> None:
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    good = fe.FlexibleBuffer.from_spec(spec, num_steps=10)
    assert fe.record(gym.make("CartPole-v1"), buffer=good).buffer is good
    wrong = fe.FlexibleBuffer(10, 5, [2], individual_reward=True, global_reward=True)
    with pytest.raises(fe.SpecMismatchError, match="obs_size"):
        fe.record(gym.make("CartPole-v1"), buffer=wrong)


def test_record_rejects_what_is_not_an_env() -> None:
    with pytest.raises(TypeError, match="gymnasium.Env"):
        fe.record(object())


def plain_episodes(seed: int, actions: list[int]) -> list[tuple[int, list[float]]]:
    """A plain loop over bare CartPole: (length, G) of each ended episode, gamma 0.99."""
    env, out, rewards = gym.make("CartPole-v1"), [], []
    env.reset(seed=seed)
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            g, returns = 0.0, []
            for r in reversed(rewards):
                g = r + 0.99 * g
                returns.append(g)
            out.append((len(rewards), returns[::-1]))
            rewards = []
            env.reset()
    return out


def test_recorders_sharing_a_buffer_write_a_lane_each() -> None:
    """The DummyVecEnv pattern: several fe.record(env_i, buffer=shared) stepped in turn."""
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    shared = fe.FlexibleBuffer.from_spec(spec, num_steps=2000, n_envs=3)
    envs = [fe.record(gym.make("CartPole-v1"), buffer=shared) for _ in range(3)]
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(3, 400)).tolist()
    for i, env in enumerate(envs):
        env.reset(seed=i)
    for t in range(400):
        for i, env in enumerate(envs):
            _, _, terminated, truncated, _ = env.step(actions[i][t])
            if terminated or truncated:
                env.reset()
    expected = sorted((n, g) for i in range(3) for n, g in plain_episodes(i, actions[i]))
    got = sorted(((len(e.G), e.G) for e in shared.episodes()), key=lambda episode: episode[0])
    assert [n for n, _ in got] == [n for n, _ in expected] and len(shared) == 1200
    for (_, g), (_, g_plain) in zip(got, expected):  # CartPole's G follows from the length
        np.testing.assert_allclose(g, g_plain, rtol=1e-5)
    with pytest.raises(fe.SpecMismatchError, match="n_envs"):  # every lane is written
        fe.record(gym.make("CartPole-v1"), buffer=shared)
    envs[1].close()  # frees its lane
    assert fe.record(gym.make("CartPole-v1"), buffer=shared)._recorder.lane == 1
    del envs[0]  # so does dropping a recorder
    assert fe.record(gym.make("CartPole-v1"), buffer=shared)._recorder.lane == 0


def test_record_spells_out_its_keywords() -> None:
    import inspect

    params = inspect.signature(fe.record).parameters
    for name in (
        "num_steps",
        "gamma",
        "gae_lambda",
        "bootstrap_fn",
        "seed",
        "global_reward",
        "record_state",
        "alpha",
        "extra_fields",
    ):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    from flexibuff_envs.recording import AECRecorder, ParallelRecorder

    for recorder in (fe.GymRecorder, fe.VectorRecorder, ParallelRecorder, AECRecorder):  # each kind's own
        assert {"alpha", "extra_fields"} <= inspect.signature(recorder).parameters.keys(), recorder
    with pytest.raises(TypeError, match="global_reward"):
        fe.record(gym.make("CartPole-v1"), global_reward="mean")
    with pytest.raises(ValueError, match="gae_lambda"):
        fe.record(gym.make("CartPole-v1"), gae_lambda=1.5)
    env = fe.record(gym.make("CartPole-v1"), gae_lambda=0.8, seed=3)
    assert env.buffer.gae_lambda == 0.8
    twin = fe.record(gym.make("CartPole-v1"), seed=3)
    for e in (env, twin):
        e.reset(seed=0)
        for _ in range(50):
            if any(e.step(0)[2:4]):
                e.reset()
    np.testing.assert_array_equal(env.buffer.sample_transitions(8).idx, twin.buffer.sample_transitions(8).idx)
    with pytest.raises(fe.SpecMismatchError, match="gae_lambda"):
        fe.record(gym.make("CartPole-v1"), buffer=env.buffer, gae_lambda=0.9)
