"""What each column file of an episode log gets from an append: the bytes of a chunk's parts, or
of a buffer's ring rows read straight, laid out as the files hold them, next-value slots numbered
after the log's (`LogWriter` puts them in place and commits them)."""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.errors import SpecMismatchError
from flexibuff_envs.log.append_window import Tail
from flexibuff_envs.log.format import CHAINS, EPISODE_LENGTHS, Column
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.fields import NEXT
from flexibuff_envs.storage.next_values import CHAINED, Chain
from flexibuff_envs.storage.stored_form import Stored

#: each stored part's rows, as `stored_form.Part` pieces hold them
Given = Mapping[tuple[str, str | None], Sequence[np.ndarray]] | Stored
#: each column's bytes (C-contiguous) and the file end they go to, in the log's column order
Pieces = list[tuple[Tail, np.ndarray]]


def allocated(spec: BufferSpec) -> dict[tuple[str, str | None], Any]:
    """What a row of each column of a log of ``spec`` holds before it is written: a field's
    allocated value, a next value's slot 0 (the zeros)."""
    probe = Storage(spec, 1)
    return {
        (name, part): 0 if part is not None else probe.fill(name)
        for name, part in [(name, None) for name in probe.fields] + [(name, "index") for name in NEXT]
    }


def added(given: Given) -> tuple[int, ...]:
    """The slots each chain's tail adds (its slot 0 is the log's own)."""
    tails = [given.get((name, "tail")) for name in CHAINS]
    return tuple(0 if tail is None else len(tail[0]) - 1 for tail in tails)


class Plan:
    """How an append's rows become the bytes of ``columns`` (each going to its file end in
    ``tails``): per column its key, tail, row dtype and shape, the value a row holds before it
    is written, whether its rows come agent-major (to swap), the first row it stores (a tail's
    slot 0 is the log's own) and, for a next value's index, its chain's place in a commit's
    tail counts."""

    def __init__(
        self,
        columns: Sequence[Column],
        tails: Mapping[tuple[str, str | None], Tail],
        fills: Mapping[tuple[str, str | None], Any],
        n_agents: int,
    ) -> None:
        self.columns, self.single = list(columns), n_agents == 1
        self.lengths = tails[EPISODE_LENGTHS.key]
        self.each = [
            (
                column.key,
                tails[column.key],
                column.dtype,
                column.shape,
                fills[column.key] if column.part != "tail" else None,
                column.per_agent and column.part != "tail",
                int(column.part == "tail"),
                CHAINS.index(column.name) if column.part == "index" else None,
            )
            for column in self.columns
        ]
        self.keys = {tail: key for key, tail, *_ in self.each}

    def of(self, given: Given, lengths: np.ndarray, rows: int, slots: Sequence[int]) -> Pieces:
        """The pieces of ``given`` (``[n_agents, n, ...]`` for a per-agent field), checked
        against the log's columns; ``slots``: each chain's slots the log holds. A column
        ``given`` lacks gets its allocated value."""
        pieces = [(self.lengths, np.ascontiguousarray(lengths, dtype=EPISODE_LENGTHS.dtype))]
        for key, tail, dtype, shape, fill, swap, first, shift in self.each:
            arrays = given.get(key)
            if arrays is None:  # a field the buffer lacks: its allocated value (a next value: slot 0)
                if fill is not None:
                    pieces.append((tail, np.full((rows, *shape), fill, dtype)))
                continue
            for array in arrays:
                if swap:  # the file holds each row's agents together
                    array = array.swapaxes(0, 1)
                if array.dtype != dtype or array.shape[1:] != shape:
                    raise SpecMismatchError(
                        f"the chunk's {'.'.join(k for k in key if k)} rows are {array.shape[1:]} {array.dtype}; "
                        f"the log's are {shape} {dtype}"
                    )
                if shift is not None:  # an index: slots renumbered after the log's
                    array = np.where(array > 0, array + np.int32(slots[shift] - 1), array)
                pieces.append((tail, np.ascontiguousarray(array[first:] if first else array)))
        return pieces

    def record_of(self, given: Stored, lengths: np.ndarray, rows: int) -> Pieces:
        """`of` for a journal record: slots numbered from 1 within it, each chain's values in
        the order of the rows naming them (`in_order`)."""
        pieces = self.of(given, lengths, rows, (1,) * len(CHAINS))
        index = {self.keys[tail][0]: piece for tail, piece in pieces[1:] if self.keys[tail][1] == "index"}
        return [
            (
                tail,
                in_order(index[self.keys[tail][0]], piece) if self.keys.get(tail, ("", None))[1] == "tail" else piece,
            )
            for tail, piece in pieces
        ]

    def matches(self, storage: Storage) -> bool:
        """Whether ``storage`` holds every column as the log does (or lacks it), so `Direct`
        may read it without the checks `of` makes."""
        return all(self._matches(storage, column) for column in self.columns)

    @staticmethod
    def _matches(storage: Storage, column: Column) -> bool:
        name, part = column.key
        if part is not None:
            chain = storage.chains.get(name)
            if chain is None:
                return True
            if part == "index":
                return chain.per_agent == column.per_agent
            return chain.tail.dtype == column.dtype and chain.tail.shape[1:] == column.shape
        array = storage.arrays.get(name)
        if array is None:
            return True
        if not isinstance(array, np.ndarray):  # a compressed log's rows, mapped: read as a chunk's
            return False
        per_agent = storage.fields[name].per_agent
        row = array.shape[2:] if per_agent else array.shape[1:]
        shape = column.shape[1:] if column.per_agent else column.shape
        return per_agent == column.per_agent and array.dtype == column.dtype and row == shape


_LENGTH = struct.Struct("<q")
#: rows of `CHAINED` as an index's bytes (an episode of at most `_RUN` rows is compared to them)
_RUN = 4096
_CHAINED_RUN = np.full(_RUN, CHAINED, dtype=np.int32).tobytes()
#: how `Direct` reads a column: rows of a ring array, the same copied (an array not laid out
#: row after row, as a mapped log's), its agents' rows swapped together, one row's bytes repeated
#: (a field the buffer lacks), a next value's index or its slots
ROWS, COPY, SWAP, FILL, INDEX, SLOTS = range(6)


class Direct:
    """A journal record's bytes read straight from the ring arrays of ``storage`` (which ``plan``
    `matches`), for rows ``[lo, hi)``: each column's rows as its file holds them; a next value's
    index as the ring holds it (a row with a slot of its own positive) and the values of those
    slots in the order of those rows (`in_order`). How each column is read is settled once."""

    def __init__(self, plan: Plan, storage: Storage) -> None:
        self.storage = storage
        self.arrays, self.chains = storage.arrays, storage.chains  # `current` checks they are still these
        self.readers: list[tuple[int, Any, int]] = []  # kind, what it reads, bytes per row
        for (name, part), _, dtype, shape, fill, swap, _, _ in plan.each:
            row = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if part is None:
                array = storage.arrays.get(name)
                if array is None:
                    self.readers.append((FILL, np.full(shape, fill, dtype).tobytes(), row))
                elif swap and not plan.single:
                    self.readers.append((SWAP, array, row))
                else:
                    rows = array[0] if swap else array
                    self.readers.append(
                        (ROWS, rows.data.cast("B"), row) if rows.flags.c_contiguous else (COPY, rows, row)
                    )
                continue
            chain = storage.chains.get(name)
            if chain is None:
                if part == "index":
                    self.readers.append((FILL, bytes(row), row))
            elif part == "index":
                flat = chain.index.flags.c_contiguous and (chain.index.ndim == 1 or chain.index.shape[0] == 1)
                self.readers.append(
                    (INDEX, (name, chain, chain.index.reshape(-1).data.cast("B") if flat else None), row)
                )
            else:
                self.readers.append((SLOTS, name, row))

    def current(self, storage: Storage) -> bool:
        """Whether this reads ``storage`` as it stands (its arrays not replaced since)."""
        return storage is self.storage and storage.arrays is self.arrays and storage.chains is self.chains

    def read(self, lo: int, hi: int, lengths: np.ndarray) -> tuple[list[Any], tuple[int, ...]]:
        """The record's pieces (buffers: the lengths, then each column's bytes) and the slots
        each chain's piece holds."""
        n = hi - lo
        one = len(lengths) == 1
        pieces: list[Any] = [_LENGTH.pack(n) if one else lengths.astype(EPISODE_LENGTHS.dtype, copy=False)]
        slots: dict[str, Any] = {}
        for kind, source, row in self.readers:
            if kind == ROWS:
                pieces.append(source[lo * row : hi * row])
            elif kind == FILL:
                pieces.append(source * n)
            elif kind == SWAP:
                pieces.append(np.ascontiguousarray(source[:, lo:hi].swapaxes(0, 1)))
            elif kind == COPY:
                pieces.append(np.ascontiguousarray(source[lo:hi]))
            elif kind == INDEX:
                name, chain, flat = source
                last = CHAINED
                if one and flat is not None and n <= _RUN:
                    last = int.from_bytes(flat[(hi - 1) * 4 : hi * 4], sys.byteorder, signed=True)
                if last != CHAINED and flat[lo * 4 : (hi - 1) * 4] == _CHAINED_RUN[: (n - 1) * 4]:
                    # most often: one agent's episode whose rows are chained but for its last
                    pieces.append(flat[lo * 4 : hi * 4])
                    tail = chain.tail
                    slots[name] = tail[last : last + 1] if last > 0 else tail[:0]
                else:
                    index, slots[name] = self._chain(chain, lo, hi, lengths)
                    pieces.append(index)
            else:
                pieces.append(slots[source])
        return pieces, tuple(len(slots[name]) if name in slots else 0 for name in CHAINS)

    def _chain(self, chain: Chain, lo: int, hi: int, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A next value's index over ``[lo, hi)`` as the file holds it, and its slots' values."""
        index = chain.index[..., lo:hi]
        if chain.per_agent:
            index = index[0] if index.shape[0] == 1 else np.ascontiguousarray(index.swapaxes(0, 1))
        last = lengths.cumsum() - 1
        if (index[last] != CHAINED).all():
            return index, chain.tail[index[index > 0]]
        # seldom: an episode's last row reads the row after it, which the log does not hold
        index, named = chain.appended(
            slice(lo, hi), 1, (last, functools.partial(self.storage.successor_rows, last + lo))
        )
        if chain.per_agent:
            index = index[0] if index.shape[0] == 1 else np.ascontiguousarray(index.swapaxes(0, 1))
        return index, in_order(index, named)


def in_order(index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values``, the slots ``1, 2, ...`` that ``index`` (laid out as a file holds it) names,
    in the order of the rows naming them: the form a journal record holds them in."""
    return values[index[index > 0] - 1]
