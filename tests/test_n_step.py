"""n-step batches against n-step returns computed by a plain loop over the bare env's steps."""

from __future__ import annotations

import itertools
import warnings

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.testing.pz_reference import play_aec, play_parallel, replay_aec, replay_parallel

GAMMA = 0.9


def reference(
    rewards: np.ndarray, done: np.ndarray, active: np.ndarray, episodes: list[tuple[int, int]], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per agent and row ``[A, R]``: the discounted sum of up to ``n`` of the agent's own steps
    from the row on (the row, then its next active rows of the episode; the agent's done step is
    the last) and the row those steps end at."""
    total = np.zeros(rewards.shape)
    last = np.zeros(rewards.shape, dtype=np.int64)
    for start, end in episodes:
        for agent in range(rewards.shape[0]):
            for row in range(start, end):
                steps = [row] + [k for k in range(row + 1, end) if active[agent, k]]
                for j, k in enumerate(steps[:n]):
                    total[agent, row] += GAMMA**j * rewards[agent, k]
                    last[agent, row] = k
                    if done[agent, k]:
                        break
    return total, last


def steps_taken(last: np.ndarray, active: np.ndarray) -> np.ndarray:
    """How many of the agent's own steps each window summed (the row itself, then active rows)."""
    rows = np.arange(last.shape[1])
    own = np.cumsum(active, axis=1)
    return own[np.arange(last.shape[0])[:, None], last] - own[:, rows] + 1


def cartpole_loop(env: gym.Env, seed: int, steps: int) -> dict[str, np.ndarray]:
    """Step ``env`` with seeded random actions, resetting at episode ends; every transition."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out: dict[str, list] = {k: [] for k in ("obs_", "reward", "terminated", "truncated")}
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        for name, value in zip(out, (obs, reward, terminated, truncated)):
            out[name].append(value)
        if terminated or truncated:
            obs, _ = env.reset()
    return {name: np.array(values) for name, values in out.items()}


def episodes_of(done: np.ndarray) -> list[tuple[int, int]]:
    ends = [0, *(np.flatnonzero(done) + 1).tolist()]
    if ends[-1] < done.size:
        ends.append(done.size)
    return list(itertools.pairwise(ends))


@pytest.mark.parametrize("n", [1, 3, 5])
def test_cartpole_windows_stop_at_terminations_truncations_and_the_newest_row(n: int) -> None:
    """A 12-step time limit truncates; poles fall; the ring (150 rows) wraps several times."""
    steps = 500
    expected = cartpole_loop(gym.make("CartPole-v1", max_episode_steps=12), 3, steps)
    env = fe.record(gym.make("CartPole-v1", max_episode_steps=12), num_steps=150, gamma=GAMMA)
    env.action_space.seed(3)
    env.reset(seed=3)
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    buffer = env.buffer
    assert expected["terminated"].any() and expected["truncated"].any()
    rows = np.concatenate([b.idx for b in buffer.minibatches(1000, shuffle=False)])  # oldest first
    kept = slice(steps - rows.size, steps)  # the ring forgot the oldest episodes
    done = expected["terminated"] | expected["truncated"]
    rewards, last = reference(expected["reward"][None], done[None], np.ones((1, steps), bool), episodes_of(done), n)
    batch = buffer.sample_transitions(idx=rows, n_step=n)
    np.testing.assert_allclose(batch.individual_rewards, rewards[0, kept], rtol=1e-6)
    np.testing.assert_array_equal(batch.obs_, expected["obs_"][last[0, kept]])
    np.testing.assert_array_equal(batch.terminated, expected["terminated"][last[0, kept]])
    np.testing.assert_array_equal(batch.truncated, expected["truncated"][last[0, kept]])
    k = last[0, kept] - np.arange(steps)[kept] + 1
    np.testing.assert_allclose(batch.discounts, GAMMA**k, rtol=1e-6)
    assert batch.discounts.dtype == np.float32
    if n == 3:  # some windows are cut by an episode end, the newest included
        assert {1, 2, 3} <= set(k.tolist())
        assert k[-1] == 1 and not (batch.terminated[-1] or batch.truncated[-1])


def test_n_step_1_is_the_plain_batch_with_gamma_as_discount() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=300, gamma=GAMMA, seed=0)
    env.reset(seed=0)
    for _ in range(250):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    plain = env.buffer.sample_transitions(64)
    one = env.buffer.sample_transitions(idx=plain.idx, n_step=1)
    for name in ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "truncated", "G"):
        np.testing.assert_array_equal(getattr(one, name), getattr(plain, name), err_msg=name)
    assert plain.discounts is None
    np.testing.assert_array_equal(one.discounts, np.float32(GAMMA))


def test_vector_lanes_each_sum_their_own_sub_env() -> None:
    n, steps, num_envs = 4, 120, 3
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15)] * num_envs)
    env = fe.record(vec, num_steps=200, gamma=GAMMA)
    bare = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15)] * num_envs)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, (steps, num_envs))
    env.reset(seed=0)
    bare.reset(seed=0)
    lanes: list[dict[str, list]] = [{"obs_": [], "reward": [], "done": [], "terminated": []} for _ in range(num_envs)]
    resetting = np.zeros(num_envs, bool)
    for act in actions:
        env.step(act)
        obs, reward, terminated, truncated, _ = bare.step(act)
        for i in np.flatnonzero(~resetting):  # NEXT_STEP: a step after an end only resets
            for name, value in zip(lanes[i], (obs[i], reward[i], terminated[i] | truncated[i], terminated[i])):
                lanes[i][name].append(value)
        resetting = terminated | truncated
    batch_rows, want_rewards, want_obs_, want_terminated = [], [], [], []
    for i, lane in enumerate(lanes):
        done = np.array(lane["done"])
        rewards, last = reference(
            np.array(lane["reward"])[None], done[None], np.ones((1, done.size), bool), episodes_of(done), n
        )
        batch_rows.append(i * 200 + np.arange(done.size))
        want_rewards.append(rewards[0])
        want_obs_.append(np.array(lane["obs_"])[last[0]])
        want_terminated.append(np.array(lane["terminated"])[last[0]])
    batch = env.buffer.sample_transitions(idx=np.concatenate(batch_rows), n_step=n)
    np.testing.assert_allclose(batch.individual_rewards, np.concatenate(want_rewards), rtol=1e-6)
    np.testing.assert_array_equal(batch.obs_, np.concatenate(want_obs_))
    np.testing.assert_array_equal(batch.terminated, np.concatenate(want_terminated))


def check_agents(expected, buffer: fe.FlexibleBuffer, n: int) -> None:  # type: ignore[no-untyped-def]
    done = expected.terminated | expected.truncated
    rewards, last = reference(expected.rewards, done, expected.active, expected.episodes, n)
    rows = expected.rewards.shape[1]
    batch = buffer.sample_transitions(idx=np.arange(rows), n_step=n)
    agents = np.arange(rewards.shape[0])[:, None]
    acted = expected.active  # the rows of each agent's own transitions
    np.testing.assert_allclose(batch.individual_rewards[acted], rewards[acted], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batch.obs_[acted], expected.obs_[agents, last][acted])
    np.testing.assert_array_equal(batch.terminated[acted], expected.terminated[agents, last][acted])
    np.testing.assert_array_equal(batch.truncated[acted], expected.truncated[agents, last][acted])
    k = steps_taken(last, expected.active)
    np.testing.assert_allclose(batch.discounts[acted], GAMMA ** k[acted], rtol=1e-6)
    if expected.mask_ is not None:
        np.testing.assert_array_equal(
            np.concatenate(batch.action_mask_, axis=-1)[acted], expected.mask_[agents, last][acted]
        )
    team = expected.rewards.sum(axis=0)
    want = [
        sum(GAMMA**j * team[k] for j, k in enumerate(range(row, min(row + n, end))))
        for start, end in expected.episodes
        for row in range(start, end)
    ]
    np.testing.assert_allclose(batch.global_rewards, want, rtol=1e-5, atol=1e-5)


def test_agents_that_die_mid_window_stop_at_their_own_last_step() -> None:
    pytest.importorskip("pettingzoo")
    warnings.filterwarnings("ignore", module="pettingzoo")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    def make():  # type: ignore[no-untyped-def]
        return knights_archers_zombies_v11.parallel_env(line_death=True, spawn_delay=1000, max_cycles=100)

    expected, _ = play_parallel(make(), seed=2, steps=40)
    env = fe.record(make(), num_steps=200, gamma=GAMMA)
    replay_parallel(env, 2, expected.actions)
    start, end = expected.episodes[0]
    deaths = {int(np.flatnonzero(t[start:end])[0]) for t in expected.terminated if t[start:end].any()}
    assert len(deaths) > 1  # agents die at different steps while others play on
    check_agents(expected, env.buffer, 4)


def test_aec_turns_sum_each_agents_own_turns() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import connect_four_v3

    expected = play_aec(connect_four_v3.env(), seed=0, episodes=4)
    env = fe.record(connect_four_v3.env(), num_steps=200, gamma=GAMMA)
    replay_aec(env, 0, 4, expected.actions)
    check_agents(expected, env.buffer, 3)


def test_prioritized_n_step_torch_batches() -> None:
    torch = pytest.importorskip("torch")
    env = fe.record(gym.make("CartPole-v1"), num_steps=300, gamma=GAMMA, seed=0)
    env.reset(seed=0)
    for _ in range(100):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    batch = env.buffer.sample_transitions(
        32,
        prioritized=True,
        n_step=3,
        as_torch=True,
        fields=("obs", "obs_", "individual_rewards", "terminated", "discounts"),
    )
    assert batch.discounts.dtype == torch.float32 and batch.weights.shape == (32,)
    assert batch.discrete_actions is None and batch.obs_.shape == (32, 4)
    again = env.buffer.sample_transitions(idx=batch.idx.numpy(), n_step=3)
    np.testing.assert_allclose(batch.individual_rewards.numpy(), again.individual_rewards)


def test_bad_n_step_and_rows_not_recorded_are_refused() -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=100)
    env.reset(seed=0)
    for _ in range(5):
        env.step(0)
    with pytest.raises(ValueError, match="n_step"):
        env.buffer.sample_transitions(4, n_step=0)
    with pytest.raises(ValueError, match="one-dimensional"):
        env.buffer.sample_transitions(idx=np.zeros((2, 2), dtype=np.int64), n_step=2)
    with pytest.raises(ValueError, match="not recorded"):
        env.buffer.sample_transitions(idx=np.array([50]), n_step=2)


def test_rows_an_agent_sits_out_are_skipped_by_its_window() -> None:
    """b sits out three steps in a row (the window widens past them): its 3-step window still sums
    its own next transitions, as a plain loop over the bare env lists them."""
    from tests.test_pettingzoo_parallel import ScriptedParallel, own_transitions

    spawn, end = {"a": 0, "b": 0}, {"a": 9, "b": 8}
    plan = [
        {"a": 0, "b": 1},
        {"a": 0, "b": 1},
        {"a": 0},
        {"a": 0},
        {"a": 0},
        {"a": 1, "b": 0},
        {"a": 1},
        {"a": 1, "b": 2},
        {"a": 2},
    ]
    expected = own_transitions(ScriptedParallel(spawn, end), plan)
    env = fe.record(ScriptedParallel(spawn, end), num_steps=50, gamma=GAMMA)
    own_transitions(env, plan)
    batch = env.buffer.sample_transitions(idx=np.arange(len(plan)), n_step=3)
    for i, agent in enumerate(env.possible_agents):
        mine = expected[agent]
        rows = np.flatnonzero(env.buffer.sample_transitions(idx=np.arange(len(plan))).active[i])
        assert len(rows) == len(mine)
        want = [sum(GAMMA**j * t["reward"] for j, t in enumerate(mine[k : k + 3])) for k in range(len(mine))]
        np.testing.assert_allclose(batch.individual_rewards[i, rows], want, rtol=1e-6)
        np.testing.assert_array_equal(batch.obs_[i, rows], [t["obs_"] for t in mine[2:]] + [mine[-1]["obs_"]] * 2)
        np.testing.assert_allclose(batch.discounts[i, rows], GAMMA ** np.minimum(3, len(mine) - np.arange(len(mine))))


def test_a_hand_filled_termination_ends_the_window_even_inside_an_episode() -> None:
    buffer = fe.FlexibleBuffer(20, 1, [2], individual_reward=True, gamma=GAMMA)
    buffer.begin_episode()
    rows = buffer.claim_rows(6)
    buffer.end_episode()
    buffer.field("individual_rewards")[0, rows] = [1, 2, 3, 4, 5, 6]
    buffer.field("terminated")[0, rows[2]] = True  # the agent's episode ended at its third step
    batch = buffer.sample_transitions(idx=rows, n_step=3)
    np.testing.assert_allclose(
        batch.individual_rewards,
        [1 + 2 * GAMMA + 3 * GAMMA**2, 2 + 3 * GAMMA, 3, 4 + 5 * GAMMA + 6 * GAMMA**2, 5 + 6 * GAMMA, 6],
        rtol=1e-6,
    )
    np.testing.assert_array_equal(batch.terminated, [True, True, True, False, False, False])
