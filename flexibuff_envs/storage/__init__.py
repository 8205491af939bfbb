"""The arrays a buffer's rows live in, and every form a value is stored in: `Storage` here; the
fields and their encodings (`fields`), next values kept once (`next_values`), what recorders
write through (`holders`, `row_writers`), the one form rows leave and enter in (`stored_form`),
rows kept as zstd frames (`packed`, `packed_ring`, `compression`). Imports: `spec` and below.

Preallocated numpy arrays, one per field, agent-major like FlexiBuff.

Per-agent fields are ``[n_agents, rows, ...]``, global ones ``[rows, ...]``. A field is either
allocated up front (the constructor asked for it) or on first use (`Storage.ensure`), never by
catching an exception, and an absent field is ``None`` on every batch. The next-value fields
(`NEXT`) are kept as a `Chain` on their base field, or as plain arrays when filled by hand.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec, index_dtype
from flexibuff_envs.storage.compression import Compress, plan
from flexibuff_envs.storage.fields import (
    DECODED,
    MASKS,
    N_STEP_MADE,
    NEXT,
    encoder,
    field_table,
    mask_bytes,
    one_hot,
    pack_mask,
    unpack_mask,
)
from flexibuff_envs.storage.holders import Held, HeldBatch
from flexibuff_envs.storage.next_values import CHAINED, Alloc, Chain, TakeMode, zeroed
from flexibuff_envs.storage.packed_ring import PackedRing
from flexibuff_envs.storage.stored_form import Decoded, Part, Segments, Stored, Streamed, runs, segment_rows

#: the fields a storage may keep compressed in memory (`PackedRing`): observations and states
PACKABLE = ("obs", "state")


def packable(compress: Compress) -> Compress:
    """``compress``, checked as a buffer's: a policy `plan` takes, naming only fields of `PACKABLE`."""
    plan(compress, "", np.dtype(np.uint8), 0)
    for name, codec in compress.items() if isinstance(compress, Mapping) else ():
        if name not in PACKABLE:
            raise InvalidArgumentError(f"compress: {name!r} is not kept compressed in memory; only {PACKABLE} are")
        plan(compress, name, np.dtype(np.uint8), 0)  # its codec is one
    return compress


class Storage:
    """The arrays of one buffer: ``rows`` rows of every allocated field."""

    def __init__(
        self, spec: BufferSpec, rows: int, *, lanes: int = 1, log_prob_continuous: int = 0, compress: Compress = None
    ) -> None:
        self.spec, self.compress = spec, compress  # `compress`: which of `PACKABLE` are kept as `PackedRing`
        self.rows = rows
        #: every field this storage can hold
        self.fields = field_table(spec)
        #: the names a batch may be asked for (`fields=`)
        self.known = frozenset([*self.fields, *N_STEP_MADE])
        self.lane_rows = rows // lanes
        # per lane: rows (from its first) holding their allocated values; the rest are calloc's zeros
        self.opened = [0] * lanes
        self.arrays: dict[str, np.ndarray] = {}
        self.chains: dict[str, Chain] = {}
        self.alloc: Alloc = zeroed  # what makes its arrays (a logging buffer's: files, `log.ring_files`)
        # (fresh?) -> what clearing a row writes: (array, value, per agent); None once arrays change
        self._clearing: dict[bool, list[tuple[np.ndarray, float | bool, bool]]] = {}
        self._widths = {
            "obs_size": len(spec.obs_categories) or spec.obs_size,
            "state_size": spec.state_size or 0,
            "n_heads": len(spec.discrete_action_cardinalities),
            "continuous_action_dimension": spec.continuous_action_dimension,
            "mask_bytes": mask_bytes(sum(spec.discrete_action_cardinalities)),
            "log_prob_continuous": log_prob_continuous,
        }

    def shape(self, name: str) -> tuple[int, ...]:
        """The full array shape of field ``name``."""
        field = self.fields[name]
        lead = (self.spec.n_agents, self.rows) if field.per_agent else (self.rows,)
        return lead + ((self._widths[field.width],) if field.width else ()) + field.shape

    def ensure(self, name: str, *, width: int | None = None) -> np.ndarray:
        """The array of ``name``, allocated (filled with its default) on first use (a
        `PackedRing` where ``compress`` keeps it compressed: it reads and writes as the array)."""
        array: Any = self.arrays.get(name)
        if array is None:
            field = self.fields[name]
            if width is not None:
                self._widths[field.width] = width
            shape, dtype, per_agent = self.shape(name), self.dtype(name), self.fields[name].per_agent
            packed = name in PACKABLE and plan(self.compress, name, dtype, shape[-1] * dtype.itemsize)
            # else zeros that cost memory only where written: untouched rows of a huge buffer cost none
            array = PackedRing(shape, dtype, per_agent, name) if packed else self.alloc(shape, dtype, name)
            fill = self.fill(name)
            if fill:
                for lane, opened in enumerate(self.opened):
                    first = lane * self.lane_rows
                    self._fill(array, name, first, first + opened)
            self.put(name, array)
        return array

    def dtype(self, name: str) -> np.dtype:
        """The dtype field ``name`` is stored in."""
        field = self.fields[name]
        if field.dtype == "obs":
            return index_dtype(self.spec.obs_categories) if self.spec.obs_categories else np.dtype(self.spec.obs_dtype)
        return np.dtype(self.spec.state_dtype if field.dtype == "state" else field.dtype)

    def _fill(self, array: np.ndarray, name: str, lo: int, hi: int) -> None:
        if self.fields[name].per_agent:
            array[:, lo:hi] = self.fill(name)
        else:
            array[lo:hi] = self.fill(name)

    def open(self, lane: int, segments: Segments, *, fill: bool = True) -> None:
        """Rows ``segments`` (ranges ``[lo, hi)`` of lane ``lane``'s) get their fields' allocated
        values (``fill=False``: they are left as they are); a field allocated later fills them
        too, with every row of the lane before them."""
        first = lane * self.lane_rows
        for lo, hi in segments:
            if fill:
                self.refill(lo, hi)
            self.opened[lane] = max(self.opened[lane], hi - first)

    def refill(self, lo: int, hi: int) -> None:
        """Rows ``[lo, hi)`` hold their fields' allocated values again (NaN ``G``, active, ...)."""
        for name, array in self.arrays.items():
            if self.fill(name):
                self._fill(array, name, lo, hi)

    def put(self, name: str, array: np.ndarray) -> None:
        """Hold ``array`` as field ``name``."""
        self.arrays[name] = array
        self._clearing.clear()

    def pop(self, name: str) -> np.ndarray:
        """Field ``name``'s array, no longer held."""
        self._clearing.clear()
        return self.arrays.pop(name)

    def replace(self, arrays: dict[str, np.ndarray]) -> None:
        """Hold ``arrays`` instead of every current field (a mapped file's)."""
        self.arrays = arrays
        self._clearing.clear()

    def clear(self, row: int, agents: list[int] | None = None, *, fresh: bool = False) -> None:
        """Reset ``row`` to "nothing happened" (NaN for values not given, weight 1, else 0: agents
        inactive, rewards 0, no legal actions; next values slot 0, zeros). ``agents``: only these
        agents' per-agent fields (None: every field). ``fresh``: the row was never written, so
        only the fields allocated with another value than that are written."""
        plan = self._clearing.get(fresh)
        if plan is None:  # made whole, then kept: an interrupted making keeps nothing
            plan = []
            for name, array in self.arrays.items():
                fill = self.fields[name].fill
                value = fill if isinstance(fill, float) and (np.isnan(fill) or name == "memory_weights") else 0
                if not (fresh and value == self.fill(name)):
                    plan.append((array, value, self.fields[name].per_agent))
            self._clearing[fresh] = plan
        who = slice(None) if agents is None else agents
        for array, value, per_agent in plan:
            if per_agent:
                array[who, row] = value
            elif agents is None:
                array[row] = value
        for chain in [] if fresh else self.chains.values():  # a fresh row reads slot 0
            if chain.per_agent:
                chain.index[who, row] = 0
            elif agents is None:
                chain.index[row] = 0

    def fill(self, name: str) -> float | bool:
        """The value field ``name`` is allocated with."""
        # a lone agent acts at every step: its rows are active once written
        return True if name == "active" and self.spec.n_agents == 1 else self.fields[name].fill

    def chain(self, name: str) -> Chain:
        """The chain of next-value field ``name``, made (with its base field) on first use."""
        chain = self.chains.get(name)
        if chain is None:
            chain = self.chains[name] = Chain(
                self.ensure(NEXT[name]), self.fields[name].per_agent, alloc=self.alloc, name=name
            )
        return chain

    def holder(self, name: str, codec: ObsCodec | ActionCodec, agent: int | None, lane: int) -> Held:
        """A `Held` writing next-value field ``name`` of ``agent`` (None: a global field) in lane
        ``lane``, for values of ``codec``'s space, in the field's stored form (`fields.encoder`)."""
        first, stored = lane * self.lane_rows, encoder(self.spec, name, codec)
        return Held(self.chain(name), agent, stored.writer, stored.size, (first, first + self.lane_rows))

    def batch_holder(self, name: str, n: int) -> HeldBatch:
        """A `HeldBatch` writing next-value field ``name`` of ``n`` single-agent lanes."""
        return HeldBatch(self.chain(name), 0, n)

    # ----------------------------------------------------------------- reading: every encoding undone here

    def successors(self, rows: np.ndarray) -> tuple[np.ndarray, TakeMode]:
        """Each row's successor in its lane (where a chained next value is read), as indices and
        the ``take`` mode that makes them rows."""
        if len(self.opened) == 1:  # one lane is the whole ring
            return rows + 1, "wrap"
        following = rows + 1
        return following - self.lane_rows * (following % self.lane_rows == 0), "raise"

    def successor_rows(self, rows: np.ndarray) -> np.ndarray:
        """`successors` as plain buffer rows."""
        succ, mode = self.successors(rows)
        return succ % self.rows if mode == "wrap" else succ

    def gather(self, idx: np.ndarray, wanted: Collection[str] | None = None) -> dict[str, Any]:
        """The rows ``idx`` (any integer shape) of the fields ``wanted`` (None: every allocated
        one) as a batch shows them: next values read through their chains, category indices as
        their one-hot flattening, mask bits as one bool array per action head."""
        single = self.spec.n_agents == 1
        out: dict[str, Any] = {}
        arrays = self.arrays
        for name in arrays if wanted is None else wanted:
            array = arrays.get(name)
            if array is None:
                continue
            if self.fields[name].per_agent:
                out[name] = array[0].take(idx, axis=0) if single else array.take(idx, axis=1)
            else:
                out[name] = array.take(idx, axis=0)
        chains = [(name, chain) for name, chain in self.chains.items() if wanted is None or name in wanted]
        if chains:
            succ, mode = self.successors(idx)
            for name, chain in chains:
                out[name] = chain.gather(idx, succ, mode, 0 if single and chain.per_agent else None)
        if self.spec.obs_categories or "action_mask" in arrays:  # else nothing is stored in another form
            for name in [name for name in DECODED if name in out]:
                out[name] = self.decode(name, out[name])
        return out

    def decode(self, name: str, values: np.ndarray) -> Any:
        """Stored values of field ``name`` as a batch shows them."""
        if name in MASKS:
            cards = self.spec.discrete_action_cardinalities
            return np.split(unpack_mask(values, sum(cards)), np.cumsum(cards)[:-1], axis=-1)
        if name in ("obs", "obs_") and self.spec.obs_categories:
            return one_hot(values, self.spec.obs_categories)
        return values

    def next_value(self, name: str, row: int, agent: int | None = None) -> np.ndarray:
        """Next-value field ``name`` of one row (of ``agent``'s), as a batch shows it."""
        chain = self.chains[name]
        value = chain.value(row, int(self.successor_rows(np.array(row))), agent if chain.per_agent else None)
        return self.decode(name, value)

    # ----------------------------------------------------------------- the stored form, out and in

    def export(
        self, rows: Segments | np.ndarray, last: np.ndarray | None = None, *, blocked: bool = False
    ) -> list[Part]:
        """``rows`` in their stored form (`Stored`): views of the arrays for ring ranges, else
        copies; ``blocked``: rows kept compressed decoded a block at a time as read (a file's writer)."""
        return Stored(self, rows, last).parts(blocked=blocked)

    def insert(self, parts: Sequence[Part], segments: Segments, ends: np.ndarray) -> None:
        """Write rows in their stored form (`export`ed, whole episodes back to back) to the ring
        rows ``segments``; ``ends``: each episode's last position in them. A field the parts do
        not hold gets a fresh row's values, a next value a fresh row's value at each end."""
        given = {part.key: part.whole() for part in parts}
        for name, array in self:
            source, per_agent = given.get((name, None)), self.fields[name].per_agent
            for lo, hi, at in runs(segments):
                span = (slice(None), slice(lo, hi)) if per_agent else slice(lo, hi)
                array[span] = self.fill(name) if source is None else source[:, at] if per_agent else source[at]
        rows = segment_rows(segments)
        for name, chain in self.chains.items():
            if (name, "index") in given:
                chain.insert(rows, given[name, "index"], given[name, "tail"])
            else:
                chain.fill(rows, ends, self.fill(NEXT[name]))

    def receive(self, name: str, part: str | None, shape: tuple[int, ...], dtype: np.dtype, segments: Segments) -> Part:
        """Where a file's part ``(name, part)`` of ``shape`` and ``dtype`` is read to, for the ring
        rows ``segments``: views of the arrays it is held in (`settle` finishes what is read in
        an older form)."""
        if part is None and name in NEXT:  # formats 1-2: next values written out row by row
            self.chains.pop(name, None)
        if part is None and name in MASKS and dtype == bool:  # formats 1-2: a bool per action
            return Part(name, "bools", False, (np.ones(shape, dtype=bool),))
        if part is None and isinstance(self.ensure(name), PackedRing):
            return Streamed.over(name, self.arrays[name], self.fields[name].per_agent, segments)
        if part is None:
            return Part.of(name, None, self.ensure(name), self.fields[name].per_agent, segments)
        chain = self.chain(name)
        if part == "index":
            return Part.of(name, part, chain.index, chain.per_agent, segments)
        chain.alloc(shape[0] - chain.fresh)
        return Part(name, part, False, (chain.tail[: shape[0]],))

    def settle(self, parts: Sequence[Part], segments: Segments) -> None:
        """Store what `receive` read in another form: masks as bits, a compressed field's last rows."""
        for part in parts:
            if isinstance(part, Streamed):
                part.flush()
            if part.part == "bools":
                bools, packed = part.whole(), self.ensure(part.name)
                for lo, hi, at in runs(segments):
                    packed[:, lo:hi] = pack_mask(bools[:, at])

    def adopt(self, arrays: Mapping[tuple[str, str | None], np.ndarray]) -> None:
        """Hold a mapped file's parts, every ring row of every lane, instead of any array."""
        self.replace(
            {
                name: pack_mask(array) if name in MASKS and array.dtype == bool else array
                for (name, part), array in arrays.items()
                if part is None
            }
        )  # formats 1-2: a bool per action
        self.chains = {
            name: Chain(self.arrays[NEXT[name]], self.fields[name].per_agent, index=index, tail=arrays[name, "tail"])
            for (name, part), index in arrays.items()
            if part == "index"
        }

    def problem(self, segments: Segments, live: np.ndarray, newest: np.ndarray) -> str | None:
        """What is wrong with the values of rows ``segments`` given from outside (a file) that
        sampling uses as indices or flags, or None: bools 0 or 1; category indices within their
        categories; next-value indices naming a slot of the tail, no two of the ``live`` rows
        one slot, and no lane's ``newest`` row chained (its successor is not recorded)."""
        categories = np.asarray(self.spec.obs_categories)
        for name, array in self:
            per_agent = self.fields[name].per_agent
            # rows kept compressed: a block at a time
            part = Part.of(name, None, array, per_agent, segments) if isinstance(array, np.ndarray) else None
            pieces = part.pieces if part is not None else Decoded.over(name, array, per_agent, segments).blocks()
            if array.dtype == bool and any(piece.view(np.uint8).max(initial=0) > 1 for piece in pieces):
                return f"{name} holds a bool that is neither 0 nor 1"
            if name == "obs" and categories.size and any((piece > categories).any() for piece in pieces):
                return "obs names a category past its space's size"
        if categories.size and "obs_" in self.chains and (self.chains["obs_"].tail > categories).any():
            return "obs_ names a category past its space's size"
        if not live.size:
            return None
        for name, chain in self.chains.items():
            pieces = Part.of(name, "index", chain.index, chain.per_agent, segments).pieces
            if any(((piece < CHAINED) | (piece >= len(chain.tail))).any() for piece in pieces):
                return f"{name} names a slot outside its {len(chain.tail)} stored ones"
            slots = chain.index.take(live, axis=-1)
            slots = slots[slots > 0]
            if np.unique(slots).size != slots.size:
                return f"{name} gives two rows one stored slot"
            if (chain.index.take(newest, axis=-1) == CHAINED).any():
                return f"{name} chains a lane's newest row to a row not recorded"
        return None

    def compact(self, live: np.ndarray, newest: np.ndarray) -> None:
        """Keep next values given row by row (filled in by hand, or an old file's) once: chained
        where a row's equals its base field at the next row, bit for bit (not for a lane's
        ``newest`` row: its successor is not recorded), else in a slot of its own."""
        for name in [name for name in NEXT if name in self.arrays]:
            explicit = self.pop(name)
            self.chain(name).absorb(
                explicit.take(live, axis=-2), live, self.successor_rows(live), ~np.isin(live, newest)
            )

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        return iter(self.arrays.items())

    @property
    def nbytes(self) -> int:
        """Bytes held by all allocated arrays."""
        return sum(a.nbytes for a in self.arrays.values()) + sum(c.nbytes for c in self.chains.values())

    @property
    def row_nbytes(self) -> int:
        """Bytes one row takes (a chain's tail store is not per row)."""
        return (self.nbytes - sum(c.tail.nbytes for c in self.chains.values())) // self.rows
