"""What the PettingZoo recorders share: layout from the env's agents, buffer set-up, state reads."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.recording.agent_state import AgentStateFn, AgentStates, with_agent_state
from flexibuff_envs.recording.lane_recorder import LaneRecorder
from flexibuff_envs.recording.setup import BootstrapFn, GlobalReward, LogPath, Sourced, prepare_buffer
from flexibuff_envs.recording.writer import Unpicklable, Writer
from flexibuff_envs.spec import BufferSpec, combine_agents, state_codec
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.observations import obs_codec


def agent_codecs(env: Any) -> tuple[list[str], list[Any], list[Any], Any]:
    """(agent ids, obs codecs, action codecs, state codec) of a PettingZoo env, in buffer order."""
    ids = list(env.possible_agents)
    return (
        ids,
        [obs_codec(env.observation_space(a), f"observation space of agent {a!r}") for a in ids],
        [action_codec(env.action_space(a), f"action space of agent {a!r}") for a in ids],
        state_codec(env),
    )


class PettingZooRecorderMixin(Sourced, Unpicklable):
    """What both PettingZoo recorders share: construction from the env and the public surface."""

    buffer: FlexibleBuffer
    env: Any
    #: the API recorded, as `BufferSpec.env_api` says it
    API: str

    def _setup(
        self,
        env: Any,
        buffer: FlexibleBuffer | None,
        *,
        num_steps: int,
        gamma: float | None,
        gae_lambda: float | None,
        bootstrap_fn: BootstrapFn | None,
        seed: int | None,
        global_reward: GlobalReward,
        record_state: bool,
        alpha: float | None,
        extra_fields: Mapping[str, Any] | None,
        log: LogPath | None,
        agent_state: AgentStateFn | None,
        agent_state_size: int | None,
        policy: str = "",
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        ids, obs, actions, state = agent_codecs(env)
        state = state if record_state else None
        spec = dataclasses.replace(combine_agents([str(a) for a in ids], obs, actions, state=state), env_api=self.API)
        self.buffer = prepare_buffer(
            spec,
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            seed=seed,
            global_reward=global_reward,
            alpha=alpha,
            extra_fields=with_agent_state(extra_fields, agent_state, agent_state_size),
            log=log,
        )
        self._log_opened = log is not None
        self._index = {agent: i for i, agent in enumerate(ids)}
        self._env_name = str(env)
        self._writer = Writer(self.buffer, self)
        (lane,) = self._writer.claim_lanes(1)
        self._begin_session(env, self.API, policy, env_kwargs)  # once its lane is its own
        self._recorder = LaneRecorder(
            self._writer, obs, actions, lane=lane, bootstrap_fn=bootstrap_fn, global_reward=global_reward, state=state
        )
        self._tag_origins(self._recorder.origins)
        if agent_state is not None:
            self._recorder.agent_states = AgentStates(self._writer, agent_state, env, ids)
        self._raw = env.unwrapped
        # the raw env's state(): the wrappers around it only check that reset came first
        self._state = self._raw.state if state is not None else None
        self._state_failed = False

    def _read_state(self) -> Any:
        """The env's global state, or None (recorded as missing) when its ``state()`` fails.

        Some envs' ``state()`` breaks in states the bare env never asks it about (multiwalker's,
        once a walker has fallen); the recorder must not turn that into a crash of the user's loop.
        """
        if self._state is None:
            return None
        try:
            return self._state()
        except Exception as exc:  # noqa: BLE001 - any failure of the env's own state()
            if not self._state_failed:
                self._state_failed = True
                warnings.warn(
                    f"state() of {self._env_name} raised {exc!r}; such steps record the state as missing (NaN)",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return None

    def truncate(self) -> None:
        """End the running episode at its last recorded step, every agent still in it truncated
        there (see `GymRecorder.truncate`). Recording resumes at the next reset."""
        if self._recorder.running:
            self._recorder.cut_by_user()

    def close(self) -> None:
        """Close the env; the buffer's lane is free for another recorder; the log
        it opened (``log=``) is closed, a log the buffer keeps otherwise synced."""
        self._writer.release_lanes(close_log=self._log_opened)
        self.env.close()

    @property
    def buffer_spec(self) -> BufferSpec:
        """The layout the buffer records in."""
        return self.buffer.spec

    def _agent_index(self, what: str, agent: Any) -> int:
        if agent not in self._index:
            raise InvalidArgumentError(f"{what}: agent must be one of {list(self._index)}, got {agent!r}")
        return self._index[agent]

    def annotate(self, agent: Any = None, **fields: Any) -> None:
        """What ``agent`` knows about its next transition (see `GymRecorder.annotate`)."""
        self._recorder.annotations.add(self._agent_index("annotate", agent), str(agent), fields)

    def add_feedback(self, value: float, agent: Any = None, step: int = -1) -> None:
        """Add a human reward to ``agent``'s ``step``-th recorded transition of this episode."""
        self._recorder.feedback(self._agent_index("add_feedback", agent), value, step)
