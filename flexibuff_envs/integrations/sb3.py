"""Stable-Baselines3: `RecordingVecEnv` records any SB3 ``VecEnv`` (``DummyVecEnv``,
``SubprocVecEnv``, SuperSuit's conversions) into one buffer, one lane per sub-env; `ReplayBuffer`
is SB3's replay buffer kept in a `FlexibleBuffer` (``DQN(..., replay_buffer_class=ReplayBuffer)``).

SB3 resets a finished sub-env within its step: the observation it returns is the reset one, the
last one is ``infos[i]["terminal_observation"]``, and ``infos[i]["TimeLimit.truncated"]`` says a
time limit ended it. That is Gymnasium's SAME_STEP autoreset, so `BatchRecorder` records it as
it records a Gymnasium vector env: a block of steps at a time, every field in one numpy
operation. Needs ``pip install 'flexibuff_envs[sb3]'``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from flexibuff_envs.action_codecs import action_codec
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.codecs import obs_codec
from flexibuff_envs.errors import ArgumentTypeError, MissingExtraError
from flexibuff_envs.interrupts import holding
from flexibuff_envs.spec import BufferSpec, spec_from_codecs
from flexibuff_envs.wrappers.batched import BatchRecorder, VectorBootstrapFn
from flexibuff_envs.wrappers.setup import prepare_buffer
from flexibuff_envs.wrappers.staged import SingleLaneRecorder
from flexibuff_envs.writer import Unpicklable, Writer

try:
    import torch as th
    from stable_baselines3.common import buffers
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
    from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecNormalize
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(
        "flexibuff_envs.integrations.sb3 needs Stable-Baselines3: pip install 'flexibuff_envs[sb3]'"
    ) from error


def _timeouts(dones: np.ndarray, infos: list[dict[str, Any]]) -> np.ndarray:
    """The sub-envs whose episode a time limit ended (SB3's ``TimeLimit.truncated``)."""
    return dones & np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])


class RecordingVecEnv(Unpicklable, VecEnvWrapper):
    """``venv`` as it is, with every sub-env step recorded into ``self.buffer`` (lane ``i`` for
    sub-env ``i``, its episodes whole): pass it to any SB3 algorithm in place of ``venv``.

    Args:
        venv: an SB3 ``VecEnv``.
        buffer: a buffer to record into (a free lane per sub-env); None: a new one.
        num_steps, gamma, gae_lambda, bootstrap_fn, seed: as `flexibuff_envs.record`
            (``num_steps`` per sub-env; ``bootstrap_fn(obs_)`` values time-limited episodes).
    """

    def __init__(
        self,
        venv: VecEnv,
        buffer: FlexibleBuffer | None = None,
        *,
        num_steps: int = 100_000,
        gamma: float | None = None,
        gae_lambda: float | None = None,
        bootstrap_fn: VectorBootstrapFn | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(venv)
        obs, action = obs_codec(venv.observation_space), action_codec(venv.action_space)
        self.buffer = prepare_buffer(
            spec_from_codecs(obs, action, n_envs=venv.num_envs),
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            seed=seed,
        )
        writer = Writer(self.buffer, self)
        self._recorder = BatchRecorder(
            writer,
            obs,
            action,
            writer.claim_lanes(venv.num_envs),
            mode=AutoresetMode.SAME_STEP,
            bootstrap_fn=bootstrap_fn,
        )
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
        truncated = _timeouts(dones, infos)
        ended = np.flatnonzero(dones)
        final = (ended, [infos[i]["terminal_observation"] for i in ended.tolist()]) if ended.size else None
        self._recorder.step(self._actions, obs, rewards, dones & ~truncated, truncated, final=final)
        return obs, rewards, dones, infos

    def close(self) -> None:
        """Close the sub-envs; the buffer's lanes are free for another recorder."""
        self._recorder.writer.release_lanes()
        self.venv.close()


class ReplayBuffer(buffers.ReplayBuffer):
    """SB3's ``ReplayBuffer``, kept in a `FlexibleBuffer` (``self.buffer``): it holds what was
    added, and each observation once where the adds chain (an add's ``obs`` is the last one's
    ``next_obs``, as in a rollout; a shuffled prefill is kept as added). The final observation of
    a time-limited episode is kept (SB3's own ``optimize_memory_usage`` reads the next episode's
    first observation there instead).

    Use it as ``DQN(..., replay_buffer_class=ReplayBuffer)`` (or SAC, TD3, ...): SB3 passes the
    arguments below. Observations must be a ``Box`` (SB3 keeps Dict ones in ``DictReplayBuffer``).
    ``optimize_memory_usage`` changes nothing: observations are always stored once.

    Each sub-env's transition is written as it is added (`SingleLaneRecorder` with
    ``stage=False``): SB3 samples every few adds, often after each, and staged steps would be
    written at every sample. So ``add`` writes its sub-envs one after the other, a few
    microseconds each, rather than pay a run's fixed cost at each read (staged, SB3's add and
    sample cycle took 1.12x and 1.90x its own buffer's for one and four sub-envs, against 0.96x
    and 1.42x written at once: `benchmarks/versus.py cfe3d09 bench_sb3.py` at 8ac6221).
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
    ) -> None:
        if not isinstance(observation_space, spaces.Box):
            raise ArgumentTypeError(
                f"ReplayBuffer keeps Box observations; got {observation_space!r} "
                "(SB3 keeps Dict ones in DictReplayBuffer)"
            )
        buffers.BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = optimize_memory_usage
        self.handle_timeout_termination = handle_timeout_termination
        obs, action = obs_codec(observation_space), action_codec(action_space)
        # draws follow numpy's global generator, which SB3 seeds (set_random_seed), as its own buffer's do
        self.buffer = FlexibleBuffer.from_spec(
            spec_from_codecs(obs, action, n_envs=n_envs),
            num_steps=self.buffer_size,
            global_reward=False,
            seed=int(np.random.randint(2**31)),
        )
        writer = Writer(self.buffer, self)
        self._lanes = [
            SingleLaneRecorder(writer, obs, action, lane=lane, global_reward="none", stage=False)
            for lane in writer.claim_lanes(n_envs)
        ]
        self._action_shape = (n_envs, *(action_space.shape or ()))
        self._continuous = isinstance(action_space, spaces.Box)

    @holding
    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """One transition per sub-env: ``next_obs`` is the final observation where ``done``."""
        done = np.asarray(done, dtype=bool)
        truncated = _timeouts(done, infos) if self.handle_timeout_termination else np.zeros_like(done)
        actions = np.reshape(action, self._action_shape)
        for i, (lane, ended, timeout) in enumerate(zip(self._lanes, done.tolist(), truncated.tolist())):
            if not lane.running:  # an episode begins here, with its first observation
                lane.begin([(0, obs[i], {})])
            else:  # stored once where the adds chain (obs is the last add's next_obs), else as added
                lane.observe(0, obs[i])
            lane.step_single(actions[i], next_obs[i], reward[i], ended and not timeout, timeout, infos[i])
        self.pos = (self.pos + 1) % self.buffer_size
        self.full = self.full or self.pos == 0

    def size(self) -> int:
        """Transitions held per sub-env (SB3's count)."""
        return len(self.buffer) // self.n_envs

    def reset(self) -> None:
        """Forget every transition."""
        self.buffer.clear()
        self.pos, self.full = 0, False

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly over every sub-env's, as SB3's tensors."""
        as_torch = env is None  # else VecNormalize scales numpy arrays first
        batch = self.buffer.sample_transitions(
            batch_size,
            fields=(
                "obs",
                "obs_",
                "continuous_actions" if self._continuous else "discrete_actions",
                "individual_rewards",
                "terminated",
            ),
            as_torch=as_torch,
            device=self.device if as_torch else None,
        )
        shape = (batch_size, *self.obs_shape)
        actions = batch.continuous_actions if self._continuous else batch.discrete_actions
        data = (
            self._normalize_obs(batch.obs.reshape(shape), env),
            actions.reshape(batch_size, self.action_dim),
            self._normalize_obs(batch.obs_.reshape(shape), env),
            batch.terminated.reshape(-1, 1) if as_torch else batch.terminated.astype(np.float32).reshape(-1, 1),
            self._normalize_reward(batch.individual_rewards.reshape(-1, 1), env),
        )
        return ReplayBufferSamples(*(data if as_torch else map(self.to_torch, data)))
