"""Prioritized replay (Schaul et al. 2016): sum and min trees over a buffer's rows.

A leaf holds its row's ``priority ** alpha`` (0 for a row that is not recorded). Every operation
on a batch of rows is a fixed number of numpy passes per tree level (about 20 levels for a million
rows): no Python loop over rows. The trees follow the lanes by comparing what each lane held when
they last looked with what it holds now: rows forgotten since can never be drawn, and rows
recorded since get the highest priority seen so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flexibuff_envs.episodes import Lane, spans


class PriorityTree:
    """Priorities of the rows of a buffer of ``rows`` rows in ``lanes`` lanes."""

    def __init__(self, rows: int, lanes: int, alpha: float) -> None:
        self.alpha = alpha
        self.leaves = 1 << max(1, (rows - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        self.sums = np.zeros(2 * self.leaves)
        self.mins = np.full(2 * self.leaves, np.inf)  # a row not recorded never is the minimum
        self.live = np.zeros(self.leaves, dtype=bool)
        self.max_priority = 1.0  # new rows get the highest priority seen so far
        self._known = np.zeros((2, lanes), dtype=np.int64)  # per lane: live_start, written when last seen

    @classmethod
    def restore(cls, leaves: np.ndarray, lanes: Sequence[Lane], alpha: float, max_priority: float) -> PriorityTree:
        """The trees of a loaded buffer: ``leaves`` (``priority ** alpha`` per buffer row, as
        `leaf_values` gave them) over the live rows of ``lanes``; every level built in one pass."""
        tree = cls(leaves.size, len(lanes), alpha)
        live_from = np.array([lane.live_start for lane in lanes], dtype=np.int64)
        written = np.array([lane.written for lane in lanes], dtype=np.int64)
        positions, which = spans(live_from, written)
        rows = np.array([lane.offset for lane in lanes], dtype=np.int64)[which] + positions % lanes[0].capacity
        tree.live[rows] = True
        tree.sums[rows + tree.leaves] = leaves[rows]
        tree.mins[rows + tree.leaves] = leaves[rows]
        level = tree.leaves
        while level > 1:  # each level from the one below, all its nodes at once
            parents = np.arange(level // 2, level)
            tree.sums[parents] = tree.sums[2 * parents] + tree.sums[2 * parents + 1]
            tree.mins[parents] = np.minimum(tree.mins[2 * parents], tree.mins[2 * parents + 1])
            level //= 2
        tree.max_priority = max_priority
        tree._known = np.stack([live_from, written])
        return tree

    def leaf_values(self, rows: int) -> np.ndarray:
        """``priority ** alpha`` of each of the first ``rows`` rows (0 where not recorded)."""
        return self.sums[self.leaves:self.leaves + rows]

    def _set(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Leaves ``rows`` hold ``values`` (``priority ** alpha``; 0 and not live: never drawn)."""
        node = rows + self.leaves
        self.sums[node] = values
        self.mins[node] = np.where(self.live[rows], values, np.inf)
        for _ in range(self.depth):  # every leaf is as deep: each level is one pass
            node = node >> 1
            left = 2 * node
            self.sums[node] = self.sums[left] + self.sums[left + 1]
            self.mins[node] = np.minimum(self.mins[left], self.mins[left + 1])

    def sync(self, lanes: Sequence[Lane]) -> None:
        """Follow the lanes: rows forgotten since the last look leave, rows recorded since join
        with the highest priority seen so far."""
        now = np.array([[lane.live_start for lane in lanes], [lane.written for lane in lanes]], dtype=np.int64)
        if (now == self._known).all():
            return
        offsets = np.array([lane.offset for lane in lanes], dtype=np.int64)
        capacity = lanes[0].capacity
        (kept_from, kept_to), (live_from, written) = self._known, now
        gone, which = spans(kept_from, np.minimum(live_from, kept_to))
        rows = offsets[which] + gone % capacity
        self.live[rows] = False
        self._set(rows, np.zeros(rows.size))
        new, which = spans(np.maximum(kept_to, live_from), written)
        rows = offsets[which] + new % capacity
        self.live[rows] = True
        self._set(rows, np.full(rows.size, self.max_priority ** self.alpha))
        self._known = now

    def update(self, rows: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities of recorded ``rows`` (rows no longer recorded are left out)."""
        keep = self.live[rows]
        rows, priorities = rows[keep], priorities[keep]
        if rows.size:
            self.max_priority = max(self.max_priority, float(priorities.max()))
            self._set(rows, priorities ** self.alpha)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` rows drawn with replacement in proportion to their leaves: one descent of the sum
        tree for all of them at once."""
        total = self.sums[1]
        target = np.minimum(rng.random(n) * total, np.nextafter(total, 0))
        node = np.ones(n, dtype=np.int64)
        for _ in range(self.depth):
            left = self.sums[2 * node]
            right = target >= left
            target = target - left * right
            node = 2 * node + right
        rows = node - self.leaves
        empty = self.sums[node] <= 0  # a float edge landed on an empty leaf: its live neighbour's instead
        if empty.any():
            rows[empty] = self.draw(rng, int(empty.sum()))
        return rows

    def weights(self, rows: np.ndarray, beta: float) -> np.ndarray:
        """Importance-sampling weights ``(N P(i)) ** -beta / max``: ``(p_i / p_min) ** -beta``."""
        return ((self.sums[rows + self.leaves] / self.mins[1]) ** -beta).astype(np.float32)
