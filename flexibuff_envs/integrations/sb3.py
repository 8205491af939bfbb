"""Stable-Baselines3: `RecordingVecEnv` records any SB3 ``VecEnv`` (``DummyVecEnv``,
``SubprocVecEnv``, SuperSuit's conversions) into one buffer, one lane per sub-env; `ReplayBuffer`
is SB3's replay buffer kept in a `FlexibleBuffer` (``DQN(..., replay_buffer_class=ReplayBuffer)``),
`RolloutBuffer` its rollout buffer, GAE computed by ours (``PPO(...,
rollout_buffer_class=RolloutBuffer)``, A2C).

SB3 resets a finished sub-env within its step: the observation it returns is the reset one, the
last one is ``infos[i]["terminal_observation"]``, and ``infos[i]["TimeLimit.truncated"]`` says a
time limit ended it. That is Gymnasium's SAME_STEP autoreset, so `BatchRecorder` records it as
it records a Gymnasium vector env: a block of steps at a time, every field in one numpy
operation. Needs ``pip install -e '.[sb3]'``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import ArgumentTypeError, MissingExtraError, needs
from flexibuff_envs.interrupts import holding
from flexibuff_envs.recording.setup import Sourced, prepare_buffer
from flexibuff_envs.recording.single_agent import SingleLaneRecorder
from flexibuff_envs.recording.vector import BatchRecorder, VectorBootstrapFn
from flexibuff_envs.recording.writer import Unpicklable, Writer
from flexibuff_envs.spec import BufferSpec, spec_from_codecs
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.observations import obs_codec

try:
    import torch as th
    from stable_baselines3.common import buffers
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
    from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecNormalize
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(needs("flexibuff_envs.integrations.sb3", "stable-baselines3", "sb3")) from error


def _timeouts(dones: np.ndarray, infos: list[dict[str, Any]]) -> np.ndarray:
    """The sub-envs whose episode a time limit ended (SB3's ``TimeLimit.truncated``)."""
    return dones & np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])


def _per_env(infos: list[dict[str, Any]] | Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """``infos`` as SB3 gives them, one dict per sub-env; a Gymnasium vector env's dict of arrays
    (``key``, and ``_key`` saying which sub-envs have it: what CleanRL passes) cut into those."""
    if not isinstance(infos, Mapping):
        return list(infos)
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, values in infos.items():
        if key.startswith("_"):
            continue
        given = infos.get(f"_{key}", np.ones(n, dtype=bool))
        for i in np.flatnonzero(given).tolist():
            out[i][key] = values[i]
    return out


class RecordingVecEnv(Sourced, Unpicklable, VecEnvWrapper):
    """``venv`` as it is, with every sub-env step recorded into ``self.buffer`` (lane ``i`` for
    sub-env ``i``, its episodes whole): pass it to any SB3 algorithm in place of ``venv``.

    Args:
        venv: an SB3 ``VecEnv``.
        buffer: a buffer to record into (a free lane per sub-env); None: a new one.
        num_steps, gamma, gae_lambda, bootstrap_fn, seed, policy: as `flexibuff_envs.record`
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
        policy: str = "",
    ) -> None:
        super().__init__(venv)
        obs, action = obs_codec(venv.observation_space), action_codec(venv.action_space)
        self.buffer = prepare_buffer(
            spec_from_codecs(obs, action, n_envs=venv.num_envs, env_api="vector"),
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
        self._begin_session(venv, "vector", policy)  # once its lanes are its own
        self._tag_origins(self._recorder.origins)
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
        try:
            obs, rewards, dones, infos = self.venv.step_wait()
            dones = np.asarray(dones, dtype=bool)
            truncated = _timeouts(dones, infos)
            ended = np.flatnonzero(dones)
            final = (ended, [infos[i]["terminal_observation"] for i in ended.tolist()]) if ended.size else None
            self._recorder.step(self._actions, obs, rewards, dones & ~truncated, truncated, final=final)
        except BaseException as error:  # Ctrl-C after the envs moved included (see `GymRecorder.step`)
            self._recorder.abandon(error)
            raise
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
            spec_from_codecs(obs, action, n_envs=n_envs, env_api="vector"),
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
        infos: list[dict[str, Any]] | Mapping[str, Any],
    ) -> None:
        """One transition per sub-env: ``next_obs`` is the final observation where ``done``.
        ``infos``: SB3's list of dicts, or a Gymnasium vector env's dict (as CleanRL passes it)."""
        done = np.asarray(done, dtype=bool)
        infos = _per_env(infos, self.n_envs)
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


class RolloutBuffer(buffers.RolloutBuffer):
    """SB3's ``RolloutBuffer`` recorded into a `FlexibleBuffer` (``self.buffer``, a lane per
    sub-env, ``values`` and SB3's joint ``log_prob`` annotated on each step), its advantages and
    returns our GAE (`FlexibleBuffer.finish_path` at the rollout's end), served as SB3 serves
    them: ``PPO(..., rollout_buffer_class=RolloutBuffer)``, or A2C.

    SB3 tells an episode's end by the next step's ``episode_start`` (or the rollout's ``dones``),
    so each step is recorded when the next comes. It hands a rollout buffer no final observation
    and no truncation (PPO folds a time limit's ``gamma * V`` into the reward): an episode's last
    ``obs_`` is unknown (NaN; 0 for integer observations), and every end is recorded as
    terminated, which gives SB3's advantages. Observations must be a ``Box``.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        gae_lambda: float = 1,
        gamma: float = 0.99,
        n_envs: int = 1,
    ) -> None:
        if not isinstance(observation_space, spaces.Box):
            raise ArgumentTypeError(f"RolloutBuffer keeps Box observations; got {observation_space!r}")
        obs, action = obs_codec(observation_space), action_codec(action_space)
        spec = spec_from_codecs(obs, action, n_envs=n_envs, env_api="vector")
        self.buffer = FlexibleBuffer.from_spec(
            dataclasses.replace(spec, extra_fields=(("log_prob", (1,), "float32"),)),  # SB3's joint log prob
            num_steps=buffer_size,
            gamma=gamma,
            gae_lambda=gae_lambda,
            global_reward=False,
            values=True,
        )
        writer = Writer(self.buffer, self)
        self._lane_ids = writer.claim_lanes(n_envs)
        self._lanes = [SingleLaneRecorder(writer, obs, action, lane=i, global_reward="none") for i in self._lane_ids]
        self._writer = writer
        unknown = np.nan if np.dtype(observation_space.dtype).kind == "f" else 0
        self._unknown = np.full(observation_space.shape, unknown, dtype=observation_space.dtype)
        # the last add (obs, action, reward, value, log prob), recorded when the next says if it ended
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._action = "continuous_actions" if isinstance(action_space, spaces.Box) else "discrete_actions"
        super().__init__(buffer_size, observation_space, action_space, device, gae_lambda, gamma, n_envs)

    def reset(self) -> None:
        """Forget the rollout (an episode still running goes on in the next)."""
        self.buffer.clear()
        self._pending = None
        self.generator_ready = False
        buffers.BaseBuffer.reset(self)

    @holding
    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        episode_start: np.ndarray,
        value: th.Tensor,
        log_prob: th.Tensor,
    ) -> None:
        """One step per sub-env; the step before it is recorded, ended where ``episode_start``."""
        if self._pending is not None:
            self._record(*self._pending, np.asarray(episode_start, dtype=bool), obs)
        self._pending = (
            np.array(obs),
            np.reshape(action, (self.n_envs, *(self.action_space.shape or ()))),
            np.array(reward),
            value.detach().cpu().numpy().reshape(self.n_envs),
            log_prob.detach().cpu().numpy().reshape(self.n_envs),
        )
        self.pos += 1
        self.full = self.full or self.pos == self.buffer_size

    def _record(
        self, obs: Any, action: Any, reward: Any, value: Any, log_prob: Any, ended: np.ndarray, after: Any
    ) -> None:
        for i, lane in enumerate(self._lanes):
            if not lane.running:
                lane.begin([(0, obs[i], {})])
            else:  # stored once where it is the step before's next observation
                lane.observe(0, obs[i])
            lane.annotations.add(0, "agent_0", {"values": value[i], "log_prob": log_prob[i : i + 1]})
            ends = bool(ended[i])
            lane.step_single(
                action[i], self._unknown if ends or after is None else after[i], reward[i], ends, False, {}
            )

    @holding
    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        """Record the last step (ended where ``dones``), write ``G`` and GAE of the episodes still
        running from ``last_values`` (`FlexibleBuffer.finish_path`), and gather the rollout as
        SB3's arrays ``[buffer_size, n_envs, ...]`` for `get`."""
        if self._pending is not None:
            self._record(*self._pending, np.asarray(dones, dtype=bool), None)
            self._pending = None
        self.buffer.finish_path(last_values.detach().cpu().numpy().reshape(self.n_envs))
        n, steps = self.n_envs, self.buffer_size
        written = np.array([self._writer.lane(i).written for i in self._lane_ids])[:, None]
        rows = (np.array(self._lane_ids)[:, None] * steps + (written - steps + np.arange(steps)) % steps).reshape(-1)
        fields = ("obs", self._action, "values", "log_prob", "advantages", "returns")
        batch = self.buffer.sample_transitions(idx=rows, fields=fields)

        def by_step(values: np.ndarray, *shape: int) -> np.ndarray:  # env-major rows -> [steps, n, ...]
            return np.swapaxes(values.reshape(n, steps, *shape), 0, 1)

        self.observations = by_step(batch.obs, *self.obs_shape)
        self.actions = by_step(getattr(batch, self._action), self.action_dim).astype(self.action_space.dtype)
        self.values, self.advantages, self.returns = (
            by_step(v) for v in (batch.values, batch.advantages, batch.returns)
        )
        self.log_probs = by_step(batch.log_prob)
        self.generator_ready = False
