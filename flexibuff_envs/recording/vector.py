"""Recording the single-agent lanes of a vector env a block of steps at a time.

`BatchRecorder` copies each vector step into staging arrays (`vector_stage.Stage`, one copy per
field) and writes a block of 64 to 256 steps into the buffer in a fixed number of numpy
operations, all from the block's flags at once (`blocks`): nothing runs per sub-env, nor per
step beyond the copies.

The buffer's `Lane` objects are brought up to date (`commit`) only when something reads the
buffer, which commits first: a batch always sees every step recorded so far. ``G`` (and GAE) of
ended episodes is written in one pass then, or with their block when an episode log takes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from flexibuff_envs.errors import note
from flexibuff_envs.index.lanes import span_rows
from flexibuff_envs.interrupts import holding
from flexibuff_envs.recording.annotations import StagedAnnotations
from flexibuff_envs.recording.origins import LaneOrigins
from flexibuff_envs.recording.vector_blocks import ends_of, episode_spans, publish, transitions
from flexibuff_envs.recording.vector_stage import stage_for
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec
from flexibuff_envs.storage.holders import HeldBatch

#: ``bootstrap_fn(obs_)``: V of a truncated episode's last ``obs_``, as a batch shows it
VectorBootstrapFn = Callable[[np.ndarray], Any]
#: sub-env steps staged before they are written: a block is this many over all sub-envs (its fixed
#: costs spread over them), of 64 to 256 vector steps (fewer when a ring is short or steps are large)
_BLOCK = 16384
#: bytes the staging arrays may take
_STAGE_BYTES = 64 << 20


class BatchRecorder:
    """Records ``len(lanes)`` single-agent lanes of ``writer``'s buffer: sub-env ``i`` into
    ``lanes[i]``, its transitions those the vector env's autoreset ``mode`` says. A step that
    cannot be recorded ends every running episode at its last whole step, as truncated; each
    sub-env records again from its next reset. ``bootstrap_fn`` is called for truncated
    episodes when their block is written (at the latest when the buffer is next read)."""

    _near: np.ndarray | bool | None  # per lane: `_ends_near`'s (False: none), None until worked out

    def __init__(
        self,
        writer: Writer,
        obs: ObsCodec,
        action: ActionCodec,
        lanes: list[int],
        *,
        mode: AutoresetMode,
        bootstrap_fn: VectorBootstrapFn | None = None,
    ) -> None:
        self.writer = writer
        self.owner = writer.owner  # the recorder: its lanes are freed when it is closed or dropped
        self.n = n = len(lanes)
        self.lane_ids = lanes
        self.mode = mode
        self.bootstrap_fn = bootstrap_fn
        self._capacity = writer.capacity
        self._lane_array = np.array(lanes, dtype=np.int64)
        self._offsets = self._lane_array * writer.capacity
        codec = writer.obs_encoder(obs)
        self.obs = writer.batch_holder("obs_", n)
        self._mask_width = sum(action.cardinalities)
        step_bytes = n * (
            codec.size * codec.dtype.itemsize + 8 * len(action.cardinalities) + 4 * action.continuous_dim + 8
        )
        # at most an eighth of a lane's ring, which lanes make room for at once (`_make_room`)
        self.block = max(1, min(max(64, min(256, _BLOCK // n)), writer.capacity // 8, _STAGE_BYTES // step_bytes))
        self._k = 0  # steps staged
        # in a file of the buffer's log, replayed after a kill, when no bootstrap must be called
        self._stage = stage_for(writer, codec, action, lanes, self.block, mode, durable=bootstrap_fn is None)
        self.origins = LaneOrigins(n)  # of the episodes each sub-env begins
        self._stage.obs[0] = self.obs.values()
        self.mask: HeldBatch | None = None
        if writer.spec.action_mask:
            self._enable_masks()
        self.annotations = StagedAnnotations(writer, n, self.block)
        # per lane, as of the last written block: next position, start of the running episode,
        # running?, and NEXT_STEP's "next step resets"
        self.pos, self.start = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self.running, self._resetting = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        # per lane: where rows hold its oldest episode, and from where they were never used; steps
        # running that this recorder did not begin; the running episode's first rows forgotten
        self._live_end, self._opened = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        self._foreign, self._clipped = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        self._ended: list[tuple[np.ndarray, ...]] = []  # not committed: lanes, starts, ends, boots, whole, origins
        self._returned = 0  # of them, those with their G written (and logged)
        self._draining = False
        self._version = -1
        writer.attach(self)
        self._reload()
        self._settle(log=False)

    # ----------------------------------------------------------------- bookkeeping

    def _reload(self) -> None:
        """Read the lanes again: the buffer was read (and maybe changed) since the last block."""
        self._near = None
        lanes = self.writer.lanes(self.lane_ids)
        self.pos = np.array([lane.written for lane in lanes], dtype=np.int64)
        started = np.array([-1 if lane.running is None else lane.running.start for lane in lanes], dtype=np.int64)
        self.running &= started >= 0  # an episode ended from outside is no longer recorded
        self.start = np.where(self.running, started, self.pos)
        # episodes with steps running in lanes this recorder has not begun (a loaded file's)
        self._foreign = ~self.running & (started >= 0) & (self.pos > started)
        self._clipped = np.array([lane.running is not None and not lane.running.whole for lane in lanes])
        self._live_end = np.array([lane.live_start + lane.capacity for lane in lanes], dtype=np.int64)
        self._opened = np.array([lane.opened for lane in lanes], dtype=np.int64)
        self._version = self.writer.version

    def _sync(self) -> None:
        if self._version != self.writer.version:
            self._reload()

    @holding
    def commit(self) -> None:
        """Write the staged steps, then bring the buffer's lanes up to date: positions, ended
        episodes (with ``G``) and running ones."""
        self._drain()
        self._push()

    def _push(self) -> None:
        """The lanes as of the last written block: positions, ended episodes and running ones."""
        self._return_ended()
        spans = tuple(np.concatenate(parts) for k, parts in enumerate(zip(*self._ended)) if k in (0, 1, 2, 5))
        self._ended, self._returned = [], 0
        publish(self.writer.lanes(self.lane_ids), spans or None, self.pos, self.start, self.running, self.origins.at)

    def _return_ended(self) -> None:
        """``G`` of the episodes ended since the last call, then the episode log (if one is kept)
        gets them; the lanes stay behind until the next `commit`."""
        fresh = self._ended[self._returned :]
        if fresh:
            which, starts, ends, boots, whole, origins = (np.concatenate(parts) for parts in zip(*fresh))
            self.writer.end_runs(self._lane_array[which], starts, ends, boots, whole, origins)
            self._returned = len(self._ended)

    def resume(self, running: np.ndarray, resetting: np.ndarray, arrays: Mapping[str, np.ndarray], k: int) -> None:
        """Go on from the lanes and the ``k`` staged steps a killed recorder left (`recording.stage_replay`)."""
        self.running[:], self._resetting[:] = running, resetting
        self._reload()
        self._k = self._stage.load(arrays, k)

    # ----------------------------------------------------------------- staging

    @holding
    def step(
        self,
        actions: Any,
        obs: Any,
        rewards: Any,
        terminated: np.ndarray,
        truncated: np.ndarray,
        *,
        final: tuple[np.ndarray, list[Any]] | None = None,
        masks: np.ndarray | None = None,
        masks_: np.ndarray | None = None,
    ) -> None:
        """Stage one vector step: ``obs``, what each sub-env returned (and holds next); ``final``
        (SAME_STEP), the sub-envs whose transition ends elsewhere and their final observations;
        ``masks``/``masks_``, the legal actions of ``obs`` and of the transitions' next ones."""
        k = self._k
        try:
            self.writer.uncommitted()
            self._stage.put(k, actions, obs, rewards, terminated, truncated, final)
            if self.mask is not None:
                self._stage.put_masks(k, masks, masks_)
            self.annotations.stage(k)
        except BaseException as error:
            self.abandon(error)
            raise
        self._k = k + 1
        self._stage.staged(k + 1)
        # a logged episode goes to the log in the step it ends (`FlexibleBuffer.log_to`), or is in
        # its files; one that began before the block, nearly a ring ago, is written before the
        # block's later steps in its lane overwrite its first rows
        stage, ends = self._stage, self._stage.flags[:, k]
        if self._k == self.block or (
            ends.any() and ((self.writer.logging_each_step and not stage.durable) or self._ends_near(ends))
        ):
            self._drain()

    def _ends_near(self, ends: np.ndarray) -> bool:
        """Whether ``ends`` (``[2, n]``) end an episode begun nearly a ring before the block."""
        if self._near is None:
            near = self.running & (self.pos - self.start > self._capacity - self.block)
            self._near = near if near.any() else False  # False: no lane is near (most often)
        return self._near is not False and bool((ends & self._near).any())

    # ----------------------------------------------------------------- writing a block

    def _drain(self) -> None:
        """Write the staged steps into the buffer."""
        k = self._k
        if k == 0 or self._draining:
            return
        self._draining = True
        try:
            self._sync()
            stage = self._stage
            terminated, truncated = stage.flags[0, :k], stage.flags[1, :k]
            block = transitions(self.mode, terminated | truncated, self.running, self._resetting)
            steps, resets = block.steps, block.resets
            self.origins.unrecorded(steps, resets if self.mode == AutoresetMode.NEXT_STEP else None)
            counts = steps.sum(axis=0)
            needed = self.pos + counts
            if (needed > self._live_end).any():
                self._make_room(counts)
            elif (needed > self._opened).any():
                self._open(needed)
            positions = self.pos + np.cumsum(steps, axis=0)  # each step's next position, per lane
            # the transitions lane by lane, each lane's in step order: its rows then follow each
            # other, and every field is written lane after lane (several times faster than
            # step by step, which jumps between the lanes' rings on every row)
            lanes, at = np.nonzero(steps.T)
            flat = at * self.n + lanes  # in the block's [k, n] steps
            after = positions.reshape(-1).take(flat)  # each transition's next position
            rows = self._offsets[lanes] + (after - 1) % self._capacity
            stage.write(rows, flat, k)
            self.annotations.write(rows, flat, k)
            ends = steps & (terminated | truncated)
            ended = ends.reshape(-1).take(flat)
            stepped = counts > 0
            # each lane's last transition, unless it ends an episode: it will chain to the next block
            newest = (after == needed.take(lanes)) & ~ended
            reset = resets.any(axis=0)
            # the pending row chains on unless the lane's first event here is a reset (a lone step
            # comes before its own reset)
            chained = (
                stepped if k == 1 else stepped & (~reset | (np.argmax(steps, axis=0) <= np.argmax(resets, axis=0)))
            )
            touched = stepped | reset
            finished = flat[ended]  # in the transitions' order
            end_obs = ends_of(stage.obs, stage.final, stage.has_final, finished)

            def held(holder: HeldBatch, staged: np.ndarray, at_ends: np.ndarray) -> None:
                """``holder``'s rows from the block's ``staged`` values; ``at_ends``: the ended episodes' last."""
                taken = staged[:k].reshape(k * self.n, -1).take(flat, axis=0)
                holder.write(rows, lanes, taken, ended, at_ends, newest, chained, touched, staged[k])

            held(self.obs, stage.obs, end_obs)
            if self.mask is not None:
                held(self.mask, stage.masks, ends_of(stage.masks, stage.final_masks, stage.has_final, finished))
            starts = np.maximum.accumulate(np.where(resets, positions, -1), axis=0)  # latest episode start
            if finished.size:
                self._end_block(finished, starts, positions, end_obs, truncated & ~terminated)
            self._clipped &= ~reset
            self.start = np.where(starts[-1] >= 0, starts[-1], self.start)
            self.pos = self.pos + counts
            self.running, self._resetting = block.running, block.resetting
            self.writer.uncommitted()  # the lanes are behind until `commit`
            self._settle(log=bool(finished.size) and self.writer.logging, written=k)  # the episodes that ended
        finally:
            self._draining = False

    def _make_room(self, counts: np.ndarray) -> None:
        """Lanes whose next ``counts`` rows hold their oldest episodes, or were never used: `Lane.make_room`."""
        self._push()  # what was written before this block
        ring = self.writer.lanes(self.lane_ids)
        # room for an eighth of the ring (a block's most) in each lane that needs it within that many
        # rows, so lanes make room together, seldom; no more than the running episode leaves
        room = self._capacity - np.where(self.running, self.pos - self.start, 0)
        ahead = np.maximum(counts, np.minimum(self._capacity // 8, room))
        lanes = np.flatnonzero(self.pos + ahead > np.minimum(self._live_end, self._opened))
        bounds = [ring[i].make_room(int(ahead[i]), defer=True) for i in lanes.tolist()]
        lo, hi = np.array(bounds, dtype=np.int64).reshape(-1, 2).T
        self.writer.forget_rows(span_rows(self._offsets[lanes], self._capacity, lo, hi))
        self._reload()

    def _open(self, needed: np.ndarray) -> None:
        """Give rows up to positions ``needed`` their fields' allocated values (no commit: only rows change)."""
        for i in np.flatnonzero(needed > self._opened).tolist():
            self._opened[i] = self.writer.open(self.lane_ids[i], int(needed[i]))

    def _end_block(
        self,
        finished: np.ndarray,
        starts: np.ndarray,
        positions: np.ndarray,
        end_obs: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        """The episodes that ended in this block (``finished``: flat indices of their last
        transitions, each lane's in step order), queued for `commit` with their bootstraps."""
        at, lanes, first, last = episode_spans(finished, starts, positions, self.start)
        whole = ~(self._clipped[lanes] & (first == self.start[lanes]))  # not one that began clipped
        boots = np.zeros(lanes.size)
        if self.bootstrap_fn is not None:
            for j in np.flatnonzero(truncated[at, lanes]).tolist():
                boots[j] = self.bootstrap_fn(self.writer.as_batch("obs_", end_obs[j]))
        self._ended.append((lanes, first, last, boots, whole, self.origins.of(lanes, first)))

    # ----------------------------------------------------------------- resets and failures

    @holding
    def begin(self, lanes: np.ndarray, obs: Any, masks: np.ndarray | None = None, seed: Any = None) -> None:
        """Lanes ``lanes`` (indices) were reset by the user with ``seed`` (the vector env's) to
        ``obs`` (the whole batch; with ``masks``, the batch's legal-action flags ``[n, actions]``):
        episodes running there end as truncated."""
        values = self._stage.codec.batch(obs)[lanes]  # may raise: then nothing has changed
        self._drain()
        if masks is not None and self.mask is None and self._mask_width:
            self.writer.enable_action_mask()  # reads the lanes: before anything changes here
            self._enable_masks()
        packed = self._stage.mask_codec.batch(masks, self.n)[lanes] if self.mask is not None else None
        self._sync()
        foreign = lanes[self._foreign[lanes]]
        for i in foreign.tolist():  # an episode a loaded file left running: closed as `begin_episode` does
            self.writer.begin_episode(self.lane_ids[i])
        if foreign.size:
            self._sync()
        self.origins.skipped(lanes[self.running[lanes] & (self.pos[lanes] == self.start[lanes])])  # reset twice
        cut = lanes[self.running[lanes] & (self.pos[lanes] > self.start[lanes])]
        if cut.size:
            self._cut(cut, bootstrap=True)
        self.obs.hold(lanes, values)
        self._stage.obs[0] = self.obs.values()
        if self.mask is not None and packed is not None:
            self.mask.hold(lanes, packed)
            self._stage.masks[0] = self.mask.values()
        self.start[lanes] = self.pos[lanes]
        self.origins.reset_lanes(lanes, seed, self.pos)
        self.running[lanes], self._resetting[lanes] = True, False
        self.writer.uncommitted()
        self._settle(log=bool(cut.size) and (self.writer.logging_each_step or self._stage.durable))

    def _settle(self, *, log: bool, written: int = 0) -> None:
        """The lanes as they stand to the stage's file, then the episodes ended since to the log
        (``log``); the stage's first ``written`` steps are written."""
        self._near = None  # the lanes changed
        self._stage.snapshot(self.pos, self.start, self.running, self._resetting, self._clipped)
        try:
            if log:
                self._return_ended()
        finally:
            if written:
                self._stage.restart(written)
                self._k = 0
            self._stage.settled()

    def _enable_masks(self) -> None:
        self.mask = self.writer.batch_holder("action_mask_", self.n)
        self.mask.hold(np.arange(self.n), self._stage.mask_codec.batch(None, self.n))  # all legal
        self._stage.enable_masks(self.mask.values())

    def _cut(self, lanes: np.ndarray, *, bootstrap: bool) -> None:
        """The running episodes of ``lanes`` end at their last row, truncated there."""
        last = self._offsets[lanes] + (self.pos[lanes] - 1) % self._capacity
        self._stage.values.truncate(last)
        boots = np.zeros(lanes.size)
        if bootstrap and self.bootstrap_fn is not None:
            for k, lane in enumerate(lanes.tolist()):
                value = self.obs.value(lane)
                boots[k] = self.bootstrap_fn(self.writer.as_batch("obs_", value))
        starts = self.start[lanes]
        self._ended.append(
            (lanes, starts, self.pos[lanes].copy(), boots, ~self._clipped[lanes], self.origins.of(lanes, starts))
        )
        self.running[lanes] = self._clipped[lanes] = False
        self.writer.uncommitted()

    @holding
    def truncate(self, *, bootstrap: bool = True) -> None:
        """The staged steps are written and every running episode ends there, as truncated; each
        lane records again from its sub-env's next reset."""
        self._drain()
        self._sync()
        cut = np.flatnonzero(self.running & (self.pos > self.start))
        if cut.size:
            self._cut(cut, bootstrap=bootstrap)
        self.running[:] = self._resetting[:] = False
        self._settle(log=bool(cut.size) and (self.writer.logging_each_step or self._stage.durable))

    def abandon(self, error: BaseException) -> None:
        """The step staged, or the vector env's (a Ctrl-C: which sub-env moved is unknown), failed
        with ``error``: every running episode ends at its last whole step as truncated, ``error`` says so."""
        self.origins.broken()  # which sub-env moved is unknown
        if self._k or self.running.any():  # staged steps may begin episodes `running` does not show yet
            self.truncate(bootstrap=False)
            resumes = "its last whole step (as truncated) and its recording resumes at its next reset"
            note(error, f"this vector step was not recorded; each sub-env's episode is kept up to {resumes}")

    @holding
    def annotate(self, fields: Mapping[str, Any]) -> None:
        """Hold per sub-env annotations (a leading ``[n]`` axis) for the next step; a sub-env
        whose next step is no transition (it only resets) drops them. A stage in a file holds
        none: from now on ended episodes go to the log in the step they end."""
        if self._stage.durable:
            self._drain()
            self._stage.stop()
        self.annotations.add(fields, self._drain)
