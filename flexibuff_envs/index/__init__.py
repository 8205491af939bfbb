"""Which rows hold which episodes: `EpisodeIndex` and `EpisodeTable` here; a lane's ring and its
running episode (`lanes`); what an episode's end writes (`episode_ends`: `G` and GAE, whose
math is `returns`). Imports: `storage` and below.

The episode index: a buffer's lanes, which recorder writes each and what batch recorders
hold back (`EpisodeIndex`), and the episodes they hold as arrays (`EpisodeTable`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs.index.lanes import Episode, Lane, lane_offsets, span_rows
from flexibuff_envs.interrupts import holding


class EpisodeIndex:
    """A buffer's lanes, which recorder writes each, and what batch recorders hold back.

    Batch recorders (`BatchRecorder`) keep their lanes' newest steps to themselves until
    something reads the lanes: `change` and `read` commit them first (an explicit call, never a
    property), so a reader always sees every recorded step. `version` grows whenever the lanes are handed out to be changed,
    which tells a batch recorder to read them again.
    """

    def __init__(
        self,
        n_lanes: int,
        capacity: int,
        n_agents: int,
        on_forget: Callable[[Lane, Episode], None],
        on_open: Callable[[Lane, int], None],
    ) -> None:
        self.ring = [Lane(i * capacity, capacity, on_forget, n_agents, on_open) for i in range(n_lanes)]
        # per lane: the recorder writing it (a weak reference: a dropped recorder frees its lane)
        self.writers: list[weakref.ref[Any] | None] = [None] * n_lanes
        self.batched: list[Any] = []  # batch recorders, each with commit() and owner()
        self.uncommitted = False
        self._committing = False
        self.version = 0

    def change(self) -> list[Lane]:
        """The lanes to change, every staged step committed first (`commit`)."""
        self.commit()
        self.version += 1
        return self.ring

    def read(self) -> list[Lane]:
        """The lanes to read only (sampling, counting), every staged step committed first (`commit`)."""
        self.commit()
        return self.ring

    def commit(self) -> None:
        """Every batch recorder's staged steps into the lanes (ended episodes get their ``G``:
        the user's ``bootstrap_fn`` may run)."""
        if self.uncommitted:
            self._commit()

    @holding
    def _commit(self) -> None:
        if self._committing:  # reached again from inside a recorder's commit: it is under way
            return
        self._committing = True
        try:
            for batch in self.batched:
                batch.commit()
        finally:
            self._committing = False
        self.uncommitted = False


@dataclass(frozen=True)
class EpisodeTable:
    """Episodes of several lanes as arrays, lane by lane and oldest first: positions ``[starts,
    ends)`` in their lanes, and rows; ``origins`` (`origins.ORIGIN`), of ended ones."""

    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray  # of each one's lane
    capacity: int
    origins: np.ndarray | None = None

    def __len__(self) -> int:
        return self.starts.size

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    def rows(self, k: int) -> np.ndarray:
        """The buffer rows of the ``k``-th, in time order."""
        return self.offsets[k] + np.arange(self.starts[k], self.ends[k]) % self.capacity

    def all_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows of every one back to back, each in time order, and the position in them of
        each one's last row."""
        return span_rows(self.offsets, self.capacity, self.starts, self.ends), np.cumsum(self.lengths) - 1


def episode_table(lanes: Sequence[Lane], running: bool = False) -> EpisodeTable:
    """Every ended whole episode of ``lanes`` (with ``running``: every episode that has a step,
    clipped or running ones too)."""
    starts, ends, which, origins = [], [], [], []
    for i, lane in enumerate(lanes):
        ended = lane.ended
        if running:
            first, last = ended.with_running(lane.running)
            keep = last > first
            starts.append(first[keep])
            ends.append(last[keep])
        elif ended.whole.all():  # most often: the arrays as they are, no copy through a mask
            starts.append(ended.starts)
            ends.append(ended.ends)
            origins.append(ended.origins)
        else:
            starts.append(ended.starts[ended.whole])
            ends.append(ended.ends[ended.whole])
            origins.append(ended.origins[ended.whole])
        which.append(np.full(starts[-1].size, i))
    return EpisodeTable(
        np.concatenate(starts),
        np.concatenate(ends),
        lane_offsets(lanes)[np.concatenate(which)],
        lanes[0].capacity,
        None if running else np.concatenate(origins),
    )


def episode_ranges(lengths: np.ndarray, rows: int) -> Iterator[tuple[int, int]]:
    """Ranges ``[lo, hi)`` of the episodes of ``lengths``, back to back, each of whole episodes
    holding about ``rows`` rows (at least one episode, however long)."""
    ends = np.cumsum(lengths)
    lo = 0
    while lo < len(lengths):
        hi = max(lo + 1, int(np.searchsorted(ends, (int(ends[lo - 1]) if lo else 0) + rows, side="right")))
        yield lo, hi
        lo = hi


def newest_fitting(lengths: np.ndarray, rows: int) -> int:
    """The first of the last episodes of ``lengths`` that fit in ``rows`` rows together
    (``len(lengths)``: not even the last one fits)."""
    fits = np.cumsum(lengths[::-1])[::-1] <= rows  # the episodes from here on fit
    return int(np.argmax(fits)) if fits.any() else len(lengths)


def newest_rows(lanes: Sequence[Lane]) -> np.ndarray:
    """The newest row of each lane that holds any (its successor is not recorded)."""
    return np.array([lane.offset + (lane.written - 1) % lane.capacity for lane in lanes if lane.size], dtype=np.int64)


def count_whole(lanes: list[Lane]) -> int:
    """How many ended whole episodes ``lanes`` hold."""
    return sum(int(np.count_nonzero(lane.ended.whole)) for lane in lanes)


def episode_sums(values: np.ndarray, lanes: list[Lane]) -> np.ndarray:
    """``values`` (``[k, rows]``) summed over each ended whole episode of ``lanes`` (``[k,
    episodes]``, in `episode_table`'s order), in float64, read where the rows lie: a lane's rows
    are one or two ranges, never gathered."""
    sums = []
    for lane in lanes:
        keep = lane.ended.whole
        starts, ends = lane.ended.starts[keep], lane.ended.ends[keep]
        if not starts.size:
            continue
        pieces = [values[:, lo:hi] for lo, hi in lane.segments(int(starts[0]), int(ends[-1]))]
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)  # a ring that wrapped
        bounds = np.column_stack([starts, ends]).reshape(-1) - starts[0]
        sums.append(np.add.reduceat(rows, bounds[:-1], axis=1, dtype=np.float64)[:, ::2])
    return np.concatenate(sums, axis=1) if sums else np.zeros((values.shape[0], 0))
