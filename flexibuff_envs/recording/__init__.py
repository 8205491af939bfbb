"""Recording: the env adapters, one per API (`gymnasium_env`, `gymnasium_vector`,
`pettingzoo_parallel`, `pettingzoo_aec`), and `record`, which picks one, here; the engines they
drive (`lane_recorder`; `single_agent`; `vector`, with `vector_stage` and `vector_blocks`), the
one door they write through (`writer`), and playing them (`rollout`). Imports: `buffer` and below.

Recorder wrappers, one per env API, and `record` which picks the right one."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, overload

import gymnasium as gym
from gymnasium.vector import VectorEnv

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import ArgumentTypeError, NotAnEnvError, UnknownNameError
from flexibuff_envs.recording import stage_replay  # noqa: F401  (the log replays a killed vector recorder with it)
from flexibuff_envs.recording.agent_state import AgentStateFn
from flexibuff_envs.recording.gymnasium_env import GymRecorder
from flexibuff_envs.recording.gymnasium_vector import VectorRecorder
from flexibuff_envs.recording.setup import BootstrapFn, GlobalReward, LogPath
from flexibuff_envs.spec import ENV_KINDS
from flexibuff_envs.spec.env_kinds import env_kind

__all__ = ["AECRecorder", "GymRecorder", "ParallelRecorder", "VectorRecorder", "record"]


@overload
def record(
    env: gym.Env,
    buffer: FlexibleBuffer | None = None,
    *,
    num_steps: int = 100_000,
    gamma: float | None = None,
    gae_lambda: float | None = None,
    bootstrap_fn: BootstrapFn | None = None,
    seed: int | None = None,
    alpha: float | None = None,
    extra_fields: Mapping[str, Any] | None = None,
    log: LogPath | None = None,
    policy: str = "",
    env_kwargs: None = None,
) -> GymRecorder: ...


@overload
def record(
    env: VectorEnv,
    buffer: FlexibleBuffer | None = None,
    *,
    num_steps: int = 100_000,
    gamma: float | None = None,
    gae_lambda: float | None = None,
    bootstrap_fn: BootstrapFn | None = None,
    seed: int | None = None,
    alpha: float | None = None,
    extra_fields: Mapping[str, Any] | None = None,
    log: LogPath | None = None,
    policy: str = "",
    env_kwargs: None = None,
) -> VectorRecorder: ...


@overload
def record(
    env: Any,
    buffer: FlexibleBuffer | None = None,
    *,
    num_steps: int = 100_000,
    gamma: float | None = None,
    gae_lambda: float | None = None,
    bootstrap_fn: BootstrapFn | None = None,
    seed: int | None = None,
    global_reward: GlobalReward = "sum",
    record_state: bool = True,
    alpha: float | None = None,
    extra_fields: Mapping[str, Any] | None = None,
    log: LogPath | None = None,
    agent_state: AgentStateFn | None = None,
    agent_state_size: int | None = None,
    policy: str = "",
    env_kwargs: Mapping[str, Any] | None = None,
) -> Any: ...


def record(
    env: Any,
    buffer: FlexibleBuffer | None = None,
    *,
    num_steps: int = 100_000,
    gamma: float | None = None,
    gae_lambda: float | None = None,
    bootstrap_fn: BootstrapFn | None = None,
    seed: int | None = None,
    global_reward: GlobalReward | None = None,
    record_state: bool | None = None,
    alpha: float | None = None,
    extra_fields: Mapping[str, Any] | None = None,
    log: LogPath | None = None,
    agent_state: AgentStateFn | None = None,
    agent_state_size: int | None = None,
    policy: str = "",
    env_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Wrap ``env`` in the recorder of its API kind; every step then lands in ``.buffer``.

    Args:
        env: a ``gymnasium.Env``, a ``gymnasium.vector.VectorEnv``, a PettingZoo ``ParallelEnv`` or a
            PettingZoo ``AECEnv``.
        buffer: an existing buffer to fill (must match the env), else a new one. Recorders that
            share a buffer write a lane each: it needs a lane (``n_envs``) per recorder (sub-env).
        num_steps: rows of a new buffer, per lane (ignored when ``buffer`` is given).
        gamma: discount of ``G`` and GAE (default 0.99, or the given buffer's).
        gae_lambda: GAE's lambda, used once values are annotated (default 0.95, or the buffer's).
        bootstrap_fn: V at a truncation: ``bootstrap_fn(obs_)``, for PettingZoo
            ``bootstrap_fn(obs_, agent_id)``; ``obs_`` is exactly what a batch shows as that row's.
        seed: seed of the buffer's sampler (also reseeds a given buffer's).
        global_reward: PettingZoo only: the team reward of a row, "sum" (default), "mean",
            "none" or ``fn(rewards, active) -> float``.
        record_state: PettingZoo only: record the env's global state where it has one (default).
        alpha: prioritized replay's exponent for a new buffer (default 0.6; a given buffer's must match).
        extra_fields: per-agent fields of your own, ``{"hidden": (64,)}`` or ``{"hidden": ((64,),
            "float16")}``, filled through ``env.annotate(hidden=h)`` (a given buffer must hold them).
        log: an episode log directory (made, or continued) every whole episode is appended to as
            it ends (`FlexibleBuffer.log_to`); ``env.close()`` closes it.
        agent_state: PettingZoo only: ``fn(env, agent, obs) -> values``, a state per agent for
            its own critic (HARL's "FP" state), taken whenever an agent observes and recorded as
            the fields ``agent_state`` (beside the row's ``obs``) and ``agent_state_`` (beside its
            ``obs_``), ``[n_agents, batch, agent_state_size]`` in a batch.
        agent_state_size: how many values ``agent_state`` returns (float32).
        policy: a tag for the policy acting (a checkpoint's name, ``"ppo-step-120000"``), kept
            with the episodes that end under it (`FlexibleBuffer.sessions`, a log's header);
            ``env.set_policy(tag)`` changes it mid-run.
        env_kwargs: PettingZoo only: the keywords ``env`` was made with, kept in its session (a
            Gymnasium env's spec says them itself).

    Returns:
        `GymRecorder`, `VectorRecorder`, `ParallelRecorder` or `AECRecorder`.

    Raises:
        NotAnEnvError: ``env`` is none of the accepted kinds.
        TypeError: a PettingZoo-only keyword for a Gymnasium env.

    >>> env = record(gym.make("CartPole-v1"), num_steps=1000)
    >>> _ = env.reset(seed=0); _ = env.step(0)
    >>> len(env.buffer)
    1
    """
    kind = env_kind(env)
    if kind in ("gymnasium", "vector"):
        extra = [
            name
            for name, value in (
                ("global_reward", global_reward),
                ("record_state", record_state),
                ("agent_state", agent_state),
                ("agent_state_size", agent_state_size),
                ("env_kwargs", env_kwargs),
            )
            if value is not None
        ]
        if extra:
            raise ArgumentTypeError(
                f"record(): {', '.join(extra)} apply to PettingZoo envs only, not to a "
                f"{'Gymnasium env' if kind == 'gymnasium' else 'vector env'}"
            )
        gymnasium = GymRecorder if kind == "gymnasium" else VectorRecorder
        return gymnasium(
            env,
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            bootstrap_fn=bootstrap_fn,
            seed=seed,
            alpha=alpha,
            extra_fields=extra_fields,
            log=log,
            policy=policy,
        )
    if kind in ("parallel", "aec"):
        if kind == "parallel":
            from flexibuff_envs.recording.pettingzoo_parallel import ParallelRecorder as recorder
        else:
            from flexibuff_envs.recording.pettingzoo_aec import AECRecorder as recorder
        return recorder(
            env,
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            bootstrap_fn=bootstrap_fn,
            seed=seed,
            global_reward="sum" if global_reward is None else global_reward,
            record_state=True if record_state is None else record_state,
            alpha=alpha,
            extra_fields=extra_fields,
            log=log,
            agent_state=agent_state,
            agent_state_size=agent_state_size,
            policy=policy,
            env_kwargs=env_kwargs,
        )
    got = f"{type(env).__module__}.{type(env).__qualname__}"
    sb3 = sys.modules.get("stable_baselines3.common.vec_env")
    if sb3 is not None and isinstance(env, sb3.VecEnv):
        raise NotAnEnvError(
            f"record(env): {got} is a Stable-Baselines3 VecEnv; record it with "
            "flexibuff_envs.integrations.sb3.RecordingVecEnv(venv), which SB3's algorithms take as is"
        )
    raise NotAnEnvError(f"record(env): expected one of {ENV_KINDS}; got {got}")


def __getattr__(name: str) -> Any:
    # The PettingZoo recorders subclass pettingzoo's wrappers: import them only when asked for.
    if name == "ParallelRecorder":
        from flexibuff_envs.recording.pettingzoo_parallel import ParallelRecorder

        return ParallelRecorder
    if name == "AECRecorder":
        from flexibuff_envs.recording.pettingzoo_aec import AECRecorder

        return AECRecorder
    raise UnknownNameError(f"module {__name__!r} has no attribute {name!r}")
