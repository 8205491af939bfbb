"""Buffer files: round trip, atomic replace, and clear errors for bad files."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import flexibuff_envs as fe
from flexibuff_envs.testing.reference import play
from tests.batches import assert_same_batches
from tests.envs import ToyEnv


def recorder(capacity: int = 40) -> fe.GymRecorder:
    return fe.record(
        ToyEnv(spaces.Box(0, 255, (3, 2), np.uint8), spaces.Discrete(4), lengths=(6, 11), mask_info=True),
        num_steps=capacity,
        gamma=0.7,
    )


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
    resumed = fe.record(
        ToyEnv(spaces.Box(0, 255, (3, 2), np.uint8), spaces.Discrete(4), lengths=(6, 11), mask_info=True), buffer=loaded
    )
    play(resumed, seed=5, steps=30)
    assert loaded.n_episodes > episodes
    for episode in loaded.episodes():
        assert not np.isnan(episode.G).any()
        assert episode.terminated[-1] or episode.truncated[-1]
        assert not (episode.terminated[:-1] | episode.truncated[:-1]).any()


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mapped"])
def test_a_loaded_buffer_records_on_exactly_as_the_saved_one_does(tmp_path: Path, mmap: bool) -> None:
    """Recording on into a loaded buffer gives every row, next values and masks included, what
    recording on into the buffer that was saved gives (new episode ends take stored slots the
    file's rows must keep)."""
    env = recorder()
    play(env, seed=0, steps=95)
    loaded = fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "run.fbuf"), mmap=mmap)
    resumed = fe.record(
        ToyEnv(spaces.Box(0, 255, (3, 2), np.uint8), spaces.Discrete(4), lengths=(6, 11), mask_info=True), buffer=loaded
    )
    for going_on in (env, resumed):
        play(going_on, seed=5, steps=23)  # less than the ring: rows from the file are still held
    assert len(loaded) == len(env.buffer) > 20 and loaded.n_episodes == env.buffer.n_episodes
    (mine,), (theirs,) = (list(b.minibatches(len(b), shuffle=False)) for b in (loaded, env.buffer))  # every live row
    assert_same_batches(mine, theirs)


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


def vector_recorder(capacity: int, lengths: tuple[int, ...]) -> fe.VectorRecorder:
    import gymnasium as gym

    return fe.record(
        gym.vector.SyncVectorEnv([lambda: ToyEnv(spaces.Discrete(5), spaces.Discrete(3), lengths=lengths)] * 2),
        num_steps=capacity,
    )


def step_vector(env: fe.VectorRecorder, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    for _ in range(steps):
        env.step(rng.integers(0, 3, 2))


@pytest.mark.parametrize(
    ("capacity", "lengths", "live"), [(8, (4,), 16), (500, (4, 9), 60)], ids=["full-ring", "partly-filled"]
)
def test_mmap_load_samples_and_records_exactly_like_a_full_load(
    tmp_path: Path, capacity: int, lengths: tuple[int, ...], live: int
) -> None:
    env = vector_recorder(capacity, lengths)
    step_vector(env, 35, seed=0)
    assert len(env.buffer) == live
    path = env.buffer.save(tmp_path / "run.fbuf")
    before = Path(path).read_bytes()
    read, mapped = fe.FlexibleBuffer.load(path), fe.FlexibleBuffer.load(path, mmap=True)
    assert len(mapped) == len(read) == len(env.buffer) and mapped.n_episodes == read.n_episodes
    for name in ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "G"):
        np.testing.assert_array_equal(
            getattr(mapped.sample_transitions(50), name), getattr(read.sample_transitions(50), name)
        )
    for x, y in zip(mapped.sample_episodes(n_episodes=2), read.sample_episodes(n_episodes=2)):
        assert_same_batches(x, y)
    # both keep recording the same way; the mapped file is never written to
    for buffer in (read, mapped):
        step_vector(fe.record(vector_recorder(capacity, lengths).env, buffer=buffer), 25, seed=1)
    assert len(mapped) == len(read) and mapped.n_episodes == read.n_episodes
    assert_same_batches(mapped.sample_transitions(80), read.sample_transitions(80))
    assert Path(path).read_bytes() == before


def test_mmap_load_reads_only_the_header(tmp_path: Path) -> None:
    env = recorder()
    play(env, seed=0, steps=40)
    path = env.buffer.save(tmp_path / "run.fbuf")
    raw = bytearray(Path(path).read_bytes())
    length = int.from_bytes(raw[12:20], "little")
    header = json.loads(raw[20 : 20 + length])
    obs = next(f for f in header["fields"] if f["name"] == "obs")
    raw[20 + length + -(20 + length) % 64 + obs["offset"] + 5] ^= 0xFF  # an observation: only a full read notices
    Path(path).write_bytes(raw)
    assert len(fe.FlexibleBuffer.load(path, mmap=True)) == 40
    with pytest.raises(fe.BufferFileError, match="data checksum"):
        fe.FlexibleBuffer.load(path)


def test_a_mapped_load_maps_the_file_it_read_and_a_save_never_changes_a_mapped_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save landing at the path while a load maps it: the load maps the file whose header it
    read, not the new one. And saving over a mapped file (ours write a new file and rename it)
    leaves the mapped buffer's rows as they were."""
    import flexibuff_envs.files.format as fio

    runs = []
    for seed in (0, 1):
        env = recorder(capacity=40)
        play(env, seed=seed, steps=95)  # both rings wrap: the file spans the ring and is mapped
        runs.append(env.buffer)
    path = runs[0].save(tmp_path / "run.fbuf")
    other = runs[1].save(tmp_path / "other.fbuf")
    parse = fio.parse

    def a_save_lands_after_the_header_is_read(*args: object) -> object:
        header = parse(*args)
        os.replace(other, path)
        return header

    monkeypatch.setattr(fio, "parse", a_save_lands_after_the_header_is_read)
    mapped = fe.FlexibleBuffer.load(path, mmap=True)
    monkeypatch.undo()
    (mine,), (want,) = (list(b.minibatches(len(b), shuffle=False)) for b in (mapped, runs[0]))
    assert_same_batches(mine, want)
    runs[0].clear()
    play(
        fe.record(
            ToyEnv(spaces.Box(0, 255, (3, 2), np.uint8), spaces.Discrete(4), lengths=(6, 11), mask_info=True),
            buffer=runs[0],
        ),
        seed=7,
        steps=30,
    )
    runs[0].save(path)  # over the file the buffer maps
    (again,) = mapped.minibatches(len(mapped), shuffle=False)
    assert_same_batches(again, want)


def test_files_of_format_1_still_load(tmp_path: Path) -> None:
    # tests/data/format1.fbuf was written by the format-1 writer from the same run as below
    env = recorder()
    play(env, seed=0, steps=95)
    path = env.buffer.save(tmp_path / "format2.fbuf")
    for mmap in (False, True):
        old = fe.FlexibleBuffer.load(Path(__file__).parent / "data" / "format1.fbuf", mmap=mmap)
        new = fe.FlexibleBuffer.load(path, mmap=mmap)
        # a format-1 file does not say which API it was recorded from
        assert dataclasses.replace(old.spec, env_api="gymnasium") == new.spec and len(old) == len(new) == 38
        old.rng, new.rng = np.random.default_rng(0), np.random.default_rng(0)  # the fixture's was unseeded
        assert_same_batches(old.sample_transitions(64), new.sample_transitions(64))


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("version", [2, 3])
def test_files_of_formats_2_and_3_still_load(mmap: bool, version: int) -> None:
    # format 2 wrote obs_ and state_ row by row, format 3 renumbered rows oldest first;
    # tests/data/format<N>.npz holds that release's batch of every row (simple_spread, 3 agents,
    # a ring of 16 rows that had wrapped)
    data = Path(__file__).parent / "data"
    buffer = fe.FlexibleBuffer.load(data / f"format{version}.fbuf", mmap=mmap)
    expected = np.load(data / f"format{version}.npz")
    batch = next(buffer.minibatches(len(buffer), shuffle=False))
    for name in expected.files:
        if name != "idx":
            np.testing.assert_array_equal(getattr(batch, name), expected[name], err_msg=name)
    assert ("obs_" in buffer._store.chains) is (version == 3 or not mmap)  # a full load stores them once


@pytest.mark.parametrize("failure", ["write", "fsync"])
def test_a_failed_save_leaves_the_previous_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    import resource
    import signal

    env = recorder()
    play(env, seed=0, steps=20)
    path = tmp_path / "run.fbuf"
    env.buffer.save(path)
    good = path.read_bytes()
    play(env, seed=1, steps=20)
    if failure == "write":  # the process may write no more than half the new file: a real failed write
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(good) // 2, limits[1]))
    else:  # a full disk often shows only when the written pages are flushed

        def disk_full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", disk_full)
    try:
        with pytest.raises(fe.BufferSaveError) as caught:  # an OSError naming the path given
            env.buffer.save(path)
    finally:
        if failure == "write":
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
            signal.signal(signal.SIGXFSZ, previous)
    assert caught.value.filename == str(path) and caught.value.errno == (
        errno.EFBIG if failure == "write" else errno.ENOSPC
    )
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["run.fbuf"]
    assert len(fe.FlexibleBuffer.load(path)) == 20


def test_a_save_to_a_directory_names_it_and_writes_nothing(tmp_path: Path) -> None:
    env = recorder()
    play(env, seed=0, steps=5)
    with pytest.raises(fe.BufferSaveError, match="is a directory") as caught:
        env.buffer.save(tmp_path)
    assert caught.value.filename == str(tmp_path) and isinstance(caught.value, OSError)
    assert os.listdir(tmp_path) == []


def test_a_saved_file_gets_ordinary_permissions(tmp_path: Path) -> None:
    env = recorder()
    play(env, seed=0, steps=5)
    path = env.buffer.save(tmp_path / "run.fbuf")
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "foreign", "newer"])
def test_bad_files_raise_a_clear_error(tmp_path: Path, damage: str) -> None:
    env = recorder()
    play(env, seed=0, steps=20)
    path = tmp_path / "run.fbuf"
    env.buffer.save(path)
    raw = bytearray(path.read_bytes())
    expected = {
        "missing": "no such",
        "truncated": "truncated",
        "flipped": "corrupt",
        "foreign": "not a flexibuff_envs buffer",
        "newer": "newer",
    }[damage]
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
    if damage != "flipped":  # a flipped data byte is only found by reading the data
        with pytest.raises(fe.BufferFileError, match=expected):
            fe.FlexibleBuffer.load(path, mmap=True)


@pytest.mark.parametrize("where", ["magic", "length", "header", "data", "end"])
def test_damage_anywhere_is_named_with_where_it_is(tmp_path: Path, where: str) -> None:
    env = recorder()
    play(env, seed=0, steps=20)
    path = Path(env.buffer.save(tmp_path / "run.fbuf"))
    raw = bytearray(path.read_bytes())
    at = {"magic": 0, "length": 13, "header": 100, "data": len(raw) - 100, "end": len(raw) - 3}[where]
    raw[at] ^= 0x55
    path.write_bytes(raw)
    with pytest.raises(fe.BufferFileError, match=f"{path}: .*(corrupt|truncated|not a flexibuff|bad magic)"):
        fe.FlexibleBuffer.load(path)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_a_file_cut_anywhere_is_reported_truncated(tmp_path: Path, keep: float) -> None:
    env = recorder()
    play(env, seed=0, steps=20)
    path = Path(env.buffer.save(tmp_path / "run.fbuf"))
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    for mmap in (False, True):
        with pytest.raises(fe.BufferFileError, match="truncated|too short"):
            fe.FlexibleBuffer.load(path, mmap=mmap)


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


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("case", ["wrapped", "partly-filled", "after-take", "vector"])
def test_row_numbers_stay_the_same_across_save_and_load(tmp_path: Path, case: str, mmap: bool) -> None:
    """Prioritized replay keeps batch.idx across a checkpoint: the same idx give the same rows."""
    if case == "vector":
        env = vector_recorder(200, (4, 9))
        step_vector(env, 30, seed=0)
    else:
        env = recorder(capacity=40 if case == "wrapped" else 500)
        play(env, seed=0, steps=95 if case != "partly-filled" else 30)
        if case == "after-take":
            env.buffer.take_episodes()  # the live rows now start inside the ring
            play(env, seed=2, steps=20)
    buffer = env.buffer
    batch = buffer.sample_transitions(100)
    loaded = fe.FlexibleBuffer.load(buffer.save(tmp_path / "run.fbuf"), mmap=mmap)
    assert_same_batches(loaded.sample_transitions(idx=batch.idx), batch)
    assert_same_batches(loaded.sample_transitions(50), buffer.sample_transitions(50))  # same draws, too
    saved = loaded.save(tmp_path / "again.fbuf")  # and once more
    assert_same_batches(fe.FlexibleBuffer.load(saved, mmap=mmap).sample_transitions(idx=batch.idx), batch)


def test_a_save_removes_what_killed_saves_of_its_target_left(tmp_path: Path) -> None:
    """kill -9 during a save leaves its temporary file; the next save of that target removes it,
    and leaves alone those of saves still under way and of other targets."""
    import signal
    import subprocess
    import sys
    import time

    target = tmp_path / "big.fbuf"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import numpy as np, flexibuff_envs as fe
buffer = fe.FlexibleBuffer(40_000, 84 * 84 * 4, [6], obs_dtype="uint8")
buffer.field("obs")[...] = 7  # 1.1 GB to write: the save takes a while
buffer.begin_episode()
for _ in range(40_000):
    buffer.claim_row()
buffer.save({str(target)!r})
""",
        ]
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".big.fbuf.*.fbuf-tmp")) and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    time.sleep(0.2)  # well inside the save
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = list(tmp_path.glob(".big.fbuf.*.fbuf-tmp"))
    assert len(left) == 1 and not target.exists()  # the save had not finished: no target
    under_way = tmp_path / f".big.fbuf.{os.getpid()}.abc.fbuf-tmp"  # a save this process is making
    other = tmp_path / ".other.fbuf.1.abc.fbuf-tmp"
    under_way.write_bytes(b"x")
    other.write_bytes(b"x")
    env = recorder()
    play(env, seed=0, steps=10)
    env.buffer.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["big.fbuf", under_way.name, other.name])


def test_a_vector_recorder_goes_on_recording_into_a_loaded_buffer(tmp_path: Path) -> None:
    """The episodes a file left running in each lane close as truncated at the first reset, and
    everything recorded after, in blocks, is whole."""
    env = vector_recorder(capacity=50, lengths=(7,))
    step_vector(env, steps=10, seed=0)  # each lane: one episode ended, one running
    loaded = fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "vec.fbuf"))
    running = len(loaded)
    resumed = fe.record(env.env, buffer=loaded)  # the same vector env, recorded afresh
    step_vector(resumed, steps=30, seed=1)
    episodes = list(loaded.episodes())
    assert len(loaded) == running + 2 * 30 - 2 * (30 // 8)  # NEXT_STEP: a reset step every 8 per lane
    for episode in episodes:
        assert not np.isnan(episode.G).any()
        assert episode.terminated[-1] or episode.truncated[-1]
        assert not (episode.terminated[:-1] | episode.truncated[:-1]).any()
    assert sum(e.truncated[-1] for e in episodes) == 2  # the two episodes the file left running


def _resume_case(case: str, buffer: fe.FlexibleBuffer | None = None, *, seed: int, steps: int) -> fe.FlexibleBuffer:
    """Record ``steps`` steps of ``case`` with fixed actions (into ``buffer``, else a new small ring)."""
    import gymnasium as gym

    rng = np.random.default_rng(seed)
    if case == "parallel":
        from mpe2 import simple_spread_v3

        env = fe.record(simple_spread_v3.parallel_env(N=3, max_cycles=25), buffer, num_steps=60)
        env.reset(seed=seed)
        for _ in range(steps):
            env.step({a: int(rng.integers(5)) for a in env.agents})
            if not env.agents:
                env.reset()
        return env.buffer
    if case == "vector":
        env = fe.record(
            gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2),
            buffer,
            num_steps=60,
            extra_fields={"hidden": (2,)},
        )
        env.reset(seed=[seed, seed + 1])
        for _ in range(steps):
            env.step(rng.integers(0, 2, 2))
        return env.buffer
    env = fe.record(gym.make("CartPole-v1"), buffer, num_steps=100, extra_fields={"hidden": (2,)})
    env.reset(seed=seed)
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        if terminated or truncated:
            env.reset()
    return env.buffer


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mapped"])
@pytest.mark.parametrize("case", ["gym", "vector", "parallel"])
def test_rows_a_file_did_not_hold_record_on_as_in_the_saved_buffer(tmp_path: Path, case: str, mmap: bool) -> None:
    """A ring that wrapped past rows it no longer holds: those rows come back with each field's
    allocated value (active, NaN G while an episode runs, NaN for a field never annotated), so
    recording on over them gives every field, n-step windows and weights what the saved buffer gives."""
    if case == "parallel":
        pytest.importorskip("mpe2")
    saved = _resume_case(case, seed=0, steps=300)
    loaded = fe.FlexibleBuffer.load(saved.save(tmp_path / "run.fbuf"), mmap=mmap)
    for buffer in (saved, loaded):
        _resume_case(case, buffer, seed=1, steps=20)
    (mine,), (theirs,) = (list(b.minibatches(len(b), shuffle=False)) for b in (loaded, saved))
    np.testing.assert_array_equal(mine.idx, theirs.idx)
    assert_same_batches(mine, theirs)
    assert np.isnan(mine.G).any()  # the episodes running now
    assert_same_batches(
        loaded.sample_transitions(idx=mine.idx, n_step=3), saved.sample_transitions(idx=mine.idx, n_step=3)
    )


def _pong(steps: int = 600) -> fe.FlexibleBuffer:
    """Pong's raw 210x160x3 frames (100 KB a row), episodes of 150 steps, a ring that wraps."""
    import gymnasium as gym

    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    env = fe.record(gym.make("ALE/Pong-v5", max_episode_steps=150), num_steps=400)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(steps):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    return env.buffer


def test_a_compressed_file_loads_bit_for_bit_as_the_raw_one_at_a_small_part_of_its_size(tmp_path: Path) -> None:
    """``compress="auto"`` (the default) stores image observations compressed (zstd): the file
    loads, read or mapped, into a buffer equal field by field to the raw file's, every sampled
    batch the same, at a hundredth of its bytes or less."""
    buffer = _pong()
    raw = fe.FlexibleBuffer.load(buffer.save(tmp_path / "raw.fbuf", compress=None))
    packed_path = buffer.save(tmp_path / "packed.fbuf")
    assert os.path.getsize(packed_path) * 100 < os.path.getsize(tmp_path / "raw.fbuf")
    for packed in (fe.FlexibleBuffer.load(packed_path), fe.FlexibleBuffer.load(packed_path, mmap=True)):
        packed.save(tmp_path / "again.fbuf")  # saved again, it is the same file
        assert (tmp_path / "again.fbuf").read_bytes() == Path(packed_path).read_bytes()
        for mine, want in zip(packed.episodes(), raw.episodes(), strict=True):
            assert_same_batches(mine, want)
        for loaded in (packed, raw):
            loaded.rng = np.random.default_rng(3)
        assert_same_batches(packed.sample_transitions(64), raw.sample_transitions(64))


@pytest.mark.parametrize("mmap", [False, True])
def test_a_buffer_loaded_from_a_compressed_file_records_on_as_one_loaded_raw(tmp_path: Path, mmap: bool) -> None:
    """Pong's frames saved compressed and raw, each loaded and recorded on with the same seeds and
    actions into its wrapping ring: every episode and the ring's rows come out the same."""
    import gymnasium as gym

    buffer = _pong(500)
    loaded = [
        fe.FlexibleBuffer.load(buffer.save(tmp_path / f"{name}.fbuf", compress=compress), mmap=mmap)
        for name, compress in (("packed", "auto"), ("raw", None))
    ]
    for going_on in loaded:
        env = fe.record(gym.make("ALE/Pong-v5", max_episode_steps=150), going_on)
        env.reset(seed=7)
        env.action_space.seed(7)
        for _ in range(300):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
        env.close()
    for mine, want in zip(loaded[0].episodes(), loaded[1].episodes(), strict=True):
        assert_same_batches(mine, want)
    rows = np.arange(len(loaded[0]))
    assert_same_batches(loaded[0].sample_transitions(idx=rows), loaded[1].sample_transitions(idx=rows))


def test_a_part_that_does_not_compress_is_stored_raw_and_mapped(tmp_path: Path) -> None:
    """Random pixels do not compress: "auto" stores them raw (a format-4 file), which maps."""
    rows, width = 200, 32 * 32 * 3
    buffer = fe.FlexibleBuffer(rows, width, [2], obs_dtype="uint8", individual_reward=True, seed=0)
    buffer.field("obs")[0] = np.random.default_rng(0).integers(0, 256, (rows, width), dtype=np.uint8)
    for _ in range(rows // 20):
        buffer.begin_episode()
        buffer.claim_rows(20)
        buffer.end_episode()
    path = Path(buffer.save(tmp_path / "noise.fbuf"))
    raw = path.read_bytes()
    header = json.loads(raw[20 : 20 + int.from_bytes(raw[12:20], "little")])
    assert "codec" not in next(f for f in header["fields"] if f["name"] == "obs")
    for mine, want in zip(fe.FlexibleBuffer.load(path, mmap=True).episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)


def test_compressed_parts_that_would_not_fit_in_memory_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However well a part compresses, a file decodes only into the memory this machine has: on
    a machine with a megabyte free, Pong's frames (200 MB decoded) are refused before decoding."""
    from flexibuff_envs.files import format as fileformat

    path = _pong(300).save(tmp_path / "packed.fbuf")
    monkeypatch.setattr(fileformat, "available_memory", lambda: 1 << 20)
    for mmap in (False, True):
        with pytest.raises(fe.BufferFileError, match="compressed parts decode to .* more than the 1,048,576 of memory"):
            fe.FlexibleBuffer.load(path, mmap=mmap)


def test_compress_names_fields_and_refuses_what_is_no_codec(tmp_path: Path) -> None:
    buffer = recorder().buffer
    play(buffer_env := recorder(), seed=0, steps=30)
    buffer = buffer_env.buffer
    path = buffer.save(tmp_path / "obs.fbuf", compress={"obs": "zstd"})  # float observations too
    for mine, want in zip(fe.FlexibleBuffer.load(path).episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
    header = json.loads(Path(path).read_bytes()[20:].split(b"\0", 1)[0].rsplit(b"}", 1)[0] + b"}")
    assert {f["name"]: f.get("codec") for f in header["fields"]}["obs"] == "zstd"
    with pytest.raises(fe.InvalidArgumentError, match="compress: 'obs' asks for codec 'lz5'"):
        buffer.save(tmp_path / "x.fbuf", compress={"obs": "lz5"})
    with pytest.raises(fe.InvalidArgumentError, match="compress must be 'auto', None or"):
        buffer.save(tmp_path / "x.fbuf", compress="best")
    with pytest.raises(fe.InvalidArgumentError, match="save: compress names 'bogus', which is no field"):
        buffer.save(tmp_path / "x.fbuf", compress={"bogus": "zstd"})
    assert not (tmp_path / "x.fbuf").exists()


def _rewritten(path: Path, change: Any) -> Path:
    """``path`` with its header changed by ``change`` (or its arrays, when it returns bytes), its
    checksums made right again: what a hostile file can do."""
    import struct
    import zlib

    raw = path.read_bytes()
    _, version, length = struct.unpack("<8sIQ", raw[:20])
    header = json.loads(raw[20 : 20 + length])
    start = 20 + length + -(20 + length) % 64
    data = raw[start:-16]
    result = change(header, data)
    data = result if isinstance(result, bytes) else data
    blob = json.dumps(header).encode()
    prefix = struct.pack("<8sIQ", b"FLEXIBUF", version, len(blob)) + blob
    prefix += b"\0" * (-len(prefix) % 64)
    out = path.with_name("crafted.fbuf")
    out.write_bytes(prefix + data + struct.pack("<II8s", zlib.crc32(prefix), zlib.crc32(data), b"FBUF-END"))
    return out


def test_a_crafted_compressed_part_is_one_buffer_file_error_before_memory_is_reserved(tmp_path: Path) -> None:
    """A codec this does not read, a stored size too small for its chunks, a ratio no real file
    reaches (a decompression bomb), a frame damaged behind a right checksum: each a
    `BufferFileError` naming the file and the part (and the chunk)."""
    buffer = _pong(300)
    path = Path(buffer.save(tmp_path / "packed.fbuf"))

    def obs(header: dict[str, Any]) -> dict[str, Any]:
        return next(f for f in header["fields"] if f["name"] == "obs")

    def damaged(header: dict[str, Any], data: bytes) -> bytes:
        at = obs(header)["offset"] + 100  # inside the first frame
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]

    def bomb(header: dict[str, Any], data: bytes) -> None:  # 3 GB of observations from its 28 KB
        header["spec"].update(obs_size=10**7, obs_shape=[10**7])
        obs(header)["shape"][-1] = 10**7

    cases = [
        (bomb, "field 'obs' claims 3,000,000,000 bytes from .* stored, more than 65,536x: a decompression bomb"),
        (lambda h, d: obs(h).update(codec="lz5"), "field 'obs' has codec 'lz5'"),
        (lambda h, d: obs(h).update(stored=1), "field 'obs' stored bytes"),
        (lambda h, d: obs(h).update(shape=[1, 10**9, obs(h)["shape"][-1]]), "shape"),
        (damaged, r"field 'obs'.*chunk 0 .*corrupt"),
    ]
    for change, says in cases:
        with pytest.raises(fe.BufferFileError, match=f"crafted.fbuf: .*{says}"):
            fe.FlexibleBuffer.load(_rewritten(path, change))
