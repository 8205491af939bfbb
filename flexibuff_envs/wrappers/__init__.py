"""Recorder wrappers, one per env API, and `record` which picks the right one."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import NotAnEnvError
from flexibuff_envs.spec import ENV_KINDS
from flexibuff_envs.wrappers.gymnasium_env import GymRecorder

__all__ = ["GymRecorder", "record"]


def record(env: Any, buffer: FlexibleBuffer | None = None, **options: Any) -> GymRecorder:
    """Wrap ``env`` in the recorder of its API kind; every step then lands in ``.buffer``.

    Args:
        env: a ``gymnasium.Env``.
        buffer: an existing buffer to fill (must match the env), else a new one.
        **options: the recorder's keywords (``num_steps``, ``gamma``, ``bootstrap_fn``).

    Raises:
        NotAnEnvError: ``env`` is none of the accepted kinds.

    >>> env = record(gym.make("CartPole-v1"), num_steps=1000)
    >>> _ = env.reset(seed=0); _ = env.step(0)
    >>> len(env.buffer)
    1
    """
    if isinstance(env, gym.Env):
        return GymRecorder(env, buffer, **options)
    raise NotAnEnvError(f"record(env): expected one of {ENV_KINDS}; got {type(env).__module__}."
                        f"{type(env).__qualname__}")
