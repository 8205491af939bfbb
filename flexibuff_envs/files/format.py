"""Buffer files' shared form and their reading: the bytes around the arrays, the running
checksum, and `BufferFile`, which opens a file and checks it, then `fill`, which gives a buffer
its rows (`flexibuff_envs.files.io` writes them; its docstring lays the format out)."""

from __future__ import annotations

import os
import stat
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, NoReturn

import numpy as np

from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.files.header import PRIORITY, BadHeader, Truncated, parse
from flexibuff_envs.index import newest_rows
from flexibuff_envs.index.lanes import Lane
from flexibuff_envs.index.origins import UNKNOWN, checked
from flexibuff_envs.sampling.samplers import live_rows
from flexibuff_envs.storage import Storage, compression
from flexibuff_envs.storage.compression import available_memory
from flexibuff_envs.storage.stored_form import Part, Segments

MAGIC, END = b"FLEXIBUF", b"FBUF-END"
#: the newest format: 5 is 4 with compressed parts (a file with none is written as 4, which readers
#: before compression read)
VERSION = 5
ALIGN = 64
PREFIX = struct.Struct("<8sIQ")
SUFFIX = {1: struct.Struct("<I8s"), **dict.fromkeys((2, 3, 4, 5), struct.Struct("<II8s"))}


def padding(position: int) -> int:
    return -position % ALIGN


class Checksum:
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
        if self.size < PREFIX.size:
            self.fail(f"too short to be a buffer file ({self.size} bytes)")
        head = self.handle.read(PREFIX.size)
        if len(head) < PREFIX.size:
            self.fail(f"too short to be a buffer file ({len(head)} bytes could be read)")
        magic, self.version, length = PREFIX.unpack(head)
        if magic != MAGIC:
            self.fail("not a flexibuff_envs buffer file (bad magic bytes)")
        if self.version > VERSION:
            self.fail(
                f"written by a newer flexibuff_envs (format {self.version}, this one reads up to "
                f"{VERSION}); upgrade flexibuff-envs"
            )
        if self.version < 1:
            self.fail(f"corrupt header (format {self.version} does not exist)")
        suffix = SUFFIX[self.version]
        blob = self.handle.read(length) if PREFIX.size + length + suffix.size <= self.size else b""
        if len(blob) < length:
            self.fail(f"truncated or corrupt: the header runs past the end of the file ({self.size} bytes)")
        self.data_start = PREFIX.size + length + padding(PREFIX.size + length)
        self.data_end = self.size - suffix.size
        if self.data_start > self.data_end:
            self.fail(f"truncated (no room for the arrays and the end marker in {self.size} bytes)")
        self.handle.seek(self.data_end)
        *self.crcs, end = suffix.unpack(self.handle.read(suffix.size))
        if end != END:
            self.fail(f"truncated (no end marker at byte {self.data_end}); the save did not finish")
        head_part = head + blob + b"\0" * (self.data_start - PREFIX.size - length)
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

    def _decode(self, meta: dict[str, Any], blocks: Iterable[np.ndarray], checksum: Checksum | None) -> None:
        """The compressed part ``meta`` describes, decoded into ``blocks`` (its bytes in order),
        read from where the handle stands (its start); ``checksum`` given, what is read adds to it."""
        start = self.handle.tell()

        def read(n: int) -> bytes:
            data = self.handle.read(n)
            if len(data) != n:
                self.fail(f"truncated inside field {meta['name']!r}")
            if checksum is not None:
                checksum.add(data)
            return data

        def sizes_of(n: int) -> bytes:
            return os.pread(self.handle.fileno(), n, start + meta["stored"] - n)

        where = f"field {meta['name']!r}" + (f" ({meta['part']})" if meta.get("part") else "")
        nbytes = int(np.prod(meta["shape"], dtype=np.int64)) * np.dtype(meta["dtype"]).itemsize
        try:
            targets = (block.data.cast("B") for block in blocks if block.size)
            compression.decode(read, sizes_of, meta["stored"], targets, nbytes, where)
        except BufferFileError as exc:
            self.fail(f"corrupt: {exc}")

    def decoded(self, meta: dict[str, Any]) -> np.ndarray:
        """The compressed part ``meta`` describes, decoded into memory (`mapped`'s counterpart)."""
        out = np.empty(tuple(meta["shape"]), dtype=np.dtype(meta["dtype"]))
        self.handle.seek(self.data_start + meta["offset"])
        self._decode(meta, [out], None)
        return out

    def check_memory(self) -> None:
        """`BufferFileError` unless the compressed parts decode into the memory available (a
        file cannot make this take more than it has, however its parts compress)."""
        decoded = sum(
            int(np.prod(meta["shape"], dtype=np.int64)) * np.dtype(meta["dtype"]).itemsize
            for meta in self.header.fields
            if "codec" in meta
        )
        if decoded > available_memory():
            self.fail(
                f"its compressed parts decode to {decoded:,} bytes, more than the "
                f"{available_memory():,} of memory available"
            )

    def read_into(self, storage: Storage, segments: Segments, leaves: np.ndarray | None) -> None:
        """Read each part straight into where ``storage`` holds the ring rows ``segments`` (the
        priorities into ``leaves``), checking the CRC."""
        handle, checksum = self.handle, Checksum(self.crc_seed)
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
                if "codec" in meta:
                    self._decode(meta, part.blocks(), checksum)
                    parts.append(part)
                    continue
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
    file.check_memory()
    if mmap and all((info.lo, info.hi) == (0, header.num_steps) for info in header.lanes):
        arrays = {
            (meta["name"], meta.get("part")): file.decoded(meta) if "codec" in meta else file.mapped(meta)
            for meta in header.fields
        }
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
            UNKNOWN if info.origins is None else checked(info.origins, len(header.sessions)),
        )
    live = live_rows(lanes)
    problem = storage.problem(segments, live, newest_rows(lanes))
    if not problem and leaves is not None and not (np.isfinite(leaves[live]).all() and (leaves[live] >= 0).all()):
        problem = f"{PRIORITY} holds a value that is negative or not finite"
    if problem:
        file.fail(f"corrupt: {problem}")
    return leaves
