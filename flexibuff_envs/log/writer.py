"""Writing an episode log: appending chunks, a buffer's ring rows and whole logs, merging logs
(`flexibuff_envs.log`)."""

from __future__ import annotations

import dataclasses
import operator
import os
import shutil
import time
import weakref
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

import numpy as np

from flexibuff_envs.errors import BufferFileError, BufferSaveError, InvalidArgumentError
from flexibuff_envs.files.chunk import Chunk, check_layout
from flexibuff_envs.interrupts import holding
from flexibuff_envs.log.absorb import absorb
from flexibuff_envs.log.append_plan import Direct, Plan, added, allocated
from flexibuff_envs.log.append_window import Tail
from flexibuff_envs.log.compressed import Frames, made_column, packed
from flexibuff_envs.log.format import (
    COMMITS,
    ENTRY_BYTES,
    EPISODE_LENGTHS,
    HEADER,
    Column,
    Commit,
    FsyncPolicy,
    LogHeader,
    header_bytes,
    is_log,
)
from flexibuff_envs.log.journal import JOURNAL, lock, scan
from flexibuff_envs.log.markers import Marks
from flexibuff_envs.log.origins import OriginsFile, RecordFile
from flexibuff_envs.log.read import State, repaired, sync_file
from flexibuff_envs.log.ring_files import RING
from flexibuff_envs.log.stage_files import Layout, StageFile
from flexibuff_envs.log.summaries import Summaries, summed
from flexibuff_envs.log.syncing import Syncer
from flexibuff_envs.log.writer_journal import Journaling
from flexibuff_envs.storage.compression import Compress, plan
from flexibuff_envs.storage.packed import Stack


class LogWriter(Journaling):
    """Appends chunks of whole episodes to the log ``directory`` (made if missing).

    An existing log is continued: its layout must match, a torn tail is cut first, the episodes
    its journal holds are folded (a recording killed before it folded them), and nothing else
    already there is rewritten. Each append (`append`, `append_rows`) hands its rows to the OS
    before it returns: a process killed (SIGKILL) after that loses none of its episodes.
    `append_rows` writes them to the journal, one record, and they are folded into the columns
    ``every`` seconds, when the journal reaches 64 MiB, and at `sync` and `close`. ``fsync``
    says when they reach the disk itself, which is what survives a power loss: "interval" (at
    the first fold or `append` ``every`` seconds after the last sync, on a thread of its own:
    `log.syncing`; the default),
    "always" (every append and every record), "close" (only at `sync` and `close`).
    ``compress`` says which columns keep their rows as zstd frames (`Column.codec`): "auto"
    (observations and states of images: `compression.plan`), a codec per field, or None; a
    continued log's columns keep theirs.

    One writer appends to a log at a time: it holds the journal's lock while open.

    Raises:
        BufferFileError: another writer holds the log, or the directory holds a log of another
            layout, or a damaged one.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        header: LogHeader,
        *,
        fsync: FsyncPolicy = "interval",
        every: float = 5.0,
        compress: Compress = "auto",
    ) -> None:
        if fsync not in ("interval", "always", "close"):
            raise InvalidArgumentError(f"fsync must be 'interval', 'always' or 'close', got {fsync!r}")
        plan(compress, "", np.dtype(np.uint8), 0)  # a policy, or raises
        self.compress = compress
        self.directory = os.fspath(directory)
        self.header = dataclasses.replace(header, sessions=())  # sessions: the log's, then `add_sessions`
        self.fsync, self.every = fsync, float(every)
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, JOURNAL)
        try:
            self._journal = Tail(path)
        except OSError as exc:
            raise BufferFileError(f"{path}: cannot be opened to write ({exc.strerror or exc})") from None
        if not lock(self._journal.fd, path):
            os.close(self._journal.fd)
            raise BufferFileError(f"{self.directory}: another writer has this episode log open")
        try:
            state = self._continued(header)
        except BaseException:
            os.close(self._journal.fd)  # and its lock
            raise
        self.columns, self.commit = state.columns, state.commit
        self.header = dataclasses.replace(self.header, sessions=state.header.sessions)
        self._fills = allocated(header.spec)
        self._tails = {c.key: self._tail(c) for c in state.files}
        self._frames = {
            self._tails[c.key]: Frames(c, Tail(os.path.join(self.directory, c.frames_file)), state.frames_end(c))
            for c in state.columns
            if c.codec
        }
        self._plan = Plan(self.columns, self._tails, self._fills, header.spec.n_agents)
        self._fields: tuple[str, ...] = ()  # a buffer's fields and chains `append_rows` found in the log
        self._direct: Direct | None = None  # how `append_rows` reads them straight, where it can
        self.marks = Marks(None)  # the ended episodes of a buffer whose ring is in files (`use_ring`)
        self._stages: list[StageFile] = []  # its vector recorders' (`stage`)
        self._commits = open(os.path.join(self.directory, COMMITS), "ab", buffering=0)  # noqa: SIM115
        self._synced = self._folded = time.monotonic()
        self._syncer = Syncer(self.directory)
        self._records = scan(self.directory, self.columns, self.commit)[0]
        self.origins = OriginsFile(self.directory, self.next_episode)  # (`log.origins`)
        self.summaries = Summaries(self.directory, header.spec.n_agents, self.next_episode)  # (`log.summaries`)
        # a writer dropped unclosed (its buffer collected) still cuts and lets go of its files
        self._open = _Open(
            self._tails, self._commits, self._journal, self.columns, self.commit, self._syncer, self._frames
        )
        self._open.records = [self.origins, self.summaries.file]
        self._finalizer = weakref.finalize(self, self._open.close)
        try:
            self.fold()  # what a killed recording left in the journal
            self._replay()  # and in its vector recorders' stages
            self._journal.cut(0)  # and a torn record past it
            shutil.rmtree(os.path.join(self.directory, RING), ignore_errors=True)  # and the ring it read them from
            self.summaries.fill()  # those a log older than them, or a kill, left it without
            self._sync_files()  # all of it on the disk, and recorded so (`log.syncing`)
        except BaseException:
            self._finalizer()
            raise

    def stage(self, layout: Layout, lanes: list[int]) -> StageFile | None:
        """A vector recorder's stage in a file beside the ring (`log.stage_files`), for its ``lanes``;
        None where the buffer's ring is not in files."""
        if self.marks.storage is None:
            return None
        stage = StageFile.make(os.path.join(self.directory, RING), layout, lanes, lambda: self.next_episode)
        self._stages.append(stage)
        return stage

    def _continued(self, header: LogHeader) -> State:
        """The log as it stands, its torn tails cut and its layout checked (made if missing)."""
        if is_log(self.directory):
            state = repaired(self.directory)
            if state.header != header:
                check_layout(header.spec, state.header.spec, f"the episode log {self.directory}")
                raise BufferFileError(
                    f"{self.directory}: the log's discounts (gamma {state.header.gamma}, "
                    f"gae_lambda {state.header.gae_lambda}) differ from the recording's "
                    f"({header.gamma}, {header.gae_lambda})"
                )
        else:
            state = State(self.directory, self.header, [], Commit())
            self._write_header([])
        listed = {c.file for c in state.files} | {HEADER, COMMITS}
        for name in os.listdir(self.directory):  # a column a kill caught before the header named it
            if name.endswith((".col", ".new")) and name not in listed:
                os.unlink(os.path.join(self.directory, name))
        return state

    def _tail(self, column: Column) -> Tail:
        return Tail(os.path.join(self.directory, column.file))

    def _write_header(self, columns: Sequence[Column]) -> None:
        """The header naming ``columns``, whole or not at all."""
        path = os.path.join(self.directory, HEADER)
        with open(path + ".new", "wb") as out:
            out.write(header_bytes(self.header, columns))
            out.flush()
            os.fsync(out.fileno())
        os.replace(path + ".new", path)
        sync_file(self.directory)

    def _add(self, columns: Sequence[Column]) -> None:
        """New columns, holding what the rows committed so far would hold had the field been
        there: its allocated value (a next value: slot 0, zeros), compressed as ``compress``
        says."""
        columns = [
            dataclasses.replace(
                c, codec=plan(self.compress, c.name, c.dtype, c.row_bytes) if c.part != "index" else None
            )
            for c in columns
        ]
        columns = [dataclasses.replace(c, stack=self._stack(c)) if c.codec else c for c in columns]
        made = {c.key: made_column(self.directory, c, self._fills.get(c.key, 0), self.commit.rows) for c in columns}
        self._write_header([*self.columns, *columns])
        self.columns = self._open.columns = [*self.columns, *columns]
        for column in columns:
            self._tails[column.key] = self._tail(column)
            frames = made[column.key]
            if frames is not None:
                self._frames[self._tails[column.key]] = frames
        self._plan = Plan(self.columns, self._tails, self._fills, self.header.spec.n_agents)

    def _stack(self, column: Column) -> Stack | None:
        """The stack observations of ``column`` may be (`packed.Stack`), by their shape."""
        shape, size = self.header.spec.obs_shape, column.row_bytes // column.per_row
        if column.key != ("obs", None) or not shape or int(np.prod(shape)) * column.dtype.itemsize != size:
            return None
        return Stack.of(tuple(shape), column.dtype)

    @holding  # a Ctrl-C between two of its writes would leave rows no commit counts before the next
    def append(self, chunk: Chunk) -> None:
        """Write ``chunk``'s episodes to every column, then commit them (nothing for an empty chunk)."""
        if not chunk.n_episodes:
            return
        self.fold()  # the journal's episodes came first
        if chunk.spec is not self.header.spec:  # a chunk from this log's own buffer has its layout
            check_layout(self.header.spec, chunk.spec, "the chunk")
        given = {part.key: part.pieces for part in chunk.parts}
        for name, part in given:
            if part is not None and (name, "tail" if part == "index" else "index") not in given:
                raise InvalidArgumentError(f"the chunk's next-value field {name!r} needs both its index and tail parts")
        if given.keys() - self._tails.keys():
            self._add([Column.of(part) for part in chunk.parts if part.key not in self._tails])
        rows = chunk.rows
        self.origins.put(self.commit.episodes, chunk.origins, chunk.n_episodes)
        self._commit(self._plan.of(given, chunk.lengths, rows, self.commit.tails), rows, chunk.n_episodes, added(given))
        self._maybe_sync()

    @holding
    def absorb(self, source: str | os.PathLike[str]) -> None:
        """Append every whole episode of the log ``source`` (of this layout and discounts) as one
        commit: each of its bytes is read once and written once, in pieces of at most 16 MiB, next
        values renumbered to follow this log's; its sessions and origins follow this log's."""
        absorb(self, os.fspath(source))

    def _commit(
        self, pieces: Iterable[tuple[Tail, np.ndarray]], rows: int, episodes: int, added: tuple[int, ...]
    ) -> None:
        """Put ``pieces`` (a column's tail, a C-contiguous array) in order, then write the commit
        entry counting ``rows``, ``episodes`` and each chain's ``added`` slots. If a write fails
        (a full disk), every file goes back to the last commit and `BufferSaveError` names the one
        that failed."""
        last = self.commit
        commit = Commit(
            last.number + 1, last.rows + rows, last.episodes + episodes, tuple(map(operator.add, last.tails, added))
        )
        crc, tail, crc32, packers = 0, None, zlib.crc32, self._frames
        kept: dict[str, list[Any]] = {}  # the rows a summary is made of (`log.summaries`)
        if self.summaries.on:
            watched = {self._tails[c.key]: c for c in [EPISODE_LENGTHS, *self.columns] if summed(c)}
            pieces = self.summaries.watching(pieces, watched, kept)
        try:  # each piece is with the OS once put (a killed process loses nothing appended)
            for tail, piece in packed(pieces, packers) if packers else pieces:
                crc = crc32(piece, crc)  # type: ignore[arg-type]  # a buffer
                tail.put(piece)
            tail = None  # the entry's turn
            entry, done = commit.entry(crc), 0
            while done < ENTRY_BYTES:
                done += self._commits.write(entry[done:])
        except BaseException as exc:  # a full disk, or a source that cannot be read: back to the last commit
            for column in [EPISODE_LENGTHS, *self.columns]:
                self._tails[column.key].cut(self.commit.length(column))
            for frames in packers.values():
                frames.settle(committed=False)
            os.ftruncate(self._commits.fileno(), (self.commit.number + 1) * ENTRY_BYTES)
            if isinstance(exc, OSError):
                raise BufferSaveError(
                    exc.errno,
                    f"cannot append to the episode log ({exc.strerror or exc}; every "
                    "episode appended before is intact)",
                    self._commits.name if tail is None else tail.path,
                ) from exc
            raise
        for frames in packers.values():
            frames.settle(committed=True)
        self.commit = self._open.commit = commit
        if kept:
            self.summaries.committed(last.episodes, episodes, kept, {c.name: c.dtype for c in self.columns})

    def _maybe_sync(self) -> None:
        """After an append to the columns: sync as ``fsync`` says ("interval": on a thread,
        `log.syncing`; what it meets is raised by the next fold, `sync` or `close`)."""
        if self.fsync == "always":
            self._sync_files()
        elif self.fsync == "interval" and time.monotonic() - self._synced >= self.every:
            # fsync alone, no msync of the windows (another thread may move them): where tails
            # are mapped (Linux, the BSDs) it writes the pages a mapping dirtied too
            files = [(tail.fd, tail.path) for tail in self._all_tails()] + [(self.origins.fd, self.origins.path)]
            if self._syncer.start([*files, (self._commits.fileno(), self._commits.name)], self.commit.number):
                self._synced = time.monotonic()

    def _sync_files(self) -> None:
        """The columns' rows to the disk itself, then the commits (the sync under way done first)."""
        self._syncer.wait()
        for tail in self._all_tails():
            tail.sync()
        self.origins.sync()
        self.summaries.file.sync()
        os.fsync(self._commits.fileno())
        self._syncer.synced(self.commit.number)
        self._syncer.check()
        self._synced = time.monotonic()

    def _all_tails(self) -> list[Tail]:
        return [*self._tails.values(), *(frames.tail for frames in self._frames.values())]

    def sync(self) -> None:
        """Everything appended so far to the disk itself: the journal folded, the rows, then the
        commits."""
        self.fold()
        self._sync_files()

    @holding
    def close(self) -> None:
        """Fold the journal, cut the reserved blocks past the last commit, sync (the cut sizes
        too) and close (appending again needs a new writer). If folding fails (a full disk), the
        files are closed all the same, the journal keeping what was not folded (the next writer
        or reader folds it, from the ring's files when the buffer's ring is in files), and the error
        is raised. The ring's files go once folded (a buffer recording on keeps them mapped)."""
        if not self._commits.closed:
            for stage in self._stages:
                stage.stop()
            try:
                self.fold()
                shutil.rmtree(os.path.join(self.directory, RING), ignore_errors=True)  # its episodes are folded
            finally:
                for column in [EPISODE_LENGTHS, *self.columns]:
                    self._tails[column.key].cut(self.commit.length(column))
                for frames in self._frames.values():
                    frames.tail.cut(frames.end)
                self._sync_files()
                self._finalizer()


class _Open:
    """A writer's files and its newest commit: what closing them needs, so that a writer dropped
    unclosed (its buffer collected) still cuts them to what is committed and lets go of them."""

    def __init__(
        self,
        tails: dict[Any, Tail],
        commits: BinaryIO,
        journal: Tail,
        columns: list[Column],
        commit: Commit,
        syncer: Syncer,
        frames: dict[Tail, Frames],  # a compressed column's frames, by the tail of their ends
    ) -> None:
        self.tails, self.commits, self.journal, self.columns, self.commit = tails, commits, journal, columns, commit
        self.syncer, self.frames = syncer, frames
        self.records: list[RecordFile] = []  # the origins and summaries

    def close(self) -> None:
        self.syncer.close()  # it syncs these files
        for column in [EPISODE_LENGTHS, *self.columns]:
            self.tails[column.key].close(self.commit.length(column))
        for frames in self.frames.values():
            frames.tail.close(frames.end)
        self.commits.close()
        for records in self.records:
            records.close(self.commit.episodes)
        self.journal.close(
            self.journal.size
        )  # its records kept (the next writer or reader folds them), its lock let go
