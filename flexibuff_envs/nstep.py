"""n-step windows: which rows each drawn row's n-step return sums, per agent, inside its episode.

An agent's window starts at the drawn row and takes its next active rows in the same episode
until it holds ``n`` steps, or the agent's step that terminated or truncated it, or the newest
row recorded (a running episode). The team's window (global rewards, ``state_``) is the
episode's next ``n`` rows. All of it is a fixed number of numpy passes over ``[agents, batch,
width]`` arrays; a window that needs more rows than ``width`` (an agent sitting many rows out)
doubles ``width`` for the whole batch and looks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from flexibuff_envs.episodes import Lane


@dataclass(frozen=True)
class Windows:
    """The windows of a batch of ``B`` rows, ``W`` rows wide, for ``A`` agents."""

    #: ``[B, W]`` the rows from each drawn row on (past its episode's end: its last row again)
    rows: np.ndarray
    #: ``[B, W]`` inside the team's window (the episode's next ``n`` rows)
    team: np.ndarray
    #: ``[A, B, W]`` inside each agent's window
    mine: np.ndarray
    #: ``[A, B, W]`` each included row's step number in its agent's window, from 0
    step: np.ndarray
    #: ``[B]`` the team window's last row
    team_last: np.ndarray


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
        raise ValueError(f"n_step: idx holds rows of lane {lane_index} that are not recorded; "
                         "give rows of a batch drawn from this buffer")
    starts, ends = lane.bounds()
    return position, ends[np.searchsorted(starts, position, side="right") - 1]


def windows(lanes: Sequence[Lane], rows: np.ndarray, n: int, active: np.ndarray, terminated: np.ndarray,
            truncated: np.ndarray) -> Windows:
    """The n-step windows of live ``rows`` (``[B]``); ``active``, ``terminated`` and
    ``truncated`` are the buffer's ``[A, rows]`` flags."""
    capacity = lanes[0].capacity
    offset = rows - rows % capacity
    position, end = episode_ends(lanes, rows)
    width = n
    while True:
        ahead = position[:, None] + np.arange(width)
        inside = ahead < end[:, None]
        window = offset[:, None] + np.minimum(ahead, end[:, None] - 1) % capacity
        acts = active[:, window] & inside
        acts[:, :, 0] = True  # the drawn row is the window's first step, whoever acted
        count = np.cumsum(acts, axis=-1)
        mine = acts & (count <= n)
        ended = (terminated[:, window] | truncated[:, window]) & mine
        mine &= (np.cumsum(ended, axis=-1) - ended) == 0  # nothing after the agent's last step
        short = (count[..., -1] < n) & ~ended.any(-1) & (position + width < end)
        if not short.any():
            steps = np.minimum(n, end - position)
            team = np.arange(width) < steps[:, None]
            return Windows(window, team, mine, count - 1, window[np.arange(rows.size), steps - 1])
        width *= 2


def agent_last_rows(w: Windows) -> np.ndarray:
    """Each agent's last row of each window ``[A, B]``."""
    last = np.where(w.mine, np.arange(w.rows.shape[1]), -1).max(axis=-1)
    return w.rows[np.arange(w.rows.shape[0]), last]


def discounted_sum(rewards: np.ndarray, inside: np.ndarray, step: np.ndarray, gamma: float) -> np.ndarray:
    """``sum_k gamma**k r_k`` over the rows ``inside`` each window (the last axis)."""
    return np.where(inside, rewards * gamma ** step.astype(np.float64), 0.0).sum(axis=-1)
