"""Recorder wrappers, one per env API, and `record` which picks the right one."""

from __future__ import annotations

from typing import Any

import gymnasium as gym  # noqa: F401 - used by the doctest

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import NotAnEnvError
from flexibuff_envs.kinds import env_kind
from flexibuff_envs.spec import ENV_KINDS
from flexibuff_envs.wrappers.gymnasium_env import GymRecorder
from flexibuff_envs.wrappers.gymnasium_vector import VectorRecorder

__all__ = ["AECRecorder", "GymRecorder", "ParallelRecorder", "VectorRecorder", "record"]


def record(env: Any, buffer: FlexibleBuffer | None = None, **options: Any) -> Any:
    """Wrap ``env`` in the recorder of its API kind; every step then lands in ``.buffer``.

    Args:
        env: a ``gymnasium.Env``, a ``gymnasium.vector.VectorEnv``, a PettingZoo ``ParallelEnv`` or a
            PettingZoo ``AECEnv``.
        buffer: an existing buffer to fill (must match the env), else a new one.
        **options: the recorder's keywords (``num_steps``, ``gamma``, ``bootstrap_fn``, and for
            PettingZoo ``global_reward``).

    Returns:
        `GymRecorder`, `VectorRecorder`, `ParallelRecorder` or `AECRecorder`.

    Raises:
        NotAnEnvError: ``env`` is none of the accepted kinds.

    >>> env = record(gym.make("CartPole-v1"), num_steps=1000)
    >>> _ = env.reset(seed=0); _ = env.step(0)
    >>> len(env.buffer)
    1
    """
    kind = env_kind(env)
    if kind == "gymnasium":
        return GymRecorder(env, buffer, **options)
    if kind == "vector":
        return VectorRecorder(env, buffer, **options)
    if kind == "parallel":
        from flexibuff_envs.wrappers.pettingzoo_parallel import ParallelRecorder

        return ParallelRecorder(env, buffer, **options)
    if kind == "aec":
        from flexibuff_envs.wrappers.pettingzoo_aec import AECRecorder

        return AECRecorder(env, buffer, **options)
    raise NotAnEnvError(f"record(env): expected one of {ENV_KINDS}; got {type(env).__module__}."
                        f"{type(env).__qualname__}")


def __getattr__(name: str) -> Any:
    # The PettingZoo recorders subclass pettingzoo's wrappers: import them only when asked for.
    if name == "ParallelRecorder":
        from flexibuff_envs.wrappers.pettingzoo_parallel import ParallelRecorder

        return ParallelRecorder
    if name == "AECRecorder":
        from flexibuff_envs.wrappers.pettingzoo_aec import AECRecorder

        return AECRecorder
    raise AttributeError(name)
