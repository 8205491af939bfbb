"""The episode log writer's journal half: ended episodes written as journal records (or
markers, when the buffer's ring is in files) and folded into the columns (`LogWriter`)."""

from __future__ import annotations

import dataclasses
import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.errors import BufferSaveError
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.interrupts import holding
from flexibuff_envs.log.append_plan import Direct, Plan, added
from flexibuff_envs.log.append_window import Tail
from flexibuff_envs.log.format import EPISODE_LENGTHS, Column, Commit, LogHeader
from flexibuff_envs.log.journal import FOLD, RECORD_BYTES, Record, batches, parts, parts_of, record
from flexibuff_envs.log.markers import Marks, in_records, parse
from flexibuff_envs.log.origins import OriginsFile
from flexibuff_envs.log.ring_files import RING, left
from flexibuff_envs.log.stage_files import left as stages_left
from flexibuff_envs.log.stage_files import replayers
from flexibuff_envs.log.syncing import Syncer
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.stored_form import Segments, Stored, segment_rows

#: a journal holding more bytes than this is folded at the next record
JOURNAL_LIMIT = 1 << 26


class Journaling:
    """`LogWriter`'s appends of ended episodes through the journal, and folding it."""

    if TYPE_CHECKING:  # given by `LogWriter`
        directory: str
        header: LogHeader
        fsync: str
        every: float
        columns: list[Column]
        commit: Commit
        marks: Marks
        _journal: Tail
        _records: list[Record]
        _folded: float
        _fields: tuple[str, ...]
        _tails: dict[Any, Tail]
        _direct: Direct | None
        _plan: Plan
        _syncer: Syncer
        origins: OriginsFile

        def append(self, chunk: Chunk) -> None: ...

        def _commit(self, pieces: Any, rows: int, episodes: int, added: tuple[int, ...]) -> None: ...

        def _maybe_sync(self) -> None: ...

        def _write_header(self, columns: Any) -> None: ...

    def _replay(self) -> None:
        """Append the episodes that ended in the steps a killed recording's vector recorders
        staged (`log.stage_files`), replayed over the ring it left."""
        stages = list(stages_left(os.path.join(self.directory, RING), self.commit.episodes))
        ring = left(self.directory, self.header.spec) if stages else None
        if ring is None:  # none, or written before the system last booted: lost, as markers are
            return
        for stage in stages:
            chunk = replayers["vector"](stage, ring, self.header)
            if chunk is not None:
                self.append(chunk)

    @holding
    def add_sessions(self, sessions: Any) -> None:
        """Name recording ``sessions`` (`spec.provenance`, each ``first_episode`` as this log
        numbers its episodes, or None: unknown) in the header, rewritten whole."""
        given = list(sessions)
        if given:
            self.header = dataclasses.replace(self.header, sessions=(*self.header.sessions, *given))
            self._write_header(self.columns)

    @holding
    def append_rows(
        self, storage: Storage, rows: Segments | np.ndarray, lengths: np.ndarray, origins: np.ndarray | None = None
    ) -> None:
        """Whole episodes of ``lengths`` and ``origins``, back to back in the ring rows ``rows`` (ranges, or row
        numbers) of ``storage`` (a buffer of this log's layout), as one journal record: their
        stored form (`Stored`), each column read straight from the ring's arrays when the rows
        are one range (else gathered in one piece); a marker naming the rows instead when the
        ring is in files (`marks`). The journal is folded first when due."""
        if (self._records or self.marks.pending) and (
            self._journal.size > JOURNAL_LIMIT or time.monotonic() - self._folded >= self.every
        ):
            self.fold()
        if not isinstance(rows, np.ndarray) and len(rows) > 2:
            rows = segment_rows(rows)
        fields = (*storage.arrays, *storage.chains)
        if fields != self._fields:  # the buffer's fields changed: a field the log lacks yet is added as a chunk's
            stored = Stored(storage, rows, lengths.cumsum() - 1)
            if any(key not in self._tails for key in stored):
                self.append(
                    Chunk(
                        storage.spec, self.header.gamma, self.header.gae_lambda, lengths, tuple(stored.parts()), origins
                    )
                )
                return
            self._fields = fields
            self._direct = Direct(self._plan, storage) if self._plan.matches(storage) else None
        self.origins.put(self.next_episode, origins, len(lengths))  # before the episodes: `log.origins`
        if storage is self.marks.storage:
            self._put(self.marks.marker(self.commit.episodes + self.marks.episodes, rows, lengths))
            self.marks.add(rows, lengths)
            return
        self._record(*self._read(storage, rows, lengths))

    @property
    def next_episode(self) -> int:
        """The log's number of the next episode appended."""
        return self.commit.episodes + self.marks.episodes + sum(r.episodes for r in self._records)

    def mark(self, storage: Storage, lo: int, n: int, origins: np.ndarray | None = None) -> bool:
        """`append_rows` of one episode in the ``n`` ring rows from ``lo`` of a ring in files, by
        its marker alone (an episode's end, most often); False, with nothing done, where
        `append_rows` has more to do (no ring in files, a fold due, fields the log lacks). Its
        caller holds `HOLD`."""
        if (
            storage is not self.marks.storage
            or time.monotonic() - self._folded >= self.every
            or self._journal.size > JOURNAL_LIMIT
            or self._fields != (*storage.arrays, *storage.chains)
        ):
            return False
        self.origins.put(self.next_episode, origins, 1)
        self._put(self.marks.one(self.commit.episodes + self.marks.episodes, lo, n))
        self.marks.add([(lo, lo + n)], np.array([n]))
        return True

    def _read(self, storage: Storage, rows: Segments | np.ndarray, lengths: np.ndarray) -> tuple[Any, ...]:
        """The record-form pieces of episodes of ``lengths`` in ``storage``'s ring rows ``rows``,
        how many, their rows, and each chain's slots."""
        if len(rows) == 1 and not isinstance(rows, np.ndarray):  # one range: read straight where it can
            direct = self._direct
            if direct is None or not direct.current(storage):
                direct = self._direct = Direct(self._plan, storage) if self._plan.matches(storage) else None
            if direct is not None:
                lo, hi = rows[0]
                pieces, counts = direct.read(lo, hi, lengths)
                return pieces, len(lengths), hi - lo, counts
        stored, total = Stored(storage, rows, lengths.cumsum() - 1), int(lengths.sum())
        return [piece for _, piece in self._plan.record_of(stored, lengths, total)], len(lengths), total, added(stored)

    def use_ring(self, storage: Storage) -> None:
        """``storage``'s arrays are in files (`log.ring_files`): its ended episodes go to the journal
        as markers, their rows read from the ring when it is folded."""
        self.fold()
        self.marks = Marks(storage)

    def _record(self, pieces: list[Any], episodes: int, rows: int, slots: tuple[int, ...]) -> None:
        """Write ``pieces`` (a record's body, `journal.record`) to the journal as one record."""
        first = self._records[-1].first + self._records[-1].episodes if self._records else self.commit.episodes
        new, data = record(self._journal.size, first, pieces, episodes, rows, slots)
        self._put(data)
        self._records.append(new)

    def _put(self, data: bytes) -> None:
        """``data`` (a record, a marker) to the journal. If the write fails (a full disk), the
        journal goes back to its last whole record and `BufferSaveError` names it."""
        at = self._journal.size
        try:
            self._journal.put(data)
            if self.fsync == "always":
                self._journal.sync()
        except OSError as exc:
            self._journal.cut(at)
            raise BufferSaveError(
                exc.errno,
                f"cannot append to the episode log ({exc.strerror or exc}; every episode appended before is intact)",
                self._journal.path,
            ) from exc

    def _fold_marked(self, run: list[Record], order: list[Tail]) -> None:
        """Commit the episodes of the markers ``run`` (the first of the journal's records), their
        rows read from the ring files a killed recording left (`ring.left`)."""
        ring = left(self.directory, self.header.spec)
        if ring is None:  # gone with a power loss (or deleted): its episodes are lost
            self._records = [r for r in self._records if not r.mark]
            return
        path, fd = self._journal.path, self._journal.fd
        entries = ((*parse(path, r, os.pread(fd, r.size, r.offset + RECORD_BYTES), ring.rows), 1) for r in run)
        for batch, raw, held in in_records(entries, partial(self._read, ring), self.commit.episodes, FOLD):
            pieces, rows, episodes, slots = parts_of(path, self.columns, batch, self.commit.tails, raw)
            self._commit(zip(order, pieces), rows, episodes, slots)
            self._records = self._records[held:]

    def _fold_ring(self, storage: Storage) -> None:
        """Commit the pending episodes of ``storage`` (a ring in files), each column's rows put
        straight from the ring's arrays (a slice of them, or one gather of its rows), 4 MiB a
        commit."""
        most = max(1, FOLD // sum(c.row_bytes for c in self.columns))
        for rows, lengths, entries in self.marks.batches(most):
            stored, total = Stored(storage, rows, lengths.cumsum() - 1), int(lengths.sum())
            self._commit(self._plan.of(stored, lengths, total, self.commit.tails), total, len(lengths), added(stored))
            self.marks.done(entries, len(lengths))

    @holding
    def fold(self) -> None:
        """Append the episodes the journal holds to the columns (a commit per 4 MiB of them),
        then empty it; synced first when a sync is due (`_maybe_sync`). If a commit fails (a full disk),
        the journal keeps what was not folded and `BufferSaveError` says why; so it does, with
        nothing written, when the sync before failed (`log.syncing`)."""
        self._syncer.check()
        if not self._records and not self.marks.pending:
            return
        order = [self._tails[c.key] for c in [EPISODE_LENGTHS, *self.columns]]
        try:
            for run in batches(self._records):
                if run[0].mark:  # a killed recording's markers: their rows are in the ring it left
                    self._fold_marked(run, order)
                    continue
                pieces, rows, episodes, slots = parts(self.directory, self.columns, run, self.commit.tails)
                self._commit(zip(order, pieces), rows, episodes, slots)
                self._records = self._records[len(run) :]
            if self.marks.storage is not None:
                self._fold_ring(self.marks.storage)
        finally:
            self._folded = time.monotonic()
        self._maybe_sync()  # a fold before rows change (the ring wrapping) may come often: synced as due
        self._journal.cut(0)
