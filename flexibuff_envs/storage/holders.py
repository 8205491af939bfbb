"""Holders: what recorders hold for their lanes' next rows, written through a `Chain` (`Held`
for one lane's agent or global state, `HeldBatch` for a vector env's lanes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flexibuff_envs.storage.next_values import CHAINED, Chain, as_rows


class Held:
    """What one agent (or the global state) holds for its next row, written through a `Chain`.

    `write` puts the held value in the row's base field and the new value in a reserved slot,
    which the row's ``index`` names until the agent's next transition lands in the lane's next
    row: then the row is chained and the slot is free again. Every other next value is copied to
    a slot of its own when it stops being held (`hold`, or a next transition elsewhere).
    """

    def __init__(
        self,
        chain: Chain,
        agent: int | None,
        writer: Callable[[np.ndarray], Callable[[int, Any], None]],
        size: int,
        lane: tuple[int, int],
    ) -> None:
        self.chain = chain
        self.base = chain.base[agent] if agent is not None else chain.base
        self.index = chain.index[agent] if agent is not None else chain.index
        self._make_writer, self._size = writer, size
        self._first, self._end = lane  # the lane's rows [first, end): its successor wraps there
        self.held, self.spare = (int(s) for s in chain.reserve())
        self.pending = -1  # the row whose next value is the held one (-1: none, e.g. after a reset)
        self._before = -1  # the pending row before the last write (-1: none, or nothing to undo)
        chain.holders.add(self)
        self.bind()

    def bind(self) -> None:
        """Point the writers at the chain's current tail store (it moves when it grows)."""
        self.tail = self.chain.tail
        self._write = self._make_writer(self.tail[:, : self._size])
        self._views = {self.held: self.tail[self.held], self.spare: self.tail[self.spare]}

    def release(self, rows: np.ndarray | slice | None = None) -> None:
        """The pending row was forgotten (``rows`` holds it; None: every row): hold without it."""
        pending = self.pending
        if pending >= 0 and (
            rows is None or (rows.start <= pending < rows.stop if isinstance(rows, slice) else (rows == pending).any())
        ):
            self.pending = -1

    def _settle(self) -> None:
        """The held value stops being held: the pending row keeps it in a slot of its own."""
        if self.pending >= 0:
            slot = self.chain.alloc_one()
            self.chain.tail[slot] = self._views[self.held]
            self.index[self.pending] = slot

    def hold(self, value: Any) -> None:
        """Hold ``value`` (from a reset, or an agent that joins) for the next row."""
        self._write(self.spare, value)  # may raise: then nothing has changed
        self._settle()
        self.held, self.spare, self.pending = self.spare, self.held, -1

    def hold_unless_held(self, value: Any) -> None:
        """Hold ``value`` for the next row, unless it is, bit for bit, the value held already:
        then the last row and the next chain as usual; else the last row keeps its next value
        in a slot of its own (transitions added that do not follow one another)."""
        self._write(self.spare, value)  # may raise: then nothing has changed
        new, held = self._views[self.spare][: self._size], self._views[self.held][: self._size]
        if not np.array_equal(new.view(np.uint8), held.view(np.uint8)):
            self._settle()
            self.held, self.spare, self.pending = self.spare, self.held, -1

    def replace(self, value: Any) -> None:
        """The held value becomes ``value``, and so does the pending row's next value: the row's
        transition runs on (its agent sat a step out)."""
        self._write(self.spare, value)  # may raise: then nothing has changed
        if self.pending >= 0:
            self.index[self.pending] = self.spare
        self.held, self.spare, self._before = self.spare, self.held, -1

    def hold_missing(self) -> None:
        """Hold a value the env could not give: NaN (0 for integer dtypes)."""
        self._views[self.spare][...] = np.nan if self.tail.dtype.kind == "f" else 0
        self._settle()
        self.held, self.spare, self.pending = self.spare, self.held, -1

    def write(self, row: int, value: Any) -> None:
        """``base[row]`` = the held value; ``value`` is ``row``'s next value and is held next."""
        held, spare, pending = self.held, self.spare, self.pending
        self._write(spare, value)  # may raise: then nothing has changed
        self.base[row] = self._views[held]
        if pending >= 0:
            if row == (pending + 1 if pending + 1 < self._end else self._first):
                self.index[pending] = CHAINED
            else:
                self._settle()
        self._before = pending
        self.index[row] = spare
        self.held, self.spare, self.pending = spare, held, row

    def stager(self, n: int) -> tuple[np.ndarray, Callable[[int, Any], None]]:
        """``n`` rows of this holder's stored form, and the writer that checks and puts a value
        into one of them (as `write` does into the chain): where a recorder stages values for
        `write_run`."""
        staged = np.zeros((n, self._size), dtype=self.tail.dtype)
        return staged, self._make_writer(staged)

    def write_run(self, rows: slice | np.ndarray, values: np.ndarray) -> None:
        """`write` of each of ``rows`` (claimed one after the other in the lane: a slice, or
        indices when they wrap) with its next value ``values[j]`` (the stored form, as `stager`
        keeps it), in a fixed number of numpy operations: each row's next value is its
        successor's base value (chained), the last one's is held next."""
        held, spare, pending = self.held, self.spare, self.pending
        k = len(values)
        later: slice | np.ndarray
        chained: slice | np.ndarray
        if isinstance(rows, slice):
            first, last = rows.start, rows.stop - 1
            later, chained = slice(first + 1, rows.stop), slice(first, last)
        else:
            first, last = int(rows[0]), int(rows[-1])
            later, chained = rows[1:], rows[:-1]
        if pending >= 0:
            if first == (pending + 1 if pending + 1 < self._end else self._first):
                self.index[pending] = CHAINED
            else:
                self._settle()
        self.base[first] = self._views[held]
        if k > 1:
            self.base[later] = values[: k - 1]
            self.index[chained] = CHAINED
            self._before = last - 1 if isinstance(rows, slice) else int(rows[-2])
            self._views[held][: self._size] = values[k - 2]  # what `undo` of the last row holds again
        else:
            self._before = pending
        self._views[spare][: self._size] = values[k - 1]
        self.index[last] = spare
        self.held, self.spare, self.pending = spare, held, last

    def write_missing(self, row: int) -> None:
        """As `write`, for a value the env could not give: NaN (0 for integer dtypes)."""
        self._views[self.spare][...] = np.nan if self.tail.dtype.kind == "f" else 0
        self.write(row, self._views[self.spare])

    def undo(self, row: int) -> None:
        """``row`` is given back (`LaneRecorder.abandon`): hold again what was held before it."""
        if self.pending != row:
            return
        pending, self._before = self._before, -1
        self.held, self.spare = self.spare, self.held
        chained = pending >= 0 and self.index[pending] == CHAINED
        if chained:  # the previous row reads its next value from the held slot again
            self.index[pending] = self.held
        self.pending = pending if chained else -1  # else that row kept a slot of its own


class HeldBatch:
    """What the single-agent lanes of a vector env hold for their next rows, written a block of
    steps at a time (`BatchRecorder`).

    Each lane owns one reserved slot with its latest value. Its newest row (whose successor is
    not written yet) names that slot until the lane's next row is written; then it is chained.
    """

    def __init__(self, chain: Chain, agent: int | None, n: int) -> None:
        self.chain = chain
        self.base = chain.base[agent] if agent is not None else chain.base
        self.index = chain.index[agent] if agent is not None else chain.index
        # rows as opaque values (faster to assign), unless kept compressed (`PackedRing`)
        self._rows = as_rows(self.base) if isinstance(self.base, np.ndarray) else None
        self.held = chain.reserve(n)
        self.pending = np.full(n, -1, dtype=np.int64)  # per lane, as `Held.pending`
        chain.holders.add(self)

    def bind(self) -> None:
        """Nothing to rebind: the tail store is read from the chain at each use."""

    def release(self, rows: np.ndarray | slice | None = None) -> None:
        """As `Held.release`, for every lane whose pending row is among ``rows`` (None: all):
        `Chain.forget` has cleared them, and a pending row names a slot, so it is one that reads
        slot 0 now (no search through ``rows``)."""
        if rows is None:
            self.pending[:] = -1
            return
        pending = self.pending >= 0
        self.pending[pending & (self.index[np.where(pending, self.pending, 0)] == 0)] = -1

    def values(self) -> np.ndarray:
        """What every lane holds, ``[n, width]`` (a copy)."""
        return self.chain.tail[self.held]

    def value(self, lane: int) -> np.ndarray:
        """What lane ``lane`` holds (a copy)."""
        return self.chain.tail[self.held[lane]].copy()

    def _settle(self, lanes: np.ndarray) -> None:
        """The pending rows of ``lanes`` (indices, or a mask) keep the values held till now in
        slots of their own."""
        if lanes.dtype == bool:
            lanes = np.flatnonzero(lanes & (self.pending >= 0))
        else:
            lanes = lanes[self.pending[lanes] >= 0]
        if lanes.size:
            slots = self.chain.alloc(lanes.size)
            self.chain.tail[slots] = self.chain.tail[self.held[lanes]]
            self.index[self.pending[lanes]] = slots
            self.pending[lanes] = -1

    def hold(self, lanes: np.ndarray, values: np.ndarray) -> None:
        """Lanes ``lanes`` (indices) hold ``values`` (``[k, width]``, from a reset) for their next row."""
        self._settle(lanes)
        self.chain.tail[self.held[lanes]] = values

    def write(
        self,
        rows: np.ndarray,
        lanes: np.ndarray,
        before: np.ndarray,
        ends: np.ndarray,
        end_values: np.ndarray,
        newest: np.ndarray,
        chained: np.ndarray,
        touched: np.ndarray,
        latest: np.ndarray,
    ) -> None:
        """Rows ``rows`` of lanes ``lanes`` (``[T]``, each lane's in step order) get base values ``before``.

        Args:
            ends: rows that end an episode: their next values ``end_values`` get slots of their own.
            newest: each lane's newest row, when it does not end an episode: it names the lane's slot.
            chained: per lane, whether its pending row is followed by its first row here (else
                it keeps its value in a slot of its own).
            touched: per lane, whether it had a row or a reset here; those hold ``latest``
                (``[n, width]``) next.
        """
        old = self.pending[chained]
        self.index[old[old >= 0]] = CHAINED
        self.pending[chained] = -1
        self._settle(touched)
        if self._rows is None:
            self.base[rows] = before
        else:
            self._rows[rows] = as_rows(before)
        index = np.full(rows.size, CHAINED, dtype=np.int32)
        if ends.any():
            slots = self.chain.alloc(int(np.count_nonzero(ends)))
            self.chain.tail[slots] = end_values
            index[ends] = slots
        index[newest] = self.held[lanes[newest]]
        self.index[rows] = index
        self.chain.tail[self.held[touched]] = latest[touched]
        self.pending[lanes[newest]] = rows[newest]
