"""Provenance: every recorder keeps a session (env id, keywords, wrappers, versions, host,
process, start, policy tag) in its buffer and in the log it appends to; the sessions survive
save and load, a log's opening, merging and continuing; policy tags change mid-run and name the
episodes that end under them; a crafted header's sessions are refused with the path named."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
import zlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs import log
from flexibuff_envs.cli import main
from tests.envs import random_games


def _episodes(env: Any, n: int, seed: int = 0) -> None:
    env.reset(seed=seed)
    done = 0
    while done < n:
        if any(env.step(env.action_space.sample())[2:4]):
            done += 1
            env.reset()


def test_each_recorder_keeps_what_its_env_was_made_from() -> None:
    pytest.importorskip("pettingzoo")
    from mpe2 import simple_spread_v3
    from pettingzoo.classic import connect_four_v3

    cases = [
        (gym.make("CartPole-v1", max_episode_steps=50), "gymnasium", "CartPole-v1"),
        (gym.make_vec("CartPole-v1", num_envs=2), "vector", "CartPole-v1"),
        (simple_spread_v3.parallel_env(N=2), "parallel", "mpe2.simple_spread_v3"),
        (connect_four_v3.env(), "aec", "pettingzoo.classic.connect_four_v3"),
    ]
    for env, api, env_id in cases:
        (session,) = fe.record(env, num_steps=100).buffer.sessions
        assert (session["api"], session["env_id"]) == (api, env_id)
        assert session["host"] == socket.gethostname() and session["pid"] == os.getpid()
        assert session["versions"]["flexibuff_envs"] == fe.__version__ and "numpy" in session["versions"]
        assert session["policy"] == "" and session["first_episode"] is None
    gym_session = fe.record(gym.make("CartPole-v1", max_episode_steps=50), num_steps=10).buffer.sessions[0]
    assert gym_session["wrappers"][0] == "gymnasium.wrappers.common.TimeLimit"
    remade = gym.make(gym.envs.registration.EnvSpec.from_json(gym_session["gym_spec"]))
    assert remade.spec.max_episode_steps == 50  # Gymnasium's own spec makes the env again


def test_policy_tags_name_the_episodes_that_end_under_them_through_save_merge_and_resume(tmp_path: Path) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=1000, log=tmp_path / "log", policy="ppo-step-0")
    env.action_space.seed(0)
    _episodes(env, 4)
    env.set_policy("ppo-step-100")
    _episodes(env, 3, seed=1)
    env.close()
    opened = fe.FlexibleBuffer.open(tmp_path / "log")
    tags = [(s["policy"], s["first_episode"]) for s in opened.sessions]
    assert tags == [("ppo-step-0", 0), ("ppo-step-100", 4)] and opened.n_episodes == 7
    assert fe.FlexibleBuffer.load(opened.save(tmp_path / "log.fbuf")).sessions == opened.sessions
    # continued by another recording: the log's sessions kept, the new one from its next episode
    again = fe.record(gym.make("CartPole-v1"), num_steps=1000, log=tmp_path / "log", policy="ppo-step-200")
    _episodes(again, 2, seed=2)
    again.close()
    tags = [(s["policy"], s["first_episode"]) for s in fe.FlexibleBuffer.open(tmp_path / "log").sessions]
    assert tags == [("ppo-step-0", 0), ("ppo-step-100", 4), ("ppo-step-200", 7)]
    # merged twice: the second copy's sessions numbered after the first's 9 episodes
    fe.merge_logs([tmp_path / "log", tmp_path / "log"], tmp_path / "merged")
    tags = [(s["policy"], s["first_episode"]) for s in fe.FlexibleBuffer.open(tmp_path / "merged").sessions]
    assert tags == [("ppo-step-0", 0), ("ppo-step-100", 4), ("ppo-step-200", 7)] + [
        ("ppo-step-0", 9),
        ("ppo-step-100", 13),
        ("ppo-step-200", 16),
    ]
    with pytest.raises(fe.InvalidArgumentError, match="policy"):
        env.set_policy(3)  # type: ignore[arg-type]


def test_inspect_says_who_recorded_what(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=500, log=tmp_path / "log", policy="random")
    _episodes(env, 2)
    env.close()
    assert main(["inspect", str(tmp_path / "log")]) == 0
    out = capsys.readouterr().out
    assert "recorded  from episode 0, policy 'random', CartPole-v1 (gymnasium)" in out
    assert f"on {socket.gethostname()} (pid {os.getpid()})" in out and "wrapped in TimeLimit" in out
    assert "seeds     1 episode reset with a seed (0), 1 right after their lane's episode before" in out
    env.buffer.save(tmp_path / "b.fbuf")
    assert main(["inspect", str(tmp_path / "b.fbuf")]) == 0
    assert "seeds     1 episode reset with a seed (0), 1 right after" in capsys.readouterr().out


@pytest.mark.parametrize(
    "sessions",
    [
        "not a list",
        [{"api": "gymnasium"}],
        [{"started": float("nan")}],
        [{"first_episode": -4}],
        [{"wrappers": [3]}],
        [{"env_kwargs": {"deep": "x" * (5 << 20)}}],
    ],
)
def test_a_crafted_header_s_sessions_are_refused_naming_the_path(tmp_path: Path, sessions: Any) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=200, log=tmp_path / "log")
    _episodes(env, 2)
    env.close()
    real = fe.FlexibleBuffer.open(tmp_path / "log").sessions[0]
    if isinstance(sessions, list) and len(sessions[0]) == 1 and "api" not in sessions[0]:
        sessions = [{**real, **sessions[0]}]
    path = tmp_path / "log" / log.HEADER
    raw = path.read_bytes()
    data = json.loads(raw[20:-4])
    data["sessions"] = sessions
    blob = json.dumps(data).encode()
    prefix = struct.pack("<8sIQ", b"FBLOGHDR", struct.unpack("<I", raw[8:12])[0], len(blob)) + blob
    path.write_bytes(prefix + struct.pack("<I", zlib.crc32(prefix)))
    with pytest.raises(fe.BufferFileError, match=f"{path}: corrupt header: sessions"):
        fe.FlexibleBuffer.open(tmp_path / "log")


def test_a_buffer_file_keeps_its_sessions_and_old_files_have_none(tmp_path: Path) -> None:
    env = fe.record(gym.make_vec("CartPole-v1", num_envs=2), num_steps=100, policy="random")
    env.reset(seed=0)
    for _ in range(50):
        env.step(np.zeros(2, np.int64))
    loaded = fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "v.fbuf"), mmap=True)
    assert loaded.sessions == env.buffer.sessions and loaded.sessions[0]["policy"] == "random"
    assert fe.FlexibleBuffer.load(Path(__file__).parent / "data" / "format1.fbuf").sessions == []


def test_parquet_and_vault_exports_keep_the_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=2000, log=tmp_path / "log", policy="a")
    _episodes(env, 3)
    env.set_policy("b")
    _episodes(env, 2, seed=1)
    env.close()
    source = fe.FlexibleBuffer.open(tmp_path / "log")
    pytest.importorskip("pyarrow")
    from flexibuff_envs.integrations.parquet import from_parquet, to_parquet

    back = from_parquet(to_parquet(source, tmp_path / "parquet"))
    assert back.sessions == source.sessions
    assert main(["inspect", str(tmp_path / "parquet")]) == 0  # read from its layout, no rows
    assert "from episode 3, policy 'b', CartPole-v1" in capsys.readouterr().out
    logged = from_parquet(tmp_path / "parquet", log=tmp_path / "again")  # into a new log: numbered as they were
    assert fe.FlexibleBuffer.open(tmp_path / "again").sessions == source.sessions == logged.sessions
    pytest.importorskip("tensorstore")
    from flexibuff_envs.integrations.vault import from_vault, to_vault

    assert from_vault(to_vault(source, tmp_path / "vaults", vault_name="v.vlt")).sessions == source.sessions


def test_a_dataset_card_says_what_the_dataset_holds_and_who_recorded_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import connect_four_v3

    games = fe.record(connect_four_v3.env(), num_steps=500, log=tmp_path / "c4", policy="random")
    random_games(games, 12)
    games.close()
    assert main(["inspect", str(tmp_path / "c4"), "--card", str(tmp_path / "README.md")]) == 0
    assert "wrote" in capsys.readouterr().out
    text = (tmp_path / "README.md").read_text()
    buffer = fe.FlexibleBuffer.open(tmp_path / "c4")
    returns = buffer.episode_stats()["returns"]
    assert text.startswith("---\ntask_categories:\n- reinforcement-learning\n")
    assert "12 episodes" in text and "`pettingzoo.classic.connect_four_v3` (PettingZoo AEC, 2 agents)" in text
    for a, agent in enumerate(buffer.spec.agent_ids):  # the table's means are numpy's
        assert f"| {agent} | {returns[:, a].mean():.3g} |" in text
    assert "| 0 | random | `pettingzoo.classic.connect_four_v3` (aec) | unknown |" in text
    assert "Of the 12 episodes, 12 were reset with a seed they keep and 0 without one" in text
    assert 'fe.FlexibleBuffer.open("c4")' in text
    assert main(["inspect", str(tmp_path / "c4"), "--card", "-"]) == 0
    assert capsys.readouterr().out == text  # the same card on stdout


def test_an_episode_hashes_the_same_in_every_form_and_a_changed_reward_changes_only_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hash covers what was recorded: a log, its file, a compressed copy and a Parquet export
    of the same episodes hash alike (and other discounts too); a reward changed by hand changes
    its episode's hash and no other."""
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import pistonball_v6

    env = fe.record(pistonball_v6.parallel_env(n_pistons=3, max_cycles=8), num_steps=200, log=tmp_path / "log")
    for k in range(4):
        env.reset(seed=k)
        while env.agents:
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    env.close()
    hashes = env.buffer.episode_hashes()
    assert len(hashes) == 4 == len(set(hashes)) and all(len(h) == 32 for h in hashes)
    opened = fe.FlexibleBuffer.open(tmp_path / "log")
    forms = [
        opened,
        fe.FlexibleBuffer.open(tmp_path / "log", mmap=False),
        fe.FlexibleBuffer.load(opened.save(tmp_path / "raw.fbuf", compress=None)),
        fe.FlexibleBuffer.load(opened.save(tmp_path / "packed.fbuf"), compress="auto"),  # frames kept as zstd
    ]
    pytest.importorskip("pyarrow")
    from flexibuff_envs.integrations.parquet import from_parquet, to_parquet

    forms.append(from_parquet(to_parquet(opened, tmp_path / "parquet"), gamma=0.5))  # other discounts
    for form in forms:
        assert form.episode_hashes() == hashes
    changed = fe.FlexibleBuffer.open(tmp_path / "log", mmap=False)
    field = changed.field("individual_rewards")
    first_row_of_third = sum(len(e.individual_rewards[0]) for e in list(changed.episodes())[:2])
    field[1, first_row_of_third + 3] += 1.0
    assert [a == b for a, b in zip(changed.episode_hashes(), hashes)] == [True, True, False, True]
    assert main(["inspect", str(tmp_path / "log"), "--hashes"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{k}\t{h}" for k, h in enumerate(hashes)]


def test_sessions_follow_a_vector_env_s_staged_episodes_and_a_refused_recorder_adds_none(tmp_path: Path) -> None:
    env = fe.record(gym.make_vec("CartPole-v1", num_envs=4), num_steps=4000, log=tmp_path / "log", policy="a")
    env.reset(seed=0)
    env.action_space.seed(0)
    ended = 0
    for _ in range(60):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        ended += int((terminated | truncated).sum())
    env.set_policy("b")  # the episodes that ended under "a", still staged, keep it
    for _ in range(60):
        env.step(env.action_space.sample())
    env.close()
    assert ended > 0
    tags = [(s["policy"], s["first_episode"]) for s in fe.FlexibleBuffer.open(tmp_path / "log").sessions]
    assert tags == [("a", 0), ("b", ended)]
    first = fe.record(gym.make("CartPole-v1"), num_steps=100, policy="A")
    with pytest.raises(fe.SpecMismatchError):
        fe.record(gym.make("CartPole-v1"), first.buffer, policy="B")  # its one lane is taken
    assert [s["policy"] for s in first.buffer.sessions] == ["A"]


def test_logs_of_other_apis_or_older_versions_still_merge_and_continue(tmp_path: Path) -> None:
    """The API recorded is provenance, not layout: a parallel and an AEC log of pistonball merge,
    and a log whose spec names no API (older versions) is continued by a recorder."""
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import pistonball_v6

    for api, make in (("parallel", pistonball_v6.parallel_env), ("aec", pistonball_v6.env)):
        env = fe.record(make(n_pistons=3, max_cycles=4), num_steps=100, log=tmp_path / api)
        env.reset(seed=0)
        if api == "parallel":
            while env.agents:
                env.step({agent: env.action_space(agent).sample() for agent in env.agents})
        else:
            for agent in env.agent_iter():
                done = any(env.last()[2:4])
                env.step(None if done else env.action_space(agent).sample())
        env.close()
    fe.merge_logs([tmp_path / "parallel", tmp_path / "aec"], tmp_path / "both")
    assert fe.FlexibleBuffer.open(tmp_path / "both").n_episodes == 2
    spec = dataclasses.replace(fe.infer_spec(gym.make("CartPole-v1")), env_api="")  # as older versions wrote it
    old = fe.FlexibleBuffer.from_spec(spec, num_steps=100)
    old.log_to(tmp_path / "old")
    old.close_log()
    again = fe.record(gym.make("CartPole-v1"), num_steps=100, log=tmp_path / "old")
    _episodes(again, 1)
    again.close()
    assert fe.FlexibleBuffer.open(tmp_path / "old").n_episodes == 1


def test_an_env_with_large_keywords_records() -> None:
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    env = fe.record(gym.make("FrozenLake-v1", desc=generate_random_map(size=200, seed=0)), num_steps=100)
    assert len(env.buffer.sessions[0]["gym_spec"]) > 40_000  # and its keywords again: over 64 KiB together


def test_a_pettingzoo_env_s_keywords_are_kept_where_given(tmp_path: Path) -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import pistonball_v6

    made = {"n_pistons": 3, "max_cycles": 5}
    env = fe.record(pistonball_v6.parallel_env(**made), num_steps=50, env_kwargs=made)
    (session,) = env.buffer.sessions
    assert (session["env_id"], session["env_kwargs"]) == ("pettingzoo.butterfly.pistonball_v6", made)
    remade = pistonball_v6.parallel_env(**session["env_kwargs"])  # what makes it again
    assert remade.possible_agents == env.possible_agents
    with pytest.raises(fe.ArgumentTypeError, match="env_kwargs apply to PettingZoo envs only"):
        fe.record(gym.make("CartPole-v1"), env_kwargs={"x": 1})  # type: ignore[call-overload]
    argv = ["record", "pettingzoo.butterfly.pistonball_v6", "--env-kwargs", '{"n_pistons": 3, "max_cycles": 5}']
    assert main([*argv, "--episodes", "1", "--out", str(tmp_path / "log")]) == 0
    assert fe.FlexibleBuffer.open(tmp_path / "log").sessions[0]["env_kwargs"] == made
