"""Rows kept as zstd frames, one a row (or one a row's agent), read as arrays: `pack` makes the
frames of rows and says where each ends; `Packed` decodes the rows a read asks for, and only those.

A frame per row (not per block of rows) lets a batch decode exactly its rows (a stacked Atari
observation or a pistonball camera compresses a hundredfold and more alone:
`benchmarks/bench_log_compress.py`). Frames are checked before they are decoded: each must say
it holds exactly one row's bytes (`compression.MAX_RATIO` bounds what a row may claim of the file), and a
frame that does not decode to them (each carries its checksum) is a `BufferFileError` naming the
file and the row.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from flexibuff_envs.errors import BufferFileError, InvalidArgumentError, OutOfRangeError
from flexibuff_envs.storage.compression import LEVEL, MAX_RATIO, available_memory

#: an end offset's dtype
END = np.dtype("<u8")
#: frames packed on two threads from this many on (zstd's own, in one call)
PARALLEL = 64
#: an end's top bit: its frame holds only the row's newest stacked frame (`Stack`); the rest, its offset
SHIFTED, OFFSET = np.uint64(1 << 63), np.uint64((1 << 63) - 1)


@dataclass(frozen=True)
class Stack:
    """Rows that are stacks of ``k`` frames, along axis 0 (Gymnasium's `FrameStackObservation`:
    ``[k, ...]``) or the last (SB3's `VecFrameStack`, SuperSuit's `frame_stack`: ``[..., k]``),
    of ``size`` bytes a row and elements of ``itemsize``. A row whose first ``k - 1`` frames are
    the row before's last (the env moved the stack on by one frame) is kept as its newest
    frame alone (`SHIFTED`), a fourth of the bytes to store and decode; any other row, whole.
    Found in the data, so a row is rebuilt exactly as the env gave it whatever the wrapper did
    (padding at an episode's start, a reset, a final observation)."""

    k: int
    axis: int
    size: int
    itemsize: int

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: np.dtype) -> Stack | None:
        """The stack an observation of ``shape`` may be (three or more axes, the first or the
        last of 2 to 16 frames, not a colour axis of 3), or None."""
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(shape) >= 3 and 2 <= shape[0] <= 16:
            return cls(shape[0], 0, size, dtype.itemsize)
        if len(shape) >= 3 and 2 <= shape[-1] <= 16 and shape[-1] != 3:
            return cls(shape[-1], -1, size, dtype.itemsize)
        return None

    @property
    def frame(self) -> int:
        """Bytes of one frame."""
        return self.size // self.k

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (``[n, size]`` bytes) as ``[n, a, k, b]``: frame ``j`` is ``[:, :, j]``."""
        if self.axis == 0:
            return rows.reshape(len(rows), 1, self.k, self.frame)
        return rows.reshape(len(rows), self.size // (self.k * self.itemsize), self.k, self.itemsize)


_LOCAL = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    compressor = getattr(_LOCAL, "compressor", None)
    if compressor is None:
        compressor = _LOCAL.compressor = zstandard.ZstdCompressor(
            level=LEVEL, write_content_size=True, write_checksum=True
        )
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_LOCAL, "decompressor", None)
    if decompressor is None:
        decompressor = _LOCAL.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def compressed(rows: Sequence[Any]) -> list[bytes]:
    """A zstd frame of each of ``rows`` (C-contiguous arrays of bytes), each its own ``bytes`` of
    exactly its size (a frame ``compress`` returns keeps the room zstd reserved: about a raw row)."""
    if len(rows) >= PARALLEL:
        out = _compressor().multi_compress_to_buffer([row.data for row in rows], threads=2)
        return [out[k].tobytes() for k in range(len(out))]
    compress = _compressor().compress
    return [memoryview(compress(row.data)).tobytes() for row in rows]


def pack(
    rows: Any, count: int, per: int, start: int, stack: Stack | None = None, last: np.ndarray | None = None
) -> tuple[bytes, np.ndarray]:
    """The frames of ``count`` rows (``rows``: their bytes, C-contiguous, each row's ``per``
    frames after one another), joined, and where each ends in a file whose frames before them
    end at ``start``: ``[count, per]`` offsets, `SHIFTED` set on a row of a ``stack`` kept as its
    newest frame (``last``: the ``per`` frames of the row before them, if any)."""
    flat = np.frombuffer(rows, np.uint8).reshape(count * per, -1) if count * per else np.zeros((0, 0), np.uint8)
    payload: list[Any] = list(flat)
    shifted = np.zeros(len(flat), dtype=bool)
    if stack is not None and len(flat):
        now = stack.slots(flat).reshape(count, per, -1, stack.k, stack.slots(flat[:1]).shape[-1])
        before = now[:-1] if last is None else np.concatenate([stack.slots(last).reshape(1, *now.shape[1:]), now[:-1]])
        same = (now[len(now) - len(before) :, :, :, :-1] == before[:, :, :, 1:]).all(axis=(2, 3, 4))
        shifted[(count - len(before)) * per :] = same.reshape(-1)
        newest = np.ascontiguousarray(now[:, :, :, -1]).reshape(count * per, -1)
        for k in np.flatnonzero(shifted):
            payload[k] = newest[k]
    frames = compressed(payload)
    ends = np.cumsum(np.fromiter(map(len, frames), END, len(frames)), dtype=END) + np.uint64(start)
    ends[shifted] |= SHIFTED
    return b"".join(frames), ends.reshape(count, per)


class Packed:
    """Rows of ``dtype`` and ``shape`` (per frame) kept as zstd frames in ``frames`` (a mapped
    file), frame ``k`` ending at ``ends[k]`` (``[rows, per]``), read like
    the array a buffer holds: ``[per, rows, ...]`` for a per-agent field, else ``[rows, ...]``.
    ``take`` and indexing decode the rows they read; anything else (``np.asarray``) decodes all
    of them. ``where``: the file, for errors. Read-only."""

    def __init__(
        self,
        frames: Any,
        ends: np.ndarray,
        dtype: np.dtype,
        shape: tuple[int, ...],
        per_agent: bool,
        where: str,
        stack: Stack | None = None,
    ) -> None:
        self._frames, self._where, self._stack = frames, where, stack
        flags = ends.reshape(-1)
        self._shifted = (flags & SHIFTED) != 0 if stack is not None else None
        self._ends = flags & OFFSET if stack is not None else flags
        self._memo: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros((0, 0), np.uint8))
        self._rows, self._per = ends.shape
        self._frame_shape, self.dtype, self.per_agent = shape, dtype, per_agent
        self._size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.shape = (self._per, self._rows, *shape) if per_agent else (self._rows, *shape)
        self.ndim, self.itemsize = len(self.shape), dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes the rows take decoded."""
        return self._size * self._rows * self._per

    def __len__(self) -> int:
        return self.shape[0]

    def _decoded(self, flat: np.ndarray) -> np.ndarray:
        """Frames ``flat`` (any integer shape), decoded: ``[*flat.shape, *shape]``."""
        index = flat.reshape(-1)
        stack, shifted = self._stack, self._shifted
        out = self._stacked(index, stack, shifted) if stack and shifted is not None else self._whole(index, self._size)
        return out.view(self.dtype).reshape(*flat.shape, *self._frame_shape)

    def _whole(self, index: np.ndarray, size: int) -> np.ndarray:
        """Frames ``index`` (1-D) as stored, each of ``size`` bytes: ``[n, size]``. Decoded on the
        caller's thread: a frame takes zstd a few microseconds, too little to hand to another
        thread (taking turns at the GIL costs more than the second core gives back)."""
        decompress = _decompressor().decompress
        out = np.empty((index.size, size), np.uint8)  # numpy's: large ones in huge pages, quick to fill
        for at, (k, frame) in enumerate(zip(index.tolist(), self._stored(index))):
            if frame is None:  # a row never written: zeros
                out[at] = 0
                continue
            try:
                if zstandard.frame_content_size(frame) != size:
                    raise zstandard.ZstdError(f"it does not hold the row's {size:,} bytes")
                out[at] = np.frombuffer(decompress(frame), np.uint8)  # its size checked: no more is decoded
            except zstandard.ZstdError as exc:
                raise self._corrupt(k, str(exc)) from None
        return out

    def _stored(self, index: np.ndarray) -> list[Any]:
        """The stored frames ``index`` (1-D), as bytes-like (one cut short by its file, or empty,
        fails as it is decoded)."""
        stops = self._ends[index]
        starts = np.where(index > 0, self._ends[np.maximum(index - 1, 0)], np.uint64(0))
        frames = self._frames
        return [frames[lo:hi] for lo, hi in zip(starts.tolist(), stops.tolist())]

    def _corrupt(self, k: int, why: str) -> BufferFileError:
        """The error for frame ``k``, corrupt for reason ``why``."""
        row, agent = divmod(k, self._per)
        who = f", agent {agent}" if self._per > 1 else ""
        return BufferFileError(f"{self._where}: row {row}{who} is corrupt ({why})")

    def _stacked(self, index: np.ndarray, stack: Stack, shifted: np.ndarray) -> np.ndarray:
        """Frames ``index`` (1-D) of ``stack``, rebuilt: each from the newest row kept whole in
        its last ``k`` and the newest frames of the rows after it (``shifted``: those rows)."""
        per, k = self._per, stack.k
        window = index[:, None] - per * np.arange(k - 1, -1, -1)  # the rows of each stack's frames, oldest first
        valid = window >= 0
        whole = valid & ~shifted[np.maximum(window, 0)]
        newest = np.where(whole.any(axis=1), k - 1 - np.argmax(whole[:, ::-1], axis=1), -1)  # its column
        own = np.arange(k) > newest[:, None]  # frames the rows after it keep
        if (own & ~valid).any():
            k = int(index[(own & ~valid).any(axis=1)][0])
            raise self._corrupt(k, "it names a row before the log's first as its stack's")
        keys = np.flatnonzero(newest >= 0)
        wholes, at_whole = np.unique(window[keys, newest[keys]], return_inverse=True)
        parts, at_part = np.unique(window[own], return_inverse=True)
        full = stack.slots(self._whole(wholes, stack.size))
        frames = self._newest(parts, stack.frame).reshape(len(parts), *full.shape[1:2], full.shape[3])
        out = np.empty((index.size, stack.size), np.uint8)
        slots = stack.slots(out)
        for j in range(k):
            take = keys[newest[keys] >= j]  # frame j of these comes from the row kept whole
            slots[take, :, j] = full[at_whole[np.searchsorted(keys, take)], :, j + k - 1 - newest[take]]
        column = np.broadcast_to(np.arange(k), own.shape)[own]
        slots[np.nonzero(own)[0], :, column] = frames[at_part]
        return out

    def _newest(self, parts: np.ndarray, size: int) -> np.ndarray:
        """The newest frames (``size`` bytes) of the rows ``parts`` (sorted, unique), those the
        read before decoded copied (a transition's obs_ shares all but one of its obs's frames)."""
        kept, decoded = self._memo
        out = np.empty((len(parts), size), np.uint8)
        hit = np.zeros(len(parts), dtype=bool)
        if len(kept):
            at = np.minimum(np.searchsorted(kept, parts), len(kept) - 1)
            hit = kept[at] == parts
            out[hit] = decoded[at[hit]]
        out[~hit] = self._whole(parts[~hit], size)
        self._memo = (parts, out)
        return out

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` as a file holds them: a per-agent field's agents together,
        ``[n, per, ...]``."""
        frames = np.arange(lo * self._per, hi * self._per).reshape(hi - lo, self._per)
        return self._decoded(frames if self.per_agent else frames[:, 0])

    def _frame(self, agents: Any, rows: Any) -> np.ndarray:
        """The frame numbers of ``agents`` and ``rows`` (indices as numpy takes them; a slice:
        every one it names, outer to the other)."""
        outer = isinstance(agents, slice) or isinstance(rows, slice)
        agents = np.arange(self._per)[agents] if isinstance(agents, slice) else np.asarray(agents)
        rows = np.arange(self._rows)[rows] if isinstance(rows, slice) else np.asarray(rows)
        agents, rows = (a if a.size else a.astype(np.intp) for a in (agents, rows))  # [] names no row
        if outer:
            agents = agents.reshape(*agents.shape, *(1,) * rows.ndim)
        if not (np.issubdtype(agents.dtype, np.integer) and np.issubdtype(rows.dtype, np.integer)):
            raise InvalidArgumentError(f"{self._where}: rows are read by integer indices or slices")
        if rows.size and not (-self._rows <= rows.min() and rows.max() < self._rows):
            raise OutOfRangeError(f"{self._where}: a row index out of range for its {self._rows:,} rows")
        if agents.size and not (-self._per <= agents.min() and agents.max() < self._per):
            raise OutOfRangeError(f"{self._where}: an agent index out of range for its {self._per} agents")
        return (rows % max(self._rows, 1)) * self._per + agents % self._per

    def take(self, indices: Any, axis: int = 0, mode: str = "raise") -> np.ndarray:
        """As `numpy.take` along ``axis`` (the rows, or a per-agent field's agents)."""
        indices = np.asarray(indices)
        rows_axis = 1 if self.per_agent else 0
        if axis == rows_axis and mode == "wrap":
            indices = indices % max(self._rows, 1)
        elif axis == rows_axis - 1 and mode == "wrap":
            indices = indices % self._per
        if not self.per_agent:
            return self._decoded(self._frame(0, indices))
        if axis == 1:
            return self._decoded(self._frame(np.arange(self._per).reshape(-1, *(1,) * indices.ndim), indices))
        return self._decoded(self._frame(indices.reshape(*indices.shape, 1), np.arange(self._rows)))

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        if self.per_agent and len(key) == 1 and isinstance(key[0], (int, np.integer)):
            agent = int(key[0]) % self._per  # one agent's rows: still read as they are used
            return _Agent(self, agent)
        if any(k is None for k in key):
            return np.asarray(self)[key]
        lead, rest = self._lead(key)
        out = self._decoded(self._frame(*lead))
        out = out[(Ellipsis,) + tuple(rest)] if rest else out
        out.flags.writeable = False  # a copy: a write into it would be lost (numpy's would be a view)
        return out

    def _lead(self, key: tuple[Any, ...]) -> tuple[tuple[Any, Any], tuple[Any, ...]]:
        """``key`` as the agents and rows it names (a global field's: agent 0), and what it
        says of a row's values."""
        if any(k is Ellipsis for k in key):
            at = key.index(Ellipsis)
            key = key[:at] + (slice(None),) * (self.ndim - len(key) + 1) + key[at + 1 :]
        lead, rest = (key[:2], key[2:]) if self.per_agent else ((0, key[0]), key[1:])
        return ((*lead, slice(None)) if len(lead) == 1 else lead), rest  # type: ignore[return-value]

    def __setitem__(self, key: Any, value: Any) -> None:
        raise InvalidArgumentError(
            f"{self._where}: the rows of a compressed column mapped from a log are read-only; "
            "open the log with mmap=False to change them"
        )

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        decoded = self._size * self._rows * self._per
        if decoded > available_memory():
            raise InvalidArgumentError(
                f"{self._where}: decoding all of it takes {decoded:,} bytes, more than this machine has free"
            )
        out = self[:, :] if self.per_agent else self[:]
        out.flags.writeable = True  # all of it, its own: what a buffer read into memory records on
        return out if dtype is None else out.astype(dtype, copy=False)


class _Agent:
    """One agent's rows of a per-agent `Packed`: ``[rows, ...]``."""

    def __init__(self, packed: Packed, agent: int) -> None:
        self._packed, self._agent = packed, agent
        self.dtype, self.shape, self.ndim = packed.dtype, packed.shape[1:], packed.ndim - 1

    @property
    def nbytes(self) -> int:
        return self._packed.nbytes // self._packed.shape[0]

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, indices: Any, axis: int = 0, mode: str = "raise") -> np.ndarray:
        if axis != 0:
            return np.asarray(self).take(indices, axis=axis, mode=mode)  # type: ignore[call-overload,no-any-return]
        indices = np.asarray(indices) % max(self.shape[0], 1) if mode == "wrap" else indices
        return self._packed._decoded(self._packed._frame(self._agent, indices))

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        return self._packed[(self._agent,) + key]

    def __setitem__(self, key: Any, value: Any) -> None:
        key = key if isinstance(key, tuple) else (key,)
        self._packed[(self._agent,) + key] = value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._packed[self._agent, :]
        out.flags.writeable = True  # all of its rows, its own
        return out if dtype is None else out.astype(dtype, copy=False)


def ratio_ok(rows: int, per: int, size: int, stored: int) -> bool:
    """Whether ``stored`` bytes of frames may hold ``rows`` rows of ``per`` frames of ``size``
    bytes (a file claiming more is a decompression bomb)."""
    return rows * per * size <= MAX_RATIO * max(stored, 1)
