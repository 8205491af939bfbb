"""Replaying a recording (`flexibuff-envs verify --replay`, `integrations.replay`): each episode's
origin (its reset seed, or that it follows its lane's episode before) is kept wherever its rows
go, and an episode replayed in an env made again from its session, with its recorded actions,
gives every observation, reward and end flag again; a changed reward is named by episode and
step, an env that is not deterministic is said to be, and what cannot be replayed says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.cli import main
from flexibuff_envs.integrations import editing
from flexibuff_envs.integrations.replay import replay
from tests.envs import ToyEnv, Unseeded, parallel_games, random_games, toy


def _episodes(env: Any, seeds: list[int | None]) -> None:
    """One episode per seed (None: reset without one), random actions."""
    env.action_space.seed(0)
    for seed in seeds:
        env.reset(seed=seed)
        while not any(env.step(env.action_space.sample())[2:4]):
            pass


def test_origins_say_how_each_episode_was_reset_and_survive_save_log_and_merge(tmp_path: Path) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=4000, log=tmp_path / "log")
    _episodes(env, [7, None, None, 9, None])
    env.close()
    origins = env.buffer.episode_origins()
    assert origins["seed"].tolist() == [7, -1, -1, 9, -1]
    assert origins["follows"].tolist() == [False, True, True, False, True]
    assert origins["ordinal"].tolist() == [0, 1, 2, 3, 4] and set(origins["lane"].tolist()) == {0}
    assert (np.diff(origins["started"]) >= 0).all() and origins["session"].tolist() == [0] * 5
    for held in (
        fe.FlexibleBuffer.open(tmp_path / "log"),
        fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "b.fbuf")),
        fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "c.fbuf", compress={"obs": "zstd"})),
    ):
        for name, column in held.episode_origins().items():
            np.testing.assert_array_equal(column, origins[name], err_msg=name)
    pytest.importorskip("pyarrow")
    from flexibuff_envs.integrations.parquet import from_parquet, to_parquet

    back = from_parquet(to_parquet(tmp_path / "log", tmp_path / "parquet")).episode_origins()
    for name, column in back.items():
        np.testing.assert_array_equal(column, origins[name], err_msg=name)
    fe.merge_logs([tmp_path / "log", tmp_path / "log"], tmp_path / "merged")
    merged = fe.FlexibleBuffer.open(tmp_path / "merged").episode_origins()
    assert merged["seed"].tolist() == [7, -1, -1, 9, -1] * 2
    assert merged["session"].tolist() == [0] * 5 + [1] * 5  # the second copy's session follows the first's
    # a chunk moved to another buffer keeps its seeds; its session is not that buffer's
    other = fe.FlexibleBuffer.from_spec(env.buffer.spec, num_steps=4000)
    other.extend(env.buffer.take_episodes())
    assert other.episode_origins()["seed"].tolist() == [7, -1, -1, 9, -1]
    assert other.episode_origins()["session"].tolist() == [-1] * 5


def test_a_vector_env_s_sub_envs_each_keep_their_own_seed_and_follow_their_own_episodes() -> None:
    env = fe.record(gym.make_vec("CartPole-v1", 3, vectorization_mode="sync"), num_steps=3000)
    env.reset(seed=100)
    env.action_space.seed(0)
    for _ in range(150):
        env.step(env.action_space.sample())
    env.set_policy("later")
    for _ in range(150):
        env.step(env.action_space.sample())
    origins = env.buffer.episode_origins()
    for lane in range(3):
        mine = origins["lane"] == lane
        assert origins["seed"][mine][0] == 100 + lane and (origins["seed"][mine][1:] == -1).all()
        assert origins["follows"][mine][1:].all() and origins["ordinal"][mine].tolist() == list(range(mine.sum()))
        assert sorted(set(origins["session"][mine].tolist())) == [0, 1]  # the tag of the episodes begun since
    assert replay(env.buffer).ok and len(replay(env.buffer).clean) == env.buffer.n_episodes


@pytest.mark.parametrize("kind", ["gymnasium", "vector", "parallel", "aec"])
def test_a_recording_of_each_api_replays_clean_through_the_cli(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log"
    if kind == "gymnasium":
        env = fe.record(gym.make("CartPole-v1"), num_steps=2000, log=log)
        _episodes(env, [3, None, None])
        env.close()
    elif kind == "vector":
        env = fe.record(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"), num_steps=2000, log=log)
        env.reset(seed=5)
        for _ in range(80):
            env.step(env.action_space.sample())
        env.close()
    elif kind == "parallel":
        from mpe2 import simple_spread_v3

        made = {"N": 2, "max_cycles": 15}  # its keywords: a PettingZoo env's spec does not keep them
        env = fe.record(simple_spread_v3.parallel_env(**made), num_steps=200, log=log, env_kwargs=made)
        parallel_games(env, [1, None])
        env.close()
    else:
        from pettingzoo.classic import connect_four_v3

        env = fe.record(connect_four_v3.env(), num_steps=200, log=log, env_kwargs={})  # made with none
        random_games(env, 3, seed=4)
        env.close()
    assert main(["verify", "--replay", str(log)]) == 0
    out = capsys.readouterr().out
    held = fe.FlexibleBuffer.open(log).n_episodes
    assert held >= 2 and f"{held} replay exactly as recorded" in out and "DIVERGES" not in out


def test_a_reward_changed_by_hand_is_named_by_episode_and_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["record", "CartPole-v1", "--episodes", "4", "--seed", "2", "--out", str(tmp_path / "log")]) == 0
    buffer = fe.FlexibleBuffer.from_log(tmp_path / "log")
    lengths = buffer.episode_stats()["lengths"]
    row = int(lengths[:2].sum()) + 5  # episode 2, step 5
    buffer._store.arrays["individual_rewards"][0, row] = 2.0
    buffer.save(tmp_path / "edited.fbuf")
    assert main(["verify", "--replay", str(tmp_path / "edited.fbuf")]) == 1
    out = capsys.readouterr().out
    assert "DIVERGES: episode 2, step 5, agent 'agent_0': individual_rewards was 2.0 in the recording, 1.0" in out
    assert "2 replay exactly as recorded" in out and "not checked: episode 3 (after a divergence" in out


def test_a_non_deterministic_env_is_said_to_be_and_not_counted_a_divergence(capsys: pytest.CaptureFixture[str]) -> None:
    env = fe.record(Unseeded(), num_steps=200)
    _episodes(env, [0, None])
    report = replay(env.buffer, env=Unseeded)
    assert report.ok and report.nondeterministic == [0, 1] and not report.divergences and not report.clean


def test_what_cannot_be_replayed_says_why_and_a_factory_replays_an_env_made_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = fe.record(toy(), num_steps=200, log=tmp_path / "log")
    _episodes(env, [None, None, 4, None])  # no seed at first: those two cannot be replayed
    env.close()
    assert main(["verify", "--replay", str(tmp_path / "log")]) == 0
    out = capsys.readouterr().out
    assert "cannot replay episodes 0, 1: its env was reset without a seed" in out
    assert "cannot replay episodes 2, 3: its env was made by hand (no env id recorded)" in out
    assert main(["verify", "--replay", str(tmp_path / "log"), "--env", "tests.envs:toy"]) == 0
    assert "2 replay exactly as recorded" in capsys.readouterr().out
    # an edit that leaves out the seeded episode leaves the one after it with nothing to follow
    editing.drop(tmp_path / "log", [2], tmp_path / "dropped")
    report = replay(tmp_path / "dropped", env=toy)
    assert report.skipped[2] == "its lane's episode before it is not in the dataset"
    assert main(["verify", "--replay", str(tmp_path / "log"), "--env", "nowhere:make"]) == 2
    assert "cannot import nowhere" in capsys.readouterr().err


def test_an_env_made_again_unlike_the_recorded_one_is_not_replayed_and_says_so() -> None:
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(N=2, max_cycles=10), num_steps=100)  # keywords not given
    parallel_games(env, [0])
    report = replay(env.buffer)  # simple_spread_v3.parallel_env() would make three agents
    assert report.ok and not report.clean
    assert "keywords its env was made with were not recorded" in report.skipped[0] and "--env" in report.skipped[0]
    made = {"N": 2, "max_cycles": 10}
    named = fe.record(simple_spread_v3.parallel_env(**made), num_steps=100, env_kwargs=made)
    parallel_games(named, [0])
    assert replay(named.buffer).clean == [0]  # its keywords given: made again as recorded
    wrapped = fe.record(gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: 2 * r))
    _episodes(wrapped, [0])
    assert "wrapped in ways its Gymnasium spec does not keep" in replay(wrapped.buffer).skipped[0]


def test_a_vector_env_of_one_piece_is_not_replayed_lane_by_lane() -> None:
    env = fe.record(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point"), num_steps=2000)
    env.reset(seed=1)
    for _ in range(60):
        env.step(env.action_space.sample())
    report = replay(env.buffer)
    assert report.ok and not report.clean and set(report.skipped.values()) == {"its env was reset without a seed"}


def test_a_resumed_recording_repeats_none_of_the_seeds_before_it(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    for _ in range(2):
        assert main(["record", "CartPole-v1", "--episodes", "3", "--seed", "0", "--out", log, "--resume"]) == 0
    origins = fe.FlexibleBuffer.open(log).episode_origins()
    seeds = origins["seed"][origins["seed"] >= 0].tolist()
    assert len(seeds) == 2 and seeds[0] != seeds[1]
    assert replay(log).ok and len(replay(log).clean) == 6


def test_a_crafted_file_s_origins_read_as_unknown_or_are_refused_naming_the_path(tmp_path: Path) -> None:
    env = fe.record(ToyEnv(lengths=(3,)), num_steps=100, log=tmp_path / "log")
    _episodes(env, [1, None])
    env.close()
    with open(tmp_path / "log" / "origins.fblog", "r+b") as handle:  # a session the log does not name
        handle.seek(24)
        handle.write(np.int32(7).tobytes())
    origins = fe.FlexibleBuffer.open(tmp_path / "log").episode_origins()
    assert origins["seed"].tolist() == [-1, -1] and np.isnan(origins["started"][0])


def test_resets_and_steps_the_recording_does_not_hold_leave_no_false_divergence() -> None:
    from gymnasium.vector import AutoresetMode

    for mode in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):  # a sub-env reset by itself, then by the user
        made = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})
        env = fe.record(made, num_steps=1000)
        env.reset(seed=1)
        while not np.logical_or(*env.step(np.zeros(2, int))[2:4]).any():
            pass
        env.reset()
        for _ in range(5):
            env.step(np.zeros(2, int))
        env.truncate()
        report = replay(env.buffer)
        assert report.ok and len(report.clean) + len(report.skipped) == env.buffer.n_episodes, mode
    slippery = fe.record(gym.make("FrozenLake-v1", is_slippery=True), num_steps=100)  # its steps draw
    slippery.reset(seed=5)
    slippery.step(1)
    slippery.truncate()
    for _ in range(5):  # steps no recording holds: the next episode follows nothing
        slippery.step(1)
    slippery.reset()
    for _ in range(3):
        slippery.step(1)
    slippery.truncate()
    report = replay(slippery.buffer)
    assert report.ok and report.clean == [0] and report.skipped == {1: "its env was reset without a seed"}


def test_an_aec_game_cut_mid_game_is_not_called_a_divergence(capsys: pytest.CaptureFixture[str]) -> None:
    from pettingzoo.classic import tictactoe_v3

    for cut in range(3, 8):
        env = fe.record(tictactoe_v3.env(), num_steps=50, env_kwargs={})
        env.reset(seed=0)
        for n, _ in enumerate(env.agent_iter()):
            if n == cut:
                break
            obs, _, terminated, truncated, _ = env.last()
            env.step(None if terminated or truncated else int(np.flatnonzero(obs["action_mask"])[0]))
        env.truncate()
        report = replay(env.buffer)
        assert report.ok and report.skipped == {
            0: "the user cut it mid-game: the moves of the turns left open are not in the recording"
        }


def test_a_continued_log_numbers_each_episode_s_session_as_the_log_does(tmp_path: Path) -> None:
    for tag in ("a", "b"):
        env = fe.record(gym.make("CartPole-v1"), log=tmp_path / "log", policy=tag)
        _episodes(env, [1])
        env.close()
    assert fe.FlexibleBuffer.open(tmp_path / "log").episode_origins()["session"].tolist() == [0, 1]
    assert editing.where(tmp_path / "log", "policy == 'b'").tolist() == [1]


def test_a_log_held_twice_replays_twice_and_the_cli_refuses_episodes_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = fe.record(gym.make("CartPole-v1"), log=tmp_path / "log")
    _episodes(env, [3, None, 4, None])  # a seeded episode after others of its lane: replayed after them
    env.close()
    fe.merge_logs([tmp_path / "log", tmp_path / "log"], tmp_path / "twice")
    assert replay(tmp_path / "twice").clean == list(range(8))
    assert main(["verify", "--replay", str(tmp_path / "log"), "--episodes", "9"]) == 2
    assert "the dataset holds episodes 0 to 3" in capsys.readouterr().err
    with pytest.raises(fe.InvalidArgumentError, match="seed"):
        env.buffer.begin_episode(seed=-1)


def test_image_rows_recorded_through_a_ring_that_wraps_replay_exactly_from_the_log(tmp_path: Path) -> None:
    """Frames, a ring far shorter than the recording, the log holding every episode: each equals
    what a fresh env gives with its seed and actions, bit for bit."""
    import ale_py
    from pettingzoo.butterfly import pistonball_v6

    gym.register_envs(ale_py)
    made = gym.make_vec("ALE/Pong-v5", 2, vectorization_mode="sync", obs_type="grayscale", max_episode_steps=25)
    pong = fe.record(made, num_steps=60, log=tmp_path / "pong")  # 60 rows a lane: it wraps
    pong.reset(seed=3)
    pong.action_space.seed(0)
    for _ in range(200):
        pong.step(pong.action_space.sample())
    pong.close()
    report = replay(tmp_path / "pong")
    assert len(report.clean) == fe.FlexibleBuffer.open(tmp_path / "pong").n_episodes == 14 and report.ok
    kwargs = {"n_pistons": 3, "max_cycles": 15}
    pistons = fe.record(pistonball_v6.parallel_env(**kwargs), num_steps=20, log=tmp_path / "pb", env_kwargs=kwargs)
    parallel_games(pistons, [0, None, None, 5])
    pistons.close()
    assert replay(tmp_path / "pb").clean == [0, 1, 2, 3]
