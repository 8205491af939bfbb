"""The one stored form rows leave and enter a buffer in: `Part` (files, chunks and memory maps
hold it) and `Stored`, a storage's rows in that form, each part made when read."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from flexibuff_envs.storage import Storage


#: ring rows as ``[lo, hi)`` ranges, in order
Segments = Sequence[tuple[int, int]]


def segment_rows(segments: Sequence[tuple[int, int]]) -> np.ndarray:
    """The rows of the ring ranges ``[lo, hi)`` of ``segments``, range after range."""
    if len(segments) == 1:
        return np.arange(*segments[0])
    return np.concatenate([np.arange(lo, hi) for lo, hi in segments] or [np.zeros(0, dtype=np.int64)])


def runs(segments: Segments) -> Iterator[tuple[int, int, slice]]:
    """Each ring range ``[lo, hi)`` of ``segments``, and where its rows lie when the ranges'
    rows are put back to back."""
    at = 0
    for lo, hi in segments:
        yield lo, hi, slice(at, at + hi - lo)
        at += hi - lo


def views(array: np.ndarray, per_agent: bool, segments: Segments) -> tuple[np.ndarray, ...]:
    """The rows ``segments`` of ``array``, a view per range."""
    if len(segments) == 1:  # the common case, without building a list
        lo, hi = segments[0]
        return (array[:, lo:hi] if per_agent else array[lo:hi],)
    if per_agent:
        return tuple([array[:, lo:hi] for lo, hi in segments])
    return tuple([array[lo:hi] for lo, hi in segments])


@dataclass(frozen=True, eq=False)
class Part:
    """One array of a buffer's stored form, the one form files hold, chunks carry and memory maps
    give (`Storage.export`, `Storage.insert`, `Storage.receive`, `Storage.adopt`): field
    ``name``'s rows (``part`` None), or a chained next value's ``"index"`` (a slot per row;
    `CHAINED`: the base field at the next row) or ``"tail"`` (the slots it names, slot 0 zeros);
    ``"bools"`` while a format 1-2 file's masks are read, a bool per action, until `settle`.

    ``pieces`` hold its rows in order, ``[n_agents, n, ...]`` each for a per-agent field and
    ``[n, ...]`` else; a tail is one piece.
    """

    name: str
    part: str | None
    per_agent: bool
    pieces: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, name: str, part: str | None, array: np.ndarray, per_agent: bool, segments: Segments) -> Part:
        """The rows ``segments`` of ``array`` (views)."""
        return cls(name, part, per_agent, views(array, per_agent, segments))

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.part

    @property
    def axis(self) -> int:
        """The axis of its rows."""
        return int(self.per_agent and self.part != "tail")

    @functools.cached_property
    def shape(self) -> tuple[int, ...]:
        first, axis = self.pieces[0], self.axis
        return (*first.shape[:axis], sum(piece.shape[axis] for piece in self.pieces), *first.shape[axis + 1 :])

    @property
    def dtype(self) -> np.dtype:
        return self.pieces[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(piece.nbytes for piece in self.pieces)

    def blocks(self) -> Iterator[np.ndarray]:
        """Its values in the C order of `shape`, as pieces that are contiguous where its arrays
        are: agent after agent, each rows first to last."""
        for agent in range(self.shape[0]) if self.axis else (None,):
            for piece in self.pieces:
                yield piece if agent is None else piece[agent]

    def whole(self) -> np.ndarray:
        """Its values as one array of `shape`."""
        return self.pieces[0] if len(self.pieces) == 1 else np.concatenate(self.pieces, axis=self.axis)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Its rows ``[lo, hi)`` (a tail whole)."""
        whole = self.whole()
        return whole if self.part == "tail" else whole[:, lo:hi] if self.axis else whole[lo:hi]


@dataclass(frozen=True, eq=False)
class Blocked(Part):
    """The rows ``segments`` of ``array`` (a `PackedRing`: rows kept compressed) as a file writes
    or reads them, a block of rows at a time, so a field kept compressed is never whole in
    memory. ``pieces`` only stand for its shape (one zero, broadcast)."""

    array: Any = None
    segments: Segments = ()

    #: rows of a block
    BLOCK = 256

    @classmethod
    def over(cls, name: str, array: Any, per_agent: bool, segments: Segments, **more: Any) -> Blocked:
        """The rows ``segments`` of field ``name``'s ``array``."""
        rows = sum(hi - lo for lo, hi in segments)
        shape = (*array.shape[:per_agent], rows, *array.shape[1 + per_agent :])
        return cls(name, None, per_agent, (np.broadcast_to(np.zeros((), array.dtype), shape),), array, segments, **more)

    def spans(self) -> Iterator[tuple[Any, int]]:
        """Where each block lies in ``array`` (an index), and its rows, in the order of `blocks`."""
        for agent in range(self.shape[0]) if self.axis else (None,):
            for lo, hi, _ in runs(self.segments):
                for start in range(lo, hi, self.BLOCK):
                    rows = slice(start, min(start + self.BLOCK, hi))
                    yield ((agent, rows) if self.axis else rows), rows.stop - start


@dataclass(frozen=True, eq=False)
class Decoded(Blocked):
    """`Blocked` rows read: each block decoded as it is asked for (a file being written)."""

    def blocks(self) -> Iterator[np.ndarray]:
        for where, _ in self.spans():
            yield self.array[where]

    def whole(self) -> np.ndarray:
        """Every row at once (what `blocks` avoids)."""
        return np.concatenate([self.array[where] for where, _ in self.spans()]).reshape(self.shape)


@dataclass(frozen=True, eq=False)
class Streamed(Blocked):
    """`Blocked` rows written: each block a file's reader filled goes to ``array`` once the next
    is asked for (the last by `flush`)."""

    filling: list[tuple[Any, np.ndarray]] = dataclasses.field(default_factory=list)  # the block being read

    def blocks(self) -> Iterator[np.ndarray]:
        row = self.shape[1 + self.axis :]
        for where, n in self.spans():
            self.flush()
            block = np.empty((n, *row), self.dtype)
            self.filling.append((where, block))
            yield block

    def flush(self) -> None:
        """Write the block read last to ``array``."""
        while self.filling:
            where, block = self.filling.pop()
            self.array[where] = block


class Stored:
    """Rows of ``storage`` in their stored form, as `Part` pieces hold them, each part made when
    it is read (`get`: a writer that reads every part once pays for nothing else).

    ``rows``: ring ranges (each field's pieces are views of its arrays, one per range) or row
    numbers (copies). Each chain's parts hold the slots those rows name, renumbered ``1, 2,
    ...``; a chained row at a position in ``last`` (an episode's end, whose successor does not
    follow it in ``rows``) gets a slot with its value.
    """

    def __init__(self, storage: Storage, rows: Segments | np.ndarray, last: np.ndarray | None = None) -> None:
        self.storage, self.last = storage, last
        self._arrays, self._fields = storage.arrays, storage.fields
        # ring ranges, or the row numbers (made from the ranges once a chain needs them)
        self._segments: Segments | None = None if isinstance(rows, np.ndarray) else rows
        self._numbers: np.ndarray | None = rows if isinstance(rows, np.ndarray) else None
        self._chains: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # extracted: name -> (index, tail)

    def get(self, key: tuple[str, str | None], default: Any = None) -> Any:
        name, part = key
        if part is None:
            array = self._arrays.get(name)
            if array is None:
                return default
            per_agent = self._fields[name].per_agent
            if self._segments is not None:
                return views(array, per_agent, self._segments)
            return (array.take(self._numbers, axis=int(per_agent)),)  # type: ignore[arg-type]
        storage = self.storage
        if name not in storage.chains or part not in ("index", "tail"):
            return default
        extracted = self._chains.get(name)
        if extracted is None:
            rows: np.ndarray | slice
            if self._numbers is None and self._segments is not None and len(self._segments) == 1:
                ((lo, hi),) = self._segments  # one range of the ring: read through a slice
                rows = slice(lo, hi)
            else:
                if self._numbers is None:
                    self._numbers = segment_rows(self._segments or ())
                rows = self._numbers
            last = self.last
            cut = None
            if last is not None:  # the ring rows at those positions, whose successors a cut needs
                at = last + rows.start if isinstance(rows, slice) else rows[last]
                cut = (last, functools.partial(storage.successor_rows, at))
            extracted = self._chains[name] = storage.chains[name].extract(rows, cut)
        return (extracted[part == "tail"],)

    def __iter__(self) -> Iterator[tuple[str, str | None]]:
        yield from ((name, None) for name in self.storage.arrays)
        for name in self.storage.chains:
            yield from ((name, "index"), (name, "tail"))

    def parts(self, *, blocked: bool = False) -> list[Part]:
        """Every part, made now; with ``blocked``, a field whose rows are kept compressed (no
        numpy array) as `Decoded`: decoded a block of rows at a time as a file writer reads it."""
        fields, chains = self.storage.fields, self.storage.chains
        arrays, segments = self.storage.arrays, self._segments
        return [
            Decoded.over(name, arrays[name], fields[name].per_agent, segments)
            if blocked and part is None and segments is not None and not isinstance(arrays[name], np.ndarray)
            else Part(
                name,
                part,
                chains[name].per_agent if part == "index" else part is None and fields[name].per_agent,
                self.get((name, part)),
            )
            for name, part in self
        ]
