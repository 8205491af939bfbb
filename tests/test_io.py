"""Buffer files: round trip, atomic replace, and clear errors for bad files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

import flexibuff_envs as fe
from tests.envs import ToyEnv
from tests.reference import play


def recorder(capacity: int = 40) -> fe.GymRecorder:
    return fe.record(ToyEnv(spaces.Box(0, 255, (3, 2), np.uint8), spaces.Discrete(4), lengths=(6, 11),
                            mask_info=True), num_steps=capacity, gamma=0.7)


def assert_same_batches(a: fe.FlexiBatch, b: fe.FlexiBatch) -> None:
    for name in ("obs", "obs_", "discrete_actions", "individual_rewards", "global_rewards", "terminated",
                 "truncated", "active", "G"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for x, y in zip(a.action_mask, b.action_mask):
        np.testing.assert_array_equal(x, y)


def test_round_trip_keeps_every_field_and_keeps_recording_and_sampling_as_before(tmp_path: Path) -> None:
    env = recorder()
    play(env, seed=0, steps=95)  # wraps the 40-row ring and leaves an episode running
    path = env.buffer.save(tmp_path / "run.fbuf")
    loaded = fe.FlexibleBuffer.load(path)
    assert loaded.spec == env.buffer.spec and len(loaded) == len(env.buffer)
    assert loaded.n_episodes == env.buffer.n_episodes and loaded.gamma == 0.7
    assert_same_batches(loaded.sample_transitions(64), env.buffer.sample_transitions(64))
    for x, y in zip(loaded.sample_episodes(n_episodes=2), env.buffer.sample_episodes(n_episodes=2)):
        assert_same_batches(x, y)
    # recording goes on into the loaded buffer: the episode that was running closes as truncated
    episodes = loaded.n_episodes
    resumed = fe.record(ToyEnv(spaces.Box(0, 255, (3, 2), np.uint8), spaces.Discrete(4), lengths=(6, 11),
                               mask_info=True), buffer=loaded)
    play(resumed, seed=5, steps=30)
    assert loaded.n_episodes > episodes
    for episode in loaded.sample_episodes(n_episodes=loaded.n_episodes):
        assert not np.isnan(episode.G).any()
        assert episode.terminated[-1] or episode.truncated[-1]
        assert not (episode.terminated[:-1] | episode.truncated[:-1]).any()


def test_file_holds_recorded_rows_not_the_empty_ring(tmp_path: Path) -> None:
    env = recorder(capacity=1_000_000)
    play(env, seed=0, steps=30)
    path = env.buffer.save(tmp_path / "small.fbuf")
    assert os.path.getsize(path) < 20_000


def test_save_replaces_atomically_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    env = recorder()
    play(env, seed=0, steps=10)
    path = tmp_path / "run.fbuf"
    env.buffer.save(path)
    play(env, seed=1, steps=10)
    env.buffer.save(path)
    assert os.listdir(tmp_path) == ["run.fbuf"]
    assert len(fe.FlexibleBuffer.load(path)) == len(env.buffer)


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "foreign", "newer"])
def test_bad_files_raise_a_clear_error(tmp_path: Path, damage: str) -> None:
    env = recorder()
    play(env, seed=0, steps=20)
    path = tmp_path / "run.fbuf"
    env.buffer.save(path)
    raw = bytearray(path.read_bytes())
    expected = {"missing": "no such", "truncated": "truncated", "flipped": "corrupt",
                "foreign": "not a flexibuff_envs buffer", "newer": "newer"}[damage]
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(raw)
    elif damage == "foreign":
        path.write_bytes(b"PK\x03\x04" + bytes(200))
    else:
        raw[8] = 99
        path.write_bytes(raw)
    with pytest.raises(fe.BufferFileError, match=expected):
        fe.FlexibleBuffer.load(path)


def test_save_and_load_never_touch_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pickle was used")

    for name in ("load", "loads", "dump", "dumps", "Unpickler", "Pickler"):
        monkeypatch.setattr(pickle, name, refuse)
    env = recorder()
    play(env, seed=0, steps=20)
    path = env.buffer.save(tmp_path / "run.fbuf")
    assert len(fe.FlexibleBuffer.load(path)) == 20
    assert Path(path).read_bytes()[:8] == b"FLEXIBUF"
