"""An episode log: whole episodes appended to files on disk as they end, readable after a crash.

A log is a directory of segments, ``00000000.fblog``, ``00000001.fblog``, ... Each segment
starts with a header (the layout and discounts, JSON, with its checksum) and holds records
appended one after the other; a record is one `Chunk` of whole episodes in the stored form files
and chunks share (`storage.Part`: observations once, masks as bits), with its own checksum:

    segment:  b"FBLOGSEG" | u32 version | u64 header length | JSON header | u32 crc32 of all before
    record:   b"FBLOGREC" | u64 meta length | u64 data length | JSON meta | data | u32 crc32 | b"FBREC-OK"

A record is handed to the OS (written and flushed) when its episodes end, so a process killed
at any instant leaves its last record whole or torn; a torn record (short, or its checksum wrong) can
only be the newest segment's last, and readers stop before it: no part of an episode is ever
read. `verify` reports a torn tail, `repair` cuts it, and opening a log to append cuts it too.
Nothing in a log is code: JSON and numbers only, and every length is checked against the bytes
the file holds before anything is allocated, so a crafted log reads or raises `BufferFileError`.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import numpy as np

from flexibuff_envs.chunk import Chunk, check, check_layout, copy
from flexibuff_envs.episodes import Lane, episode_table
from flexibuff_envs.errors import BufferFileError, BufferSaveError, plain_dtype, short_repr
from flexibuff_envs.header import BadHeader, parse_spec
from flexibuff_envs.interrupts import holding
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import NEXT, Part, Storage

VERSION = 1
_SEGMENT = struct.Struct("<8sIQ")
_RECORD = struct.Struct("<8sQQ")
_TRAILER = struct.Struct("<I8s")
_SEGMENT_MAGIC, _RECORD_MAGIC, _RECORD_END = b"FBLOGSEG", b"FBLOGREC", b"FBREC-OK"
_NAME = re.compile(r"^(\d{8})\.fblog$")
#: bytes a segment grows to before the next record starts a new one
SEGMENT_BYTES = 256 << 20
#: when appended records reach the disk itself (they reach the OS at once, whatever the policy)
FsyncPolicy = Literal["interval", "always", "close"]


def segment_name(number: int) -> str:
    return f"{number:08d}.fblog"


def segments(directory: str) -> list[str]:
    """The segment files of the log ``directory``, in order."""
    try:
        names = sorted(name for name in os.listdir(directory) if _NAME.match(name))
    except FileNotFoundError as exc:
        raise BufferFileError(f"{directory}: no such episode log") from exc
    except NotADirectoryError as exc:
        raise BufferFileError(f"{directory}: not a directory; an episode log is one") from exc
    return [os.path.join(directory, name) for name in names]


@dataclass(frozen=True)
class LogHeader:
    """What every segment of a log starts with: the layout its episodes were recorded in."""

    spec: BufferSpec
    gamma: float
    gae_lambda: float

    def to_bytes(self) -> bytes:
        blob = json.dumps({"format": "flexibuff_envs episode log", "spec": self.spec.to_dict(),
                           "gamma": self.gamma, "gae_lambda": self.gae_lambda}).encode()
        prefix = _SEGMENT.pack(_SEGMENT_MAGIC, VERSION, len(blob)) + blob
        return prefix + struct.pack("<I", zlib.crc32(prefix))


@dataclass(frozen=True)
class Torn:
    """A segment's tail that is not a whole record: from byte ``offset`` on, ``size`` bytes."""

    path: str
    offset: int
    size: int


@dataclass(frozen=True)
class LogReport:
    """What a log holds: its segments, whole episodes and rows, and a torn tail if it has one."""

    header: LogHeader
    segments: int
    episodes: int
    rows: int
    torn: Torn | None


def _fail(path: str, problem: str) -> BufferFileError:
    return BufferFileError(f"{path}: {problem}")


def _read_header(path: str, handle: BinaryIO, size: int) -> LogHeader:
    head = handle.read(_SEGMENT.size)
    if len(head) < _SEGMENT.size:
        raise _fail(path, f"too short to be a log segment ({size} bytes)")
    magic, version, length = _SEGMENT.unpack(head)
    if magic != _SEGMENT_MAGIC:
        raise _fail(path, "not a flexibuff_envs log segment (bad magic bytes)")
    if not 1 <= version <= VERSION:
        raise _fail(path, f"log format {version} is not one this flexibuff_envs reads (up to {VERSION})")
    if _SEGMENT.size + length + 4 > size:
        raise _fail(path, f"truncated: its header runs past the end of the file ({size} bytes)")
    blob = handle.read(length)
    (crc,) = struct.unpack("<I", handle.read(4))
    if zlib.crc32(head + blob) != crc:
        raise _fail(path, "corrupt header (checksum mismatch)")
    try:
        data = json.loads(blob)
        if not isinstance(data, dict) or set(data) != {"format", "spec", "gamma", "gae_lambda"}:
            raise BadHeader(f"a segment header holds format, spec, gamma and gae_lambda, got {short_repr(data)}")
        gamma, lam = data["gamma"], data["gae_lambda"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in (gamma, lam)):
            raise BadHeader(f"gamma and gae_lambda must be numbers in [0, 1], got {short_repr((gamma, lam))}")
        return LogHeader(parse_spec(data["spec"]), float(gamma), float(lam))
    except (ValueError, RecursionError, BadHeader) as exc:  # JSON errors are ValueErrors
        raise _fail(path, f"corrupt header: {exc}") from None


def _parts(path: str, meta: Any, data: bytes, header: LogHeader) -> Chunk:
    """The chunk a record's ``meta`` describes, its arrays views of ``data``; `BufferFileError`
    unless every part lies inside the data and every value is of a plain dtype."""
    if not isinstance(meta, dict) or set(meta) != {"lengths", "parts"}:
        raise BadHeader(f"a record's meta holds lengths and parts, got {short_repr(meta)}")
    lengths, described = meta["lengths"], meta["parts"]
    if not isinstance(lengths, list) or not lengths or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 < n <= len(data) for n in lengths):
        raise BadHeader(f"lengths must be positive episode lengths, got {short_repr(lengths)}")
    if not isinstance(described, list):
        raise BadHeader(f"parts must be a list, got {short_repr(described)}")
    parts = []
    for k, item in enumerate(described):
        if not isinstance(item, dict) or set(item) != {"name", "part", "per_agent", "dtype", "shape", "offset"}:
            raise BadHeader(f"part {k} must hold name, part, per_agent, dtype, shape and offset, got {short_repr(item)}")
        dtype = plain_dtype(f"part {k} dtype", item["dtype"])
        shape, offset = item["shape"], item["offset"]
        if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                  for n in shape) or not isinstance(offset, int) or offset < 0:
            raise BadHeader(f"part {k} has shape {short_repr(shape)} at offset {short_repr(offset)}")
        count = int(np.prod(shape, dtype=object))
        if offset + count * dtype.itemsize > len(data):
            raise BadHeader(f"part {k} ({item['name']!r}) runs past the record's {len(data)} bytes of data")
        if not isinstance(item["name"], str) or item["part"] not in (None, "index", "tail") \
                or not isinstance(item["per_agent"], bool):
            raise BadHeader(f"part {k} has name {short_repr(item['name'])}, part {short_repr(item['part'])}")
        array = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        parts.append(Part(item["name"], item["part"], item["per_agent"], (array,)))
    chunk = Chunk(header.spec, header.gamma, header.gae_lambda, np.array(lengths, dtype=np.int64), tuple(parts))
    _check(chunk)
    return chunk


def _check(chunk: Chunk) -> None:
    """`BadHeader` unless ``chunk`` extends a buffer of its layout as it is: the checks `extend`
    makes, against a one-row storage holding every field the chunk has."""
    probe = Storage(chunk.spec, 1)
    try:
        for part in chunk.parts:
            if part.part is None and part.name in probe.fields and part.name not in NEXT:
                width = part.shape[-1] if part.name == "continuous_log_probs" and len(part.shape) > 1 else None
                probe.ensure(part.name, width=width)
        check(chunk, probe, [Lane(0, 1, lambda lane, episode: None)], 0, chunk.gamma, chunk.gae_lambda)
    except (ValueError, TypeError) as exc:
        raise BadHeader(str(exc).removeprefix("extend: ")) from None


def _records(path: str, handle: BinaryIO, size: int, header: LogHeader) -> Iterator[Chunk | Torn]:
    """The chunk of each whole record after the header, then a `Torn` if the segment ends in a
    record that is not whole."""
    offset = handle.tell()
    while offset < size:
        head = handle.read(_RECORD.size)
        whole = len(head) == _RECORD.size
        if whole:
            magic, meta_len, data_len = _RECORD.unpack(head)
            end = offset + _RECORD.size + meta_len + data_len + _TRAILER.size
            whole = magic == _RECORD_MAGIC and end <= size
        if whole:
            meta, data = handle.read(meta_len), handle.read(data_len)
            crc, marker = _TRAILER.unpack(handle.read(_TRAILER.size))
            whole = marker == _RECORD_END and zlib.crc32(data, zlib.crc32(meta, zlib.crc32(head))) == crc
        if not whole:
            yield Torn(path, offset, size - offset)
            return
        try:
            chunk = _parts(path, json.loads(meta), data, header)
        except (ValueError, RecursionError, BadHeader) as exc:
            raise _fail(path, f"corrupt record at byte {offset}: {exc}") from None
        yield chunk
        offset = end


def _open(path: str) -> tuple[BinaryIO, int]:
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the callers
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})") from None
    return handle, os.fstat(handle.fileno()).st_size


def read(directory: str) -> Iterator[Chunk]:
    """Every whole record of the log ``directory``, oldest first, as a `Chunk` (a torn tail is
    left out). Raises `BufferFileError` naming the file for a segment that is not a log's, a
    layout that differs between segments, or damage anywhere but the newest segment's tail."""
    for _, item in _scan(directory):
        if isinstance(item, Chunk):
            yield item


def _scan(directory: str) -> Iterator[tuple[LogHeader, Chunk | Torn]]:
    """Each segment's header with each of its records, oldest first."""
    files = segments(directory)
    first: LogHeader | None = None
    for k, path in enumerate(files):
        handle, size = _open(path)
        with handle:
            header = _read_header(path, handle, size)
            if first is None:
                first = header
            elif header != first:
                raise _fail(path, "its layout or discounts differ from the log's first segment")
            for item in _records(path, handle, size, header):
                if isinstance(item, Torn) and k < len(files) - 1:
                    raise _fail(path, f"damaged at byte {item.offset}, and not the log's newest segment: "
                                      "a crash leaves only the newest segment's last record torn")
                yield header, item


def verify(directory: str, each: Callable[[Chunk], None] | None = None) -> LogReport:
    """Read every record of the log (checking every checksum) and say what it holds; ``each``
    is called with every whole record's chunk on the way."""
    header: LogHeader | None = None
    episodes = rows = 0
    torn = None
    for header, item in _scan(directory):
        if isinstance(item, Torn):
            torn = item
        else:
            episodes += item.n_episodes
            rows += item.rows
            if each is not None:
                each(item)
    if header is None:
        files = segments(directory)
        if not files:
            raise BufferFileError(f"{directory}: an episode log with no segment")
        handle, size = _open(files[0])
        with handle:
            header = _read_header(files[0], handle, size)
    return LogReport(header, len(segments(directory)), episodes, rows, torn)


def repair(directory: str) -> LogReport:
    """Cut a torn tail off the newest segment (every whole record stays as it is); returns what
    the log held before."""
    report = verify(directory)
    if report.torn is not None:
        os.truncate(report.torn.path, report.torn.offset)
        _sync_file(report.torn.path)
    return report


def _sync_file(path: str) -> None:
    """``path`` (a file, or a directory: its entries) to the disk itself."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LogWriter:
    """Appends chunks of whole episodes to the log ``directory`` (made if missing).

    An existing log is continued: its layout must match, a torn tail is cut first, and nothing
    else already there is rewritten. Each `append` hands its record to the OS before it
    returns: a process killed (SIGKILL) after that loses none of its episodes. ``fsync``
    says when they reach the disk itself, which is what survives a power loss: "interval" (at
    the first append ``every`` seconds after the last sync; the default), "always" (every
    append), "close" (only at `close`).

    One writer appends to a log at a time (two would interleave their records).

    Raises:
        BufferFileError: the directory holds a log of another layout, or a damaged one.
    """

    def __init__(self, directory: str | os.PathLike[str], header: LogHeader, *, fsync: FsyncPolicy = "interval",
                 every: float = 5.0, segment_bytes: int = SEGMENT_BYTES) -> None:
        if fsync not in ("interval", "always", "close"):
            raise ValueError(f"fsync must be 'interval', 'always' or 'close', got {fsync!r}")
        self.directory = os.fspath(directory)
        self.header = header
        self._header_bytes = header.to_bytes()
        self.fsync, self.every, self.segment_bytes = fsync, float(every), int(segment_bytes)
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):  # a segment a kill caught before it had its header
            if name.endswith(".fblog.new"):
                os.unlink(os.path.join(self.directory, name))
        files = segments(self.directory)
        if files:
            report = repair(self.directory)
            if report.header != header:
                check_layout(report.header.spec, header.spec, f"the episode log {self.directory}")
                raise BufferFileError(f"{self.directory}: the log's discounts (gamma {report.header.gamma}, "
                                      f"gae_lambda {report.header.gae_lambda}) differ from the recording's "
                                      f"({header.gamma}, {header.gae_lambda})")
            self._number = len(files) - 1
            self._file = open(files[-1], "ab", buffering=0)  # noqa: SIM115 - closed by close()
        else:
            self._number = -1
            self._next_segment()
        self._synced = time.monotonic()

    def _next_segment(self) -> None:
        self._number += 1
        path = os.path.join(self.directory, segment_name(self._number))
        with open(path + ".new", "wb") as out:  # whole or absent: a segment appears with its header
            out.write(self._header_bytes)
            out.flush()
            os.fsync(out.fileno())
        os.replace(path + ".new", path)
        _sync_file(self.directory)  # the new name is on disk too
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()

    @holding  # a Ctrl-C between two of its writes would leave a half record before the next
    def append(self, chunk: Chunk) -> None:
        """Write ``chunk``'s episodes as one record (nothing for an empty chunk)."""
        if not chunk.n_episodes:
            return
        check_layout(self.header.spec, chunk.spec, "the chunk")
        described, offset = [], 0
        for part in chunk.parts:
            offset += -offset % 8
            described.append({"name": part.name, "part": part.part, "per_agent": part.per_agent,
                              "dtype": part.dtype.str, "shape": list(part.shape), "offset": offset})
            offset += part.nbytes
        meta = json.dumps({"lengths": chunk.lengths.tolist(), "parts": described}).encode()
        data = np.zeros(offset, dtype=np.uint8)
        for part, item in zip(chunk.parts, described):
            at = item["offset"]
            for block in part.blocks():
                raw = np.ascontiguousarray(block).view(np.uint8).reshape(-1)
                data[at:at + raw.size] = raw
                at += raw.size
        head = _RECORD.pack(_RECORD_MAGIC, len(meta), data.size)
        crc = zlib.crc32(data.data, zlib.crc32(meta, zlib.crc32(head)))
        if self._file.tell() > len(self._header_bytes) and self._file.tell() + data.size > self.segment_bytes:
            self._file.close()
            self._next_segment()
        start = self._file.tell()
        try:  # unbuffered: each piece is with the OS when written (a killed process loses nothing appended)
            trailer = _TRAILER.pack(crc, _RECORD_END)
            for piece in (memoryview(head), memoryview(meta), data.data, memoryview(trailer)):
                view = piece.cast("B")
                while view:
                    view = view[self._file.write(view):]
        except OSError as exc:  # a full disk: no half record stays before the records to come
            os.ftruncate(self._file.fileno(), start)
            raise BufferSaveError(exc.errno, f"cannot append to the episode log ({exc.strerror or exc}; every "
                                  "episode appended before is intact)", str(self._file.name)) from exc
        if self.fsync == "always" or (self.fsync == "interval" and time.monotonic() - self._synced >= self.every):
            self.sync()

    def sync(self) -> None:
        """Everything appended so far to the disk itself."""
        os.fsync(self._file.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        """Sync and close (appending again needs a new writer)."""
        if not self._file.closed:
            self.sync()
            self._file.close()


class Follower:
    """Appends to ``writer`` every whole episode that ends in ``lanes`` from now on: `flush`
    after episodes end writes those that ended since the last flush, as one record."""

    def __init__(self, writer: LogWriter, lanes: Sequence[Lane]) -> None:
        self.writer = writer
        self._after = [lane.written for lane in lanes]  # per lane: episodes ending later are new
        self.episodes = self.rows = 0  # appended so far

    def flush(self, storage: Storage, lanes: Sequence[Lane]) -> None:
        episodes = episode_table(lanes, after=self._after)
        if not len(episodes):
            return
        self.writer.append(copy(storage, episodes, self.writer.header.gamma, self.writer.header.gae_lambda))
        self.episodes += len(episodes)
        self.rows += int(episodes.lengths.sum())
        self._after = [lane.ended.ends[-1] if len(lane.ended) else after for lane, after in zip(lanes, self._after)]
