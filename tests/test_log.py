"""The episode log on disk: whole episodes appended to column files and committed, read back
exactly, a torn tail (a process killed mid-append) never read, cut by repair or a resumed
writer, and a crafted log one BufferFileError naming the file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from flexibuff_envs import log
from flexibuff_envs.log.read import Reader, State, state_of
from tests import killed
from tests.batches import assert_same_batches


def recorded_chunks(episodes_per_chunk: list[int], seed: int = 0) -> tuple[list[fe.Chunk], list[fe.FlexiBatch]]:
    """CartPole recorded with fixed actions, its ended episodes taken ``episodes_per_chunk[k]`` at
    a time: the chunks, and every episode as the buffer handed it out before it was taken."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=5000, gamma=0.9)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    chunks, batches = [], []
    for wanted in episodes_per_chunk:
        while env.buffer.n_episodes < wanted:
            _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            if terminated or truncated:
                env.reset()
        batches += list(env.buffer.episodes())
        chunks.append(env.buffer.take_episodes())
    return chunks, batches


def header_of(chunk: fe.Chunk) -> log.LogHeader:
    return log.LogHeader(chunk.spec, chunk.gamma, chunk.gae_lambda)


def read_back(directory: Path) -> list[fe.FlexiBatch]:
    """Every episode of the log, as a buffer opened on it hands them out."""
    return list(fe.FlexibleBuffer.open(directory).episodes())


def test_appended_episodes_read_back_as_recorded(tmp_path: Path) -> None:
    chunks, batches = recorded_chunks([1, 3, 2, 5, 1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    for chunk in chunks:
        writer.append(chunk)
    writer.close()
    for mapped in (True, False):
        got = list(fe.FlexibleBuffer.open(tmp_path, mmap=mapped).episodes())
        assert len(got) == len(batches) == 12
        for mine, want in zip(got, batches):
            assert_same_batches(mine, want)
    report = log.verify(tmp_path)
    assert (report.episodes, report.rows, report.torn) == (12, sum(len(b.obs) for b in batches), ())


def _sizes(directory: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in directory.iterdir() if path.suffix in (".col", ".fblog")}


def _committed(directory: Path) -> dict[str, int]:
    """The bytes of each file the log's newest whole commit counts."""
    state = log.read.state_of(str(directory))
    return {
        log.COMMITS: (state.commit.number + 1) * log.ENTRY_BYTES,
        **{column.file: state.commit.length(column) for column in state.files},
    }


def _kill_during(writer: log.LogWriter, chunk: fe.Chunk, at: float) -> None:
    """What a SIGKILL at fraction ``at`` of appending ``chunk`` leaves: the append's bytes, in
    the order it puts them (each episode's length, every column, then the commit entry), kept
    up to that point, the rest never written."""
    directory = Path(writer.directory)
    before = _committed(directory)
    writer.append(chunk)
    after = _committed(directory)
    # a new column starts as a kill before the append leaves it: a tail holding its slot 0
    start = {
        log.LENGTHS: 0,
        log.COMMITS: 0,
        **{column.file: column.row_bytes if column.part == "tail" else 0 for column in writer.columns},
        **before,
    }
    order = [log.LENGTHS, *(column.file for column in writer.columns), log.COMMITS]
    budget = int(at * sum(after[name] - start[name] for name in order))
    writer.close()
    for name in order:
        keep = min(after[name] - start[name], budget)
        os.truncate(directory / name, start[name] + keep)
        budget -= keep


@settings(max_examples=40, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.floats(0, 0.999))), min_size=1, max_size=5))
def test_appends_kills_and_resumes_leave_a_prefix_of_what_was_recorded(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[int, float | None]]
) -> None:
    """Any sequence of appends, kills mid-append (the files cut where the kill leaves them) and
    resumes: readers see exactly the episodes of the appends that finished, in order, and a
    resumed writer cuts what a kill left before appending on."""
    directory = tmp_path_factory.mktemp("log")
    chunks, batches = recorded_chunks([n for n, _ in plan])
    bounds = np.cumsum([0, *(c.n_episodes for c in chunks)])
    expected: list[fe.FlexiBatch] = []
    for k, (chunk, (_, kill)) in enumerate(zip(chunks, plan)):
        writer = log.LogWriter(directory, header_of(chunk))  # a resume, after the first
        if kill is None:
            writer.append(chunk)
            writer.close()
            expected += batches[bounds[k] : bounds[k + 1]]
        else:
            _kill_during(writer, chunk, kill)
        got = read_back(directory)
        assert len(got) == len(expected)
        for mine, want in zip(got, expected):
            assert_same_batches(mine, want)
        assert log.verify(directory).episodes == len(expected)


def test_after_a_power_loss_a_commit_whose_rows_never_reached_the_disk_ends_the_log(tmp_path: Path) -> None:
    """A power loss can keep a commit entry on the disk while rows of one before it never got
    there (the OS writes pages back in any order; checking the newest commit does not see it).
    A log last synced in another boot has every commit since that sync checked: it reads back as
    the episodes before the first whose rows are missing, and a writer opening it cuts there. One
    synced in this boot is read as its newest commit says: no process loses the page cache."""
    chunks, batches = recorded_chunks([1, 3, 2, 5, 1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]), fsync="close")
    for chunk in chunks:
        writer.append(chunk)
    files = {path.name: path.read_bytes() for path in tmp_path.iterdir()}  # killed here: synced at open only
    writer.close()
    obs = next(column for column in log.read.state_of(str(tmp_path)).columns if column.file == "obs.col")
    lengths = np.frombuffer(files[log.LENGTHS], dtype=np.int64)
    at = (int(lengths[:4].sum()) + 1) * obs.row_bytes  # a row of the third commit, as a power loss leaves it
    files["obs.col"] = files["obs.col"][:at] + bytes(obs.row_bytes) + files["obs.col"][at + obs.row_bytes :]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert len(read_back(tmp_path)) == 12  # this boot: the newest commit holds, so the log is read as it says
    synced = (tmp_path / "synced.fblog").read_bytes()
    other = synced[:8] + b"another boot".ljust(40, b"\0") + synced[48:56]
    (tmp_path / "synced.fblog").write_bytes(other + struct.pack("<I", zlib.crc32(other)))
    got = read_back(tmp_path)
    assert len(got) == 4  # the first two commits' episodes
    for mine, want in zip(got, batches, strict=False):
        assert_same_batches(mine, want)
    log.LogWriter(tmp_path, header_of(chunks[0])).close()  # a resume cuts past them
    assert log.verify(tmp_path).episodes == 4 and not log.verify(tmp_path).torn


def test_repair_cuts_only_the_torn_tails(tmp_path: Path) -> None:
    chunks, _ = recorded_chunks([2, 4])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    for chunk in chunks:
        writer.append(chunk)
    writer.close()
    whole = {name: (tmp_path / name).read_bytes() for name in _sizes(tmp_path)}
    for name in ("obs.col", log.COMMITS):  # an append a kill cut short: rows, and half its entry
        with open(tmp_path / name, "ab") as out:
            out.write(bytes(40))
    assert {Path(t.path).name: t.size for t in log.verify(tmp_path).torn} == {"obs.col": 40, log.COMMITS: 40}
    assert len(read_back(tmp_path)) == 6
    report = log.repair(tmp_path)
    assert report.episodes == 6 and len(report.torn) == 2
    assert {name: (tmp_path / name).read_bytes() for name in whole} == whole and log.verify(tmp_path).torn == ()


def _entry(number: int, rows: int, episodes: int, tails: tuple[int, ...], crc: int) -> bytes:
    body = struct.pack("<8sQQQ3QI", b"FBCOMMIT", number, rows, episodes, *tails, crc)
    return body + struct.pack("<I", zlib.crc32(body))


def _rewrite_header(directory: Path, change: object) -> None:
    """The header with its JSON changed by ``change`` (a function of the parsed JSON, or bytes
    that replace it), its checksum right."""
    raw = (directory / log.HEADER).read_bytes()
    blob = raw[20:-4]
    blob = change if isinstance(change, bytes) else json.dumps(change(json.loads(blob))).encode()  # type: ignore[operator]
    prefix = struct.pack("<8sIQ", b"FBLOGHDR", 2, len(blob)) + blob
    (directory / log.HEADER).write_bytes(prefix + struct.pack("<I", zlib.crc32(prefix)))


def _first_column(header: dict, **change: object) -> dict:
    return {**header, "columns": [{**header["columns"][0], **change}, *header["columns"][1:]]}


@pytest.mark.parametrize(
    "case",
    [
        "object dtype",
        "unknown field",
        "wrong shape",
        "not json",
        "bad checksum",
        "slot out of range",
        "lengths off",
        "damaged, then whole",
    ],
)
def test_a_crafted_log_is_one_buffer_file_error_naming_the_file(tmp_path: Path, case: str) -> None:
    chunks, _ = recorded_chunks([2, 1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    for chunk in chunks:
        writer.append(chunk)
    writer.close()
    says, named = "corrupt", tmp_path / log.HEADER
    if case == "object dtype":
        _rewrite_header(tmp_path, lambda h: _first_column(h, dtype="|O"))
    elif case == "unknown field":
        _rewrite_header(tmp_path, lambda h: _first_column(h, name="weights"))
    elif case == "wrong shape":
        _rewrite_header(tmp_path, lambda h: _first_column(h, shape=[2**20, 4]))
    elif case == "not json":
        _rewrite_header(tmp_path, b"[[[")
    elif case == "bad checksum":
        raw = bytearray((tmp_path / log.HEADER).read_bytes())
        raw[30] ^= 0xFF
        (tmp_path / log.HEADER).write_bytes(bytes(raw))
        says = "checksum mismatch"
    else:
        # the newest commit's first row (episode) made to say what the case needs, its entry made
        # to count it with checksums right
        state = state_of(str(tmp_path))
        last = entry_of(state, state.commit.number)
        previous = entry_of(state, last.number - 1)
        named = tmp_path / {"slot out of range": "obs_.index.col", "lengths off": log.LENGTHS}.get(case, log.COMMITS)
        raw = bytearray(named.read_bytes())
        if case == "slot out of range":
            raw[previous.rows * 4 : previous.rows * 4 + 4] = struct.pack("<i", 10**6)
            says = "slot outside"
        elif case == "lengths off":
            raw[previous.episodes * 8 : previous.episodes * 8 + 8] = struct.pack("<q", 0)
            says = "lengths must be positive"
        else:  # the first commit's entry damaged, the second whole
            says = "damaged at commit 0"
            raw[10] ^= 0xFF
        named.write_bytes(bytes(raw))
        if case != "damaged, then whole":
            crc = 0
            for column in state.files:
                crc = zlib.crc32(
                    (tmp_path / column.file).read_bytes()[previous.length(column) : last.length(column)], crc
                )
            commits = (tmp_path / log.COMMITS).read_bytes()[: -log.ENTRY_BYTES]
            (tmp_path / log.COMMITS).write_bytes(
                commits + _entry(last.number, last.rows, last.episodes, last.tails, crc)
            )
    readers = [lambda: log.verify(tmp_path), lambda: fe.FlexibleBuffer.open(tmp_path)]
    for reader in readers if case != "damaged, then whole" else readers[:1]:
        with pytest.raises(fe.BufferFileError, match=f"^{named}: .*{says}"):
            reader()


def entry_of(state: State, number: int) -> log.Commit:
    with Reader(state) as reader:
        item = reader.entry(number)
    assert item is not None
    return item[0]


def test_a_writer_refuses_a_log_of_another_layout(tmp_path: Path) -> None:
    chunks, _ = recorded_chunks([1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    writer.append(chunks[0])
    writer.close()
    pendulum = fe.infer_spec(gym.make("Pendulum-v1"))
    # the log's size (CartPole's 4) there, the recording's (Pendulum's 3) in the buffer
    with pytest.raises(fe.SpecMismatchError, match="obs_size is 4 there but 3 in the buffer"):
        log.LogWriter(tmp_path, log.LogHeader(pendulum, 0.9, 0.95))
    with pytest.raises(fe.BufferFileError, match="discounts"):
        log.LogWriter(tmp_path, log.LogHeader(chunks[0].spec, 0.5, 0.95))
    with pytest.raises(fe.BufferFileError, match="not a directory"):
        fe.FlexibleBuffer.open(tmp_path / "obs.col")
    with pytest.raises(fe.BufferFileError, match="no header.fblog"):
        fe.FlexibleBuffer.open(tmp_path.parent)


def test_verify_and_repair_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flexibuff_envs.cli import main

    chunks, _ = recorded_chunks([3])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    writer.append(chunks[0])
    writer.close()
    assert main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}: 3 whole episodes")
    with open(tmp_path / log.COMMITS, "ab") as out:
        out.write(b"FBCOMMIT" + bytes(10))  # an entry cut short
    assert main(["verify", str(tmp_path)]) == 1
    said = capsys.readouterr().out
    assert "torn tail: 18 bytes past the last whole append, left by a writer that was killed" in said
    assert said.count("torn tail") == 1
    assert main(["repair", str(tmp_path)]) == 0
    assert (
        "3 whole episodes kept, every one in its columns; cut 18 torn bytes from commits.fblog"
        in capsys.readouterr().out
    )
    assert main(["verify", str(tmp_path)]) == 0
    assert main(["verify", str(tmp_path / "none")]) == 1
    assert "no such episode log" in capsys.readouterr().err


def _kinds_recorded(kind: str, directory: Path, num_steps: int = 5000) -> fe.FlexibleBuffer:
    """A recording of ``kind`` logged to ``directory`` by a buffer of ``num_steps``; returns its
    buffer (the recorder closed)."""
    if kind == "atari":  # rows of 100 KB: a fold takes a few episodes a commit
        env = fe.record(_pong(25), num_steps=min(num_steps, 400), log=directory)
        env.reset(seed=0)
        for t in range(300):
            if any(env.step(t * 7 % 6)[2:4]):
                env.reset()
    elif kind == "atari vector":  # episodes of 20 to 35 stacks of 4 grayscale frames, ending at different steps
        env = fe.record(
            gym.vector.SyncVectorEnv([lambda n=n: killed._pong(n, stacked=True) for n in (20, 25, 30, 35)]),
            num_steps=min(num_steps, 800),
            log=directory,
        )
        env.reset(seed=0)
        for t in range(150):
            env.step(np.array([t % 6, t % 5, t % 4, t % 3]))
    elif kind == "gym":
        env = fe.record(gym.make("CartPole-v1"), num_steps=num_steps, log=directory)
        env.reset(seed=0)
        for t in range(500):
            _, _, terminated, truncated, _ = env.step(t % 2)
            if terminated or truncated:
                env.reset()
    elif kind == "vector":
        env = fe.record(
            gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4), num_steps=num_steps, log=directory
        )
        env.reset(seed=0)
        for t in range(300):
            env.step(np.array([t % 2, 1, 0, t % 3 % 2]))
    elif kind == "parallel":
        from mpe2 import simple_spread_v3

        env = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=num_steps, log=directory)
        env.reset(seed=0)
        for t in range(100):
            env.step({agent: (t + i) % 5 for i, agent in enumerate(env.agents)})
            if not env.agents:
                env.reset()
    else:
        from pettingzoo.classic import connect_four_v3

        env = fe.record(connect_four_v3.env(), num_steps=num_steps, log=directory)
        for episode in range(10):
            env.reset(seed=episode)
            for _ in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                legal = np.flatnonzero(obs["action_mask"])
                env.step(None if terminated or truncated else int(legal[episode % len(legal)]))
    env.close()
    return env.buffer


def _pong(steps: int) -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", max_episode_steps=steps)


_KINDS = ["gym", "vector", "parallel", "aec", "atari", "atari vector"]


def _needs(kind: str) -> None:
    if kind in ("parallel", "aec"):
        pytest.importorskip("pettingzoo")
        pytest.importorskip("mpe2")
    if kind.startswith("atari"):
        pytest.importorskip("ale_py")


@pytest.mark.parametrize("kind", _KINDS)
def test_every_recorder_kind_logs_each_episode_as_the_buffer_holds_it(tmp_path: Path, kind: str) -> None:
    _needs(kind)
    buffer = _kinds_recorded(kind, tmp_path)
    assert not buffer.logging  # closed with the recorder that opened it
    logged, held = read_back(tmp_path), list(buffer.episodes())
    assert len(logged) == len(held) > 5
    for mine, want in zip(sorted(logged, key=_key), sorted(held, key=_key)):
        assert_same_batches(mine, want)


def _key(batch: fe.FlexiBatch) -> bytes:
    """An episode's key for sorting: a vector recorder logs a block's ended episodes lane by lane."""
    return batch.obs.tobytes() + batch.discrete_actions.tobytes()


@pytest.mark.parametrize("kind", _KINDS)
def test_a_ring_that_wraps_logs_every_episode_as_one_that_does_not(tmp_path: Path, kind: str) -> None:
    _needs(kind)
    # a few episodes, folded as it wraps
    rows = {"gym": 160, "vector": 160, "parallel": 32, "aec": 48, "atari": 110, "atari vector": 60}[kind]
    small = _kinds_recorded(kind, tmp_path / "small", rows)
    _kinds_recorded(kind, tmp_path / "large")
    assert len(list(small.episodes())) < len(read_back(tmp_path / "large")) > 5
    small_log, large_log = read_back(tmp_path / "small"), read_back(tmp_path / "large")
    for mine, want in zip(sorted(small_log, key=_key), sorted(large_log, key=_key), strict=True):
        assert_same_batches(mine, want)


def test_a_log_the_buffer_keeps_outlives_its_recorders_and_a_dropped_buffer_lets_go_of_it(tmp_path: Path) -> None:
    """A log opened by `log_to` stays open across recorders (closing one syncs it); a buffer
    dropped with its log open closes the log's files, with no ResourceWarning, and the log is whole."""
    import gc
    import warnings

    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(gym.make("CartPole-v1")), num_steps=1000)
    buffer.log_to(tmp_path)
    for seed in (0, 1):
        env = fe.record(gym.make("CartPole-v1"), buffer)
        env.reset(seed=seed)
        while not any(env.step(0)[2:4]):
            pass
        env.close()
        assert buffer.logging
    held = list(buffer.episodes())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        del buffer, env
        gc.collect()
    assert [str(w.message) for w in said if issubclass(w.category, ResourceWarning)] == []
    for mine, want in zip(read_back(tmp_path), held, strict=True):
        assert_same_batches(mine, want)


def _assert_from_reference(logged: list[fe.FlexiBatch], reference: dict[bytes, np.ndarray]) -> None:
    for batch in logged:
        rewards = reference.get(batch.obs.tobytes())
        assert rewards is not None, "an episode no plain loop played (a part of one, or rows of two)"
        np.testing.assert_array_equal(batch.individual_rewards, rewards)


@pytest.mark.parametrize("kind", killed.KINDS)
def test_a_recording_killed_at_any_moment_keeps_every_ended_episode(tmp_path: Path, kind: str) -> None:
    """SIGKILL from another process, at random moments (Atari frames compressed): the log holds
    at least every episode the env had reported ended when the kill landed (the recording prints
    each end after the call returns), each equal to an episode of a plain loop with the same seeds and actions,
    and no part of any other; resuming the log appends after them."""
    _needs(kind)
    reference = killed.reference(kind)
    rng = np.random.default_rng(0)
    for kill in range(int(os.environ.get("FLEXIBUFF_KILLS", "3"))):
        directory = tmp_path / f"kill{kill}"
        ended = killed.kill_after(kind, directory, rng.uniform(0.0, 1.5))
        logged = read_back(directory)
        assert len(logged) >= ended
        if kind.startswith("atari") and logged:  # frames kept as zstd frames (the default for images)
            obs = {c.file: c for c in log.format.read_header(str(directory))[1]}["obs.ends.col"]
            assert obs.codec == "zstd" and (obs.stack is not None) == (kind == "atari vector")  # stacks a frame a row
        _assert_from_reference(logged, reference)
        resumed = killed.recording(kind, directory, "3")
        assert resumed.communicate(timeout=120)[1] is None and resumed.returncode == 0
        again = read_back(directory)
        assert len(again) >= len(logged) + 3
        for before, after in zip(logged, again):
            assert_same_batches(before, after)
        _assert_from_reference(again, reference)
        assert log.verify(directory).torn == ()
        shutil.rmtree(directory)


def test_a_recording_resumed_without_a_field_the_log_holds_appends_its_allocated_value(tmp_path: Path) -> None:
    """A log continued by a buffer that lacks one of its fields (values annotated before, not
    now): the new episodes hold what an unwritten row holds (NaN values), the old ones keep
    theirs, and each reads back as its buffer held it."""
    held: list[fe.FlexiBatch] = []
    for annotated in (True, False):
        env = fe.record(gym.make("CartPole-v1"), num_steps=2000, log=tmp_path / "run.log")
        obs, _ = env.reset(seed=int(annotated))
        while env.buffer.n_episodes < 4:
            if annotated:
                env.annotate(values=float(obs[0]))
            obs, _, terminated, truncated, _ = env.step(int(obs[2] > 0))
            if terminated or truncated:
                obs, _ = env.reset()
        env.close()
        held += list(env.buffer.episodes())
    logged = read_back(tmp_path / "run.log")
    assert len(logged) == len(held) == 8
    for k, (mine, want) in enumerate(zip(logged, held)):
        if k < 4:
            assert_same_batches(mine, want)
            assert np.isfinite(mine.values).all()
        else:
            assert np.isnan(mine.values).all()
            for name in ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "G"):
                np.testing.assert_array_equal(getattr(mine, name), getattr(want, name), err_msg=name)


def test_the_cli_records_to_a_log_resumes_it_and_inspects_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out DIR`` logs what ``--out FILE.fbuf`` saves, episode for episode; a log is continued
    only with --resume, which repeats none of its episodes; ``inspect DIR`` reports it as it
    reports a file."""
    from flexibuff_envs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "CartPole-v1", "--episodes", "40", "--seed", "3", "--out", "run.fbuf"]) == 0
    assert main(["record", "CartPole-v1", "--episodes", "40", "--seed", "3", "--out", "run.log"]) == 0
    assert "40 whole episodes and" in capsys.readouterr().out
    for mine, want in zip(read_back(tmp_path / "run.log"), fe.FlexibleBuffer.load("run.fbuf").episodes(), strict=True):
        assert_same_batches(mine, want)
    assert main(["record", "CartPole-v1", "--episodes", "5", "--out", "run.log"]) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err
    # the same command resumed: it goes on with another seed, and says which
    assert main(["record", "CartPole-v1", "--episodes", "5", "--seed", "3", "--out", "run.log", "--resume"]) == 0
    assert "holds 40 episodes; this run goes on with seed " in capsys.readouterr().err
    assert main(["inspect", "run.log"]) == 0
    assert "45 whole episodes" in capsys.readouterr().out
    episodes = read_back(tmp_path / "run.log")
    assert len({batch.obs.tobytes() for batch in episodes}) == len(episodes) == 45  # none played twice
    assert main(["record", "CartPole-v1", "--episodes", "5", "--out", "run.fbuf", "--resume"]) == 2


def test_a_log_reads_into_a_buffer_that_plots_and_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("minari")
    from flexibuff_envs.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    buffer = _kinds_recorded("gym", tmp_path / "run.log")
    read = fe.FlexibleBuffer.from_log(tmp_path / "run.log")
    assert read.n_episodes == buffer.n_episodes and len(read) == sum(len(e.obs) for e in buffer.episodes())
    assert main(["plot", "run.log", "--out", "run.png"]) == 0 and (tmp_path / "run.png").stat().st_size > 0
    assert main(["export", "run.log", "--minari", "cartpole/log-v0", "--env", "CartPole-v1"]) == 0
    assert f"{buffer.n_episodes} episodes" in capsys.readouterr().out


def test_a_full_disk_mid_append_leaves_no_half_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails (here the file size limit, as a full disk fails it) takes back what
    it wrote: the error names the file, every episode before stays, no byte past them (nor a
    reserved block) is left, appending goes on. Small windows, so that both ways an append
    lands (copied into a reserved window, written when large) meet the limit."""
    import resource
    import signal

    monkeypatch.setattr(log.append_window, "FIRST", 4096)
    monkeypatch.setattr(log.append_window, "WINDOW", 4096)
    monkeypatch.setattr(log.append_window, "LARGE", 1024)
    chunks, batches = recorded_chunks([2, 30, 1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    writer.append(chunks[0])
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limits[1]))
    try:
        with pytest.raises(fe.BufferSaveError, match="cannot append to the episode log") as caught:
            writer.append(chunks[1])  # 30 episodes: obs.col's rows are more than 8 kB
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert caught.value.filename == str(tmp_path / "obs.col")  # the largest column reached the limit first
    report = log.verify(tmp_path)
    assert report.episodes == 2 and report.torn == ()
    writer.append(chunks[2])
    writer.close()
    got = read_back(tmp_path)
    assert len(got) == 3
    for mine, want in zip(got, [*batches[:2], batches[-1]]):
        assert_same_batches(mine, want)


def test_a_log_on_a_full_disk_reads_without_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A killed recording's journal on a disk with no room (the file size limit stands for it):
    `open` and `inspect` read the folded episodes, grow no file (they cut the blocks the killed
    writer reserved past its commits, which frees room), and say once why the rest are left
    out; once there is room, the next open folds them."""
    import resource

    from flexibuff_envs.cli import main

    for attempt in range(10):  # killed with episodes in its journal (not just after a fold)
        directory = tmp_path / f"run{attempt}.log"
        ended = killed.kill_after("gym", directory, 0.6 + 0.1 * attempt)
        if log.report(directory).unfolded:
            break
    assert ended > 0 and log.report(directory).unfolded > 0
    assert main(["verify", str(directory)]) == 1  # a killed writer's tails, in many files: said once
    assert [line.startswith("torn tail: ") for line in capsys.readouterr().out.splitlines()].count(True) == 1
    sizes = {path: path.stat().st_size for path in directory.rglob("*") if path.is_file()}
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            partial = fe.FlexibleBuffer.open(directory).n_episodes
            assert main(["inspect", str(directory)]) == 0
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert ["cannot be folded" in str(w.message) for w in said] == [True, True]  # once per open
    assert "episode log" in capsys.readouterr().out
    assert all(path.stat().st_size <= size for path, size in sizes.items())  # nothing grew
    assert fe.FlexibleBuffer.open(directory).n_episodes >= max(partial, ended)
    assert log.verify(directory).torn == ()


def _cli(directory: Path, *args: str, env: str = "CartPole-v1", **options: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flexibuff_envs", "record", env, "--out", str(directory), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,
    )


def _wait_for_commits(directory: Path, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not (directory / log.COMMITS).exists() or (directory / log.COMMITS).stat().st_size < 10 * log.ENTRY_BYTES:
        assert child.poll() is None and time.monotonic() < deadline, "the recording did not start logging"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["gym", "vector", "parallel", "aec"])
def test_truncate_ends_the_running_episodes_where_they_stand_and_logs_them(tmp_path: Path, kind: str) -> None:
    """A run stopped mid-episode (the CLI at Ctrl-C) keeps its running episodes: `truncate` ends
    each at its last recorded step, truncated there, with its G, and the log holds it whole."""
    _needs(kind)
    if kind == "gym":
        env = fe.record(gym.make("CartPole-v1"), num_steps=100, log=tmp_path)
        env.reset(seed=0)
        for t in range(6):
            env.step(t % 2)
    elif kind == "vector":
        env = fe.record(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync"), num_steps=100, log=tmp_path)
        env.reset(seed=0)
        for t in range(6):
            env.step(np.array([t % 2] * 3))
    elif kind == "parallel":
        from mpe2 import simple_spread_v3

        env = fe.record(simple_spread_v3.parallel_env(max_cycles=25), num_steps=100, log=tmp_path)
        env.reset(seed=0)
        for t in range(6):
            env.step({agent: t % 5 for agent in env.agents})
    else:
        from pettingzoo.classic import connect_four_v3

        env = fe.record(connect_four_v3.env(), num_steps=100, log=tmp_path)
        env.reset(seed=0)
        for t in range(12):  # six moves each, no four in a row
            env.step([0, 1, 2, 3, 4, 5][t % 6] if t % 12 < 6 else [1, 0, 3, 2, 5, 4][t % 6])
    assert env.buffer.n_episodes == 0
    env.truncate()
    env.truncate()  # nothing left running: nothing more
    env.close()
    logged = read_back(tmp_path)
    assert len(logged) == (3 if kind == "vector" else 1) == env.buffer.n_episodes
    for episode in logged:
        if kind == "aec":  # a move is a row once its player's next turn shows what it led to
            assert [int(np.flatnonzero(a)[-1]) for a in episode.active] == [4, 4]
            assert episode.truncated[:, 4].all() and not episode.terminated.any()
            continue
        assert len(episode.obs if kind in ("gym", "vector") else episode.obs[0]) == 6
        assert episode.truncated.reshape(-1, 6)[:, -1].all() and not episode.terminated.any()
        assert np.isfinite(episode.G).all()


def _count(text: str, before: str) -> int:
    """The number printed just before ``before`` in ``text``."""
    return int(text.split(before)[0].rsplit(" ", 1)[1].replace(",", ""))


@pytest.mark.parametrize(
    ("env", "signum", "code", "says"),
    [
        ("CartPole-v1", signal.SIGTERM, 143, "stopped by SIGTERM"),
        ("CartPole-v1", signal.SIGINT, 130, "stopped by Ctrl-C"),
        ("mpe2.simple_spread_v3", signal.SIGTERM, 143, "stopped by SIGTERM"),
    ],
)
def test_the_cli_streams_a_long_recording_and_closes_its_log_on_a_signal(
    tmp_path: Path, env: str, signum: int, code: int, says: str
) -> None:
    """``record ENV --steps 100000000 --out DIR``: a signal from another process ends the run
    with 128 + its number, the report says so, and the log is whole: every episode the report
    counts as appended, no torn tail, the running episode cut and appended as truncated (a row
    for every env step taken)."""
    if env.startswith("mpe2"):
        pytest.importorskip("mpe2")
    directory = tmp_path / "run.log"
    child = _cli(directory, "--steps", "100000000", "--force", env=env)  # a signal ends it, whatever the free disk
    _wait_for_commits(directory, child)
    child.send_signal(signum)
    out, err = child.communicate(timeout=120)
    assert child.returncode == code, err
    assert says in out
    ended, appended = _count(out, " ended, "), _count(out, " whole episodes and")
    report = log.verify(directory)
    assert report.torn == () and report.episodes == appended >= 10
    # a row for every step call that returned, and for one the signal interrupted just after its
    # recording (the recorder holds signals while it records; the call did not return to be counted)
    steps = _count(out, " env steps in")
    assert report.rows == _count(out, " rows appended") and report.rows - steps in (0, 1)
    assert appended in (ended, ended + 1)  # and the running one, if it had a step
    last = list(fe.FlexibleBuffer.open(directory).episodes())[-1]
    assert last.terminated.any() or last.truncated.any()


def test_force_records_a_run_projected_past_the_free_space(tmp_path: Path) -> None:
    """``--force`` goes on with a run projected not to fit (a quadrillion steps), until stopped."""
    directory = tmp_path / "run.log"
    child = _cli(directory, "--steps", str(10**15), "--force")
    _wait_for_commits(directory, child)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143 and "would write" not in err
    assert log.verify(directory).episodes > 10


def test_a_full_disk_ends_the_cli_recording_with_one_line_and_a_whole_log(tmp_path: Path) -> None:
    """The file size limit stands for a full disk: the run ends with exit 1 and one line naming
    the file that could not grow; every episode appended before reads back."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    directory = tmp_path / "run.log"
    child = _cli(directory, "--steps", "1000000", preexec_fn=limited)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 1
    assert err.count("\n") == 1 and f"{directory}/" in err and "every episode appended before is intact" in err
    report = log.verify(directory)
    assert report.torn == () and report.episodes > 100
    assert len(read_back(directory)) == report.episodes


def _recorded_log(directory: Path, kind: str, seed: int, steps: int) -> list[fe.FlexiBatch]:
    """``kind`` ("gym": CartPole, "aec": connect four, with masks) recorded to the log
    ``directory`` with random actions of ``seed``; returns its episodes as the log holds them."""
    rng = np.random.default_rng(seed)
    if kind == "gym":
        env = fe.record(gym.make("CartPole-v1"), num_steps=400, log=directory)
        env.reset(seed=seed)
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            if terminated or truncated:
                env.reset()
    else:
        from pettingzoo.classic import connect_four_v3

        env = fe.record(connect_four_v3.env(), num_steps=64, log=directory)
        for episode in range(steps):
            env.reset(seed=seed + episode)
            for _ in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                env.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"]))))
    env.close()
    return read_back(directory)


@pytest.mark.parametrize("kind", ["gym", "aec"])
def test_merged_logs_hold_each_ones_episodes_in_order(tmp_path: Path, kind: str) -> None:
    """Logs recorded apart (one per worker) merge into one holding each one's episodes, field by
    field (next values and masks renumbered), in the order given; a source's torn tail is left
    out, the sources are not changed, and merging into a log continues it."""
    parts = [_recorded_log(tmp_path / f"w{k}", kind, seed=k, steps=600 if kind == "gym" else 12) for k in range(3)]
    with open(tmp_path / "w2" / "obs.col", "ab") as out:  # a kill's leftovers in one worker's log
        out.write(bytes(100))
    sources = {path.name: path.read_bytes() for path in (tmp_path / "w2").iterdir()}
    report = fe.merge_logs([tmp_path / "w0", tmp_path / "w1", tmp_path / "w2"], tmp_path / "all")
    assert report.torn == () and report.episodes == sum(map(len, parts))
    merged = read_back(tmp_path / "all")
    for mine, want in zip(merged, [batch for part in parts for batch in part], strict=True):
        assert_same_batches(mine, want)
    assert {path.name: path.read_bytes() for path in (tmp_path / "w2").iterdir()} == sources
    fe.merge_logs([tmp_path / "w0"], tmp_path / "all")
    again = read_back(tmp_path / "all")
    assert len(again) == len(merged) + len(parts[0])
    for mine, want in zip(again[len(merged) :], parts[0], strict=True):
        assert_same_batches(mine, want)
    assert log.verify(tmp_path / "all").torn == ()


def test_merging_logs_that_differ_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flexibuff_envs.cli import main

    _recorded_log(tmp_path / "cartpole", "gym", seed=0, steps=100)
    _recorded_log(tmp_path / "c4", "aec", seed=0, steps=2)
    with pytest.raises(fe.BufferFileError, match="c4: .*c4 does not match"):
        fe.merge_logs([tmp_path / "cartpole", tmp_path / "c4"], tmp_path / "all")
    assert not (tmp_path / "all").exists()
    assert main(["merge", str(tmp_path / "cartpole"), "--out", str(tmp_path / "cartpole")]) == 1
    assert "cannot be merged into itself" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "cartpole"), str(tmp_path / "cartpole"), "--out", str(tmp_path / "two")]) == 0
    assert "whole episodes appended from 2 log(s)" in capsys.readouterr().out
    assert (
        fe.FlexibleBuffer.open(tmp_path / "two").n_episodes
        == 2 * fe.FlexibleBuffer.open(tmp_path / "cartpole").n_episodes
    )


DQN_FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated")


@pytest.mark.parametrize("kind", ["gym", "parallel", "aec"])
def test_a_mapped_log_samples_in_every_mode_as_the_log_read_into_memory(tmp_path: Path, kind: str) -> None:
    """`open` maps the columns (per-agent ones as strided views of each row's agents) and
    `open(mmap=False)` reads them: with the same seed every mode hands out the same batches,
    and prioritized updates land on the same rows. The log's episodes equal the recording's."""
    if kind != "gym":
        pytest.importorskip("mpe2")
    recorded = _kinds_recorded(kind, tmp_path)
    mapped, ram = fe.FlexibleBuffer.open(tmp_path), fe.FlexibleBuffer.open(tmp_path, mmap=False)
    draws = [
        lambda b: b.sample_transitions(64),
        lambda b: b.sample_transitions(64, fields=DQN_FIELDS),
        lambda b: b.sample_transitions(64, n_step=3),
        lambda b: b.sample_transitions(64, prioritized=True),
        lambda b: b.sample_episodes(n_episodes=3),
        lambda b: b.sample_sequences(8, 4),
        lambda b: next(b.minibatches(50)),
    ]
    for buffer in (mapped, ram):
        buffer.rng = np.random.default_rng(7)
    for draw in draws:
        a, b = draw(mapped), draw(ram)
        for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            assert_same_batches(x, y)
            np.testing.assert_array_equal(x.idx, y.idx)
    for buffer in (mapped, ram):
        buffer.update_priorities(buffer.sample_transitions(16, prioritized=True).idx, np.arange(16) + 1.0)
    assert_same_batches(mapped.sample_transitions(32, prioritized=True), ram.sample_transitions(32, prioritized=True))
    for mine, want in zip(mapped.episodes(), recorded.episodes(), strict=True):
        assert_same_batches(mine, want)


def test_an_episode_longer_than_the_ring_is_left_out_of_the_log_and_said_once(tmp_path: Path) -> None:
    """The ring forgets the first rows of an episode longer than it: that episode is not whole,
    so it is not logged, and a warning says so once; every other is logged as a plain loop played it."""
    from flexibuff_envs.testing.reference import play

    reference = play(gym.make("CartPole-v1"), seed=0, steps=600)
    env = fe.record(gym.make("CartPole-v1"), num_steps=16, log=tmp_path)
    env.reset(seed=0)

    def replay() -> None:
        for action in reference.actions:
            if any(env.step(action)[2:4]):
                env.reset()

    with pytest.warns(RuntimeWarning, match="outgrew the buffer's 16 rows") as said:
        replay()
    env.close()
    assert len([w for w in said if "outgrew" in str(w.message)]) == 1
    short = [(a, b) for a, b in reference.episodes if b - a <= 16]
    assert 0 < len(short) < len(reference.episodes)
    logged = read_back(tmp_path)
    assert len(logged) == len(short)
    for batch, (a, b) in zip(logged, short):
        np.testing.assert_array_equal(batch.obs, np.array(reference.obs[a:b]))


def test_a_vector_recorder_leaves_out_an_episode_longer_than_the_ring_and_says_so_once(tmp_path: Path) -> None:
    """As above for a vector env, whose ended episodes go to the log as arrays: in a ring of 16
    rows per lane, the episodes longer than 16 steps are left out with one warning, and the log
    holds every other, as a buffer large enough holds them."""

    def record(num_steps: int, directory: Path | None) -> fe.FlexibleBuffer:
        venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
        env = fe.record(venv, num_steps=num_steps, log=directory)
        env.reset(seed=0)
        for t in range(400):  # lane 0 balances for a while, lanes 1 and 2 fall within a few steps
            env.step(np.array([t % 2, 1, 0]))
        env.close()
        return env.buffer

    held = [batch for batch in record(5000, None).episodes() if len(batch.obs) <= 16]
    with pytest.warns(RuntimeWarning, match="outgrew the buffer's 16 rows") as said:
        record(16, tmp_path)
    assert len([w for w in said if "outgrew" in str(w.message)]) == 1
    logged = read_back(tmp_path)
    assert 0 < len(logged) == len(held)

    def key(batch: fe.FlexiBatch) -> bytes:
        return batch.obs.tobytes() + batch.discrete_actions.tobytes()

    for mine, want in zip(sorted(logged, key=key), sorted(held, key=key)):
        assert_same_batches(mine, want)


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP"])
def test_a_vector_recorder_keeps_every_episode_that_fits_its_ring(tmp_path: Path, mode: str) -> None:
    """Episodes nearly as long as the ring (95 rows of 100) are kept whole in the buffer and the
    log, however a block of steps falls across them: only an episode longer than the ring is
    left out. A plain loop over the same vector env with the same seed and actions is the
    reference."""
    actions = np.random.default_rng(0).integers(0, 2, (4189, 8))

    def venv() -> gym.vector.VectorEnv:
        autoreset = getattr(gym.vector.AutoresetMode, mode)
        return gym.make_vec(
            "CartPole-v1", num_envs=8, vectorization_mode="sync", vector_kwargs={"autoreset_mode": autoreset}
        )

    plain, lengths = venv(), [[] for _ in range(8)]
    plain.reset(seed=0)
    running, skip = np.zeros(8, dtype=np.int64), np.zeros(8, dtype=bool)
    for action in actions:
        _, _, terminated, truncated, _ = plain.step(action)
        running += ~skip
        done = terminated | truncated
        for lane in np.flatnonzero(done).tolist():
            lengths[lane].append(int(running[lane]))
        running[done] = 0
        skip = done & (mode == "NEXT_STEP")
    fits = sorted(n for lane in lengths for n in lane if n <= 100)
    assert any(88 < n <= 100 for n in fits)  # longer than the ring less a block (of 12 steps here)
    env = fe.record(venv(), num_steps=100, log=tmp_path)
    env.reset(seed=0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for action in actions:
            env.step(action)
        env.close()
    outgrown = [w for w in said if "outgrew" in str(w.message)]
    assert len(outgrown) == (len(fits) < sum(map(len, lengths)))  # said once, only when one was left out
    assert sorted(len(batch.obs) for batch in read_back(tmp_path)) == fits
    if mode == "NEXT_STEP":  # lane 2's last episode, 95 rows, ends in the last step: the ring holds it
        assert lengths[2][-1] == 95 and 95 in [len(batch.obs) for batch in env.buffer.episodes()]


def test_a_vector_recorder_keeps_image_episodes_nearly_as_long_as_its_ring(tmp_path: Path) -> None:
    """Four Pongs whose episodes last 45 to 50 steps, in a ring of 50 rows per lane (blocks of 6
    steps): the log holds every episode a plain loop over the same envs, seed and actions plays,
    frame for frame."""
    pytest.importorskip("ale_py")

    def venv() -> gym.vector.VectorEnv:
        return gym.vector.SyncVectorEnv([lambda n=n: _pong(n) for n in (45, 47, 49, 50)])

    actions = np.random.default_rng(0).integers(0, 6, (220, 4))
    plain, played = venv(), set()
    obs, _ = plain.reset(seed=0)
    rows: list[list[np.ndarray]] = [[] for _ in range(4)]
    skip = np.zeros(4, dtype=bool)  # next-step autoreset: that step is no transition
    for action in actions:
        nxt, _, terminated, truncated, _ = plain.step(action)
        for lane in np.flatnonzero(~skip).tolist():
            rows[lane].append(obs[lane].copy())
            if terminated[lane] or truncated[lane]:
                played.add(np.stack(rows[lane]).tobytes())
                rows[lane] = []
        skip, obs = terminated | truncated, nxt
    env = fe.record(venv(), num_steps=50, log=tmp_path)
    env.reset(seed=0)
    for action in actions:
        env.step(action)
    env.close()
    logged = [batch.obs.tobytes() for batch in read_back(tmp_path)]
    assert len(played) >= 12 and sorted(logged) == sorted(played)


def test_an_append_the_disk_refused_goes_out_with_the_next_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk fails the step that ended an episode (the step itself stays recorded); once
    there is room, the next episode's append carries it too: the log holds every episode.
    Windows of one page, so that a full disk meets the appends soon."""
    import resource

    monkeypatch.setattr(log.append_window, "FIRST", 4096)
    monkeypatch.setattr(log.append_window, "WINDOW", 4096)
    env = fe.record(gym.make("CartPole-v1"), num_steps=5000, log=tmp_path)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    refused = 0
    for t in range(1500):
        if t == 200:  # the disk is full from here to step 1000
            resource.setrlimit(resource.RLIMIT_FSIZE, (max(p.stat().st_size for p in tmp_path.iterdir()), limits[1]))
        if t == 1000:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        try:
            done = any(env.step(int(rng.integers(2)))[2:4])
        except fe.BufferSaveError:
            refused, done = refused + 1, True
        if done:
            env.reset()
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, previous)
    env.close()
    assert refused > 0
    for mine, want in zip(read_back(tmp_path), env.buffer.episodes(), strict=True):
        assert_same_batches(mine, want)


def test_a_vector_recorders_appends_the_disk_refused_go_out_once_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above for a vector env, whose ended episodes go to the log as arrays: the steps whose
    appends a full disk refused raise `BufferSaveError`, and once there is room the log catches
    up: it holds every episode the buffer holds."""
    import resource

    monkeypatch.setattr(log.append_window, "FIRST", 4096)
    monkeypatch.setattr(log.append_window, "WINDOW", 4096)
    env = fe.record(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4), num_steps=5000, log=tmp_path)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    refused = 0
    for t in range(600):
        if t == 100:  # the disk is full from here to step 400
            resource.setrlimit(resource.RLIMIT_FSIZE, (max(p.stat().st_size for p in tmp_path.iterdir()), limits[1]))
        if t == 400:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        try:
            env.step(rng.integers(0, 2, 4))
        except fe.BufferSaveError:
            refused += 1
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, previous)
    env.close()
    assert refused > 0
    logged, held = read_back(tmp_path), list(env.buffer.episodes())
    assert len(logged) == len(held) > 50

    def key(batch: fe.FlexiBatch) -> bytes:
        return batch.obs.tobytes() + batch.discrete_actions.tobytes()

    for mine, want in zip(sorted(logged, key=key), sorted(held, key=key)):
        assert_same_batches(mine, want)
