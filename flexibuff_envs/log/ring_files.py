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
from flexibuff_envs.log.format import fail
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.fields import NEXT
from flexibuff_envs.storage.next_values import CHAINED, Chain

RING = "ring"
INDEX = "ring.json"
#: this boot's id (Linux): a ring written before another boot may have lost pages to it
_BOOT = "/proc/sys/kernel/random/boot_id"


def boot() -> str | None:
    """This boot's id, where the system tells it (Linux); None elsewhere."""
    try:
        with open(_BOOT) as handle:
            return handle.read().strip()
    except OSError:
        return None


class RingFiles:
    """Makes the arrays of a buffer's storage as files of ``directory/ring/`` (an `Alloc`:
    ``ring(shape, dtype, name)``), keeping ``ring.json`` up to date."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.join(directory, RING)
        os.makedirs(self.directory, exist_ok=True)
        self.files: dict[str, dict[str, object]] = {}  # array name -> its file, shape, dtype
        self.boot = boot()
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
            json.dump({"boot": self.boot, "arrays": self.files}, out)
        # the old index or the new, whole, after a kill; no sync: after a crash of the system the
        # ring is not read (`left`)
        os.replace(path + ".new", path)


def into_files(storage: Storage, directory: str) -> bool:
    """Move ``storage``'s arrays and next-value chains into files of ``directory/ring/`` (the
    rows its lanes opened: the others are zeros in both) and make its later ones there. Nothing
    moves, and False is returned, once a recorder writes to it (it holds views of the arrays),
    or where the system lacks `posix_fallocate` or a boot id (not Linux), or it holds a compressed
    log's rows, mapped (read-only), or rows kept compressed in memory (`PackedRing`)."""
    if (
        any(len(chain.holders) for chain in storage.chains.values())
        or not all(isinstance(array, np.ndarray) for array in storage.arrays.values())
        or not hasattr(os, "posix_fallocate")
        or not boot()
    ):
        return False  # where the system cannot reserve a file's blocks, or name its boot: records instead
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


def kept(directory: str) -> bool:
    """Whether ``directory/ring/`` holds a ring written since the system last booted (`left`
    folds its episodes; without it, they are lost)."""
    try:
        with open(os.path.join(directory, RING, INDEX), "rb") as handle:
            index = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(index, dict) and index.get("boot") == boot()


def left(directory: str, spec: BufferSpec) -> Storage | None:
    """The ring a killed recording left in ``directory/ring/`` (as `ring.json` names it), its
    files mapped read-only, as a storage of ``spec``'s layout; None when there is none, or it
    was written before the system last booted (a power loss or a crash of the OS may have kept
    some of its pages from the disk: the episodes it held are lost, as ``fsync="interval"``
    allows).

    Raises:
        BufferFileError: a file differs from what ``ring.json`` says of it, or an array from
            what ``spec`` stores.
    """
    root = os.path.join(directory, RING)
    path = os.path.join(root, INDEX)
    try:
        with open(path, "rb") as handle:
            index = json.loads(handle.read(1 << 20))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise fail(path, f"cannot be read as the ring's index ({exc})") from None
    if not isinstance(index, dict) or not isinstance(index.get("arrays"), dict):
        raise fail(path, "is not a ring's index (its boot and arrays)")
    if index.get("boot") != boot():
        return None
    probe = Storage(spec, 1)
    arrays: dict[str, np.ndarray] = {}
    for name, entry in index["arrays"].items():
        arrays[name] = _mapped(root, path, name, entry, probe)
    rows = arrays["obs"].shape[1] if "obs" in arrays else 0
    storage = Storage(spec, rows)
    storage.replace({name: array for name, array in arrays.items() if name in storage.fields})
    for name in NEXT:
        index, tail = arrays.get(f"{name}.index"), arrays.get(f"{name}.tail")
        if index is not None and tail is not None and NEXT[name] in storage.arrays:
            base = storage.arrays[NEXT[name]]
            if index.shape != base.shape[:-1] or tail.shape[1:] != base.shape[-1:] or tail.dtype != base.dtype:
                raise fail(path, f"the ring's {name} does not fit its {NEXT[name]}")
            if index.size and (index.min() < CHAINED or index.max() >= len(tail)):
                raise fail(path, f"the ring's {name} names slots its tail does not hold")
            storage.chains[name] = Chain(base, storage.fields[name].per_agent, index=index, tail=tail)
    for name, array in storage.arrays.items():
        lead = (spec.n_agents, rows) if storage.fields[name].per_agent else (rows,)
        if array.shape[: len(lead)] != lead or array.dtype != storage.dtype(name):
            raise fail(path, f"the ring's {name} is {array.shape} {array.dtype}, not a ring of {rows} rows of it")
    return storage


def _mapped(root: str, path: str, name: str, entry: Any, probe: Storage) -> np.ndarray:
    """The array ``ring.json`` (``path``) lists as ``name``, mapped read-only once checked."""
    try:
        file, shape, dtype = str(entry["file"]), tuple(int(n) for n in entry["shape"]), np.dtype(entry["dtype"])
    except (KeyError, TypeError, ValueError) as exc:
        raise fail(path, f"its entry {name!r} is not a file, shape and dtype ({exc})") from None
    base = name.split(".")[0]
    if os.sep in file or file.startswith(".") or base not in probe.fields or dtype.kind not in "biuf":
        raise fail(path, f"its entry {name!r} names no array of a ring ({file}, {dtype})")
    full = os.path.join(root, file)
    nbytes = math.prod(shape) * dtype.itemsize if all(n >= 0 for n in shape) else -1
    try:
        size = os.path.getsize(full)
    except OSError as exc:
        raise fail(full, f"cannot be read ({exc.strerror or exc})") from None
    if size != nbytes or not nbytes:
        raise fail(full, f"holds {size:,} bytes, not the {nbytes:,} of {shape} {dtype}")
    return np.memmap(full, dtype=dtype, mode="r", shape=shape)
