"""Stable-Baselines3: `RecordingVecEnv` records any SB3 ``VecEnv`` (``DummyVecEnv``,
``SubprocVecEnv``, SuperSuit's conversions) into one buffer, one lane per sub-env.

SB3 resets a finished sub-env within its step: the observation it returns is the reset one, the
last one is ``infos[i]["terminal_observation"]``, and ``infos[i]["TimeLimit.truncated"]`` says a
time limit ended it. That is Gymnasium's SAME_STEP autoreset, so `BatchRecorder` records it as
it records a Gymnasium vector env: a block of steps at a time, every field in one numpy
operation. Needs ``pip install 'flexibuff_envs[sb3]'``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.codecs import action_codec, obs_codec
from flexibuff_envs.errors import MissingExtraError
from flexibuff_envs.spec import BufferSpec, spec_from_codecs
from flexibuff_envs.wrappers.batched import BatchRecorder, VectorBootstrapFn
from flexibuff_envs.wrappers.core import prepare_buffer
from flexibuff_envs.writer import Writer

try:
    from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError("flexibuff_envs.integrations.sb3 needs Stable-Baselines3: "
                            "pip install 'flexibuff_envs[sb3]'") from error


class RecordingVecEnv(VecEnvWrapper):
    """``venv`` as it is, with every sub-env step recorded into ``self.buffer`` (lane ``i`` for
    sub-env ``i``, its episodes whole): pass it to any SB3 algorithm in place of ``venv``.

    Args:
        venv: an SB3 ``VecEnv``.
        buffer: a buffer to record into (a free lane per sub-env); None: a new one.
        num_steps, gamma, gae_lambda, bootstrap_fn, seed: as `flexibuff_envs.record`
            (``num_steps`` per sub-env; ``bootstrap_fn(obs_)`` values time-limited episodes).
    """

    def __init__(self, venv: VecEnv, buffer: FlexibleBuffer | None = None, *, num_steps: int = 100_000,
                 gamma: float | None = None, gae_lambda: float | None = None,
                 bootstrap_fn: VectorBootstrapFn | None = None, seed: int | None = None) -> None:
        super().__init__(venv)
        obs, action = obs_codec(venv.observation_space), action_codec(venv.action_space)
        self.buffer = prepare_buffer(spec_from_codecs(obs, action, n_envs=venv.num_envs), buffer,
                                     num_steps=num_steps, gamma=gamma, gae_lambda=gae_lambda, seed=seed)
        writer = Writer(self.buffer, self)
        self._recorder = BatchRecorder(
            writer, obs, action, writer.claim_lanes(venv.num_envs), mode=AutoresetMode.SAME_STEP,
            obs_space=batch_space(venv.observation_space, venv.num_envs),
            action_space=batch_space(venv.action_space, venv.num_envs), bootstrap_fn=bootstrap_fn)
        self._actions: Any = None

    @property
    def buffer_spec(self) -> BufferSpec:
        """The layout the buffer records in."""
        return self.buffer.spec

    def reset(self) -> Any:
        obs = self.venv.reset()
        self._recorder.begin(np.arange(self.num_envs), obs)
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions
        self.venv.step_async(actions)

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        dones = np.asarray(dones, dtype=bool)
        truncated = dones & np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        ended = np.flatnonzero(dones)
        final = (ended, [infos[i]["terminal_observation"] for i in ended.tolist()]) if ended.size else None
        self._recorder.step(self._actions, obs, rewards, dones & ~truncated, truncated, final=final)
        return obs, rewards, dones, infos

    def close(self) -> None:
        """Close the sub-envs; the buffer's lanes are free for another recorder."""
        self._recorder.writer.release_lanes()
        self.venv.close()
