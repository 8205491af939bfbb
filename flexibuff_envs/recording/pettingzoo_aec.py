"""Recorder for a PettingZoo ``AECEnv`` (turn-based)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pettingzoo.utils import BaseWrapper
from pettingzoo.utils.env import AECEnv
from pettingzoo.utils.wrappers import (
    AssertOutOfBoundsWrapper,
    CaptureStdoutWrapper,
    ClipOutOfBoundsWrapper,
    OrderEnforcingWrapper,
    TerminateIllegalWrapper,
)
from typing_extensions import override

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.recording.agent_state import AgentStateFn
from flexibuff_envs.recording.pettingzoo_base import PettingZooRecorderMixin
from flexibuff_envs.recording.setup import BootstrapFn, GlobalReward, LogPath

#: PettingZoo's own wrappers (each env's ``env()`` adds some): they keep no rewards, flags or
#: infos of their own (TerminateIllegalWrapper writes the raw env's), so ``last()`` through them
#: is the raw env's
_FORWARDING = (
    AssertOutOfBoundsWrapper,
    CaptureStdoutWrapper,
    ClipOutOfBoundsWrapper,
    OrderEnforcingWrapper,
    TerminateIllegalWrapper,
)


def forwards_last(env: AECEnv) -> bool:
    """Whether every wrapper around the raw env is one of `_FORWARDING` (then the recorder reads
    ``last()`` on the raw env, saving a chain of forwarded lookups per turn). Any other wrapper
    may keep what ``last()`` returns itself, set in ``reset`` or ``step`` (SuperSuit's
    ``reward_lambda_v0`` and ``clip_reward_v0`` do): it is read through the wrappers then."""
    while isinstance(env, BaseWrapper):
        if type(env) not in _FORWARDING:
            return False
        env = env.env
    return True


class AECRecorder(PettingZooRecorderMixin, BaseWrapper):
    """Records every turn of a PettingZoo AEC env into ``self.buffer``; otherwise the bare env.

    Each agent's transition opens at its turn (its observation, mask and action) and closes at its
    next appearance in ``agent_iter``: its next turn, or its dead step. It takes the reward
    ``last()`` reports then (everything the agent received since it acted), the observation and
    mask of that moment, and the agent's own terminated/truncated. Row ``k`` of an episode holds
    each agent's ``k``-th turn. The ``None`` step of a finished agent closes its last transition
    and is not a transition itself. A reward received before an agent's first turn goes into its
    first transition; one received by an agent that never acts stays, inactive, in row 0. The global state of row ``k`` is taken when the row's first
    transition closes; ``state`` is the previous row's ``state_`` (the reset state for row 0).

    Args: as `ParallelRecorder`.
    """

    API = "aec"

    def __init__(
        self,
        env: AECEnv,
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
    ) -> None:
        BaseWrapper.__init__(self, env)
        self._setup(
            env,
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            bootstrap_fn=bootstrap_fn,
            seed=seed,
            global_reward=global_reward,
            record_state=record_state,
            alpha=alpha,
            extra_fields=extra_fields,
            log=log,
            agent_state=agent_state,
            agent_state_size=agent_state_size,
            policy=policy,
            env_kwargs=env_kwargs,
        )
        self._recorder.end_with_last_agent = False  # step() ends the episode when the env has no agents
        # where last() and the agent to act are read: the raw env when the wrappers only forward
        # them (_direct, saving each wrapper's forwarding), else through the wrappers
        self._direct: AECEnv | None = self._raw if forwards_last(env) else None
        self._source: AECEnv = self._raw if self._direct is not None else env
        self._actions: list[Any] = [None] * len(self._index)
        # per agent: the annotations given for its open transition (before the action that
        # opened it); they are written when it closes, at the agent's next turn
        self._held: list[dict[str, Any]] = [{} for _ in self._index]
        self._seen: tuple[Any, tuple[Any, ...]] | None = None

    @override
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self._seen = None
        self._held = [{} for _ in self._index]
        self._recorder.begin([], self._read_state(), seed)

    @override
    def agent_iter(self, max_iter: int = 2**63) -> Any:
        # the env's own iterator, with its own order checks, and no extra forwarding per read
        return self.env.agent_iter(max_iter)

    @override
    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if not self._recorder.running:
            return super().last(observe)
        raw = self._direct
        if raw is not None:  # the inner wrappers only forward these: read them on the raw env
            agent = raw.agent_selection
            result = (
                self.env.observe(agent) if observe else None,
                raw._cumulative_rewards[agent],
                raw.terminations[agent],
                raw.truncations[agent],
                raw.infos[agent],
            )
        else:
            agent = self.env.agent_selection
            result = self.env.last(observe)
        if observe:  # the step that follows reuses this observation instead of observing again
            self._seen = (agent, result)
        return result

    @override
    def step(self, action: Any) -> None:
        recorder = self._recorder
        acting = None
        try:
            if recorder.running:
                acting = self._index[self._source.agent_selection]
                recorder.record(self._record, acting, action)
            else:  # a step not recorded: the next episode follows nothing (`recording.origins`)
                recorder.origins.broken()
            self._seen = None
            self.env.step(action)
        except Exception:
            if acting is not None:  # the env refused the action: no transition starts, a retry may follow
                self._actions[acting] = None
            raise
        except BaseException as error:  # Ctrl-C, wherever it landed: whether the env moved is unknown
            recorder.step_failed(error)
            raise
        if recorder.running and not self._source.agents:
            recorder.cut()  # the env ended the episode without a dead step for every agent

    def _record(self, i: int, action: Any) -> None:
        """Close agent ``i``'s previous transition; open the one its ``action`` starts."""
        recorder = self._recorder
        seen = self._seen
        obs, reward, terminated, truncated, info = (
            seen[1] if seen is not None and seen[0] == self._source.agent_selection else self.last()
        )
        given = recorder.annotations.take(i)  # given before this action: they belong to what it opens
        if recorder.open[i] and self._actions[i] is not None:
            self._close_turn(i, obs, reward, terminated, truncated, info)
        elif action is not None:  # its first turn (what it received so far goes into this
            # transition), or a retry after a step that raised (its reward went into the last one)
            recorder.join(i, obs, info, 0.0 if recorder.open[i] else reward)
        elif reward:  # it leaves without ever acting (a poker hand folded before its turn)
            recorder.unrewarded(i, reward, recorder.row(recorder.steps[i]))
        self._held[i] = given if action is not None else {}
        self._actions[i] = (
            None if action is None else np.array(action, copy=True) if isinstance(action, np.ndarray) else action
        )

    def _close_turn(
        self, i: int, obs: Any, reward: Any, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        recorder = self._recorder
        k = recorder.steps[i]
        new_row = k == len(recorder.rows)
        row = recorder.row(k)
        recorder.write(row, i, self._actions[i], obs, reward, terminated, truncated, info, self._held[i])
        recorder.team_reward(row)
        if new_row:
            recorder.write_state(row, self._read_state())
        if terminated or truncated:
            recorder.close([i], [bool(truncated and not terminated)])
