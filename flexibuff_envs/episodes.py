"""Which rows of a ring lane are live, and where each episode lies.

Positions are absolute step counts of the lane (they only grow), so wrap-around never makes two
episodes look alike; ``row = offset + position % capacity``. Every written row belongs to exactly
one episode and episodes are contiguous, so the live rows are always one ring segment
``[live_start, written)``. Overwriting the oldest live row forgets its whole episode at once.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: `Lane.opened` once every row of the lane's ring is open
ALL = 1 << 62


@dataclass(slots=True)
class Episode:
    """One episode of a lane: positions ``[start, end)``; ``whole`` is False once clipped."""

    start: int
    end: int
    whole: bool = True


class Lane:
    """The ring segment of one env lane and the episodes recorded in it."""

    __slots__ = ("_bounds", "agent_start", "capacity", "dirty", "ended", "live_start", "offset", "on_forget",
                 "on_open", "opened", "running", "written")

    def __init__(self, offset: int, capacity: int, on_forget: Callable[[Lane, Episode], None],
                 n_agents: int = 1, on_open: Callable[[Lane, int], None] | None = None) -> None:
        self.on_forget = on_forget
        # on the ring's first pass, rows below position ``opened`` hold their fields' allocated
        # values; claiming past it calls ``on_open(lane, position)`` (ALL: every row is open)
        self.on_open = on_open
        self.opened = 0 if on_open is not None else ALL
        # per agent: the position its own episode began at inside the running one (-1: it ended
        # there already, its G is final); its rows are the rows from there on where it is active
        self.agent_start = [0] * n_agents
        self.offset = offset
        self.capacity = capacity
        self.written = 0
        self.dirty = 0  # positions below this may have been written, even if given back
        self.live_start = 0
        self.ended: deque[Episode] = deque()
        self.running: Episode | None = None
        self._bounds: tuple[tuple[int, int, int], np.ndarray, np.ndarray] | None = None

    def begin(self) -> None:
        """Start an episode at the next position (any running one must be ended first)."""
        self.running = Episode(self.written, self.written)
        self.agent_start = [self.written] * len(self.agent_start)

    def make_room(self, ahead: int = 1, *, defer: bool = False) -> tuple[int, int]:
        """Make the next ``ahead`` rows (at most ``capacity``) ready for steps: forget the oldest
        episodes they hold (if the running episode alone fills the lane, its first rows), and give
        rows never used their fields' allocated values.

        Returns the positions ``[lo, hi)`` forgotten. With ``defer``, their rows are left for the
        caller to forget (several lanes at once); else ``on_forget`` forgets them first, so an
        interrupted call is done again.
        """
        lo = hi = self.live_start
        over = self.written + ahead - self.capacity - lo
        if over > 0:
            episodes = 0
            for episode in self.ended:
                if hi - lo >= over:
                    break
                hi, episodes = episode.end, episodes + 1
            clip = max(0, over - (hi - lo))  # the running episode's first rows
            hi += clip
            if not defer:
                self.on_forget(self, Episode(lo, hi, whole=False))
            for _ in range(episodes):
                self.ended.popleft()
            if clip:
                running = self.running
                assert running is not None  # rows are only made ready while an episode runs
                running.start += clip
                running.whole = False
            self.live_start = hi
        if self.written + ahead > self.opened:
            self.on_open(self, self.written + ahead)  # type: ignore[misc]
        return lo, hi

    def claim(self) -> int:
        """The row for the running episode's next step; forgets the oldest episode if it is there."""
        if self.written - self.capacity >= self.live_start or self.written >= self.opened:
            self.make_room()
        row = self.offset + self.written % self.capacity
        self.written += 1
        self.running.end = self.written  # type: ignore[union-attr]
        return row

    def claim_block(self, n: int) -> np.ndarray:
        """The rows for the running episode's next ``n`` steps (at most ``capacity``): `claim`
        ``n`` times in one go."""
        self.make_room(n)
        rows = self.offset + (self.written + np.arange(n)) % self.capacity
        self.written += n
        self.running.end = self.written  # type: ignore[union-attr]
        return rows

    def unclaim(self) -> None:
        """Give back the row of the last `claim` (its step could not be recorded)."""
        self.dirty = max(self.dirty, self.written)
        self.written -= 1
        self.running.end = self.written  # type: ignore[union-attr]

    def _forget_ended(self) -> None:
        """Forget the oldest ended episode (its rows first: interrupted, this is done again)."""
        oldest = self.ended[0]
        self.on_forget(self, oldest)
        self.live_start = oldest.end
        self.ended.popleft()

    def forget_ended(self) -> None:
        """Forget every ended episode; a running one goes on."""
        while self.ended:
            self._forget_ended()

    def append(self, lengths: np.ndarray) -> int:
        """Room for ended episodes of ``lengths`` (adding up to at most ``capacity``) after the
        newest row, forgetting the oldest episodes they overwrite; returns their first position.

        A running episode must have no step yet: it then starts after them.
        """
        first = self.written
        self.written = first + int(lengths.sum())
        if self.written > self.opened:
            self.on_open(self, self.written)  # type: ignore[misc]
        while self.ended and self.ended[0].start < self.written - self.capacity:
            self._forget_ended()
        ends = first + np.cumsum(lengths)
        self.ended.extend(Episode(int(end - n), int(end)) for end, n in zip(ends, lengths))
        if self.running is not None:
            self.running.start = self.running.end = self.written
            self.agent_start = [self.written if s >= 0 else s for s in self.agent_start]
        return first

    def clear(self) -> None:
        """Forget every row; a running episode goes on from here, no longer whole."""
        self.ended.clear()
        self.live_start = self.written
        if self.running is not None:
            self.running.whole = self.running.start == self.written
            self.running.start = self.written

    def end(self) -> Episode | None:
        """Close the running episode; return it, or None if it had no step."""
        episode, self.running = self.running, None
        if episode is None or episode.end == episode.start:
            return None
        self.ended.append(episode)
        return episode

    def rows(self, episode: Episode) -> np.ndarray:
        """The buffer rows of ``episode``, in time order."""
        return self.offset + np.arange(episode.start, episode.end) % self.capacity

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end positions of every live episode (ended ones, then the running one)."""
        running = self.running
        key = (len(self.ended), self.live_start, -1 if running is None else running.start)
        if self._bounds is None or self._bounds[0] != key:
            episodes = [*self.ended, *([running] if running is not None else [])]
            self._bounds = (key, np.array([e.start for e in episodes], dtype=np.int64),
                            np.array([e.end for e in episodes], dtype=np.int64))
        if running is not None:
            self._bounds[2][-1] = running.end  # the running episode grows without changing the key
        return self._bounds[1], self._bounds[2]

    def segments(self) -> list[tuple[int, int]]:
        """The live rows as one or two contiguous ``[lo, hi)`` row ranges, oldest first."""
        first = self.live_start % self.capacity
        head = min(self.size, self.capacity - first)
        out = [(self.offset + first, self.offset + first + head)]
        if head < self.size:  # the live rows wrap around the lane's end
            out.append((self.offset, self.offset + self.size - head))
        return out

    @property
    def size(self) -> int:
        """Live rows in this lane."""
        return self.written - self.live_start


class EpisodeIndex:
    """A buffer's lanes, which recorder writes each, and what batch recorders hold back.

    Batch recorders (`BatchRecorder`) keep their lanes' newest steps to themselves until
    something reads the lanes: `lanes` and `read_lanes` commit them first, so a reader always
    sees every recorded step. `version` grows whenever the lanes are handed out to be changed,
    which tells a batch recorder to read them again.
    """

    def __init__(self, n_lanes: int, capacity: int, n_agents: int, on_forget: Callable[[Lane, Episode], None],
                 on_open: Callable[[Lane, int], None]) -> None:
        self.ring = [Lane(i * capacity, capacity, on_forget, n_agents, on_open) for i in range(n_lanes)]
        # per lane: the recorder writing it (a weak reference: a dropped recorder frees its lane)
        self.writers: list[weakref.ref[Any] | None] = [None] * n_lanes
        self.batched: list[Any] = []  # batch recorders, each with commit() and owner()
        self.uncommitted = False
        self._committing = False
        self.version = 0

    @property
    def lanes(self) -> list[Lane]:
        """The lanes to change, every staged step committed first."""
        if self.uncommitted:
            self.commit()
        self.version += 1
        return self.ring

    @property
    def read_lanes(self) -> list[Lane]:
        """The lanes to read only (sampling, counting), every staged step committed first."""
        if self.uncommitted:
            self.commit()
        return self.ring

    def commit(self) -> None:
        """Every batch recorder's staged steps into the lanes."""
        if self._committing:  # reached again from inside a recorder's commit: it is under way
            return
        self._committing = True
        try:
            for batch in self.batched:
                batch.commit()
        finally:
            self._committing = False
        self.uncommitted = False


def spans(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every position of the ranges ``[starts, ends)`` (empty where ``ends <= starts``) back to
    back, and which range each belongs to."""
    lengths = np.maximum(ends - starts, 0)
    which = np.repeat(np.arange(lengths.size), lengths)
    first = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) - first[which] + starts[which], which


def whole_episodes(lanes: list[Lane]) -> list[tuple[Lane, Episode]]:
    """Every ended whole episode with its lane, lane by lane, oldest first."""
    return [(lane, e) for lane in lanes for e in lane.ended if e.whole]


def episode_rows(episodes: list[tuple[Lane, Episode]]) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``episodes`` back to back, each in time order, and the position in them of
    each episode's last row."""
    lengths = np.array([e.end - e.start for _, e in episodes], dtype=np.int64)
    rows = np.concatenate([lane.rows(e) for lane, e in episodes]) if episodes else np.zeros(0, np.int64)
    return rows, np.cumsum(lengths) - 1
