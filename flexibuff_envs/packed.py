"""Rows kept as zstd frames, one a row (or one a row's agent), read as arrays: `pack` makes the
frames of rows and says where each ends; `Packed` decodes the rows a read asks for, and only those.

A frame per row (not per block of rows) lets a batch decode exactly its rows: a stacked Atari
observation (28,224 bytes) takes about 260 bytes and 13 us to decode, a pistonball agent's
(164,520 bytes) about 160. Frames are checked before they are decoded: each must say it holds
exactly one row's bytes (`compression.MAX_RATIO` bounds what a row may claim of the file), and a
frame that does not decode to them (each carries its checksum) is a `BufferFileError` naming the
file and the row.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import zstandard

from flexibuff_envs.compression import LEVEL, MAX_RATIO, available_memory
from flexibuff_envs.errors import BufferFileError, InvalidArgumentError, OutOfRangeError

#: an end offset's dtype
END = np.dtype("<u8")
#: frames packed or decoded on two threads from this many on (zstd releases the GIL)
PARALLEL = 64
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


def _pool() -> ThreadPoolExecutor:
    """This process's thread that decodes beside the caller's (a forked child makes its own)."""
    pool = getattr(_pool, "made", None)
    if pool is None or pool[0] != os.getpid():
        pool = _pool.made = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="flexibuff-zstd"))  # type: ignore[attr-defined]
    return pool[1]  # type: ignore[no-any-return]


def pack(rows: Any, count: int, per: int, start: int) -> tuple[bytes, np.ndarray]:
    """The frames of ``count`` rows (``rows``: their bytes, C-contiguous, each row's ``per``
    frames after one another), joined, and where each ends in a file whose frames before them
    end at ``start``: ``[count, per]`` offsets."""
    flat = np.frombuffer(rows, np.uint8).reshape(count * per, -1) if count * per else np.zeros((0, 0), np.uint8)
    if len(flat) >= PARALLEL:
        segments = np.empty((len(flat), 2), END)
        segments[:, 0] = np.arange(len(flat), dtype=END) * flat.shape[1]
        segments[:, 1] = flat.shape[1]
        out = _compressor().multi_compress_to_buffer(
            zstandard.BufferWithSegments(flat.data, segments.tobytes()), threads=2
        )
        frames = [out[k].tobytes() for k in range(len(out))]
    else:
        compress = _compressor().compress
        frames = [compress(row.data) for row in flat]
    ends = np.cumsum(np.fromiter(map(len, frames), END, len(frames)), dtype=END) + np.uint64(start)
    return b"".join(frames), ends.reshape(count, per)


class Packed:
    """Rows of ``dtype`` and ``shape`` (per frame) kept as zstd frames in ``frames`` (a mapped
    file, from byte ``first``), frame ``k`` ending at ``ends[k]`` (``[rows, per]``), read like
    the array a buffer holds: ``[per, rows, ...]`` for a per-agent field, else ``[rows, ...]``.
    ``take`` and indexing decode the rows they read; anything else (``np.asarray``) decodes all
    of them. ``where``: the file, for errors. Read-only."""

    def __init__(
        self,
        frames: Any,
        ends: np.ndarray,
        first: int,
        dtype: np.dtype,
        shape: tuple[int, ...],
        per_agent: bool,
        where: str,
    ) -> None:
        self._frames, self._ends, self._first, self._where = frames, ends.reshape(-1), first, where
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
        out = np.empty((flat.size, self._size), np.uint8)
        if flat.size:
            index = flat.reshape(-1)
            stops = self._ends[index]
            starts = np.where(index > 0, self._ends[np.maximum(index - 1, 0)], np.uint64(self._first))
            work = list(zip(index.tolist(), starts.tolist(), stops.tolist()))
            if len(work) >= PARALLEL:  # half on the other core (zstd lets go of the GIL as it decodes)
                half = len(work) // 2
                later = _pool().submit(self._decode, work[half:], out[half:])
                self._decode(work[:half], out[:half])
                later.result()
            else:
                self._decode(work, out)
        return out.view(self.dtype).reshape(*flat.shape, *self._frame_shape)

    def _decode(self, work: Sequence[tuple[int, int, int]], out: np.ndarray) -> None:
        decompress, size = _decompressor().decompress, self._size
        for at, (k, lo, hi) in enumerate(work):
            frame = self._frames[lo:hi]
            try:
                if not lo < hi <= len(self._frames) or zstandard.frame_content_size(frame) != size:
                    raise zstandard.ZstdError(f"it does not hold the row's {size:,} bytes")
                raw = decompress(frame)  # its size checked: no more is allocated
                if len(raw) != size:
                    raise zstandard.ZstdError(f"it decodes to {len(raw):,} bytes, not {size:,}")
            except zstandard.ZstdError as exc:
                row, agent = divmod(k, self._per)
                who = f", agent {agent}" if self._per > 1 else ""
                raise BufferFileError(f"{self._where}: row {row}{who} is corrupt ({exc})") from None
            out[at] = np.frombuffer(raw, np.uint8)

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
        lead, rest = (key[:2], key[2:]) if self.per_agent else ((0, key[0]), key[1:])
        lead = (*lead, slice(None)) if len(lead) == 1 else lead
        if any(k is Ellipsis or k is None for k in key):
            return np.asarray(self)[key]
        out = self._decoded(self._frame(*lead))
        return out[(Ellipsis,) + tuple(rest)] if rest else out

    def __setitem__(self, key: Any, value: Any) -> None:
        raise InvalidArgumentError(
            f"{self._where}: the rows of a compressed column mapped from a log are read-only; "
            "open the log with mmap=False to change them"
        )

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.nbytes > available_memory():
            raise InvalidArgumentError(
                f"{self._where}: decoding all of it takes {self.nbytes:,} bytes, more than this machine has free"
            )
        out = self[:, :] if self.per_agent else self[:]
        return out if dtype is None else out.astype(dtype, copy=False)

    def copy(self) -> np.ndarray:
        return np.asarray(self)


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
        self._packed[self._agent] = value  # refused, as any write

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._packed[self._agent, :]
        return out if dtype is None else out.astype(dtype, copy=False)

    def copy(self) -> np.ndarray:
        return np.asarray(self)


def ratio_ok(rows: int, per: int, size: int, stored: int) -> bool:
    """Whether ``stored`` bytes of frames may hold ``rows`` rows of ``per`` frames of ``size``
    bytes (a file claiming more is a decompression bomb)."""
    return rows * per * size <= MAX_RATIO * max(stored, 1) and stored >= 0
