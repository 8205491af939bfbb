"""Preallocated numpy arrays, one per field, agent-major like FlexiBuff.

Per-agent fields are ``[n_agents, rows, ...]``, global ones ``[rows, ...]``. A field is either
allocated up front (the constructor asked for it) or on first use (`Storage.ensure`), never by
catching an exception, and an absent field is ``None`` on every batch. The next-value fields
(`NEXT`) are kept as a `Chain` on their base field, or as plain arrays when filled by hand.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.batch import FlexiBatch
from flexibuff_envs.chain import CHAINED, Chain, TakeMode, zeroed
from flexibuff_envs.codecs import index_dtype
from flexibuff_envs.episodes import segment_rows
from flexibuff_envs.errors import ArgumentTypeError, InvalidArgumentError, plain_dtype
from flexibuff_envs.nstep import Windows, discounted_sum
from flexibuff_envs.returns import episode_gae, episode_returns, gae, segmented_scan
from flexibuff_envs.spec import BufferSpec

if TYPE_CHECKING:
    from flexibuff_envs.episodes import Episode, Lane


@dataclass(frozen=True)
class Field:
    """How one field is laid out."""

    per_agent: bool
    dtype: str
    fill: float | bool
    #: which spec size gives the trailing dimension ("" for a scalar per row)
    width: str = ""
    #: a fixed trailing shape (fields of your own, `extra_fields`)
    shape: tuple[int, ...] = ()


FIELDS: dict[str, Field] = {
    "obs": Field(True, "obs", 0, "obs_size"),
    "obs_": Field(True, "obs", 0, "obs_size"),
    "state": Field(False, "float32", 0, "state_size"),
    "state_": Field(False, "float32", 0, "state_size"),
    "discrete_actions": Field(True, "int64", 0, "n_heads"),
    "continuous_actions": Field(True, "float32", 0, "continuous_action_dimension"),
    # legal-action masks as bits, eight actions a byte (`pack_mask`); 255: all legal
    "action_mask": Field(True, "uint8", 255, "mask_bytes"),
    "action_mask_": Field(True, "uint8", 255, "mask_bytes"),
    "individual_rewards": Field(True, "float32", 0),
    "individual_auxiliary_rewards": Field(True, "float32", 0),
    "global_rewards": Field(False, "float32", 0),
    "global_auxiliary_rewards": Field(False, "float32", 0),
    "discrete_log_probs": Field(True, "float32", np.nan, "n_heads"),
    "continuous_log_probs": Field(True, "float32", np.nan, "log_prob_continuous"),
    "values": Field(True, "float32", np.nan),
    "advantages": Field(True, "float32", np.nan),
    "returns": Field(True, "float32", np.nan),
    "terminated": Field(True, "bool", False),
    "truncated": Field(True, "bool", False),
    "active": Field(True, "bool", False),
    "G": Field(True, "float32", np.nan),
    "memory_weights": Field(False, "float32", 1.0),
}

#: batch fields an n-step draw makes (`Storage.gather_n_step`) rather than gathers
N_STEP_MADE = ("discounts", "n_steps")
#: names a field of your own cannot take: the batch's own attributes
RESERVED = frozenset({*FIELDS, *(f.name for f in dataclasses.fields(FlexiBatch))})
#: most values one row of a field of your own may hold
MAX_EXTRA_SIZE = 1 << 24


def extra_fields(fields: Mapping[str, object] | None) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """Fields of your own as a spec holds them, ``(name, shape, dtype name)``, from ``{name:
    shape}`` or ``{name: (shape, dtype)}`` (dtype float32 unless given), or ValueError naming the
    field that is not a new identifier with a shape of positive sizes and a plain numeric dtype."""
    if fields is None:
        return ()
    if not isinstance(fields, Mapping):
        raise ArgumentTypeError(f"extra_fields must map names to shapes, e.g. {{'hidden': (64,)}}, got {fields!r}")
    out = []
    for name, given in fields.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in RESERVED:
            raise InvalidArgumentError(
                f"extra_fields: {name!r} must be a Python name that is not a batch field "
                f"already ({', '.join(sorted(RESERVED))})"
            )
        shape, dtype = (
            given
            if (isinstance(given, (tuple, list)) and len(given) == 2 and isinstance(given[1], (str, type, np.dtype)))
            else (given, "float32")
        )
        shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
        if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape
        ):
            raise InvalidArgumentError(
                f"extra_fields: {name!r} needs a shape of positive sizes such as (64,), got {given!r}"
            )
        if int(np.prod(shape)) > MAX_EXTRA_SIZE:
            raise InvalidArgumentError(
                f"extra_fields: {name!r} holds {int(np.prod(shape)):,} values a row, more than {MAX_EXTRA_SIZE:,}"
            )
        out.append((name, tuple(int(d) for d in shape), plain_dtype(f"extra_fields {name!r} dtype", dtype).name))
    return tuple(out)


def field_table(spec: BufferSpec) -> dict[str, Field]:
    """Every field a buffer of ``spec`` can hold: the built-ins and the spec's own (NaN, or 0 for
    integers, until given)."""
    return {
        **FIELDS,
        **{
            name: Field(True, dtype, np.nan if np.dtype(dtype).kind == "f" else 0, "", shape)
            for name, shape, dtype in spec.extra_fields
        },
    }


#: the legal-action mask fields
MASKS = ("action_mask", "action_mask_")


def mask_bytes(width: int) -> int:
    """Bytes a mask of ``width`` actions takes as bits."""
    return -(-width // 8)


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """Legal-action flags (any nonzero is legal) as bits along the last axis, first action lowest."""
    return np.packbits(mask, axis=-1, bitorder="little")


def unpack_mask(bits: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` flags `pack_mask` packed, as bools."""
    return np.unpackbits(bits, axis=-1, count=width, bitorder="little").view(bool)


def one_hot(indices: np.ndarray, categories: tuple[int, ...]) -> np.ndarray:
    """Stored category indices (``[..., k]``, index + 1; 0: none) as their one-hot flattening."""
    offsets = np.cumsum((-1, *categories[:-1]))  # index + 1 -> position in the flattening
    out = np.zeros((*indices.shape[:-1], sum(categories)), dtype=np.float32)
    flat, stored = out.reshape(-1, out.shape[-1]), indices.reshape(-1, len(categories))
    rows, which = np.nonzero(stored)
    flat[rows, stored[rows, which] + offsets[which]] = 1.0
    return out


def category_indices(flat: np.ndarray, categories: tuple[int, ...]) -> np.ndarray:
    """One-hot flattenings (``[..., sum(categories)]``) as the indices `one_hot` reads (index + 1;
    0 where a category has no value set)."""
    bounds = np.cumsum(categories)
    out = np.zeros((*flat.shape[:-1], len(categories)), dtype=index_dtype(categories))
    rows, at = np.nonzero(flat.reshape(-1, flat.shape[-1]))
    which = np.searchsorted(bounds, at, side="right")
    out.reshape(-1, len(categories))[rows, which] = at - (bounds[which] - np.asarray(categories)[which]) + 1
    return out


def encode(spec: BufferSpec, name: str, values: np.ndarray) -> np.ndarray:
    """Values of field ``name`` as a batch shows them (masks joined over heads) as a buffer of
    ``spec`` stores them: the inverse of `Storage.decode`, for filling a buffer by hand."""
    if name in MASKS:
        return pack_mask(values)
    if name in ("obs", "obs_") and spec.obs_categories:
        return category_indices(values, spec.obs_categories)
    return values


#: each next-value field and the field whose next row holds it
NEXT = {"obs_": "obs", "state_": "state", "action_mask_": "action_mask"}
#: fields stored in another form than batches show (`Storage.decode`)
DECODED = ("obs", "obs_", *MASKS)

#: ring rows as ``[lo, hi)`` ranges, in order
Segments = Sequence[tuple[int, int]]


def _runs(segments: Segments) -> Iterator[tuple[int, int, slice]]:
    """Each ring range ``[lo, hi)`` of ``segments``, and where its rows lie when the ranges'
    rows are put back to back."""
    at = 0
    for lo, hi in segments:
        yield lo, hi, slice(at, at + hi - lo)
        at += hi - lo


def _views(array: np.ndarray, per_agent: bool, segments: Segments) -> tuple[np.ndarray, ...]:
    """The rows ``segments`` of ``array``, a view per range."""
    if len(segments) == 1:  # the common case, without building a list
        lo, hi = segments[0]
        return (array[:, lo:hi] if per_agent else array[lo:hi],)
    if per_agent:
        return tuple([array[:, lo:hi] for lo, hi in segments])
    return tuple([array[lo:hi] for lo, hi in segments])


@dataclass(frozen=True, eq=False)
class Part:
    """One array of a buffer's stored form, the one form files hold, chunks carry and memory maps
    give (`Storage.export`, `Storage.insert`, `Storage.receive`, `Storage.adopt`): field
    ``name``'s rows (``part`` None), or a chained next value's ``"index"`` (a slot per row;
    `CHAINED`: the base field at the next row) or ``"tail"`` (the slots it names, slot 0 zeros);
    ``"bools"`` while a format 1-2 file's masks are read, a bool per action, until `settle`.

    ``pieces`` hold its rows in order, ``[n_agents, n, ...]`` each for a per-agent field and
    ``[n, ...]`` else; a tail is one piece.
    """

    name: str
    part: str | None
    per_agent: bool
    pieces: tuple[np.ndarray, ...]

    @classmethod
    def of(cls, name: str, part: str | None, array: np.ndarray, per_agent: bool, segments: Segments) -> Part:
        """The rows ``segments`` of ``array`` (views)."""
        return cls(name, part, per_agent, _views(array, per_agent, segments))

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.part

    @property
    def axis(self) -> int:
        """The axis of its rows."""
        return int(self.per_agent and self.part != "tail")

    @functools.cached_property
    def shape(self) -> tuple[int, ...]:
        first, axis = self.pieces[0], self.axis
        return (*first.shape[:axis], sum(piece.shape[axis] for piece in self.pieces), *first.shape[axis + 1 :])

    @property
    def dtype(self) -> np.dtype:
        return self.pieces[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(piece.nbytes for piece in self.pieces)

    def blocks(self) -> Iterator[np.ndarray]:
        """Its values in the C order of `shape`, as pieces that are contiguous where its arrays
        are: agent after agent, each rows first to last."""
        for agent in range(self.shape[0]) if self.axis else (None,):
            for piece in self.pieces:
                yield piece if agent is None else piece[agent]

    def whole(self) -> np.ndarray:
        """Its values as one array of `shape`."""
        return self.pieces[0] if len(self.pieces) == 1 else np.concatenate(self.pieces, axis=self.axis)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Its rows ``[lo, hi)`` (a tail whole)."""
        whole = self.whole()
        return whole if self.part == "tail" else whole[:, lo:hi] if self.axis else whole[lo:hi]


class Storage:
    """The arrays of one buffer: ``rows`` rows of every allocated field."""

    def __init__(self, spec: BufferSpec, rows: int, *, lanes: int = 1, log_prob_continuous: int = 0) -> None:
        self.spec = spec
        self.rows = rows
        #: every field this storage can hold
        self.fields = field_table(spec)
        #: the names a batch may be asked for (`fields=`)
        self.known = frozenset([*self.fields, *N_STEP_MADE])
        self.lane_rows = rows // lanes
        # per lane: rows (from its first) that hold their fields' allocated values; the others are
        # still calloc's zeros, so a huge ring costs memory only as it is used (`open`)
        self.opened = [0] * lanes
        self.arrays: dict[str, np.ndarray] = {}
        self.chains: dict[str, Chain] = {}
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
        """The array of ``name``, allocated (filled with its default) on first use."""
        array = self.arrays.get(name)
        if array is None:
            field = self.fields[name]
            if width is not None:
                self._widths[field.width] = width
            # zeros that cost memory only where written: untouched rows of a huge buffer cost none
            array = zeroed(self.shape(name), self.dtype(name))
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
        if field.dtype != "obs":
            return np.dtype(field.dtype)
        return index_dtype(self.spec.obs_categories) if self.spec.obs_categories else np.dtype(self.spec.obs_dtype)

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

    def clearing(self, fresh: bool) -> list[tuple[np.ndarray, float | bool, bool]]:
        """What clearing a row writes, ``(array, value, per agent)`` for each field: its "nothing
        happened" value (NaN for values not given, weight 1, else 0). A ``fresh`` row (never
        written) holds its allocated value already: only fields allocated otherwise are listed."""
        plan = self._clearing.get(fresh)
        if plan is None:
            plan = []
            for name, array in self.arrays.items():
                fill = self.fields[name].fill
                value = fill if isinstance(fill, float) and (np.isnan(fill) or name == "memory_weights") else 0
                if not (fresh and value == self.fill(name)):
                    plan.append((array, value, self.fields[name].per_agent))
            self._clearing[fresh] = plan
        return plan

    def fill(self, name: str) -> float | bool:
        """The value field ``name`` is allocated with."""
        # a lone agent acts at every step: its rows are active once written
        return True if name == "active" and self.spec.n_agents == 1 else self.fields[name].fill

    def chain(self, name: str) -> Chain:
        """The chain of next-value field ``name``, made (with its base field) on first use."""
        chain = self.chains.get(name)
        if chain is None:
            chain = self.chains[name] = Chain(self.ensure(NEXT[name]), self.fields[name].per_agent)
        return chain

    # ----------------------------------------------------------------- returns

    def write_episode_returns(
        self,
        lane: Lane,
        episode: Episode,
        bootstrap: np.ndarray | float | None,
        gamma: float,
        lam: float,
        only: int | None = None,
    ) -> None:
        """``G`` (and GAE) of the agents still in ``episode`` of ``lane`` (or of agent ``only``),
        each over its own rows: those since it joined where it is active, discounted transition by
        transition; ``bootstrap`` is V after each agent's last step (None: 0)."""
        first = lane.offset + episode.start % lane.capacity
        steps = episode.end - episode.start
        # an episode that does not wrap is a slice: no index array on the per-episode path
        rows: slice | np.ndarray = (
            slice(first, first + steps) if first + steps <= lane.offset + lane.capacity else lane.rows(episode)
        )
        n_agents = self.spec.n_agents
        boot = None if bootstrap is None else np.broadcast_to(np.asarray(bootstrap, dtype=np.float64), (n_agents,))
        if n_agents == 1:
            self.write_returns(slice(None), rows, boot, gamma, lam)
            return
        starts = lane.agent_start
        agents = [only] if only is not None else [a for a, start in enumerate(starts) if start >= 0]
        if not agents:
            return
        active = self.arrays["active"][:, rows]
        if len(agents) == len(starts) and max(starts) <= episode.start and active.all():
            self.write_returns(slice(None), rows, boot, gamma, lam)  # every agent acted at every step: one pass
            return
        all_rows = None
        for agent in agents:
            mine = active[agent, max(starts[agent] - episode.start, 0) :]
            skipped = steps - mine.size
            acted = int(np.count_nonzero(mine))
            boot_ = None if boot is None else boot[agent : agent + 1]
            if isinstance(rows, slice) and mine[:acted].all():  # its rows are one run (AEC turns): a slice
                own: slice | np.ndarray = slice(first + skipped, first + skipped + acted)
            else:
                all_rows = lane.rows(episode) if all_rows is None else all_rows
                own = all_rows[skipped:][mine]
            if acted:
                self.write_returns(slice(agent, agent + 1), own, boot_, gamma, lam)

    def write_run_returns(
        self, rows: np.ndarray, last: np.ndarray, bootstrap: np.ndarray, gamma: float, lam: float
    ) -> None:
        """``G`` (and GAE where values were annotated) of many single-agent episodes in one pass:
        ``rows`` hold them back to back, ``last`` is the position there of each one's last row
        and ``bootstrap`` the value after it."""
        arrays = self.arrays
        rewards = arrays["individual_rewards"][0].take(rows).astype(np.float64)
        ends = np.zeros(rows.size, dtype=bool)
        ends[last] = True
        if "values" in arrays:
            boots = np.zeros(rows.size)
            boots[last] = bootstrap
            advantages, value_targets = gae(rewards, arrays["values"][0].take(rows), ends, gamma, lam, boots)
            self.ensure("advantages")[0, rows] = advantages
            self.ensure("returns")[0, rows] = value_targets
        rewards[last] += gamma * bootstrap
        arrays["G"][0, rows] = segmented_scan(rewards, gamma, ends)

    def write_returns(
        self, agents: slice, rows: slice | np.ndarray, bootstrap: np.ndarray | None, gamma: float, lam: float
    ) -> None:
        """``G`` (and GAE where values were annotated) of ``agents`` over ``rows``, one transition
        after the other."""
        arrays = self.arrays
        if "individual_rewards" in arrays:
            rewards = arrays["individual_rewards"][agents, rows]
        elif "global_rewards" in arrays:  # a hand-made buffer holding the team reward only
            team = arrays["global_rewards"][rows]
            rewards = np.broadcast_to(team, (self.spec.n_agents, team.shape[0]))[agents]
        else:
            return
        arrays["G"][agents, rows] = episode_returns(rewards, gamma, bootstrap)
        if "values" in arrays:
            advantages, value_targets = episode_gae(rewards, arrays["values"][agents, rows], gamma, lam, bootstrap)
            self.ensure("advantages")[agents, rows] = advantages
            self.ensure("returns")[agents, rows] = value_targets

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

    def gather_n_step(self, w: Windows, gamma: float, wanted: Collection[str] | None = None) -> dict[str, Any]:
        """The n-step fields of windows ``w`` (`flexibuff_envs.nstep`): each agent's discounted
        reward sum, the next values and flags after its window's last step, ``discounts``
        (``gamma ** k`` for its ``k`` steps) and ``n_steps`` (``k``); the team's reward sum and
        ``state_`` after its window."""
        arrays = self.arrays
        single = self.spec.n_agents == 1
        agent_last = w.agent_last()
        out: dict[str, Any] = {}

        def own(value: np.ndarray) -> np.ndarray:
            return value[0] if single else value

        def want(name: str) -> bool:
            return (wanted is None or name in wanted) and (name in arrays or name in self.chains)

        if want("individual_rewards"):
            rewards = arrays["individual_rewards"].take(w.rows, axis=1)
            out["individual_rewards"] = own(discounted_sum(rewards, w.mine, w.step, gamma).astype(np.float32))
        if want("global_rewards"):
            steps = np.broadcast_to(np.arange(w.rows.shape[0])[:, None], w.rows.shape)
            out["global_rewards"] = discounted_sum(
                arrays["global_rewards"].take(w.rows), w.team(), steps, gamma
            ).astype(np.float32)
        agents = np.arange(self.spec.n_agents)[:, None]
        for name in ("terminated", "truncated"):
            if want(name):  # indexed, not flattened: a mapped log's columns are not contiguous
                out[name] = own(arrays[name][agents, agent_last])
        steps = w.mine.sum(axis=1)
        if wanted is None or "discounts" in wanted:
            out["discounts"] = own((gamma**steps).astype(np.float32))
        if wanted is None or "n_steps" in wanted:
            out["n_steps"] = own(steps.astype(np.int64))
        for name, chain in self.chains.items():
            if not want(name):
                continue
            if not chain.per_agent:
                team_last = w.team_last()
                out[name] = chain.gather(team_last, *self.successors(team_last))
            elif single or (agent_last == agent_last[0]).all():  # every agent's window ends alike
                out[name] = chain.gather(agent_last[0], *self.successors(agent_last[0]), 0 if single else None)
            else:
                out[name] = np.stack(
                    [chain.gather(last, *self.successors(last), agent) for agent, last in enumerate(agent_last)]
                )
            if name in DECODED:
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

    def export(self, rows: Segments | np.ndarray, last: np.ndarray | None = None) -> list[Part]:
        """``rows`` in their stored form (`Stored`): given as ring ranges, each field's parts are
        views of its arrays; given as row numbers, copies."""
        return Stored(self, rows, last).parts()

    def insert(self, parts: Sequence[Part], segments: Segments, ends: np.ndarray) -> None:
        """Write rows in their stored form (`export`ed, whole episodes back to back) to the ring
        rows ``segments``; ``ends``: each episode's last position in them. A field the parts do
        not hold gets a fresh row's values, a next value a fresh row's value at each end."""
        given = {part.key: part.whole() for part in parts}
        for name, array in self:
            source, per_agent = given.get((name, None)), self.fields[name].per_agent
            for lo, hi, at in _runs(segments):
                target = array[:, lo:hi] if per_agent else array[lo:hi]
                if source is None:
                    target[...] = self.fill(name)
                else:
                    target[...] = source[:, at] if per_agent else source[at]
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
        if part is None:
            return Part.of(name, None, self.ensure(name), self.fields[name].per_agent, segments)
        chain = self.chain(name)
        if part == "index":
            return Part.of(name, part, chain.index, chain.per_agent, segments)
        chain.alloc(shape[0] - chain.fresh)
        return Part(name, part, False, (chain.tail[: shape[0]],))

    def settle(self, parts: Sequence[Part], segments: Segments) -> None:
        """Store what `receive` read in an older form: masks as bits."""
        for part in parts:
            if part.part == "bools":
                bools, packed = part.whole(), self.ensure(part.name)
                for lo, hi, at in _runs(segments):
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
            pieces = Part.of(name, None, array, self.fields[name].per_agent, segments).pieces
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
        return (
            sum(a.nbytes for a in self.arrays.values()) + sum(c.index.nbytes for c in self.chains.values())
        ) // self.rows


class Stored:
    """Rows of ``storage`` in their stored form, as `Part` pieces hold them, each part made when
    it is read (`get`: a writer that reads every part once pays for nothing else).

    ``rows``: ring ranges (each field's pieces are views of its arrays, one per range) or row
    numbers (copies). Each chain's parts hold the slots those rows name, renumbered ``1, 2,
    ...``; a chained row at a position in ``last`` (an episode's end, whose successor does not
    follow it in ``rows``) gets a slot with its value.
    """

    def __init__(self, storage: Storage, rows: Segments | np.ndarray, last: np.ndarray | None = None) -> None:
        self.storage, self.last = storage, last
        self._arrays, self._fields = storage.arrays, storage.fields
        # ring ranges, or the row numbers (made from the ranges once a chain needs them)
        self._segments: Segments | None = None if isinstance(rows, np.ndarray) else rows
        self._numbers: np.ndarray | None = rows if isinstance(rows, np.ndarray) else None
        self._chains: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # extracted: name -> (index, tail)

    def get(self, key: tuple[str, str | None], default: Any = None) -> Any:
        name, part = key
        if part is None:
            array = self._arrays.get(name)
            if array is None:
                return default
            per_agent = self._fields[name].per_agent
            if self._segments is not None:
                return _views(array, per_agent, self._segments)
            return (array.take(self._numbers, axis=int(per_agent)),)  # type: ignore[arg-type]
        storage = self.storage
        if name not in storage.chains or part not in ("index", "tail"):
            return default
        extracted = self._chains.get(name)
        if extracted is None:
            if self._numbers is None:
                self._numbers = segment_rows(self._segments or ())
            numbers, last = self._numbers, self.last
            cut = None if last is None else (last, functools.partial(storage.successor_rows, numbers[last]))
            extracted = self._chains[name] = storage.chains[name].extract(numbers, cut)
        return (extracted[part == "tail"],)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        name, part = key
        return (
            name in self.storage.arrays if part is None else part in ("index", "tail") and name in self.storage.chains
        )

    def __iter__(self) -> Iterator[tuple[str, str | None]]:
        yield from ((name, None) for name in self.storage.arrays)
        for name in self.storage.chains:
            yield from ((name, "index"), (name, "tail"))

    def __len__(self) -> int:
        return len(self.storage.arrays) + 2 * len(self.storage.chains)

    def parts(self) -> list[Part]:
        """Every part, made now."""
        fields, chains = self.storage.fields, self.storage.chains
        return [
            Part(
                name,
                part,
                chains[name].per_agent if part == "index" else part is None and fields[name].per_agent,
                self.get((name, part)),
            )
            for name, part in self
        ]
