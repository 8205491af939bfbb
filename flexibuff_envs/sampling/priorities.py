"""Prioritized replay (Schaul et al. 2016): a sum tree over a buffer's rows, and their minimum.

A leaf holds its row's ``priority ** alpha`` (0 for a row that is not recorded). Every operation
on a batch of rows is a fixed number of numpy calls, whatever the batch size, and no Python loop
runs over rows:

- a draw takes its targets in sorted order, so every read below runs forward in memory (the
  rows are handed out in the order drawn). It finds each target's node at level 11 (2,048
  nodes) with one ``np.searchsorted`` over that level's prefix sums, then descends the rest of
  the sum tree for the whole batch at once, one pass of five branch-free numpy calls per level
  (9 more for a million rows). The levels above level 11 are never read, so they are not kept;
- an update sets the changed leaves and adds each one's difference to its kept ancestors in one
  ``np.add.at`` over ``[levels, batch]`` indices. The sums are rebuilt exactly, in one pass per
  level over the whole tree, once as many leaves have changed as the tree has, so float error
  cannot build up;
- the minimum (the largest importance weight) is kept as the smallest positive leaf (a row at
  priority 0 is never drawn, so it weighs nothing) and how many leaves hold it. Only when the
  last of them rises or leaves is it found again: from the minima of blocks of 128 leaves. A
  leaf that falls below its block's minimum lowers it at once; only blocks whose minimum's
  holder changed since the last search are looked at again.

The tree follows the lanes by comparing what each lane held when it last looked with what it
holds now: rows forgotten since can never be drawn, and rows recorded since get the highest
priority seen so far.

Its arrays cost memory only where written (`zeroed`), and nothing passes over all of them
until as many leaves have changed as the tree has: a tree over a huge ring of which few rows
are used (a loaded file's) costs memory for those rows.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.index.lanes import Lane, lane_offsets, span_rows
from flexibuff_envs.storage.next_values import zeroed

#: prioritized replay's exponent unless one is given (and in files written before it was kept)
ALPHA = 0.6


def check_alpha(alpha: float, name: str = "alpha") -> float:
    """Return ``alpha`` as a float, or raise InvalidArgumentError unless it is a finite number >= 0."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha < math.inf:
        raise InvalidArgumentError(f"{name} must be a finite number >= 0, got {alpha!r}")
    return float(alpha)


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
        self.top = min(TOP, self.depth)  # the level a draw searches; the ones above are not kept
        # node i's children are 2i and 2i + 1; the leaves from ``leaves`` on
        self.sums = zeroed((2 * self.leaves,), np.float64)
        self.live = zeroed((self.leaves,), bool)
        self.max_priority = 1.0  # new rows get the highest priority seen so far
        self._min = np.inf  # the smallest positive leaf (inf: none); only recorded rows have one
        self._at_min = 0  # live leaves holding it; 0 while rows are live: to be found again
        self._block = min(BLOCK, self.leaves)
        # each block's smallest positive leaf (0: it has none), unless a leaf holding it changed since
        self._block_min = zeroed((self.leaves // self._block,), np.float64)
        self._dirty = zeroed((self.leaves // self._block,), bool)
        self._changed = 0  # leaves changed since the sums were last built exactly
        self._ancestors = np.arange(1, self.depth - self.top + 1)[:, None]  # shifts from a leaf to its kept ancestors
        self._known = [(0, 0)] * lanes  # per lane: (live_start, written) when last seen

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self.sums[1 << self.top : 2 << self.top].sum())

    @classmethod
    def restore(cls, leaves: np.ndarray, lanes: Sequence[Lane], alpha: float, max_priority: float) -> PriorityTree:
        """The tree of a loaded buffer: ``leaves`` (``priority ** alpha`` per buffer row, as
        `leaf_values` gave them) over the live rows of ``lanes``."""
        tree = cls(leaves.size, len(lanes), alpha)
        tree._known = [(lane.live_start, lane.written) for lane in lanes]
        rows = span_rows(lane_offsets(lanes), lanes[0].capacity, *np.array(tree._known, dtype=np.int64).T)
        tree.live[rows] = True
        tree.sums[tree.leaves + rows] = leaves[rows]
        tree._dirty[np.unique(rows // tree._block)] = True
        if 2 * rows.size > tree.leaves:
            tree._rebuild()
        else:  # only the paths above the rows held: a file's few rows in a huge ring cost no more
            nodes = rows + tree.leaves
            while nodes.size and nodes[0] >= 2 << tree.top:
                nodes = np.unique(nodes >> 1)
                tree.sums[nodes] = tree.sums[2 * nodes] + tree.sums[2 * nodes + 1]
        tree.max_priority = max_priority
        return tree

    def leaf_values(self, rows: int) -> np.ndarray:
        """``priority ** alpha`` of each of the first ``rows`` rows (0 where not recorded)."""
        return self.sums[self.leaves : self.leaves + rows]

    def _rebuild(self) -> None:
        """Every kept sum from the leaves up, exactly."""
        level = self.leaves
        while level > 1 << self.top:
            self.sums[level // 2 : level] = self.sums[level : 2 * level : 2] + self.sums[level + 1 : 2 * level : 2]
            level //= 2
        self._changed = 0

    def minimum(self) -> float:
        """The smallest positive leaf (inf when none is): rows not recorded hold 0."""
        if self._at_min == 0:
            leaves = self.sums[self.leaves :].reshape(-1, self._block)
            changed = np.flatnonzero(self._dirty)
            if changed.size:
                block = leaves[changed]
                self._block_min[changed] = np.where(block > 0, block, np.inf).min(axis=1)
                self._block_min[changed[np.isinf(self._block_min[changed])]] = 0.0
                self._dirty[changed] = False
            held = self._block_min[self._block_min > 0]
            self._min = float(held.min()) if held.size else np.inf
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
            self._at_min -= int(np.count_nonzero(old == self._min))
            lowest = float(values.min()) if live else np.inf
            if lowest <= 0:  # rows at priority 0 do not count
                lowest = float(values[values > 0].min(initial=np.inf))
            if lowest < self._min:
                self._min, self._at_min = lowest, int(np.count_nonzero(values == lowest))
            elif live:
                self._at_min += int(np.count_nonzero(values == self._min))
        blocks = rows // self._block
        self._dirty[blocks[old == self._block_min[blocks]]] = True  # its minimum may rise: looked at again
        positive = values > 0  # a fall is known at once
        lowered = blocks[positive]
        self._block_min[lowered[self._block_min[lowered] == 0]] = np.inf
        np.minimum.at(self._block_min, lowered, values[positive])
        self._changed += rows.size
        self.sums[node] = values
        if rows.size * self._ancestors.size > self.leaves or self._changed > self.leaves:
            self._rebuild()  # many leaves at once, or enough float error risked: all of it exactly
        elif self._ancestors.size:
            deltas = np.repeat((values - old)[None], self._ancestors.size, axis=0)
            np.add.at(self.sums, (node >> self._ancestors).ravel(), deltas.ravel())

    def sync(self, lanes: Sequence[Lane]) -> None:
        """Follow the lanes: rows forgotten since the last look leave, rows recorded since join
        with the highest priority seen so far."""
        now = [(lane.live_start, lane.written) for lane in lanes]
        if now == self._known:
            return
        offsets, capacity = lane_offsets(lanes), lanes[0].capacity
        kept_from, kept_to = np.array(self._known, dtype=np.int64).T
        live_from, written = np.array(now, dtype=np.int64).T
        gone = span_rows(offsets, capacity, kept_from, np.minimum(live_from, kept_to))
        if gone.size:
            self._set(gone, np.zeros(gone.size), live=False)
        new = span_rows(offsets, capacity, np.maximum(kept_to, live_from), written)
        if new.size:
            self._set(new, np.full(new.size, self.max_priority**self.alpha), live=True)
        self._known = now

    def update(self, rows: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities of recorded ``rows`` (rows no longer recorded are left out; of a row
        given twice, the last)."""
        order = np.argsort(rows, kind="stable")  # equal rows keep the order given
        rows, priorities = rows[order], priorities[order]
        keep = self.live[rows]
        keep[:-1] &= rows[:-1] != rows[1:]  # of a row given twice the later, last of its run
        rows, priorities = rows[keep], priorities[keep]
        if rows.size:
            self.max_priority = max(self.max_priority, float(priorities.max()))
            self._set(rows, priorities**self.alpha, live=True)

    def draw(self, rng: np.random.Generator, n: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``n`` rows drawn with replacement in proportion to their leaves (one descent of the sum
        tree for all of them at once), and their importance-sampling weights
        ``(N P(i)) ** -beta / max``, which is ``(p_i / p_min) ** -beta``."""
        rows = self._descend(rng, n)
        leaf = self.sums.take(rows + self.leaves)
        empty = leaf <= 0
        if empty.any():  # an edge of float rounding: exact sums, and those drawn again
            self._rebuild()
            while empty.any():
                rows[empty] = self._descend(rng, int(empty.sum()))
                empty = self.sums[rows + self.leaves] <= 0
            leaf = self.sums.take(rows + self.leaves)
        return rows, ((leaf / self.minimum()) ** -beta).astype(np.float32)

    def _descend(self, rng: np.random.Generator, n: int) -> np.ndarray:
        level = self.sums[1 << self.top : 2 << self.top]
        below = np.cumsum(level)  # each node's prefix sum, its own included
        total = below[-1]
        target = rng.random(n)
        order = np.argsort(target)  # searched in tree order (the reads below then run forward in memory)
        target = np.minimum(target.take(order) * total, np.nextafter(total, 0))
        node = np.minimum(np.searchsorted(below, target, side="right"), level.size - 1)
        target -= below[node] - level[node]
        node += 1 << self.top
        for _ in range(self.depth - self.top):  # without branches: the rows' paths are random
            node <<= 1
            left = self.sums.take(node)
            right = target >= left
            left *= right
            target -= left
            node += right
        rows = np.empty_like(node)
        rows[order] = node - self.leaves  # handed out in the order drawn
        return rows
