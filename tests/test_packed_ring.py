"""Observations and states kept compressed in memory (``FlexibleBuffer(compress=...)``): a
buffer recorded so holds, samples, saves, loads, extends and logs exactly what a raw buffer of
the same seeds and actions does, as its ring wraps, in a fraction of the memory."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.storage.packed_ring import PackedRing
from tests.batches import assert_same_batches, assert_same_draws, filled_by_hand

BOTH = {"obs": "zstd", "state": "zstd"}


def _env(kind: str) -> Any:
    if kind == "gym":
        return gym.make("CartPole-v1")
    if kind == "vector":
        return gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    if kind == "pong":  # stacked 84x84 frames: 28,224 bytes a row
        import ale_py
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

        gym.register_envs(ale_py)
        pong = gym.make("ALE/Pong-v5", frameskip=1, max_episode_steps=240)  # 60 steps
        return FrameStackObservation(AtariPreprocessing(pong), 4)
    pytest.importorskip("pettingzoo")
    if kind == "parallel":
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(max_cycles=10)
    if kind == "pistonball":  # image observations (457x120x3 an agent) and an image state
        from pettingzoo.butterfly import pistonball_v6

        return pistonball_v6.parallel_env(n_pistons=4, max_cycles=12)
    from pettingzoo.classic import connect_four_v3

    return connect_four_v3.env()


#: kind -> (rows a lane, episodes or steps recorded): each ring wraps
SIZES = {
    "gym": (40, 4),
    "vector": (60, 200),
    "parallel": (25, 4),
    "aec": (30, 4),
    "pistonball": (30, 3),
    "pong": (250, 400),
}


def _recorded(kind: str, compress: Any) -> fe.FlexibleBuffer:
    """``kind`` recorded with fixed seeds and random actions into a buffer keeping its fields as
    ``compress`` says."""
    env = _env(kind)
    num_steps, count = SIZES[kind]
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=num_steps, compress=compress)
    env = fe.record(env, buffer)
    rng = np.random.default_rng(0)
    if kind in ("vector", "pong"):  # steps: a vector env resets its sub-envs itself
        env.reset(seed=0)
        env.action_space.seed(0)
        for _ in range(count):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if kind == "pong" and (terminated or truncated):
                env.reset()
        return buffer
    for episode in range(count):
        env.reset(seed=episode)
        if kind == "gym":
            while not any(env.step(int(rng.integers(2)))[2:4]):
                pass
        elif kind == "aec":
            for _ in env.agent_iter():
                obs, _, terminated, truncated, _ = env.last()
                env.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"]))))
        else:
            for k, agent in enumerate(env.possible_agents):
                env.action_space(agent).seed(100 * episode + k)
            while env.agents:
                env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    return buffer


def _assert_same(mine: fe.FlexibleBuffer, want: fe.FlexibleBuffer, *, draws: bool = True) -> None:
    """The same episodes, and (``draws``: rows at the same numbers) the same batches in every
    sampling mode."""
    assert mine.n_episodes == want.n_episodes > 0
    for x, y in zip(mine.episodes(), want.episodes(), strict=True):
        assert_same_batches(x, y)
    if draws:
        assert_same_draws(mine, want)


@pytest.mark.parametrize("kind", list(SIZES))
def test_a_buffer_kept_compressed_records_and_samples_exactly_what_a_raw_one_does(kind: str) -> None:
    compress = "auto" if kind in ("pistonball", "pong") else BOTH
    packed, raw = _recorded(kind, compress), _recorded(kind, None)
    assert isinstance(packed.field("obs"), PackedRing) and isinstance(raw.field("obs"), np.ndarray)
    assert kind not in ("parallel", "pistonball") or isinstance(packed.field("state"), PackedRing)
    _assert_same(packed, raw)
    if kind in ("pistonball", "pong"):  # images: the rows take a fraction of their raw bytes
        assert packed.nbytes * 5 < raw.nbytes


def test_stacked_atari_frames_take_a_fiftieth_of_their_raw_bytes_in_memory() -> None:
    """Measured as Python allocates them (a frame zstd returns keeps the room it reserved, about
    a raw row, unless copied to its size), for rows written one at a time (pistonball's agents)
    and many at once (Pong's runs)."""
    for kind, raw_row in (("pong", 28_224), ("pistonball", 457 * 120 * 3)):
        tracemalloc.start()
        try:
            packed = _recorded(kind, "auto")
            held = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*storage/packed*")])
        finally:
            tracemalloc.stop()
        obs, rows = packed.field("obs"), packed.spec.n_agents * packed.num_steps  # every row written
        allocated = sum(stat.size for stat in held.statistics("filename"))
        assert allocated * 50 < raw_row * rows, kind
        assert obs.nbytes * 0.8 < allocated < obs.nbytes * 1.5, kind  # what nbytes says is what it holds


def test_auto_keeps_only_images_compressed_and_a_bad_choice_is_refused() -> None:
    assert isinstance(_recorded("gym", "auto").field("obs"), np.ndarray)  # 16-byte rows: raw
    with pytest.raises(fe.InvalidArgumentError, match="compress: 'G' is not kept compressed in memory"):
        fe.FlexibleBuffer(10, obs_size=4, compress={"G": "zstd"})
    with pytest.raises(fe.InvalidArgumentError, match="compress: 'obs' asks for codec 'lz4'"):
        fe.FlexibleBuffer(10, obs_size=4, compress={"obs": "lz4"})
    with pytest.raises(fe.InvalidArgumentError, match="compress must be 'auto', None or"):
        fe.FlexibleBuffer(10, obs_size=4, compress="fast")


def test_a_compressed_buffer_saves_loads_extends_and_logs_as_a_raw_one(tmp_path: Path) -> None:
    packed, raw = _recorded("pistonball", "auto"), _recorded("pistonball", None)
    path = packed.save(tmp_path / "packed.fbuf")
    _assert_same(fe.FlexibleBuffer.load(path), raw)
    for stored in (path, packed.save(tmp_path / "raw.fbuf", compress=None)):  # parts decoded, or raw
        again = fe.FlexibleBuffer.load(stored, compress="auto")
        _assert_same(again, raw)
        assert again.nbytes * 5 < raw.nbytes
    with pytest.raises(fe.InvalidArgumentError, match="load: mmap maps the rows"):
        fe.FlexibleBuffer.load(path, mmap=True, compress="auto")
    extended = fe.FlexibleBuffer.from_spec(raw.spec, num_steps=raw.num_steps, compress="auto")
    extended.extend(_recorded("pistonball", None).take_episodes())
    _assert_same(extended, raw, draws=False)  # its rows from the first: drawn at other numbers
    logging = fe.FlexibleBuffer.from_spec(raw.spec, num_steps=raw.num_steps, compress="auto")
    logging.log_to(tmp_path / "log")
    logging.extend(_recorded("pistonball", None).take_episodes())
    logging.close_log()
    _assert_same(fe.FlexibleBuffer.open(tmp_path / "log"), raw, draws=False)


def test_observations_filled_in_by_hand_are_kept_compressed_as_written() -> None:
    packed, raw = filled_by_hand(compress=BOTH), filled_by_hand()
    assert not isinstance(packed.field("obs"), np.ndarray)
    _assert_same(packed, raw)
    packed.field("obs")[0, 1] = 7.0  # a row at a time, any value numpy casts
    np.testing.assert_array_equal(packed.field("obs")[0, 1], [7.0, 7.0])
    with pytest.raises(fe.InvalidArgumentError, match="obs: a compressed field is written a whole row at a time"):
        packed.field("obs")[0, 1, 0] = 1.0


def test_saving_and_loading_a_compressed_buffer_never_holds_its_field_whole(tmp_path: Path) -> None:
    """save and load(compress=) decode and pack a block of rows at a time: their peak memory (a
    few blocks and the file's compression chunks in flight: about 35 MB whatever the buffer)
    stays under half the observations' raw bytes (2,500 Pong rows: 70 MB)."""
    packed = fe.FlexibleBuffer.from_spec(fe.infer_spec(_env("pong")), num_steps=2500, compress="auto")
    env = fe.record(_env("pong"), packed)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(2499):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    raw_bytes = 28_224 * len(packed)
    peaks = []
    for action in (
        lambda: packed.save(tmp_path / "pong.fbuf"),
        lambda: fe.FlexibleBuffer.load(tmp_path / "pong.fbuf", compress="auto"),
    ):
        tracemalloc.start()
        try:
            kept = action()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert max(peaks) * 2 < raw_bytes, peaks
    for x, y in zip(kept.episodes(), packed.episodes(), strict=True):
        assert_same_batches(x, y)


def test_a_vector_recorder_sampled_every_step_records_what_a_raw_buffer_does(tmp_path: Path) -> None:
    """Sampling after every step drains the vector recorder's block each step, so some blocks
    hold only resets (no row to write); and a log is written as episodes end."""
    buffers = []
    for compress in ({"obs": "zstd"}, None):
        env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=200, compress=compress, seed=3)
        buffer.log_to(tmp_path / str(compress is None))
        env = fe.record(env, buffer)
        env.reset(seed=0)
        env.action_space.seed(0)
        for step in range(300):
            env.step(env.action_space.sample())
            if step > 30:
                buffer.sample_transitions(8)
        env.close()
        buffers.append(buffer)
    _assert_same(*buffers)
    _assert_same(fe.FlexibleBuffer.open(tmp_path / "False"), fe.FlexibleBuffer.open(tmp_path / "True"), draws=False)
