"""Syncing an episode log's files on a thread of their own (`LogWriter`, ``fsync="interval"``).

An ``fsync`` of a few seconds of rows waits for the disk (tens of milliseconds for tens of MB);
the recording need not wait with it. ``fsync`` lets go of the GIL, so a thread syncs while the
recording goes on; the next sync (or `sync`, `close`) waits for it first, and raises what it met.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from flexibuff_envs.errors import BufferSaveError


class Syncer:
    """A writer's syncs on a thread, at most one under way at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failed: tuple[OSError, str] | None = None  # what a sync met, on which file

    def start(self, files: Sequence[tuple[int, str]]) -> bool:
        """fsync ``files`` (descriptor, path) in order on a thread; False, with nothing done,
        while the sync before is under way."""
        if self._thread is not None:
            if self._thread.is_alive():
                return False
            self._thread.join()
        self._thread = threading.Thread(target=self._run, args=(list(files),), name="flexibuff-envs log sync")
        self._thread.start()
        return True

    def _run(self, files: list[tuple[int, str]]) -> None:
        for fd, path in files:
            try:
                os.fsync(fd)
            except OSError as exc:
                self._failed = (exc, path)
                return

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
