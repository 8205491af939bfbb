"""What a recorder is set up with: the buffer it writes (made from the env's spec, or the user's,
checked), the team-reward reduction, and the types of the recorders' shared keywords."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, SpecMismatchError
from flexibuff_envs.index.returns import check_gamma
from flexibuff_envs.recording.origins import LaneOrigins
from flexibuff_envs.sampling.priorities import check_alpha
from flexibuff_envs.spec import BufferSpec, provenance
from flexibuff_envs.storage.fields import extra_fields as extra_fields_of

#: ``bootstrap_fn(obs_)`` (``bootstrap_fn(obs_, agent_id)`` for PettingZoo): V of the observation
#: after a truncated episode's last step, exactly as a batch shows that row's ``obs_``. The core
#: always calls it with both.
BootstrapFn = Callable[..., Any]
#: an episode log's directory (`FlexibleBuffer.log_to`)
LogPath = str | os.PathLike[str]
#: how a row's team reward comes from its agents' rewards: "sum", "mean", "none" or
#: ``fn(rewards [n_agents], active [n_agents]) -> float``
GlobalReward = str | Callable[[np.ndarray, np.ndarray], float]

_REDUCERS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "sum": lambda rewards, active: float(rewards.sum()),
    "mean": lambda rewards, active: float(rewards.sum()) / max(int(active.sum()), 1),
}


def reducer(global_reward: GlobalReward) -> Callable[[np.ndarray, np.ndarray], float] | None:
    """The team-reward function for ``global_reward`` (None for "none")."""
    if callable(global_reward):
        return global_reward
    if global_reward == "none":
        return None
    if global_reward not in _REDUCERS:
        raise InvalidArgumentError(f"global_reward must be 'sum', 'mean', 'none' or a function, got {global_reward!r}")
    return _REDUCERS[global_reward]


def prepare_buffer(
    spec: BufferSpec,
    buffer: FlexibleBuffer | None,
    *,
    num_steps: int,
    gamma: float | None,
    gae_lambda: float | None,
    seed: int | None,
    global_reward: GlobalReward = "sum",
    alpha: float | None = None,
    extra_fields: Mapping[str, Any] | None = None,
    log: LogPath | None = None,
) -> FlexibleBuffer:
    """A new buffer for ``spec`` (with ``extra_fields``), or the user's, checked against it
    (``seed`` reseeds its sampler); with ``log``, it appends every episode that ends to that log."""
    spec = dataclasses.replace(spec, extra_fields=extra_fields_of(extra_fields))
    if buffer is None:
        buffer = FlexibleBuffer.from_spec(
            spec,
            num_steps=num_steps,
            gamma=0.99 if gamma is None else gamma,
            gae_lambda=0.95 if gae_lambda is None else gae_lambda,
            seed=seed,
            global_reward=global_reward != "none",
            **({} if alpha is None else {"alpha": alpha}),
        )
    else:
        buffer.check_matches(spec)
        for name, value, check in (
            ("gamma", gamma, check_gamma),
            ("gae_lambda", gae_lambda, check_gamma),
            ("alpha", alpha, check_alpha),
        ):
            if value is not None and check(value, name) != getattr(buffer, name):
                raise SpecMismatchError(
                    f"{name}={value!r} differs from the given buffer's {name}={getattr(buffer, name)!r}"
                )
        if seed is not None:
            buffer.rng = np.random.default_rng(seed)
    if log is not None:
        buffer.log_to(log)
    return buffer


class Sourced:
    """A recorder's session in its buffer (`FlexibleBuffer.sessions`: where its episodes came
    from), and the policy tag its episodes carry."""

    buffer: FlexibleBuffer
    _session: int
    _origins: LaneOrigins | None = None  # its recorder's (`recording.origins`), once made

    def _begin_session(self, env: Any, api: str, policy: str, env_kwargs: Mapping[str, Any] | None = None) -> None:
        self._session = self.buffer.add_session(provenance.session(env, api, policy=policy, env_kwargs=env_kwargs))
        self._tag_origins(self._origins)

    def _tag_origins(self, origins: LaneOrigins | None) -> None:
        """Episodes ``origins`` (the recorder's) begins from now on are this session's."""
        self._origins = origins
        if origins is not None:
            origins.session = self._session

    def set_policy(self, tag: str) -> None:
        """Tag the episodes that end from now on with ``tag`` (the policy acting, a checkpoint's
        name: ``"ppo-step-120000"``): a new session of the buffer and of its log, the same env's,
        begun now (`FlexibleBuffer.sessions`)."""
        begun = self.buffer._sessions[self._session]
        tagged = {**begun, "policy": provenance.policy_tag(tag), "started": time.time(), "first_episode": None}
        self._session = self.buffer.add_session(tagged)
        self._tag_origins(self._origins)
