"""Buffer files: one self-describing file, no pickle, written atomically, readable as a memory map.

Layout (little endian)::

    b"FLEXIBUF" | u32 version | u64 header length | JSON header | pad to 64
    | arrays, each 64-byte aligned | u32 crc32 of the header part | u32 crc32 of the arrays | b"FBUF-END"

The header names each array's dtype, shape and offset. An array holds the rows of each lane that
hold recorded steps, in ring order (one range per lane: the whole lane when its live rows wrap
around), lane after lane, per agent for per-agent fields; so a file holds what was recorded, not
the empty part of the ring, and every row keeps its number. Episode positions are written as
they are in memory (format 4; formats 1-3 renumbered them from each lane's oldest row). A
next-value field (``obs_``) is stored once, as in memory (`flexibuff_envs.chain`): a per-row
``index`` part and the ``tail`` slots it names, renumbered to the slots in use; masks are bits. Formats 1 (one checksum over everything), 2
(next values written out row by row, a bool per action) and 3 are still read.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, NoReturn

import numpy as np

from flexibuff_envs.episodes import Lane
from flexibuff_envs.errors import BufferFileError, BufferSaveError
from flexibuff_envs.header import PRIORITY, BadHeader, Truncated, parse, stored_range
from flexibuff_envs.index import newest_rows
from flexibuff_envs.parts import Part, Segments
from flexibuff_envs.samplers import live_rows
from flexibuff_envs.storage import Storage

MAGIC, END = b"FLEXIBUF", b"FBUF-END"
VERSION = 4
_ALIGN = 64
_PREFIX = struct.Struct("<8sIQ")
_SUFFIX = {1: struct.Struct("<I8s"), 2: struct.Struct("<II8s"), 3: struct.Struct("<II8s"), 4: struct.Struct("<II8s")}
#: what a prioritized sampler keeps in a file: priority ** alpha per row, the highest priority given
Priorities = tuple[np.ndarray, float] | None


def _padding(position: int) -> int:
    return -position % _ALIGN


class _Checksum:
    """A running crc32, computed on a worker thread while the calling thread reads or writes.

    Both zlib and file I/O release the GIL on large buffers, so checking costs no extra time.
    """

    PIECE = 1 << 25  # 32 MiB: big enough to amortise a hand-off, small enough to overlap

    def __init__(self, seed: int = 0) -> None:
        self.value = seed
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="flexibuff-crc")

    def pieces(self, data: memoryview) -> Iterator[memoryview]:
        """``data`` in pieces; each is checksummed (in order) once the caller has handled it."""
        for start in range(0, len(data), self.PIECE):
            piece = data[start : start + self.PIECE]
            yield piece
            self._worker.submit(self._update, piece)

    def add(self, data: bytes) -> None:
        """Checksum a small piece the caller has handled."""
        self._worker.submit(self._update, data)

    def _update(self, piece: memoryview | bytes) -> None:
        self.value = zlib.crc32(piece, self.value)

    def result(self) -> int:
        self._worker.shutdown(wait=True)
        return self.value


def _lanes(lanes: Sequence[Lane], ranges: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Each lane's positions, stored rows ``[lo, hi)`` and episodes, as the header holds them."""
    return [
        {
            "written": lane.written,
            "live_start": lane.live_start,
            "rows": [lo, hi],
            "ended": [
                list(e) for e in zip(lane.ended.starts.tolist(), lane.ended.ends.tolist(), lane.ended.whole.tolist())
            ],
            "running": None if lane.running is None else [lane.running.start, lane.running.end, lane.running.whole],
            "agent_start": lane.agents.saved(),
        }
        for lane, (lo, hi) in zip(lanes, ranges)
    ]


def save(path: str, settings: dict[str, Any], storage: Storage, lanes: Sequence[Lane], priorities: Priorities) -> None:
    """Write a buffer (its ``settings``, the JSON-ready values its header keeps, and its parts)
    to ``path`` atomically: the old file stays intact until the new is whole. ``priorities``:
    what its prioritized sampler keeps (`Prioritized.saved`), if it has one.

    Rows go from the ring to the file slice by slice, in ring order (so row numbers stay as they
    are): no copy of the buffer is made.

    Raises:
        BufferSaveError: the file could not be written (``path`` is a directory, a directory on
            the way cannot be made, no permission, a full disk); it names ``path``.
    """
    try:
        _save(path, settings, storage, lanes, priorities)
    except BufferSaveError:
        raise
    except OSError as exc:
        what = exc.strerror or str(exc)
        raise BufferSaveError(
            exc.errno, f"cannot save the buffer ({what}; a file already there is intact)", path
        ) from exc


def _save(path: str, settings: dict[str, Any], storage: Storage, lanes: Sequence[Lane], priorities: Priorities) -> None:
    if os.path.isdir(path):
        raise BufferSaveError(errno.EISDIR, "cannot save the buffer: it is a directory; give a file name", path)
    ranges = [stored_range(lane.live_start, lane.written, lane.capacity) for lane in lanes]
    segments = [(lane.offset + lo, lane.offset + hi) for lane, (lo, hi) in zip(lanes, ranges)]
    header = {"format": "flexibuff_envs buffer", **settings, "lanes": _lanes(lanes, ranges), "fields": []}
    parts = storage.export(segments)
    if priorities is not None:  # prioritized replay's priority ** alpha per row, and the highest priority given
        leaves, header["max_priority"] = priorities
        parts.append(Part.of(PRIORITY, None, leaves, False, segments))
    offset = 0
    for part in parts:
        offset += _padding(offset)
        meta: dict[str, Any] = {"name": part.name}
        if part.part is not None:
            meta["part"] = part.part
        elif part.name != PRIORITY:
            meta["width"] = part.shape[-1] if len(part.shape) > 1 + part.per_agent else None
        header["fields"].append({**meta, "dtype": part.dtype.str, "shape": list(part.shape), "offset": offset})
        offset += part.nbytes
    header["data_bytes"] = offset
    blob = json.dumps(header).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, len(blob)) + blob
    prefix += b"\0" * _padding(len(prefix))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    _remove_stale(directory, os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=_TMP, dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(prefix)
            checksum = _Checksum()
            try:
                position = 0
                for part in parts:
                    pad = b"\0" * _padding(position)
                    out.write(pad)
                    checksum.add(pad)
                    position += len(pad)
                    for block in part.blocks():
                        for piece in checksum.pieces(block.data.cast("B") if block.size else memoryview(b"")):
                            out.write(piece)
                        position += block.nbytes
            finally:
                crc = checksum.result()
            out.write(_SUFFIX[VERSION].pack(zlib.crc32(prefix), crc, END))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a saved buffer is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


#: the end of a temporary file's name: ``.<target>.<pid>.<random>.fbuf-tmp``
_TMP = ".fbuf-tmp"


def _remove_stale(directory: str, target: str) -> None:
    """Remove what saves of ``target`` left behind when their process was killed mid-save: its
    temporary files whose process is gone (those of live processes may be saves under way)."""
    prefix = f".{target}."
    try:
        entries = [e.name for e in os.scandir(directory) if e.name.startswith(prefix) and e.name.endswith(_TMP)]
    except OSError:
        return
    for name in entries:
        pid = name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit() and len(pid) < 10 and not _alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass  # another save removed it first, or it is not ours to remove


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading, if it is (or links to) a regular file: a FIFO would block,
    a device or a directory is no buffer file."""
    try:
        info = os.stat(path)
    except FileNotFoundError as exc:
        raise BufferFileError(f"{path}: no such buffer file") from exc
    except OSError as exc:
        raise BufferFileError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if not stat.S_ISREG(info.st_mode):
        raise BufferFileError(f"{path}: not a regular file; a buffer file is one")
    try:  # non-blocking: a FIFO put there since the check must not hang the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise BufferFileError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BufferFileError(f"{path}: not a regular file; a buffer file is one")
    return os.fdopen(fd, "rb")


class BufferFile:
    """An opened regular buffer file whose size, end marker, checksum and header were checked."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.handle = _open_regular(path)
        try:
            self._check()
        except OSError as exc:
            self.fail(f"cannot be read ({exc.strerror or exc})")

    def _check(self) -> None:
        self.size = os.fstat(self.handle.fileno()).st_size
        if self.size < _PREFIX.size:
            self.fail(f"too short to be a buffer file ({self.size} bytes)")
        head = self.handle.read(_PREFIX.size)
        if len(head) < _PREFIX.size:
            self.fail(f"too short to be a buffer file ({len(head)} bytes could be read)")
        magic, self.version, length = _PREFIX.unpack(head)
        if magic != MAGIC:
            self.fail("not a flexibuff_envs buffer file (bad magic bytes)")
        if self.version > VERSION:
            self.fail(
                f"written by a newer flexibuff_envs (format {self.version}, this one reads up to "
                f"{VERSION}); upgrade flexibuff-envs"
            )
        if self.version < 1:
            self.fail(f"corrupt header (format {self.version} does not exist)")
        suffix = _SUFFIX[self.version]
        blob = self.handle.read(length) if _PREFIX.size + length + suffix.size <= self.size else b""
        if len(blob) < length:
            self.fail(f"truncated or corrupt: the header runs past the end of the file ({self.size} bytes)")
        self.data_start = _PREFIX.size + length + _padding(_PREFIX.size + length)
        self.data_end = self.size - suffix.size
        if self.data_start > self.data_end:
            self.fail(f"truncated (no room for the arrays and the end marker in {self.size} bytes)")
        self.handle.seek(self.data_end)
        *self.crcs, end = suffix.unpack(self.handle.read(suffix.size))
        if end != END:
            self.fail(f"truncated (no end marker at byte {self.data_end}); the save did not finish")
        head_part = head + blob + b"\0" * (self.data_start - _PREFIX.size - length)
        if self.version > 1 and zlib.crc32(head_part) != self.crcs[0]:
            self.fail(f"corrupt header (checksum mismatch in bytes 0-{self.data_start})")
        data_bytes = self.data_end - self.data_start
        try:
            self.header = parse(blob, self.version, data_bytes)
        except BadHeader as exc:
            self.fail(str(exc) if isinstance(exc, Truncated) else f"corrupt header: {exc}")
        # format 1 has one checksum over everything; its running value starts with the header part
        self.data_crc = self.crcs[-1]
        self.crc_seed = zlib.crc32(head_part) if self.version == 1 else 0

    def fail(self, problem: str) -> NoReturn:
        self.handle.close()
        raise BufferFileError(f"{self.path}: {problem}")

    def __enter__(self) -> BufferFile:  # noqa: PYI034 (Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def mapped(self, meta: dict[str, Any]) -> np.ndarray:
        """The array field ``meta`` of the header describes, mapped copy-on-write from the file
        that was opened and checked (not the path again: it may name another file by now)."""
        return np.asarray(
            np.memmap(
                self.handle,
                dtype=np.dtype(meta["dtype"]),
                mode="c",
                offset=self.data_start + meta["offset"],
                shape=tuple(meta["shape"]),
            )
        )

    def read_into(self, storage: Storage, segments: Segments, leaves: np.ndarray | None) -> None:
        """Read each part straight into where ``storage`` holds the ring rows ``segments`` (the
        priorities into ``leaves``), checking the CRC."""
        handle, checksum = self.handle, _Checksum(self.crc_seed)
        handle.seek(self.data_start)
        parts = []
        try:
            for meta in self.header.fields:
                checksum.add(handle.read(self.data_start + meta["offset"] - handle.tell()))  # padding
                dtype = np.dtype(meta["dtype"])
                part = (
                    Part.of(PRIORITY, None, leaves, False, segments)  # type: ignore[arg-type]
                    if meta["name"] == PRIORITY
                    else storage.receive(meta["name"], meta.get("part"), tuple(meta["shape"]), dtype, segments)
                )
                if part.dtype != dtype:
                    self.fail(
                        f"corrupt: field {meta['name']!r} has dtype {meta['dtype']} in the header, "
                        f"{part.dtype.str} in its spec"
                    )
                for block in part.blocks():
                    for piece in checksum.pieces(block.data.cast("B") if block.size else memoryview(b"")):
                        if handle.readinto(piece) != len(piece):  # type: ignore[attr-defined]
                            self.fail(f"truncated inside field {meta['name']!r}")
                parts.append(part)
            checksum.add(handle.read(self.data_end - handle.tell()))
        finally:
            crc = checksum.result()
        if crc != self.data_crc:
            self.fail(f"corrupt: data checksum mismatch (bytes {self.data_start}-{self.data_end})")
        storage.settle(parts, segments)


def fill(file: BufferFile, storage: Storage, lanes: Sequence[Lane], *, mmap: bool = False) -> np.ndarray | None:
    """Give ``storage`` and ``lanes`` (of a buffer made as ``file``'s header says) the file's rows
    and episodes; returns each row's priority ``** alpha`` when the file holds priorities.

    Rows keep their numbers (``batch.idx``). Values sampling uses as indices or flags are
    checked (`Storage.problem`): any file either loads or raises `BufferFileError`.

    Args:
        mmap: map the arrays from the file instead of reading them (copy-on-write: the buffer can
            be changed and recorded into, the file never is). Only the header is read and checked;
            the data checksum is not, as that would read the whole file. A file whose lanes do
            not all span their whole ring is read instead: the ring needs its full size.
    """
    header = file.header
    segments = [(lane.offset + info.lo, lane.offset + info.hi) for lane, info in zip(lanes, header.lanes)]
    leaves = np.zeros(storage.rows) if header.max_priority is not None else None
    if mmap and all((info.lo, info.hi) == (0, header.num_steps) for info in header.lanes):
        arrays = {(meta["name"], meta.get("part")): file.mapped(meta) for meta in header.fields}
        if leaves is not None:
            leaves[:] = arrays.pop((PRIORITY, None))
        storage.adopt(arrays)
    else:
        file.read_into(storage, segments, leaves)
    for k, (lane, info) in enumerate(zip(lanes, header.lanes)):
        # the rows that are not live are opened (given their allocated values) as recording on
        # reaches them (`Lane.restore`); a field allocated later fills the whole lane
        storage.open(k, [(lane.offset, lane.offset + lane.capacity)], fill=False)
        running = info.running[0] if info.running else 0
        lane.restore(
            info.written,
            info.live_start,
            np.array(info.ended, dtype=np.int64).reshape(-1, 3),
            info.running,
            info.agent_start if info.agent_start is not None else [running] * len(lane.agents.starts),
        )
    live = live_rows(lanes)
    problem = storage.problem(segments, live, newest_rows(lanes))
    if not problem and leaves is not None and not (np.isfinite(leaves[live]).all() and (leaves[live] >= 0).all()):
        problem = f"{PRIORITY} holds a value that is negative or not finite"
    if problem:
        file.fail(f"corrupt: {problem}")
    return leaves
