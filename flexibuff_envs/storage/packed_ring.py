"""A buffer's observations or states kept compressed in memory (``FlexibleBuffer(...,
compress="auto")``): `PackedRing` holds each row (each agent's row) as a zstd frame of its own,
compressed as it is written and decoded as it is read. It is written (whole rows) and read as
the numpy array it stands for, so recorders and samplers use it unchanged; what indexing reads is
a read-only copy (a write into it would be lost), and files read and write it a block of rows at
a time (`stored_form.Decoded`, `stored_form.Streamed`).

Rows are kept whole (not a stack's newest frame alone, as a log keeps them): a ring overwrites
its oldest rows, and a row rebuilt from the rows before it would lose them.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.interrupts import HOLD
from flexibuff_envs.storage.packed import END, Packed, compressed


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
        """Bytes the frames take in memory (each a ``bytes`` object), and a reference a row."""
        return self._held + 8 * len(self._kept)

    def _stored(self, index: np.ndarray) -> list[Any]:
        kept = self._kept
        return [kept[k] for k in index.tolist()]

    def __setitem__(self, key: Any, value: Any) -> None:
        lead, rest = self._lead(key if isinstance(key, tuple) else (key,))
        if any(not (isinstance(k, slice) and k == slice(None)) for k in rest):
            raise InvalidArgumentError(f"{self._where}: a compressed field is written a whole row at a time")
        grid = self._frame(*lead)
        given = np.asarray(value, dtype=self.dtype)
        rows = np.broadcast_to(given, (*grid.shape, *self._frame_shape))  # as numpy would, or raises
        if not grid.size:  # no row named (a vector recorder's block of resets alone)
            return
        frames: list[bytes | None]
        if given.ndim == 0 and given.tobytes() == bytes(given.itemsize):  # cleared: rows of zeros keep no frame
            frames = [None] * grid.size
        else:
            frames = list(compressed(list(np.ascontiguousarray(rows).reshape(grid.size, -1).view(np.uint8))))
        kept = self._kept
        with HOLD:  # every row written, or none (a Ctrl-C waits)
            for k, frame in zip(grid.reshape(-1).tolist(), frames):  # in order: a row named twice, the last wins
                self._held += (0 if frame is None else sys.getsizeof(frame)) - (
                    0 if kept[k] is None else sys.getsizeof(kept[k])
                )
                kept[k] = frame
