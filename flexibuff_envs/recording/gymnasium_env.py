"""Recorder for a single ``gymnasium.Env``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.recording.setup import BootstrapFn, LogPath, Sourced, prepare_buffer
from flexibuff_envs.recording.single_agent import SingleLaneRecorder
from flexibuff_envs.recording.writer import Unpicklable, Writer
from flexibuff_envs.spec import BufferSpec, infer_spec
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.observations import obs_codec


class GymRecorder(Sourced, Unpicklable, gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Records every step of a Gymnasium env into ``self.buffer``; otherwise the bare env.

    ``reset`` starts an episode (a reset before the last one ended closes it as truncated);
    each ``step`` is one row; ``G`` is written when the episode terminates or is truncated.
    A ``step`` after the episode ended, without a reset, is passed through and not recorded.

    Args:
        env: the env to record.
        buffer: an existing buffer to fill; it must match the env's layout.
        num_steps: rows of the new buffer (ignored when ``buffer`` is given).
        gamma: discount of ``G`` (default 0.99, or the given buffer's).
        gae_lambda: GAE's lambda, used once values are annotated (default 0.95, or the given
            buffer's).
        bootstrap_fn: ``V(obs_)`` at a truncation; ``obs_`` is exactly what a batch shows as
            that row's ``obs_`` (flat; one-hot float32 for categorical observations).
        seed: seed of the buffer's sampler (also reseeds a given buffer's).
        log: an episode log directory every whole episode is appended to as it ends
            (`FlexibleBuffer.log_to`; ``env.close()`` closes it).
        policy: a tag for the policy acting (a checkpoint's name), kept with the episodes
            (`FlexibleBuffer.sessions`); ``set_policy(tag)`` changes it mid-run.

    Several recorders can share one buffer, each writing a lane of its own: the buffer needs as
    many lanes (``n_envs``) as recorders. A recorder frees its lane when closed or dropped.
    """

    def __init__(
        self,
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
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            bootstrap_fn=bootstrap_fn,
            seed=seed,
            alpha=alpha,
            extra_fields=extra_fields,
        )
        gym.Wrapper.__init__(self, env)
        self.buffer = prepare_buffer(
            infer_spec(env),
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            seed=seed,
            alpha=alpha,
            extra_fields=extra_fields,
            log=log,
        )
        self._log_opened = log is not None
        self._writer = Writer(self.buffer, self)
        (lane,) = self._writer.claim_lanes(1)
        self._begin_session(env, "gymnasium", policy)  # once its lane is its own
        self._recorder = SingleLaneRecorder(
            self._writer,
            obs_codec(env.observation_space),
            action_codec(env.action_space),
            lane=lane,
            bootstrap_fn=None if bootstrap_fn is None else lambda obs_, agent: bootstrap_fn(obs_),
        )
        self._tag_origins(self._recorder.origins)

    @property
    def buffer_spec(self) -> BufferSpec:
        """The layout the buffer records in (``.spec`` stays Gymnasium's ``EnvSpec``)."""
        return self.buffer.spec

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._recorder.begin([(0, obs, info)], seed=seed)
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        recorder = self._recorder
        try:
            result = self.env.step(action)
            if recorder.running:
                recorder.step_single(action, *result)
            else:  # a step not recorded: the next episode follows nothing (`recording.origins`)
                recorder.origins.broken()
        except BaseException as error:  # Ctrl-C after the env moved included: `step_failed`
            recorder.step_failed(error)
            raise
        return result

    def truncate(self) -> None:
        """End the running episode at its last recorded step, as truncated (``G`` written,
        bootstrapped by ``bootstrap_fn`` where given), so the buffer and its log hold it whole
        (a run stopped early: the CLI calls it at Ctrl-C). Recording resumes at the next reset."""
        self._recorder.cut_by_user()

    def close(self) -> None:
        """Close the env; the buffer's lane is free for another recorder; the log
        it opened (``log=``) is closed, a log the buffer keeps otherwise synced."""
        self._writer.release_lanes(close_log=self._log_opened)
        super().close()

    def annotate(self, agent: None = None, **fields: Any) -> None:
        """What the agent knows about the step it is about to take, written into that step's row.

        Fields: ``discrete_log_probs`` (one per head), ``continuous_log_probs``, ``values`` (V of
        the current observation, enables GAE), ``memory_weights``. An unknown field or a wrong
        shape raises ValueError naming it.
        """
        if agent is not None:
            raise InvalidArgumentError(f"annotate: a Gymnasium env has one agent; pass no agent (got {agent!r})")
        self._recorder.annotations.add(0, "agent_0", fields)

    def add_feedback(self, value: float, agent: None = None, step: int = -1) -> None:
        """Add a human (auxiliary) reward to an already recorded step of this episode.

        ``step`` counts the episode's steps from 0, or from the latest with negative numbers; right
        after a reset it refers to the episode that just ended. Repeated feedback adds up.
        """
        if agent is not None:
            raise InvalidArgumentError(f"add_feedback: a Gymnasium env has one agent; pass no agent (got {agent!r})")
        self._recorder.feedback(0, value, step)
