"""Row writers: what recorders write a row's values through, bound by the storage to its arrays.

A recorder hands these values (an action as the env took it, a reward, end flags, an
annotation) and rows; how each is stored (action heads through the action codec, the team's
reward beside the agents', a field of your own) is theirs. Next values (``obs_``, ``state_``,
``action_mask_``) go through the holders (`flexibuff_envs.storage.holders`), also made by the storage.
Both recording engines write through these: one row at a time, or a run of rows in one
assignment per field (`AgentRows.write_rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.storage.next_values import as_rows

if TYPE_CHECKING:
    from flexibuff_envs.storage import Storage

#: ``reduce(rewards, active)``: a row's team reward from its agents' rewards ``[n_agents]`` and
#: who acted in it
Reduce = Callable[[np.ndarray, np.ndarray], Any]


class AgentRows:
    """Agent ``agent``'s values in its rows, besides its next values: its action (``action``'s
    heads), its reward and end flags, and whether it acted."""

    def __init__(self, storage: Storage, agent: int, action: ActionCodec) -> None:
        dim = action.continuous_dim
        self._discrete = storage.ensure("discrete_actions")[agent] if action.cardinalities else None
        self._continuous = storage.ensure("continuous_actions")[agent][:, :dim] if dim else None
        self._put_action = action.writer(
            np.zeros((0, 0)) if self._discrete is None else self._discrete,
            np.zeros((0, 0)) if self._continuous is None else self._continuous,
        )
        self._action = action
        # a row's heads as one value: many rows are moved several times faster so
        self._discrete_rows = None if self._discrete is None else as_rows(self._discrete)
        self._rewards = storage.ensure("individual_rewards")[agent]
        self._terminated = storage.ensure("terminated")[agent]
        self._truncated = storage.ensure("truncated")[agent]
        self._active = storage.ensure("active")[agent]

    def write(self, row: int, action: Any, reward: float, terminated: Any, truncated: Any) -> None:
        """The agent acted in ``row``: ``action`` (checked against its space: `EnvValueError`
        before anything is written), ``reward`` and the end flags."""
        self._put_action(row, action)
        self._rewards[row] = reward
        self._terminated[row] = terminated
        self._truncated[row] = truncated
        self._active[row] = True

    def run_on(self, row: int, reward: float, terminated: Any, truncated: Any) -> None:
        """The agent's transition in ``row`` runs on through a step it sat out: ``reward`` is
        added, and the end flags are that step's."""
        self._rewards[row] += reward
        self._terminated[row] = terminated
        self._truncated[row] = truncated

    def add_reward(self, row: int, reward: float) -> None:
        """``reward`` added to the agent's in ``row`` (it received it without a transition)."""
        self._rewards[row] += reward

    def truncate(self, row: int | np.ndarray) -> None:
        """The agent's episode was cut after ``row`` (or each of the rows ``row``)."""
        self._truncated[row] = True

    def acted(self, rows: np.ndarray) -> np.ndarray:
        """The rows among ``rows`` (in order) in which the agent acted."""
        return rows[self._active[rows]]

    def action_stager(self, n: int) -> tuple[np.ndarray, np.ndarray, Callable[[int, Any], None]]:
        """``n`` staged actions in their stored form (discrete heads, continuous values) and the
        writer that checks and puts one into a staged row: what `write_rows` takes."""
        discrete = np.zeros((n, len(self._action.cardinalities)), dtype=np.int64)
        continuous = np.zeros((n, self._action.continuous_dim), dtype=np.float32)
        return discrete, continuous, self._action.writer(discrete, continuous)

    def write_rows(
        self,
        rows: int | slice | np.ndarray,
        discrete: np.ndarray,
        continuous: np.ndarray,
        rewards: Any,
        terminated: np.ndarray | bool,
        truncated: np.ndarray | bool,
    ) -> None:
        """Transitions into ``rows`` (a row, a slice or indices), one assignment per field:
        actions in their stored form (``[len(rows), heads]``, ``[len(rows), dim]``), rewards and
        end flags (a value each, or one for all). The agent is not marked active: the rows of a buffer
        with one agent always are."""
        if self._discrete is not None:
            if isinstance(rows, np.ndarray):
                self._discrete_rows[rows] = as_rows(discrete)  # type: ignore[index]
            else:
                self._discrete[rows] = discrete
        if self._continuous is not None:
            self._continuous[rows] = continuous
        self._rewards[rows] = rewards
        self._terminated[rows] = terminated
        self._truncated[rows] = truncated


class TeamRows:
    """The team reward of a lane's rows (``global_rewards``): its agents' rewards summed as they
    are written, or ``reduce`` of them once a row is whole."""

    def __init__(self, storage: Storage, reduce: Reduce | None) -> None:
        self._values = storage.ensure("global_rewards")
        self._reduce = reduce
        if reduce is not None:
            self._rewards, self._active = storage.ensure("individual_rewards"), storage.ensure("active")

    def start(self, row: int) -> None:
        """``row`` is new: no agent's reward is in it yet."""
        self._values[row] = 0.0

    def set(self, rows: int | slice | np.ndarray, rewards: Any) -> None:
        """The team rewards of ``rows`` are ``rewards`` (one agent's: the team's)."""
        self._values[rows] = rewards

    def add(self, row: int, reward: float) -> None:
        """An agent's ``reward`` in ``row`` counts for the team's (summing)."""
        self._values[row] += reward

    def reduce(self, row: int) -> None:
        """``row``'s team reward from its agents' rewards, now that they are written."""
        self._values[row] = self._reduce(self._rewards[:, row], self._active[:, row])  # type: ignore[misc]


class FieldRows:
    """A field given beside the env's values (an annotation, a field of your own): one value
    per agent and row, or per row for a global field; ``missing`` where it was not given."""

    def __init__(self, storage: Storage, name: str, width: int | None) -> None:
        self._values = storage.ensure(name, width=width)
        self.per_agent = storage.fields[name].per_agent
        self.missing = storage.fill(name)
        self.dtype = self._values.dtype
        #: one value's shape (an agent's, or the row's for a global field)
        self.shape: tuple[int, ...] = self._values.shape[2 if self.per_agent else 1 :]

    def write(self, row: int, agent: int, value: Any) -> None:
        """Agent ``agent``'s value in ``row`` (of the row itself for a global field)."""
        if self.per_agent:
            self._values[agent, row] = value
        else:
            self._values[row] = value

    def write_rows(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Values of ``rows`` of a single-agent lane, one per row."""
        if self.per_agent:
            self._values[0][rows] = values
        else:
            self._values[rows] = values


def add_feedback(storage: Storage, row: int, agent: int, value: float) -> None:
    """A human reward for agent ``agent`` in ``row``: added to its auxiliary reward and the team's."""
    storage.ensure("individual_auxiliary_rewards")[agent, row] += value
    storage.ensure("global_auxiliary_rewards")[row] += value
