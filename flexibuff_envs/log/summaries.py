"""An episode log's summaries: ``summaries.fblog``, one record per episode of what the browser's
table shows of it (each agent's return, the team's, how it ended, agents that died before it
ended), written with each commit from the rows it commits (`LogWriter`), so that a log of
hundreds of millions of rows opens reading a few bytes an episode.

A summary is derived from the rows: a log without them (written before they were kept, merged
from one that lacked them, or killed between a commit and its summaries) is summed from its rows
instead, as it always could be. A record that was never written reads as zeros, whose ``known``
is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.log.origins import RecordFile, read_records
from flexibuff_envs.log.read import load
from flexibuff_envs.storage.packed import Packed

SUMMARIES = "summaries.fblog"
#: the columns a summary is made of
SUMMED = ("individual_rewards", "global_rewards", "terminated", "truncated")


def dtype_of(n_agents: int) -> np.dtype:
    """A summary record of a log of ``n_agents`` agents."""
    return np.dtype(
        [("returns", "<f8", (n_agents,)), ("team", "<f8"), ("deaths", "<u4"), ("ended", "u1"), ("known", "u1")]
    )


def summed(column: Any) -> bool:
    """Whether a commit's pieces of ``column`` (a log's) go into its summaries: its lengths and the
    raw columns of `SUMMED`."""
    return column.name == "lengths" or (column.name in SUMMED and column.part is None and column.codec is None)


class SummariesFile(RecordFile):
    """``summaries.fblog`` of the log ``directory``, open to write."""

    def __init__(self, directory: str, n_agents: int, episodes: int) -> None:
        super().__init__(directory, SUMMARIES, dtype_of(n_agents), episodes)


def summarize(lengths: np.ndarray, rows: Mapping[str, np.ndarray], n_agents: int) -> np.ndarray:
    """The summaries of episodes of ``lengths``, back to back in ``rows`` (each of `SUMMED` a log
    holds, laid out as a buffer's: ``[n_agents, rows]`` or ``[rows]``), as the browser sums them
    (`view.data.Run`): in float64, over each episode's rows in order."""
    out = np.zeros(len(lengths), dtype_of(n_agents))
    if not len(lengths):
        return out
    firsts = np.cumsum(lengths) - lengths
    last = firsts + lengths - 1
    returns = np.add.reduceat(rows["individual_rewards"], firsts, axis=1, dtype=np.float64)
    out["returns"] = returns.T
    team = rows.get("global_rewards")
    out["team"] = returns.sum(axis=0) if team is None else np.add.reduceat(team, firsts, dtype=np.float64)
    terminated, truncated = rows["terminated"], rows["truncated"]
    out["ended"] = np.where(terminated[:, last].any(axis=0), 0, np.where(truncated[:, last].any(axis=0), 1, 2))
    died = np.add.reduceat(terminated, firsts, axis=1, dtype=np.float64) - terminated[:, last]
    out["deaths"] = died.sum(axis=0)
    out["known"] = 1
    return out


def rows_of(
    pieces: Mapping[str, list[np.ndarray]], dtypes: Mapping[str, np.dtype], n_agents: int
) -> dict[str, np.ndarray]:
    """The rows of each of `SUMMED` from a commit's pieces (as its file lays them out: each row's
    agents together), laid out as `summarize` takes them."""
    out = {}
    for name, parts in pieces.items():
        flat = np.concatenate([np.frombuffer(p, dtypes[name]) for p in parts])
        out[name] = flat if name == "global_rewards" else flat.reshape(-1, n_agents).T
    return out


def read_summaries(directory: str, episodes: int, n_agents: int) -> np.ndarray | None:
    """The summaries of the log ``directory``'s ``episodes``, or None unless it holds every one."""
    records, held = read_records(directory, SUMMARIES, dtype_of(n_agents), episodes)
    return records if held == episodes and records["known"].all() else None


class Summaries:
    """A writer's summaries: each commit's taken from the rows it commits (`watching`, then
    `committed`), and those a log lacks made from its rows when the writer opens it (`fill`)."""

    def __init__(self, directory: str, n_agents: int, episodes: int) -> None:
        self.file = SummariesFile(directory, n_agents, episodes)
        self.directory, self.n_agents = directory, n_agents
        self.on = True  # off while a whole log is absorbed: its own summaries are copied

    def watching(
        self, pieces: Iterable[tuple[Any, Any]], watched: Mapping[Any, Any], kept: dict[str, list[Any]]
    ) -> Iterator[tuple[Any, Any]]:
        """``pieces`` (a commit's: tail, bytes) passed on, those of the columns ``watched`` (by
        tail: the lengths and `SUMMED`'s raw columns) kept in ``kept`` by name."""
        for tail, piece in pieces:
            column = watched.get(tail)
            if column is not None:
                kept.setdefault(column.name, []).append(piece)
            yield tail, piece

    def committed(self, first: int, episodes: int, kept: dict[str, list[Any]], dtypes: Mapping[str, np.dtype]) -> None:
        """The summaries of a commit's ``episodes`` (the log's from ``first``), from ``kept``."""
        lengths = np.concatenate(
            [np.frombuffer(p, np.int64) for p in kept.pop("lengths", [])] or [np.zeros(0, np.int64)]
        )
        if len(lengths) != episodes or not {"individual_rewards", "terminated", "truncated"} <= kept.keys():
            return  # a column kept compressed, or none: the browser sums its rows
        self.file.put(first, summarize(lengths, rows_of(kept, dtypes, self.n_agents), self.n_agents), episodes)

    def fill(self) -> None:
        """The summaries of the log's episodes that have none (a log older than them, a merge of
        one, a kill between a commit and its summaries), made from its rows."""
        logged = load(self.directory)
        episodes = len(logged.lengths)
        records, _ = read_records(self.directory, SUMMARIES, self.file.dtype, episodes)
        missing = np.flatnonzero(records["known"] == 0)
        arrays = {name: logged.arrays.get((name, None)) for name in SUMMED}
        if not missing.size or any(isinstance(a, Packed) for a in arrays.values()):
            return
        if any(arrays[name] is None for name in ("individual_rewards", "terminated", "truncated")):
            return
        ends = np.cumsum(logged.lengths)
        runs = np.split(missing, np.flatnonzero(np.diff(missing) != 1) + 1)  # runs of episodes in a row
        for run in runs:
            lo, hi = int(ends[run[0]] - logged.lengths[run[0]]), int(ends[run[-1]])
            rows = {name: a[..., lo:hi] for name, a in arrays.items() if a is not None}
            self.file.put(int(run[0]), summarize(logged.lengths[run], rows, self.n_agents), len(run))
