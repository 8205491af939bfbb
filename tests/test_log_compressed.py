"""Compressed episode logs: image columns kept as zstd frames (one a row, or one a row's agent)
hold exactly what an uncompressed log of the same seeds and actions holds, sample the same
batches mapped or read, merge and resume, and a damaged or crafted frame is a BufferFileError
naming the file and the row."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs import log
from tests.batches import assert_same_batches, assert_same_draws

BOTH = {"obs": "zstd", "state": "zstd"}


def _recorded(kind: str, directory: Path, compress: Any, episodes: int = 4) -> fe.FlexibleBuffer:
    """``kind`` recorded with fixed seeds and actions to the log ``directory``, its columns
    compressed as ``compress`` says; returns the buffer."""
    if kind == "gym":
        env: Any = gym.make("CartPole-v1")
    elif kind == "parallel":
        from mpe2 import simple_spread_v3

        env = simple_spread_v3.parallel_env(max_cycles=10)
    elif kind == "pistonball":  # image observations (457x120x3 an agent) and an image state
        from pettingzoo.butterfly import pistonball_v6

        env = pistonball_v6.parallel_env(n_pistons=4, max_cycles=12)
    else:
        from pettingzoo.classic import connect_four_v3

        env = connect_four_v3.env()
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=400)
    buffer.log_to(directory, compress=compress)
    env = fe.record(env, buffer)
    rng = np.random.default_rng(0)
    for episode in range(episodes):
        if kind == "gym":
            env.reset(seed=episode)
            while not any(env.step(int(rng.integers(2)))[2:4]):
                pass
        elif kind == "aec":
            env.reset(seed=episode)
            for _ in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                legal = np.flatnonzero(obs["action_mask"])
                env.step(None if terminated or truncated else int(rng.choice(legal)))
        else:
            env.reset(seed=episode)
            for k, agent in enumerate(env.possible_agents):
                env.action_space(agent).seed(100 * episode + k)
            while env.agents:
                env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    env.close()
    buffer.close_log()  # opened here, not by the recorder
    return buffer


def _codecs(directory: Path) -> dict[str, str | None]:
    return {c.file: c.codec for c in log.read.read_header(str(directory))[1]}


@pytest.mark.parametrize("kind", ["gym", "parallel", "aec", "pistonball"])
def test_a_compressed_log_holds_and_samples_exactly_what_an_uncompressed_one_does(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("pettingzoo")
    compress = "auto" if kind == "pistonball" else BOTH
    packed = _recorded(kind, tmp_path / "packed", compress)
    _recorded(kind, tmp_path / "raw", None)
    codecs = _codecs(tmp_path / "packed")
    assert codecs["obs.ends.col"] == "zstd" and "obs.col" in _codecs(tmp_path / "raw")
    if kind == "pistonball":
        assert codecs["state.ends.col"] == "zstd" and codecs["obs_.tail.ends.col"] == "zstd"
        assert log.report(tmp_path / "packed").nbytes * 50 < log.report(tmp_path / "raw").nbytes
    raw = fe.FlexibleBuffer.open(tmp_path / "raw")
    mapped, read = fe.FlexibleBuffer.open(tmp_path / "packed"), fe.FlexibleBuffer.open(tmp_path / "packed", mmap=False)
    for mine, want in zip(mapped.episodes(), packed.episodes(), strict=True):
        assert_same_batches(mine, want)
    for buffer in (mapped, read):
        assert_same_draws(buffer, raw)
    assert log.verify(tmp_path / "packed").torn == ()


def test_auto_compresses_images_only_and_a_continued_log_keeps_its_columns(tmp_path: Path) -> None:
    _recorded("gym", tmp_path, "auto")
    assert set(_codecs(tmp_path).values()) == {None}  # CartPole's rows are 16 bytes: raw
    _recorded("gym", tmp_path / "both", BOTH, episodes=2)
    _recorded("gym", tmp_path / "both", None, episodes=2)  # continued: its columns as they were
    assert _codecs(tmp_path / "both")["obs.ends.col"] == "zstd"
    assert fe.FlexibleBuffer.open(tmp_path / "both").n_episodes == 4
    with pytest.raises(fe.InvalidArgumentError, match="compress: 'obs' asks for codec 'lz4'"):
        _recorded("gym", tmp_path / "bad", {"obs": "lz4"})


def test_logs_compressed_or_not_merge_into_one_holding_each_ones_episodes(tmp_path: Path) -> None:
    a = list(_recorded("gym", tmp_path / "a", BOTH).episodes())
    b = list(_recorded("gym", tmp_path / "b", None).episodes())
    fe.merge_logs([tmp_path / "a", tmp_path / "b"], tmp_path / "all")
    for mine, want in zip(fe.FlexibleBuffer.open(tmp_path / "all").episodes(), a + b, strict=True):
        assert_same_batches(mine, want)
    assert log.verify(tmp_path / "all").torn == ()


def test_a_damaged_frame_is_an_error_naming_the_file_and_the_row(tmp_path: Path) -> None:
    _recorded("gym", tmp_path, BOTH, episodes=2)
    _recorded("gym", tmp_path, BOTH, episodes=2)  # a second commit after the damaged one
    ends = np.fromfile(tmp_path / "obs.ends.col", dtype="<u8")
    frames = bytearray((tmp_path / "obs.zst").read_bytes())
    frames[int(ends[20]) - 6 : int(ends[20]) - 2] = b"\xff\xff\xff\xff"  # inside row 20's frame
    (tmp_path / "obs.zst").write_bytes(frames)
    with pytest.raises(fe.BufferFileError, match="damaged at commit"):
        log.verify(tmp_path)  # every byte is checked against its commit
    buffer = fe.FlexibleBuffer.open(tmp_path)  # the newest commit trusted: rows read as used
    assert buffer.sample_transitions(8, fields=("discrete_actions",)).discrete_actions.shape == (8, 1)
    with pytest.raises(fe.BufferFileError, match=r"obs\.zst: row 20 is corrupt \(.*checksum"):
        list(buffer.episodes())


@pytest.mark.parametrize("case", ["overlap", "claims more", "past the file"])
def test_crafted_frames_are_refused_before_anything_is_decoded(tmp_path: Path, case: str) -> None:
    before = _recorded("gym", tmp_path, BOTH, episodes=2)
    ends = np.fromfile(tmp_path / "obs.ends.col", dtype="<u8")
    if case == "overlap":
        ends[5] = ends[3]
        ends.tofile(tmp_path / "obs.ends.col")
        _recommit(tmp_path)
        with pytest.raises(fe.BufferFileError, match=r"obs\.ends\.col: corrupt: the frames of rows 0 on overlap"):
            fe.FlexibleBuffer.open(tmp_path)
        return
    import zstandard

    frames = bytearray((tmp_path / "obs.zst").read_bytes())
    if case == "claims more":  # row 3 holds a frame of a gigabyte of zeros, as small as zstd makes it
        bomb = zstandard.ZstdCompressor().compress(bytes(1 << 20))
        frames[int(ends[2]) : int(ends[3])] = bomb
        ends[3:] += np.uint64(len(bomb)) - (ends[3] - ends[2])
        ends.tofile(tmp_path / "obs.ends.col")
    (tmp_path / "obs.zst").write_bytes(frames if case == "claims more" else frames[: int(ends[-1]) - 10])
    if case == "past the file":  # as a torn append leaves it: read as of the newest commit it holds whole
        whole = fe.FlexibleBuffer.open(tmp_path)
        assert whole.n_episodes < 2
        for mine, want in zip(whole.episodes(), before.episodes()):
            assert_same_batches(mine, want)
        return
    _recommit(tmp_path)
    buffer = fe.FlexibleBuffer.open(tmp_path)
    with pytest.raises(fe.BufferFileError, match=r"obs\.zst: row 3 is corrupt \(it does not hold the row's 16 bytes"):
        list(buffer.episodes())


def _recommit(directory: Path) -> None:
    """One commit entry counting every file as it now is (a crafted log, not a torn one)."""
    _, columns = log.read.read_header(str(directory))
    entries = (directory / log.COMMITS).read_bytes()
    last, _ = log.format.parse_entry(entries[-log.ENTRY_BYTES :], len(entries) // log.ENTRY_BYTES - 1)
    crc, first = 0, log.Commit()  # what a log holds before its first commit: each tail's slot 0
    for column in [log.format.EPISODE_LENGTHS, *columns]:
        data = (directory / column.file).read_bytes()
        lo, hi = first.length(column), last.length(column)
        if column.codec is not None:
            frames = (directory / column.frames_file).read_bytes()
            start = int.from_bytes(data[lo - 8 : lo], "little") if lo else 0
            crc = zlib.crc32(frames[start : int.from_bytes(data[hi - 8 : hi], "little")], crc)
        crc = zlib.crc32(data[lo:hi], crc)
    (directory / log.COMMITS).write_bytes(log.Commit(0, last.rows, last.episodes, last.tails).entry(crc))


def test_a_mapped_compressed_log_is_read_only_and_one_read_into_memory_records_on(tmp_path: Path) -> None:
    _recorded("gym", tmp_path / "log", BOTH)
    mapped = fe.FlexibleBuffer.open(tmp_path / "log")
    mapped.log_to(tmp_path / "again")  # its ring stays where it is, as an opened log's
    mapped.close_log()
    env = fe.record(gym.make("CartPole-v1"), mapped)
    env.reset(seed=9)
    with pytest.raises(
        fe.InvalidArgumentError, match=r"obs\.zst: the rows .* are read-only; open the log with mmap=False"
    ):
        while not any(env.step(0)[2:4]):  # the rows go into the ring as the episode ends
            pass
    ram = fe.FlexibleBuffer.open(tmp_path / "log", mmap=False)
    env = fe.record(gym.make("CartPole-v1"), ram)
    first, _ = env.reset(seed=9)
    while not any(env.step(0)[2:4]):
        pass
    np.testing.assert_array_equal(list(ram.episodes())[-1].obs[0], first)  # the ring's newest episode


def _stacked_pong(kind: str) -> Any:
    """Pong's grayscale frames in stacks of 4, episodes of 40 steps: Gymnasium's
    FrameStackObservation ([4, 210, 160]), SuperSuit's frame_stack ([210, 160, 4]), or two of
    the first in a vector env of either autoreset mode."""
    import ale_py

    gym.register_envs(ale_py)

    def pong(steps: int = 40) -> gym.Env:
        return gym.make("ALE/Pong-v5", obs_type="grayscale", max_episode_steps=steps)

    if kind == "gymnasium":
        return gym.wrappers.FrameStackObservation(pong(), 4)
    if kind == "supersuit":
        import supersuit

        return supersuit.frame_stack_v1(pong(), 4)
    mode = gym.vector.AutoresetMode.SAME_STEP if kind == "vector same-step" else gym.vector.AutoresetMode.NEXT_STEP
    return gym.vector.SyncVectorEnv(
        [lambda n=n: gym.wrappers.FrameStackObservation(pong(n), 4, padding_type="zero") for n in (30, 45)],
        autoreset_mode=mode,
    )


def _stacks_recorded(kind: str, directory: Path, compress: Any) -> fe.FlexibleBuffer:
    env = _stacked_pong(kind)
    vector = kind.startswith("vector")
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=100)  # a ring that wraps
    buffer.log_to(directory, compress=compress)
    env = fe.record(env, buffer)
    env.reset(seed=0)
    for t in range(260 if vector else 200):
        if vector:
            env.step(np.array([t % 6, t % 5]))
        elif any(env.step(t % 6)[2:4]):
            env.reset()
    env.close()
    buffer.close_log()
    return buffer


@pytest.mark.parametrize("kind", ["gymnasium", "supersuit", "vector next-step", "vector same-step"])
def test_frame_stacks_are_kept_a_frame_a_row_and_read_back_exactly(tmp_path: Path, kind: str) -> None:
    """A log keeps a frame stack that moved on by one frame as its newest frame alone (found in
    the data: Gymnasium's stack on the first axis, SuperSuit's on the last), and rebuilds every
    stack exactly: padding at an episode's start, resets, final observations, both vector
    autoreset modes, a ring that wraps; every mode samples as from a raw log."""
    pytest.importorskip("ale_py")
    if kind == "supersuit":
        pytest.importorskip("supersuit")
    _stacks_recorded(kind, tmp_path / "packed", "auto")
    _stacks_recorded(kind, tmp_path / "raw", None)
    raw, packed = (log.report(tmp_path / name) for name in ("raw", "packed"))
    assert packed.episodes == raw.episodes > 4
    assert packed.nbytes * 500 < raw.nbytes  # kept whole, stacks took 350-410x less; a frame a row, 590x
    ram = fe.FlexibleBuffer.open(tmp_path / "raw", mmap=False)
    for opened in (
        fe.FlexibleBuffer.open(tmp_path / "packed"),
        fe.FlexibleBuffer.open(tmp_path / "packed", mmap=False),
    ):
        for mine, want in zip(opened.episodes(), ram.episodes(), strict=True):
            assert_same_batches(mine, want)
        assert_same_draws(opened, ram)
    assert log.verify(tmp_path / "packed").torn == ()


def test_a_mapped_multi_agent_log_saves_to_a_buffer_file_that_holds_the_same(tmp_path: Path) -> None:
    """A mapped log's per-agent columns are views in another order than a buffer's arrays:
    saving writes their values, in the file's order."""
    pytest.importorskip("pettingzoo")
    _recorded("parallel", tmp_path / "log", None)
    mapped = fe.FlexibleBuffer.open(tmp_path / "log")
    loaded = fe.FlexibleBuffer.load(mapped.save(tmp_path / "saved.fbuf"))
    for mine, want in zip(loaded.episodes(), mapped.episodes(), strict=True):
        assert_same_batches(mine, want)
