"""Buffer files: one self-describing file, no pickle, written atomically, readable as a memory map.

Layout (little endian)::

    b"FLEXIBUF" | u32 version | u64 header length | JSON header | pad to 64
    | arrays, each 64-byte aligned | u32 crc32 of the header part | u32 crc32 of the arrays | b"FBUF-END"

The header names each array's dtype, shape and offset. An array holds the rows of each lane that
hold recorded steps, in ring order (one range per lane: the whole lane when its live rows wrap
around), lane after lane, per agent for per-agent fields; so a file holds what was recorded, not
the empty part of the ring, and every row keeps its number. Episode positions are written as
they are in memory (format 4; formats 1-3 renumbered them from each lane's oldest row). A next-value field (``obs_``) is stored once,
as in memory (`flexibuff_envs.chain`): a per-row ``index`` part and the ``tail`` slots it names,
renumbered to the slots in use; masks are bits. Formats 1 (one checksum over everything), 2
(next values written out row by row, a bool per action) and 3 are still read.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from flexibuff_envs.episodes import ALL, Episode, Lane
from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import FIELDS, MASKS, NEXT, pack_mask

if TYPE_CHECKING:
    from flexibuff_envs.buffer import FlexibleBuffer

MAGIC, END = b"FLEXIBUF", b"FBUF-END"
VERSION = 4
_ALIGN = 64
_PREFIX = struct.Struct("<8sIQ")
_SUFFIX = {1: struct.Struct("<I8s"), 2: struct.Struct("<II8s"), 3: struct.Struct("<II8s"), 4: struct.Struct("<II8s")}


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
            piece = data[start:start + self.PIECE]
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


def stored_range(lane: Lane) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of ``lane`` (counted from its first row) a file holds: the live ones
    as one range in ring order, the whole lane when they wrap around its end."""
    if lane.size == 0:
        return 0, 0
    first = lane.live_start % lane.capacity
    return (first, first + lane.size) if first + lane.size <= lane.capacity else (0, lane.capacity)


def _header(buffer: FlexibleBuffer) -> dict[str, Any]:
    lanes = []
    for lane in buffer._lanes:
        lo, hi = stored_range(lane)
        lanes.append({
            "written": lane.written,
            "live_start": lane.live_start,
            "rows": [lo, hi],
            "ended": [[e.start, e.end, e.whole] for e in lane.ended],
            "running": None if lane.running is None else [lane.running.start, lane.running.end, lane.running.whole],
            "agent_start": list(lane.agent_start),
        })
    return {
        "format": "flexibuff_envs buffer",
        "spec": buffer.spec.to_dict(),
        "num_steps": buffer.num_steps,
        "gamma": buffer.gamma,
        "gae_lambda": buffer.gae_lambda,
        "path": buffer.path,
        "name": buffer.name,
        "rng": buffer.rng.bit_generator.state,
        "lanes": lanes,
        "fields": [],
    }


def _blocks(array: np.ndarray, per_agent: bool, segments: list[tuple[int, int]]) -> Iterator[np.ndarray]:
    """The contiguous pieces of ``array`` a file holds, in file order."""
    for agent in range(array.shape[0]) if per_agent else (None,):
        for lo, hi in segments:
            yield array[lo:hi] if agent is None else array[agent, lo:hi]


def save(buffer: FlexibleBuffer, path: str) -> None:
    """Write ``buffer`` to ``path`` atomically: the old file stays intact until the new is whole.

    Rows go from the ring to the file slice by slice, in ring order (so row numbers stay as they
    are): no copy of the buffer is made.
    """
    segments = [(lane.offset + lo, lane.offset + hi) for lane in buffer._lanes for lo, hi in [stored_range(lane)]]
    rows = sum(hi - lo for lo, hi in segments)
    header = _header(buffer)
    fields: list[list[np.ndarray] | Iterator[np.ndarray]] = []
    offset = 0

    def add(meta: dict[str, Any], shape: list[int], array: np.ndarray,
            blocks: list[np.ndarray] | Iterator[np.ndarray]) -> None:
        nonlocal offset
        offset += _padding(offset)
        header["fields"].append({**meta, "dtype": array.dtype.str, "shape": shape, "offset": offset})
        fields.append(blocks)
        offset += int(np.prod(shape)) * array.itemsize

    def row_shape(array: np.ndarray, per_agent: bool) -> list[int]:
        return [array.shape[0], rows, *array.shape[2:]] if per_agent else [rows, *array.shape[1:]]

    for name, array in buffer._storage:
        per_agent = FIELDS[name].per_agent
        add({"name": name, "width": array.shape[-1] if array.ndim > 1 + per_agent else None},
            row_shape(array, per_agent), array, _blocks(array, per_agent, segments))
    stored = np.concatenate([np.arange(lo, hi) for lo, hi in segments]) if rows else np.zeros(0, np.int64)
    for name, chain in buffer._storage.chains.items():
        index, tail = chain.extract(stored)  # slots renumbered to the ones in use
        add({"name": name, "part": "index"}, row_shape(chain.index, chain.per_agent), index, [index])
        add({"name": name, "part": "tail"}, list(tail.shape), tail, [tail])
    header["data_bytes"] = offset
    blob = json.dumps(header).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, len(blob)) + blob
    prefix += b"\0" * _padding(len(prefix))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fbuf-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(prefix)
            checksum = _Checksum()
            try:
                position = 0
                for blocks in fields:
                    pad = b"\0" * _padding(position)
                    out.write(pad)
                    checksum.add(pad)
                    position += len(pad)
                    for block in blocks:
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _File:
    """An opened buffer file whose header, size and end marker were checked."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.handle: BinaryIO = open(path, "rb")  # noqa: SIM115 (closed by load)
        except FileNotFoundError as exc:
            raise BufferFileError(f"{path}: no such buffer file") from exc
        except OSError as exc:
            raise BufferFileError(f"{path}: cannot be read ({exc.strerror})") from exc
        self.size = os.fstat(self.handle.fileno()).st_size
        head = self.handle.read(_PREFIX.size)
        if len(head) < _PREFIX.size:
            self.fail(f"too short to be a buffer file ({self.size} bytes)")
        magic, self.version, length = _PREFIX.unpack(head)
        if magic != MAGIC:
            self.fail("not a flexibuff_envs buffer file (bad magic bytes)")
        if self.version > VERSION:
            self.fail(f"written by a newer flexibuff_envs (format {self.version}, this one reads up to "
                      f"{VERSION}); upgrade flexibuff-envs")
        suffix = _SUFFIX[self.version]
        blob = self.handle.read(length) if _PREFIX.size + length + suffix.size <= self.size else b""
        if len(blob) < length:
            self.fail(f"truncated or corrupt: the header runs past the end of the file ({self.size} bytes)")
        self.data_start = _PREFIX.size + length + _padding(_PREFIX.size + length)
        self.handle.seek(self.size - suffix.size)
        *self.crcs, end = suffix.unpack(self.handle.read(suffix.size))
        if end != END:
            self.fail(f"truncated (no end marker at byte {self.size - suffix.size}); the save did not finish")
        head_part = head + blob + b"\0" * (self.data_start - _PREFIX.size - length)
        if self.version > 1 and zlib.crc32(head_part) != self.crcs[0]:
            self.fail(f"corrupt header (checksum mismatch in bytes 0-{self.data_start})")
        try:
            self.header = json.loads(blob)
        except ValueError as exc:
            self.fail(f"corrupt header: {exc}")
        expected = self.data_start + self.header.get("data_bytes", self.size) + suffix.size
        if self.version > 1 and expected != self.size:
            self.fail(f"truncated: the header describes {expected} bytes but the file has {self.size}")
        # format 1 has one checksum over everything; its running value starts with the header part
        self.data_crc = self.crcs[-1]
        self.crc_seed = zlib.crc32(head_part) if self.version == 1 else 0
        self.data_end = self.size - suffix.size

    def fail(self, problem: str) -> None:
        self.handle.close()
        raise BufferFileError(f"{self.path}: {problem}")


def _lanes_of(header: dict[str, Any], version: int) -> list[dict[str, Any]]:
    """Each lane's positions, episodes and stored rows, as format 4 writes them. Formats 1-3
    held the live rows oldest first, their positions counted from the oldest."""
    if version >= 4:
        return header["lanes"]
    return [{"written": info["size"], "live_start": 0, "rows": [0, info["size"]], "ended": info["ended"],
             "running": info["running"], "agent_start": None} for info in header["lanes"]]


def load(path: str, *, mmap: bool = False) -> FlexibleBuffer:
    """Read a buffer file written by `save`; rows keep their numbers (``batch.idx``).

    Args:
        mmap: map the arrays from the file instead of reading them (copy-on-write: the buffer can
            be changed and recorded into, the file never is). Only the header is read and checked;
            the data checksum is not, as that would read the whole file. A file whose lanes do
            not all span their whole ring is read instead: the ring needs its full size.
    """
    from flexibuff_envs.buffer import FlexibleBuffer

    file = _File(path)
    header = file.header
    fields = header["fields"]
    log_probs = next((f["width"] for f in fields if f["name"] == "continuous_log_probs"), 0) or 0
    buffer = FlexibleBuffer.from_spec(BufferSpec.from_dict(header["spec"]), num_steps=header["num_steps"],
                                      gamma=header["gamma"], gae_lambda=header.get("gae_lambda", 0.95),
                                      log_prob_continuous=log_probs, global_reward=False,
                                      individual_reward=False)
    buffer.path, buffer.name = header["path"], header["name"]
    buffer.rng.bit_generator.state = header["rng"]
    lanes = _lanes_of(header, file.version)
    try:
        if mmap and all(info["rows"] == [0, buffer.num_steps] for info in lanes):
            buffer._map(file.path, file.data_start, fields)
        else:
            segments = [(lane.offset + info["rows"][0], lane.offset + info["rows"][1])
                        for lane, info in zip(buffer._lanes, lanes)]
            _read_into(buffer, file, fields, segments)
    finally:
        file.handle.close()
    for i, (lane, info) in enumerate(zip(buffer._lanes, lanes)):
        lane.written = lane.dirty = info["written"]
        # rows below written hold the file's values (or are not live): the rest opens as recorded
        lane.opened = info["written"] if info["written"] < lane.capacity else ALL
        buffer._storage.opened[i] = min(info["written"], lane.capacity)
        lane.live_start = info["live_start"]
        lane.ended.extend(Episode(s, e, w) for s, e, w in info["ended"])
        lane.running = None if info["running"] is None else Episode(*info["running"])
        if info["agent_start"] is not None:
            lane.agent_start = list(info["agent_start"])
        elif lane.running is not None:
            lane.agent_start = [lane.running.start] * len(lane.agent_start)
    if not mmap and any(name in buffer._storage.arrays for name in NEXT):
        buffer.compact()  # an older file's next values, written out row by row: keep them once
    return buffer


def _read_into(buffer: FlexibleBuffer, file: _File, fields: list[dict[str, Any]],
               segments: list[tuple[int, int]]) -> None:
    """Read each field's rows from ``file`` straight into the buffer's ring rows ``segments``
    (one range per lane), checking the CRC."""
    handle, checksum = file.handle, _Checksum(file.crc_seed)
    handle.seek(file.data_start)
    try:
        for meta in fields:
            checksum.add(handle.read(file.data_start + meta["offset"] - handle.tell()))  # padding
            part = meta.get("part")
            if meta["name"] in MASKS and meta["dtype"] == "|b1":  # formats 1-2: a bool per action
                packed = buffer.field(meta["name"])
                target = np.ones((*packed.shape[:-1], meta["width"]), dtype=bool)
                blocks = _blocks(target, True, segments)
            elif part is None:
                target = buffer.field(meta["name"], width=meta["width"])
                blocks = _blocks(target, FIELDS[meta["name"]].per_agent, segments)
            elif part == "index":
                chain = buffer._storage.chain(meta["name"])
                target = chain.index
                blocks = _blocks(target, chain.per_agent, segments)
            else:
                chain = buffer._storage.chain(meta["name"])
                chain.alloc(meta["shape"][0] - chain.fresh)
                target = chain.tail
                blocks = iter([target[:meta["shape"][0]]])
            if target.dtype.str != meta["dtype"]:
                file.fail(f"corrupt: field {meta['name']!r} has dtype {meta['dtype']} in the header, "
                          f"{target.dtype.str} in its spec")
            for block in blocks:
                for piece in checksum.pieces(block.data.cast("B") if block.size else memoryview(b"")):
                    if handle.readinto(piece) != len(piece):  # type: ignore[attr-defined]
                        file.fail(f"truncated inside field {meta['name']!r}")
            if target.dtype == bool and meta["name"] in MASKS:
                packed[...] = pack_mask(target)
        checksum.add(handle.read(file.data_end - handle.tell()))
    finally:
        crc = checksum.result()
    if crc != file.data_crc:
        file.fail(f"corrupt: data checksum mismatch (bytes {file.data_start}-{file.data_end})")
