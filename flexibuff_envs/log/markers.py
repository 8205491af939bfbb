"""Episodes of a buffer whose ring is in files (`flexibuff_envs.log.ring_files`): at an episode's end
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

from flexibuff_envs.log.format import CHAINS, fail
from flexibuff_envs.log.journal import MARK, RECORD_BYTES, Record, head
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.stored_form import Segments, segment_rows

_ONE = struct.Struct("<qqq")  # one episode in one range: its length, lo, hi
#: the record-form pieces of episodes of ``lengths`` in ring rows ``rows``, how many, their rows,
#: and each chain's slots (`LogWriter`'s reading of a buffer)
Read = Callable[[Segments | np.ndarray, np.ndarray], tuple[list[Any], int, int, tuple[int, ...]]]


_NONE = (0,) * len(CHAINS)  # a marker's slots: its rows' are in the ring


class Marks:
    """The ended episodes of ``storage`` (its arrays in files; None: no buffer's) not yet
    folded, in order."""

    def __init__(self, storage: Storage | None) -> None:
        self.storage = storage
        self.pending: list[tuple[Segments | np.ndarray, np.ndarray]] = []
        self.episodes = 0  # of them
        # per ring row, whether a pending episode may hold it (`touches`)
        self.held = np.zeros(0 if storage is None else storage.lane_rows * len(storage.opened), dtype=bool)

    def marker(self, first: int, rows: Segments | np.ndarray, lengths: np.ndarray) -> bytes:
        """The marker of episodes of ``lengths`` in ring rows ``rows``, the log's ``first`` on
        (`add` them once it is written)."""
        if len(lengths) == 1 and not isinstance(rows, np.ndarray) and len(rows) == 1:
            lo, hi = rows[0]
            return self.one(first, lo, hi - lo)
        body = lengths.astype(np.int64).tobytes() + bounds(rows).tobytes()
        return head(MARK, first, len(lengths), int(lengths.sum()), _NONE, len(body), zlib.crc32(body)) + body

    @staticmethod
    def one(first: int, lo: int, n: int) -> bytes:
        """The marker of the log's ``first`` episode, in the ``n`` ring rows from ``lo``."""
        body = _ONE.pack(n, lo, lo + n)
        return head(MARK, first, 1, n, _NONE, _ONE.size, zlib.crc32(body)) + body

    def add(self, rows: Segments | np.ndarray, lengths: np.ndarray) -> None:
        """Episodes of ``lengths`` in ring rows ``rows`` are pending (their marker written)."""
        self.pending.append((rows, lengths))
        self.episodes += len(lengths)
        if isinstance(rows, np.ndarray):
            self.held[rows] = True
        else:
            for lo, hi in rows:
                self.held[lo:hi] = True

    def touches(self, rows: np.ndarray | slice) -> bool:
        """Whether a pending episode may hold one of the ring rows ``rows``."""
        return bool(self.pending) and bool(self.held[rows].any())

    def runs(self, most: int) -> Iterator[tuple[Segments | np.ndarray, np.ndarray, int]]:
        """The pending episodes in order, those back to back in one range of the ring together
        (at most ``most`` rows a run, but for one longer episode), each run with how many
        pending entries it holds (`done` drops them once folded, while this goes on: it reads
        the pending entries as they were when it began)."""
        lo = hi = -1
        lengths: list[np.ndarray] = []
        for rows, these in tuple(self.pending):
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

    def batches(self, most: int) -> Iterator[tuple[Segments | np.ndarray, np.ndarray, int]]:
        """The pending episodes in order, as many `runs` together as hold at most ``most`` rows
        (a longer run alone): their ring rows (ranges, or row numbers where any run's are), their
        lengths and how many pending entries they hold."""
        batch: list[tuple[Segments | np.ndarray, np.ndarray, int]] = []
        held = 0
        for run in self.runs(most):
            n = int(run[1].sum())
            if batch and held + n > most:
                yield _joined(batch)
                batch, held = [], 0
            batch.append(run)
            held += n
        if batch:
            yield _joined(batch)

    def done(self, entries: int, episodes: int) -> None:
        """The first ``entries`` pending entries (``episodes`` episodes) are folded."""
        del self.pending[:entries]
        self.episodes -= episodes
        if not self.pending:
            self.held[:] = False


def _joined(
    runs: list[tuple[Segments | np.ndarray, np.ndarray, int]],
) -> tuple[Segments | np.ndarray, np.ndarray, int]:
    """`runs` as one: their rows one after the other, their lengths, their entries."""
    if len(runs) == 1:
        return runs[0]
    lengths = np.concatenate([these for _, these, _ in runs])
    entries = sum(held for _, _, held in runs)
    if not any(isinstance(rows, np.ndarray) for rows, _, _ in runs):
        return [bound for rows, _, _ in runs for bound in rows], lengths, entries  # type: ignore[union-attr]
    numbers = [rows if isinstance(rows, np.ndarray) else segment_rows(rows) for rows, _, _ in runs]
    return np.concatenate(numbers), lengths, entries


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


def bounds(rows: Segments | np.ndarray) -> np.ndarray:
    """``lo, hi`` of each range of ring rows ``rows`` (ranges, or rows: runs of consecutive ones)."""
    if not isinstance(rows, np.ndarray):
        return np.array([bound for run in rows for bound in run], dtype=np.int64)
    edge = np.empty(len(rows) + 1, dtype=bool)  # a range begins after each edge, and ends before it
    edge[0] = edge[-1] = True
    np.not_equal(np.diff(rows), 1, out=edge[1:-1])
    at = np.flatnonzero(edge)
    out = np.empty(2 * len(at) - 2, dtype=np.int64)
    out[0::2], out[1::2] = rows[at[:-1]], rows[at[1:] - 1] + 1
    return out


def parse(path: str, record: Record, body: bytes, capacity: int) -> tuple[Segments, np.ndarray]:
    """The ring rows and lengths of the episodes of the marker ``record`` (body ``body``) of the
    journal ``path``, checked against a ring of ``capacity`` rows.

    Raises:
        BufferFileError: they are not rows of the ring, or not its episodes' rows.
    """
    values = np.frombuffer(body, dtype="<i8")
    lengths, ranges = values[: record.episodes], values[record.episodes :].reshape(-1, 2)
    lo, hi = ranges[:, 0], ranges[:, 1]
    if (
        (lengths < 1).any()
        or lengths.sum() != record.rows
        or (lo < 0).any()
        or (hi <= lo).any()
        or (hi > capacity).any()
        or (hi - lo).sum() != record.rows
    ):
        raise fail(path, f"corrupt marker at byte {record.offset}: it names other rows than its episodes'")
    return [(int(a), int(b)) for a, b in ranges.tolist()], lengths.astype(np.int64)
