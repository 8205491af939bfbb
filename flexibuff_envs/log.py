"""An episode log: whole episodes appended to column files on disk as they end, readable after a
crash, and sampled in place when it is larger than memory.

A log is a directory. Each stored part of the buffer (`storage.Part`: ``obs``, ``obs_``'s index
and tail, masks as bits, ...) is one *column* file holding its rows one after the other, exactly
as a ring holds them, so mapping a column gives the array a buffer samples from::

    header.fblog   b"FBLOGHDR" | u32 version | u64 length | JSON | u32 crc32 of all before it
                   (layout, discounts, the columns with dtype and row shape; replaced atomically)
    commits.fblog  one 64-byte entry per append: b"FBCOMMIT" | u64 number | u64 rows
                   | u64 episodes | u64 tail slots of obs_, state_, action_mask_
                   | u32 crc32 of the bytes the append added to the columns | u32 crc32 of the entry
    lengths.col    each episode's length (int64)
    obs.col, obs_.index.col, obs_.tail.col, ...   one per column

An append writes its rows at the end of every column, then its commit entry; all of it is with
the OS when `LogWriter.append` returns, so a process killed at any instant leaves the log as of
its last whole entry plus bytes past it that no entry counts. Readers take the newest entry whose
own checksum and whose appended bytes' checksum hold (so an entry that reached the disk before
its rows, in a power loss, is passed over) and ignore everything past it: no part of an episode is
ever read. `verify` checks every entry and byte, `repair` cuts what lies past the newest whole
entry, and opening a log to append cuts it too. Nothing in a log is code: JSON and numbers only,
and every length is checked against the bytes the files hold before anything is allocated or
mapped, so a crafted log reads or raises `BufferFileError` naming the file.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

import numpy as np

from flexibuff_envs.chain import CHAINED
from flexibuff_envs.chunk import Chunk, check_layout
from flexibuff_envs.episodes import Lane
from flexibuff_envs.errors import (
    BufferFileError,
    BufferSaveError,
    SpecMismatchError,
    plain_dtype,
    short_repr,
)
from flexibuff_envs.header import BadHeader, parse_spec
from flexibuff_envs.interrupts import holding
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import NEXT, Part, Storage

VERSION = 2
HEADER, COMMITS, LENGTHS = "header.fblog", "commits.fblog", "lengths.col"
_HEADER = struct.Struct("<8sIQ")
_HEADER_MAGIC, _COMMIT_MAGIC = b"FBLOGHDR", b"FBCOMMIT"
_ENTRY = struct.Struct(f"<8sQQQ{len(NEXT)}QI")  # then the entry's own crc32
ENTRY_BYTES = _ENTRY.size + 4
_CHAINS = tuple(NEXT)  # the order of the tail counts in an entry
#: bytes read at a time when a column is checked or copied
_PIECE = 1 << 24
#: when appended episodes reach the disk itself (they reach the OS at once, whatever the policy)
FsyncPolicy = Literal["interval", "always", "close"]


@dataclass(frozen=True)
class LogHeader:
    """The layout and discounts a log's episodes were recorded with."""

    spec: BufferSpec
    gamma: float
    gae_lambda: float


@dataclass(frozen=True)
class Column:
    """One stored part, a file of rows: ``shape`` and ``dtype`` of one row (a per-agent field's
    row holds every agent's value: ``[n_agents, ...]``)."""

    name: str
    part: str | None  # None, "index" or "tail", as `storage.Part`
    per_agent: bool
    dtype: np.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, part: Part) -> Column:
        shape = part.shape
        return cls(part.name, part.part, part.per_agent, part.dtype, shape[:part.axis] + shape[part.axis + 1:])

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.part

    @property
    def file(self) -> str:
        return f"{self.name}.col" if self.part is None else f"{self.name}.{self.part}.col"

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "part": self.part, "per_agent": self.per_agent, "dtype": self.dtype.str,
                "shape": list(self.shape)}


_LENGTHS = Column("lengths", None, False, np.dtype("<i8"), ())


@dataclass(frozen=True)
class Commit:
    """What a log holds as of one commit entry: rows, episodes and each chain's tail slots
    (counting slot 0, the zeros every chain starts with)."""

    number: int = -1  # -1: before the first entry
    rows: int = 0
    episodes: int = 0
    tails: tuple[int, ...] = (1,) * len(_CHAINS)

    def count(self, column: Column) -> int:
        """Rows of ``column`` this commit counts (episodes, tail slots or rows)."""
        if column is _LENGTHS:
            return self.episodes
        return self.tails[_CHAINS.index(column.name)] if column.part == "tail" else self.rows

    def length(self, column: Column) -> int:
        """Bytes of ``column`` this commit counts."""
        return self.count(column) * column.row_bytes

    def entry(self, crc: int) -> bytes:
        body = _ENTRY.pack(_COMMIT_MAGIC, self.number, self.rows, self.episodes, *self.tails, crc)
        return body + struct.pack("<I", zlib.crc32(body))


@dataclass(frozen=True)
class Torn:
    """Bytes at the end of a file that no whole commit counts: from ``offset`` on, ``size``."""

    path: str
    offset: int
    size: int


@dataclass(frozen=True)
class LogReport:
    """What a log holds, and the torn tails of its files (empty for a whole log)."""

    header: LogHeader
    episodes: int
    rows: int
    nbytes: int
    torn: tuple[Torn, ...]


@dataclass
class _State:
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
        return [_LENGTHS, *self.columns]

    def torn(self) -> tuple[Torn, ...]:
        counted = {COMMITS: (self.commit.number + 1) * ENTRY_BYTES,
                   **{column.file: self.commit.length(column) for column in self.files}}
        return tuple(Torn(os.path.join(self.directory, name), counted[name], self.sizes[name] - counted[name])
                     for name in counted if self.sizes[name] > counted[name])


def _fail(path: str, problem: str) -> BufferFileError:
    return BufferFileError(f"{path}: {problem}")


def is_log(directory: str) -> bool:
    """Whether ``directory`` holds an episode log (its header file)."""
    return os.path.isfile(os.path.join(directory, HEADER))


def _header_bytes(header: LogHeader, columns: Sequence[Column]) -> bytes:
    blob = json.dumps({"format": "flexibuff_envs episode log", "spec": header.spec.to_dict(), "gamma": header.gamma,
                       "gae_lambda": header.gae_lambda, "columns": [c.to_dict() for c in columns]}).encode()
    prefix = _HEADER.pack(_HEADER_MAGIC, VERSION, len(blob)) + blob
    return prefix + struct.pack("<I", zlib.crc32(prefix))


def _read_header(directory: str) -> tuple[LogHeader, list[Column]]:
    path = os.path.join(directory, HEADER)
    if not os.path.isdir(directory):
        raise BufferFileError(f"{directory}: {'not a directory; an episode log is one' if os.path.exists(directory) else 'no such episode log'}")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(_HEADER.size)
            if len(head) < _HEADER.size:
                raise _fail(path, f"too short to be a log header ({size} bytes)")
            magic, version, length = _HEADER.unpack(head)
            if magic != _HEADER_MAGIC:
                raise _fail(path, "not a flexibuff_envs episode log header (bad magic bytes)")
            if version != VERSION:
                raise _fail(path, f"log format {version} is not one this flexibuff_envs reads ({VERSION})")
            if _HEADER.size + length + 4 != size:
                raise _fail(path, f"its header says {length} bytes of JSON, but the file holds {size} bytes")
            blob = handle.read(length)
            (crc,) = struct.unpack("<I", handle.read(4))
    except FileNotFoundError:
        raise _fail(directory, "not an episode log (no header.fblog)") from None
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})") from None
    if zlib.crc32(head + blob) != crc:
        raise _fail(path, "corrupt header (checksum mismatch)")
    try:
        data = json.loads(blob)
        if not isinstance(data, dict) or set(data) != {"format", "spec", "gamma", "gae_lambda", "columns"}:
            raise BadHeader(f"a log header holds format, spec, gamma, gae_lambda and columns, got {short_repr(data)}")
        gamma, lam = data["gamma"], data["gae_lambda"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in (gamma, lam)):
            raise BadHeader(f"gamma and gae_lambda must be numbers in [0, 1], got {short_repr((gamma, lam))}")
        header = LogHeader(parse_spec(data["spec"]), float(gamma), float(lam))
        return header, _columns(header.spec, data["columns"])
    except (ValueError, RecursionError, BadHeader) as exc:  # JSON errors are ValueErrors
        raise _fail(path, f"corrupt header: {exc}") from None


def expected(spec: BufferSpec, name: str, part: str | None, width: int | None = None) -> Column:
    """The column a buffer of layout ``spec`` stores part ``(name, part)`` in (``width``: the
    continuous log probs' own); `BadHeader` for a part no such buffer has."""
    probe = Storage(spec, 1)
    if name in NEXT and part in ("index", "tail"):
        base = probe.ensure(NEXT[name])
        per_agent = probe.fields[name].per_agent
        if part == "index":
            return Column(name, part, per_agent, np.dtype(np.int32), (spec.n_agents,) if per_agent else ())
        return Column(name, part, False, base.dtype, base.shape[-1:])
    if part is not None or name not in probe.fields or name in NEXT:
        raise BadHeader(f"no buffer of this layout stores a part {part!r} of {name!r}")
    array = probe.ensure(name, width=width if name == "continuous_log_probs" else None)
    per_agent = probe.fields[name].per_agent
    return Column(name, None, per_agent, array.dtype, (spec.n_agents, *array.shape[2:]) if per_agent else array.shape[1:])


def _columns(spec: BufferSpec, described: Any) -> list[Column]:
    if not isinstance(described, list):
        raise BadHeader(f"columns must be a list, got {short_repr(described)}")
    columns: list[Column] = []
    for k, item in enumerate(described):
        if not isinstance(item, dict) or set(item) != {"name", "part", "per_agent", "dtype", "shape"}:
            raise BadHeader(f"column {k} must hold name, part, per_agent, dtype and shape, got {short_repr(item)}")
        shape = item["shape"]
        if not isinstance(item["name"], str) or not isinstance(shape, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
            raise BadHeader(f"column {k} has name {short_repr(item['name'])} and shape {short_repr(shape)}")
        width = shape[-1] if item["name"] == "continuous_log_probs" and shape else None
        column = Column(item["name"], item["part"], bool(item["per_agent"]), plain_dtype(f"column {k} dtype", item["dtype"]),
                        tuple(shape))
        if column != expected(spec, column.name, column.part, width) or column.key in {c.key for c in columns}:
            raise BadHeader(f"column {k} ({column.file}) is not one a buffer of this layout stores, or twice")
        columns.append(column)
    return columns


def _parse(entry: bytes, number: int) -> tuple[Commit, int] | None:
    """The commit entry ``number`` names and its data crc, or None if it is not whole and in place."""
    if len(entry) < ENTRY_BYTES:
        return None
    body, (crc,) = entry[:_ENTRY.size], struct.unpack("<I", entry[_ENTRY.size:])
    if zlib.crc32(body) != crc:
        return None
    magic, at, rows, episodes, *rest = _ENTRY.unpack(body)
    if magic != _COMMIT_MAGIC or at != number:
        return None
    return Commit(at, rows, episodes, tuple(rest[:-1])), rest[-1]


def _sizes(directory: str, files: Sequence[Column]) -> dict[str, int]:
    sizes = {}
    for name in (COMMITS, *(c.file for c in files)):
        try:
            sizes[name] = os.path.getsize(os.path.join(directory, name))
        except FileNotFoundError:
            sizes[name] = 0
    return sizes


class _Reader:
    """The log's files open for reading, to check commits against the bytes they count."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.handles = {c.file: _open(state.path(c)) for c in state.files if state.sizes[c.file]}
        self.commits = _open(os.path.join(state.directory, COMMITS))

    def __enter__(self) -> _Reader:  # noqa: PYI034 (Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in [*self.handles.values(), self.commits]:
            handle.close()

    def entry(self, number: int) -> tuple[Commit, int] | None:
        return _parse(os.pread(self.commits.fileno(), ENTRY_BYTES, number * ENTRY_BYTES), number)

    def holds(self, before: Commit, after: Commit, crc: int) -> bool:
        """Whether commit ``after`` follows ``before`` and the bytes it adds are in place."""
        state = self.state
        if not (after.rows >= before.rows and after.episodes >= before.episodes
                and all(b <= a for b, a in zip(before.tails, after.tails))):
            return False
        if any(state.sizes[column.file] < after.length(column) for column in state.files):
            return False
        mine = 0
        for column in state.files:
            lo, hi = before.length(column), after.length(column)
            while lo < hi:
                piece = os.pread(self.handles[column.file].fileno(), min(_PIECE, hi - lo), lo)
                mine = zlib.crc32(piece, mine)
                lo += len(piece)
        return mine == crc


def _open(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})") from None


def _state(directory: str, *, every: bool = False) -> _State:
    """The log ``directory`` as of its newest whole commit: the newest entry that is whole and
    whose bytes are in place (entries before it are trusted). With ``every``, every entry and
    every byte it counts is checked, and damage before the newest whole entry raises."""
    header, columns = _read_header(directory)
    state = _State(directory, header, columns, Commit())
    state.sizes = _sizes(directory, state.files)
    count = state.sizes[COMMITS] // ENTRY_BYTES
    if not count:
        return _counted(state)
    with _Reader(state) as reader:
        if every:
            before = Commit()
            for k in range(count):
                item = reader.entry(k)
                if item is None or not reader.holds(before, *item):
                    if any(reader.entry(later) is not None for later in range(k + 1, count)):
                        raise _fail(os.path.join(directory, COMMITS), f"damaged at commit {k}, before whole ones: "
                                    "a crash leaves only the newest commits torn")
                    break
                before = item[0]
            state.commit = before
            return _counted(state)
        for k in range(count - 1, -1, -1):
            item = reader.entry(k)
            previous = reader.entry(k - 1) if k else (Commit(), 0)
            if item is not None and previous is not None and reader.holds(previous[0], *item):
                state.commit = item[0]
                break
    return _counted(state)


def _counted(state: _State) -> _State:
    """``state``, unless a file holds fewer bytes than its commit counts (a file cut or removed
    by hand: no crash does that)."""
    for column in state.files:
        if state.sizes[column.file] < state.commit.length(column):
            raise _fail(state.path(column), f"holds {state.sizes[column.file]:,} bytes, fewer than the "
                                            f"{state.commit.length(column):,} its commits count")
    return state


def _spans(count: int, per_piece: int) -> Iterator[tuple[int, int]]:
    """``[0, count)`` in ranges of at most ``per_piece``."""
    per_piece = max(1, per_piece)
    return ((lo, min(lo + per_piece, count)) for lo in range(0, count, per_piece))


def _blocks(state: _State, column: Column, count: int, first: int = 0) -> Iterator[np.ndarray]:
    """Rows ``[first, count)`` of ``column``, at most 16 MiB at a time."""
    if count <= first:
        return
    values = int(np.prod(column.shape, dtype=np.int64))
    with open(state.path(column), "rb") as handle:
        handle.seek(first * column.row_bytes)
        for lo, hi in _spans(count - first, _PIECE // max(1, column.row_bytes)):
            block = np.fromfile(handle, dtype=column.dtype, count=(hi - lo) * values)
            yield block.reshape((hi - lo, *column.shape))


def _check_values(state: _State) -> None:
    """`BufferFileError` unless the values sampling uses as indices or flags are in range:
    lengths positive and summing to the rows, bools 0 or 1, category indices within their
    categories, next-value indices naming a stored slot, each slot named once, and each
    episode's last row not chained (its successor is another episode's). Read a piece at a time."""
    commit, spec = state.commit, state.header.spec
    lengths = np.concatenate([*_blocks(state, _LENGTHS, commit.episodes), np.zeros(0, np.int64)])
    if (lengths < 1).any() or int(lengths.sum()) != commit.rows:
        raise _fail(state.path(_LENGTHS), f"corrupt: episode lengths must be positive and sum to the {commit.rows} "
                                          "rows committed")
    categories = np.asarray(spec.obs_categories)
    ends = np.cumsum(lengths) - 1
    for column in state.columns:
        if column.part == "tail":
            if column.name == "obs_" and categories.size and any(
                    (block > categories).any() for block in _blocks(state, column, commit.tails[_CHAINS.index("obs_")])):
                raise _fail(state.path(column), "corrupt: a value names a category past its space's size")
            continue
        if column.dtype == bool or (column.name == "obs" and categories.size) or column.part == "index":
            slots: list[np.ndarray] = []
            lo = 0
            for block in _blocks(state, column, commit.rows):
                if column.dtype == bool and block.view(np.uint8).max(initial=0) > 1:
                    raise _fail(state.path(column), "corrupt: a bool that is neither 0 nor 1")
                if column.name == "obs" and (block > categories).any():
                    raise _fail(state.path(column), "corrupt: a value names a category past its space's size")
                if column.part == "index":
                    tails = commit.tails[_CHAINS.index(column.name)]
                    if ((block < CHAINED) | (block >= tails)).any():
                        raise _fail(state.path(column), f"corrupt: a row names a slot outside the {tails} stored")
                    at = ends[(ends >= lo) & (ends < lo + len(block))] - lo
                    if (block[at] == CHAINED).any():
                        raise _fail(state.path(column), "corrupt: an episode's last row is chained to the next episode")
                    slots.append(block[block > 0])
                lo += len(block)
            if slots:
                named = np.concatenate(slots)
                if np.unique(named).size != named.size:
                    raise _fail(state.path(column), "corrupt: two rows name one stored slot")


def verify(directory: str | os.PathLike[str]) -> LogReport:
    """Check every commit entry, every byte the commits count and every value sampling uses as
    an index or flag, and say what the log holds (its torn tails too).

    Raises:
        BufferFileError: not an episode log, damaged before its newest whole commit (which a
            crash cannot do), or holding values out of range.
    """
    state = _state(os.fspath(directory), every=True)
    _check_values(state)
    return _report(state)


def report(directory: str | os.PathLike[str]) -> LogReport:
    """What the log holds as a reader sees it (the newest whole commit, and the torn tails past
    it), checking only the newest commits; `verify` checks everything."""
    return _report(_state(os.fspath(directory)))


def _report(state: _State) -> LogReport:
    return LogReport(state.header, state.commit.episodes, state.commit.rows,
                     sum(state.commit.length(c) for c in state.files) + (state.commit.number + 1) * ENTRY_BYTES,
                     state.torn())


def repair(directory: str | os.PathLike[str]) -> LogReport:
    """Cut every file's torn tail (the bytes past the newest whole commit; every whole episode
    stays as it is); returns what the log held, and the tails cut."""
    return _report(_repair(os.fspath(directory)))


def _repair(directory: str) -> _State:
    state = _state(directory)
    for torn in state.torn():
        os.truncate(torn.path, torn.offset)
        _sync_file(torn.path)
    return state


def _sync_file(path: str) -> None:
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
    arrays: dict[tuple[str, str | None], np.ndarray]

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
    state = _state(os.fspath(directory))
    _check_values(state)
    arrays = {}
    for column in [_LENGTHS, *state.columns]:
        count = state.commit.count(column)
        shape = (count, *column.shape)
        if not count or not column.row_bytes:
            array = np.zeros(shape, dtype=column.dtype)
        elif mmap:
            array = _mapped(state.path(column), column.dtype, shape)
        else:
            array = np.fromfile(state.path(column), dtype=column.dtype, count=int(np.prod(shape))).reshape(shape)
        if column.per_agent:  # the file holds each row's agents together; a buffer holds each agent's rows
            array = np.moveaxis(array, 0, 1)
            array = array if mmap else np.ascontiguousarray(array)
        arrays[column.key] = array
    return Logged(state.header, arrays.pop(_LENGTHS.key), arrays)


def _mapped(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The first rows of the file ``path`` as an array, mapped copy-on-write, read as sampled:
    without read-ahead (a batch's rows lie anywhere; reading ahead of each would read the log)."""
    with open(path, "rb") as handle:
        memory = mmap.mmap(handle.fileno(), int(np.prod(shape)) * dtype.itemsize, access=mmap.ACCESS_COPY)
    if hasattr(mmap, "MADV_RANDOM"):
        memory.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


class LogWriter:
    """Appends chunks of whole episodes to the log ``directory`` (made if missing).

    An existing log is continued: its layout must match, a torn tail is cut first, and nothing
    else already there is rewritten. Each `append` hands its rows to the OS before it returns: a
    process killed (SIGKILL) after that loses none of its episodes. ``fsync`` says when they
    reach the disk itself, which is what survives a power loss: "interval" (at the first append
    ``every`` seconds after the last sync; the default), "always" (every append), "close" (only
    at `close`).

    One writer appends to a log at a time (two would interleave their rows).

    Raises:
        BufferFileError: the directory holds a log of another layout, or a damaged one.
    """

    def __init__(self, directory: str | os.PathLike[str], header: LogHeader, *, fsync: FsyncPolicy = "interval",
                 every: float = 5.0) -> None:
        if fsync not in ("interval", "always", "close"):
            raise ValueError(f"fsync must be 'interval', 'always' or 'close', got {fsync!r}")
        self.directory = os.fspath(directory)
        self.header = header
        self.fsync, self.every = fsync, float(every)
        os.makedirs(self.directory, exist_ok=True)
        if is_log(self.directory):
            state = _repair(self.directory)
            if state.header != header:
                check_layout(state.header.spec, header.spec, f"the episode log {self.directory}")
                raise BufferFileError(f"{self.directory}: the log's discounts (gamma {state.header.gamma}, "
                                      f"gae_lambda {state.header.gae_lambda}) differ from the recording's "
                                      f"({header.gamma}, {header.gae_lambda})")
        else:
            state = _State(self.directory, header, [], Commit())
            self._write_header([])
        listed = {c.file for c in state.files} | {HEADER, COMMITS}
        for name in os.listdir(self.directory):  # a column a kill caught before the header named it
            if name.endswith((".col", ".new")) and name not in listed:
                os.unlink(os.path.join(self.directory, name))
        self.columns, self.commit = state.columns, state.commit
        probe = Storage(header.spec, 1)
        self._fills = {(name, part): 0 if part is not None else probe.fill(name) for name, part in
                       [(name, None) for name in probe.fields] + [(name, "index") for name in NEXT]}
        self._files = {c.key: self._append_to(c.file) for c in state.files}
        self._commits = self._append_to(COMMITS)
        self._synced = time.monotonic()

    def _append_to(self, name: str) -> Any:
        return open(os.path.join(self.directory, name), "ab", buffering=0)

    def _write_header(self, columns: Sequence[Column]) -> None:
        """The header naming ``columns``, whole or not at all."""
        path = os.path.join(self.directory, HEADER)
        with open(path + ".new", "wb") as out:
            out.write(_header_bytes(self.header, columns))
            out.flush()
            os.fsync(out.fileno())
        os.replace(path + ".new", path)
        _sync_file(self.directory)

    def _add(self, columns: Sequence[Column]) -> None:
        """New columns, holding what the rows committed so far would hold had the field been
        there: its allocated value (a next value: slot 0, zeros)."""
        for column in columns:
            with open(os.path.join(self.directory, column.file), "wb") as out:
                if column.part == "tail":
                    out.write(bytes(column.row_bytes))  # slot 0
                elif self._fills[column.key]:
                    row = np.full(column.shape, self._fills[column.key], dtype=column.dtype).tobytes()
                    per_piece = max(1, _PIECE // len(row))
                    out.writelines(row * min(per_piece, self.commit.rows - lo) for lo in range(0, self.commit.rows, per_piece))
                else:  # zeros: the file system stores none of them
                    out.truncate(self.commit.rows * column.row_bytes)
                out.flush()
                os.fsync(out.fileno())
        self._write_header([*self.columns, *columns])
        self.columns = [*self.columns, *columns]
        self._files.update({c.key: self._append_to(c.file) for c in columns})

    def _pieces(self, chunk: Chunk) -> dict[tuple[str, str | None], np.ndarray]:
        """Each column's bytes for ``chunk``: rows laid out as the files hold them, next-value
        slots renumbered to follow the log's."""
        given = {part.key: part.whole() for part in chunk.parts}
        for name, part in given:
            if part is not None and (name, "tail" if part == "index" else "index") not in given:
                raise ValueError(f"the chunk's next-value field {name!r} needs both its index and tail parts")
        if given.keys() - self._files.keys():
            self._add([Column.of(part) for part in chunk.parts if part.key not in self._files])
        out = {_LENGTHS.key: np.ascontiguousarray(chunk.lengths, dtype=_LENGTHS.dtype)}
        for column in self.columns:
            array = given.get(column.key)
            if array is None:  # a field the chunk's buffer lacks: its allocated value (a next value: slot 0)
                if column.part != "tail":
                    out[column.key] = np.full((chunk.rows, *column.shape), self._fills[column.key], column.dtype)
                continue
            if column.per_agent and column.part != "tail":  # the file holds each row's agents together
                array = array.swapaxes(0, 1)
            if array.shape[1:] != column.shape or array.dtype != column.dtype:
                raise SpecMismatchError(f"the chunk's {column.file} rows are {array.shape[1:]} {array.dtype}; "
                                        f"the log's are {column.shape} {column.dtype}")
            if column.part == "tail":
                array = array[1:]  # slot 0 (zeros) is the log's own
            elif column.part == "index":
                tails = self.commit.tails[_CHAINS.index(column.name)]
                array = np.where(array > 0, array + np.int32(tails - 1), array)
            out[column.key] = np.ascontiguousarray(array)
        return out

    @holding  # a Ctrl-C between two of its writes would leave rows no commit counts before the next
    def append(self, chunk: Chunk) -> None:
        """Write ``chunk``'s episodes to every column, then commit them (nothing for an empty chunk)."""
        if not chunk.n_episodes:
            return
        check_layout(self.header.spec, chunk.spec, "the chunk")
        pieces = self._pieces(chunk)
        added = tuple(len(pieces.get((name, "tail"), ())) for name in _CHAINS)
        self._commit(((key, piece.data.cast("B")) for key, piece in pieces.items()),
                     chunk.rows, chunk.n_episodes, added)

    @holding
    def absorb(self, source: str | os.PathLike[str]) -> None:
        """Append every whole episode of the log ``source`` (of this layout and discounts) as one
        commit: each of its bytes is read once and written once, in pieces of at most 16 MiB, next
        values renumbered to follow this log's."""
        state = _state(os.fspath(source))
        _check_values(state)
        if state.header != self.header:
            check_layout(self.header.spec, state.header.spec, f"the episode log {state.directory}")
            raise BufferFileError(f"{state.directory}: its discounts (gamma {state.header.gamma}, gae_lambda "
                                  f"{state.header.gae_lambda}) differ from the log's ({self.header.gamma}, "
                                  f"{self.header.gae_lambda})")
        for column in state.columns:
            mine = next((c for c in self.columns if c.key == column.key), column)
            if mine != column:
                raise SpecMismatchError(f"{state.path(column)} holds rows of {column.shape} {column.dtype}; the "
                                        f"log's are {mine.shape} {mine.dtype}")
        if not state.commit.episodes:
            return
        if any(c.key not in self._files for c in state.columns):
            self._add([c for c in state.columns if c.key not in self._files])
        theirs = {c.key: c for c in state.files}
        shift = {name: self.commit.tails[k] - 1 for k, name in enumerate(_CHAINS)}

        def pieces() -> Iterator[tuple[tuple[str, str | None], Any]]:
            for column in [_LENGTHS, *self.columns]:
                if column.key not in theirs:  # a field the source's buffer lacked: its allocated value
                    if column.part != "tail":
                        row = np.full(column.shape, self._fills[column.key], column.dtype).tobytes()
                        for lo, hi in _spans(state.commit.rows, _PIECE // max(1, len(row))):
                            yield column.key, row * (hi - lo)
                    continue
                first = 1 if column.part == "tail" else 0  # slot 0 is the log's own
                for block in _blocks(state, column, state.commit.count(column), first):
                    if column.part == "index":
                        block = np.where(block > 0, block + np.int32(shift[column.name]), block)
                    yield column.key, block.data.cast("B")

        added = tuple(state.commit.tails[k] - 1 for k in range(len(_CHAINS)))
        self._commit(pieces(), state.commit.rows, state.commit.episodes, added)

    def _commit(self, pieces: Iterable[tuple[tuple[str, str | None], Any]], rows: int, episodes: int,
                added: tuple[int, ...]) -> None:
        """Write ``pieces`` (column key, bytes) in order, then the commit entry counting ``rows``,
        ``episodes`` and each chain's ``added`` slots. If a write fails (a full disk), every file
        goes back to the last commit and `BufferSaveError` names the one that failed."""
        commit = Commit(self.commit.number + 1, self.commit.rows + rows, self.commit.episodes + episodes,
                        tuple(t + n for t, n in zip(self.commit.tails, added)))
        crc = 0
        before = {key: target.tell() for key, target in self._files.items()}
        target = self._commits
        try:  # unbuffered: each piece is with the OS when written (a killed process loses nothing appended)
            for key, piece in pieces:
                target = self._files[key]
                crc = _write(target, memoryview(piece), crc)
            target = self._commits
            _write(target, memoryview(commit.entry(crc)), 0)
        except BaseException as exc:  # a full disk, or a source that cannot be read: back to the last commit
            for key, size in before.items():
                os.ftruncate(self._files[key].fileno(), size)
            if isinstance(exc, OSError):
                raise BufferSaveError(exc.errno, f"cannot append to the episode log ({exc.strerror or exc}; every "
                                      "episode appended before is intact)", str(target.name)) from exc
            raise
        self.commit = commit
        if self.fsync == "always" or (self.fsync == "interval" and time.monotonic() - self._synced >= self.every):
            self.sync()

    def sync(self) -> None:
        """Everything appended so far to the disk itself (the rows first, then the commits)."""
        for target in self._files.values():
            os.fsync(target.fileno())
        os.fsync(self._commits.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        """Sync and close (appending again needs a new writer)."""
        if not self._commits.closed:
            self.sync()
            for target in [*self._files.values(), self._commits]:
                target.close()


def _write(target: BinaryIO, view: memoryview, crc: int) -> int:
    """Write all of ``view``; returns ``crc`` carried over it."""
    crc = zlib.crc32(view, crc)
    while view:
        view = view[target.write(view):]
    return crc


class Follower:
    """Appends to ``writer`` every whole episode that ends in ``lanes`` from now on: `flush`
    after episodes end writes those that ended since the last flush, as one commit, straight
    from the ring's rows."""

    def __init__(self, writer: LogWriter, lanes: Sequence[Lane], *, per_block: bool = False) -> None:
        self.writer = writer
        self.per_block = per_block  # a vector recorder flushes with its blocks, not in each step
        self.outgrown = False  # an episode longer than the ring was left out (said once)
        self._after = [lane.written for lane in lanes]  # per lane: episodes ending later are new
        self.episodes = self.rows = 0  # appended so far

    def flush(self, storage: Storage, lanes: Sequence[Lane], which: Sequence[int] | None = None) -> None:
        """Append the episodes that ended since the last flush in ``lanes`` (or in ``lanes[i]``
        for ``i`` in ``which``: where episodes ended)."""
        segments: list[tuple[int, int]] = []
        lengths: list[int] = []
        for i in range(len(lanes)) if which is None else which:
            lane = lanes[i]
            ended = lane.ended
            if not len(ended) or ended[-1].end <= self._after[i]:
                continue
            new = slice(int(np.searchsorted(ended.ends, self._after[i], side="right")), None)
            for start, end, whole in zip(ended.starts[new].tolist(), ended.ends[new].tolist(), ended.whole[new].tolist()):
                if whole:
                    segments += lane.segments(start, end)
                    lengths.append(end - start)
                elif not self.outgrown:  # its first rows were forgotten before it ended
                    self.outgrown = True
                    warnings.warn(f"an episode outgrew the buffer's {lane.capacity:,} rows per lane and is not in the "
                                  f"episode log {self.writer.directory} (nor is any other that does): give the "
                                  "buffer more rows than the longest episode", RuntimeWarning, stacklevel=2)
            self._after[i] = ended[-1].end
        if not lengths:
            return
        header = self.writer.header
        parts = storage.export(segments, np.cumsum(lengths) - 1)
        self.writer.append(Chunk(storage.spec, header.gamma, header.gae_lambda, np.array(lengths), tuple(parts)))
        self.episodes += len(lengths)
        self.rows += sum(lengths)


def merge(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> LogReport:
    """Append every whole episode of the logs ``sources``, in order, to the log ``out`` (made,
    or continued when it holds a log of the same layout and discounts): one commit per source,
    so a merge cut short by a kill leaves ``out`` with the sources before it, whole. A source's
    torn tail is left out; the sources are only read.

    Raises:
        BufferFileError: a source is not an episode log, is damaged, or differs from the others
            in layout or discounts; or ``out`` is one of them.
        BufferSaveError: ``out`` cannot be written (a full disk: it keeps what it held).
    """
    paths = [os.fspath(source) for source in sources]
    if not paths:
        raise ValueError("merge: give at least one episode log to merge")
    target = os.path.realpath(out)
    for path in paths:
        if os.path.realpath(path) == target:
            raise BufferFileError(f"{path}: a log cannot be merged into itself")
    headers = [_state(path).header for path in paths]
    for path, header in zip(paths, headers):
        if header != headers[0]:
            check_layout(headers[0].spec, header.spec, f"the episode log {path}")
            raise BufferFileError(f"{path}: its discounts (gamma {header.gamma}, gae_lambda {header.gae_lambda}) "
                                  f"differ from {paths[0]}'s")
    writer = LogWriter(out, headers[0], fsync="close")
    try:
        for path in paths:
            writer.absorb(path)
    finally:
        writer.close()
    return report(out)
