"""PettingZoo's route into SB3 through SuperSuit: recorders work under its wrappers, and its
vector conversion is recorded as an SB3 VecEnv, every agent's steps whole."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("torch")
ss = pytest.importorskip("supersuit")
pytest.importorskip("stable_baselines3")
pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3
from stable_baselines3 import PPO

import flexibuff_envs as fe
from flexibuff_envs.integrations.sb3 import RecordingVecEnv


def spread() -> object:
    return simple_spread_v3.parallel_env(N=2, max_cycles=10, continuous_actions=False)


def test_sb3_ppo_trains_on_a_supersuit_vector_env_recorded_agent_by_agent() -> None:
    vec = ss.concat_vec_envs_v1(
        ss.pettingzoo_env_to_vec_env_v1(spread()), 2, num_cpus=0, base_class="stable_baselines3"
    )
    venv = RecordingVecEnv(vec, num_steps=2000)  # one lane per agent of each copy: 2 x 2
    PPO("MlpPolicy", venv, n_steps=128, batch_size=64, n_epochs=1, device="cpu").learn(total_timesteps=2048)
    assert venv.num_envs == 4 and len(venv.buffer) == 2048
    lengths = venv.buffer.episode_stats()["lengths"]
    assert len(lengths) == 4 * (2048 // 4 // 10) and (lengths == 10).all()  # every agent's episodes whole


@pytest.mark.parametrize("inside", [True, False])
def test_recorders_work_under_and_over_supersuit_s_wrappers(inside: bool) -> None:
    """SuperSuit's padding around a recorded env, or a recorder around SuperSuit's padding: the
    recorded observations are what the recorder's env gave (padded only when it sees the padding)."""
    if inside:
        recorder = fe.record(spread(), num_steps=100)
        env = ss.pad_observations_v0(recorder)
    else:
        env = recorder = fe.record(ss.pad_observations_v0(spread()), num_steps=100)
    obs, _ = env.reset(seed=0)
    seen = {agent: [o] for agent, o in obs.items()}
    for _ in range(10):
        obs, *_ = env.step({agent: 1 for agent in env.agents})
        for agent, o in obs.items():
            seen[agent].append(o)
    episode = next(iter(recorder.buffer.episodes()))
    assert len(episode) == 10
    for i, agent in enumerate(["agent_0", "agent_1"]):
        got = np.asarray(seen[agent])
        width = episode.obs.shape[-1]  # the unpadded width when the padding is outside
        np.testing.assert_allclose(episode.obs[i], got[:-1, :width])
        np.testing.assert_allclose(episode.obs_[i], got[1:, :width])


def test_a_recorder_refuses_to_be_copied_and_says_what_to_record_instead() -> None:
    with pytest.raises(TypeError, match=r"RecordingVecEnv\(concat_vec_envs_v1"):
        pickle.dumps(fe.record(spread(), num_steps=10))
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        ss.concat_vec_envs_v1(
            ss.pettingzoo_env_to_vec_env_v1(fe.record(spread(), num_steps=10)),
            1,
            num_cpus=0,
            base_class="stable_baselines3",
        )
