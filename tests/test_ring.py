"""A buffer's ring in files (`flexibuff_envs.log.ring`): recording into it is recording into RAM,
and its files hold the arrays' bytes as they are written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
from pettingzoo.classic import connect_four_v3

import flexibuff_envs as fe
from flexibuff_envs.log.ring import INDEX, RING, into_files
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
    for make, steps, directory in (
        (lambda: gym.make("CartPole-v1"), 300, tmp_path / "cartpole"),
        (connect_four_v3.env, 12, tmp_path / "connect_four"),
    ):
        in_files = recorded(make, directory, steps)
        in_memory = recorded(make, None, steps)
        for mine, want in zip(in_files.episodes(), in_memory.episodes(), strict=True):
            assert_same_batches(mine, want)
        listed = json.loads((directory / RING / INDEX).read_text())
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
