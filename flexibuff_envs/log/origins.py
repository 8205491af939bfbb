"""An episode log's origins (`index.origins`): ``origins.fblog``, one fixed record per episode, the
``k``-th the log's episode ``k``'s (`flexibuff_envs.log`).

A writer puts an episode's record in place before the episode's rows (a record, a marker or a
commit), and syncs the file before the commits, so every episode a log holds has its record
written first, whatever instant a process dies. Past the log's episodes, a record is one a
killed writer put before it could append the episode: the next writer cuts them, and a reader
never reads them. An episode whose record is missing (a log written before origins were kept,
or appended to by a flexibuff_envs that did not keep them) or is not a plausible origin reads
as unknown: origins are information about the data, never a reason to refuse it.
"""

from __future__ import annotations

import os

import numpy as np

from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.index.origins import ORIGIN, checked

ORIGINS = "origins.fblog"


class RecordFile:
    """A file of one fixed record per episode of the log ``directory`` (``name``, of ``dtype``),
    open to write: each record at its episode's place, the file cut to ``episodes`` (the log's)
    first. `OriginsFile` is one; `log.summaries` another."""

    def __init__(self, directory: str, name: str, dtype: np.dtype, episodes: int) -> None:
        self.path, self.dtype = os.path.join(directory, name), dtype
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(self.fd).st_size > episodes * dtype.itemsize:
                os.ftruncate(self.fd, episodes * dtype.itemsize)
        except OSError as exc:
            raise BufferFileError(f"{self.path}: cannot be opened to write ({exc.strerror or exc})") from None

    def put(self, first: int, records: np.ndarray | None, n: int) -> None:
        """The records of the ``n`` episodes from the log's ``first`` (None: zeros, unknown)."""
        data = (
            np.zeros(n, self.dtype) if records is None else np.ascontiguousarray(records, dtype=self.dtype)
        ).tobytes()
        at, done = first * self.dtype.itemsize, 0
        while done < len(data):
            done += os.pwrite(self.fd, data[done:], at + done)

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self, episodes: int) -> None:
        """Cut to the log's ``episodes`` and close (again: nothing)."""
        if self.fd >= 0:
            try:
                if os.fstat(self.fd).st_size > episodes * self.dtype.itemsize:
                    os.ftruncate(self.fd, episodes * self.dtype.itemsize)
            finally:
                os.close(self.fd)
                self.fd = -1


class OriginsFile(RecordFile):
    """``origins.fblog`` of the log ``directory``, open to write."""

    def __init__(self, directory: str, episodes: int) -> None:
        super().__init__(directory, ORIGINS, ORIGIN, episodes)


def read_records(directory: str, name: str, dtype: np.dtype, episodes: int) -> tuple[np.ndarray, int]:
    """The records of the first ``episodes`` of the log ``directory`` in its file ``name`` (zeros
    for those it lacks), and how many it holds."""
    out = np.zeros(episodes, dtype=dtype)
    path = os.path.join(os.fspath(directory), name)
    try:
        with open(path, "rb") as handle:
            held = min(episodes, os.fstat(handle.fileno()).st_size // dtype.itemsize)
            view = out[:held].view(np.uint8).data
            done = 0
            while done < len(view):
                got = handle.readinto(view[done:])
                if not got:
                    break
                done += got
    except FileNotFoundError:
        return out, 0
    except OSError as exc:
        raise BufferFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return out, done // dtype.itemsize


def read_origins(directory: str, episodes: int, sessions: int) -> np.ndarray:
    """The origins of the log ``directory``'s first ``episodes`` (of ``sessions`` sessions):
    read from its file, those it lacks unknown."""
    return checked(read_records(directory, ORIGINS, ORIGIN, episodes)[0], sessions)
