"""The end of one log file, where appends land (`flexibuff_envs.log`).

A small append is a copy into a mapped window of the file's end: the bytes are in the OS's page
cache when the copy returns (a killed process loses none of them), without a system call. The
window's disk blocks are reserved before it is mapped, so a full disk is an `OSError` when the
window moves, never a SIGBUS on a copy. A large append is one `pwrite`. The bytes past the last
commit (the rest of the window) are cut when the file is closed, or by a reader's repair after a
kill, like any torn tail.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

#: bytes of a file's end mapped at a time: an eighth of the file, at least FIRST, at most WINDOW
#: (the pages a window has written count in the process's resident memory until it moves on: at
#: most 256 KiB a column keeps a long recording's resident memory flat)
FIRST, WINDOW = 1 << 16, 1 << 18
#: appends of more bytes than this are written, not copied
LARGE = WINDOW // 4
#: reserving blocks ahead needs posix_fallocate (Linux, BSDs); elsewhere every append is written
MAPPED = hasattr(os, "posix_fallocate")


class Tail:
    """Appends to the file ``path`` (made if missing) after the bytes it holds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self.capacity = os.fstat(self.fd).st_size  # bytes the file holds, reserved ones included
        self.size = self.capacity  # bytes put, the append under way's too
        self._map: mmap.mmap | None = None
        self._start = 0  # the file offset of the window's first byte

    def put(self, data: Any) -> None:
        """Append ``data`` (bytes, or a C-contiguous array) after the bytes put so far."""
        n, at = len(data) if data.__class__ is bytes else data.nbytes, self.size
        if n > LARGE or not MAPPED:
            view, done = memoryview(data).cast("B"), 0
            while done < n:
                done += os.pwrite(self.fd, view[done:], at + done)
            self.capacity = max(self.capacity, at + n)
        else:
            window = self._map
            if window is None or at + n > self._start + len(window):
                window = self._slide(at, n)
            window[at - self._start : at - self._start + n] = data
        self.size = at + n

    def _slide(self, at: int, n: int) -> mmap.mmap:
        """Map a window holding bytes ``[at, at + n)``, its blocks reserved first."""
        self._unmap()
        start = at - at % mmap.ALLOCATIONGRANULARITY
        end = start + max(min(WINDOW, max(FIRST, at // 8)), at + n - start)
        end += -end % mmap.ALLOCATIONGRANULARITY
        if end > self.capacity:
            os.posix_fallocate(self.fd, self.capacity, end - self.capacity)
            self.capacity = end
        self._map, self._start = mmap.mmap(self.fd, end - start, offset=start), start
        return self._map

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def cut(self, size: int) -> None:
        """Back to ``size`` bytes (the committed ones): the file holds nothing past them, no
        reserved blocks either."""
        self._unmap()
        os.ftruncate(self.fd, size)
        self.size = self.capacity = size

    def sync(self) -> None:
        """What was put to the disk itself."""
        if self._map is not None:
            self._map.flush()
        os.fsync(self.fd)

    def close(self, size: int) -> None:
        """`cut` to ``size`` and let go of the file."""
        if self.fd >= 0:
            self.cut(size)
            os.close(self.fd)
            self.fd = -1
