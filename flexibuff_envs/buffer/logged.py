"""The episode log's half of `FlexibleBuffer`: following a log (`log_to`), opening one to
sample (`open`), and closing it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.index import EpisodeIndex, origins
from flexibuff_envs.index.lanes import Episode, Lane
from flexibuff_envs.interrupts import holding
from flexibuff_envs.log import Follower, FsyncPolicy, LogHeader, LogWriter
from flexibuff_envs.log import load as load_log
from flexibuff_envs.log import settle as settle_journal
from flexibuff_envs.log.origins import read_origins
from flexibuff_envs.log.ring_files import into_files
from flexibuff_envs.log.stage_files import Layout, StageFile
from flexibuff_envs.sampling import Half
from flexibuff_envs.spec import provenance
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.compression import Compress
from flexibuff_envs.storage.fields import NEXT

if TYPE_CHECKING:
    from typing_extensions import Self

    from flexibuff_envs.spec import BufferSpec


class Logged(Half):
    """The episode log's half of `FlexibleBuffer`."""

    _ring: list[Lane]
    _log: Follower | None
    _sessions: list[dict[str, Any]]

    if TYPE_CHECKING:  # given by `FlexibleBuffer`

        @classmethod
        def from_spec(cls, spec: BufferSpec, *, num_steps: int, **options: Any) -> Self: ...

        def _forget(self, lane: Lane, episode: Episode) -> None: ...

        def _open(self, lane: Lane, needed: int) -> None: ...

        def compact(self) -> None: ...

        def __len__(self) -> int: ...

    @property
    def sessions(self) -> list[dict[str, Any]]:
        """The recording sessions that wrote this buffer (and, opened from a log, its episodes),
        oldest first, as `flexibuff_envs.spec.provenance` describes them: env id and keywords,
        wrappers, versions, host, process, start time, policy tag, and in a log the number of the
        first episode each recorded. Copies: a recorder adds one with `add_session`."""
        return [dict(s) for s in self._sessions]

    def episode_origins(self) -> dict[str, np.ndarray]:
        """Where each whole ended episode came from, in `episodes`' order (`index.origins`):
        ``seed`` (its env's reset seed, -1 without one), ``follows`` (reset without a seed right
        after its lane's previous episode, every step of which was recorded), ``started``
        (seconds since the epoch), ``session`` (in `sessions`; -1 unknown), ``env`` (a token of
        the env instance recorded), ``lane`` (its sub-env) and ``ordinal`` (the how-manyth
        episode of that lane). Episodes whose origin is unknown (filled by hand without
        `begin_episode`, or read from a log written before origins were kept) have seed -1,
        started NaN, session and lane -1."""
        lanes = self._index.read()
        held = [e.origins if e.whole.all() else e.origins[e.whole] for e in (lane.ended for lane in lanes)]
        return origins.table(np.concatenate(held) if held else np.zeros(0, origins.ORIGIN))

    @holding
    def add_session(self, session: dict[str, Any]) -> int:
        """Keep ``session`` (`provenance.session`: a recorder begins writing this buffer), and name
        it in the log the buffer appends to, as the session of the episodes appended from now on.
        Returns its number."""
        (checked,) = provenance.sessions([dict(session)], "session")
        self._index.read()  # staged steps written first: the episodes they began keep the session before
        if self._log is not None:  # the log numbers its episodes; a ring forgets its oldest: its copy is unnumbered
            writer = self._log.writer
            writer.add_sessions([{**checked, "first_episode": writer.next_episode}])
            checked = {**checked, "first_episode": None}
        self._sessions.append(checked)
        return len(self._sessions) - 1

    @holding
    def log_to(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "interval",
        every: float = 5.0,
        per_block: bool = False,
        compress: Compress = "auto",
    ) -> None:
        """Append every whole episode that ends in this buffer from now on (recorded, or added by
        `extend`) to the episode log ``directory``, made or continued (`flexibuff_envs.log`).

        An episode is handed to the OS in the step it ends: a process killed after that loses none
        of it. A buffer no recorder has written to yet (as `fe.record(..., log=DIR)` makes one)
        keeps its ring in files of ``DIR/ring/`` from now on, so an episode's end writes a marker
        naming its rows to the log's journal; any other (or with ``fsync="always"``) writes its
        rows, as one record. The journal is folded into the log's columns every ``every``
        seconds, at `sync_log` and `close_log`, and before rows of an episode not yet folded
        change. ``fsync`` ("interval": every ``every`` seconds, on a thread of its own while the
        recording goes on; "always": each record too; "close") says when episodes reach the disk
        itself. A vector recorder of a ring in files hands its
        ended episodes over with its block of staged steps (up to 256 vector steps later), its
        stage a file of ``DIR/ring/`` that the next to open the log replays after a kill
        (`log.stage_files`); of a ring in RAM, in the step they end. ``per_block``: there too with its
        block (a kill then loses those), which spares a fast vector env the cost of a write in
        every step where one of its sub-envs ends an episode.
        ``compress``: which columns the log keeps as zstd frames, a row (an agent's row) each
        (`LogWriter`): "auto" (observations and states of images), ``{field: "zstd"}``, or None.

        Raises:
            BufferFileError: ``directory`` holds a log of another layout, or a damaged one.
        """
        if self._log is not None:
            raise InvalidArgumentError(f"this buffer already logs to {self._log.writer.directory}; close_log() first")
        header = LogHeader(self.spec, self.gamma, self.gae_lambda)
        writer = LogWriter(directory, header, fsync=fsync, every=every, compress=compress)
        # the episodes it appends from now on: a dataset's own numbering kept while none is held yet
        # an empty buffer's sessions (a dataset read in) keep their numbering, shifted; else the newest
        # session records the episodes appended from now on, and which episodes the others did is unknown
        base, fresh, newest = writer.next_episode, not len(self), len(self._sessions) - 1
        first_session = len(writer.header.sessions)  # the log's number of this buffer's session 0
        writer.add_sessions(
            [
                {**s, "first_episode": base + s["first_episode"] if s["first_episode"] is not None else None}
                if fresh
                else {**s, "first_episode": base if k == newest else None}
                for k, s in enumerate(self._sessions)
            ]
        )
        self._log = Follower(writer, self._index.read(), per_block=per_block, first_session=first_session)
        # no recorder writes to it yet: its ring goes in files, an episode's end a marker ("always"
        # syncs each episode's rows with it: records)
        if fsync != "always" and into_files(self._store, writer.directory):
            writer.use_ring(self._store)

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, mmap: bool = True, settle: bool = True) -> Self:
        """Every whole episode of the episode log ``directory`` (a torn tail is left out), in a
        buffer that samples them in every mode, batches laid out as any buffer's. Episodes a
        killed recording left in the log's journal are folded into its columns first (unless a
        writer has the log open, or the directory cannot be written: they are left out then).

        With ``mmap`` (the default) each column of the log is mapped, not read: opening reads
        only the few bytes per row that sampling uses as indices or flags (to check them), a
        batch reads the rows it touches, and a log larger than memory samples in place. Changes
        (priorities, weights, rows recorded on) stay in memory, copy-on-write, never in the log.
        ``mmap=False`` reads every column into memory. ``settle=False`` writes nothing: episodes
        left in the journal are left out (a reader that must not change the log: ``view``).

        Raises:
            BufferFileError: ``directory`` is not an episode log, or a damaged one.
        """
        if settle:
            settle_journal(os.fspath(directory))
        logged = load_log(directory, mmap=mmap)
        probs = logged.arrays.get(("continuous_log_probs", None))
        width = probs.shape[-1] if probs is not None and probs.ndim == 3 else 0
        buffer = cls.from_spec(
            dataclasses.replace(logged.header.spec, n_envs=1),
            num_steps=1,
            gamma=logged.header.gamma,
            gae_lambda=logged.header.gae_lambda,
            log_prob_continuous=width,
            global_reward=False,
            individual_reward=False,
        )
        buffer._sessions = list(logged.header.sessions)
        rows = logged.rows
        if rows:  # one lane, as long as the log, holding its episodes back to back
            buffer.num_steps = rows
            buffer._store = Storage(buffer.spec, rows, log_prob_continuous=width)
            buffer._store.adopt(logged.arrays)
            buffer._index = EpisodeIndex(1, rows, buffer.spec.n_agents, buffer._forget, buffer._open)
            buffer._ring = buffer._index.ring
            buffer._store.open(0, [(0, rows)], fill=False)
            ends = np.cumsum(logged.lengths)
            ended = np.stack([ends - logged.lengths, ends, np.ones_like(ends)], axis=1)
            origins = read_origins(os.fspath(directory), len(ends), len(buffer._sessions))
            buffer._index.ring[0].restore(rows, 0, ended, None, [0] * buffer.spec.n_agents, origins)
        return buffer

    @classmethod
    def from_log(cls, directory: str | os.PathLike[str]) -> Self:
        """`open` ``directory`` with every column read into memory."""
        return cls.open(directory, mmap=False)

    @property
    def logging(self) -> bool:
        """Whether ended episodes go to an episode log (`log_to`)."""
        return self._log is not None

    @property
    def logging_each_step(self) -> bool:
        """Whether ended episodes go to an episode log in the step they end (`log_to`)."""
        return self._log is not None and not self._log.per_block

    def sync_log(self) -> None:
        """Everything logged so far to the disk itself (nothing when no log is kept)."""
        if self._log is not None:
            self._log.writer.sync()

    @holding
    def close_log(self) -> tuple[int, int]:
        """Sync and close the episode log; ended episodes go to none from now on. Returns the
        episodes and rows appended to it since `log_to` ((0, 0) when no log was kept)."""
        if self._log is None:
            return 0, 0
        self._log.writer.close()
        appended, self._log = (self._log.episodes, self._log.rows), None
        return appended

    def _flush_log(self, lanes: Sequence[int] | None = None) -> None:
        """The episodes that ended since the last flush to the log (in every lane, or in the
        lanes ``lanes``; lanes as they stand)."""
        if self._log is not None:
            if not self._store.arrays.keys().isdisjoint(NEXT):  # next values filled in by hand
                self.compact()  # the log stores them as a buffer's ring does: chained
            self._log.flush(self._store, self._index.ring, lanes)

    def _stage_file(self, layout: Layout, lanes: list[int]) -> StageFile | None:
        """`Writer.stage_file`."""
        return None if self._log is None else self._log.writer.stage(layout, lanes)

    def _settle_log(self, rows: np.ndarray | slice | None = None) -> None:
        """Rows of ended episodes are about to change (forgotten, compacted, fed back, handed out
        to fill; ``rows``, where known): when the ring is in files, the log's pending episodes
        are folded first if one may hold them, so it holds each as it ended."""
        if self._log is None:
            return
        marks = self._log.writer.marks
        if marks.pending if rows is None else marks.touches(rows):
            self._log.writer.fold()

    def _log_ended(
        self,
        which: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        rows: np.ndarray,
        whole: np.ndarray,
        origins: np.ndarray,
    ) -> None:
        """The episodes of ``origins`` that ended at positions ``[starts, ends)`` of the lanes
        ``which`` (lane by lane, each in time order; ``rows``: theirs; ``whole``: none of their
        rows forgotten) to the log (`Follower.flush_spans`)."""
        if self._log is not None:
            self._log.flush_spans(self._store, self._index.ring, which, starts, ends, rows, whole, origins)
