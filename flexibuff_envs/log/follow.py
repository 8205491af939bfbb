"""Following a buffer: its ended episodes appended to an episode log as they end
(`flexibuff_envs.log`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from flexibuff_envs.episodes import Lane
from flexibuff_envs.log.write import LogWriter
from flexibuff_envs.storage import Storage


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
            lane, after = lanes[i], self._after[i]
            ended = lane.ended
            ends = ended.ends
            n = ends.size
            if not n or ends[-1] <= after:
                continue
            # the episodes that ended after ``after``: most often the newest alone
            new = n - 1 if n == 1 or ends[-2] <= after else int(np.searchsorted(ends, after, side="right"))
            for start, end, whole in zip(ended.starts[new:].tolist(), ends[new:].tolist(), ended.whole[new:].tolist()):
                if whole:
                    for lo, hi in lane.segments(start, end):
                        if segments and segments[-1][1] == lo:  # the episode before ended here
                            lo = segments.pop()[0]
                        segments.append((lo, hi))
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
            marks[i] = int(ends[-1])
        if not lengths:
            self._after = marks
            return
        self.writer.append_rows(storage, segments, np.array(lengths))
        self._after = marks
        self.episodes += len(lengths)
        self.rows += sum(lengths)
