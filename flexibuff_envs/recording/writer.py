"""`Writer`: the one interface recorders write a `FlexibleBuffer` through.

A recorder claims lanes, claims and clears rows, and hands values to what the storage makes
for it: next values to holders (`Storage.holder`: never a raw chain), every other row value to
row writers (`rowwriters`: never a raw array); it ends agents' own episodes and (a batch
recorder) writes ``G`` of many episodes at once. None of this is on the buffer's public
surface: users fill a buffer by hand with ``field``, ``claim_row``, ``begin_episode`` and
``end_episode``, and read it through the sampling methods.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.errors import ArgumentTypeError, SpecMismatchError
from flexibuff_envs.index.episode_ends import write_episode_returns, write_run_returns
from flexibuff_envs.index.lanes import Lane, span_rows
from flexibuff_envs.index.origins import UNKNOWN, Origin
from flexibuff_envs.interrupts import holding
from flexibuff_envs.log.stage_files import Layout, StageFile
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec
from flexibuff_envs.storage.fields import MaskCodec, stored_mask, stored_obs
from flexibuff_envs.storage.holders import Held, HeldBatch
from flexibuff_envs.storage.row_writers import AgentRows, FieldRows, Reduce, TeamRows, add_feedback

if TYPE_CHECKING:
    from flexibuff_envs.buffer import FlexibleBuffer
    from flexibuff_envs.spec import BufferSpec


class Unpicklable:
    """A recorder refuses to be pickled or copied: it writes its buffer in this process, and a copy
    would record into a copy nobody reads."""

    def __reduce__(self) -> Any:
        raise ArgumentTypeError(
            f"{type(self).__name__} cannot be pickled or copied: it writes its buffer in this process, "
            "and a copy would record into a copy. SuperSuit's concat_vec_envs_v1 copies the env it is "
            "given: record the vector env it makes instead, "
            "flexibuff_envs.integrations.sb3.RecordingVecEnv(concat_vec_envs_v1(...))"
        )


class Writer:
    """Writes ``buffer`` for one recorder (``owner``). Row and agent methods touch only the
    recorder's own lanes, so they skip committing other recorders' staged steps."""

    def __init__(self, buffer: FlexibleBuffer, owner: object) -> None:
        self.buffer = buffer
        self.owner = weakref.ref(owner)
        # what it writes through: the buffer's episode index (lanes) and storage (fields, encodings)
        self.index, self.storage = buffer._index, buffer._store

    # ----------------------------------------------------------------- lanes

    @holding
    def claim_lanes(self, n: int) -> list[int]:
        """``n`` lanes no other recorder writes, written by the owner from now on (until it is
        closed or dropped): several recorders can share a buffer, one lane each.

        Raises:
            SpecMismatchError: fewer than ``n`` lanes are free; the message says what to do.
        """
        buffer, index = self.buffer, self.index
        index.commit()
        index.batched = [batch for batch in index.batched if batch.owner() is not None]
        free = [i for i, ref in enumerate(index.writers) if ref is None or ref() is None]
        if len(free) < n:
            lanes = buffer.spec.n_envs
            raise SpecMismatchError(
                f"this buffer has {lanes} lane(s), {lanes - len(free)} written by another recorder, and this "
                f"recorder needs {n}: recorders that share a buffer write one lane each (one per sub-env). "
                f"Make the buffer with a lane per recorder, fe.FlexibleBuffer.from_spec(spec, num_steps=..., "
                f"n_envs=<recorders>), or record one vector env (gymnasium.vector.SyncVectorEnv) instead"
            )
        for lane in free[:n]:
            index.writers[lane] = self.owner
        return free[:n]

    @holding
    def release_lanes(self, *, close_log: bool = False) -> None:
        """The lanes the owner claimed are free again (its env was closed), and the buffer's
        log synced, or closed (``close_log``: the owner opened it)."""
        index, owner = self.index, self.owner()
        index.commit()
        index.batched = [batch for batch in index.batched if batch.owner() not in (owner, None)]
        index.writers = [None if ref is not None and ref() is owner else ref for ref in index.writers]
        if close_log:
            self.buffer.close_log()
        else:
            self.buffer.sync_log()

    def lane(self, lane: int) -> Lane:
        """Lane ``lane`` with every staged step committed."""
        return self.index.change()[lane]

    def lanes(self, ids: list[int]) -> list[Lane]:
        """Lanes ``ids`` as they stand, without committing (for a batch recorder's own lanes)."""
        return [self.index.ring[i] for i in ids]

    def attach(self, batch: Any) -> None:
        """Register a batch recorder: it is committed (``batch.commit()``) before the buffer is read."""
        self.index.batched.append(batch)

    def uncommitted(self) -> None:
        """A batch recorder holds steps the lanes do not show yet."""
        self.index.uncommitted = True

    @property
    def spec(self) -> BufferSpec:
        """The layout of the buffer written."""
        return self.buffer.spec

    @property
    def capacity(self) -> int:
        """Rows per lane."""
        return self.buffer.num_steps

    @property
    def version(self) -> int:
        """Grows whenever the lanes were read from outside (and so may have changed)."""
        return self.index.version

    # ----------------------------------------------------------------- fields

    def agent_rows(self, agent: int, action: ActionCodec) -> AgentRows:
        """What agent ``agent``'s actions (``action``'s heads), rewards and end flags are
        written through (`rowwriters.AgentRows`)."""
        return AgentRows(self.storage, agent, action)

    def team_rows(self, reduce: Reduce | None) -> TeamRows:
        """What the rows' team rewards are written through: summed as written (``reduce`` None)
        or reduced once a row is whole."""
        return TeamRows(self.storage, reduce)

    def field_rows(self, name: str, *, width: int | None = None) -> FieldRows:
        """What annotated field (or field of your own) ``name`` is written through, allocated
        (``width`` values per row, where the field's width is free) on first use."""
        return FieldRows(self.storage, name, width)

    def has(self, name: str) -> bool:
        """Whether field ``name`` is allocated."""
        return name in self.storage.arrays

    def width(self, name: str) -> int | None:
        """Values per agent and row of vector field ``name``, once allocated (else None)."""
        array = self.storage.arrays.get(name)
        return None if array is None else int(array.shape[-1])

    def own_fields(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The buffer's fields of your own: name -> (shape per agent and row, dtype name)."""
        return {name: (shape, dtype) for name, shape, dtype in self.buffer.spec.extra_fields}

    def holder(self, name: str, codec: ObsCodec | ActionCodec, agent: int | None, lane: int) -> Held:
        """What a recorder writes next-value field ``name`` of ``agent`` in ``lane`` through, for
        values of ``codec``'s space (the action space's for masks) (`storage.Storage.holder`;
        next values written out by hand are compacted first)."""
        self._compacted(name)
        return self.storage.holder(name, codec, agent, lane)

    def batch_holder(self, name: str, n: int) -> HeldBatch:
        """What a vector recorder writes next-value field ``name`` of its ``n`` lanes through, in
        its stored form (`obs_encoder`, `mask_encoder`)."""
        self._compacted(name)
        return self.storage.batch_holder(name, n)

    def obs_encoder(self, obs: ObsCodec) -> ObsCodec:
        """What observations of ``obs``'s space are stored as (categories as indices): for a
        recorder that stages them (`fields.stored_obs`)."""
        return stored_obs(self.spec, obs)

    def mask_encoder(self, action: ActionCodec) -> MaskCodec:
        """What legal-action flags of ``action``'s space are stored as (padded bits): for a
        recorder that stages them (`fields.stored_mask`)."""
        return stored_mask(self.spec, action)

    def _compacted(self, name: str) -> None:
        if name in self.storage.arrays:  # written out by hand: stored once again first
            self.buffer.compact()

    def next_obs(self, row: int, agent: int = 0) -> np.ndarray:
        """``obs_`` of ``row`` for ``agent`` exactly as a batch shows it (`bootstrap_fn`'s input)."""
        return self.storage.next_value("obs_", row, agent)

    def as_batch(self, name: str, values: np.ndarray) -> Any:
        """Stored values of field ``name`` as a batch shows them (`Storage.decode`)."""
        return self.storage.decode(name, values)

    @property
    def logging(self) -> bool:
        """Whether the buffer sends ended episodes to an episode log."""
        return self.buffer.logging

    @property
    def logging_each_step(self) -> bool:
        """Whether ended episodes go to the buffer's log in the step they end."""
        return self.buffer.logging_each_step

    def stage_file(self, layout: Layout, lanes: list[int]) -> StageFile | None:
        """A file for a vector recorder's stage of ``lanes`` beside the buffer's ring, where its
        episode log keeps the ring in files (`log.stage_files`); else None."""
        return self.buffer._stage_file(layout, lanes)

    def flush_log(self, lanes: Sequence[int] | None = None) -> None:
        """Episodes that ended in the lanes (by default, all; else the buffer lanes ``lanes``)
        since the last flush go to the buffer's log."""
        self.buffer._flush_log(lanes)

    def enable_action_mask(self) -> None:
        """Record action masks from now on (masks first appeared in an info)."""
        self.buffer._enable_action_mask()

    def add_feedback(self, row: int, agent: int, value: float) -> None:
        """Add a human reward to agent ``agent`` in ``row`` (its auxiliary reward and the team's)."""
        self.buffer._settle_log(slice(row, row + 1))  # the episode may be pending in the log
        add_feedback(self.storage, row, agent, value)

    # ----------------------------------------------------------------- rows

    def row_claimer(self, lane: int) -> Callable[[], int]:
        """`FlexibleBuffer.claim_row` bound to one lane, for a recorder's per-step path."""
        return self.index.ring[lane].claim

    def unclaim_row(self, lane: int) -> None:
        """Give back ``lane``'s last claimed row: the step it was for could not be recorded."""
        self.index.ring[lane].unclaim()

    def claim_cleared_row(self, lane: int) -> int:
        """A claimed row reset to "nothing happened" (a row never written before needs less)."""
        lane_ = self.index.ring[lane]
        fresh = lane_.dirty <= lane_.written < lane_.capacity  # the ring's first pass: allocated values
        row = lane_.claim()
        self.clear_row(row, fresh=fresh)
        return row

    def clear_row(self, row: int, agents: list[int] | None = None, *, fresh: bool = False) -> None:
        """Reset ``row`` (or only ``agents``' part of it) to "nothing happened" (`Storage.clear`)."""
        self.storage.clear(row, agents, fresh=fresh)

    def open(self, lane: int, needed: int) -> int:
        """Give lane ``lane``'s rows up to position ``needed`` their allocated values (no commit);
        returns the position up to which the lane is open."""
        lane_ = self.index.ring[lane]
        self.buffer._open(lane_, needed)
        return lane_.opened

    def forget_rows(self, rows: np.ndarray) -> None:
        """``rows`` (of lanes whose episode index already left them) are no longer recorded."""
        self.buffer._forget_rows(rows)

    # ----------------------------------------------------------------- episodes

    def begin_episode(self, lane: int, origin: Origin = UNKNOWN) -> None:
        """Start an episode of ``origin`` in ``lane`` (`FlexibleBuffer.begin_episode`: one still
        running there, a loaded file's, is closed first as truncated)."""
        self.buffer._begin_episode(lane, origin)

    def end_episode(self, lane: int, bootstrap: np.ndarray | float | None = None) -> None:
        """Close ``lane``'s running episode (`FlexibleBuffer.end_episode`; the recorder's own lane,
        so no other recorder's staged steps are committed); the recorder sends it to the log
        (`flush_log`) once the step that ended it is recorded whole, so a log that cannot be
        written fails no step."""
        self.buffer._end_episode(self.index.ring[lane], bootstrap)

    def end_agent(self, lane: int, agent: int, bootstrap: float | None = None) -> None:
        """Agent ``agent``'s own episode ended inside ``lane``'s running one: write its ``G`` over
        its own rows (those where it is active since it joined), bootstrapped by ``bootstrap``.
        Its ``G`` is final: `end_episode` and `finish_path` leave it alone."""
        lane_ = self.index.ring[lane]
        if lane_.running is None:
            return
        write_episode_returns(
            self.storage, lane_, lane_.running, bootstrap, self.buffer.gamma, self.buffer.gae_lambda, only=agent
        )
        lane_.agents.end(agent)

    def rejoin_agent(self, lane: int, agent: int) -> None:
        """Agent ``agent`` appears again in ``lane``'s running episode after its own ended: its
        next episode starts with its next row."""
        lane_ = self.index.ring[lane]
        if lane_.running is not None:
            lane_.agents.rejoin(agent, lane_.running.end)

    def end_runs(
        self,
        lanes: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        bootstrap: np.ndarray,
        whole: np.ndarray,
        origins: np.ndarray,
    ) -> None:
        """Many single-agent episodes of ``origins`` ended at positions ``[starts, ends)`` of the
        buffer lanes ``lanes``, each bootstrapped by its ``bootstrap``: their ``G`` (and GAE where values were
        annotated) in one pass, then those ``whole`` (none of their rows forgotten) go to the
        episode log (if one is kept), the lanes left as they are (the recorder brings them up to date)."""
        if not starts.size:
            return
        buffer = self.buffer
        order = np.lexsort((starts, lanes))  # lane by lane, each in time order: as the log holds them
        lanes, starts, ends, bootstrap, whole, origins = (
            a[order] for a in (lanes, starts, ends, bootstrap, whole, origins)
        )
        rows = span_rows(lanes * buffer.num_steps, buffer.num_steps, starts, ends)
        write_run_returns(self.storage, rows, np.cumsum(ends - starts) - 1, bootstrap, buffer.gamma, buffer.gae_lambda)
        buffer._log_ended(lanes, starts, ends, rows, whole, origins)
