"""Following a buffer: its ended episodes appended to an episode log as they end
(`flexibuff_envs.log`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from flexibuff_envs.index.lanes import Lane, span_rows
from flexibuff_envs.log.writer import LogWriter
from flexibuff_envs.storage import Storage


class Follower:
    """Appends to ``writer`` every whole episode that ends in ``lanes`` from now on: `flush`
    after episodes end writes those that ended since the last flush to the log's journal
    (`LogWriter.append_rows`): one record of their rows, or a marker naming them where the ring is
    in files."""

    def __init__(
        self, writer: LogWriter, lanes: Sequence[Lane], *, per_block: bool = False, first_session: int = 0
    ) -> None:
        self.writer = writer
        # the log's number of the buffer's session 0: a continued log's sessions come first
        self.first_session = first_session
        self.per_block = per_block  # a vector recorder flushes with its blocks, not in each step
        self.outgrown = False  # an episode longer than the ring was left out (said once)
        self._after = np.array(
            [lane.written for lane in lanes], dtype=np.int64
        )  # per lane: episodes ending later are new
        self.episodes = self.rows = 0  # appended so far

    def flush(self, storage: Storage, lanes: Sequence[Lane], which: Sequence[int] | None = None) -> None:
        """Append the episodes that ended since the last flush in ``lanes`` (or in ``lanes[i]``
        for ``i`` in ``which``: where episodes ended)."""
        if which is not None and len(which) == 1 and self._newest(storage, lanes, which[0]):
            return
        segments: list[tuple[int, int]] = []
        lengths: list[int] = []
        origins: list[np.ndarray] = []
        marks: list[tuple[int, int]] = []  # taken on only once the episodes are appended: a failed append is retried
        for i in range(len(lanes)) if which is None else which:
            lane, after = lanes[i], self._after[i]
            ended = lane.ended
            ends = ended.ends
            n = ends.size
            if not n or ends[-1] <= after:
                continue
            if n == 1 or ends[-2] <= after:  # most often the newest alone ended since
                newest = ended[-1]
                if newest.whole:
                    self._add(segments, lane.segments(newest.start, newest.end))
                    lengths.append(newest.end - newest.start)
                    origins.append(ended.origins[-1:])
                else:
                    self._outgrown(lane)
                marks.append((i, newest.end))
                continue
            new = int(np.searchsorted(ends, after, side="right"))
            starts, ends, whole = ended.starts[new:], ends[new:], ended.whole[new:]
            origins.append(ended.origins[new:][whole])
            if whole.all() and (starts[1:] == ends[:-1]).all():  # back to back: one span of the ring
                self._add(segments, lane.segments(int(starts[0]), int(ends[-1])))
                lengths.extend((ends - starts).tolist())
            else:
                for start, end in zip(starts[whole].tolist(), ends[whole].tolist()):
                    self._add(segments, lane.segments(start, end))
                    lengths.append(end - start)
                if not whole.all():
                    self._outgrown(lane)
            marks.append((i, int(ends[-1])))
        if lengths:
            self.writer.append_rows(storage, segments, np.array(lengths, dtype=np.int64), self._numbered(origins))
            self.episodes += len(lengths)
            self.rows += sum(lengths)
        for i, mark in marks:
            self._after[i] = mark

    def _newest(self, storage: Storage, lanes: Sequence[Lane], i: int) -> bool:
        """`flush` of lane ``i`` when the newest of its episodes alone ended since, whole, in
        one range of the ring (a recorder's episode end, most often); whether it was."""
        lane = lanes[i]
        before, start, end, whole = lane.ended.newest()
        after = self._after.item(i)
        first, n = start % lane.capacity, end - start
        if not (before <= after < end and whole and first + n <= lane.capacity):
            return end <= after  # nothing new: done
        lo = lane.offset + first
        origins = self._numbered([lane.ended.origins[-1:]])
        if not self.writer.mark(storage, lo, n, origins):
            self.writer.append_rows(storage, [(lo, lo + n)], np.array([n]), origins)
        self._after[i] = end
        self.episodes += 1
        self.rows += n
        return True

    def flush_spans(
        self,
        storage: Storage,
        lanes: Sequence[Lane],
        which: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        rows: np.ndarray,
        whole: np.ndarray,
        origins: np.ndarray,
    ) -> None:
        """`flush` for the episodes of ``origins`` known to have ended at positions ``[starts,
        ends)`` of ``lanes[which]`` (a vector recorder's, lane by lane, each in time order;
        ``rows``: their buffer rows; ``whole``: none of their rows forgotten): the same record,
        in a fixed number of array operations however many lanes."""
        keep = ends > self._after[which]  # not appended yet
        if not whole[keep].all():
            self._outgrown(lanes[int(which[np.argmin(whole | ~keep)])])
        keep &= whole
        if not keep.all():  # seldom: the rows of those kept
            which, starts, ends, origins = which[keep], starts[keep], ends[keep], origins[keep]
            rows = span_rows(np.array([lanes[i].offset for i in which.tolist()]), lanes[0].capacity, starts, ends)
        if not which.size:
            return
        lengths = ends - starts
        self.writer.append_rows(storage, rows, lengths, self._numbered([origins]))
        np.maximum.at(self._after, which, ends)
        self.episodes += len(lengths)
        self.rows += int(lengths.sum())

    def _numbered(self, origins: list[np.ndarray]) -> np.ndarray:
        """``origins`` (the buffer's) with their sessions numbered as the log numbers them."""
        out = np.concatenate(origins)
        if self.first_session:
            out["session"] = np.where(out["session"] >= 0, out["session"] + self.first_session, -1)
        return out

    @staticmethod
    def _add(segments: list[tuple[int, int]], ranges: list[tuple[int, int]]) -> None:
        """Ring ranges after ``segments``, the first joined to the last one where it follows it."""
        lo, hi = ranges[0]
        if segments and segments[-1][1] == lo:  # the episode before ended here
            segments[-1] = (segments[-1][0], hi)
        else:
            segments.append((lo, hi))
        segments.extend(ranges[1:])

    def _outgrown(self, lane: Lane) -> None:
        """Say once that an episode was left out: its first rows were forgotten before it ended."""
        if not self.outgrown:
            self.outgrown = True
            warnings.warn(
                f"an episode outgrew the buffer's {lane.capacity:,} rows per lane and is not in the "
                f"episode log {self.writer.directory} (nor is any other that does): give the "
                "buffer more rows than the longest episode",
                RuntimeWarning,
                stacklevel=3,
            )
