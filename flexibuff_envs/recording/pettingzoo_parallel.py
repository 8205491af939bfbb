"""Recorder for a PettingZoo ``ParallelEnv``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pettingzoo.utils import BaseParallelWrapper
from pettingzoo.utils.env import ParallelEnv
from typing_extensions import override

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.recording.agent_state import AgentStateFn
from flexibuff_envs.recording.pettingzoo_base import PettingZooRecorderMixin
from flexibuff_envs.recording.setup import BootstrapFn, GlobalReward, LogPath


class ParallelRecorder(PettingZooRecorderMixin, BaseParallelWrapper):
    """Records every step of a PettingZoo parallel env into ``self.buffer``; otherwise the bare env.

    One row per ``step`` over ``possible_agents``. An agent that does not act in a step is
    inactive in that row. An agent's transition runs from its action to its next one: a step it
    sits out (present, given no action) adds its reward to that transition and gives it its
    ``obs_``; a reward before its first action goes into its first transition. Each agent's
    episode ends at its own termination or truncation, taken from the dicts ``step`` returned,
    and its ``G`` is written then, over its own transitions.

    Args:
        env: the parallel env to record.
        buffer: an existing buffer to fill; it must match the env's layout.
        num_steps: rows of the new buffer (ignored when ``buffer`` is given).
        gamma: discount of ``G`` (default 0.99, or the given buffer's).
        gae_lambda: GAE's lambda (default 0.95, or the given buffer's).
        bootstrap_fn: ``bootstrap_fn(obs_, agent_id)`` -> V at a truncation; ``obs_`` is what a
            batch shows as that agent's ``obs_`` in the row.
        seed: seed of the buffer's sampler (also reseeds a given buffer's).
        global_reward: "sum" (default), "mean", "none" or ``fn(rewards, active) -> float``.
        record_state: record the global state where the env has one (default). Each step then
            calls the env's ``state()``, which on mpe2 costs about as much as recording itself.
        agent_state: ``fn(env, agent, obs) -> values``, a state per agent for its own critic (HARL's
            "FP" state): called whenever an agent observes, recorded as the fields of your own
            ``agent_state`` (with the row's ``obs``) and ``agent_state_`` (with its ``obs_``).
        agent_state_size: how many values ``agent_state`` returns (float32).
        policy: a tag for the policy acting (a checkpoint's name), kept with the episodes
            (`FlexibleBuffer.sessions`); ``set_policy(tag)`` changes it mid-run.
        env_kwargs: the keywords ``env`` was made with, kept in its session (a PettingZoo env
            does not say them): what makes it again (``parallel_env(**env_kwargs)``).
    """

    API = "parallel"

    def __init__(
        self,
        env: ParallelEnv,
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
        BaseParallelWrapper.__init__(self, env)
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

    @override
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        agents = [(self._index[a], o, infos.get(a, {})) for a, o in obs.items()]
        self._recorder.begin(agents, self._read_state(), seed)
        return obs, infos

    @property
    def agents(self) -> list:
        """The env's live agents (read on every step of a loop, so forwarded directly)."""
        return self.env.agents

    @override
    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        recorder = self._recorder
        try:
            result = self.env.step(actions)
            if recorder.running:  # claiming the row may forget the oldest episode: part of the step
                recorder.record(lambda: self._record(recorder.next_row(), actions, *result))
            else:  # a step not recorded: the next episode follows nothing (`recording.origins`)
                recorder.origins.broken()
        except BaseException as error:  # Ctrl-C after the env moved included: `step_failed`
            recorder.step_failed(error)
            raise
        return result

    def _record(
        self, row: int, actions: dict, obs: dict, rewards: dict, terminations: dict, truncations: dict, infos: dict
    ) -> None:
        recorder = self._recorder
        index, is_open = self._index, recorder.open
        written: list[int] = []
        ended: list[int] = []
        bootstrap: list[bool] = []
        for agent, o in obs.items():
            i = index[agent]
            info = infos.get(agent, {})
            reward, terminated, truncated = rewards[agent], terminations[agent], truncations[agent]
            if not is_open[i]:  # spawned: its first transition starts at its first action
                recorder.join(i, o, info, reward)
                if terminated or truncated:
                    ended.append(i)
                    bootstrap.append(False)
                continue
            if agent in actions:
                recorder.write(row, i, actions[agent], o, reward, terminated, truncated, info)
                written.append(i)
            else:  # sat this step out: its transition runs on
                recorder.sit_out(i, o, reward, terminated, truncated, info)
            if terminated or truncated:
                ended.append(i)
                bootstrap.append(bool(truncated and not terminated))
        recorder.clear_absent(row, written)
        recorder.team_reward(row)
        recorder.write_state(row, self._read_state())
        if ended:
            recorder.close(ended, bootstrap)
