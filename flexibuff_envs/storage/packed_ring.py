"""A buffer's observations or states kept compressed in memory (``FlexibleBuffer(...,
compress="auto")``): `PackedRing` holds each row (each agent's row) as a zstd frame of its own,
compressed as it is written and decoded as it is read, and is written and read as the numpy
array it stands for, so recorders, samplers and files use it unchanged.

Rows are kept whole (not a stack's newest frame alone, as a log keeps them): a ring overwrites
its oldest rows, and a row rebuilt from the rows before it would lose them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.storage.packed import END, PARALLEL, Packed, _compressor


class PackedRing(Packed):
    """``shape`` (``[n_agents, rows, ...]`` for a per-agent field, else ``[rows, ...]``) of
    ``dtype``, each row a zstd frame in memory (a row never written: zeros). Writes take whole
    rows (any integer indices or slices of the agents and rows); reads decode the rows they read."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, per_agent: bool, name: str) -> None:
        lead = 2 if per_agent else 1
        per, rows = (shape[0], shape[1]) if per_agent else (1, shape[0])
        super().__init__(b"", np.zeros((rows, per), END), np.dtype(dtype), shape[lead:], per_agent, name)
        self._kept: list[bytes | None] = [None] * (rows * per)  # frame ``row * per + agent``
        self._held = 0  # bytes of the frames kept

    @property
    def nbytes(self) -> int:
        """Bytes the frames take in memory (and a reference a row)."""
        return self._held + 8 * len(self._kept)

    def _stored(self, index: np.ndarray) -> list[Any]:
        kept = self._kept
        return [kept[k] for k in index.tolist()]

    def __setitem__(self, key: Any, value: Any) -> None:
        lead, rest = self._lead(key if isinstance(key, tuple) else (key,))
        if any(not (isinstance(k, slice) and k == slice(None)) for k in rest):
            raise InvalidArgumentError(f"{self._where}: a compressed field is written a whole row at a time")
        grid = self._frame(*lead)
        frames = grid.reshape(-1)
        given = np.asarray(value, dtype=self.dtype)
        kept, held = self._kept, self._held
        if given.ndim == 0 and not given.any():  # cleared: rows of zeros keep no frame
            for k in frames.tolist():
                held -= len(kept[k] or b"")
                kept[k] = None
            self._held = held
            return
        rows = np.ascontiguousarray(np.broadcast_to(given, (*grid.shape, *self._frame_shape)))
        flat = rows.reshape(frames.size, -1).view(np.uint8)
        if frames.size >= PARALLEL:
            out = _compressor().multi_compress_to_buffer([row.data for row in flat], threads=2)
            packed = [out[k].tobytes() for k in range(len(out))]
        else:
            compress = _compressor().compress
            packed = [compress(row.data) for row in flat]
        for k, frame in zip(frames.tolist(), packed):  # in order: where a row is named twice, the last wins
            held += len(frame) - len(kept[k] or b"")
            kept[k] = frame
        self._held = held
