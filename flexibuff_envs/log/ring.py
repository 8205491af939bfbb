"""A logging buffer's ring in files (`flexibuff_envs.log`): every array of its storage mapped
shared from a file of ``DIR/ring/``, so the rows it records are with the OS as they are written
and an episode's end needs no copy of them, only a small record naming them (the journal's).

``ring.json`` names each array's file, shape and dtype (rewritten whole, then renamed, when an
array is made or grows). A file is sized at once with its blocks reserved, so a full disk is an
error when the array is made, never a crash on a write; its bytes read zero until written, as a
RAM ring's calloc'd arrays do.
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import os
from typing import Any

import numpy as np

from flexibuff_envs.errors import BufferSaveError
from flexibuff_envs.fields import NEXT
from flexibuff_envs.storage import Storage

RING = "ring"
INDEX = "ring.json"


class RingFiles:
    """Makes the arrays of a buffer's storage as files of ``directory/ring/`` (an `Alloc`:
    ``ring(shape, dtype, name)``), keeping ``ring.json`` up to date."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.join(directory, RING)
        os.makedirs(self.directory, exist_ok=True)
        self.files: dict[str, dict[str, object]] = {}  # array name -> its file, shape, dtype
        self._made = itertools.count()

    def __call__(self, shape: tuple[int, ...], dtype: Any, name: str = "") -> np.ndarray:
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        file = f"{name}.{next(self._made)}.ring"
        path = os.path.join(self.directory, file)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                if count:
                    os.posix_fallocate(fd, 0, count * dtype.itemsize)
                memory = mmap.mmap(fd, max(count * dtype.itemsize, 1))
            finally:
                os.close(fd)
        except OSError as exc:
            raise BufferSaveError(exc.errno, f"cannot make the ring's {name} ({exc.strerror or exc})", path) from exc
        before = self.files.get(name)
        self.files[name] = {"file": file, "shape": list(shape), "dtype": dtype.str}
        self._write_index()
        if before is not None:  # grown: the array before stays mapped for as long as it is held
            os.unlink(os.path.join(self.directory, str(before["file"])))
        return np.frombuffer(memory, dtype, count).reshape(shape)

    def _write_index(self) -> None:
        path = os.path.join(self.directory, INDEX)
        with open(path + ".new", "w") as out:
            json.dump(self.files, out)
        os.replace(path + ".new", path)


def into_files(storage: Storage, directory: str) -> bool:
    """Move ``storage``'s arrays and next-value chains into files of ``directory/ring/`` (the
    rows its lanes opened: the others are zeros in both) and make its later ones there. Nothing
    moves, and False is returned, once a recorder writes to it: it holds views of the arrays."""
    if any(len(chain.holders) for chain in storage.chains.values()):
        return False
    ring = RingFiles(directory)
    for name, array in list(storage.arrays.items()):
        storage.put(name, _moved(storage, ring, array, name, storage.fields[name].per_agent))
    for name, chain in storage.chains.items():
        chain.base = storage.arrays[NEXT[name]]
        chain.index = _moved(storage, ring, chain.index, f"{name}.index", chain.per_agent)
        tail = ring(chain.tail.shape, chain.tail.dtype, f"{name}.tail")
        tail[...] = chain.tail
        chain.tail, chain.alloc_array = tail, ring
    storage.alloc = ring
    return True


def _moved(storage: Storage, ring: RingFiles, array: np.ndarray, name: str, per_agent: bool) -> np.ndarray:
    """``array`` (rows on its first axis, or its second ``per_agent``) in a file of ``ring``:
    the rows each lane opened copied."""
    moved = ring(array.shape, array.dtype, name)
    rows, source = (moved.swapaxes(0, 1), array.swapaxes(0, 1)) if per_agent else (moved, array)
    for lane, opened in enumerate(storage.opened):
        first = lane * storage.lane_rows
        rows[first : first + opened] = source[first : first + opened]
    return moved
