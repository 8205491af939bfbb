"""A lane's episodes: one (`Episode`), and those that ended, as arrays (`Ended`), each with its
origin (`origins`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from flexibuff_envs.errors import OutOfRangeError
from flexibuff_envs.index.origins import ORIGIN, UNKNOWN, Origin
from flexibuff_envs.interrupts import HOLD


@dataclass(slots=True)
class Episode:
    """One episode of a lane: positions ``[start, end)``; ``whole`` is False once clipped."""

    start: int
    end: int
    whole: bool = True


class Ended:
    """A lane's ended episodes, oldest first, as arrays: positions ``[start, end)``, whether
    each is whole (none of its rows forgotten) and its origin (`origins.ORIGIN`). Appending and
    forgetting cost the same however many there are; ``starts``, ``ends``, ``whole`` and
    ``origins`` are views, valid until the next change."""

    __slots__ = ("_end", "_first", "_origin", "_start", "_stop", "_whole")

    def __init__(self) -> None:
        self._start = np.zeros(16, dtype=np.int64)
        self._end = np.zeros(16, dtype=np.int64)
        self._whole = np.zeros(16, dtype=bool)
        self._origin = np.zeros(16, dtype=ORIGIN)
        self._first = self._stop = 0  # the episodes held are [_first, _stop) of the arrays

    def __len__(self) -> int:
        return self._stop - self._first

    def __iter__(self) -> Iterator[Episode]:
        return map(Episode, self.starts.tolist(), self.ends.tolist(), self.whole.tolist())

    def __getitem__(self, i: int) -> Episode:
        """The ``i``-th oldest episode (``-1``: the newest)."""
        j = (self._first if i >= 0 else self._stop) + i
        if not self._first <= j < self._stop:
            raise OutOfRangeError(f"episode {i} of {len(self)}")
        return Episode(int(self._start[j]), int(self._end[j]), bool(self._whole[j]))

    @property
    def starts(self) -> np.ndarray:
        return self._start[self._first : self._stop]

    @property
    def ends(self) -> np.ndarray:
        return self._end[self._first : self._stop]

    @property
    def whole(self) -> np.ndarray:
        return self._whole[self._first : self._stop]

    @property
    def origins(self) -> np.ndarray:
        return self._origin[self._first : self._stop]

    def newest(self) -> tuple[int, int, int, bool]:
        """The end of the episode before the newest (-1 if none), and the newest's start, end and
        wholeness (-1, -1, -1, False when none ended), in plain integers (a log's question)."""
        j = self._stop - 1
        if j < self._first:
            return -1, -1, -1, False
        before = self._end.item(j - 1) if j > self._first else -1
        return before, self._start.item(j), self._end.item(j), bool(self._whole.item(j))

    def with_running(self, running: Episode | None) -> tuple[np.ndarray, np.ndarray]:
        """``starts`` and ``ends`` followed by ``running`` (if any): views of the arrays, whose
        spare slot after the newest holds the running episode."""
        if running is None:
            return self.starts, self.ends
        self._room(1)
        self._start[self._stop], self._end[self._stop] = running.start, running.end
        return self._start[self._first : self._stop + 1], self._end[self._first : self._stop + 1]

    def append(self, episode: Episode, origin: Origin = UNKNOWN) -> None:
        self._room(1)
        stop = self._stop
        self._start[stop], self._end[stop], self._whole[stop] = episode.start, episode.end, episode.whole
        self._origin[stop] = origin
        self._stop = stop + 1

    def extend(
        self,
        starts: np.ndarray,
        ends: np.ndarray,
        whole: np.ndarray | bool = True,
        origins: np.ndarray | Origin = UNKNOWN,
    ) -> None:
        """Episodes ``[starts, ends)``, oldest first, after the newest, of ``origins`` (one
        each, or one for all)."""
        n = len(starts)
        self._room(n)
        at = slice(self._stop, self._stop + n)
        self._start[at], self._end[at], self._whole[at] = starts, ends, whole
        self._origin[at] = origins
        self._stop += n

    def drop(self, n: int) -> None:
        """Forget the ``n`` oldest."""
        self._first = min(self._first + n, self._stop)

    def clear(self) -> None:
        self._first = self._stop = 0

    def _room(self, n: int) -> None:
        """Room for ``n`` more after the newest, and one spare slot (`with_running`)."""
        held = len(self)
        if self._stop + n + 1 <= self._start.size:
            return
        # the held ones doubled (appends one at a time cost the same however many), plus the new
        # ones: a lane restored with millions of episodes at once takes what it holds, not twice
        size = self._start.size if held + n + 1 <= self._start.size // 2 else 2 * held + n + 16
        made = {}
        for name in ("_start", "_end", "_whole", "_origin"):  # made aside: a Ctrl-C here changes nothing
            old = getattr(self, name)
            new = old.copy() if size == old.size else np.zeros(size, dtype=old.dtype)
            new[:held] = old[self._first : self._stop]  # the held ones to the front
            made[name] = new
        with HOLD:  # then swapped in at once
            for name, new in made.items():
                setattr(self, name, new)
            self._first, self._stop = 0, held
