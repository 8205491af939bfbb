"""A vector recorder's stage in a file of its log (`flexibuff_envs.log.stage_files`): the steps it has
not written yet are replayed by the next to open the log after a kill, so every episode that ended
in them is logged as the recorder would have logged it."""

from __future__ import annotations

import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import flexibuff_envs as fe
from flexibuff_envs import log
from flexibuff_envs.cli import main
from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.log.ring_files import RING
from flexibuff_envs.log.stage_files import staged
from flexibuff_envs.recording import vector as batched
from tests.batches import assert_same_batches

#: CartPole under each autoreset mode, and Taxi (observations as categories, legal-action masks)
CASES = [("CartPole-v1", mode) for mode in AutoresetMode] + [("Taxi-v4", AutoresetMode.NEXT_STEP)]


def _recording(directory: Path, mode: AutoresetMode, name: str = "CartPole-v1") -> fe.VectorRecorder:
    venv = gym.make_vec(
        name, num_envs=4, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}, max_episode_steps=20
    )
    return fe.record(venv, num_steps=96, log=directory)


def _step(env: fe.VectorRecorder, rng: np.random.Generator, mode: AutoresetMode) -> int:
    """One vector step of random actions; returns how many episodes it ended (DISABLED: the
    finished sub-envs are reset by the user, as that mode asks)."""
    _, _, terminated, truncated, _ = env.step(rng.integers(0, env.single_action_space.n, 4))
    done = terminated | truncated
    if mode == AutoresetMode.DISABLED and done.any():
        env.reset(options={"reset_mask": done})
    return int(done.sum())


@pytest.mark.parametrize(("name", "mode"), CASES, ids=lambda case: getattr(case, "name", case))
def test_a_killed_vector_recording_logs_the_episodes_that_ended_in_its_staged_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, mode: AutoresetMode
) -> None:
    """The log's files copied mid-block, as a SIGKILL would leave them (the OS holds every byte
    written), read back: every episode that ended before, equal to the same episode in the log
    the recording closed cleanly, no part of any other. `verify` before the replay counts the
    staged steps and says the episodes in them are replayed on open."""
    env = _recording(tmp_path / "run", mode, name)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    ended = sum(_step(env, rng, mode) for _ in range(150))
    while not ended or env._recorder._k == 0:  # stop with steps staged, an episode ended among them
        ended += _step(env, rng, mode)
    assert staged(str(tmp_path / "run" / RING))
    shutil.copytree(tmp_path / "run", tmp_path / "killed")
    steps = env._recorder._k
    env.close()

    before = log.verify(tmp_path / "killed")
    assert before.staged == steps and before.episodes <= ended  # DISABLED: the reset wrote the block
    assert main(["verify", str(tmp_path / "killed")]) == 1  # and the torn tail a kill leaves
    assert f"{before.staged:,} vector steps are staged" in capsys.readouterr().out

    whole = {batch.obs.tobytes(): batch for batch in fe.FlexibleBuffer.open(tmp_path / "run").episodes()}
    replayed = list(fe.FlexibleBuffer.open(tmp_path / "killed").episodes())
    assert len(replayed) == ended == log.verify(tmp_path / "killed").episodes
    assert log.verify(tmp_path / "killed").staged == 0
    for batch in replayed:
        assert_same_batches(batch, whole[batch.obs.tobytes()])
    assert not (tmp_path / "killed" / RING).exists()  # replayed once, then gone


def test_a_stage_that_names_another_buffers_steps_raises_naming_it(tmp_path: Path) -> None:
    """A stage file whose header and checksums hold, but whose lanes the ring lacks: opening
    the log raises `BufferFileError` naming the stage file."""
    env = _recording(tmp_path / "run", AutoresetMode.NEXT_STEP)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    while not (_step(env, rng, AutoresetMode.NEXT_STEP) and env._recorder._k):  # an episode ended in staged steps
        pass
    stage = next((tmp_path / "run" / RING).glob("stage*"))
    lanes = env._recorder._stage.file.arrays["lanes"]  # type: ignore[union-attr]
    lanes[0] = 1 << 20  # a lane far past the ring's
    shutil.copytree(tmp_path / "run", tmp_path / "killed")
    env.close()
    with pytest.raises(BufferFileError, match=stage.name):
        fe.FlexibleBuffer.open(tmp_path / "killed")


def test_a_stage_of_shorter_blocks_than_this_version_stages_is_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage a recorder of an earlier version left, its blocks shorter (64 vector steps of 4
    sub-envs, where this version stages 256), replays as that recorder would have written it."""
    with monkeypatch.context() as earlier:
        earlier.setattr(batched, "_BLOCK", 256)
        venv = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
        env = fe.record(venv, num_steps=4096, log=tmp_path / "run")
        assert env._recorder.block == 64
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        ended = sum(_step(env, rng, AutoresetMode.NEXT_STEP) for _ in range(100))
        while not ended or env._recorder._k < 40:  # many steps staged, an episode ended among them
            ended += _step(env, rng, AutoresetMode.NEXT_STEP)
        shutil.copytree(tmp_path / "run", tmp_path / "killed")
        env.close()
    whole = {batch.obs.tobytes(): batch for batch in fe.FlexibleBuffer.open(tmp_path / "run").episodes()}
    replayed = list(fe.FlexibleBuffer.open(tmp_path / "killed").episodes())
    assert len(replayed) == ended
    for batch in replayed:
        assert_same_batches(batch, whole[batch.obs.tobytes()])
