"""The episode log's journal: the episodes a buffer's recording ends, each written in one record
the moment it ends, then folded into the column files many at a time (`flexibuff_envs.log`).

An append straight to the columns costs a write to every column file and a commit entry, about
a dozen calls whatever the episode's size; a record is one write. ``journal.fblog`` holds
records one after the other::

    b"FBJOURNL" | u64 first episode (the log's number of its first) | u64 episodes | u64 rows
    | u64 slots each of obs_, state_, action_mask_ adds | u64 body bytes | u32 crc32 of the body
    | u32 crc32 of all before it
    body: each episode's length (int64), then each column's bytes as an append would put them
    (the log's columns in order), but for a next value's: its index marks each row with a slot
    of its own positive, and its slots hold their values in the order of those rows

A record counts when it is whole (both checksums hold) and continues the log: its first episode
is the next one after the log's newest commit and every record before it. Records the log
already holds (folded, but the journal not yet emptied when a crash came) are passed over, and
anything else ends the journal: what follows is a torn record and is never read. Folding appends
the records' episodes to the columns as commits (at most 4 MiB of them each, so folding a long
journal needs little memory) and then empties the journal.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from flexibuff_envs.log.format import CHAINS, EPISODE_LENGTHS, PIECE, Column, Commit, fail
from flexibuff_envs.storage.next_values import CHAINED

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so no guard against two writers there
    fcntl = None  # type: ignore[assignment]

JOURNAL = "journal.fblog"
#: bytes of records folded in one commit: what a fold holds in memory (twice over, read and
#: joined), which a long recording's resident memory keeps once it has folded
FOLD = 1 << 22
_MAGIC = b"FBJOURNL"
MARK = b"FBJRMARK"  # a marker's magic (`log.markers`)
_RECORD = struct.Struct(f"<8sQQQ{len(CHAINS)}QQI")  # then the crc32 of the record's header
RECORD_BYTES = _RECORD.size + 4


class Record(NamedTuple):
    """One record's header: where it starts in the journal and what its body holds."""

    offset: int
    first: int  # the log's number of its first episode
    episodes: int
    rows: int
    slots: tuple[int, ...]  # per chain (`CHAINS`), the next-value slots its body holds
    size: int  # bytes of its body
    crc: int
    mark: bool = False  # a marker: its body names ring rows (`log.markers`), not their bytes

    @property
    def end(self) -> int:
        return self.offset + RECORD_BYTES + self.size


def body_bytes(columns: Sequence[Column], episodes: int, rows: int, slots: Sequence[int]) -> int:
    """The bytes of a record's body holding ``episodes`` of ``rows`` and ``slots`` per chain."""
    counts = (slots[CHAINS.index(c.name)] if c.part == "tail" else rows for c in columns)
    return episodes * EPISODE_LENGTHS.row_bytes + sum(n * c.row_bytes for n, c in zip(counts, columns))


def record(
    offset: int, first: int, pieces: Sequence[Any], episodes: int, rows: int, slots: tuple[int, ...]
) -> tuple[Record, bytes]:
    """The record of ``pieces`` (buffers: the ``episodes``' lengths, then each column's bytes,
    C-contiguous) after ``first`` episodes of the log, written at ``offset``: its header, and
    its bytes."""
    body = b"".join(pieces)
    new = Record(offset, first, episodes, rows, slots, len(body), zlib.crc32(body))
    return new, head(_MAGIC, first, episodes, rows, slots, len(body), new.crc) + body


def head(magic: bytes, first: int, episodes: int, rows: int, slots: Sequence[int], size: int, crc: int) -> bytes:
    """A record's header (``magic``: a record's, or a marker's), its crc32 after it."""
    raw = _RECORD.pack(magic, first, episodes, rows, *slots, size, crc)
    return raw + struct.pack("<I", zlib.crc32(raw))


def _header(fd: int, offset: int, size: int) -> Record | None:
    """The record whose header starts at ``offset``, if the header is whole and its body fits
    in the ``size`` bytes of the file."""
    raw = os.pread(fd, RECORD_BYTES, offset)
    if len(raw) < RECORD_BYTES or zlib.crc32(raw[: _RECORD.size]) != struct.unpack("<I", raw[_RECORD.size :])[0]:
        return None
    magic, first, episodes, rows, *rest = _RECORD.unpack(raw[: _RECORD.size])
    record = Record(offset, first, episodes, rows, tuple(rest[: len(CHAINS)]), rest[-2], rest[-1], magic == MARK)
    return record if magic in (_MAGIC, MARK) and record.end <= size else None


def marked_bytes(record: Record) -> bool:
    """Whether a marker's body can hold its episodes' lengths and ``lo, hi`` ranges of rows."""
    ranges = record.size - 8 * record.episodes
    return not any(record.slots) and ranges > 0 and ranges % 16 == 0 and ranges // 16 <= record.rows


def _held(record: Record, columns: Sequence[Column]) -> bool:
    """Whether ``record``'s counts are ones a recording writes: no slots for a next value the log
    has no column of, and every count below 2**48 (bytes are counted in int64)."""
    kept = {c.name for c in columns if c.part == "tail"}
    counts = (record.episodes, record.rows, *record.slots)
    return max(counts) < 1 << 48 and all(n == 0 or name in kept for name, n in zip(CHAINS, record.slots))


def _body_crc(fd: int, record: Record) -> int:
    crc, lo = 0, record.offset + RECORD_BYTES
    while lo < record.end:
        piece = os.pread(fd, min(PIECE, record.end - lo), lo)
        if not piece:
            break
        crc = zlib.crc32(piece, crc)
        lo += len(piece)
    return crc


def scan(directory: str, columns: Sequence[Column], commit: Commit) -> tuple[list[Record], int, int]:
    """The journal's records that continue the log as of ``commit``, in order; the bytes the
    journal's whole records end at (those the log holds counted too: what lies past is torn);
    and the journal's size."""
    path = os.path.join(directory, JOURNAL)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return [], 0, 0
    except OSError as exc:
        raise fail(path, f"cannot be read ({exc.strerror or exc})") from None
    records: list[Record] = []
    try:
        size = os.fstat(fd).st_size
        offset, expected = 0, commit.episodes
        while (record := _header(fd, offset, size)) is not None:
            if record.first + record.episodes <= commit.episodes and record.first < expected:
                offset = record.end  # folded already: the journal was not emptied before a crash
                continue
            if (
                record.first != expected
                or not record.episodes
                or not _held(record, columns)
                or (
                    not marked_bytes(record)
                    if record.mark
                    else record.size != body_bytes(columns, record.episodes, record.rows, record.slots)
                )
                or _body_crc(fd, record) != record.crc
            ):
                break
            records.append(record)
            offset, expected = record.end, expected + record.episodes
    finally:
        os.close(fd)
    return records, offset, size


def batches(records: Sequence[Record]) -> Iterator[list[Record]]:
    """``records`` in runs of at most `FOLD` bytes of bodies (a larger record alone), records
    and markers in runs of their own."""
    run: list[Record] = []
    held = 0
    for record in records:
        if run and (held + record.size > FOLD or record.mark != run[0].mark):
            yield run
            run, held = [], 0
        run.append(record)
        held += record.size
    if run:
        yield run


def parts(
    directory: str, columns: Sequence[Column], run: Sequence[Record], tails: Sequence[int]
) -> tuple[list[np.ndarray], int, int, tuple[int, ...]]:
    """The pieces a commit of ``run`` puts (the episodes' lengths, then each column's rows, next
    values numbered after the log's ``tails``), its rows, episodes and slots added per chain.

    Raises:
        BufferFileError: a whole record holds values no recording writes (lengths that do not
            sum to its rows, a next value naming a slot it does not hold): a crafted journal.
    """
    path = os.path.join(directory, JOURNAL)
    with open(path, "rb") as handle:
        handle.seek(run[0].offset)
        raw = memoryview(handle.read(run[-1].end - run[0].offset))
    if len(raw) < run[-1].end - run[0].offset:  # cut since it was scanned (by hand: no writer cuts it)
        raise fail(path, f"holds fewer bytes than its records at byte {run[0].offset} on")
    return parts_of(path, columns, run, tails, raw)


def parts_of(
    path: str, columns: Sequence[Column], run: Sequence[Record], tails: Sequence[int], raw: memoryview
) -> tuple[list[np.ndarray], int, int, tuple[int, ...]]:
    """`parts` of the records ``run`` whose bytes are ``raw`` (from the first one's offset on;
    ``path``: the journal's, for errors)."""
    rows = np.array([r.rows for r in run], dtype=np.int64)
    slots = np.array([r.slots for r in run], dtype=np.int64).reshape(len(run), len(CHAINS))
    files = [EPISODE_LENGTHS, *columns]
    counts = np.stack(
        [
            np.array([r.episodes for r in run], dtype=np.int64),
            *(slots[:, CHAINS.index(c.name)] if c.part == "tail" else rows for c in columns),
        ],
        axis=1,
    )
    sizes = counts * np.array([c.row_bytes for c in files], dtype=np.int64)
    starts = np.array([r.offset for r in run], dtype=np.int64) - run[0].offset + RECORD_BYTES
    offsets = starts[:, None] + np.cumsum(sizes, axis=1) - sizes
    pieces = []
    for column, lo, hi in zip(files, offsets.T.tolist(), (offsets + sizes).T.tolist()):
        values = np.frombuffer(b"".join(map(raw.__getitem__, map(slice, lo, hi))), column.dtype)  # every record's
        if column is EPISODE_LENGTHS and (
            (values < 1).any() or (np.add.reduceat(values, starts_of(counts[:, 0])) != rows).any()
        ):
            raise fail(path, f"corrupt record after byte {run[0].offset}: its episode lengths do not sum to its rows")
        if column.part == "index":  # the rows with a slot of their own, numbered after the log's slots
            k, named = CHAINS.index(column.name), values > 0
            per_record = np.add.reduceat(named, starts_of(rows * int(np.prod(column.shape))))
            if (values < CHAINED).any() or (per_record != slots[:, k]).any():
                raise fail(path, f"corrupt record after byte {run[0].offset}: its rows name other slots than it holds")
            values = values.copy()
            values[named] = np.arange(tails[k], tails[k] + per_record.sum(), dtype=values.dtype)
        pieces.append(values)
    return pieces, int(rows.sum()), len(pieces[0]), tuple(int(n) for n in slots.sum(axis=0))


def starts_of(counts: np.ndarray) -> np.ndarray:
    """Where each of runs of ``counts`` values starts among them all."""
    return np.cumsum(counts) - counts


def lock(fd: int, path: str, *, shared: bool = False) -> bool:
    """Take the journal's lock without waiting (a writer's own, or a reader's shared one);
    whether it was free."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise fail(path, f"cannot be locked ({exc.strerror or exc})") from None
    return True


def writing(directory: str) -> bool:
    """Whether a writer holds the log ``directory`` open (in this process or another)."""
    path = os.path.join(directory, JOURNAL)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return not lock(fd, path, shared=True)
    finally:
        os.close(fd)  # lets go of the shared lock too
