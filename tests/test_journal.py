"""The episode log's journal: each episode a record written in the step it ends, folded into the
columns later. A recording killed with episodes in its journal, or mid-record, reads back as a
prefix of what it recorded; one writer has a log at a time; a reader beside a writer sees what was
folded; the log holds each episode as it was when it ended; a record whose checksums hold but
whose values no recording writes is one BufferFileError naming the journal."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import threading
import zlib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from flexibuff_envs import log
from flexibuff_envs.log.journal import _RECORD, JOURNAL, RECORD_BYTES, Record, scan
from flexibuff_envs.log.read import state_of
from tests.batches import assert_same_batches, filled_by_hand

Files = dict[str, bytes]


def logging(directory: Path) -> gym.Env:
    """CartPole recorded to the log ``directory``, its journal folded only when asked."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=5000, gamma=0.9)
    env.buffer.log_to(directory, every=3600.0)
    env.reset(seed=0)
    return env


def play(env: gym.Env, episodes: int, rng: np.random.Generator) -> None:
    """Step ``env`` until its buffer holds ``episodes`` ended episodes."""
    while env.buffer.n_episodes < episodes:
        if any(env.step(int(rng.integers(2)))[2:4]):
            env.reset()


def snapshot(directory: Path) -> Files:
    """The log's files as a process killed now leaves them."""
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def restore(files: Files, directory: Path, journal: int | None = None) -> Path:
    """``files`` in ``directory`` (emptied first), the journal cut to ``journal`` bytes."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data[:journal] if name == JOURNAL and journal is not None else data)
    return directory


def records(directory: Path) -> list[Record]:
    state = state_of(str(directory))
    return scan(str(directory), state.columns, state.commit)[0]


def read_back(directory: Path) -> list[fe.FlexiBatch]:
    return list(fe.FlexibleBuffer.open(directory).episodes())


def test_a_journal_cut_at_any_byte_reads_back_as_the_episodes_before_the_cut(tmp_path: Path) -> None:
    """Three episodes folded into the columns, three more in the journal; the journal cut at every
    byte offset of its last record (a SIGKILL while that record was written): readers count the
    episodes of the whole records, and an opened log holds exactly those, equal to the recording's."""
    env = logging(tmp_path / "live")
    rng = np.random.default_rng(0)
    play(env, 3, rng)
    env.buffer.sync_log()
    play(env, 6, rng)
    recorded = list(env.buffer.episodes())
    killed = snapshot(tmp_path / "live")
    env.buffer.close_log()
    last = records(restore(killed, tmp_path / "cut"))[-1]
    assert (last.first, last.episodes) == (5, 1)
    for cut in range(last.offset, last.end + 1):
        report = log.report(restore(killed, tmp_path / "cut", cut))
        assert report.episodes == (6 if cut == last.end else 5), cut
        assert report.unfolded == report.episodes - 3
        torn = [t for t in report.torn if t.path.endswith(JOURNAL)]  # the columns' reserved blocks are torn too
        assert bool(torn) == (last.offset < cut < last.end)
        if cut % 97 == 0 or cut in (last.offset, last.end - 1, last.end):  # opened: folded, then read
            got = read_back(tmp_path / "cut")
            assert len(got) == report.episodes
            for mine, want in zip(got, recorded):
                assert_same_batches(mine, want)
            assert log.verify(tmp_path / "cut").torn == ()  # folding emptied the journal
    for mine, want in zip(read_back(tmp_path / "live"), recorded, strict=True):  # closed: every episode
        assert_same_batches(mine, want)


@pytest.fixture(scope="module")
def source() -> tuple[fe.FlexibleBuffer, list[fe.FlexiBatch]]:
    """A RAM buffer of 20 CartPole episodes, and each episode as it hands it out."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=5000, gamma=0.9)
    env.reset(seed=1)
    play(env, 20, np.random.default_rng(1))
    return env.buffer, list(env.buffer.episodes())


@settings(max_examples=30, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.floats(0, 0.999))), min_size=1, max_size=6))
def test_records_kills_and_resumes_leave_a_prefix_of_what_was_recorded(
    tmp_path_factory: pytest.TempPathFactory,
    source: tuple[fe.FlexibleBuffer, list[fe.FlexiBatch]],
    plan: list[tuple[int, float | None]],
) -> None:
    """Any sequence of records (``n`` episodes each, through `LogWriter.append_rows` as a recorder
    writes them), kills while a record was written (the files as the kill left them, the journal
    cut inside that record) and resumes: readers see exactly the episodes of the records that
    were whole, in order."""
    buffer, episodes = source
    lane = buffer._index.ring[0]
    ended = [(int(s), int(e)) for s, e in zip(lane.ended.starts, lane.ended.ends)]
    header = log.LogHeader(buffer.spec, buffer.gamma, buffer.gae_lambda)
    directory = tmp_path_factory.mktemp("log")

    def append(writer: log.LogWriter, at: int, n: int) -> None:
        lo, hi = ended[at][0], ended[at + n - 1][1]
        writer.append_rows(buffer._store, lane.segments(lo, hi), np.array([e - s for s, e in ended[at : at + n]]))

    writer = log.LogWriter(directory, header)
    append(writer, 0, 1)  # a new log's first episodes make its columns, in a commit of their own
    writer.close()
    expected, at = episodes[:1], 1
    for n, kill in plan:
        if at + n > len(ended):
            break
        writer = log.LogWriter(directory, header, every=3600.0)  # a resume
        append(writer, at, n)
        files, last = snapshot(directory), records(directory)[-1]
        writer.close()
        if kill is None:
            expected += episodes[at : at + n]
        else:
            restore(files, directory, last.offset + int(kill * (last.end - last.offset)))
        at += n
        got = read_back(directory)
        assert len(got) == len(expected)
        for mine, want in zip(got, expected):
            assert_same_batches(mine, want)
        assert log.verify(directory).episodes == len(expected)


def test_one_writer_at_a_time_and_a_reader_beside_it_sees_what_was_folded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flexibuff_envs.cli import main

    env = logging(tmp_path)
    play(env, 4, np.random.default_rng(0))
    header = log.LogHeader(env.buffer.spec, env.buffer.gamma, env.buffer.gae_lambda)
    with pytest.raises(fe.BufferFileError, match="another writer has this episode log open"):
        log.LogWriter(tmp_path, header)
    folded = state_of(str(tmp_path)).commit.episodes  # the first made the log's columns, in a commit
    assert folded == 1
    assert len(read_back(tmp_path)) == 1  # the writer's records are its own to fold
    assert log.report(tmp_path).unfolded == 3
    assert log.report(tmp_path).live and log.verify(tmp_path).torn == ()  # its reserved blocks are its own
    assert main(["verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "4 whole episodes" in out and "3 of those episodes are in its journal" in out and "a writer has it open" in out
    )
    assert main(["inspect", str(tmp_path)]) == 0 and "writer" in capsys.readouterr().out
    env.buffer.sync_log()
    assert len(read_back(tmp_path)) == 4
    play(env, 6, np.random.default_rng(1))
    env.buffer.close_log()
    log.LogWriter(tmp_path, header).close()  # closed, the log takes a writer again
    assert not log.report(tmp_path).live
    for mine, want in zip(read_back(tmp_path), env.buffer.episodes(), strict=True):
        assert_same_batches(mine, want)


def test_the_log_holds_each_episode_as_it_was_when_it_ended(tmp_path: Path) -> None:
    """Rows changed after their episode ended (by hand, or feedback on the episode before) change
    the buffer, not the log: what was handed to the OS at the end is what is folded."""
    env = logging(tmp_path)
    play(env, 5, np.random.default_rng(0))
    before = list(env.buffer.episodes())
    env.buffer.field("global_rewards")[:] = 123.0
    env.buffer.close_log()
    logged = read_back(tmp_path)
    assert len(logged) == 5
    for mine, want in zip(logged, before):
        assert_same_batches(mine, want)
    assert not any((batch.global_rewards == 123.0).any() for batch in logged)


def test_a_record_no_recording_writes_is_one_buffer_file_error_naming_the_journal(tmp_path: Path) -> None:
    env = logging(tmp_path / "live")
    play(env, 3, np.random.default_rng(0))  # the first in the columns, two in the journal
    killed = snapshot(tmp_path / "live")
    env.buffer.close_log()
    length = struct.unpack("<q", killed[JOURNAL][RECORD_BYTES : RECORD_BYTES + 8])[0]
    crafted = bytearray(killed[JOURNAL])
    crafted[RECORD_BYTES : RECORD_BYTES + 8] = struct.pack("<q", length + 1)  # lengths past the rows
    fields = list(_RECORD.unpack(bytes(crafted[: _RECORD.size])))
    fields[-1] = zlib.crc32(bytes(crafted[RECORD_BYTES : RECORD_BYTES + fields[-2]]))
    head = _RECORD.pack(*fields)
    crafted[:RECORD_BYTES] = head + struct.pack("<I", zlib.crc32(head))
    directory = restore({**killed, JOURNAL: bytes(crafted)}, tmp_path / "crafted")
    with pytest.raises(fe.BufferFileError, match=f"{JOURNAL}: corrupt record .* lengths do not sum"):
        fe.FlexibleBuffer.open(directory)
    with pytest.raises(fe.BufferFileError, match=f"{JOURNAL}: corrupt record"):
        log.verify(directory)
    assert log.report(directory).episodes == 3  # counted, never folded: the columns are as they were
    assert state_of(str(directory)).commit.episodes == 1


def test_next_values_filled_in_by_hand_are_logged_as_the_buffer_holds_them(tmp_path: Path) -> None:
    """A buffer filled by hand logs its ``obs_`` (once a log header named a column no reader
    takes), and an episode whose last ``obs_`` is chained to the next episode in the ring carries
    that value in its record, as the log's next episode may be another."""
    buffer = filled_by_hand(tmp_path / "by hand")
    held = list(buffer.episodes())
    buffer.close_log()
    for mine, want in zip(read_back(tmp_path / "by hand"), held, strict=True):
        assert_same_batches(mine, want)
    learner = fe.FlexibleBuffer(20, obs_size=2, discrete_action_cardinalities=[2], individual_reward=True)
    learner.log_to(tmp_path / "moved", every=3600.0)
    learner.extend(filled_by_hand().take_episodes())  # a new log: its columns made by a commit
    learner.extend(filled_by_hand().take_episodes())  # a journal record of two episodes
    assert log.report(tmp_path / "moved").unfolded == 2
    held = list(learner.episodes())
    learner.close_log()
    logged = read_back(tmp_path / "moved")
    for mine, want in zip(logged, held, strict=True):
        assert_same_batches(mine, want)
    np.testing.assert_array_equal(logged[2].obs_[-1], [6.0, 7.0])


def test_a_sync_the_disk_refused_is_raised_once_and_loses_no_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interval's sync runs on a thread while the recording goes on; an fsync failing there
    (EIO, which no test can make a real disk give) is raised by the next fold, once, naming the
    file, with nothing written in that call; the recording goes on and the log holds every episode."""
    real, failed = os.fsync, []

    def fsync(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread() and not failed:
            failed.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    env = fe.record(gym.make("CartPole-v1"), num_steps=5000)
    env.buffer.log_to(tmp_path, every=0.0)  # a fold and a sync at each episode's end
    env.reset(seed=0)
    rng, refused = np.random.default_rng(0), []
    while env.buffer.n_episodes < 40:
        try:
            done = any(env.step(int(rng.integers(2)))[2:4])
        except fe.BufferSaveError as error:
            refused.append(error)
            done = True
        if done:
            env.reset()
    env.close()
    assert failed and len(refused) == 1
    assert "cannot sync the episode log" in str(refused[0]) and refused[0].filename.startswith(str(tmp_path))
    for mine, want in zip(read_back(tmp_path), env.buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
