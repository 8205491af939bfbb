"""Which rows of a ring lane are live, and where each episode lies.

Positions are absolute step counts of the lane (they only grow), so wrap-around never makes two
episodes look alike; ``row = offset + position % capacity``. Every written row belongs to exactly
one episode and episodes are contiguous, so the live rows are always one ring segment
``[live_start, written)``. Overwriting the oldest live row forgets its whole episode at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from flexibuff_envs.index.ended import Ended, Episode
from flexibuff_envs.index.origins import UNKNOWN, Origin

#: `Lane.opened` once every row of the lane's ring is open
ALL = 1 << 62


class AgentEpisodes:
    """Each agent's own episode inside its lane's running one: the position it began at (when
    the agent joined, or the episode began), or None once it ended there (its ``G`` is final).
    An agent's rows are those from its start on where it is active."""

    __slots__ = ("starts",)

    def __init__(self, n_agents: int) -> None:
        self.starts: list[int | None] = [0] * n_agents

    def begin(self, position: int) -> None:
        """Every agent's own episode begins with the lane's next one, at ``position``."""
        self.starts = [position] * len(self.starts)

    def end(self, agent: int) -> None:
        """``agent``'s own episode ended (its ``G`` is written and final)."""
        self.starts[agent] = None

    def rejoin(self, agent: int, position: int) -> None:
        """``agent`` is back after its own episode ended: its next one begins at ``position``."""
        self.starts[agent] = position

    def running(self) -> list[int]:
        """The agents whose own episode still runs."""
        return [agent for agent, start in enumerate(self.starts) if start is not None]

    def first(self, agent: int, start: int) -> int:
        """The position ``agent``'s own rows begin at in the running episode, which now begins
        at ``start`` (its oldest rows may have been forgotten)."""
        begun = self.starts[agent]
        return start if begun is None else max(begun, start)

    def moved(self, position: int) -> None:
        """The lane's running episode now begins at ``position`` (episodes appended before it)."""
        self.starts = [None if start is None else position for start in self.starts]

    def saved(self) -> list[int]:
        """The starts as a file keeps them: -1 for an agent whose own episode ended."""
        return [-1 if start is None else start for start in self.starts]

    def restore(self, saved: Sequence[int], base: int) -> None:
        """Take a file's starts (`saved`), renumbered by ``base`` positions: an agent's own
        episode that began in rows forgotten since begins at the first kept one."""
        self.starts = [None if start < 0 else max(start - base, 0) for start in saved]


class Lane:
    """The ring segment of one env lane and the episodes recorded in it."""

    __slots__ = (
        "agents",
        "capacity",
        "dirty",
        "ended",
        "live_start",
        "offset",
        "on_forget",
        "on_open",
        "open_limit",
        "opened",
        "origin",
        "running",
        "written",
    )

    def __init__(
        self,
        offset: int,
        capacity: int,
        on_forget: Callable[[Lane, Episode], None],
        n_agents: int = 1,
        on_open: Callable[[Lane, int], None] | None = None,
    ) -> None:
        self.on_forget = on_forget
        # rows below ``opened`` hold allocated or recorded values (ALL: every row); claiming past it calls
        # ``on_open(lane, position)`` until ``open_limit`` (the ring's first pass; a loaded lane's non-live rows)
        self.on_open = on_open
        self.opened = 0 if on_open is not None else ALL
        self.open_limit = capacity
        self.agents = AgentEpisodes(n_agents)
        self.offset = offset
        self.capacity = capacity
        self.written = 0
        self.dirty = 0  # positions below this may have been written, even if given back
        self.live_start = 0
        self.ended = Ended()
        self.running: Episode | None = None
        self.origin: Origin = UNKNOWN  # the running episode's

    def begin(self, origin: Origin = UNKNOWN) -> None:
        """Start an episode of ``origin`` at the next position (any running one must be ended
        first)."""
        self.running, self.origin = Episode(self.written, self.written), origin
        self.agents.begin(self.written)

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
            ends = self.ended.ends  # the oldest episodes up to the first that covers the rows needed
            episodes = min(int(np.searchsorted(ends, lo + over)) + 1, ends.size)
            hi = int(ends[episodes - 1]) if episodes else lo
            clip = max(0, over - (hi - lo))  # the running episode's first rows
            hi += clip
            if not defer:
                self.on_forget(self, Episode(lo, hi, whole=False))
            self.ended.drop(episodes)
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

    def claim_block(self, n: int) -> slice | np.ndarray:
        """The rows for the running episode's next ``n`` steps (at most ``capacity``): `claim`
        ``n`` times in one go; a slice unless they wrap around the lane's end."""
        written = self.written
        if written + n - self.capacity > self.live_start or written + n > self.opened:
            self.make_room(n)
        self.written = written + n
        self.running.end = self.written  # type: ignore[union-attr]
        lo = self.offset + written % self.capacity
        if lo + n <= self.offset + self.capacity:
            return slice(lo, lo + n)
        return self.offset + (written + np.arange(n)) % self.capacity  # around the lane's end

    def unclaim(self) -> None:
        """Give back the row of the last `claim` (its step could not be recorded)."""
        self.dirty = max(self.dirty, self.written)
        self.written -= 1
        self.running.end = self.written  # type: ignore[union-attr]

    def _forget_ended(self, n: int) -> None:
        """Forget the ``n`` oldest ended episodes (their rows first: interrupted, this is done
        again)."""
        if n:
            end = int(self.ended.ends[n - 1])
            self.on_forget(self, Episode(int(self.ended.starts[0]), end))
            self.live_start = end
            self.ended.drop(n)

    def forget_ended(self) -> None:
        """Forget every ended episode; a running one goes on."""
        self._forget_ended(len(self.ended))

    def append(self, lengths: np.ndarray, origins: np.ndarray | Origin = UNKNOWN) -> int:
        """Room for ended episodes of ``lengths`` (adding up to at most ``capacity``) and
        ``origins`` after the newest row, forgetting the oldest episodes they overwrite; returns
        their first position.

        A running episode must have no step yet: it then starts after them.
        """
        first = self.written
        self.written = first + int(lengths.sum())
        if self.written > self.opened:
            self.on_open(self, self.written)  # type: ignore[misc]
        self._forget_ended(int(np.searchsorted(self.ended.starts, self.written - self.capacity)))
        ends = first + np.cumsum(lengths)
        self.ended.extend(ends - lengths, ends, True, origins)
        if self.running is not None:
            self.running.start = self.running.end = self.written
            self.agents.moved(self.written)
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
        episode = self.running
        if episode is None or episode.end == episode.start:
            self.running = None
            return None
        self.ended.append(episode, self.origin)  # first: interrupted, the episode still runs
        self.running = None
        return episode

    def rows(self, episode: Episode) -> np.ndarray:
        """The buffer rows of ``episode``, in time order."""
        return self.offset + np.arange(episode.start, episode.end) % self.capacity

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end positions of every live episode (ended ones, then the running one):
        views, valid until the lane changes."""
        return self.ended.with_running(self.running)

    def segments(self, start: int | None = None, end: int | None = None) -> list[tuple[int, int]]:
        """The rows of positions ``[start, end)`` (at most ``capacity``; by default the live ones)
        as one or two contiguous ``[lo, hi)`` row ranges, oldest first."""
        start = self.live_start if start is None else start
        n = (self.written if end is None else end) - start
        first = start % self.capacity
        head = min(n, self.capacity - first)
        out = [(self.offset + first, self.offset + first + head)]
        if head < n:  # they wrap around the lane's end
            out.append((self.offset, self.offset + n - head))
        return out

    def open_to(self, upto: int) -> None:
        """Rows below position ``upto`` hold their fields' allocated values (or recorded ones)."""
        self.opened = upto if upto < self.open_limit else ALL

    def restore(
        self,
        written: int,
        live_start: int,
        ended: np.ndarray,
        running: tuple[int, int, bool] | None,
        agent_start: list[int],
        origins: np.ndarray | Origin = UNKNOWN,
    ) -> None:
        """Take the positions and episodes a file gives (``ended``: ``[start, end, whole]`` rows,
        of ``origins``),
        into this lane as made. The live rows hold the file's values; the others (the file does
        not hold them, or holds what was forgotten) are opened as recording reaches them, as on
        a ring's first pass: a file costs memory for what it holds, not for the ring it names.

        Positions are renumbered by whole turns of the ring (every row stays where it is), so
        the live ones start in the first turn: a file's positions, however large, leave room to
        record on.
        """
        base = live_start - live_start % self.capacity
        self.written = self.dirty = written - base
        self.live_start = live_start - base
        self.open_limit = self.live_start + self.capacity
        self.open_to(self.written)
        if len(ended):
            self.ended.extend(ended[:, 0] - base, ended[:, 1] - base, ended[:, 2].astype(bool), origins)
        self.running = None if running is None else Episode(running[0] - base, running[1] - base, running[2])
        self.agents.restore(agent_start, base)

    @property
    def size(self) -> int:
        """Live rows in this lane."""
        return self.written - self.live_start


def lane_offsets(lanes: Sequence[Lane]) -> np.ndarray:
    """Each lane's first buffer row."""
    return np.array([lane.offset for lane in lanes], dtype=np.int64)


def span_rows(offsets: np.ndarray, capacity: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The buffer rows of positions ``[starts, ends)`` (at most ``capacity`` each; none where
    ``ends <= starts``) of the lanes at ``offsets``, range after range, each in time order.

    A range is one run of ring rows, or two where it wraps around its lane's end; the rows are
    the running sum of steps that are 1 within a run and jump to the next run's first row."""
    lengths = np.maximum(ends - starts, 0)
    firsts = starts % capacity
    head = np.minimum(lengths, capacity - firsts)  # the run up to the lane's end, then the wrapped rest
    runs = np.stack([head, lengths - head], axis=1).ravel()
    run_rows = np.stack([offsets + firsts, offsets], axis=1).ravel()
    keep = runs > 0
    runs, run_rows = runs[keep], run_rows[keep]
    if not runs.size:
        return np.zeros(0, dtype=np.int64)
    step = np.ones(int(runs.sum()), dtype=np.int64)
    step[np.cumsum(runs[:-1])] = run_rows[1:] - (run_rows[:-1] + runs[:-1] - 1)
    step[0] = run_rows[0]
    return np.cumsum(step)
