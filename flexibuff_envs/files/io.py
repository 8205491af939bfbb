"""Buffer files: one self-describing file, no pickle, written atomically, readable as a memory map.

Layout (little endian)::

    b"FLEXIBUF" | u32 version | u64 header length | JSON header | pad to 64
    | arrays, each 64-byte aligned | u32 crc32 of the header part | u32 crc32 of the arrays | b"FBUF-END"

The header names each array's dtype, shape and offset. An array holds the rows of each lane that
hold recorded steps, in ring order (one range per lane: the whole lane when its live rows wrap
around), lane after lane, per agent for per-agent fields; so a file holds what was recorded, not
the empty part of the ring, and every row keeps its number. Episode positions are written as
they are in memory (format 4; formats 1-3 renumbered them from each lane's oldest row). A
next-value field (``obs_``) is stored once, as in memory (`flexibuff_envs.storage.next_values`): a per-row
``index`` part and the ``tail`` slots it names, renumbered to the slots in use; masks are bits.
Format 5 is format 4 with compressed parts: such a part's header entry names its ``codec`` and
the bytes ``stored`` (`flexibuff_envs.storage.compression`: zstd frames, then their sizes); a file with
none is written as format 4. Formats 1 (one checksum over everything), 2 (next values written
out row by row, a bool per action) and 3 are still read (`flexibuff_envs.files.format` reads).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
import zlib
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np

from flexibuff_envs.errors import BufferSaveError
from flexibuff_envs.files.format import END, MAGIC, PREFIX, SUFFIX, BufferFile, Checksum, fill, padding
from flexibuff_envs.files.header import PRIORITY, stored_range
from flexibuff_envs.index.lanes import Lane
from flexibuff_envs.index.origins import FIELDS
from flexibuff_envs.storage import Storage, compression
from flexibuff_envs.storage.compression import Compress
from flexibuff_envs.storage.stored_form import Part

__all__ = ["BufferFile", "fill", "save"]

#: what a prioritized sampler keeps in a file: priority ** alpha per row, the highest priority given
Priorities = tuple[np.ndarray, float] | None


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
            "origins": {name: lane.ended.origins[name].tolist() for name in FIELDS},
        }
        for lane, (lo, hi) in zip(lanes, ranges)
    ]


def save(
    path: str,
    settings: dict[str, Any],
    storage: Storage,
    lanes: Sequence[Lane],
    priorities: Priorities,
    compress: Compress = None,
) -> None:
    """Write a buffer (its ``settings``, the JSON-ready values its header keeps, and its parts)
    to ``path`` atomically: the old file stays intact until the new is whole. ``priorities``:
    what its prioritized sampler keeps (`Prioritized.saved`), if it has one; ``compress``: the
    parts stored compressed (`compression.plan`).

    Rows go from the ring to the file slice by slice, in ring order (so row numbers stay as they
    are): no copy of the buffer is made. A compressed part is compressed first into a temporary
    file beside the target (its size goes in the header), then copied in.

    Raises:
        BufferSaveError: the file could not be written (``path`` is a directory, a directory on
            the way cannot be made, no permission, a full disk); it names ``path``.
    """
    try:
        _save(path, settings, storage, lanes, priorities, compress)
    except BufferSaveError:
        raise
    except OSError as exc:
        what = exc.strerror or str(exc)
        raise BufferSaveError(
            exc.errno, f"cannot save the buffer ({what}; a file already there is intact)", path
        ) from exc


def _save(
    path: str,
    settings: dict[str, Any],
    storage: Storage,
    lanes: Sequence[Lane],
    priorities: Priorities,
    compress: Compress,
) -> None:
    if os.path.isdir(path):
        raise BufferSaveError(errno.EISDIR, "cannot save the buffer: it is a directory; give a file name", path)
    ranges = [stored_range(lane.live_start, lane.written, lane.capacity) for lane in lanes]
    segments = [(lane.offset + lo, lane.offset + hi) for lane, (lo, hi) in zip(lanes, ranges)]
    header = {"format": "flexibuff_envs buffer", **settings, "lanes": _lanes(lanes, ranges), "fields": []}
    parts = storage.export(segments, blocked=True)  # rows kept compressed: never whole
    if priorities is not None:  # prioritized replay's priority ** alpha per row, and the highest priority given
        leaves, header["max_priority"] = priorities
        parts.append(Part.of(PRIORITY, None, leaves, False, segments))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    _remove_stale(directory, os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=_TMP, dir=directory)
    spills: dict[int, BinaryIO] = {}  # part -> its compressed form, written first
    closing = contextlib.ExitStack()
    try:
        offset = 0
        for k, part in enumerate(parts):
            offset += padding(offset)
            meta: dict[str, Any] = {"name": part.name}
            if part.part is not None:
                meta["part"] = part.part
            elif part.name != PRIORITY:
                meta["width"] = part.shape[-1] if len(part.shape) > 1 + part.per_agent else None
            meta.update(dtype=part.dtype.str, shape=list(part.shape), offset=offset)
            row_bytes = part.dtype.itemsize * int(np.prod(part.shape[part.axis + 1 :], dtype=np.int64))
            codec = None if part.name == PRIORITY else compression.plan(compress, part.name, part.dtype, row_bytes)
            if codec is not None and part.nbytes:
                spill = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 - closed with the save, by `closing`
                spills[k] = compressed = closing.enter_context(spill)
                for frame in compression.encode(_bytes(block) for block in part.blocks()):
                    compressed.write(frame)
                if compress != "auto" or compressed.tell() <= compression.WORTH * part.nbytes:
                    meta.update(codec=codec, stored=compressed.tell())
                else:  # "auto", and it does not pay (noise): raw, as it can be mapped
                    del spills[k]
            header["fields"].append(meta)
            offset += meta.get("stored", part.nbytes)
        header["data_bytes"] = offset
        version = 5 if spills else 4
        blob = json.dumps(header).encode()
        prefix = PREFIX.pack(MAGIC, version, len(blob)) + blob
        prefix += b"\0" * padding(len(prefix))
        with os.fdopen(fd, "wb") as out:
            out.write(prefix)
            checksum = Checksum()
            try:
                position = 0
                for k, part in enumerate(parts):
                    pad = b"\0" * padding(position)
                    out.write(pad)
                    checksum.add(pad)
                    position += len(pad)
                    stored = spills.get(k)
                    if stored is not None:
                        stored.seek(0)
                        while data := stored.read(Checksum.PIECE):
                            out.write(data)
                            checksum.add(data)
                            position += len(data)
                        continue
                    for block in part.blocks():
                        for piece in checksum.pieces(_bytes(block) if block.size else memoryview(b"")):
                            out.write(piece)
                        position += block.nbytes
            finally:
                crc = checksum.result()
            out.write(SUFFIX[version].pack(zlib.crc32(prefix), crc, END))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a saved buffer is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        closing.close()
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


def _bytes(block: np.ndarray) -> memoryview:
    """``block``'s bytes in C order (a copy only where it is a view that is not: a mapped log's
    per-agent columns are stored agent-minor)."""
    return np.ascontiguousarray(block).data.cast("B")
