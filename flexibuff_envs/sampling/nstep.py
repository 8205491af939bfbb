"""n-step windows: which rows each drawn row's n-step return sums, per agent, inside its episode.

An agent's window starts at the drawn row and takes its next active rows in the same episode
until it holds ``n`` steps, or the agent's step that terminated or truncated it, or the newest
row recorded (a running episode). The team's window (global rewards, ``state_``) is the
episode's next ``n`` rows. All of it is a fixed number of numpy passes over ``[agents, width,
batch]`` arrays; a window that needs more rows than ``width`` (an agent sitting many rows out)
doubles ``width`` for the whole batch and looks again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.storage.fields import DECODED

if TYPE_CHECKING:
    from flexibuff_envs.index.lanes import Lane
    from flexibuff_envs.storage import Storage


@dataclass(frozen=True)
class Windows:
    """The windows of a batch of ``B`` rows, ``W`` rows wide, for ``A`` agents. The window's
    steps lead (``[W, B]``, ``[A, W, B]``): a pass along a window is then one over whole rows
    of ``B`` values, which numpy does in a few calls of its inner loop."""

    #: ``[W, B]`` the rows from each drawn row on (past its episode's end: its last row again)
    rows: np.ndarray
    #: ``[A, W, B]`` inside each agent's window
    mine: np.ndarray
    #: ``[A, W, B]`` each included row's step number in its agent's window, from 0
    step: np.ndarray
    #: ``[B]`` rows of the team's window: the episode's next ``n`` rows, fewer where it ends first
    team_steps: np.ndarray

    def team(self) -> np.ndarray:
        """``[W, B]`` inside the team's window."""
        return np.arange(self.rows.shape[0])[:, None] < self.team_steps

    def team_last(self) -> np.ndarray:
        """``[B]`` the team window's last row."""
        return self.rows[self.team_steps - 1, np.arange(self.rows.shape[1])]

    def agent_last(self) -> np.ndarray:
        """``[A, B]`` each agent's last row of each window."""
        last = np.where(self.mine, np.arange(self.rows.shape[0])[:, None], -1).max(axis=1)
        return self.rows[last, np.arange(self.rows.shape[1])]


def episode_ends(lanes: Sequence[Lane], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each live row's position in its lane and the end position of its episode."""
    capacity = lanes[0].capacity
    if len(lanes) == 1:
        return _ends(lanes[0], 0, rows)
    which = rows // capacity
    position = np.empty(rows.shape, dtype=np.int64)
    end = np.empty(rows.shape, dtype=np.int64)
    for lane_index in np.flatnonzero(np.bincount(which)).tolist():  # a pass per lane drawn from, not per row
        pick = which == lane_index
        position[pick], end[pick] = _ends(lanes[lane_index], lane_index, rows[pick])
    return position, end


def _ends(lane: Lane, lane_index: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    position = lane.live_start + (rows - lane.offset - lane.live_start) % lane.capacity
    if (position >= lane.written).any():
        raise InvalidArgumentError(
            f"n_step: idx holds rows of lane {lane_index} that are not recorded; "
            "give rows of a batch drawn from this buffer"
        )
    starts, ends = lane.bounds()
    return position, ends[np.searchsorted(starts, position, side="right") - 1]


def windows(
    lanes: Sequence[Lane], rows: np.ndarray, n: int, active: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
) -> Windows:
    """The n-step windows of live ``rows`` (``[B]``); ``active``, ``terminated`` and
    ``truncated`` are the buffer's ``[A, rows]`` flags."""
    capacity = lanes[0].capacity
    position, end = episode_ends(lanes, rows)
    room = end - position  # rows from the drawn one to its episode's end, itself included
    past = rows - rows % capacity + capacity  # the row after each lane's last
    width = n
    while True:
        steps = np.arange(width)[:, None]
        inside = steps < room
        window = rows + np.minimum(steps, room - 1)
        window -= capacity * (window >= past)  # round the lane's ring
        acts = active.take(window, axis=1)
        acts &= inside
        acts[:, 0] = True  # the drawn row is the window's first step, whoever acted
        count = acts.cumsum(axis=1)
        mine = acts & (count <= n)
        ended = (terminated.take(window, axis=1) | truncated.take(window, axis=1)) & mine
        stopped = ended.any(axis=1)
        if stopped.any():
            mine &= (ended.cumsum(axis=1) - ended) == 0  # nothing after the agent's last step
        short = count[:, -1] < n
        if not (short.any() and (short & ~stopped & (room > width)).any()):
            return Windows(window, mine, count - 1, np.minimum(n, room))
        width *= 2  # an agent sat rows out: look further


def discounted_sum(rewards: np.ndarray, inside: np.ndarray, step: np.ndarray, gamma: float) -> np.ndarray:
    """``sum_k gamma**k r_k`` over the rows ``inside`` each window (the window's axis, 1 for
    ``[A, W, B]``, 0 for ``[W, B]``)."""
    powers = gamma ** np.arange(inside.shape[-2], dtype=np.float64)
    return (np.where(inside, rewards, 0.0) * powers.take(step)).sum(axis=-2)


def gather(storage: Storage, w: Windows, gamma: float, wanted: Collection[str] | None = None) -> dict[str, Any]:
    """The n-step fields of ``storage``'s windows ``w`` (`flexibuff_envs.sampling.nstep`): each agent's discounted
    reward sum, the next values and flags after its window's last step, ``discounts``
    (``gamma ** k`` for its ``k`` steps) and ``n_steps`` (``k``); the team's reward sum and
    ``state_`` after its window."""
    arrays = storage.arrays
    single = storage.spec.n_agents == 1
    agent_last = w.agent_last()
    out: dict[str, Any] = {}

    def own(value: np.ndarray) -> np.ndarray:
        return value[0] if single else value

    def want(name: str) -> bool:
        return (wanted is None or name in wanted) and (name in arrays or name in storage.chains)

    if want("individual_rewards"):
        rewards = arrays["individual_rewards"].take(w.rows, axis=1)
        out["individual_rewards"] = own(discounted_sum(rewards, w.mine, w.step, gamma).astype(np.float32))
    if want("global_rewards"):
        steps = np.broadcast_to(np.arange(w.rows.shape[0])[:, None], w.rows.shape)
        out["global_rewards"] = discounted_sum(arrays["global_rewards"].take(w.rows), w.team(), steps, gamma).astype(
            np.float32
        )
    agents = np.arange(storage.spec.n_agents)[:, None]
    for name in ("terminated", "truncated"):
        if want(name):  # indexed, not flattened: a mapped log's columns are not contiguous
            out[name] = own(arrays[name][agents, agent_last])
    steps = w.mine.sum(axis=1)
    if wanted is None or "discounts" in wanted:
        out["discounts"] = own((gamma**steps).astype(np.float32))
    if wanted is None or "n_steps" in wanted:
        out["n_steps"] = own(steps.astype(np.int64))
    for name, chain in storage.chains.items():
        if not want(name):
            continue
        if not chain.per_agent:
            team_last = w.team_last()
            out[name] = chain.gather(team_last, *storage.successors(team_last))
        elif single or (agent_last == agent_last[0]).all():  # every agent's window ends alike
            out[name] = chain.gather(agent_last[0], *storage.successors(agent_last[0]), 0 if single else None)
        else:
            out[name] = np.stack(
                [chain.gather(last, *storage.successors(last), agent) for agent, last in enumerate(agent_last)]
            )
        if name in DECODED:
            out[name] = storage.decode(name, out[name])
    return out
