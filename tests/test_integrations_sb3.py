"""Stable-Baselines3 trains on a recorded VecEnv as on the bare one, and the buffer holds exactly
SB3's steps: one lane per sub-env, each episode whole, as its Monitor counted it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("torch")

from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import flexibuff_envs as fe
from flexibuff_envs.integrations.sb3 import RecordingVecEnv
from flexibuff_envs.testing.reference import plain_returns


@pytest.mark.parametrize("vec_env_cls", [DummyVecEnv, SubprocVecEnv])
def test_sb3_ppo_on_four_recorded_cartpoles_leaves_every_step_whole_in_the_buffer(vec_env_cls: type) -> None:
    venv = RecordingVecEnv(
        make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=vec_env_cls), num_steps=2000, gamma=0.9
    )
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=1024)
    buffer = venv.buffer
    assert len(buffer) == model.num_timesteps == 1024
    lengths, returns = venv.get_attr("episode_lengths"), venv.get_attr("episode_returns")  # each Monitor's
    episodes = list(buffer.episodes())
    for lane in range(4):
        mine = [e for e in episodes if int(e.idx[0]) // 2000 == lane]
        assert [len(e) for e in mine] == lengths[lane]
        np.testing.assert_allclose([e.individual_rewards.sum() for e in mine], returns[lane], rtol=1e-6)
        for e in mine:  # G by a plain loop over the episode's rewards (terminated: no bootstrap)
            assert e.terminated[-1] and not e.truncated.any()
            np.testing.assert_allclose(e.G, plain_returns(list(e.individual_rewards), 0.9, 0.0), rtol=1e-5)
            np.testing.assert_array_equal(e.obs[1:], e.obs_[:-1])  # each observation follows the last
    venv.close()


def test_a_time_limit_is_a_truncation_with_the_final_observation_and_a_bootstrap() -> None:
    seen: list[np.ndarray] = []
    venv = RecordingVecEnv(
        make_vec_env(lambda: gym.make("Pendulum-v1", max_episode_steps=5), n_envs=2, seed=1),
        num_steps=100,
        gamma=0.5,
        bootstrap_fn=lambda obs_: seen.append(obs_) or 2.0,
    )
    venv.reset()
    finals = []
    for _ in range(12):
        _, _, dones, infos = venv.step(np.zeros((2, 1), dtype=np.float32))
        finals += [info["terminal_observation"] for info, done in zip(infos, dones) if done]
    episodes = list(venv.buffer.episodes())
    assert len(episodes) == len(finals) == 4 and all(len(e) == 5 for e in episodes)
    for e in episodes:
        assert e.truncated[-1] and not e.terminated.any()
        np.testing.assert_allclose(e.G[-1], e.individual_rewards[-1] + 0.5 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(sorted(map(tuple, [e.obs_[-1] for e in episodes])), sorted(map(tuple, finals)))
    np.testing.assert_allclose(sorted(map(tuple, seen)), sorted(map(tuple, finals)), rtol=1e-6)


def test_recording_vec_envs_share_a_buffer_a_lane_each_and_free_them_when_closed() -> None:
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    shared = fe.FlexibleBuffer.from_spec(spec, num_steps=50, n_envs=3)
    first = RecordingVecEnv(make_vec_env("CartPole-v1", n_envs=2), buffer=shared)
    with pytest.raises(fe.SpecMismatchError, match="needs 2"):
        RecordingVecEnv(make_vec_env("CartPole-v1", n_envs=2), buffer=shared)
    first.close()
    assert RecordingVecEnv(make_vec_env("CartPole-v1", n_envs=3), buffer=shared).buffer is shared


def test_sb3_dqn_learns_cartpole_from_this_replay_buffer() -> None:
    """SB3's DQN with RL Zoo's CartPole settings (`examples/sb3_dqn_buffers.py`, which compares
    it with SB3's own buffer over five seeds) learns from this buffer, every step stored once."""
    import importlib.util

    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    path = Path(__file__).resolve().parent.parent / "examples" / "sb3_dqn_buffers.py"
    spec = importlib.util.spec_from_file_location("sb3_dqn_buffers", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.rl_zoo_dqn(ReplayBuffer, seed=1)
    before, _ = evaluate_policy(model, Monitor(gym.make("CartPole-v1")), n_eval_episodes=10)
    model.learn(total_timesteps=12_000)
    assert len(model.replay_buffer.buffer) == model.num_timesteps  # every step, once
    after, _ = evaluate_policy(model, Monitor(gym.make("CartPole-v1")), n_eval_episodes=10)
    assert before < 50 and after >= 150


@pytest.mark.parametrize("handle_timeouts", [True, False])
def test_the_replay_buffer_keeps_a_time_limit_s_final_observation_and_ends_it_as_sb3_is_told(
    handle_timeouts: bool,
) -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv

    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    venv = DummyVecEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=4)] * 2)
    replay = ReplayBuffer(
        100,
        venv.observation_space,
        venv.action_space,
        device="cpu",
        n_envs=2,
        handle_timeout_termination=handle_timeouts,
    )
    obs = venv.reset()
    finals = []
    for _ in range(10):  # as SB3's off-policy collection adds: next_obs is the final one where done
        action = np.zeros((2, 1), dtype=np.float32)
        next_obs, reward, done, infos = venv.step(action)
        real_next = next_obs.copy()
        for i, info in enumerate(infos):
            if done[i]:
                real_next[i] = info["terminal_observation"]
                finals.append(info["terminal_observation"])
        replay.add(obs, real_next, action, reward, done, infos)
        obs = next_obs
    assert replay.size() == 10 and len(finals) == 4
    samples = replay.sample(4000)
    ended = {tuple(np.round(f, 5)) for f in finals}
    drawn = [tuple(np.round(o, 5)) for o in samples.next_observations.numpy()]
    assert ended <= set(drawn)  # every final observation can be drawn
    done = samples.dones.numpy()[:, 0] == 1
    if handle_timeouts:  # SB3's default: time limits are no terminations
        assert not done.any()
    else:  # SB3 told not to tell them apart: every episode end is a termination, and only those
        assert [o in ended for o in drawn] == done.tolist()


Transition = tuple[np.ndarray, int, float, np.ndarray]  # obs, action, reward, next_obs as added


class Adder:
    """Plays a DummyVecEnv of CartPoles with random actions, adding each step to ``replay`` as SB3's
    off-policy collection does (next_obs is the final one where done), and keeps a plain list of
    each sub-env's episodes that began and ended while it watched."""

    def __init__(self, venv: DummyVecEnv, replay: Any) -> None:
        self.venv, self.replay, self.n = venv, replay, venv.num_envs
        self.obs, self.rng = venv.reset(), np.random.default_rng(0)
        self.watching: list[list[Transition] | None] = [None] * self.n  # None: its episode began unwatched
        self.ended: list[list[list[Transition]]] = [[] for _ in range(self.n)]

    def play(self, steps: int) -> None:
        for _ in range(steps):
            action = self.rng.integers(0, 2, self.n)
            next_obs, reward, done, infos = self.venv.step(action)
            real_next = np.stack(
                [info["terminal_observation"] if d else o for o, d, info in zip(next_obs, done, infos)]
            )
            size = len(self.replay.buffer)
            self.replay.add(self.obs, real_next, action, reward, done, infos)
            assert len(self.replay.buffer) == size + self.n  # a read right after an add sees it
            for i, episode in enumerate(self.watching):
                if episode is not None:
                    episode.append((self.obs[i].copy(), int(action[i]), float(reward[i]), real_next[i].copy()))
                    if done[i]:
                        self.ended[i].append(episode)
                if done[i]:
                    self.watching[i] = []
            self.obs = next_obs

    def watch(self) -> None:
        """Only episodes that begin from now on are kept."""
        self.watching, self.ended = [None] * self.n, [[] for _ in range(self.n)]

    def check(self) -> None:
        """The buffer's whole episodes are, sub-env by sub-env, exactly the watched ones."""
        episodes = list(self.replay.buffer.episodes())
        for lane in range(self.n):
            mine = [e for e in episodes if int(e.idx[0]) // self.replay.buffer.num_steps == lane]
            assert len(mine) == len(self.ended[lane]) > 2
            for episode, plain in zip(mine, self.ended[lane]):
                np.testing.assert_array_equal(episode.obs, np.stack([t[0] for t in plain]))
                np.testing.assert_array_equal(episode.discrete_actions[:, 0], [t[1] for t in plain])
                np.testing.assert_array_equal(episode.individual_rewards, [t[2] for t in plain])
                np.testing.assert_array_equal(episode.obs_, np.stack([t[3] for t in plain]))
                assert episode.terminated[-1] and not episode.terminated[:-1].any()


def test_the_replay_buffer_holds_each_sub_env_s_adds_as_whole_episodes_and_every_read_sees_the_last_add() -> None:
    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    venv = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    venv.seed(3)
    adder = Adder(venv, ReplayBuffer(1000, venv.observation_space, venv.action_space, device="cpu", n_envs=2))
    adder.watching = [[], []]  # the first episodes begin with the first add
    adder.play(300)
    adder.check()


def test_the_replay_buffer_s_reset_forgets_every_transition_and_the_adds_after_it_are_kept() -> None:
    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    venv = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    venv.seed(4)
    replay = ReplayBuffer(1000, venv.observation_space, venv.action_space, device="cpu", n_envs=2)
    adder = Adder(venv, replay)
    adder.play(50)
    replay.reset()  # mid-episode: SB3 goes on adding the running episodes' steps
    assert replay.size() == 0 and len(replay.buffer) == 0
    adder.watch()
    adder.play(200)
    assert replay.size() == 200
    adder.check()  # the episodes cut by the reset are no longer whole; every later one is


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("normalized", [False, True])
def test_the_replay_buffer_samples_what_sb3_s_own_samples_with_and_without_vec_normalize(
    env_id: str, normalized: bool
) -> None:
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    from stable_baselines3.common.vec_env import VecNormalize

    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    venv = VecNormalize(DummyVecEnv([lambda: gym.make(env_id)]), gamma=0.9)
    venv.seed(0)
    venv.reset()
    obs = venv.get_original_obs()
    for _ in range(30):  # VecNormalize's running statistics move away from 0 and 1
        venv.step(np.array([venv.action_space.sample()]))
    ours = ReplayBuffer(10, venv.observation_space, venv.action_space, device="cpu")
    theirs = SB3ReplayBuffer(10, venv.observation_space, venv.action_space, device="cpu")
    action = np.array([venv.action_space.sample()])
    next_obs, reward, done = obs + 0.5, np.array([1.5]), np.array([True])
    for replay in (ours, theirs):  # one transition: every draw is it
        replay.add(obs, next_obs, action, reward, done, [{}])
    env = venv if normalized else None
    for got, want in zip(ours.sample(4, env), theirs.sample(4, env)):
        if want is None:  # SB3's n-step discounts
            assert got is None
            continue
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_sb3_sac_trains_on_this_replay_buffer_with_continuous_actions() -> None:
    from stable_baselines3 import SAC

    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    model = SAC(
        "MlpPolicy",
        gym.make("Pendulum-v1", max_episode_steps=50),
        buffer_size=10_000,
        learning_starts=64,
        batch_size=32,
        replay_buffer_class=ReplayBuffer,
        seed=0,
        device="cpu",
    )
    model.learn(total_timesteps=300)
    replay = model.replay_buffer
    assert len(replay.buffer) == 300 and replay.buffer.n_episodes == 6  # six whole time-limited episodes
    samples = replay.sample(16)
    assert samples.actions.shape == (16, 1) and samples.observations.shape == (16, 3)
    assert float(samples.actions.abs().max()) <= 1.0  # SAC stores its actions scaled to [-1, 1]
    assert samples.dones.sum() == 0  # a time limit ends no episode for the critic


def test_adds_that_do_not_follow_one_another_come_back_as_added_as_in_sb3_s_own_buffer() -> None:
    """A shuffled demonstration prefill: each add's obs is not the last add's next_obs. Ours holds
    what was added, as SB3's own buffer does (and each observation once where adds chain)."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    from flexibuff_envs.integrations.sb3 import ReplayBuffer
    from flexibuff_envs.testing.reference import play

    env = gym.make("CartPole-v1")
    log = play(env, seed=0, steps=300)
    order = np.random.default_rng(0).permutation(300)[:200]
    order[100:110] = np.arange(50, 60)  # a run of adds that do chain
    ours = ReplayBuffer(500, env.observation_space, env.action_space, device="cpu")
    theirs = SB3ReplayBuffer(500, env.observation_space, env.action_space, device="cpu")
    for t in order.tolist():
        add = (
            log.obs[t][None],
            log.obs_[t][None],
            np.array([[log.actions[t]]]),
            np.array([log.reward[t]]),
            np.array([log.terminated[t] or log.truncated[t]]),
            [{"TimeLimit.truncated": log.truncated[t]}],
        )
        ours.add(*add)
        theirs.add(*add)
    batch = ours.buffer.sample_transitions(idx=np.arange(200))
    np.testing.assert_array_equal(batch.obs, theirs.observations[:200, 0])
    np.testing.assert_array_equal(batch.obs_, theirs.next_observations[:200, 0])
    np.testing.assert_array_equal(batch.discrete_actions[:, 0], theirs.actions[:200, 0, 0])
    # the two adds the issue gives: (1, 2) then (5, 6) stay (1, 2) and (5, 6)
    space = gym.spaces.Box(-10, 10, (1,), np.float32)
    small = ReplayBuffer(10, space, gym.spaces.Discrete(2), device="cpu")
    for first in (1.0, 5.0, 6.0):
        small.add(
            np.array([[first]]), np.array([[first + 1]]), np.array([[0]]), np.array([0.0]), np.array([False]), [{}]
        )
    batch = small.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.obs[:, 0], [1, 5, 6])
    np.testing.assert_array_equal(batch.obs_[:, 0], [2, 6, 7])


def test_record_of_an_sb3_vec_env_names_the_recorder_to_use() -> None:
    venv = DummyVecEnv([lambda: gym.make("CartPole-v1")])
    with pytest.raises(fe.NotAnEnvError, match=r"Stable-Baselines3 VecEnv.*RecordingVecEnv\(venv\)"):
        fe.record(venv)


def _rollouts(make: Any, n_envs: int, steps: int, rollouts: int, seed: int = 0) -> list[list[tuple[Any, ...]]]:
    """What PPO hands a rollout buffer over ``rollouts`` rollouts of ``steps`` steps of ``n_envs``
    copies of ``make()``, with random actions, values and log probs: each rollout's adds
    ``(obs, action, reward, episode_start, value, log_prob)``, then ``(last_values, dones)``."""
    import torch as th

    venv = DummyVecEnv([make] * n_envs)
    venv.seed(seed)
    venv.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    obs, starts, out = venv.reset(), np.ones(n_envs, dtype=bool), []
    for _ in range(rollouts):
        adds: list[tuple[Any, ...]] = []
        for _ in range(steps):
            action = np.array([venv.action_space.sample() for _ in range(n_envs)])
            value, log_prob = th.tensor(rng.normal(size=(n_envs, 1))), th.tensor(rng.normal(size=n_envs))
            new_obs, rewards, dones, _ = venv.step(action)
            adds.append((obs, action, rewards, starts, value, log_prob))
            obs, starts = new_obs, dones
        adds.append((th.tensor(rng.normal(size=(n_envs, 1))), starts))
        out.append(adds)
    return out


def _pong() -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", max_episode_steps=20)


@pytest.mark.parametrize(
    ("env_id", "lam"),
    [("CartPole-v1", 0.95), ("Pendulum-v1", 0.9), ("CartPole-v1", 1.0), ("ALE/Pong-v5", 0.95)],
    ids=str,
)
def test_the_rollout_buffer_serves_what_sb3_s_own_serves(env_id: str, lam: float) -> None:
    """The same adds into SB3's ``RolloutBuffer`` and ours: our GAE gives SB3's advantages and
    returns, and ``get`` the same minibatches for the same seed, over rollouts that cut episodes
    (an episode running on from one rollout into the next); Pong's raw frames (100 KB a row, 20-step
    episodes) too."""
    from stable_baselines3.common.buffers import RolloutBuffer as Theirs

    from flexibuff_envs.integrations.sb3 import RolloutBuffer

    if env_id.startswith("ALE/"):
        pytest.importorskip("ale_py")
    make = _pong if env_id.startswith("ALE/") else (lambda: gym.make(env_id))
    env = make()
    spaces = (env.observation_space, env.action_space)
    theirs, ours = (cls(64, *spaces, gamma=0.9, gae_lambda=lam, n_envs=3) for cls in (Theirs, RolloutBuffer))
    for adds in _rollouts(make, 3, 64, rollouts=3):
        for buffer in (theirs, ours):
            buffer.reset()
            for add in adds[:-1]:
                buffer.add(*add)
            buffer.compute_returns_and_advantage(*adds[-1])
        for name in ("observations", "actions", "values", "log_probs"):
            np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name), err_msg=name)
        for name in ("advantages", "returns"):
            np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-5, atol=1e-5, err_msg=name)
        for seed in (0, 1):
            np.random.seed(seed)
            mine = list(ours.get(50))
            np.random.seed(seed)
            for a, b in zip(mine, theirs.get(50), strict=True):
                for x, y in zip(a, b):
                    np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-5, atol=1e-5)
    if env_id != "Pendulum-v1":  # whole episodes recorded, G and GAE written at their end
        assert ours.buffer.n_episodes > 0


@pytest.mark.parametrize("algorithm", ["PPO", "A2C"])
def test_ppo_and_a2c_train_on_the_rollout_buffer_as_on_sb3_s_own(algorithm: str) -> None:
    import stable_baselines3
    import torch as th

    from flexibuff_envs.integrations.sb3 import RolloutBuffer

    trained = []
    for buffer_class in (None, RolloutBuffer):
        cls = getattr(stable_baselines3, algorithm)
        options = {"n_steps": 64, "batch_size": 64} if algorithm == "PPO" else {"n_steps": 16}
        model = cls("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), seed=0, device="cpu", **options)
        if buffer_class is not None:  # the class SB3 made its own of, with the same arguments
            model = cls(
                "MlpPolicy",
                make_vec_env("CartPole-v1", n_envs=2, seed=0),
                seed=0,
                device="cpu",
                rollout_buffer_class=buffer_class,
                **options,
            )
        model.learn(total_timesteps=256)
        trained.append(th.nn.utils.parameters_to_vector(model.policy.parameters()).detach())
    assert (
        isinstance(model.rollout_buffer, RolloutBuffer) and len(model.rollout_buffer.buffer) == 2 * options["n_steps"]
    )
    assert th.allclose(trained[0], trained[1], atol=1e-4)  # the same updates, to float rounding


def test_the_replay_buffer_takes_a_gymnasium_vector_env_s_dict_infos_as_cleanrl_passes_them() -> None:
    """CleanRL's DQN passes Gymnasium's dict ``infos`` to ``ReplayBuffer.add`` (SB3's accepts
    them): the transitions are kept as with SB3's list of dicts."""
    from flexibuff_envs.integrations.sb3 import ReplayBuffer

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    rb = ReplayBuffer(
        1000, envs.single_observation_space, envs.single_action_space, "cpu", n_envs=2, handle_timeout_termination=False
    )
    obs, _ = envs.reset(seed=0)
    for t in range(60):
        actions = np.array([t % 2, (t // 3) % 2])
        next_obs, rewards, terminations, _, infos = envs.step(actions)
        real_next = next_obs.copy()
        rb.add(obs, real_next, actions, rewards, terminations, infos)
        obs = next_obs
    assert rb.size() == 60 and len(rb.buffer) == 120
    sample = rb.sample(8)
    assert sample.observations.shape == (8, 4) and sample.actions.shape == (8, 1)
