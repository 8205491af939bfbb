"""Appending a whole episode log to another (`LogWriter.absorb`; `log.manage.merge`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from flexibuff_envs.errors import BufferFileError, SpecMismatchError
from flexibuff_envs.files.chunk import check_layout
from flexibuff_envs.log.append_window import Tail
from flexibuff_envs.log.compressed import spans
from flexibuff_envs.log.format import CHAINS, EPISODE_LENGTHS, PIECE
from flexibuff_envs.log.origins import read_origins
from flexibuff_envs.log.read import blocks, check_values, state_of
from flexibuff_envs.log.summaries import read_summaries
from flexibuff_envs.spec import provenance

if TYPE_CHECKING:
    from flexibuff_envs.log.writer import LogWriter


def absorb(self: LogWriter, source: str) -> None:
    """`LogWriter.absorb`."""
    state = state_of(source)
    check_values(state)
    if state.header != self.header:
        check_layout(self.header.spec, state.header.spec, f"the episode log {state.directory}")
        raise BufferFileError(
            f"{state.directory}: its discounts (gamma {state.header.gamma}, gae_lambda "
            f"{state.header.gae_lambda}) differ from the log's ({self.header.gamma}, "
            f"{self.header.gae_lambda})"
        )
    for column in state.columns:
        mine = next((c for c in self.columns if c.key == column.key), column)
        if (mine.dtype, mine.shape, mine.per_agent) != (column.dtype, column.shape, column.per_agent):
            raise SpecMismatchError(
                f"{state.path(column)} holds rows of {column.shape} {column.dtype}; the "
                f"log's are {mine.shape} {mine.dtype}"
            )
    if not state.commit.episodes:
        return
    base = self.next_episode  # a log that names none: recorded by sessions not kept
    theirs_ = state.header.sessions or (provenance.unknown(),)
    origins = read_origins(state.directory, state.commit.episodes, len(state.header.sessions))
    origins["session"] = np.where(origins["session"] >= 0, origins["session"] + len(self.header.sessions), -1)
    self.add_sessions(
        [{**s, "first_episode": None if s["first_episode"] is None else base + s["first_episode"]} for s in theirs_]
    )
    if any(c.key not in self._tails for c in state.columns):
        self._add([c for c in state.columns if c.key not in self._tails])
    theirs = {c.key: c for c in state.files}
    shift = {name: self.commit.tails[k] - 1 for k, name in enumerate(CHAINS)}

    def pieces() -> Iterator[tuple[Tail, np.ndarray]]:
        for column in [EPISODE_LENGTHS, *self.columns]:
            if column.key not in theirs:  # a field the source's buffer lacked: its allocated value
                if column.part != "tail":
                    row = np.full(column.shape, self._fills[column.key], column.dtype).tobytes()
                    for lo, hi in spans(state.commit.rows, PIECE // max(1, len(row))):
                        yield self._tails[column.key], np.frombuffer(row * (hi - lo), np.uint8)
                continue
            first = 1 if column.part == "tail" else 0  # slot 0 is the log's own
            for block in blocks(state, theirs[column.key], state.commit.count(column), first):
                if column.part == "index":
                    block = np.where(block > 0, block + np.int32(shift[column.name]), block)
                yield self._tails[column.key], block

    added = tuple(state.commit.tails[k] - 1 for k in range(len(CHAINS)))
    self.fold()
    first = self.commit.episodes
    self.origins.put(first, origins, len(origins))
    self.summaries.on = False  # the source's own are copied, or made when the log is next opened to write
    try:
        self._commit(pieces(), state.commit.rows, state.commit.episodes, added)
    finally:
        self.summaries.on = True
    theirs_summaries = read_summaries(state.directory, state.commit.episodes, state.header.spec.n_agents)
    if theirs_summaries is not None:
        self.summaries.file.put(first, theirs_summaries, state.commit.episodes)
    else:  # a source older than summaries: made from its rows, now in this log
        self.summaries.fill()
    self._maybe_sync()
