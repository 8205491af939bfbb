"""Whole episodes moved between buffers as plain numpy arrays (a worker's to the learner's).

`take` hands out a buffer's ended whole episodes as a `Chunk` and forgets them there; `extend`
appends a chunk's episodes to a lane of another buffer, whole, with the ``G``, masks and
annotations they were recorded with. Rows keep their stored form: next values stay chained
(`Chain.extract`), masks stay bits, so a chunk is about one copy of what was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from flexibuff_envs.chain import renumbered
from flexibuff_envs.episodes import episode_table
from flexibuff_envs.errors import SpecMismatchError
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import NEXT

if TYPE_CHECKING:
    from flexibuff_envs.buffer import FlexibleBuffer


@dataclass(frozen=True, eq=False)
class Chunk:
    """Ended whole episodes, back to back, in a buffer's stored form.

    Attributes:
        spec: the layout of the buffer they were taken from.
        gamma, gae_lambda: the discounts their ``G`` and GAE were computed with.
        lengths: ``[episodes]`` steps of each episode, in order.
        arrays: field name -> its rows (``[n_agents, rows, ...]`` or ``[rows, ...]``).
        chains: next-value field -> ``(index, tail)`` (see `Chain.extract`).
    """

    spec: BufferSpec
    gamma: float
    gae_lambda: float
    lengths: np.ndarray
    arrays: dict[str, np.ndarray]
    chains: dict[str, tuple[np.ndarray, np.ndarray]]

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
        return (self.lengths.nbytes + sum(a.nbytes for a in self.arrays.values())
                + sum(i.nbytes + t.nbytes for i, t in self.chains.values()))

    def __repr__(self) -> str:
        return f"Chunk(episodes={self.n_episodes}, rows={self.rows}, nbytes={self.nbytes})"


def take(buffer: FlexibleBuffer) -> Chunk:
    """``buffer``'s ended whole episodes as a `Chunk`; every ended episode is then forgotten there
    (running episodes go on recording)."""
    if any(name in buffer._storage.arrays for name in NEXT):
        buffer.compact()  # next values filled in by hand travel chained too
    # each episode's last row is followed by a row that is not in the chunk
    rows, last = episode_table(buffer._lanes).all_rows()
    storage = buffer._storage
    arrays = {name: array.take(rows, axis=1 if storage.fields[name].per_agent else 0) for name, array in storage}
    chains = {name: chain.extract(rows, last, storage.successor_rows(rows[last]))
              for name, chain in storage.chains.items()}
    for lane in buffer._lanes:
        lane.forget_ended()
    return Chunk(buffer.spec, buffer.gamma, buffer.gae_lambda, np.diff(last, prepend=-1), arrays, chains)


def extend(buffer: FlexibleBuffer, chunk: Chunk, lane: int = 0) -> int:
    """Append ``chunk``'s episodes to ``buffer``'s ``lane``; returns how many were kept.

    The oldest episodes of the lane are forgotten to make room, as when recording. When the chunk
    holds more than the lane, its newest episodes that fit are kept.
    """
    _check(buffer, chunk, lane)
    lane_ = buffer._lanes[lane]
    fits = np.cumsum(chunk.lengths[::-1])[::-1] <= lane_.capacity  # the episodes from here on fit
    skip = int(np.argmax(fits)) if fits.any() else len(fits)
    lengths = chunk.lengths[skip:]
    if not lengths.size:
        return 0
    if any(name in buffer._storage.arrays for name in NEXT):
        buffer.compact()  # next values filled in by hand are chained first, like the chunk's
    if chunk.spec.action_mask and not buffer.spec.action_mask:
        buffer._enable_action_mask()
    for name, array in chunk.arrays.items():
        buffer._column(name, width=array.shape[-1] if name == "continuous_log_probs" else None)
    start = int(chunk.lengths[:skip].sum())
    first = lane_.append(lengths)
    # the ring rows written, as one or two slices, and where each starts in the chunk
    head = lane_.offset + first % lane_.capacity
    n = int(lengths.sum())
    split = min(n, lane_.offset + lane_.capacity - head)
    pieces = [(slice(head, head + split), slice(start, start + split)),
              (slice(lane_.offset, lane_.offset + n - split), slice(start + split, start + n))]
    storage = buffer._storage
    for name, array in storage:
        given = chunk.arrays.get(name)
        per_agent = storage.fields[name].per_agent
        for ring, part in pieces:
            target = array[:, ring] if per_agent else array[ring]
            if given is None:  # not recorded there: the value a fresh row has
                target[...] = storage.fill(name)
            else:
                target[...] = given[:, part] if per_agent else given[part]
    rows = np.concatenate([np.arange(ring.start, ring.stop) for ring, _ in pieces])
    for name, chain in storage.chains.items():
        if name in chunk.chains:
            index, tail = chunk.chains[name]
            chain.insert(rows, *renumbered(index[..., start:], tail) if start else (index, tail))
        else:  # not recorded there: the value a fresh row has
            chain.fill(rows, np.cumsum(lengths) - 1, storage.fill(NEXT[name]))
    return len(lengths)


def check_layout(mine: BufferSpec, theirs: BufferSpec, what: str) -> None:
    """Raise `SpecMismatchError` unless rows of layout ``theirs`` fit a buffer of layout ``mine``
    (any number of lanes; masks are switched on when they come)."""
    for name in BufferSpec.LAYOUT_FIELDS:
        if name not in ("n_envs", "action_mask") and getattr(mine, name) != getattr(theirs, name):
            raise SpecMismatchError(f"{what} does not match the buffer: {name} is {getattr(theirs, name)!r} "
                                    f"there but {getattr(mine, name)!r} in the buffer")


def _check(buffer: FlexibleBuffer, chunk: Chunk, lane: int) -> None:
    """Raise, naming what differs, unless ``chunk`` can be appended to ``lane`` as it is."""
    if not isinstance(chunk, Chunk):
        raise TypeError(f"extend: expected a Chunk (from FlexibleBuffer.take_episodes), got {type(chunk).__name__}")
    if not 0 <= lane < len(buffer._lanes):
        raise ValueError(f"extend: lane must be in [0, {len(buffer._lanes)}), got {lane!r}")
    check_layout(buffer.spec, chunk.spec, "extend: the chunk")
    for name in ("gamma", "gae_lambda"):
        if getattr(chunk, name) != getattr(buffer, name) and (name == "gamma" or "advantages" in chunk.arrays):
            raise SpecMismatchError(f"extend: the chunk's returns were computed with {name}="
                                    f"{getattr(chunk, name)!r} but the buffer's {name} is {getattr(buffer, name)!r}")
    lengths = chunk.lengths
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 1).any():
        raise ValueError("extend: the chunk's lengths must be positive episode lengths")
    rows, agents = chunk.rows, buffer.spec.n_agents
    for name, array in chunk.arrays.items():
        field = buffer._storage.fields.get(name)
        if field is None or name in NEXT:
            raise ValueError(f"extend: the chunk has an unknown field {name!r}")
        lead = (agents, rows) if field.per_agent else (rows,)
        mine = buffer._storage.arrays.get(name)
        if array.shape[:len(lead)] != lead or (mine is not None and (
                array.shape[len(lead):] != mine.shape[len(lead):] or array.dtype != mine.dtype)):
            raise ValueError(f"extend: field {name!r} of the chunk has shape {array.shape} and dtype "
                             f"{array.dtype}; the buffer needs {lead} rows"
                             + ("" if mine is None else f" of {mine.shape[len(lead):]} {mine.dtype}"))
    for name, (index, tail) in chunk.chains.items():
        if name not in NEXT or index.shape[-1] != rows or tail.shape[1:] != buffer._storage.shape(NEXT[name])[-1:]:
            raise ValueError(f"extend: next-value field {name!r} of the chunk does not fit the buffer "
                             f"(index {index.shape} for {rows} rows, values {tail.shape[1:]})")
    running = buffer._lanes[lane].running
    if running is not None and running.end > running.start:
        raise ValueError(f"extend: lane {lane} has a running episode (a recorder is writing it); "
                         "append chunks to a lane no recorder writes")
