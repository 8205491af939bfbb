"""Next-values stored once: ``obs_`` (``state_``, ``action_mask_``) read from the following row.

The observation an agent receives at a step is the observation it acts on at its next step, so
``obs_[r]`` is ``obs`` of the lane's next row whenever the agent's next transition lies there.
Only the other next-values are kept, in a small *tail* store: final observations of episodes
(termination, truncation, a cut), an agent's last observation before it dies or sits out, and the
newest row of each running episode (its successor is not written yet).

``index[agent, row]`` says where the next value of a row is: `CHAINED` (the next row of the lane),
or a tail slot. Slot 0 is all zeros, the value of cleared rows. A recorder's `Held` owns two
*reserved* slots: the value it holds for the next row, and a spare it writes the next value into
first, so a value the codec rejects changes nothing. Other slots are handed out from a free stack
and come back when their rows are forgotten.
"""

from __future__ import annotations

import functools
import math
import mmap
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from flexibuff_envs.errors import BufferMemoryError

if TYPE_CHECKING:
    from flexibuff_envs.storage.holders import Held, HeldBatch

#: ``index`` value of a row whose next value is the base field at the lane's next row
CHAINED = -1
#: bytes a new tail store starts with (it doubles when full): 64 slots of small values, at least 4
#: of large ones (a 720x1280x3 float32 state is 11 MB a slot)
_TAIL_BYTES = 1 << 20
#: how ``numpy.take`` brings successor indices into range
TakeMode = Literal["raise", "wrap", "clip"]


#: arrays from this size on are mapped anonymously, with transparent huge pages asked for
_HUGE = 4 << 20
#: ``alloc(shape, dtype, name)``: zeros for the storage's array ``name`` (`zeroed`, or a file's:
#: `flexibuff_envs.log.ring_files.RingFiles`)
Alloc = Callable[[tuple[int, ...], Any, str], np.ndarray]


def zeroed(shape: tuple[int, ...], dtype: np.dtype | type, name: str = "") -> np.ndarray:
    """Zeros that cost memory only where written, as ``np.zeros`` (calloc), but for large arrays
    in huge pages where the system allows: writing a fresh 1 GiB array (a loaded file, a ring
    being recorded) then takes a fifth of the page faults' time. An `Alloc` (``name``, the
    array's, is for one that keeps arrays in files)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(shape, dtype=dtype)
    try:
        memory = mmap.mmap(-1, nbytes)
    except OSError as error:  # as np.zeros says it
        raise BufferMemoryError(f"cannot allocate {nbytes:,} bytes: {error}") from None
    try:
        memory.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # huge pages not available here: ordinary pages
        pass
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


class Holders:
    """The `Held` and `HeldBatch` of a chain, referred to weakly but without the callback a
    ``WeakSet`` runs when one is collected: a Ctrl-C that lands inside such a callback is printed
    and dropped by Python ("Exception ignored"), so none runs here; the dead are pruned as the
    holders are walked."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Held | HeldBatch]] = []

    def add(self, holder: Held | HeldBatch) -> None:
        self._refs = [ref for ref in self._refs if ref() is not None]
        self._refs.append(weakref.ref(holder))

    def live(self) -> list[Held | HeldBatch]:
        alive = [holder for holder in (ref() for ref in self._refs) if holder is not None]
        if len(alive) < len(self._refs):
            self._refs = [weakref.ref(holder) for holder in alive]
        return alive

    def __iter__(self) -> Iterator[Held | HeldBatch]:
        return iter(self.live())

    def __len__(self) -> int:
        return len(self.live())


class Chain:
    """The next-values of one base field (``obs``, ``state`` or ``action_mask``)."""

    def __init__(
        self,
        base: np.ndarray,
        per_agent: bool,
        *,
        index: np.ndarray | None = None,
        tail: np.ndarray | None = None,
        alloc: Alloc = zeroed,
        name: str = "",
    ) -> None:
        """A chain on ``base``; ``index`` and ``tail`` are given when read from a file; ``alloc``
        makes them otherwise (the arrays of next-value field ``name``)."""
        self.base = base  # [n_agents, rows, width] or [rows, width]
        self.per_agent, self.alloc_array, self.name = per_agent, alloc, name
        # calloc: every row reads slot 0 (zeros) until written
        self.index = alloc(base.shape[:-1], np.int32, f"{name}.index") if index is None else index
        slots = max(4, min(64, _TAIL_BYTES // max(1, base.shape[-1] * base.itemsize)))
        self.tail = alloc((slots, base.shape[-1]), base.dtype, f"{name}.tail") if tail is None else tail
        self.reserved = np.zeros(len(self.tail), dtype=bool)
        self._free = np.empty(len(self.tail), dtype=np.int32)  # a stack of free slots
        self._n_free = 0
        self.fresh = 1 if tail is None else len(tail)  # slots [fresh, len(tail)) were never used
        self.holders = Holders()

    # ----------------------------------------------------------------- slots

    def alloc(self, n: int = 1) -> np.ndarray:
        """``n`` free slots (the tail store grows when none are left)."""
        take = min(n, self._n_free)
        slots = self._free[self._n_free - take : self._n_free].copy()
        self._n_free -= take
        if take < n:
            need = self.fresh + n - take
            if need > len(self.tail):
                self._grow(need)
            slots = np.concatenate([slots, np.arange(self.fresh, need, dtype=np.int32)])
            self.fresh = need
        return slots

    def alloc_one(self) -> int:
        """One free slot: `alloc` of one, in plain integers (an episode's end in a single lane)."""
        if self._n_free:
            self._n_free -= 1
            return int(self._free[self._n_free])
        if self.fresh >= len(self.tail):
            self._grow(self.fresh + 1)
        self.fresh += 1
        return self.fresh - 1

    def _grow(self, need: int) -> None:
        size = max(need, 2 * len(self.tail))
        tail = self.alloc_array((size, self.tail.shape[1]), self.tail.dtype, f"{self.name}.tail")
        tail[: len(self.tail)] = self.tail
        self.tail = tail
        self.reserved = np.concatenate([self.reserved, np.zeros(size - len(self.reserved), dtype=bool)])
        self._free = np.concatenate([self._free, np.empty(size - len(self._free), dtype=np.int32)])
        for holder in self.holders:
            holder.bind()

    def release(self, slots: np.ndarray) -> None:
        """Give ``slots`` back (slot 0 and reserved slots are never given back)."""
        slots = slots[slots > 0]
        slots = slots[~self.reserved[slots]]
        self._free[self._n_free : self._n_free + slots.size] = slots
        self._n_free += slots.size

    def reserve(self, n: int = 2) -> np.ndarray:
        """``n`` zeroed slots for a `Held` (two) or a `HeldBatch`, never given back by `forget`."""
        slots = self.alloc(n)
        self.reserved[slots] = True
        self.tail[slots] = 0
        return slots

    def forget(self, rows: np.ndarray | slice) -> None:
        """``rows`` (indices, or a slice of contiguous ones) are no longer recorded: their slots
        come back and they read as cleared."""
        slots = self.index[..., rows].flatten()  # a copy: a slice's view would read the zeros below
        self.index[..., rows] = 0
        for holder in self.holders:
            holder.release(rows)
        self.release(slots)

    def reset(self, rows: np.ndarray) -> None:
        """Every row forgotten (`FlexibleBuffer.clear`; ``rows``: those recorded); the holders
        keep their slots."""
        for holder in self.holders:
            holder.release()
        self.index[..., rows] = 0
        free = np.flatnonzero(~self.reserved[1 : self.fresh]).astype(np.int32) + 1
        self._free[: free.size] = free
        self._n_free = free.size

    # ----------------------------------------------------------------- reading

    def gather(
        self, idx: np.ndarray, succ: np.ndarray, mode: TakeMode = "raise", agent: int | None = None
    ) -> np.ndarray:
        """The next values of rows ``idx`` whose lane successors are ``succ`` (same shape; ``mode``
        is how ``take`` brings them into range)."""
        if agent is not None:
            out = self.base[agent].take(succ, axis=0, mode=mode)
            index = self.index[agent].take(idx)
        elif self.per_agent:
            out = self.base.take(succ, axis=1, mode=mode)
            index = self.index.take(idx, axis=1)
        else:
            out = self.base.take(succ, axis=0, mode=mode)
            index = self.index.take(idx)
        own = (index >= 0).nonzero()  # not CHAINED: a slot of the row's own
        if own[0].size:
            out[own] = self.tail[index[own]]
        return out

    def value(self, row: int, succ: int, agent: int | None = None) -> np.ndarray:
        """The next value of one row (a copy)."""
        index = self.index[agent, row] if agent is not None else self.index[row]
        if index == CHAINED:
            return (self.base[agent, succ] if agent is not None else self.base[succ]).copy()
        return self.tail[index].copy()

    # ----------------------------------------------------------------- conversion

    def extract(
        self, rows: np.ndarray | slice, cut: tuple[np.ndarray, Callable[[], np.ndarray]] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next values of ``rows`` (row numbers, or a slice of the ring) as a chain of their
        own: ``(index, tail)``, the slots the rows name renumbered ``1, 2, ...`` in a tail holding
        only those (slot 0: zeros). ``cut`` as for `appended`."""
        index, values = self.appended(rows, 1, cut)
        return index, np.concatenate([self.tail[:1], values])

    def appended(
        self, rows: np.ndarray | slice, first: int, cut: tuple[np.ndarray, Callable[[], np.ndarray]] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next values of ``rows`` (row numbers, or a slice of the ring) as they extend
        another chain whose next free slot is ``first``: an index naming slots ``first, first +
        1, ...`` in the order it names them (chained rows stay chained, slot 0 stays the zeros),
        and the values of those slots.

        A chained row reads the next of ``rows``. ``cut``: positions in ``rows`` whose successor is
        not the next of ``rows``, and a function giving those successors' rows (called only when
        one is chained): a chained row there gets a slot with its value.
        """
        index = self.index[..., rows] if isinstance(rows, slice) else self.index.take(rows, axis=-1)
        named = index > 0
        used = index[named]
        out = index.astype(np.int32)
        out[named] = np.arange(first, first + used.size, dtype=np.int32)
        values = self.tail[used]
        if cut is not None:
            # a global field is handled as one agent's
            at, (positions, successors) = (out if self.per_agent else out[None]), cut
            chained = at[:, positions] == CHAINED
            if chained.any():  # seldom: an ended episode's last row mostly has a slot of its own
                agents, which = np.nonzero(chained)
                at[agents, positions[which]] = first + used.size + np.arange(which.size, dtype=np.int32)
                rows = successors()[which]  # the base read at those rows only (it may be kept compressed)
                values = np.concatenate([values, self.base[agents, rows] if self.per_agent else self.base[rows]])
        return out, values

    def fill(self, rows: np.ndarray, ends: np.ndarray, value: Any) -> None:
        """Every one of ``rows`` (episodes back to back, each in lane order) reads ``value`` as its
        next value: chained within an episode, from a slot of its own at each end (positions
        ``ends`` of ``rows``)."""
        index = np.full((*self.index.shape[:-1], rows.size), CHAINED, dtype=np.int32)
        slots = self.alloc(index[..., ends].size)
        self.tail[slots] = value
        index[..., ends] = slots.reshape(index[..., ends].shape)
        self.index[..., rows] = index

    def insert(self, rows: np.ndarray, index: np.ndarray, tail: np.ndarray) -> None:
        """Store a chain `extract` made at ``rows`` (in order; chained rows must be followed by
        their successors there): its slots get slots of this tail store."""
        slots = np.concatenate([np.zeros(1, dtype=np.int32), self.alloc(len(tail) - 1)])
        self.tail[slots[1:]] = tail[1:]
        self.index[..., rows] = np.where(index >= 0, slots[np.maximum(index, 0)], CHAINED)

    def absorb(self, given: np.ndarray, live: np.ndarray, succ: np.ndarray, chainable: np.ndarray) -> None:
        """Take next values given row by row (a hand-filled or old file's ``obs_``, an import's):
        rows whose value equals, bit for bit, the base at their successor are chained, the rest
        get slots.

        Args:
            given: the next values of rows ``live`` (``[n_agents, len(live), width]``, or without
                the agent axis for a global field).
            live: the rows; succ: their successors; chainable: False where the successor is not
                part of the recording (each lane's newest row).
        """
        bits = np.dtype(f"u{given.dtype.itemsize}")
        # a global field is handled as one agent's
        index = self.index if self.per_agent else self.index[None]
        following = self.base[:, succ] if self.per_agent else self.base[succ][None]  # only those rows read
        given = given if self.per_agent else given[None]
        same = (given.view(bits) == following.view(bits)).all(axis=-1) & chainable
        own = np.nonzero(~same)
        slots = self.alloc(own[0].size)
        self.tail[slots] = given[own]
        rows = np.full(same.shape, CHAINED, dtype=np.int32)
        rows[own] = slots
        index[:, live] = rows

    @property
    def nbytes(self) -> int:
        """Bytes of the index and of the tail store."""
        return self.index.nbytes + self.tail.nbytes


def renumbered(index: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``index`` naming slots ``1, 2, ...`` of a new tail that holds the slots of ``tail`` it
    named, in the order it names them (slot 0, zeros, first); chained rows stay chained."""
    named = index > 0
    used = index[named]
    out = index.astype(np.int32)
    out[named] = np.arange(1, used.size + 1, dtype=np.int32)
    return out, np.concatenate([tail[:1], tail[used]])


def as_rows(array: np.ndarray) -> np.ndarray:
    """A C-contiguous ``[rows, ...]`` array seen as one opaque value per row (a view): numpy
    gathers and assigns fancy-indexed whole rows several times faster this way. Values assigned
    through it must have the array's dtype and row shape."""
    flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return flat.view(_opaque(flat.shape[1] * flat.itemsize)).reshape(-1)


@functools.cache
def _opaque(nbytes: int) -> np.dtype:
    """The dtype of ``nbytes`` opaque bytes (made once: making one costs more than the view)."""
    return np.dtype((np.void, nbytes))
