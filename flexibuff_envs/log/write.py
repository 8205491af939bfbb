"""Writing an episode log: appending chunks and whole logs, following a buffer's ended episodes,
merging logs (`flexibuff_envs.log`)."""

from __future__ import annotations

import os
import time
import warnings
import weakref
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

from flexibuff_envs.chunk import Chunk, check_layout
from flexibuff_envs.episodes import Lane
from flexibuff_envs.errors import (
    BufferFileError,
    BufferSaveError,
    InvalidArgumentError,
    SpecMismatchError,
)
from flexibuff_envs.interrupts import holding
from flexibuff_envs.log.format import (
    CHAINS,
    COMMITS,
    EPISODE_LENGTHS,
    HEADER,
    PIECE,
    Column,
    Commit,
    FsyncPolicy,
    LogHeader,
    LogReport,
    header_bytes,
    is_log,
)
from flexibuff_envs.log.read import (
    State,
    blocks,
    check_values,
    repaired,
    report,
    spans,
    state_of,
    sync_file,
)
from flexibuff_envs.storage import NEXT, Storage


class LogWriter:
    """Appends chunks of whole episodes to the log ``directory`` (made if missing).

    An existing log is continued: its layout must match, a torn tail is cut first, and nothing
    else already there is rewritten. Each `append` hands its rows to the OS before it returns: a
    process killed (SIGKILL) after that loses none of its episodes. ``fsync`` says when they
    reach the disk itself, which is what survives a power loss: "interval" (at the first append
    ``every`` seconds after the last sync; the default), "always" (every append), "close" (only
    at `close`).

    One writer appends to a log at a time (two would interleave their rows).

    Raises:
        BufferFileError: the directory holds a log of another layout, or a damaged one.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        header: LogHeader,
        *,
        fsync: FsyncPolicy = "interval",
        every: float = 5.0,
    ) -> None:
        if fsync not in ("interval", "always", "close"):
            raise InvalidArgumentError(f"fsync must be 'interval', 'always' or 'close', got {fsync!r}")
        self.directory = os.fspath(directory)
        self.header = header
        self.fsync, self.every = fsync, float(every)
        os.makedirs(self.directory, exist_ok=True)
        if is_log(self.directory):
            state = repaired(self.directory)
            if state.header != header:
                check_layout(state.header.spec, header.spec, f"the episode log {self.directory}")
                raise BufferFileError(
                    f"{self.directory}: the log's discounts (gamma {state.header.gamma}, "
                    f"gae_lambda {state.header.gae_lambda}) differ from the recording's "
                    f"({header.gamma}, {header.gae_lambda})"
                )
        else:
            state = State(self.directory, header, [], Commit())
            self._write_header([])
        listed = {c.file for c in state.files} | {HEADER, COMMITS}
        for name in os.listdir(self.directory):  # a column a kill caught before the header named it
            if name.endswith((".col", ".new")) and name not in listed:
                os.unlink(os.path.join(self.directory, name))
        self.columns, self.commit = state.columns, state.commit
        probe = Storage(header.spec, 1)
        self._fills = {
            (name, part): 0 if part is not None else probe.fill(name)
            for name, part in [(name, None) for name in probe.fields] + [(name, "index") for name in NEXT]
        }
        self._files = {c.key: self._append_to(c.file) for c in state.files}
        self._sizes = {key: os.fstat(target.fileno()).st_size for key, target in self._files.items()}
        self._commits = self._append_to(COMMITS)
        self._synced = time.monotonic()
        # a writer dropped unclosed (its buffer collected) still lets go of its files
        self._finalizer = weakref.finalize(self, _close, self._files, self._commits)

    def _append_to(self, name: str) -> Any:
        return open(os.path.join(self.directory, name), "ab", buffering=0)

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
        there: its allocated value (a next value: slot 0, zeros)."""
        for column in columns:
            with open(os.path.join(self.directory, column.file), "wb") as out:
                if column.part == "tail":
                    out.write(bytes(column.row_bytes))  # slot 0
                elif self._fills[column.key]:
                    row = np.full(column.shape, self._fills[column.key], dtype=column.dtype).tobytes()
                    per_piece = max(1, PIECE // len(row))
                    out.writelines(
                        row * min(per_piece, self.commit.rows - lo) for lo in range(0, self.commit.rows, per_piece)
                    )
                else:  # zeros: the file system stores none of them
                    out.truncate(self.commit.rows * column.row_bytes)
                out.flush()
                os.fsync(out.fileno())
        self._write_header([*self.columns, *columns])
        self.columns = [*self.columns, *columns]
        for column in columns:
            self._files[column.key] = self._append_to(column.file)
            self._sizes[column.key] = os.fstat(self._files[column.key].fileno()).st_size

    def _pieces(self, chunk: Chunk) -> dict[tuple[str, str | None], np.ndarray]:
        """Each column's bytes for ``chunk``: rows laid out as the files hold them, next-value
        slots renumbered to follow the log's."""
        given = {part.key: part.whole() for part in chunk.parts}
        for name, part in given:
            if part is not None and (name, "tail" if part == "index" else "index") not in given:
                raise InvalidArgumentError(f"the chunk's next-value field {name!r} needs both its index and tail parts")
        if given.keys() - self._files.keys():
            self._add([Column.of(part) for part in chunk.parts if part.key not in self._files])
        out = {EPISODE_LENGTHS.key: np.ascontiguousarray(chunk.lengths, dtype=EPISODE_LENGTHS.dtype)}
        for column in self.columns:
            array = given.get(column.key)
            if array is None:  # a field the chunk's buffer lacks: its allocated value (a next value: slot 0)
                if column.part != "tail":
                    out[column.key] = np.full((chunk.rows, *column.shape), self._fills[column.key], column.dtype)
                continue
            if column.per_agent and column.part != "tail":  # the file holds each row's agents together
                array = array.swapaxes(0, 1)
            if array.shape[1:] != column.shape or array.dtype != column.dtype:
                raise SpecMismatchError(
                    f"the chunk's {column.file} rows are {array.shape[1:]} {array.dtype}; "
                    f"the log's are {column.shape} {column.dtype}"
                )
            if column.part == "tail":
                array = array[1:]  # slot 0 (zeros) is the log's own
            elif column.part == "index":
                tails = self.commit.tails[CHAINS.index(column.name)]
                array = np.where(array > 0, array + np.int32(tails - 1), array)
            out[column.key] = np.ascontiguousarray(array)
        return out

    @holding  # a Ctrl-C between two of its writes would leave rows no commit counts before the next
    def append(self, chunk: Chunk) -> None:
        """Write ``chunk``'s episodes to every column, then commit them (nothing for an empty chunk)."""
        if not chunk.n_episodes:
            return
        if chunk.spec is not self.header.spec:  # a chunk from this log's own buffer has its layout
            check_layout(self.header.spec, chunk.spec, "the chunk")
        pieces = self._pieces(chunk)
        added = tuple(len(pieces.get((name, "tail"), ())) for name in CHAINS)
        self._commit(
            ((key, piece.data.cast("B")) for key, piece in pieces.items()), chunk.rows, chunk.n_episodes, added
        )

    @holding
    def absorb(self, source: str | os.PathLike[str]) -> None:
        """Append every whole episode of the log ``source`` (of this layout and discounts) as one
        commit: each of its bytes is read once and written once, in pieces of at most 16 MiB, next
        values renumbered to follow this log's."""
        state = state_of(os.fspath(source))
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
            if mine != column:
                raise SpecMismatchError(
                    f"{state.path(column)} holds rows of {column.shape} {column.dtype}; the "
                    f"log's are {mine.shape} {mine.dtype}"
                )
        if not state.commit.episodes:
            return
        if any(c.key not in self._files for c in state.columns):
            self._add([c for c in state.columns if c.key not in self._files])
        theirs = {c.key: c for c in state.files}
        shift = {name: self.commit.tails[k] - 1 for k, name in enumerate(CHAINS)}

        def pieces() -> Iterator[tuple[tuple[str, str | None], Any]]:
            for column in [EPISODE_LENGTHS, *self.columns]:
                if column.key not in theirs:  # a field the source's buffer lacked: its allocated value
                    if column.part != "tail":
                        row = np.full(column.shape, self._fills[column.key], column.dtype).tobytes()
                        for lo, hi in spans(state.commit.rows, PIECE // max(1, len(row))):
                            yield column.key, row * (hi - lo)
                    continue
                first = 1 if column.part == "tail" else 0  # slot 0 is the log's own
                for block in blocks(state, column, state.commit.count(column), first):
                    if column.part == "index":
                        block = np.where(block > 0, block + np.int32(shift[column.name]), block)
                    yield column.key, block.data.cast("B")

        added = tuple(state.commit.tails[k] - 1 for k in range(len(CHAINS)))
        self._commit(pieces(), state.commit.rows, state.commit.episodes, added)

    def _commit(
        self, pieces: Iterable[tuple[tuple[str, str | None], Any]], rows: int, episodes: int, added: tuple[int, ...]
    ) -> None:
        """Write ``pieces`` (column key, bytes) in order, then the commit entry counting ``rows``,
        ``episodes`` and each chain's ``added`` slots. If a write fails (a full disk), every file
        goes back to the last commit and `BufferSaveError` names the one that failed."""
        commit = Commit(
            self.commit.number + 1,
            self.commit.rows + rows,
            self.commit.episodes + episodes,
            tuple(t + n for t, n in zip(self.commit.tails, added)),
        )
        crc = 0
        sizes = dict(self._sizes)
        target = self._commits
        try:  # unbuffered: each piece is with the OS when written (a killed process loses nothing appended)
            for key, piece in pieces:
                target = self._files[key]
                crc = _write(target, memoryview(piece), crc)
                sizes[key] += memoryview(piece).nbytes
            target = self._commits
            _write(target, memoryview(commit.entry(crc)), 0)
        except BaseException as exc:  # a full disk, or a source that cannot be read: back to the last commit
            for key, size in self._sizes.items():
                os.ftruncate(self._files[key].fileno(), size)
            if isinstance(exc, OSError):
                raise BufferSaveError(
                    exc.errno,
                    f"cannot append to the episode log ({exc.strerror or exc}; every "
                    "episode appended before is intact)",
                    str(target.name),
                ) from exc
            raise
        self._sizes = sizes
        self.commit = commit
        if self.fsync == "always" or (self.fsync == "interval" and time.monotonic() - self._synced >= self.every):
            self.sync()

    def sync(self) -> None:
        """Everything appended so far to the disk itself (the rows first, then the commits)."""
        for target in self._files.values():
            os.fsync(target.fileno())
        os.fsync(self._commits.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        """Sync and close (appending again needs a new writer)."""
        if not self._commits.closed:
            self.sync()
            self._finalizer()


def _close(files: dict[Any, BinaryIO], commits: BinaryIO) -> None:
    for target in [*files.values(), commits]:
        target.close()


def _write(target: BinaryIO, view: memoryview, crc: int) -> int:
    """Write all of ``view``; returns ``crc`` carried over it."""
    crc = zlib.crc32(view, crc)
    while view:
        view = view[target.write(view) :]
    return crc


class Follower:
    """Appends to ``writer`` every whole episode that ends in ``lanes`` from now on: `flush`
    after episodes end writes those that ended since the last flush, as one commit, straight
    from the ring's rows."""

    def __init__(self, writer: LogWriter, lanes: Sequence[Lane], *, per_block: bool = False) -> None:
        self.writer = writer
        self.per_block = per_block  # a vector recorder flushes with its blocks, not in each step
        self.outgrown = False  # an episode longer than the ring was left out (said once)
        self._after = [lane.written for lane in lanes]  # per lane: episodes ending later are new
        self.episodes = self.rows = 0  # appended so far

    def flush(self, storage: Storage, lanes: Sequence[Lane], which: Sequence[int] | None = None) -> None:
        """Append the episodes that ended since the last flush in ``lanes`` (or in ``lanes[i]``
        for ``i`` in ``which``: where episodes ended)."""
        segments: list[tuple[int, int]] = []
        lengths: list[int] = []
        marks = list(self._after)  # taken on only once the episodes are appended: a failed append is retried
        for i in range(len(lanes)) if which is None else which:
            lane = lanes[i]
            ended = lane.ended
            if not len(ended) or ended[-1].end <= self._after[i]:
                continue
            new = slice(int(np.searchsorted(ended.ends, self._after[i], side="right")), None)
            for start, end, whole in zip(
                ended.starts[new].tolist(), ended.ends[new].tolist(), ended.whole[new].tolist()
            ):
                if whole:
                    segments += lane.segments(start, end)
                    lengths.append(end - start)
                elif not self.outgrown:  # its first rows were forgotten before it ended
                    self.outgrown = True
                    warnings.warn(
                        f"an episode outgrew the buffer's {lane.capacity:,} rows per lane and is not in the "
                        f"episode log {self.writer.directory} (nor is any other that does): give the "
                        "buffer more rows than the longest episode",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            marks[i] = ended[-1].end
        if not lengths:
            self._after = marks
            return
        header = self.writer.header
        parts = storage.export(segments, np.cumsum(lengths) - 1)
        self.writer.append(Chunk(storage.spec, header.gamma, header.gae_lambda, np.array(lengths), tuple(parts)))
        self._after = marks
        self.episodes += len(lengths)
        self.rows += sum(lengths)


def merge(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> LogReport:
    """Append every whole episode of the logs ``sources``, in order, to the log ``out`` (made,
    or continued when it holds a log of the same layout and discounts): one commit per source,
    so a merge cut short by a kill leaves ``out`` with the sources before it, whole. A source's
    torn tail is left out; the sources are only read.

    Raises:
        BufferFileError: a source is not an episode log, is damaged, or differs from the others
            in layout or discounts; or ``out`` is one of them.
        BufferSaveError: ``out`` cannot be written (a full disk: it keeps what it held).
    """
    paths = [os.fspath(source) for source in sources]
    if not paths:
        raise InvalidArgumentError("merge: give at least one episode log to merge")
    target = os.path.realpath(out)
    for path in paths:
        if os.path.realpath(path) == target:
            raise BufferFileError(f"{path}: a log cannot be merged into itself")
    headers = [state_of(path).header for path in paths]
    for path, header in zip(paths, headers):
        if header != headers[0]:
            check_layout(headers[0].spec, header.spec, f"the episode log {path}")
            raise BufferFileError(
                f"{path}: its discounts (gamma {header.gamma}, gae_lambda {header.gae_lambda}) differ from {paths[0]}'s"
            )
    writer = LogWriter(out, headers[0], fsync="close")
    try:
        for path in paths:
            writer.absorb(path)
    finally:
        writer.close()
    return report(out)
