"""Filling: the writing half of `FlexibleBuffer`, by hand (recorders go through `Writer`):
fields, rows and episodes' ends, and whole episodes moved in and out as chunks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError, SpecMismatchError
from flexibuff_envs.files import chunk
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.index import episode_table, newest_fitting, newest_rows
from flexibuff_envs.index.episode_ends import write_episode_returns
from flexibuff_envs.index.lanes import ALL, Episode, Lane
from flexibuff_envs.index.origins import ORIGIN, Origin, origin
from flexibuff_envs.interrupts import holding
from flexibuff_envs.sampling import Half
from flexibuff_envs.sampling.samplers import live_rows
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage.fields import NEXT

#: rows of a lane given their allocated values at a time, as recording reaches them
_OPEN_ROWS = 1024


class Filling(Half):
    """The writing half of `FlexibleBuffer`."""

    _sessions: list[dict[str, Any]]

    if TYPE_CHECKING:  # given by `FlexibleBuffer`

        def _flush_log(self, lanes: Sequence[int] | None = None) -> None: ...

        def _settle_log(self, rows: np.ndarray | slice | None = None) -> None: ...

    def check_matches(self, spec: BufferSpec) -> None:
        """Raise `SpecMismatchError` naming the first layout field where this buffer differs (the
        number of lanes aside: recorders claim lanes, see `Writer.claim_lanes`)."""
        for name in BufferSpec.LAYOUT_FIELDS:
            if name == "n_envs" or (name == "extra_fields" and not spec.extra_fields):
                continue  # recorders claim lanes; a recorder need not fill every field of your own
            mine, theirs = getattr(self.spec, name), getattr(spec, name)
            if name == "action_mask" and mine and not theirs and spec.discrete_action_cardinalities:
                continue  # masks may still arrive through info["action_mask"]
            if mine != theirs:
                raise SpecMismatchError(
                    f"buffer does not match the env: {name} is {mine!r} in the buffer but the env needs {theirs!r}"
                )

    @holding
    def field(self, name: str, *, width: int | None = None) -> np.ndarray:
        """The storage array of ``name``, allocated on first use, to fill a buffer by hand.

        Every row holds its default values from then on (NaN ``G``, all actions legal, ...), so
        what you write into any row stays. A next-value field (``obs_``, ``state_``,
        ``action_mask_``) is kept once, in the next row of its base field; asking for its array
        writes every row's value out, until `compact` or a recorder stores it once again.
        """
        self._settle_log()
        for lane in self._index.change():
            if lane.opened != ALL:
                self._open(lane, lane.open_limit)
        return self._column(name, width=width)

    def _column(self, name: str, *, width: int | None = None) -> np.ndarray:
        """`field` for recorders: rows get their default values as they are claimed."""
        chain = self._store.chains.get(name)
        if chain is not None:
            if len(chain.holders):
                raise InvalidArgumentError(
                    f"{name} is stored once, in the next row of {NEXT[name]}, while a "
                    f"recorder writes this buffer; read it from a sampled batch"
                )
            rows = np.arange(self._store.rows)
            explicit = chain.gather(rows, *self._store.successors(rows))
            del self._store.chains[name]
            self._store.put(name, explicit)
        array = self._store.ensure(name, width=width)
        for next_name, base in NEXT.items():  # a base field comes with its next values
            if base == name and next_name not in self._store.chains and next_name not in self._store.arrays:
                self._store.chain(next_name)
        return array

    @holding
    def compact(self) -> None:
        """Store each next value filled in by hand once: where ``obs_`` (``state_``,
        ``action_mask_``) of a row equals its base field at the lane's next row, bit for bit,
        it is read from there; other rows keep their own copy."""
        self._settle_log()
        if any(name in self._store.arrays for name in NEXT):
            lanes = self._index.read()
            self._store.compact(live_rows(lanes), newest_rows(lanes))

    @holding
    def write_next(self, name: str, rows: np.ndarray, values: np.ndarray, ends: np.ndarray | None = None) -> None:
        """Fill in the next values (``obs_``, ``state_``, ``action_mask_``) of ended episodes'
        ``rows``, each episode's in order, episodes back to back, once their base field is
        written: each value is stored once, in the next row, where it equals that row's base
        value bit for bit, and apart otherwise (always at an episode's last row: positions
        ``ends`` of ``rows``, by default the last one). ``values`` are as `field` holds them, rows
        on the axis before the last. What an import does instead of `field` and `compact`."""
        if name not in NEXT:
            raise InvalidArgumentError(f"write_next: {name!r} is none of the next-value fields {list(NEXT)}")
        rows = np.asarray(rows)
        if name in self._store.arrays:  # written out row by row (`field`) until `compact`
            self._store.arrays[name][..., rows, :] = values
            return
        chainable = np.ones(rows.size, dtype=bool)
        chainable[rows.size - 1 if ends is None else ends] = False
        self._store.chain(name).absorb(values, rows, np.append(rows[1:], rows[-1:]), chainable)

    @holding
    def _enable_action_mask(self) -> None:
        """Record action masks from now on (a recorder calls this when masks first appear)."""
        lanes = self._index.change()
        self.spec = self._store.spec = dataclasses.replace(self.spec, action_mask=True)
        chain = self._store.chain("action_mask_")
        # rows recorded before: every action was legal, and is next
        chain.fill(*episode_table(lanes, running=True).all_rows(), self._store.fill("action_mask"))

    def begin_episode(self, lane: int = 0, *, seed: int | None = None) -> None:
        """Start an episode in ``lane``, its env reset with ``seed`` (kept in its origin,
        `episode_origins`, so it can be replayed).

        An episode still running there (say, in a loaded file) is closed first as truncated:
        its last row's active agents get ``truncated=True`` and ``G`` without a bootstrap.
        """
        if seed is not None and (
            not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64
        ):
            raise InvalidArgumentError(f"begin_episode: seed must be an int in [0, 2**64) or None, got {seed!r}")
        self._begin_episode(lane, origin(len(self._sessions) - 1, 0, lane, 0, seed))

    @holding
    def _begin_episode(self, lane: int, origin: Origin) -> None:
        """`begin_episode` of an episode of ``origin`` (a recorder's)."""
        lane_ = self._index.change()[lane]
        running = lane_.running
        if running is not None and running.end > running.start:
            last = lane_.offset + (running.end - 1) % self.num_steps
            self._store.arrays["truncated"][:, last] |= self._store.arrays["active"][:, last]
            self.end_episode(lane)
        lane_.begin(origin)

    @holding
    def claim_row(self, lane: int = 0) -> int:
        """The row for the next step of ``lane``'s running episode (may forget the oldest one)."""
        return self._index.change()[lane].claim()

    @holding
    def claim_rows(self, n: int, lane: int = 0) -> np.ndarray:
        """The rows for the next ``n`` steps of ``lane``'s running episode, as ``n`` calls of
        `claim_row` give them (an episode longer than the lane keeps its last steps' rows last)."""
        lane_ = self._index.change()[lane]
        blocks = [lane_.claim_block(min(lane_.capacity, n - done)) for done in range(0, n, lane_.capacity)]
        rows = [np.arange(b.start, b.stop) if isinstance(b, slice) else b for b in blocks]
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)

    def _open(self, lane: Lane, needed: int) -> None:
        """Give the rows of ``lane`` up to position ``needed`` (and `_OPEN_ROWS` more) their
        fields' allocated values: a ring is filled as it is first used, not when it is made."""
        upto = min(lane.open_limit, needed + _OPEN_ROWS)
        self._store.open(lane.offset // self.num_steps, lane.segments(lane.opened, upto))
        lane.open_to(upto)

    def _forget(self, lane: Lane, episode: Episode) -> None:
        for lo, hi in lane.segments(episode.start, episode.end):  # slices: the common case is one
            self._forget_rows(slice(lo, hi))

    def _forget_rows(self, rows: np.ndarray | slice) -> None:
        """``rows`` (indices, or a slice) are no longer recorded: no ``G``, and their next-value
        slots come back."""
        self._settle_log(rows)
        self._store.arrays["G"][:, rows] = np.nan
        for chain in self._store.chains.values():
            chain.forget(rows)

    @holding
    def end_episode(self, lane: int = 0, *, bootstrap: np.ndarray | float | None = None) -> None:
        """Close ``lane``'s running episode and write ``G`` of every agent still in it.

        Args:
            bootstrap: ``V(obs_)`` after each agent's last step, scalar or ``[n_agents]``
                (None: 0, as after a termination).
        """
        self._end_episode(self._index.change()[lane], bootstrap)
        self._flush_log([lane])

    def _end_episode(self, lane_: Lane, bootstrap: np.ndarray | float | None) -> None:
        """`end_episode` of the lane ``lane_`` but for the log: a recorder sends the episode there
        once its step is whole."""
        running = lane_.running
        if running is not None and running.end > running.start and lane_.agents.running():
            write_episode_returns(self._store, lane_, running, bootstrap, self.gamma, self.gae_lambda)
        lane_.end()

    @holding
    def finish_path(self, last_values: np.ndarray | float = 0.0) -> None:
        """Write ``G`` of still-running episodes at a rollout cut, bootstrapping from ``last_values``.

        Agents whose own episode already ended inside a running one (dead while others play on)
        keep the ``G`` written at their termination.

        Args:
            last_values: ``V`` of each lane's current observation: a scalar, ``[n_agents]``,
                ``[n_envs]`` or ``[n_envs, n_agents]``.
        """
        values = np.broadcast_to(
            np.asarray(last_values, dtype=np.float64).reshape(
                (-1, 1) if np.ndim(last_values) == 1 and self.spec.n_envs > 1 else np.shape(last_values)
            ),
            (self.spec.n_envs, self.spec.n_agents),
        )
        for i, lane in enumerate(self._index.change()):
            if lane.running is not None and lane.running.end > lane.running.start:
                write_episode_returns(self._store, lane, lane.running, values[i], self.gamma, self.gae_lambda)

    # ------------------------------------------------------------------ moving episodes

    @holding
    def take_episodes(self) -> Chunk:
        """Hand out every ended whole episode as a `Chunk` (plain numpy arrays, cheap to send to
        another process) and forget all ended episodes here; a running episode goes on recording.
        """
        self.compact()  # next values filled in by hand travel chained too
        lanes = self._index.change()
        return chunk.take(self._store, lanes, self.gamma, self.gae_lambda)

    @holding
    def copy_episodes(self, rows: int | None = None) -> Chunk:
        """Every ended whole episode as a `Chunk`, as `take_episodes` hands them out, but kept
        here too; with ``rows``, only the last that fit in ``rows`` rows (lane by lane, oldest
        first: of one lane, its newest)."""
        self.compact()
        episodes = episode_table(self._index.read())
        if rows is not None and episodes.lengths.sum() > rows:
            first = newest_fitting(episodes.lengths, rows)
            origins = None if episodes.origins is None else episodes.origins[first:]
            episodes = dataclasses.replace(
                episodes,
                starts=episodes.starts[first:],
                ends=episodes.ends[first:],
                offsets=episodes.offsets[first:],
                origins=origins,
            )
        return chunk.copy(self._store, episodes, self.gamma, self.gae_lambda)

    @holding
    def extend(self, episodes: Chunk, lane: int = 0) -> int:
        """Append the whole episodes of a `Chunk` (from `take_episodes`) to ``lane``, with the
        ``G``, masks and annotations they were recorded with; returns how many were appended.

        The lane's oldest episodes are forgotten to make room, as when recording; if the chunk
        holds more than the lane, only its newest episodes that fit are appended. A lane a
        recorder is writing cannot be extended.

        Raises:
            SpecMismatchError: the chunk's layout, ``gamma`` or ``gae_lambda`` differ from this
                buffer's (the message names which). Nothing is changed then.
        """
        lanes = self._index.change()
        chunk.check(episodes, self._store, lanes, lane, self.gamma, self.gae_lambda)
        lane_ = lanes[lane]
        kept = episodes.newest(lane_.capacity)
        if not kept.n_episodes:
            return 0
        self.compact()  # next values filled in by hand are chained first, like the chunk's
        if kept.spec.action_mask and not self.spec.action_mask:
            self._enable_action_mask()
        for part in kept.parts:
            if part.part is None:
                self._column(part.name, width=part.shape[-1] if part.name == "continuous_log_probs" else None)
        # where they came from, but for the session: this buffer's sessions are not the source's
        origins = np.zeros(kept.n_episodes, ORIGIN) if kept.origins is None else kept.origins.copy()
        origins["session"] = -1
        first = lane_.append(kept.lengths, origins)
        self._store.insert(kept.parts, lane_.segments(first, first + kept.rows), np.cumsum(kept.lengths) - 1)
        self._flush_log()
        return kept.n_episodes
