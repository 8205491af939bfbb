"""Episodes of a buffer whose ring is in files (`flexibuff_envs.log.ring`): at an episode's end
the journal gets a marker, its ring rows and length in a few dozen bytes, where a record would
copy its rows; the fold reads the rows from the ring (`LogWriter.fold`), many episodes at once.

A marker is a journal record (`journal`) whose magic is ``FBJRMARK`` and whose body is the
episodes' lengths (int64), then the ring rows they lie in: ``lo, hi`` pairs of ranges, or each
row (int64) when they were gathered.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from flexibuff_envs.log.format import CHAINS
from flexibuff_envs.log.journal import RECORD_BYTES, Record, head
from flexibuff_envs.parts import Segments
from flexibuff_envs.storage import Storage

MARK = b"FBJRMARK"
_ONE = struct.Struct("<qqq")  # one episode in one range: its length, lo, hi
#: the record-form pieces of episodes of ``lengths`` in ring rows ``rows``, how many, their rows,
#: and each chain's slots (`LogWriter`'s reading of a buffer)
Read = Callable[[Segments | np.ndarray, np.ndarray], tuple[list[Any], int, int, tuple[int, ...]]]


def _head_one(first: int, rows: int, crc: int) -> bytes:
    """`head` of the marker of one episode of ``rows`` in one range (its body's crc32 ``crc``)."""
    return head(MARK, Record(0, first, 1, rows, _NONE, _ONE.size, crc))


_NONE = (0,) * len(CHAINS)


class Marks:
    """The ended episodes of ``storage`` (its arrays in files; None: no buffer's) not yet
    folded, in order."""

    def __init__(self, storage: Storage | None) -> None:
        self.storage = storage
        self.pending: list[tuple[Segments | np.ndarray, np.ndarray]] = []
        self.episodes = 0  # of them

    def marker(self, first: int, rows: Segments | np.ndarray, lengths: np.ndarray) -> bytes:
        """The marker of episodes of ``lengths`` in ring rows ``rows``, the log's ``first`` on
        (`add` them once it is written)."""
        if len(lengths) == 1 and not isinstance(rows, np.ndarray) and len(rows) == 1:
            lo, hi = rows[0]
            body = _ONE.pack(hi - lo, lo, hi)
            return _head_one(first, hi - lo, zlib.crc32(body)) + body
        bounds = rows if isinstance(rows, np.ndarray) else [bound for run in rows for bound in run]
        body = lengths.astype(np.int64).tobytes() + np.asarray(bounds, dtype=np.int64).tobytes()
        record = Record(0, first, len(lengths), int(lengths.sum()), (0,) * len(CHAINS), len(body), zlib.crc32(body))
        return head(MARK, record) + body

    def add(self, rows: Segments | np.ndarray, lengths: np.ndarray) -> None:
        """Episodes of ``lengths`` in ring rows ``rows`` are pending (their marker written)."""
        self.pending.append((rows, lengths))
        self.episodes += len(lengths)

    def runs(self, most: int) -> Iterator[tuple[Segments | np.ndarray, np.ndarray, int]]:
        """The pending episodes in order, those back to back in one range of the ring together
        (at most ``most`` rows a run, but for one longer episode), each run with how many
        pending entries it holds (`done` drops them once folded)."""
        lo = hi = -1
        lengths: list[np.ndarray] = []
        for rows, these in self.pending:
            single = not isinstance(rows, np.ndarray) and len(rows) == 1
            if single and rows[0][0] == hi and rows[0][1] - lo <= most:
                hi = rows[0][1]
                lengths.append(these)
                continue
            if lengths:
                yield [(lo, hi)], np.concatenate(lengths), len(lengths)
            if single:
                (lo, hi), lengths = rows[0], [these]
            else:
                lo, hi, lengths = -1, -1, []
                yield rows, these, 1
        if lengths:
            yield [(lo, hi)], np.concatenate(lengths), len(lengths)

    def done(self, entries: int, episodes: int) -> None:
        """The first ``entries`` pending entries (``episodes`` episodes) are folded."""
        del self.pending[:entries]
        self.episodes -= episodes


def in_records(
    runs: Iterator[tuple[Segments | np.ndarray, np.ndarray, int]], read: Read, first: int, most: int
) -> Iterator[tuple[list[Record], memoryview, int]]:
    """The ``runs`` of episodes (the log's ``first`` on) as journal records in memory, as many
    as fit in ``most`` bytes a batch (a larger one alone), each batch with the pending entries
    it holds: what `journal.parts_of` folds."""
    batch: list[Record] = []
    raw: list[Any] = []
    size = entries = 0
    for rows, lengths, held in runs:
        pieces, episodes, n, slots = read(rows, lengths)
        body = sum(len(p) if p.__class__ is bytes else p.nbytes for p in pieces)
        if batch and size + body > most:
            yield batch, memoryview(b"".join(raw)), entries
            batch, raw, size, entries = [], [], 0, 0
        batch.append(Record(size, first, episodes, n, slots, body, 0))
        raw += [bytes(RECORD_BYTES), *pieces]
        size += RECORD_BYTES + body
        first += episodes
        entries += held
    if batch:
        yield batch, memoryview(b"".join(raw)), entries
