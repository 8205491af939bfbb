"""Recording the single-agent lanes of a vector env in one numpy operation per field per step.

`BatchRecorder` writes every sub-env of a step at once and keeps the episode bookkeeping as
arrays (each lane's position, where its running episode began, which lanes run). It does not
touch the buffer's `Lane` objects while it records: it marks the buffer uncommitted, and anything
that reads the buffer calls `commit` first, which brings the lanes up to date and writes ``G``
(and GAE) of every episode that ended since, in one pass. So a sampled batch always sees every
recorded step, with ``G`` written, exactly as if each step had been recorded on its own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import iterate

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.chain import HeldBatch
from flexibuff_envs.codecs import ActionCodec, ObsCodec
from flexibuff_envs.episodes import Episode
from flexibuff_envs.errors import EnvValueError, SpecMismatchError, short_repr
from flexibuff_envs.storage import one_hot, pack_mask
from flexibuff_envs.wrappers.annotations import ANNOTATIONS, add_feedback

#: ``bootstrap_fn(obs_)``: V of a truncated episode's last ``obs_``, as a batch shows it
VectorBootstrapFn = Callable[[np.ndarray], Any]


class BatchRecorder:
    """Records ``len(lanes)`` single-agent lanes of ``buffer``, sub-env ``i`` into ``lanes[i]``.

    Every method takes whole batches (a leading axis of one value per sub-env) and which lanes
    they concern; no Python loop runs over sub-envs on the step path. A step that cannot be
    recorded (a value its space does not allow, or an interrupt) ends every running episode at
    its last whole step, as truncated; each lane records again from its next reset.
    """

    def __init__(self, buffer: FlexibleBuffer, obs: ObsCodec, action: ActionCodec, lanes: list[int], *,
                 owner: object, obs_space: spaces.Space, action_space: spaces.Space,
                 bootstrap_fn: VectorBootstrapFn | None = None) -> None:
        self.buffer = buffer
        self.owner = weakref.ref(owner)
        self.n = n = len(lanes)
        self.lane_ids = lanes
        self.bootstrap_fn = bootstrap_fn
        self._capacity = buffer.num_steps
        self._offsets = np.array(lanes, dtype=np.int64) * buffer.num_steps
        codec = obs.compact() if buffer.spec.obs_categories else obs
        self._encode_obs = codec.batch or self._one_by_one(codec, obs_space)
        self._categories = buffer.spec.obs_categories
        self._action = action
        self._action_space = action_space
        self._discrete = buffer._column("discrete_actions")[0] if action.cardinalities else np.zeros((0, 0))
        self._continuous = (buffer._column("continuous_actions")[0][:, :action.continuous_dim]
                            if action.continuous_dim else np.zeros((0, 0)))
        self.obs = HeldBatch(buffer.next_chain("obs_"), 0, n)
        self._rewards = buffer._column("individual_rewards")[0]
        self._team = buffer._column("global_rewards") if "global_rewards" in buffer._storage.arrays else None
        self._terminated = buffer._column("terminated")[0]
        self._truncated = buffer._column("truncated")[0]
        self.mask: HeldBatch | None = None
        self._mask_width = sum(action.cardinalities)
        if buffer.spec.action_mask:
            self._enable_masks()
        # annotations: name -> (store, value when not given); held values and which lanes gave them
        self._annotated: dict[str, tuple[np.ndarray, float]] = {}
        self._given: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        # per lane: next position, start of the running episode, running?, the last episode's span
        self.pos = np.zeros(n, dtype=np.int64)
        self.start = np.zeros(n, dtype=np.int64)
        self.running = np.zeros(n, dtype=bool)
        self.previous = np.zeros((2, n), dtype=np.int64)
        self._room = np.zeros(n, dtype=np.int64)  # positions from which a row needs `Lane.make_room`
        self._slack = 0  # steps every lane can take before any reaches its room
        self._ended: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # not committed
        self._version = -1
        buffer._batched.append(self)
        self._reload()

    @staticmethod
    def _one_by_one(codec: ObsCodec, space: spaces.Space) -> Callable[[Any], np.ndarray]:
        """Rows of a space without a batch encoding (Tuple, Dict, MultiBinary), flattened one by one."""
        flatten = codec.flatten

        def encode(values: Any) -> np.ndarray:
            return np.stack([flatten(value) for value in iterate(space, values)])

        return encode

    # ----------------------------------------------------------------- bookkeeping

    def _reload(self) -> None:
        """Read the lanes again: the buffer was read (and maybe changed) since the last step."""
        lanes = [self.buffer._ring[i] for i in self.lane_ids]
        self.pos = np.array([lane.written for lane in lanes], dtype=np.int64)
        started = np.array([-1 if lane.running is None else lane.running.start for lane in lanes], dtype=np.int64)
        self.running &= started >= 0  # an episode ended from outside is no longer recorded
        # episodes with steps running in lanes this recorder has not begun (a loaded file's)
        self._foreign = ~self.running & (started >= 0) & (self.pos > started)
        self.start = np.where(self.running, started, self.pos)
        self._room = np.minimum([lane.live_start + lane.capacity for lane in lanes],
                                [lane.opened for lane in lanes])
        self._slack = int((self._room - self.pos).min())
        self._version = self.buffer._version

    def _make_room(self) -> None:
        """Some lane's next row is its oldest episode's, or was never used: `Lane.make_room`."""
        ring = self.buffer._lanes  # commits
        for i in np.flatnonzero(self.pos >= self._room).tolist():
            ring[self.lane_ids[i]].make_room()
        self._reload()

    def commit(self) -> None:
        """Bring the buffer's lanes up to date: positions, ended episodes (with ``G``), running ones."""
        ring = self.buffer._ring
        if self._ended:
            lanes, starts, ends, boots = (np.concatenate(parts) for parts in zip(*self._ended))
            self._ended = []
            for i, start, end in zip(lanes.tolist(), starts.tolist(), ends.tolist()):
                lane = ring[self.lane_ids[i]]
                self._running_episode(lane, start)
                lane.running.end = lane.written = end  # type: ignore[union-attr]
                lane.end()
            self.buffer._write_run_returns(self._offsets[lanes] // self._capacity, starts, ends, boots)
        for i, (pos, start, running) in enumerate(zip(self.pos.tolist(), self.start.tolist(),
                                                      self.running.tolist())):
            lane = ring[self.lane_ids[i]]
            lane.written = pos
            lane.dirty = max(lane.dirty, pos)
            if running:
                self._running_episode(lane, start)
                lane.running.end = pos  # type: ignore[union-attr]

    @staticmethod
    def _running_episode(lane: Any, start: int) -> None:
        """``lane`` runs the episode that began at ``start`` (a new one unless it already does)."""
        if lane.running is None or lane.running.start != start:
            lane.running = Episode(start, start)
            lane.agent_start = [start]

    def _sync(self) -> None:
        if self._version != self.buffer._version:
            self._reload()
        self.buffer._uncommitted = True

    # ----------------------------------------------------------------- recording

    def begin(self, lanes: np.ndarray, obs: Any, masks: np.ndarray | None = None) -> None:
        """Lanes ``lanes`` (indices) were reset to ``obs`` (the whole batch; with ``masks``, the
        batch's legal-action flags ``[n, actions]``): episodes running there end as truncated."""
        values = self._encode_obs(obs)[lanes]  # may raise: then nothing has changed
        if masks is not None and self.mask is None and self._mask_width:
            self.buffer.enable_action_mask()  # reads the lanes: before anything changes here
            self._enable_masks()
        packed = self._packed(masks)[lanes] if self.mask is not None else None
        self._sync()
        foreign = lanes[self._foreign[lanes]]
        for i in foreign.tolist():  # an episode a loaded file left running: closed as `begin_episode` does
            self.buffer.begin_episode(self.lane_ids[i])
        if foreign.size:
            self._sync()
        cut = lanes[self.running[lanes] & (self.pos[lanes] > self.start[lanes])]
        if cut.size:
            self._end(cut, truncated=True, bootstrap=True)
        self.obs.hold(lanes, values)
        if self.mask is not None and packed is not None:
            self.mask.hold(lanes, packed)
        self.start[lanes] = self.pos[lanes]
        self.running[lanes] = True

    def _enable_masks(self) -> None:
        self.mask = HeldBatch(self.buffer.next_chain("action_mask_"), 0, self.n)
        self._all_legal = pack_mask(np.ones((self.n, self._mask_width), dtype=bool))
        self.mask.hold(np.arange(self.n), self._all_legal)

    def _packed(self, masks: np.ndarray | None) -> np.ndarray:
        if masks is None:
            return self._all_legal
        if masks.shape[-1] != self._mask_width:
            raise SpecMismatchError(f"action_mask has {masks.shape[-1]} entries but the discrete action "
                                    f"heads have {self._mask_width} actions in all")
        return pack_mask(masks)

    def step(self, stepping: np.ndarray | None, actions: Any, obs_: Any, rewards: Any, terminated: np.ndarray,
             truncated: np.ndarray, masks_: np.ndarray | None = None) -> None:
        """The transitions of lanes ``stepping`` (a bool mask; None: every lane) from the values
        of a whole vector step; lanes whose episode ends stop running until `begin`.

        Every field is written for every lane in one operation; a lane that is not stepping
        writes into its next row, which it has not claimed, so the values do not count."""
        try:
            obs_rows = self._encode_obs(obs_)
            rewards = self._checked_rewards(rewards)
            packed = None if self.mask is None else self._packed(masks_)
            self._sync()
            if stepping is not None:
                if stepping.all():
                    stepping = None
                elif not stepping.any():
                    return
            if self._slack <= 0:
                if (self.pos >= self._room).any():
                    self._make_room()
                self._slack = int((self._room - self.pos).min())
            self._slack -= 1
            rows = self._offsets + self.pos % self._capacity
            self.obs.write(rows, obs_rows, stepping)
            self._write_actions(rows, actions)
            self._rewards[rows] = rewards
            if self._team is not None:
                self._team[rows] = rewards
            self._terminated[rows] = terminated
            self._truncated[rows] = truncated
            if self.mask is not None:
                self.mask.write(rows, packed, stepping)  # type: ignore[arg-type]
            if self._annotated:
                self._write_annotations(rows, stepping)
        except BaseException as error:
            self.abandon(error)
            raise
        done = terminated | truncated
        if stepping is None:
            self.pos += 1
        else:
            self.pos += stepping
            done &= stepping
        if done.any():
            ended = np.flatnonzero(done)
            self._end(ended, truncated=False, bootstrap=True, terminated=terminated[ended])

    def _checked_rewards(self, rewards: Any) -> np.ndarray:
        if rewards.__class__ is np.ndarray and rewards.dtype.kind in "biuf" and rewards.shape == (self.n,):
            return rewards
        values = np.asarray(rewards)
        if values.shape != (self.n,) or values.dtype.kind not in "biuf":
            raise EnvValueError(f"rewards must be {self.n} numbers, one per sub-env, got {short_repr(rewards)}")
        return values

    def _write_actions(self, rows: np.ndarray, actions: Any) -> None:
        write = self._action.write_batch
        if write is not None:
            write(self._discrete, self._continuous, rows, actions)
            return
        encoded = [self._action.encode(a) for a in iterate(self._action_space, actions)]
        if self._action.cardinalities:
            self._discrete[rows] = np.stack([d for d, _ in encoded])
        if self._action.continuous_dim:
            self._continuous[rows] = np.stack([c for _, c in encoded])

    def _end(self, lanes: np.ndarray, *, truncated: bool, bootstrap: bool,
             terminated: np.ndarray | None = None) -> None:
        """The running episodes of ``lanes`` end at their last row (``truncated``: mark it so)."""
        if truncated:
            self._truncated[self._offsets[lanes] + (self.pos[lanes] - 1) % self._capacity] = True
        boots = np.zeros(lanes.size)
        if bootstrap and self.bootstrap_fn is not None:
            cut = np.ones(lanes.size, dtype=bool) if terminated is None else ~terminated
            for k in np.flatnonzero(cut & self._last_truncated(lanes)).tolist():
                value = self.obs.value(int(lanes[k]))
                boots[k] = self.bootstrap_fn(one_hot(value, self._categories) if self._categories else value)
        self._ended.append((lanes, self.start[lanes], self.pos[lanes], boots))
        self.previous[:, lanes] = self.start[lanes], self.pos[lanes]
        self.running[lanes] = False
        self.buffer._uncommitted = True

    def _last_truncated(self, lanes: np.ndarray) -> np.ndarray:
        return self._truncated[self._offsets[lanes] + (self.pos[lanes] - 1) % self._capacity]

    def abandon(self, error: BaseException) -> None:
        """The step being recorded failed with ``error``: every running episode ends at its last
        whole step, as truncated (no bootstrap), and ``error`` says so."""
        self._sync()
        cut = np.flatnonzero(self.running & (self.pos > self.start))
        if cut.size:
            self._end(cut, truncated=True, bootstrap=False)
        self.running[:] = False
        self.buffer.reclaim()  # next-value slots an interrupted eviction of the oldest episode lost
        add_note = getattr(error, "add_note", None)  # Python 3.11+
        if add_note is not None:
            add_note("flexibuff_envs: this vector step was not recorded; each sub-env's episode is kept up to "
                     "its last whole step (as truncated) and its recording resumes at its next reset")

    # ----------------------------------------------------------------- what the agent adds

    def annotate(self, fields: Mapping[str, Any]) -> None:
        """Hold per sub-env annotations (a leading ``[n]`` axis) for each lane's next step."""
        checked = {name: self._check_annotation(name, value) for name, value in fields.items()}
        for name, values in checked.items():  # allocated only once every field passed
            if name not in self._annotated:
                width = values.shape[1] if name == "continuous_log_probs" else None
                store = self.buffer._column(name, width=width)
                self._annotated[name] = (store if name == "memory_weights" else store[0],
                                         1.0 if name == "memory_weights" else np.nan)
            self._given[name] = (values, np.ones(self.n, dtype=bool))

    def _check_annotation(self, name: str, value: Any) -> np.ndarray:
        if name not in ANNOTATIONS:
            raise ValueError(f"annotate: unknown field {name!r}; known fields: "
                             + ", ".join(f"{k} ({v})" for k, v in ANNOTATIONS.items()))
        if np.shape(value)[:1] != (self.n,):
            raise ValueError(f"annotate: {name} needs a leading axis of {self.n} sub-envs, "
                             f"got shape {np.shape(value)}")
        values = np.asarray(value, dtype=np.float32).reshape(self.n, -1)
        expected = {"discrete_log_probs": len(self.buffer.spec.discrete_action_cardinalities),
                    "values": 1, "memory_weights": 1}.get(name)
        if name == "continuous_log_probs":
            existing = self._annotated.get(name)
            expected = values.shape[1] if existing is None else existing[0].shape[-1]
        if values.shape[1] != expected or expected == 0:
            raise ValueError(f"annotate: {name} must have {expected} value(s) per sub-env "
                             f"({ANNOTATIONS[name]}); got shape {np.shape(value)}")
        if name == "memory_weights" and not (np.isfinite(values).all() and (values >= 0).all()):
            raise ValueError("annotate: memory_weights must be finite and >= 0")
        return values if name in ("discrete_log_probs", "continuous_log_probs") else values[:, 0]

    def _write_annotations(self, rows: np.ndarray, stepping: np.ndarray | None) -> None:
        for name, (store, missing) in self._annotated.items():
            held = self._given.get(name)
            if held is None:
                store[rows] = missing
                continue
            values, given = held
            store[rows] = values if given.all() else np.where(
                given.reshape(-1, *([1] * (values.ndim - 1))), values, missing)
            if stepping is None:
                del self._given[name]
                continue
            given &= ~stepping  # lanes that did not step keep theirs for their next step
            if not given.any():
                del self._given[name]

    def feedback(self, lane: int, value: float, step: int) -> None:
        """Add a human reward to lane ``lane``'s ``step``-th step of its running episode (of the
        episode before while the running one has no step)."""
        self._sync()
        start, end = ((self.start[lane], self.pos[lane]) if self.running[lane] and self.pos[lane] > self.start[lane]
                      else self.previous[:, lane])
        steps = int(end - start)
        if not -steps <= step < steps:
            raise ValueError(f"add_feedback: step={step} is not a recorded step of sub-env {lane} "
                             f"({steps} in its current episode)")
        add_feedback(self.buffer, int(self._offsets[lane] + (start + step % steps) % self._capacity), 0, value)
