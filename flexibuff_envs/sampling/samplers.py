"""Which rows a batch gathers: `Live`, the rows a sampler may draw from, and one `Sampler`
class per sampling mode (`FlexibleBuffer.draw` gathers what a sampler picks)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from flexibuff_envs.errors import EmptyBufferError, InvalidArgumentError
from flexibuff_envs.index import EpisodeTable, episode_table
from flexibuff_envs.index.lanes import Lane
from flexibuff_envs.sampling.priorities import PriorityTree
from flexibuff_envs.storage.stored_form import segment_rows

if TYPE_CHECKING:
    from flexibuff_envs.storage import Storage


def live_rows(lanes: Sequence[Lane]) -> np.ndarray:
    """Every live row, lane by lane, each lane oldest first."""
    return segment_rows([segment for lane in lanes for segment in lane.segments()])


def as_array(value: Any) -> np.ndarray:
    """``value`` as a numpy array; a torch tensor on any device, needing grad or not, too (its
    values, detached)."""
    detach = getattr(value, "detach", None)
    return np.asarray(detach().cpu() if detach is not None else value)


def checked_weights(caller: str, name: str, value: Any, rows: np.ndarray) -> np.ndarray:
    """``value`` (one per row of ``rows``, or one for all; a torch tensor too) as float64 of
    ``rows``' shape, or ValueError naming ``caller`` and ``name`` unless finite and non-negative."""
    values = as_array(value).astype(np.float64, copy=False)
    if values.ndim and values.shape != rows.shape:
        raise InvalidArgumentError(f"{caller}: {name} has shape {values.shape} but idx has {rows.shape}")
    if values.size and not (values.min() >= 0 and values.max() < np.inf):  # NaN fails both
        raise InvalidArgumentError(f"{caller}: {name} must be finite and non-negative")
    return np.full(rows.shape, values) if values.ndim == 0 else values


def checked_rows(caller: str, idx: Any, rows: int) -> np.ndarray:
    """``idx`` as an integer array of buffer rows, or ValueError naming ``caller``."""
    array = as_array(idx)
    if array.dtype.kind not in "iu" or (array.size and not (0 <= array.min() and array.max() < rows)):
        raise InvalidArgumentError(
            f"{caller}: idx must be integer buffer rows in [0, {rows}) (a batch's idx), "
            f"got {array.dtype} values"
            + (f" from {array.min()} to {array.max()}" if array.size and array.dtype.kind in "iuf" else "")
        )
    return array


def _draw(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    """``n`` integers drawn uniformly from ``[0, size)``: scaled uniform floats, in about half the
    time of ``rng.integers``, whose argument handling dominates for a batch (a float that rounds
    up to ``size`` counts as its last value)."""
    return np.minimum((rng.random(n) * size).astype(np.int64), size - 1)


def uniform_rows(
    lanes: Sequence[Lane], rng: np.random.Generator, n: int, what: str = "sample_transitions"
) -> np.ndarray:
    """``n`` live rows drawn uniformly with replacement over all lanes (`EmptyBufferError`
    naming ``what`` if there are none)."""
    if len(lanes) == 1:
        lane = lanes[0]
        size = lane.size
        if not size:
            _require(lanes, what)
        first = lane.live_start % lane.capacity
        if first + size <= lane.capacity:  # the live rows do not wrap: one draw
            return _draw(rng, size, n) + (lane.offset + first)
        return lane.offset + (first + _draw(rng, size, n)) % lane.capacity
    bounds = np.array([(lane.live_start, lane.written) for lane in lanes], dtype=np.int64)
    sizes = bounds[:, 1] - bounds[:, 0]
    ends = sizes.cumsum()  # the live rows of all lanes, one after the other
    if not ends[-1]:
        _require(lanes, what)
    k = _draw(rng, int(ends[-1]), n)
    which = np.searchsorted(ends, k, side="right")  # each draw's lane, whose rows start at lane * capacity
    shift = bounds[:, 0] - (ends - sizes)  # draw k is position k + shift of its lane
    capacity = lanes[0].capacity
    return which * capacity + (k + shift.take(which)) % capacity


def weighted_rows(lanes: Sequence[Lane], weights: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` live rows drawn with replacement in proportion to ``weights`` (per buffer row)."""
    live = live_rows(lanes)
    w = weights[live].astype(np.float64)
    total = w.sum()
    if not np.isfinite(total) or total <= 0 or (w < 0).any():
        raise InvalidArgumentError(
            "weighted sampling needs finite, non-negative memory_weights with a "
            f"positive sum; the live rows sum to {total!r}"
        )
    cdf = np.cumsum(w)
    return live[np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right").clip(max=live.size - 1)]


def sequence_rows(
    lanes: Sequence[Lane], rng: np.random.Generator, n: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of ``seq_len`` steps, each inside one episode, starting at uniform live rows.

    Returns:
        rows ``[n, seq_len]`` (past an episode's end: its last row again) and valid ``[n, seq_len]``.
    """
    starts = uniform_rows(lanes, rng, n, "sample_sequences")
    capacity = lanes[0].capacity
    rows = np.empty((n, seq_len), dtype=np.int64)
    valid = np.empty((n, seq_len), dtype=bool)
    which = starts // capacity
    steps = np.arange(seq_len)
    for lane_index in np.unique(which):
        lane = lanes[lane_index]
        pick = which == lane_index
        local = starts[pick] - lane.offset
        # the absolute position of each start: live positions are [live_start, written)
        position = lane.live_start + (local - lane.live_start) % capacity
        episode_starts, episode_ends = lane.bounds()
        end = episode_ends[np.searchsorted(episode_starts, position, side="right") - 1]
        window = position[:, None] + steps
        valid[pick] = window < end[:, None]
        rows[pick] = lane.offset + np.minimum(window, end[:, None] - 1) % capacity
    return rows, valid


# ----------------------------------------------------------------------------- samplers


class Live:
    """What a sampler draws from: the buffer's live rows (recorded, not yet forgotten) with every
    staged step committed, and its stored arrays (``storage``). Rows are buffer rows, as
    ``batch.idx`` gives them; no sampler needs to know how lanes lay them out."""

    def __init__(self, lanes: Sequence[Lane], storage: Storage) -> None:
        self.lanes, self.storage = lanes, storage

    @property
    def size(self) -> int:
        """How many rows are live."""
        return sum(lane.size for lane in self.lanes)

    def rows(self) -> np.ndarray:
        """Every live row, lane by lane, each lane's oldest first."""
        return live_rows(self.lanes)

    def by_lane(self) -> list[np.ndarray]:
        """Each lane's live rows, oldest first (one array per lane, empty where it holds none)."""
        return [segment_rows(lane.segments()) if lane.size else np.zeros(0, dtype=np.int64) for lane in self.lanes]

    def uniform(self, rng: np.random.Generator, n: int, what: str = "sample_transitions") -> np.ndarray:
        """``n`` live rows drawn uniformly with replacement (`EmptyBufferError` naming ``what``
        when there are none)."""
        return uniform_rows(self.lanes, rng, n, what)

    def episodes(self) -> EpisodeTable:
        """Every ended whole episode, lane by lane, oldest first (``.rows(k)``: the k-th's rows)."""
        return episode_table(self.lanes)

    def require(self, what: str) -> None:
        """`EmptyBufferError` naming ``what`` when no row is live."""
        _require(self.lanes, what)


class Draw(NamedTuple):
    """The rows of one batch (any integer shape), for sequences which of them are inside their
    window's episode, and for prioritized draws each row's importance-sampling weight."""

    rows: np.ndarray
    valid: np.ndarray | None = None
    weights: np.ndarray | None = None


class Sampler(Protocol):
    """Which rows to gather: ``draws`` gives one `Draw` per batch. A sampling mode is one class."""

    def draws(self, live: Live, rng: np.random.Generator) -> Iterable[Draw]:
        """The batches to gather from ``live``'s rows, drawn with ``rng``."""
        ...


def _require(lanes: Sequence[Lane], what: str) -> None:
    if not any(lane.size for lane in lanes):
        raise EmptyBufferError(f"{what}: the buffer holds no rows yet; record some steps first")


@dataclass(slots=True)
class Uniform:
    """``n`` rows drawn uniformly with replacement (all agents of a row together)."""

    n: int

    def draws(self, live: Live, rng: np.random.Generator) -> Iterable[Draw]:
        return (Draw(live.uniform(rng, self.n)),)


@dataclass(slots=True)
class Weighted:
    """``n`` rows drawn with replacement in proportion to ``memory_weights``."""

    n: int

    def draws(self, live: Live, rng: np.random.Generator) -> Iterable[Draw]:
        live.require("sample_transitions")
        return (Draw(weighted_rows(live.lanes, live.storage.ensure("memory_weights"), rng, self.n)),)


@dataclass(slots=True)
class Prioritized:
    """Prioritized replay (Schaul et al. 2016): ``n`` rows drawn with replacement in proportion
    to ``priority ** alpha``, each with its importance-sampling weight ``(N P(i)) ** -beta /
    max``.

    It owns the sum tree of ``priority ** alpha`` per row: new rows join it with the highest
    priority given so far, `update` gives others, and `saved` / `restored` carry it through a
    buffer file. A buffer keeps one (made on its first prioritized draw); `batch` is the same
    tree drawing another ``n`` or ``beta``.
    """

    tree: PriorityTree
    n: int = 256
    beta: float = 0.4

    @classmethod
    def new(cls, rows: int, lanes: int, alpha: float) -> Prioritized:
        """Over a buffer of ``rows`` rows in ``lanes`` lanes, every priority the same."""
        return cls(PriorityTree(rows, lanes, alpha))

    @classmethod
    def restored(cls, leaves: np.ndarray, lanes: Sequence[Lane], alpha: float, max_priority: float) -> Prioritized:
        """The sampler `saved` gave ``leaves`` and ``max_priority``, over the live rows of ``lanes``."""
        return cls(PriorityTree.restore(leaves, lanes, alpha, max_priority))

    def batch(self, n: int, beta: float) -> Prioritized:
        """This sampler (its tree) drawing ``n`` rows with importance weights for ``beta``."""
        return dataclasses.replace(self, n=n, beta=beta)

    @property
    def max_priority(self) -> float:
        """The highest priority given so far (new rows get it)."""
        return self.tree.max_priority

    def update(self, lanes: Sequence[Lane], rows: np.ndarray, priorities: np.ndarray) -> None:
        """New ``priorities`` of ``rows``; rows no longer live in ``lanes`` are left out."""
        self.tree.sync(lanes)
        self.tree.update(rows, priorities)

    def saved(self, lanes: Sequence[Lane], rows: int) -> tuple[np.ndarray, float]:
        """What a buffer file keeps of it: ``priority ** alpha`` of each of the buffer's ``rows``
        rows (0 where not recorded) and the highest priority given."""
        self.tree.sync(lanes)
        return self.tree.leaf_values(rows), self.tree.max_priority

    def draws(self, live: Live, rng: np.random.Generator) -> Iterable[Draw]:
        live.require("sample_transitions")
        self.tree.sync(live.lanes)
        if not self.tree.total > 0:
            raise InvalidArgumentError(
                "prioritized sampling needs a positive priority somewhere; every recorded row has 0"
            )
        rows, weights = self.tree.draw(rng, self.n, self.beta)
        return (Draw(rows, weights=weights),)


@dataclass(slots=True)
class Given:
    """Exactly the rows ``idx`` (a batch's ``idx``, say)."""

    idx: np.ndarray

    def draws(self, live: Live, rng: np.random.Generator) -> Iterable[Draw]:
        return (Draw(checked_rows("sample_transitions", self.idx, live.storage.rows)),)


@dataclass(slots=True)
class Sequences:
    """``n`` windows of ``length`` consecutive steps, each inside one episode."""

    n: int
    length: int

    def draws(self, live: Live, rng: np.random.Generator) -> Iterable[Draw]:
        return (Draw(*sequence_rows(live.lanes, rng, self.n, self.length)),)


@dataclass(slots=True)
class Episodes:
    """Whole ended episodes in recording order: ``n`` distinct random ones; with ``n=None``,
    random ones while their total length fits ``max_rows`` (at least one); with ``every``, all."""

    n: int | None = None
    max_rows: int = 256
    every: bool = False

    def draws(self, live: Live, rng: np.random.Generator) -> Iterator[Draw]:
        pool = live.episodes()
        if self.every:
            order = np.arange(len(pool))
        else:
            want = 1 if self.n is None else self.n
            if want > len(pool):
                raise EmptyBufferError(
                    f"sample_episodes: asked for {want} whole episodes but the buffer holds {len(pool)}"
                )
            order = rng.permutation(len(pool))
            if self.n is None:
                fits = np.cumsum(pool.lengths[order]) <= self.max_rows
                order = np.sort(order[: max(1, int(np.argmin(fits)) if not fits.all() else len(order))])
            else:
                order = np.sort(order[:want])
        for k in order.tolist():
            yield Draw(pool.rows(k))


@dataclass(slots=True)
class Minibatches:
    """One pass over every live row in batches of ``size`` (shuffled, or in order)."""

    size: int
    shuffle: bool = True
    drop_last: bool = False

    def draws(self, live: Live, rng: np.random.Generator) -> Iterator[Draw]:
        live.require("minibatches")
        rows = live.rows()
        if self.shuffle:
            rows = rng.permutation(rows)
        stop = len(rows) - (len(rows) % self.size if self.drop_last else 0)
        for first in range(0, stop, self.size):
            yield Draw(rows[first : first + self.size])
