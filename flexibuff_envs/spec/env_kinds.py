"""Which env API an object speaks. The one place pettingzoo is imported (lazily).

Detection needs no import: whoever holds a PettingZoo env has imported pettingzoo already.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import gymnasium as gym

from flexibuff_envs.errors import MissingExtraError, needs

Kind = Literal["gymnasium", "vector", "parallel", "aec"]


def pettingzoo_env_module() -> Any:
    """``pettingzoo.utils.env``, or MissingExtraError naming the extra."""
    try:
        from pettingzoo.utils import env
    except ImportError as exc:
        raise MissingExtraError(needs("PettingZoo envs", "pettingzoo", "pettingzoo")) from exc
    return env


def env_kind(env: Any) -> Kind | None:
    """ "gymnasium", "vector", "parallel", "aec", or None for anything else."""
    if isinstance(env, gym.Env):
        return "gymnasium"
    if isinstance(env, gym.vector.VectorEnv):
        return "vector"
    module = sys.modules.get("pettingzoo.utils.env")
    if module is not None:
        if isinstance(env, module.ParallelEnv):
            return "parallel"
        if isinstance(env, module.AECEnv):
            return "aec"
    return None


def implements_state(env: Any) -> bool:
    """Whether a PettingZoo env's own class overrides ``state()`` (the base raises)."""
    module = pettingzoo_env_module()
    cls = type(env.unwrapped)
    base = module.ParallelEnv if isinstance(env.unwrapped, module.ParallelEnv) else module.AECEnv
    return callable(getattr(cls, "state", None)) and cls.state is not base.state
