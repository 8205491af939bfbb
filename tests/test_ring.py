"""A buffer's ring in files (`flexibuff_envs.log.ring_files`): recording into it is recording into RAM,
and its files hold the arrays' bytes as they are written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe
from flexibuff_envs import log
from flexibuff_envs.log.ring_files import INDEX, RING, into_files
from tests.batches import assert_same_batches


def recorded(make, ring: Path | None, steps: int) -> fe.FlexibleBuffer:  # type: ignore[no-untyped-def]
    """``steps`` random legal steps of ``make()`` (seeded) recorded into a buffer whose arrays
    are in ``ring``'s files (None: in RAM); a ring of 64 rows, so it wraps."""
    env = make()
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=64)
    if ring is not None:
        assert into_files(buffer._store, str(ring))
    recorder = fe.record(env, buffer)
    rng = np.random.default_rng(0)
    if isinstance(env, gym.Env):
        recorder.reset(seed=0)
        for _ in range(steps):
            _, _, terminated, truncated, _ = recorder.step(int(rng.integers(2)))
            if terminated or truncated:
                recorder.reset()
    else:
        recorder.reset(seed=0)
        for _ in range(steps):
            for _ in recorder.agent_iter():
                obs, _, terminated, truncated, _ = recorder.last()
                move = None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"])))
                recorder.step(move)
            recorder.reset()
    return buffer


def test_a_ring_in_files_records_as_one_in_memory_and_its_files_hold_its_arrays(tmp_path: Path) -> None:
    from pettingzoo.classic import connect_four_v3

    for make, steps, directory in (
        (lambda: gym.make("CartPole-v1"), 300, tmp_path / "cartpole"),
        (connect_four_v3.env, 12, tmp_path / "connect_four"),
    ):
        in_files = recorded(make, directory, steps)
        in_memory = recorded(make, None, steps)
        for mine, want in zip(in_files.episodes(), in_memory.episodes(), strict=True):
            assert_same_batches(mine, want)
        listed = json.loads((directory / RING / INDEX).read_text())["arrays"]
        store = in_files._store
        arrays = {
            **store.arrays,
            **{f"{n}.{p}": getattr(c, p) for n, c in store.chains.items() for p in ("index", "tail")},
        }
        assert set(listed) == set(arrays)  # every array the buffer holds, in a file
        for name, array in arrays.items():
            held = np.fromfile(directory / RING / str(listed[name]["file"]), dtype=listed[name]["dtype"])
            assert np.array_equal(held.reshape(listed[name]["shape"]), array, equal_nan=True), name
        assert len(os.listdir(directory / RING)) == len(listed) + 1  # a grown tail's old file is gone


def test_a_buffer_recorded_into_keeps_its_arrays_where_they_are(tmp_path: Path) -> None:
    buffer = recorded(lambda: gym.make("CartPole-v1"), None, 50)
    arrays = dict(buffer._store.arrays)
    assert not into_files(buffer._store, str(tmp_path))  # its recorder holds views of them
    assert all(buffer._store.arrays[name] is array for name, array in arrays.items())


def killed(directory: Path) -> tuple[list[fe.FlexiBatch], int]:
    """CartPole recorded to the log ``directory`` as a killed recording leaves it (its files
    copied while the writer holds them: episodes past the last fold are markers in its journal,
    their rows in its ring's files); the episodes it ended, and how many were folded."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=500, log=directory / "live")
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for step in range(400):
        if any(env.step(int(rng.integers(2)))[2:4]):
            env.reset()
        if step == 200:
            env.buffer.sync_log()  # folded: the episodes so far are in the columns
            folded = env.buffer.n_episodes
    shutil.copytree(directory / "live", directory / "killed")
    ended = list(env.buffer.episodes())
    env.close()
    return ended, folded


def test_a_killed_recordings_ring_gives_back_every_ended_episode_unless_the_system_rebooted(tmp_path: Path) -> None:
    """Its markers are folded from the ring's files by the first to open the log, which then
    removes them; a ring written before the last boot (a power loss) is not trusted: the log
    keeps what it had folded, as ``fsync="interval"`` allows."""
    ended, folded = killed(tmp_path)
    assert log.report(tmp_path / "killed").unfolded == len(ended) - folded > 0
    for variant in ("as left", "rebooted", "no ring"):
        shutil.copytree(tmp_path / "killed", tmp_path / variant)
        index = tmp_path / variant / RING / INDEX
        if variant == "rebooted":
            index.write_text(json.dumps({**json.loads(index.read_text()), "boot": "another boot"}))
        elif variant == "no ring":
            shutil.rmtree(tmp_path / variant / RING)
        assert log.report(tmp_path / variant).episodes == len(ended if variant == "as left" else ended[:folded])
        got = list(fe.FlexibleBuffer.open(tmp_path / variant).episodes())
        want = ended if variant == "as left" else ended[:folded]
        assert len(got) == len(want)
        for mine, theirs in zip(got, want):
            assert_same_batches(mine, theirs)
        assert not (tmp_path / variant / RING).exists() and log.verify(tmp_path / variant).torn == ()
