"""Sampling: which rows to gather (one `Sampler` class per mode) and the gather into a `FlexiBatch`."""

from __future__ import annotations

import numbers
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from flexibuff_envs.batch import FlexiBatch, torch_converter
from flexibuff_envs.episodes import EpisodeIndex, Lane, episode_table, segment_rows
from flexibuff_envs.errors import (
    ArgumentTypeError,
    EmptyBufferError,
    InvalidArgumentError,
    positive_int,
)
from flexibuff_envs.nstep import windows
from flexibuff_envs.priorities import PriorityTree
from flexibuff_envs.storage import NEXT

#: the fields an n-step batch sums or reads after each window (`Storage.gather_n_step`)
N_STEP = ("individual_rewards", "global_rewards", "terminated", "truncated", *NEXT)

if TYPE_CHECKING:
    from flexibuff_envs.spec import BufferSpec
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


class Draw(NamedTuple):
    """The rows of one batch (any integer shape), for sequences which of them are inside their
    window's episode, and for prioritized draws each row's importance-sampling weight."""

    rows: np.ndarray
    valid: np.ndarray | None = None
    weights: np.ndarray | None = None


class Sampler(Protocol):
    """Which rows to gather: ``draws`` gives one `Draw` per batch. A sampling mode is one class."""

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterable[Draw]:
        """The batches to gather from the live rows of ``lanes``, drawn with ``rng``."""
        ...


def _require(lanes: Sequence[Lane], what: str) -> None:
    if not any(lane.size for lane in lanes):
        raise EmptyBufferError(f"{what}: the buffer holds no rows yet; record some steps first")


@dataclass(slots=True)
class Uniform:
    """``n`` rows drawn uniformly with replacement (all agents of a row together)."""

    n: int

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterable[Draw]:
        return (Draw(uniform_rows(lanes, rng, self.n)),)


@dataclass(slots=True)
class Weighted:
    """``n`` rows drawn with replacement in proportion to ``memory_weights``."""

    n: int

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterable[Draw]:
        _require(lanes, "sample_transitions")
        return (Draw(weighted_rows(lanes, storage.ensure("memory_weights"), rng, self.n)),)


@dataclass(slots=True)
class Prioritized:
    """``n`` rows drawn with replacement in proportion to ``priority ** alpha``, each with its
    importance-sampling weight ``(N P(i)) ** -beta / max`` (Schaul et al. 2016)."""

    n: int
    beta: float
    tree: PriorityTree

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterable[Draw]:
        _require(lanes, "sample_transitions")
        self.tree.sync(lanes)
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

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterable[Draw]:
        return (Draw(checked_rows("sample_transitions", self.idx, storage.rows)),)


@dataclass(slots=True)
class Sequences:
    """``n`` windows of ``length`` consecutive steps, each inside one episode."""

    n: int
    length: int

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterable[Draw]:
        return (Draw(*sequence_rows(lanes, rng, self.n, self.length)),)


@dataclass(slots=True)
class Episodes:
    """Whole ended episodes in recording order: ``n`` distinct random ones; with ``n=None``,
    random ones while their total length fits ``max_rows`` (at least one); with ``every``, all."""

    n: int | None = None
    max_rows: int = 256
    every: bool = False

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterator[Draw]:
        pool = episode_table(lanes)
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

    def draws(self, lanes: Sequence[Lane], rng: np.random.Generator, storage: Storage) -> Iterator[Draw]:
        _require(lanes, "minibatches")
        rows = live_rows(lanes)
        if self.shuffle:
            rows = rng.permutation(rows)
        stop = len(rows) - (len(rows) % self.size if self.drop_last else 0)
        for first in range(0, stop, self.size):
            yield Draw(rows[first : first + self.size])


_CHECKED: dict[tuple[tuple[str, ...], frozenset[str]], frozenset[str]] = {}


def checked_fields(fields: Collection[str], known: frozenset[str]) -> frozenset[str]:
    """``fields`` as a set of field names, or ValueError naming one that is not ``known``."""
    if isinstance(fields, str):
        raise ArgumentTypeError(f"fields must be a collection of field names, got the string {fields!r}")
    key = (tuple(fields), known)
    checked = _CHECKED.get(key)
    if checked is None:
        unknown = sorted(set(key[0]) - known)
        if unknown:
            raise InvalidArgumentError(f"fields: {unknown} are no batch fields; choose from {sorted(known)}")
        if len(_CHECKED) > 64:
            _CHECKED.clear()
        checked = _CHECKED[key] = frozenset(key[0])  # a training loop asks for the same ones each time
    return checked


class Sampling:
    """The reading half of `FlexibleBuffer`: every way to draw a `FlexiBatch` from its rows."""

    spec: BufferSpec
    rng: np.random.Generator
    num_steps: int
    gamma: float

    if TYPE_CHECKING:  # given by `FlexibleBuffer`: its arrays and lanes (every read commits
        # what batch recorders hold first, `EpisodeIndex.read`)
        _store: Storage
        _index: EpisodeIndex

        def _priority_tree(self) -> PriorityTree: ...

    def gather(
        self,
        idx: np.ndarray,
        *,
        as_torch: bool = False,
        device: Any = None,
        normalize_advantages: bool = False,
        valid: np.ndarray | None = None,
        fields: Collection[str] | None = None,
        weights: np.ndarray | None = None,
        n_step: int | None = None,
    ) -> FlexiBatch:
        """The rows ``idx`` (any integer shape) of every allocated field as a `FlexiBatch`.

        ``normalize_advantages`` shifts and scales this batch's advantages to mean 0, std 1;
        ``valid`` (sequences) is carried along like the fields; ``fields`` gathers only those
        (the others are None on the batch); ``n_step`` (``idx`` one-dimensional, live rows):
        rewards summed over each row's n-step window, next values and flags after it, and
        ``discounts`` (`flexibuff_envs.nstep`).
        """
        lanes, storage = self._index.read(), self._store
        wanted = None if fields is None else checked_fields(fields, storage.known)
        if n_step is None:
            out = storage.gather(idx, wanted)
        else:
            n = positive_int("n_step", n_step)
            if np.ndim(idx) != 1:
                raise InvalidArgumentError(
                    f"n_step: idx must be one-dimensional buffer rows, got shape {np.shape(idx)}"
                )
            arrays = storage.arrays
            w = windows(lanes, idx, n, arrays["active"], arrays["terminated"], arrays["truncated"])
            rest = [name for name in (storage.arrays.keys() if wanted is None else wanted) if name not in N_STEP]
            out = {**storage.gather(idx, rest), **storage.gather_n_step(w, self.gamma, wanted)}
        out["idx"] = idx
        out["agents"] = self.spec.agent_ids
        for name, value in (("valid", valid), ("weights", weights)):
            if value is not None:
                out[name] = value
        if normalize_advantages:
            advantages = out.get("advantages")
            if wanted is not None and "advantages" not in wanted:
                raise InvalidArgumentError("normalize_advantages=True but fields leaves out 'advantages'")
            if advantages is None:
                raise InvalidArgumentError(
                    "normalize_advantages=True but no advantages were recorded: "
                    "annotate values (env.annotate(values=...)) to get GAE"
                )
            # NaN marks steps without GAE yet (no value given, episode still running): skip them
            out["advantages"] = (advantages - np.nanmean(advantages)) / (np.nanstd(advantages) + 1e-8)
        if self.spec.extra_fields:
            out["extra"] = {name: out.pop(name) for name, _, _ in self.spec.extra_fields if name in out}
        if as_torch:
            convert = torch_converter(device)
            out = {name: convert(name, value) for name, value in out.items()}
        return FlexiBatch(**out)

    def draw(
        self,
        sampler: Sampler,
        *,
        as_torch: bool = False,
        device: Any = None,
        normalize_advantages: bool = False,
        fields: Collection[str] | None = None,
    ) -> Iterator[FlexiBatch]:
        """The batches ``sampler`` (`Uniform`, `Weighted`, `Given`, `Sequences`, `Episodes`,
        `Minibatches`, or one of your own) picks, gathered one at a time; the sampling methods
        below are this with their sampler."""
        for draw in sampler.draws(self._index.read(), self.rng, self._store):
            yield self.gather(
                draw.rows,
                as_torch=as_torch,
                device=device,
                valid=draw.valid,
                weights=draw.weights,
                normalize_advantages=normalize_advantages,
                fields=fields,
            )

    def sample_transitions(
        self,
        batch_size: int = 256,
        weighted: bool = False,
        as_torch: bool = False,
        device: Any = None,
        idx: np.ndarray | None = None,
        *,
        fields: Collection[str] | None = None,
        prioritized: bool = False,
        beta: float = 0.4,
        n_step: int | None = None,
    ) -> FlexiBatch:
        """``batch_size`` rows drawn uniformly with replacement (all agents of a row together).

        Args:
            weighted: draw rows in proportion to ``memory_weights`` (need not be normalised); not with ``prioritized``.
            idx: gather exactly these buffer rows instead of drawing.
            fields: gather only these (a DQN wants ``obs``, ``obs_``, ``discrete_actions``,
                ``individual_rewards``, ``terminated``); the others are None on the batch.
            prioritized: draw rows in proportion to ``priority ** alpha`` (see
                `update_priorities`), with ``batch.weights`` the importance-sampling weights for
                ``beta``.
            n_step: n-step returns: per agent, ``individual_rewards`` (``global_rewards``: the
                team's, over the episode's next n rows) is the discounted sum of the rewards of
                up to ``n`` of its steps from each row, fewer where its episode ends or the
                newest recorded row comes first; ``obs_``, ``state_``, ``action_mask_``,
                ``terminated`` and ``truncated`` are those of the window's last step, and
                ``discounts`` is ``gamma ** k`` for the ``k`` steps summed (the bootstrap's
                factor). ``n_step=1`` is the plain batch with ``discounts == gamma``.
        """
        sampler: Sampler
        if idx is not None:
            sampler = Given(idx)
        else:
            n = positive_int("batch_size", batch_size)
            if prioritized and weighted:
                raise InvalidArgumentError(
                    "sample_transitions: choose weighted=True (memory_weights) or prioritized=True "
                    "(update_priorities), not both"
                )
            if prioritized and not (isinstance(beta, numbers.Real) and 0 <= beta < np.inf):
                raise InvalidArgumentError(f"beta must be a finite number >= 0 (1 corrects fully), got {beta!r}")
            sampler = (
                Prioritized(n, beta, self._priority_tree()) if prioritized else Weighted(n) if weighted else Uniform(n)
            )
        return self._one(sampler, as_torch=as_torch, device=device, fields=fields, n_step=n_step)

    def _one(self, sampler: Sampler, **options: Any) -> FlexiBatch:
        """The one batch ``sampler`` picks (`draw` without the iterator)."""
        (draw,) = sampler.draws(self._index.read(), self.rng, self._store)
        return self.gather(draw.rows, valid=draw.valid, weights=draw.weights, **options)

    def episodes(self, *, as_torch: bool = False, device: Any = None) -> Iterator[FlexiBatch]:
        """Every whole ended episode, one `FlexiBatch` of its rows in time order, lane by lane and
        oldest first (for exporters and checks; `sample_episodes` draws some at random). Each
        episode is gathered when it is reached; the set of episodes is the one held at the call.

        >>> [len(e) for e in buffer.episodes()]  # doctest: +SKIP
        [23, 17, 41]
        """
        return self.draw(Episodes(every=True), as_torch=as_torch, device=device)

    def sample_episodes(
        self,
        max_batch_size: int = 256,
        n_episodes: int | None = None,
        as_torch: bool = False,
        device: Any = None,
    ) -> list[FlexiBatch]:
        """Whole ended episodes, each a `FlexiBatch` of its rows in time order.

        Draws ``n_episodes`` distinct episodes, or (when None) random episodes while their total
        length fits ``max_batch_size`` (at least one, never cut). The list is in recording order.
        """
        n = None if n_episodes is None else positive_int("n_episodes", n_episodes)
        return list(self.draw(Episodes(n, max_batch_size), as_torch=as_torch, device=device))

    def sample_sequences(
        self,
        batch_size: int,
        seq_len: int,
        as_torch: bool = False,
        device: Any = None,
    ) -> FlexiBatch:
        """``batch_size`` windows of ``seq_len`` consecutive steps, each inside one episode.

        Windows start at uniformly drawn rows; one that reaches its episode's end is padded with
        that last row and ``valid`` is False there. Fields are ``[n_agents, batch, seq_len, ...]``
        (``[batch, seq_len, ...]`` for global fields or one agent); ``valid`` is ``[batch, seq_len]``.
        """
        sampler = Sequences(positive_int("batch_size", batch_size), positive_int("seq_len", seq_len))
        return self._one(sampler, as_torch=as_torch, device=device)

    def minibatches(
        self,
        batch_size: int,
        shuffle: bool = True,
        as_torch: bool = False,
        device: Any = None,
        drop_last: bool = False,
        normalize_advantages: bool = False,
        *,
        fields: Collection[str] | None = None,
    ) -> Iterator[FlexiBatch]:
        """One pass over every live row in batches of ``batch_size`` (PPO epochs).

        ``normalize_advantages``: each minibatch's advantages to mean 0, std 1 (CleanRL's norm_adv).
        ``fields``: gather only these, as `sample_transitions`.
        """
        sampler = Minibatches(positive_int("batch_size", batch_size), shuffle, drop_last)
        return self.draw(
            sampler, as_torch=as_torch, device=device, normalize_advantages=normalize_advantages, fields=fields
        )
