"""An episode log's compressed columns (`Column.codec`): each row (each agent's, of a per-agent
field) is a zstd frame of its own in ``NAME.zst``, and ``NAME.ends.col`` holds where each frame
ends (u64), a row of ends for each row of the column; a commit counts rows of ends, and the
frames up to the last end it counts (`flexibuff_envs.storage.packed`). Appended here (`Frames`,
`packed`), checked and read (`check_frames`, `packed_of`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np

from flexibuff_envs.log.append_window import Tail
from flexibuff_envs.log.format import PIECE, Column, Commit, fail
from flexibuff_envs.storage.packed import END, OFFSET, Packed, pack, ratio_ok


class Frames:
    """The end of a ``codec`` column's frames file (`packed`), for the writer: where the
    committed frames end, and where those of the append under way do."""

    def __init__(self, column: Column, tail: Tail, end: int) -> None:
        self.column, self.tail, self.end, self.pending = column, tail, end, end
        # a stack's row before the next (its frames), as appended and as committed: None, not known
        self.last: np.ndarray | None = None
        self._last: np.ndarray | None = None

    def pack(self, piece: Any) -> tuple[bytes, np.ndarray]:
        """The frames of ``piece`` (rows of the column, its bytes) and their ends."""
        count, per = memoryview(piece).nbytes // self.column.row_bytes, self.column.per_row
        frames, ends = pack(piece, count, per, self.pending, self.column.stack, self.last)
        if self.column.stack is not None and count:
            self.last = np.frombuffer(piece, np.uint8).reshape(count * per, -1)[-per:].copy()
        self.pending += len(frames)
        return frames, ends

    def fill(self, value: Any, count: int) -> tuple[bytes, np.ndarray]:
        """The frames of ``count`` rows holding ``value`` (one frame, repeated) and their ends."""
        row = np.full(self.column.shape, value, self.column.dtype)
        one, _ = pack(row, 1, 1, 0) if self.column.per_row == 1 else pack(row[0], 1, 1, 0)
        frames = count * self.column.per_row
        ends = self.pending + len(one) * np.arange(1, frames + 1, dtype=END)
        self.pending += len(one) * frames
        return one * frames, ends.reshape(count, self.column.per_row)

    def settle(self, committed: bool) -> None:
        """The append is committed, or undone (its frames cut)."""
        if committed:
            self.end, self._last = self.pending, self.last
        else:
            self.tail.cut(self.end)
            self.pending, self.last = self.end, self._last


def packed(pieces: Iterable[tuple[Tail, Any]], packers: Mapping[Tail, Frames]) -> Iterator[tuple[Tail, Any]]:
    """``pieces`` as their files hold them: a compressed column's (those of a tail in
    ``packers``, one after another) as its frames, then where they end."""
    ends: list[np.ndarray] = []
    last: Tail | None = None
    for tail, piece in pieces:
        if ends and tail is not last:
            yield last, np.concatenate(ends)  # type: ignore[misc]  # the tail the ends are of
            ends = []
        frames = packers.get(tail)
        if frames is None:
            yield tail, piece
            continue
        data, at = frames.pack(piece)
        yield frames.tail, data
        ends.append(at)
        last = tail
    if ends:
        yield last, np.concatenate(ends)  # type: ignore[misc]


def made_column(directory: str, column: Column, fill: Any, rows: int) -> Frames | None:
    """The files of a new ``column`` of the log ``directory`` that holds ``rows`` rows: each row
    holds ``fill`` (a next value's tail: slot 0, zeros), on the disk when this returns; a
    compressed column's frames (None for a raw one)."""
    frames = None
    with open(os.path.join(directory, column.file), "wb") as out:
        if column.codec is not None:
            frames = Frames(column, Tail(os.path.join(directory, column.frames_file)), 0)
            frames.tail.cut(0)  # what a kill left before the header named it
            data, ends = frames.fill(fill, rows if column.part is None else 1)  # a tail's: slot 0
            frames.tail.put(data)
            frames.tail.sync()
            frames.settle(committed=True)
            out.write(ends.tobytes())
        elif column.part == "tail":
            out.write(bytes(column.row_bytes))  # slot 0
        elif fill:
            row = np.full(column.shape, fill, dtype=column.dtype).tobytes()
            per_piece = max(1, PIECE // len(row))
            out.writelines(row * min(per_piece, rows - lo) for lo in range(0, rows, per_piece))
        else:  # zeros: the file system stores none of them
            out.truncate(rows * column.row_bytes)
        out.flush()
        os.fsync(out.fileno())
    return frames


def frames_end(handle: BinaryIO, column: Column, commit: Commit) -> int:
    """Where the frames of the ``codec`` column whose ends are the file open as ``handle`` end,
    as of ``commit``: the last end it counts (0 for none)."""
    at = commit.length(column) - 8
    if at < 0:
        return 0
    raw = os.pread(handle.fileno(), 8, at)
    if len(raw) < 8:
        raise fail(handle.name, f"holds fewer bytes than the {at + 8:,} its commits count")
    return int.from_bytes(raw, "little") & int(OFFSET)


def check_frames(path: str, column: Column, rows: int) -> None:
    """`BufferFileError` unless the frames of ``rows`` rows of the ``codec`` column ``column``
    (its ends: the file ``path``, holding them) follow one another from byte 0 of their file,
    none empty; read a piece at a time."""
    count, at = rows * column.per_row, 0
    with opened(path) as handle:
        for lo, hi in spans(count, PIECE // 8):
            ends = np.fromfile(handle, dtype=END, count=hi - lo) & OFFSET
            if len(ends) != hi - lo or (np.diff(ends, prepend=np.uint64(at)).astype(np.int64) < 1).any():
                raise fail(path, f"corrupt: the frames of rows {lo // column.per_row:,} on overlap")
            at = ends[-1]


def packed_of(directory: str, column: Column, count: int, *, mapped: bool) -> Packed:
    """The first ``count`` rows of the ``codec`` column ``column`` of the log ``directory``
    (`check_frames` checked), decoded as read: its frames mapped, or read (``mapped=False``)."""
    path = os.path.join(directory, column.frames_file)
    ends = mapped_array(os.path.join(directory, column.file), END, (count, column.per_row))
    end = int(ends[-1, -1] & OFFSET) if count else 0
    if not ratio_ok(count, column.per_row, column.row_bytes // column.per_row, end + ends.nbytes):
        raise fail(path, f"{end:,} bytes of frames cannot hold {count:,} rows of {column.row_bytes:,} bytes")
    if not end:
        frames: object = b""
    elif mapped:
        with open(path, "rb") as handle:
            frames = mmap.mmap(handle.fileno(), end, access=mmap.ACCESS_READ)
        if hasattr(mmap, "MADV_RANDOM"):
            frames.madvise(mmap.MADV_RANDOM)  # type: ignore[attr-defined]  # an mmap
    else:
        with open(path, "rb") as handle:
            frames = handle.read(end)
    shape = column.shape[1:] if column.per_agent else column.shape
    return Packed(frames, ends, column.dtype, shape, column.per_agent, path, column.stack)


def mapped_array(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The first rows of the file ``path`` as an array, mapped copy-on-write, read as sampled:
    without read-ahead (a batch's rows lie anywhere; reading ahead of each would read the log)."""
    with open(path, "rb") as handle:
        memory = mmap.mmap(handle.fileno(), int(np.prod(shape)) * dtype.itemsize, access=mmap.ACCESS_COPY)
    if hasattr(mmap, "MADV_RANDOM"):
        memory.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


def opened(path: str) -> BinaryIO:
    """The file ``path`` open to read, or `BufferFileError` naming it."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise fail(path, f"cannot be read ({exc.strerror or exc})") from None


def spans(count: int, per_piece: int) -> Iterator[tuple[int, int]]:
    """``[0, count)`` in ranges of at most ``per_piece``."""
    per_piece = max(1, per_piece)
    return ((lo, min(lo + per_piece, count)) for lo in range(0, count, per_piece))
