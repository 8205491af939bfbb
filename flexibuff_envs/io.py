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

import json
import os
import stat
import struct
import tempfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

import numpy as np

from flexibuff_envs.chain import CHAINED, Chain
from flexibuff_envs.episodes import Episode
from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.header import PRIORITY, BadHeader, Truncated, parse, stored_range
from flexibuff_envs.priorities import PriorityTree
from flexibuff_envs.sampling import live_rows
from flexibuff_envs.storage import MASKS, NEXT, Storage, pack_mask

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


def _ranges(buffer: FlexibleBuffer) -> list[tuple[int, int]]:
    """Each lane's stored rows ``[lo, hi)``, counted from the lane's first row."""
    return [stored_range(lane.live_start, lane.written, lane.capacity) for lane in buffer._lanes]


def _header(buffer: FlexibleBuffer, ranges: list[tuple[int, int]]) -> dict[str, Any]:
    lanes = []
    for lane, (lo, hi) in zip(buffer._lanes, ranges):
        lanes.append({
            "written": lane.written,
            "live_start": lane.live_start,
            "rows": [lo, hi],
            "ended": [list(e) for e in zip(lane.ended.starts.tolist(), lane.ended.ends.tolist(),
                                           lane.ended.whole.tolist())],
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
        "alpha": buffer.alpha,
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
    ranges = _ranges(buffer)
    segments = [(lane.offset + lo, lane.offset + hi) for lane, (lo, hi) in zip(buffer._lanes, ranges)]
    rows = sum(hi - lo for lo, hi in segments)
    header = _header(buffer, ranges)
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
        per_agent = buffer._storage.fields[name].per_agent
        add({"name": name, "width": array.shape[-1] if array.ndim > 1 + per_agent else None},
            row_shape(array, per_agent), array, _blocks(array, per_agent, segments))
    tree = buffer._priorities
    if tree is not None:  # prioritized replay's priority ** alpha per row, and the highest priority given
        tree.sync(buffer._read_lanes)
        header["max_priority"] = tree.max_priority
        leaves = tree.leaf_values(buffer._storage.rows)
        add({"name": PRIORITY}, [rows], leaves, _blocks(leaves, False, segments))
    stored = np.concatenate([np.arange(lo, hi) for lo, hi in segments])
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
    _remove_stale(directory, os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=_TMP, dir=directory)
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
        pid = name[len(prefix):].split(".", 1)[0]
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


class _File:
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
            self.fail(f"written by a newer flexibuff_envs (format {self.version}, this one reads up to "
                      f"{VERSION}); upgrade flexibuff-envs")
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


def load(cls: type[FlexibleBuffer], path: str, *, mmap: bool = False) -> FlexibleBuffer:
    """Read a buffer file written by `save`; rows keep their numbers (``batch.idx``).

    Any file either loads, using memory in proportion to its size, or raises `BufferFileError`:
    the header is checked whole (`header.parse`) before anything is allocated or mapped, and
    the next-value indices once read.

    Args:
        cls: the buffer class to make (`FlexibleBuffer` passes itself: io imports no buffer).
        mmap: map the arrays from the file instead of reading them (copy-on-write: the buffer can
            be changed and recorded into, the file never is). Only the header is read and checked;
            the data checksum is not, as that would read the whole file. A file whose lanes do
            not all span their whole ring is read instead: the ring needs its full size.
    """
    file = _File(path)
    header = file.header
    try:
        try:
            buffer = cls.from_spec(header.spec, num_steps=header.num_steps, gamma=header.gamma,
                                   gae_lambda=header.gae_lambda, log_prob_continuous=header.log_prob_width,
                                   global_reward=False, individual_reward=False)
        except MemoryError:
            file.fail(f"its ring of {header.num_steps:,} rows x {header.spec.n_envs} lanes cannot be allocated "
                      "on this machine")
        buffer.path, buffer.name = header.path, header.name
        buffer.rng.bit_generator.state = header.rng
        buffer.alpha = header.alpha
        segments = [(lane.offset + info.lo, lane.offset + info.hi) for lane, info in zip(buffer._lanes, header.lanes)]
        leaves = np.zeros(buffer._store.rows) if header.max_priority is not None else None
        if mmap and all((info.lo, info.hi) == (0, header.num_steps) for info in header.lanes):
            _map(buffer._storage, file.path, file.data_start, header.fields, leaves)
        else:
            _read_into(buffer, file, header.fields, segments, leaves)
        for lane, info in zip(buffer._lanes, header.lanes):
            lane.written = lane.dirty = info.written
            lane.live_start = info.live_start
            # rows below written hold the file's values (or are not live): the rest opens as recorded
            buffer._open(lane, info.written, block=0, fill=False)
            if info.ended:
                ended = np.array(info.ended, dtype=np.int64)
                lane.ended.extend(ended[:, 0], ended[:, 1], ended[:, 2].astype(bool))
            lane.running = None if info.running is None else Episode(*info.running)
            lane.agent_start = (list(info.agent_start) if info.agent_start is not None else
                                [info.running[0] if info.running else 0] * buffer.spec.n_agents)
        problem = data_problem(buffer, segments)
        if leaves is not None and not problem:
            live = live_rows(buffer._lanes)
            if not (np.isfinite(leaves[live]).all() and (leaves[live] >= 0).all()):
                problem = f"{PRIORITY} holds a value that is negative or not finite"
            else:
                buffer._priorities = PriorityTree.restore(leaves, buffer._lanes, buffer.alpha,
                                                          header.max_priority)  # type: ignore[arg-type]
        if problem:
            file.fail(f"corrupt: {problem}")
    finally:
        file.handle.close()
    if not mmap and any(name in buffer._storage.arrays for name in NEXT):
        buffer.compact()  # an older file's next values, written out row by row: keep them once
    return buffer


def data_problem(buffer: FlexibleBuffer, segments: list[tuple[int, int]]) -> str | None:
    """What is wrong with values a file gave ``buffer`` (its rows ``segments``) that sampling
    uses as indices or flags, or None: next-value indices (every row names a slot of the tail
    store or is chained; no two live rows share a slot; no lane's newest row is chained, its
    successor not being recorded), category indices within their categories, bools 0 or 1."""
    storage = buffer._storage
    categories = np.asarray(buffer.spec.obs_categories)

    def stored(array: np.ndarray, per_agent: bool) -> list[np.ndarray]:
        return [array[:, lo:hi] if per_agent else array[lo:hi] for lo, hi in segments]

    for name, array in storage.arrays.items():
        parts = stored(array, storage.fields[name].per_agent)
        if array.dtype == bool and any(part.view(np.uint8).max(initial=0) > 1 for part in parts):
            return f"{name} holds a bool that is neither 0 nor 1"
        if name == "obs" and categories.size and any((part > categories).any() for part in parts):
            return "obs names a category past its space's size"
    if categories.size and "obs_" in storage.chains and (storage.chains["obs_"].tail > categories).any():
        return "obs_ names a category past its space's size"
    if not any(lane.size for lane in buffer._lanes):
        return None
    live = live_rows(buffer._lanes)
    newest = np.array([lane.offset + (lane.written - 1) % lane.capacity for lane in buffer._lanes if lane.size])
    for name, chain in storage.chains.items():
        if any(((part < CHAINED) | (part >= len(chain.tail))).any() for part in stored(chain.index, chain.per_agent)):
            return f"{name} names a slot outside its {len(chain.tail)} stored ones"
        slots = chain.index.take(live, axis=-1)
        slots = slots[slots > 0]
        if np.unique(slots).size != slots.size:
            return f"{name} gives two rows one stored slot"
        if (chain.index.take(newest, axis=-1) == CHAINED).any():
            return f"{name} chains a lane's newest row to a row not recorded"
    return None


def _map(storage: Storage, path: str, start: int, fields: list[dict[str, Any]], leaves: np.ndarray | None) -> None:
    """``storage`` uses the arrays of a buffer file in place (copy-on-write memory maps), and
    ``leaves`` gets the priorities. The file holds every row of every lane, in ring order."""
    def mapped(meta: dict[str, Any]) -> np.ndarray:
        return np.asarray(np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="c",
                                    offset=start + meta["offset"], shape=tuple(meta["shape"])))

    arrays = {meta["name"]: mapped(meta) for meta in fields if "part" not in meta}
    if leaves is not None:
        leaves[:] = arrays.pop(PRIORITY)
    for name in MASKS:
        if name in arrays and arrays[name].dtype == bool:  # formats 1-2
            arrays[name] = pack_mask(arrays[name])
    storage.replace(arrays)
    parts = {(meta["name"], meta["part"]): mapped(meta) for meta in fields if "part" in meta}
    storage.chains = {name: Chain(storage.arrays[NEXT[name]], storage.fields[name].per_agent,
                                  index=index, tail=parts[name, "tail"])
                      for (name, part), index in parts.items() if part == "index"}


def _read_into(buffer: FlexibleBuffer, file: _File, fields: list[dict[str, Any]],
               segments: list[tuple[int, int]], leaves: np.ndarray | None) -> None:
    """Read each field's rows from ``file`` straight into the buffer's ring rows ``segments``
    (one range per lane; the priorities into ``leaves``), checking the CRC."""
    handle, checksum = file.handle, _Checksum(file.crc_seed)
    handle.seek(file.data_start)
    try:
        for meta in fields:
            checksum.add(handle.read(file.data_start + meta["offset"] - handle.tell()))  # padding
            part = meta.get("part")
            if part is None and meta["name"] in NEXT:  # formats 1-2: next values written out row by row
                buffer._storage.chains.pop(meta["name"], None)
            if meta["name"] in MASKS and meta["dtype"] == "|b1":  # formats 1-2: a bool per action
                target = np.ones(meta["shape"], dtype=bool)  # the stored rows, packed into the ring below
                blocks = iter([target])
            elif meta["name"] == PRIORITY:
                target = leaves  # type: ignore[assignment]
                blocks = _blocks(target, False, segments)
            elif part is None:
                target = buffer._storage.ensure(meta["name"])
                blocks = _blocks(target, buffer._storage.fields[meta["name"]].per_agent, segments)
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
                packed, at = buffer._storage.ensure(meta["name"]), 0
                for lo, hi in segments:
                    packed[:, lo:hi] = pack_mask(target[:, at:at + hi - lo])
                    at += hi - lo
        checksum.add(handle.read(file.data_end - handle.tell()))
    finally:
        crc = checksum.result()
    if crc != file.data_crc:
        file.fail(f"corrupt: data checksum mismatch (bytes {file.data_start}-{file.data_end})")
