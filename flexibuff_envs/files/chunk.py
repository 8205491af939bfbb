"""Whole episodes moved between buffers as plain numpy arrays (a worker's to the learner's).

`take` hands out a buffer's ended whole episodes as a `Chunk` and forgets them there;
`FlexibleBuffer.extend` appends a chunk's episodes to a lane of another buffer, whole, with the
``G``, masks and annotations they were recorded with. A chunk holds rows in their stored form
(`stored_form.Part`, as files do): next values stay chained, masks stay bits, so a chunk is about one
copy of what was recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flexibuff_envs.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    OutOfRangeError,
    SpecMismatchError,
)
from flexibuff_envs.index import EpisodeTable, episode_table, newest_fitting
from flexibuff_envs.index.lanes import Lane
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.fields import NEXT
from flexibuff_envs.storage.next_values import CHAINED, renumbered
from flexibuff_envs.storage.stored_form import Part


@dataclass(frozen=True, eq=False)
class Chunk:
    """Ended whole episodes, back to back, in a buffer's stored form.

    Attributes:
        spec: the layout of the buffer they were taken from.
        gamma, gae_lambda: the discounts their ``G`` and GAE were computed with.
        lengths: ``[episodes]`` steps of each episode, in order.
        parts: their rows in stored form, one piece each (`stored_form.Part`); a chain's slots are
            those its rows name, and each episode's last row has its next value in a slot.
        origins: ``[episodes]`` of `index.origins.ORIGIN`, where each came from (None: unknown).
    """

    spec: BufferSpec
    gamma: float
    gae_lambda: float
    lengths: np.ndarray
    parts: tuple[Part, ...]
    origins: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """Rows (steps of all agents) in the chunk."""
        return int(self.lengths.sum())

    @property
    def n_episodes(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays: what it costs to send."""
        return self.lengths.nbytes + sum(part.nbytes for part in self.parts)

    def __getitem__(self, episodes: slice | int) -> Chunk:
        """Episodes ``episodes`` (a slice of step 1, or one episode's index) as a chunk of their
        own: ``chunk[-3:]`` holds the newest three, ``chunk[0]`` the oldest."""
        if isinstance(episodes, (int, np.integer)) and not isinstance(episodes, bool):
            k = int(episodes) + (self.n_episodes if episodes < 0 else 0)
            if not 0 <= k < self.n_episodes:
                raise OutOfRangeError(f"episode {episodes} of a chunk of {self.n_episodes}")
            episodes = slice(k, k + 1)
        if not isinstance(episodes, slice):
            raise ArgumentTypeError(f"a chunk is indexed by episode, chunk[k] or chunk[a:b], got {episodes!r}")
        first, stop, step = episodes.indices(self.n_episodes)
        if step != 1:
            raise InvalidArgumentError(f"a chunk's episodes are sliced in order, with step 1, got step {step}")
        bounds = np.concatenate([[0], np.cumsum(self.lengths)])
        lo, hi = int(bounds[first]), int(bounds[max(first, stop)])
        tails = {part.name: part.whole() for part in self.parts if part.part == "tail"}
        parts = []
        for part in self.parts:
            if part.part == "index":  # its tail keeps the slots the rows still name
                index, tail = renumbered(part.rows(lo, hi), tails[part.name])
                parts += [dataclasses.replace(part, pieces=(index,)), Part(part.name, "tail", False, (tail,))]
            elif part.part is None:
                parts.append(dataclasses.replace(part, pieces=(part.rows(lo, hi),)))
        kept = slice(first, max(first, stop))
        origins = None if self.origins is None else self.origins[kept]
        return dataclasses.replace(self, lengths=self.lengths[kept], parts=tuple(parts), origins=origins)

    def newest(self, rows: int) -> Chunk:
        """Its newest episodes that fit in ``rows`` rows."""
        if self.rows <= rows:
            return self
        return self[newest_fitting(self.lengths, rows) :]

    def __repr__(self) -> str:
        return f"Chunk(episodes={self.n_episodes}, rows={self.rows}, nbytes={self.nbytes})"


def take(storage: Storage, lanes: Sequence[Lane], gamma: float, gae_lambda: float) -> Chunk:
    """The ended whole episodes of ``lanes`` as a `Chunk`; every ended episode is then forgotten
    there (running episodes go on recording)."""
    chunk = copy(storage, episode_table(lanes), gamma, gae_lambda)
    for lane in lanes:
        lane.forget_ended()
    return chunk


def copy(storage: Storage, episodes: EpisodeTable, gamma: float, gae_lambda: float) -> Chunk:
    """``episodes`` (whole, ended) of ``storage`` as a `Chunk`; the buffer keeps them."""
    rows, last = episodes.all_rows()
    parts = storage.export(rows, last)  # each episode's last row is followed by a row not in the chunk
    return Chunk(storage.spec, gamma, gae_lambda, np.diff(last, prepend=-1), tuple(parts), episodes.origins)


def check_layout(mine: BufferSpec, theirs: BufferSpec, what: str) -> None:
    """Raise `SpecMismatchError` unless rows of layout ``theirs`` fit a buffer of layout ``mine``
    (any number of lanes; masks are switched on when they come)."""
    for name in BufferSpec.LAYOUT_FIELDS:
        if name not in ("n_envs", "action_mask") and getattr(mine, name) != getattr(theirs, name):
            raise SpecMismatchError(
                f"{what} does not match the buffer: {name} is {getattr(theirs, name)!r} "
                f"there but {getattr(mine, name)!r} in the buffer"
            )


def check(chunk: Chunk, storage: Storage, lanes: Sequence[Lane], lane: int, gamma: float, gae_lambda: float) -> None:
    """Raise, naming what differs, unless ``chunk`` can be appended as it is to lane ``lane`` of
    a buffer of ``storage``, ``lanes`` and those discounts."""
    if not isinstance(chunk, Chunk):
        raise ArgumentTypeError(
            f"extend: expected a Chunk (from FlexibleBuffer.take_episodes), got {type(chunk).__name__}"
        )
    if not 0 <= lane < len(lanes):
        raise InvalidArgumentError(f"extend: lane must be in [0, {len(lanes)}), got {lane!r}")
    check_layout(storage.spec, chunk.spec, "extend: the chunk")
    names = {part.name for part in chunk.parts}
    for name, value in (("gamma", gamma), ("gae_lambda", gae_lambda)):
        if getattr(chunk, name) != value and (name == "gamma" or "advantages" in names):
            raise SpecMismatchError(
                f"extend: the chunk's returns were computed with {name}="
                f"{getattr(chunk, name)!r} but the buffer's {name} is {value!r}"
            )
    lengths = chunk.lengths
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 1).any():
        raise InvalidArgumentError("extend: the chunk's lengths must be positive episode lengths")
    rows, agents = chunk.rows, storage.spec.n_agents
    parts = {part.key: part for part in chunk.parts}
    for (name, kind), part in parts.items():
        field = storage.fields.get(name)
        if kind is None and (field is None or name in NEXT):
            raise InvalidArgumentError(f"extend: the chunk has an unknown field {name!r}")
        if kind is None:
            lead = (agents, rows) if field.per_agent else (rows,)  # type: ignore[union-attr]
            mine = storage.arrays.get(name)
            if part.shape[: len(lead)] != lead or (
                mine is not None and (part.shape[len(lead) :] != mine.shape[len(lead) :] or part.dtype != mine.dtype)
            ):
                raise InvalidArgumentError(
                    f"extend: field {name!r} of the chunk has shape {part.shape} and dtype "
                    f"{part.dtype}; the buffer needs {lead} rows"
                    + ("" if mine is None else f" of {mine.shape[len(lead) :]} {mine.dtype}")
                )
        elif name not in NEXT or kind not in ("index", "tail"):
            raise InvalidArgumentError(f"extend: the chunk has an unknown part {kind!r} of {name!r}")
        elif {(name, "index"), (name, "tail")} - parts.keys():
            raise InvalidArgumentError(
                f"extend: next-value field {name!r} of the chunk needs both its index and tail parts"
            )
        elif kind == "index":
            index, tail = part.whole(), parts[name, "tail"]
            if (
                index.shape[-1] != rows
                or index.dtype.kind not in "iu"
                or tail.shape[1:] != storage.shape(NEXT[name])[-1:]
                or index.min(initial=0) < CHAINED
                or index.max(initial=0) >= tail.shape[0]
            ):
                raise InvalidArgumentError(
                    f"extend: next-value field {name!r} of the chunk does not fit the buffer "
                    f"(index {index.shape} for {rows} rows naming slots up to "
                    f"{index.max(initial=0)} of {tail.shape[0]}, values {tail.shape[1:]})"
                )
    running = lanes[lane].running
    if running is not None and running.end > running.start:
        raise InvalidArgumentError(
            f"extend: lane {lane} has a running episode (a recorder is writing it); "
            "append chunks to a lane no recorder writes"
        )
