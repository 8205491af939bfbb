"""Reading an episode log: its newest whole commit, the checks of what it counts, verify, repair
and the columns as a buffer's arrays, mapped or read (`flexibuff_envs.log`)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from flexibuff_envs.log.compressed import check_frames, frames_end, mapped_array, opened, packed_of, spans
from flexibuff_envs.log.format import (
    CHAINS,
    COMMITS,
    ENTRY_BYTES,
    EPISODE_LENGTHS,
    PIECE,
    Column,
    Commit,
    LogHeader,
    LogReport,
    Torn,
    fail,
    parse_entry,
    read_header,
)
from flexibuff_envs.log.journal import JOURNAL, batches, parts, scan, writing
from flexibuff_envs.log.ring_files import RING, kept
from flexibuff_envs.log.stage_files import left as stages_left
from flexibuff_envs.log.syncing import checked_from
from flexibuff_envs.storage.next_values import CHAINED


@dataclass
class State:
    """A log as its files stand: header, columns and the newest whole commit."""

    directory: str
    header: LogHeader
    columns: list[Column]
    commit: Commit
    sizes: dict[str, int] = field(default_factory=dict)  # file -> bytes it holds

    def path(self, column: Column) -> str:
        return os.path.join(self.directory, column.file)

    @property
    def files(self) -> list[Column]:
        return [EPISODE_LENGTHS, *self.columns]

    def frames_end(self, column: Column, commit: Commit | None = None) -> int:
        """Where a ``codec`` column's frames counted by ``commit`` (the newest whole) end: the
        last end its file holds (0 for none)."""
        with opened(self.path(column)) as handle:
            return frames_end(handle, column, commit or self.commit)

    def counted(self) -> dict[str, int]:
        """Bytes of each file the newest whole commit counts."""
        counted = {COMMITS: (self.commit.number + 1) * ENTRY_BYTES}
        for column in self.files:
            counted[column.file] = self.commit.length(column)
            if column.codec is not None:
                counted[column.frames_file] = self.frames_end(column)
        return counted

    def torn(self) -> tuple[Torn, ...]:
        counted = self.counted()
        return tuple(
            Torn(os.path.join(self.directory, name), counted[name], self.sizes[name] - counted[name])
            for name in counted
            if self.sizes[name] > counted[name]
        )


def file_sizes(directory: str, files: Sequence[Column]) -> dict[str, int]:
    sizes = {}
    names = [name for c in files for name in ((c.file, c.frames_file) if c.codec is not None else (c.file,))]
    for name in (COMMITS, *names):
        try:
            sizes[name] = os.path.getsize(os.path.join(directory, name))
        except FileNotFoundError:
            sizes[name] = 0
    return sizes


class Reader:
    """The log's files open for reading, to check commits against the bytes they count."""

    def __init__(self, state: State) -> None:
        self.state = state
        files = [name for name, size in state.sizes.items() if size and name != COMMITS]
        self.handles = {name: opened(os.path.join(state.directory, name)) for name in files}
        self.commits = opened(os.path.join(state.directory, COMMITS))

    def __enter__(self) -> Reader:  # noqa: PYI034 (Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in [*self.handles.values(), self.commits]:
            handle.close()

    def entry(self, number: int) -> tuple[Commit, int] | None:
        return parse_entry(os.pread(self.commits.fileno(), ENTRY_BYTES, number * ENTRY_BYTES), number)

    def holds(self, before: Commit, after: Commit, crc: int) -> bool:
        """Whether commit ``after`` follows ``before`` and the bytes it adds are in place."""
        state = self.state
        if not (
            after.rows >= before.rows
            and after.episodes >= before.episodes
            and all(b <= a for b, a in zip(before.tails, after.tails))
        ):
            return False
        if any(state.sizes[column.file] < after.length(column) for column in state.files):
            return False
        mine = 0
        for column in state.files:
            if column.codec is not None:  # its frames, then their ends
                frames = self.handles.get(column.frames_file)
                lo, hi = (frames_end(self.handles[column.file], column, commit) for commit in (before, after))
                if hi > state.sizes[column.frames_file] or lo > hi or (hi > lo and frames is None):
                    return False
                if hi > lo:
                    mine = _crc(frames, lo, hi, mine)  # type: ignore[arg-type]  # opened: it holds bytes
            mine = _crc(self.handles.get(column.file), before.length(column), after.length(column), mine)
        return mine == crc


def _crc(handle: BinaryIO | None, lo: int, hi: int, crc: int) -> int:
    """``crc`` (a crc32) continued over bytes ``[lo, hi)`` of the file open as ``handle``."""
    while lo < hi:
        piece = os.pread(handle.fileno(), min(PIECE, hi - lo), lo)  # type: ignore[union-attr]  # bytes: open
        crc = zlib.crc32(piece, crc)
        lo += len(piece)
    return crc


def state_of(directory: str, *, every: bool = False) -> State:
    """The log ``directory`` as of its newest whole commit: the newest entry that is whole and
    whose bytes are in place (entries before it are trusted). With ``every``, every entry and
    every byte it counts is checked, and damage before the newest whole entry raises."""
    header, columns = read_header(directory)
    state = State(directory, header, columns, Commit())
    state.sizes = file_sizes(directory, state.files)
    count = state.sizes[COMMITS] // ENTRY_BYTES
    if not count:
        return _counted(state)
    with Reader(state) as reader:
        if every:
            before = Commit()
            for k in range(count):
                item = reader.entry(k)
                if item is None or not reader.holds(before, *item):
                    if any(reader.entry(later) is not None for later in range(k + 1, count)):
                        raise fail(
                            os.path.join(directory, COMMITS),
                            f"damaged at commit {k}, before whole ones: a crash leaves only the newest commits torn",
                        )
                    break
                before = item[0]
            state.commit = before
            return _counted(state)
        first = checked_from(directory, count)
        if first is not None:  # synced in another boot: each commit since is checked (`log.syncing`)
            synced = reader.entry(first - 1) if first else (Commit(), 0)
            if synced is None:  # the record names a commit that is not whole: all are checked
                first, synced = 0, (Commit(), 0)
            state.commit = synced[0]
            for k in range(first, count):
                item = reader.entry(k)
                if item is None or not reader.holds(state.commit, *item):
                    break
                state.commit = item[0]
            return _counted(state)
        for k in range(count - 1, -1, -1):
            item = reader.entry(k)
            previous = reader.entry(k - 1) if k else (Commit(), 0)
            if item is not None and previous is not None and reader.holds(previous[0], *item):
                state.commit = item[0]
                break
    return _counted(state)


def _counted(state: State) -> State:
    """``state``, unless a file holds fewer bytes than its commit counts (a file cut or removed
    by hand: no crash does that)."""
    for name, size in state.counted().items():
        if state.sizes[name] < size:
            raise fail(
                os.path.join(state.directory, name),
                f"holds {state.sizes[name]:,} bytes, fewer than the {size:,} its commits count",
            )
    return state


def blocks(state: State, column: Column, count: int, first: int = 0) -> Iterator[np.ndarray]:
    """Rows ``[first, count)`` of ``column``, at most 16 MiB at a time (decoded, of a ``codec`` column)."""
    if count <= first:
        return
    if column.codec is not None:
        packed = packed_of(state.directory, column, count, mapped=True)
        for lo, hi in spans(count - first, PIECE // max(1, column.row_bytes)):
            yield packed.rows(first + lo, first + hi)
        return
    values = int(np.prod(column.shape, dtype=np.int64))
    with open(state.path(column), "rb") as handle:
        handle.seek(first * column.row_bytes)
        for lo, hi in spans(count - first, PIECE // max(1, column.row_bytes)):
            block = np.fromfile(handle, dtype=column.dtype, count=(hi - lo) * values)
            yield block.reshape((hi - lo, *column.shape))


def check_values(state: State) -> None:
    """`BufferFileError` unless the values sampling uses as indices or flags are in range:
    lengths positive and summing to the rows, bools 0 or 1, category indices within their
    categories, next-value indices naming a stored slot, each slot named once, and each
    episode's last row not chained (its successor is another episode's). Read a piece at a time."""
    commit, spec = state.commit, state.header.spec
    lengths = np.concatenate([*blocks(state, EPISODE_LENGTHS, commit.episodes), np.zeros(0, np.int64)])
    if (lengths < 1).any() or int(lengths.sum()) != commit.rows:
        raise fail(
            state.path(EPISODE_LENGTHS),
            f"corrupt: episode lengths must be positive and sum to the {commit.rows} rows committed",
        )
    categories = np.asarray(spec.obs_categories)
    ends = np.cumsum(lengths) - 1
    for column in state.columns:
        if column.codec is not None:
            check_frames(state.path(column), column, state.commit.count(column))
        if column.part == "tail":
            if (
                column.name == "obs_"
                and categories.size
                and any(
                    (block > categories).any() for block in blocks(state, column, commit.tails[CHAINS.index("obs_")])
                )
            ):
                raise fail(state.path(column), "corrupt: a value names a category past its space's size")
            continue
        if column.dtype == bool or (column.name == "obs" and categories.size) or column.part == "index":
            slots: list[np.ndarray] = []
            lo = 0
            for block in blocks(state, column, commit.rows):
                if column.dtype == bool and block.view(np.uint8).max(initial=0) > 1:
                    raise fail(state.path(column), "corrupt: a bool that is neither 0 nor 1")
                if column.name == "obs" and (block > categories).any():
                    raise fail(state.path(column), "corrupt: a value names a category past its space's size")
                if column.part == "index":
                    tails = commit.tails[CHAINS.index(column.name)]
                    if ((block < CHAINED) | (block >= tails)).any():
                        raise fail(state.path(column), f"corrupt: a row names a slot outside the {tails} stored")
                    at = ends[(ends >= lo) & (ends < lo + len(block))] - lo
                    if (block[at] == CHAINED).any():
                        raise fail(state.path(column), "corrupt: an episode's last row is chained to the next episode")
                    slots.append(block[block > 0])
                lo += len(block)
            if slots:
                named = np.concatenate(slots)
                if named.size and np.bincount(named, minlength=1).max() > 1:  # counting: no sort, no hash
                    raise fail(state.path(column), "corrupt: two rows name one stored slot")


def verify(directory: str | os.PathLike[str]) -> LogReport:
    """Check every commit entry, every byte the commits count, every whole record of the journal
    and every value sampling uses as an index or flag, and say what the log holds (its torn
    tails too).

    Raises:
        BufferFileError: not an episode log, damaged before its newest whole commit (which a
            crash cannot do), or holding values out of range.
    """
    state = state_of(os.fspath(directory), every=True)
    check_values(state)
    return report_of(state, every=True)


def report(directory: str | os.PathLike[str]) -> LogReport:
    """What the log holds as a reader sees it (the newest whole commit and the journal's whole
    records after it, and the torn tails past them), checking only the newest commits; `verify`
    checks everything."""
    return report_of(state_of(os.fspath(directory)))


def report_of(state: State, *, every: bool = False) -> LogReport:
    records, end, size = scan(state.directory, state.columns, state.commit)
    if any(r.mark for r in records) and not kept(state.directory):  # its ring lost (a power loss): so are they
        records = [r for r in records if not r.mark]
    if every:  # the values of the journal's records, as folding them checks them
        tails = state.commit.tails
        for run in batches(records):
            if run[0].mark:  # markers: their rows are in a killed recording's ring, checked as it is folded
                continue
            slots = parts(state.directory, state.columns, run, tails)[3]
            tails = tuple(t + n for t, n in zip(tails, slots))
    live = writing(state.directory)  # what lies past its commits is the writer's: cut when it closes
    torn = (Torn(os.path.join(state.directory, JOURNAL), end, size - end),) if size > end else ()
    episodes = state.commit.episodes + sum(r.episodes for r in records)
    staged = 0
    if not live and kept(state.directory):  # a killed vector recorder's steps, replayed when next opened
        staged = sum(stage.k for stage in stages_left(os.path.join(state.directory, RING), episodes))
    return LogReport(
        state.header,
        episodes,
        state.commit.rows + sum(r.rows for r in records),
        sum(state.counted().values()) + end,
        () if live else state.torn() + torn,
        sum(r.episodes for r in records),
        live,
        staged,
    )


def repaired(directory: str) -> State:
    state = state_of(directory)
    for torn in state.torn():
        os.truncate(torn.path, torn.offset)
        sync_file(torn.path)
    return state


def sync_file(path: str) -> None:
    """``path`` (a file, or a directory: its entries) to the disk itself."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Logged:
    """A log's whole episodes as arrays: every part of the buffer that holds them, and each
    episode's length."""

    header: LogHeader
    lengths: np.ndarray
    arrays: dict[tuple[str, str | None], Any]  # arrays, or `Packed` ones of a compressed column

    @property
    def rows(self) -> int:
        return int(self.lengths.sum())


def load(directory: str | os.PathLike[str], *, mmap: bool = True) -> Logged:
    """The whole episodes of the log ``directory``, each column mapped (``mmap``: rows are read
    from disk as they are used, copy-on-write) or read into memory; a torn tail is left out.
    Laid out as a buffer's arrays: per-agent fields ``[n_agents, rows, ...]``.

    Raises:
        BufferFileError: not an episode log, or one whose values are out of range.
    """
    state = state_of(os.fspath(directory))
    check_values(state)
    arrays: dict[tuple[str, str | None], Any] = {}
    for column in [EPISODE_LENGTHS, *state.columns]:
        count = state.commit.count(column)
        shape = (count, *column.shape)
        if column.codec is not None and count:  # laid out as a buffer's array already
            packed = packed_of(state.directory, column, count, mapped=mmap)
            arrays[column.key] = packed if mmap else np.asarray(packed)
            continue
        if not count or not column.row_bytes:
            array = np.zeros(shape, dtype=column.dtype)
        elif mmap:
            array = mapped_array(state.path(column), column.dtype, shape)
        else:
            array = np.fromfile(state.path(column), dtype=column.dtype, count=int(np.prod(shape))).reshape(shape)
        if column.per_agent:  # the file holds each row's agents together; a buffer holds each agent's rows
            array = np.moveaxis(array, 0, 1)
            array = array if mmap else np.ascontiguousarray(array)
        arrays[column.key] = array
    return Logged(state.header, arrays.pop(EPISODE_LENGTHS.key), arrays)
