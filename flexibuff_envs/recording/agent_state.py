"""A state per agent for each agent's critic (HARL's feature-pruned "FP" state), built by a
function the user gives and recorded beside each observation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.errors import ArgumentTypeError, InvalidArgumentError
from flexibuff_envs.recording.writer import Writer

#: ``agent_state(env, agent, obs) -> values``: the state agent ``agent`` sees at the moment it
#: observes ``obs`` (the env as the user gave it to the recorder)
AgentStateFn = Callable[[Any, Any, Any], Any]
#: the two fields of your own it is stored in: the value with the row's ``obs``, and with its ``obs_``
FIELDS = ("agent_state", "agent_state_")


def with_agent_state(
    extra_fields: Mapping[str, Any] | None, agent_state: AgentStateFn | None, size: int | None
) -> Mapping[str, Any] | None:
    """``extra_fields`` and, with ``agent_state``, its two fields of ``size`` float32 values."""
    if agent_state is None:
        if size is not None:
            raise ArgumentTypeError("agent_state_size applies only with agent_state=fn")
        return extra_fields
    if not callable(agent_state):
        raise ArgumentTypeError(f"agent_state must be a function (env, agent, obs) -> values, got {agent_state!r}")
    if size is None:
        raise ArgumentTypeError(
            "agent_state=fn needs agent_state_size, the number of values fn returns (the buffer is laid out before the first reset)"
        )
    taken = [name for name in FIELDS if name in (extra_fields or {})]
    if taken:
        raise InvalidArgumentError(f"extra_fields: {taken[0]!r} is where agent_state is recorded; name yours otherwise")
    return {**(extra_fields or {}), **dict.fromkeys(FIELDS, (size,))}


class AgentStates:
    """Each agent's state as ``fn`` gives it, held from the observation it acts on until the row
    that leaves it: a row's ``agent_state`` is the value taken with its ``obs``, its
    ``agent_state_`` the value taken with its ``obs_`` (the next row's ``agent_state``)."""

    def __init__(self, writer: Writer, fn: AgentStateFn, env: Any, names: Sequence[Any]) -> None:
        self.fn, self.env, self.names = fn, env, list(names)
        self.now, self.next = writer.field_rows(FIELDS[0]), writer.field_rows(FIELDS[1])
        self.size = self.now.shape[-1]
        self.held = np.full((len(self.names), self.size), np.nan, dtype=np.float32)

    def _value(self, index: int, obs: Any) -> np.ndarray:
        name = self.names[index]
        value = self.fn(self.env, name, obs)
        try:
            array = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"agent_state of agent {name!r} must be numbers, got {value!r}") from exc
        if array.size != self.size:
            raise InvalidArgumentError(
                f"agent_state of agent {name!r} must hold agent_state_size={self.size} values, got shape {array.shape}"
            )
        return array.reshape(self.size)

    def hold(self, index: int, obs: Any) -> None:
        """Agent ``index`` observes ``obs`` before acting on it (a reset, its first turn)."""
        self.held[index] = self._value(index, obs)

    def write(self, row: int, index: int, obs_: Any) -> None:
        """Agent ``index``'s transition in ``row`` leaves it at ``obs_``."""
        after = self._value(index, obs_)
        self.now.write(row, index, self.held[index])
        self.next.write(row, index, after)
        self.held[index] = after

    def replace(self, row: int, index: int, obs_: Any) -> None:
        """Agent ``index`` sat a step out: its transition in ``row`` now leaves it at ``obs_``."""
        self.held[index] = self._value(index, obs_)
        self.next.write(row, index, self.held[index])
