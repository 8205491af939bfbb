"""Recorder for a PettingZoo ``ParallelEnv``."""

from __future__ import annotations

import warnings
from typing import Any

from pettingzoo.utils import BaseParallelWrapper
from pettingzoo.utils.env import ParallelEnv
from typing_extensions import override

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.spec import BufferSpec, action_codec, combine_agents, obs_codec, state_codec
from flexibuff_envs.wrappers.core import BootstrapFn, GlobalReward, LaneRecorder, prepare_buffer


def agent_codecs(env: Any) -> tuple[list[str], list[Any], list[Any], Any]:
    """(agent ids, obs codecs, action codecs, state codec) of a PettingZoo env, in buffer order."""
    ids = list(env.possible_agents)
    return (
        ids,
        [obs_codec(env.observation_space(a), f"observation space of agent {a!r}") for a in ids],
        [action_codec(env.action_space(a), f"action space of agent {a!r}") for a in ids],
        state_codec(env),
    )


class PettingZooRecorderMixin:
    """What both PettingZoo recorders share: construction from the env and the public surface."""

    buffer: FlexibleBuffer

    def _setup(self, env: Any, buffer: FlexibleBuffer | None, num_steps: int, gamma: float | None,
               bootstrap_fn: BootstrapFn | None, global_reward: GlobalReward, record_state: bool) -> None:
        ids, obs, actions, state = agent_codecs(env)
        state = state if record_state else None
        spec = combine_agents([str(a) for a in ids], obs, actions, state=state)
        self.buffer = prepare_buffer(spec, buffer, num_steps=num_steps, gamma=gamma, global_reward=global_reward)
        self._index = {agent: i for i, agent in enumerate(ids)}
        self._env_name = str(env)
        self._recorder = LaneRecorder(self.buffer, obs, actions, bootstrap_fn=bootstrap_fn,
                                      global_reward=global_reward, state=state)
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
                warnings.warn(f"state() of {self._env_name} raised {exc!r}; such steps record the "
                              "state as missing (NaN)", RuntimeWarning, stacklevel=3)
            return None

    @property
    def buffer_spec(self) -> BufferSpec:
        """The layout the buffer records in."""
        return self.buffer.spec


class ParallelRecorder(PettingZooRecorderMixin, BaseParallelWrapper):
    """Records every step of a PettingZoo parallel env into ``self.buffer``; otherwise the bare env.

    One row per ``step`` over ``possible_agents``. An agent absent from the step is inactive in
    that row. Each agent's episode ends at its own termination or truncation, taken from the
    dicts ``step`` returned, and its ``G`` is written then.

    Args:
        env: the parallel env to record.
        buffer: an existing buffer to fill; it must match the env's layout.
        num_steps: rows of the new buffer (ignored when ``buffer`` is given).
        gamma: discount of ``G`` (default 0.99, or the given buffer's).
        bootstrap_fn: ``bootstrap_fn(obs_, agent_id)`` -> V at a truncation.
        global_reward: "sum" (default), "mean", "none" or ``fn(rewards, active) -> float``.
        record_state: record the global state where the env has one (default). Each step then
            calls the env's ``state()``, which on mpe2 costs about as much as recording itself.
    """

    def __init__(self, env: ParallelEnv, buffer: FlexibleBuffer | None = None, *, num_steps: int = 100_000,
                 gamma: float | None = None, bootstrap_fn: BootstrapFn | None = None,
                 global_reward: GlobalReward = "sum", record_state: bool = True) -> None:
        BaseParallelWrapper.__init__(self, env)
        self._setup(env, buffer, num_steps, gamma, bootstrap_fn, global_reward, record_state)

    @override
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._recorder.begin([(self._index[a], o, infos.get(a, {})) for a, o in obs.items()],
                             self._read_state())
        return obs, infos

    @property
    def agents(self) -> list:
        """The env's live agents (read on every step of a loop, so forwarded directly)."""
        return self.env.agents

    @override
    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        result = self.env.step(actions)
        recorder = self._recorder
        if recorder.running:
            obs, rewards, terminations, truncations, infos = result
            row = recorder.next_row()
            index, is_open = self._index, recorder.open
            written: list[int] = []
            ended: list[int] = []
            bootstrap: list[bool] = []
            for agent, o in obs.items():
                i = index[agent]
                info = infos.get(agent, {})
                if not is_open[i] or agent not in actions:  # spawned, or sat this step out
                    recorder.join(i, o, info)
                    continue
                terminated, truncated = terminations[agent], truncations[agent]
                recorder.write(row, i, actions[agent], o, rewards[agent], terminated, truncated, info)
                written.append(i)
                if terminated or truncated:
                    ended.append(i)
                    bootstrap.append(bool(truncated and not terminated))
            recorder.clear_absent(row, written)
            recorder.team_reward(row)
            recorder.write_state(row, self._read_state())
            if ended:
                recorder.close(ended, bootstrap)
        return result
