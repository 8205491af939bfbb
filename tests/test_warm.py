"""`fe.warm`, velora's warm-up: a buffer filled before training, equal to a plain loop over the
bare env with the same seeds and actions, with exactly the budget asked for."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe


def plain_cartpole(seed: int, episodes: int) -> list[dict[str, list]]:
    """Episodes of CartPole under uniformly random actions, seeded as `warm` seeds them."""
    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out: list[dict[str, list]] = []
    for _ in range(episodes):
        steps: dict[str, list] = {"obs": [], "actions": [], "rewards": []}
        done = False
        while not done:
            action = env.action_space.sample()
            steps["obs"].append(obs)
            steps["actions"].append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            steps["rewards"].append(reward)
            done = terminated or truncated
        out.append(steps)
        obs, _ = env.reset()
    return out


def test_warm_records_whole_episodes_equal_to_a_plain_loop() -> None:
    buffer = fe.warm("CartPole-v1", episodes=5, seed=3, gamma=0.9)
    episodes = list(buffer.episodes())
    want = plain_cartpole(3, 5)
    assert len(episodes) == 5 and len(buffer) == sum(len(e["obs"]) for e in want)  # nothing else
    for got, plain in zip(episodes, want, strict=True):
        np.testing.assert_array_equal(got.obs, np.asarray(plain["obs"]))
        np.testing.assert_array_equal(got.discrete_actions[:, 0], plain["actions"])
        np.testing.assert_allclose(got.G[0], sum(0.9**k * r for k, r in enumerate(plain["rewards"])), rtol=1e-5)


def test_warm_counts_steps_exactly_and_fills_a_given_buffer_from_a_vector_env() -> None:
    assert len(fe.warm("CartPole-v1", steps=57, seed=0)) == 57
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(gym.make_vec("CartPole-v1", num_envs=4)), num_steps=100)
    assert fe.warm("CartPole-v1", buffer, steps=200, num_envs=4, seed=1) is buffer
    assert len(buffer) == 200 and buffer.n_episodes >= 1  # 50 steps of each of 4 sub-envs, each its own lane
    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    plain = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync", vector_kwargs=same_step)
    plain.action_space.seed(1)
    obs, _ = plain.reset(seed=1)
    first: list[np.ndarray] = []  # sub-env 0's first episode
    for _ in range(50):
        first.append(obs[0])
        obs, _, terminated, truncated, _ = plain.step(plain.action_space.sample())
        if terminated[0] or truncated[0]:
            break
    np.testing.assert_array_equal(next(iter(buffer.episodes())).obs, np.asarray(first))  # lane 0's first


def test_warm_plays_pettingzoo_with_legal_moves_or_a_policy() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import connect_four_v3

    buffer = fe.warm(connect_four_v3.env(), episodes=3, seed=0)
    assert buffer.n_episodes == 3
    batch = buffer.sample_transitions(len(buffer), idx=np.arange(len(buffer)))
    for k in range(2):  # every move taken was legal where it was taken
        moved = batch.active[k]
        legal = batch.action_mask[0][k][moved]
        assert legal[np.arange(int(moved.sum())), batch.discrete_actions[k][moved][:, 0]].all()
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    spread = fe.warm(
        simple_spread_v3.parallel_env(max_cycles=5), episodes=2, policy=lambda obs, infos: dict.fromkeys(obs, 4)
    )
    assert spread.n_episodes == 2 and (spread.sample_transitions(10, idx=np.arange(10)).discrete_actions == 4).all()


def test_warm_says_what_it_needs() -> None:
    with pytest.raises(fe.InvalidArgumentError, match="steps= or episodes="):
        fe.warm("CartPole-v1")
    with pytest.raises(fe.InvalidArgumentError, match="num_envs=4 makes a vector env of a Gymnasium id"):
        fe.warm(gym.make("CartPole-v1"), steps=10, num_envs=4)
    with pytest.raises(fe.InvalidArgumentError, match="steps must be a positive integer"):
        fe.warm("CartPole-v1", steps=0)
