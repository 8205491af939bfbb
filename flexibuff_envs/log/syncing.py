"""Syncing an episode log's files on a thread of their own (`LogWriter`, ``fsync="interval"``),
and the record of the newest commit synced.

An ``fsync`` of a few seconds of rows waits for the disk (tens of milliseconds for tens of MB);
the recording need not wait with it. ``fsync`` lets go of the GIL, so a thread syncs while the
recording goes on; the next sync (or `sync`, `close`) waits for it first, and raises what it met.

``synced.fblog`` names the newest commit whose rows and entry a sync put on the disk, and the
boot it happened in: ``b"FBSYNCED" | 40 bytes boot id | i64 commit number | u32 crc32``. A power
loss can leave a commit entry on the disk while the rows of one before it never got there (the
OS writes pages back in any order), which checking the newest commit does not see; so a reader of
a log last synced in another boot (or where there is no boot id) checks every commit after that
one. Within one boot, the page cache holds whatever any process wrote, so only the newest needs
checking. The record is written after its sync, never synced itself: one lost names an older
commit, and a reader checks more.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Sequence

from flexibuff_envs.errors import BufferSaveError
from flexibuff_envs.log.ring_files import boot

SYNCED = "synced.fblog"
_MAGIC = b"FBSYNCED"
_RECORD = struct.Struct("<8s40sq")


def synced_record(number: int) -> bytes:
    """The record saying commit ``number`` (-1: none) is on the disk, in this boot."""
    body = _RECORD.pack(_MAGIC, (boot() or "").encode(), number)
    return body + struct.pack("<I", zlib.crc32(body))


def checked_from(directory: str, count: int) -> int | None:
    """The first of the ``count`` commits of the log ``directory`` whose bytes a reader checks,
    each after it in turn, before it takes the newest: the one after the last synced, where that
    happened in another boot (or there is no boot id); 0 where the record is not whole or names
    no commit of the log; None where this boot synced it, or there is no record (a log written
    before there was one): the newest alone is checked."""
    try:
        with open(os.path.join(directory, SYNCED), "rb") as handle:
            raw = handle.read(_RECORD.size + 5)
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    if len(raw) != _RECORD.size + 4 or zlib.crc32(raw[: _RECORD.size]) != struct.unpack("<I", raw[-4:])[0]:
        return 0
    magic, booted, number = _RECORD.unpack(raw[: _RECORD.size])
    if magic != _MAGIC or not -1 <= number < count:
        return 0
    here = boot()
    return None if here and booted.rstrip(b"\0") == here.encode() else number + 1


class Syncer:
    """A writer's syncs of the log ``directory``, on a thread at most one at a time, and its
    record of the newest commit synced."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, SYNCED)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._thread: threading.Thread | None = None
        self._failed: tuple[OSError, str] | None = None  # what a sync met, on which file

    def start(self, files: Sequence[tuple[int, str]], number: int) -> bool:
        """fsync ``files`` (descriptor, path) in order on a thread, then record commit ``number``
        synced; False, with nothing done, while the sync before is under way."""
        if self._thread is not None:
            if self._thread.is_alive():
                return False
            self._thread.join()
        self._thread = threading.Thread(target=self._run, args=(list(files), number), name="flexibuff-envs log sync")
        self._thread.start()
        return True

    def _run(self, files: list[tuple[int, str]], number: int) -> None:
        for fd, path in files:
            try:
                os.fsync(fd)
            except OSError as exc:
                self._failed = (exc, path)
                return
        self.synced(number)

    def synced(self, number: int) -> None:
        """Record commit ``number`` synced (its rows and entry on the disk)."""
        try:
            os.pwrite(self.fd, synced_record(number), 0)
        except OSError as exc:
            self._failed = (exc, self.path)

    def join(self) -> None:
        """Until the sync under way is done (its files may be closed then)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def check(self) -> None:
        """Raise what a sync met, once.

        Raises:
            BufferSaveError: the disk refused rows a sync wrote back: every episode appended is
                readable, but those since the sync before may not survive a power loss.
        """
        if self._failed is not None:
            (exc, path), self._failed = self._failed, None
            raise BufferSaveError(
                exc.errno,
                f"cannot sync the episode log to the disk ({exc.strerror or exc}; every episode "
                "appended is readable, but those since the last sync may not survive a power loss)",
                path,
            ) from exc

    def wait(self) -> None:
        """`join`, then `check`."""
        self.join()
        self.check()

    def close(self) -> None:
        """`join`, and let go of the record."""
        self.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
