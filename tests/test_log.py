"""The episode log on disk: whole episodes appended as records, read back exactly, a torn tail
(a process killed mid-append) never read, cut by repair or a resumed writer, and a crafted log
one BufferFileError naming the file."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from flexibuff_envs import log
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
    """Every episode of the log, through a buffer that each chunk extends."""
    chunks = list(log.read(str(directory)))
    if not chunks:
        return []
    buffer = fe.FlexibleBuffer.from_spec(chunks[0].spec, num_steps=sum(c.rows for c in chunks), gamma=chunks[0].gamma)
    for chunk in chunks:
        buffer.extend(chunk)
    return list(buffer.episodes())


def test_appended_episodes_read_back_as_recorded_across_segments(tmp_path: Path) -> None:
    chunks, batches = recorded_chunks([1, 3, 2, 5, 1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]), segment_bytes=4000)  # several segments
    for chunk in chunks:
        writer.append(chunk)
    writer.close()
    assert len(log.segments(str(tmp_path))) > 1
    got = read_back(tmp_path)
    assert len(got) == len(batches) == 12
    for mine, want in zip(got, batches):
        assert_same_batches(mine, want)
    report = log.verify(str(tmp_path))
    assert (report.episodes, report.rows, report.torn) == (12, sum(len(b.obs) for b in batches), None)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=5), cut=st.floats(0, 1), segment_bytes=st.sampled_from([3000, 1 << 20]))
def test_a_log_cut_anywhere_reads_a_prefix_and_resumes(tmp_path_factory: pytest.TempPathFactory, sizes: list[int],
                                                       cut: float, segment_bytes: int) -> None:
    """A kill mid-append, as the file it leaves: the newest segment cut at any byte. Readers see
    whole records only, in order; a resumed writer cuts the tail and appends after it."""
    directory = tmp_path_factory.mktemp("log")
    chunks, batches = recorded_chunks(sizes)
    writer = log.LogWriter(directory, header_of(chunks[0]), segment_bytes=segment_bytes)
    ends = []  # the newest segment's size after each append
    for chunk in chunks:
        writer.append(chunk)
        ends.append((len(log.segments(str(directory))), Path(log.segments(str(directory))[-1]).stat().st_size))
    writer.close()
    newest = Path(log.segments(str(directory))[-1])
    header_bytes = len(header_of(chunks[0]).to_bytes())
    keep = header_bytes + int(cut * (newest.stat().st_size - header_bytes))
    newest.write_bytes(newest.read_bytes()[:keep])
    newest_count = len(log.segments(str(directory)))
    # a record stays whole when it lies in an older segment or ends before the cut
    whole = sum(1 for segment, size in ends if segment < newest_count or size <= keep)
    kept_episodes = sum(len(c.lengths) for c in chunks[:whole])
    got = read_back(directory)
    assert len(got) == kept_episodes
    for mine, want in zip(got, batches):
        assert_same_batches(mine, want)
    at_boundary = keep in {header_bytes, *(size for segment, size in ends if segment == newest_count)}
    report = log.verify(str(directory))
    assert (report.torn is None) == at_boundary and report.episodes == kept_episodes
    resumed = log.LogWriter(directory, header_of(chunks[0]), segment_bytes=segment_bytes)  # cuts the torn tail
    resumed.append(chunks[0])
    resumed.close()
    again = read_back(directory)
    assert len(again) == kept_episodes + chunks[0].n_episodes and log.verify(str(directory)).torn is None
    for mine, want in zip(again[kept_episodes:], batches):
        assert_same_batches(mine, want)


def test_repair_cuts_only_the_torn_tail(tmp_path: Path) -> None:
    chunks, _ = recorded_chunks([2, 4])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    for chunk in chunks:
        writer.append(chunk)
    writer.close()
    (segment,) = log.segments(str(tmp_path))
    whole = Path(segment).read_bytes()
    Path(segment).write_bytes(whole + whole[-50:])  # half a record's worth of bytes after the last
    report = log.repair(str(tmp_path))
    assert report.torn is not None and report.torn.offset == len(whole) and report.episodes == 6
    assert Path(segment).read_bytes() == whole and log.verify(str(tmp_path)).torn is None


def _record(meta: object, data: bytes) -> bytes:
    """A record with a right checksum around ``meta`` (bytes as they are, else as JSON)."""
    blob = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    head = struct.pack("<8sQQ", b"FBLOGREC", len(blob), len(data))
    return head + blob + data + struct.pack("<I8s", zlib.crc32(data, zlib.crc32(blob, zlib.crc32(head))), b"FBREC-OK")


@pytest.mark.parametrize("case", ["object dtype", "past the data", "unknown field", "no lengths", "not json",
                                  "damaged, then more", "another layout"])
def test_a_crafted_log_is_one_buffer_file_error_naming_the_file(tmp_path: Path, case: str) -> None:
    chunks, _ = recorded_chunks([1])
    header = header_of(chunks[0])
    writer = log.LogWriter(tmp_path, header)
    writer.append(chunks[0])
    writer.close()
    (segment,) = log.segments(str(tmp_path))
    raw = Path(segment).read_bytes()
    body = raw[len(header.to_bytes()) + 24:]
    meta = json.loads(body[:struct.unpack("<Q", raw[len(header.to_bytes()) + 8:len(header.to_bytes()) + 16])[0]])
    data = bytes(64)
    part = {"name": "obs", "part": None, "per_agent": False, "dtype": "<f4", "shape": [1, 4], "offset": 0}
    crafted = {
        "object dtype": _record({"lengths": [1], "parts": [{**part, "dtype": "|O"}]}, data),
        "past the data": _record({"lengths": [1], "parts": [{**part, "shape": [10**9, 4]}]}, data),
        "unknown field": _record({"lengths": [1], "parts": [{**part, "name": "weights"}]}, data),
        "no lengths": _record({"parts": meta["parts"]}, data),
        "not json": _record(b"[[[", data),
    }
    target = Path(segment)
    if case in crafted:
        target.write_bytes(raw + crafted[case])
        says = "corrupt record"
    elif case == "damaged, then more":
        damaged = bytearray(raw)
        damaged[-20] ^= 0xFF
        target.write_bytes(bytes(damaged))
        (tmp_path / log.segment_name(1)).write_bytes(header.to_bytes())
        says = "not the log's newest segment"
    else:
        other = log.LogHeader(header.spec, 0.5, header.gae_lambda)
        (tmp_path / log.segment_name(1)).write_bytes(other.to_bytes())
        says = "differ from the log's first segment"
    for reader in (lambda: list(log.read(str(tmp_path))), lambda: log.verify(str(tmp_path))):
        with pytest.raises(fe.BufferFileError, match=f"^{tmp_path}.*: .*{says}"):
            reader()


def test_a_writer_refuses_a_log_of_another_layout(tmp_path: Path) -> None:
    chunks, _ = recorded_chunks([1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    writer.append(chunks[0])
    writer.close()
    pendulum = fe.infer_spec(gym.make("Pendulum-v1"))
    with pytest.raises(fe.SpecMismatchError, match="obs_size"):
        log.LogWriter(tmp_path, log.LogHeader(pendulum, 0.9, 0.95))
    with pytest.raises(fe.BufferFileError, match="discounts"):
        log.LogWriter(tmp_path, log.LogHeader(chunks[0].spec, 0.5, 0.95))
    with pytest.raises(fe.BufferFileError, match="not a directory"):
        list(log.read(str(Path(log.segments(str(tmp_path))[0]))))


def test_verify_and_repair_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flexibuff_envs.cli import main

    chunks, _ = recorded_chunks([3])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    writer.append(chunks[0])
    writer.close()
    assert main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}: 1 segment(s), 3 whole episodes")
    (segment,) = log.segments(str(tmp_path))
    with open(segment, "ab") as out:
        out.write(b"FBLOGREC" + bytes(10))  # a record cut short
    assert main(["verify", str(tmp_path)]) == 1
    assert "torn tail: 18 bytes" in capsys.readouterr().out
    assert main(["repair", str(tmp_path)]) == 0
    assert "3 whole episodes kept; cut a torn tail of 18 bytes" in capsys.readouterr().out
    assert main(["verify", str(tmp_path)]) == 0
    assert main(["verify", str(tmp_path / "none")]) == 1
    assert "no such episode log" in capsys.readouterr().err


def _kinds_recorded(kind: str, directory: Path) -> fe.FlexibleBuffer:
    """A recording of ``kind`` logged to ``directory``; returns its buffer (the recorder closed)."""
    if kind == "gym":
        env = fe.record(gym.make("CartPole-v1"), num_steps=5000, log=directory)
        env.reset(seed=0)
        for t in range(500):
            _, _, terminated, truncated, _ = env.step(t % 2)
            if terminated or truncated:
                env.reset()
    elif kind == "vector":
        env = fe.record(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4), num_steps=5000, log=directory)
        env.reset(seed=0)
        for t in range(300):
            env.step(np.array([t % 2, 1, 0, t % 3 % 2]))
    elif kind == "parallel":
        from mpe2 import simple_spread_v3

        env = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=5000, log=directory)
        env.reset(seed=0)
        for t in range(100):
            env.step({agent: (t + i) % 5 for i, agent in enumerate(env.agents)})
            if not env.agents:
                env.reset()
    else:
        from pettingzoo.classic import connect_four_v3

        env = fe.record(connect_four_v3.env(), num_steps=5000, log=directory)
        for episode in range(10):
            env.reset(seed=episode)
            for _ in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                legal = np.flatnonzero(obs["action_mask"])
                env.step(None if terminated or truncated else int(legal[episode % len(legal)]))
    env.close()
    return env.buffer


@pytest.mark.parametrize("kind", ["gym", "vector", "parallel", "aec"])
def test_every_recorder_kind_logs_each_episode_as_the_buffer_holds_it(tmp_path: Path, kind: str) -> None:
    if kind in ("parallel", "aec"):
        pytest.importorskip("pettingzoo")
        pytest.importorskip("mpe2")
    buffer = _kinds_recorded(kind, tmp_path)
    logged, held = read_back(tmp_path), list(buffer.episodes())
    assert len(logged) == len(held) > 5

    def key(batch: fe.FlexiBatch) -> bytes:  # a vector env's lanes end episodes in another order
        return batch.obs.tobytes() + batch.discrete_actions.tobytes()

    for mine, want in zip(sorted(logged, key=key), sorted(held, key=key)):
        assert_same_batches(mine, want)


KILLED = {
    "gym": """
import sys
import gymnasium as gym
import flexibuff_envs as fe
from flexibuff_envs.testing.reference import play
log = play(gym.make("CartPole-v1"), seed=0, steps=3000)
actions = log.actions[:log.episodes[-1][1]]  # whole episodes only: a replay cuts none
env = fe.record(gym.make("CartPole-v1"), num_steps=600, log=sys.argv[1])  # CartPole lasts 500: a ring far smaller than the log
print("recording", flush=True)
while True:
    env.reset(seed=0)
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
""",
    "aec": """
import sys
from pettingzoo.classic import connect_four_v3
import flexibuff_envs as fe
from flexibuff_envs.testing.pz_reference import play_aec, replay_aec
expected = play_aec(connect_four_v3.env(), seed=0, episodes=30)
env = fe.record(connect_four_v3.env(), num_steps=64, log=sys.argv[1])
print("recording", flush=True)
while True:
    replay_aec(env, 0, 30, expected.actions)
""",
}


def reference_episodes_of(kind: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(obs, rewards) of each episode of the plain loop the killed recording replays, in order."""
    if kind == "gym":
        from flexibuff_envs.testing.reference import play

        reference = play(gym.make("CartPole-v1"), seed=0, steps=3000)
        return [(np.array(reference.obs[a:b]), np.array(reference.reward[a:b])) for a, b in reference.episodes]
    from pettingzoo.classic import connect_four_v3

    from flexibuff_envs.testing.pz_reference import play_aec

    expected = play_aec(connect_four_v3.env(), seed=0, episodes=30)
    return [(expected.obs[:, a:b], expected.rewards[:, a:b]) for a, b in expected.episodes]


@pytest.mark.parametrize("kind", ["gym", "aec"])
def test_a_recording_killed_at_any_moment_leaves_every_ended_episode_in_its_log(tmp_path: Path, kind: str) -> None:
    """SIGKILL from another process, at random moments: the log holds the episodes of a plain
    loop with the same seeds and actions, in order, and no part of any other."""
    import signal
    import subprocess
    import sys
    import time

    if kind == "aec":
        pytest.importorskip("pettingzoo")
    episodes = reference_episodes_of(kind)
    rng = np.random.default_rng(0)
    for kill in range(int(os.environ.get("FLEXIBUFF_KILLS", "6"))):
        directory = tmp_path / f"kill{kill}"
        child = subprocess.Popen([sys.executable, "-c", KILLED[kind], str(directory)], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout is not None and child.stdout.readline() == "recording\n"
        time.sleep(rng.uniform(0.0, 1.5))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        logged = read_back(directory)
        for k, batch in enumerate(logged):  # the replay repeats: episode k is the reference's k-th, cycling
            obs, rewards = episodes[k % len(episodes)]
            np.testing.assert_array_equal(batch.obs, obs)
            np.testing.assert_array_equal(batch.individual_rewards, rewards)
        log.repair(str(directory))
        assert len(read_back(directory)) == len(logged)  # the cut left every whole episode


def test_the_cli_records_to_a_log_resumes_it_and_inspects_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out DIR`` logs what ``--out FILE.fbuf`` saves, episode for episode; a log is continued
    only with --resume; ``inspect DIR`` reports it as it reports a file."""
    from flexibuff_envs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "CartPole-v1", "--episodes", "40", "--seed", "3", "--out", "run.fbuf"]) == 0
    assert main(["record", "CartPole-v1", "--episodes", "40", "--seed", "3", "--out", "run.log"]) == 0
    assert "40 whole episodes and" in capsys.readouterr().out
    for mine, want in zip(read_back(tmp_path / "run.log"), fe.FlexibleBuffer.load("run.fbuf").episodes(), strict=True):
        assert_same_batches(mine, want)
    assert main(["record", "CartPole-v1", "--episodes", "5", "--out", "run.log"]) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err
    assert main(["record", "CartPole-v1", "--episodes", "5", "--seed", "4", "--out", "run.log", "--resume"]) == 0
    capsys.readouterr()
    assert main(["inspect", "run.log"]) == 0
    assert "45 whole episodes" in capsys.readouterr().out
    assert main(["record", "CartPole-v1", "--episodes", "5", "--out", "run.fbuf", "--resume"]) == 2


def test_a_log_reads_into_a_buffer_that_plots_and_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
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


def test_a_full_disk_mid_append_leaves_no_half_record(tmp_path: Path) -> None:
    """A write that fails (here the file size limit, as a full disk fails it) takes back what
    it wrote: the error names the segment, every episode before stays, appending goes on."""
    import resource
    import signal

    chunks, batches = recorded_chunks([2, 30, 1])
    writer = log.LogWriter(tmp_path, header_of(chunks[0]))
    writer.append(chunks[0])
    (segment,) = log.segments(str(tmp_path))
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (Path(segment).stat().st_size + 500, limits[1]))
    try:
        with pytest.raises(fe.BufferSaveError, match="cannot append to the episode log") as caught:
            writer.append(chunks[1])  # 30 episodes: far more than 500 bytes
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert caught.value.filename == segment
    assert log.verify(str(tmp_path)).torn is None and log.verify(str(tmp_path)).episodes == 2
    writer.append(chunks[2])
    writer.close()
    got = read_back(tmp_path)
    assert len(got) == 3
    for mine, want in zip(got, [*batches[:2], batches[-1]]):
        assert_same_batches(mine, want)
