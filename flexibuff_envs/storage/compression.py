"""Lossless, bit-exact compression of stored rows: zstd, through the ``zstandard`` package.

A part is compressed as a stream of its bytes cut into chunks of `CHUNK` bytes (the last
shorter), each a zstd frame of its own, followed by each frame's size (u64): it is written and
read a chunk at a time, two chunks at once (zstd releases the GIL), and each chunk decodes to
exactly the bytes its place in the layout holds, never more. A part ``"auto"`` picks that does
not compress to `WORTH` of its bytes is stored raw (random pixels: no gain, and a raw part can
be mapped). `plan` says which parts a
``compress`` choice compresses: ``"auto"`` those of images (integer values, a kilobyte a row
or more, where zstd takes them to a fiftieth or less), a mapping by field name, or None.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import zstandard

from flexibuff_envs.errors import BufferFileError, InvalidArgumentError

#: the codecs a part may be stored with
CODECS = ("zstd",)
#: bytes of a part a chunk holds (the last: what remains)
CHUNK = 1 << 22
#: zstd's level: 3 (its default) compresses frames near its best at hundreds of MB/s
LEVEL = 3
#: what a compressed part must come to at most, of its raw bytes, to be stored compressed
WORTH = 0.8
#: the most a part may be compressed: a file claiming more is refused as a decompression bomb
#: (4 MiB of zeros compress 28,500x)
MAX_RATIO = 1 << 16
#: what `auto` compresses: parts of these fields whose rows take at least `AUTO_BYTES`, of integers
AUTO_FIELDS = ("obs", "obs_", "state", "state_")
AUTO_BYTES = 1024
#: ``compress=``: "auto", None (nothing), or a codec (or None) per field name
Compress = str | Mapping[str, str | None] | None
_SIZE = struct.Struct("<Q")
_LOCAL = threading.local()  # each thread's compressor and decompressor (neither is shared across threads)


def plan(compress: Compress, name: str, dtype: np.dtype, row_bytes: int) -> str | None:
    """The codec part ``name`` (rows of ``row_bytes`` bytes of ``dtype``) is stored with, as
    ``compress`` says, or None (raw).

    Raises:
        InvalidArgumentError: ``compress`` is no policy, or names a codec that is not one of `CODECS`.
    """
    if compress is None:
        return None
    if isinstance(compress, str):
        if compress != "auto":
            raise InvalidArgumentError(f"compress must be 'auto', None or {{field: codec}}, got {compress!r}")
        return "zstd" if name in AUTO_FIELDS and dtype.kind in "biu" and row_bytes >= AUTO_BYTES else None
    if not isinstance(compress, Mapping):
        raise InvalidArgumentError(f"compress must be 'auto', None or {{field: codec}}, got {compress!r}")
    codec = compress.get(name, compress.get(name.removesuffix("_")))  # obs_ is stored as obs is
    if codec is not None and codec not in CODECS:
        raise InvalidArgumentError(f"compress: {name!r} asks for codec {codec!r}; the codecs are {list(CODECS)}")
    return codec


def available_memory() -> int:
    """Bytes of memory this machine can still give (Linux's MemAvailable; else all of it): what
    decoding may take at most."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def chunks(nbytes: int) -> int:
    """How many chunks a part of ``nbytes`` is cut into."""
    return -(-nbytes // CHUNK)


def encode(blocks: Iterable[memoryview]) -> Iterator[bytes]:
    """The stored form of a part whose bytes ``blocks`` yields: its frames in order, then their
    sizes."""
    sizes: list[int] = []
    with ThreadPoolExecutor(2, thread_name_prefix="flexibuff-zstd") as pool:
        for frame in _ordered(pool, _compress, _regrouped(blocks)):
            sizes.append(len(frame))
            yield frame
    yield np.array(sizes, dtype="<u8").tobytes()


def decode(read: Any, sizes_of: Any, stored: int, targets: Iterable[memoryview], nbytes: int, where: str) -> None:
    """Fill ``targets`` (the part's ``nbytes`` in order, as `Part.blocks` lays them) from the
    stored form of ``stored`` bytes that ``read(n)`` gives, in order, a frame at a time;
    ``sizes_of(n)`` gives the ``n`` bytes of its frames' sizes (at its end) first.

    Raises:
        BufferFileError: the stored form is not that of ``nbytes`` bytes (it names ``where`` and
            the chunk): sizes that do not add up, a frame that does not decode to its chunk's bytes.
    """
    count = chunks(nbytes)
    if stored < _SIZE.size * count or nbytes > MAX_RATIO * max(stored, 1):
        raise BufferFileError(f"{where}: {stored:,} stored bytes cannot hold {nbytes:,} ({count:,} chunks)")
    sizes = np.frombuffer(sizes_of(_SIZE.size * count), dtype="<u8")
    if (sizes < 1).any() or (sizes > stored).any() or int(sizes.sum()) != stored - _SIZE.size * count:
        raise BufferFileError(f"{where}: its chunks' sizes do not add up to the {stored:,} bytes stored")
    jobs = ((read(int(size)), min(CHUNK, nbytes - k * CHUNK), where, k) for k, size in enumerate(sizes))
    stream = _Filler(targets)
    with ThreadPoolExecutor(2, thread_name_prefix="flexibuff-zstd") as pool:
        for raw in _ordered(pool, _decompress, jobs):
            stream.put(raw)
    read(_SIZE.size * count)  # the sizes, in their place
    stream.done(nbytes, where)


class _Filler:
    """Copies a stream of bytes into a sequence of memoryviews, in order."""

    def __init__(self, targets: Iterable[memoryview]) -> None:
        self.targets, self.target, self.at, self.filled = iter(targets), memoryview(b""), 0, 0

    def put(self, data: bytes) -> None:
        view, done = memoryview(data), 0
        while done < len(view):
            if self.at == len(self.target):
                self.target, self.at = next(self.targets), 0
                continue
            n = min(len(self.target) - self.at, len(view) - done)
            self.target[self.at : self.at + n] = view[done : done + n]
            self.at, done = self.at + n, done + n
        self.filled += len(view)

    def done(self, nbytes: int, where: str) -> None:
        if self.filled != nbytes:
            raise BufferFileError(f"{where}: decoded {self.filled:,} bytes, not {nbytes:,}")


def _regrouped(blocks: Iterable[memoryview]) -> Iterator[bytes]:
    """``blocks``' bytes as chunks of `CHUNK` (the last: the rest)."""
    buffer = bytearray()
    for block in blocks:
        view = memoryview(block).cast("B") if block.nbytes else memoryview(b"")
        while len(view):
            take = min(CHUNK - len(buffer), len(view))
            buffer += view[:take]
            view = view[take:]
            if len(buffer) == CHUNK:
                yield bytes(buffer)
                buffer.clear()
    if buffer:
        yield bytes(buffer)


def _ordered(pool: ThreadPoolExecutor, work: Any, jobs: Iterable[Any]) -> Iterator[Any]:
    """``work(job)`` of each job, two or three running at once, in the jobs' order."""
    running: deque[Future[Any]] = deque()
    for job in jobs:
        running.append(pool.submit(work, job))
        if len(running) > 2:
            yield running.popleft().result()
    while running:
        yield running.popleft().result()


def _compress(chunk: bytes) -> bytes:
    compressor = getattr(_LOCAL, "compressor", None)
    if compressor is None:
        compressor = _LOCAL.compressor = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True)
    # its own bytes, of its size: what compress returns keeps the room zstd reserved (about a chunk)
    return memoryview(compressor.compress(chunk)).tobytes()


def _decompress(job: tuple[bytes, int, str, int]) -> bytes:
    frame, size, where, k = job
    decompressor = getattr(_LOCAL, "decompressor", None)
    if decompressor is None:
        decompressor = _LOCAL.decompressor = zstandard.ZstdDecompressor()
    try:
        params = zstandard.get_frame_parameters(frame)
        if params.content_size != size:
            raise zstandard.ZstdError(f"it says it holds {params.content_size:,} bytes")
        raw = decompressor.decompress(frame)  # its size checked: no more is allocated
    except zstandard.ZstdError as exc:
        raise BufferFileError(
            f"{where}: chunk {k} (bytes {k * CHUNK:,}-{k * CHUNK + size:,}) is corrupt ({exc})"
        ) from None
    if len(raw) != size:
        raise BufferFileError(f"{where}: chunk {k} decodes to {len(raw):,} bytes, not {size:,}")
    return raw  # type: ignore[no-any-return]
