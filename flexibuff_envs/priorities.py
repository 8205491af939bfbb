"""Prioritized replay (Schaul et al. 2016): a sum tree over a buffer's rows, and their minimum.

A leaf holds its row's ``priority ** alpha`` (0 for a row that is not recorded). Every operation
on a batch of rows is a fixed number of numpy calls, whatever the batch size, and no Python loop
runs over rows:

- a draw finds each target's node at level 11 (2,048 nodes) with one ``np.searchsorted`` over
  that level's prefix sums, then descends the rest of the sum tree for the whole batch at once,
  one pass per level (9 more for a million rows: a level costs five numpy calls, so searching
  the top 11 at once makes a draw about a quarter cheaper);
- an update adds each changed leaf's difference to all its ancestors in one ``np.add.at`` over
  ``[levels, batch]`` indices. The sums are rebuilt exactly, in one pass per level over the whole
  tree, once as many leaves have changed as the tree has, so float error cannot build up;
- the minimum (the largest importance weight) is kept as the smallest positive leaf (a row at
  priority 0 is never drawn, so it weighs nothing) and how many leaves hold it. Only when the last of them rises or leaves is it found again: from the minima
  of blocks of 128 leaves, of which only the blocks changed since the last search are looked at.

The tree follows the lanes by comparing what each lane held when it last looked with what it
holds now: rows forgotten since can never be drawn, and rows recorded since get the highest
priority seen so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flexibuff_envs.episodes import Lane, spans

#: prioritized replay's exponent unless one is given (and in files written before it was kept)
ALPHA = 0.6
#: leaves a block of the minimum's search holds (fewer in a smaller tree)
BLOCK = 128
#: the tree level a draw searches directly (its nodes' prefix sums); below it, it descends
TOP = 11


class PriorityTree:
    """Priorities of the rows of a buffer of ``rows`` rows in ``lanes`` lanes."""

    def __init__(self, rows: int, lanes: int, alpha: float) -> None:
        self.alpha = alpha
        self.leaves = 1 << max(1, (rows - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        self.sums = np.zeros(2 * self.leaves)
        self.live = np.zeros(self.leaves, dtype=bool)
        self.max_priority = 1.0  # new rows get the highest priority seen so far
        self._min = np.inf  # the smallest positive leaf (inf: none); only recorded rows have one
        self._at_min = 0  # live leaves holding it; 0 while rows are live: to be found again
        self._block = min(BLOCK, self.leaves)
        self._block_min = np.full(self.leaves // self._block, np.inf)  # each block's smallest positive leaf,
        self._dirty = np.ones(self.leaves // self._block, dtype=bool)  # unless changed since
        self._changed = 0  # leaves changed since the sums were last built exactly
        self._ancestors = np.arange(self.depth + 1)[:, None]  # shifts from a leaf to each ancestor, itself first
        self._stamp = np.zeros(self.leaves, dtype=np.int32)  # scratch: which position of a batch set a row last
        self._known = np.zeros((2, lanes), dtype=np.int64)  # per lane: live_start, written when last seen

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self.sums[1])

    @classmethod
    def restore(cls, leaves: np.ndarray, lanes: Sequence[Lane], alpha: float, max_priority: float) -> PriorityTree:
        """The tree of a loaded buffer: ``leaves`` (``priority ** alpha`` per buffer row, as
        `leaf_values` gave them) over the live rows of ``lanes``."""
        tree = cls(leaves.size, len(lanes), alpha)
        live_from = np.array([lane.live_start for lane in lanes], dtype=np.int64)
        written = np.array([lane.written for lane in lanes], dtype=np.int64)
        positions, which = spans(live_from, written)
        rows = np.array([lane.offset for lane in lanes], dtype=np.int64)[which] + positions % lanes[0].capacity
        tree.live[rows] = True
        tree.sums[tree.leaves + rows] = leaves[rows]
        tree._rebuild()
        tree.max_priority = max_priority
        tree._known = np.stack([live_from, written])
        return tree

    def leaf_values(self, rows: int) -> np.ndarray:
        """``priority ** alpha`` of each of the first ``rows`` rows (0 where not recorded)."""
        return self.sums[self.leaves:self.leaves + rows]

    def _rebuild(self) -> None:
        """Every sum from the leaves up, exactly."""
        level = self.leaves
        while level > 1:
            self.sums[level // 2:level] = self.sums[level:2 * level:2] + self.sums[level + 1:2 * level:2]
            level //= 2
        self._changed = 0

    def minimum(self) -> float:
        """The smallest positive leaf (inf when none is): rows not recorded hold 0."""
        if self._at_min == 0:
            leaves = self.sums[self.leaves:].reshape(-1, self._block)
            changed = np.flatnonzero(self._dirty)
            if changed.size:
                block = leaves[changed]
                self._block_min[changed] = np.where(block > 0, block, np.inf).min(axis=1)
                self._dirty[changed] = False
            self._min = float(self._block_min.min())
            if self._min < np.inf:
                holders = np.flatnonzero(self._block_min == self._min)
                self._at_min = int(np.count_nonzero(leaves[holders] == self._min))
        return self._min

    def _set(self, rows: np.ndarray, values: np.ndarray, live: bool) -> None:
        """Leaves of distinct ``rows`` hold ``values`` (``priority ** alpha``), and are recorded
        rows or (``live=False``, values 0) no longer."""
        node = rows + self.leaves
        old = self.sums[node]
        self.live[rows] = live
        if self._at_min:  # keep the minimum and its count in step (0: found again when asked)
            leaving = int(np.count_nonzero(old == self._min))
            positive = values[values > 0] if live else values[:0]
            lowest = float(positive.min()) if positive.size else np.inf
            if lowest < self._min:
                self._min, self._at_min = lowest, int(np.count_nonzero(values == lowest))
            else:
                self._at_min += (int(np.count_nonzero(values == self._min)) if live else 0) - leaving
        self._dirty[rows // self._block] = True
        self._changed += rows.size
        if rows.size * self.depth > self.leaves or self._changed > self.leaves:
            self.sums[node] = values
            self._rebuild()  # many leaves at once, or enough float error risked: all of it exactly
            return
        np.add.at(self.sums, (node >> self._ancestors).ravel(), np.tile(values - old, self.depth + 1))
        self.sums[node] = values  # the leaves exact, whatever the additions rounded

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
        if gone.size:
            self._set(offsets[which] + gone % capacity, np.zeros(gone.size), live=False)
        new, which = spans(np.maximum(kept_to, live_from), written)
        if new.size:
            self._set(offsets[which] + new % capacity, np.full(new.size, self.max_priority ** self.alpha), live=True)
        self._known = now

    def update(self, rows: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities of recorded ``rows`` (rows no longer recorded are left out; of a row
        given twice, the last)."""
        order = np.arange(rows.size, dtype=np.int32)
        self._stamp[rows] = order  # of a row given twice the later position stays (numpy assigns in order)
        keep = (self._stamp[rows] == order) & self.live[rows]
        rows, priorities = rows[keep], priorities[keep]
        if rows.size:
            self.max_priority = max(self.max_priority, float(priorities.max()))
            self._set(rows, priorities ** self.alpha, live=True)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` rows drawn with replacement in proportion to their leaves: one descent of the sum
        tree for all of them at once."""
        rows = self._descend(rng, n)
        empty = self.sums[rows + self.leaves] <= 0
        if empty.any():  # an edge of float rounding: exact sums, and those drawn again
            self._rebuild()
            while empty.any():
                rows[empty] = self._descend(rng, int(empty.sum()))
                empty = self.sums[rows + self.leaves] <= 0
        return rows

    def _descend(self, rng: np.random.Generator, n: int) -> np.ndarray:
        top = min(TOP, self.depth)
        level = self.sums[1 << top:2 << top]
        below = np.cumsum(level)  # each node's prefix sum, its own included
        total = below[-1]
        target = np.minimum(rng.random(n) * total, np.nextafter(total, 0))
        first = np.minimum(np.searchsorted(below, target, side="right"), level.size - 1)
        target -= below[first] - level[first]
        node = first + (1 << top)
        for _ in range(self.depth - top):
            node <<= 1
            left = self.sums.take(node)
            right = target >= left
            np.subtract(target, left, out=target, where=right)
            node += right
        return node - self.leaves

    def weights(self, rows: np.ndarray, beta: float) -> np.ndarray:
        """Importance-sampling weights ``(N P(i)) ** -beta / max``: ``(p_i / p_min) ** -beta``."""
        return ((self.sums[rows + self.leaves] / self.minimum()) ** -beta).astype(np.float32)
