"""The recording core every env adapter shares: env values in, buffer rows out.

An adapter translates its API's calls into `LaneRecorder` calls; the core owns the per-agent
writers, the observation each agent holds until the step that leaves it, masks (with padding for
agents of different sizes), the global state, team rewards and episode ends. Writers are chosen
once, from the codecs, so a step runs straight.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.action_codecs import ActionCodec
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.codecs import ObsCodec
from flexibuff_envs.errors import EnvValueError, InvalidArgumentError, SpecMismatchError, short_repr
from flexibuff_envs.fields import extra_fields as extra_fields_of
from flexibuff_envs.fields import mask_bytes, pack_mask
from flexibuff_envs.holders import Held
from flexibuff_envs.interrupts import HOLD, holding
from flexibuff_envs.priorities import check_alpha
from flexibuff_envs.returns import check_gamma
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.wrappers.annotations import Annotations, add_feedback
from flexibuff_envs.writer import Writer

#: ``bootstrap_fn(obs_)`` (``bootstrap_fn(obs_, agent_id)`` for PettingZoo): V of the observation
#: after a truncated episode's last step, exactly as a batch shows that row's ``obs_``. The core
#: always calls it with both.
BootstrapFn = Callable[..., Any]
#: an episode log's directory (`FlexibleBuffer.log_to`)
LogPath = str | os.PathLike[str]
#: how a row's team reward comes from its agents' rewards: "sum", "mean", "none" or
#: ``fn(rewards [n_agents], active [n_agents]) -> float``
GlobalReward = str | Callable[[np.ndarray, np.ndarray], float]

_REDUCERS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "sum": lambda rewards, active: float(rewards.sum()),
    "mean": lambda rewards, active: float(rewards.sum()) / max(int(active.sum()), 1),
}


def reducer(global_reward: GlobalReward) -> Callable[[np.ndarray, np.ndarray], float] | None:
    """The team-reward function for ``global_reward`` (None for "none")."""
    if callable(global_reward):
        return global_reward
    if global_reward == "none":
        return None
    if global_reward not in _REDUCERS:
        raise InvalidArgumentError(f"global_reward must be 'sum', 'mean', 'none' or a function, got {global_reward!r}")
    return _REDUCERS[global_reward]


def prepare_buffer(
    spec: BufferSpec,
    buffer: FlexibleBuffer | None,
    *,
    num_steps: int,
    gamma: float | None,
    gae_lambda: float | None,
    seed: int | None,
    global_reward: GlobalReward = "sum",
    alpha: float | None = None,
    extra_fields: Mapping[str, Any] | None = None,
    log: LogPath | None = None,
) -> FlexibleBuffer:
    """A new buffer for ``spec`` (with ``extra_fields``), or the user's, checked against it
    (``seed`` reseeds its sampler); with ``log``, it appends every episode that ends to that log."""
    spec = dataclasses.replace(spec, extra_fields=extra_fields_of(extra_fields))
    if buffer is None:
        buffer = FlexibleBuffer.from_spec(
            spec,
            num_steps=num_steps,
            gamma=0.99 if gamma is None else gamma,
            gae_lambda=0.95 if gae_lambda is None else gae_lambda,
            seed=seed,
            global_reward=global_reward != "none",
            **({} if alpha is None else {"alpha": alpha}),
        )
    else:
        buffer.check_matches(spec)
        for name, value, check in (
            ("gamma", gamma, check_gamma),
            ("gae_lambda", gae_lambda, check_gamma),
            ("alpha", alpha, check_alpha),
        ):
            if value is not None and check(value, name) != getattr(buffer, name):
                raise SpecMismatchError(
                    f"{name}={value!r} differs from the given buffer's {name}={getattr(buffer, name)!r}"
                )
        if seed is not None:
            buffer.rng = np.random.default_rng(seed)
    if log is not None:
        buffer.log_to(log)
    return buffer


#: reward types recorded as they come; anything else goes through `number`
_NUMBERS = frozenset(
    {
        int,
        float,
        bool,
        np.float64,
        np.float32,
        np.float16,
        np.int64,
        np.int32,
        np.int16,
        np.int8,
        np.uint64,
        np.uint32,
        np.uint16,
        np.uint8,
        np.bool_,
    }
)


def number(value: Any, what: str) -> float:
    """``value`` (a reward) as a float if it is a real number, else `EnvValueError` naming
    ``what``: text and None are refused, not converted. The per-step paths test
    ``value.__class__ in _NUMBERS`` first and call this only for other types."""
    if isinstance(value, numbers.Real) or (
        isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "biuf"
    ):
        return float(value)
    raise EnvValueError(f"{what} must be a number, got {short_repr(value)}")


def _flat_mask(mask: Any) -> Any:
    """A mask given per head (tuple of arrays) becomes one flat array; an array passes as is."""
    return mask if isinstance(mask, np.ndarray) else np.concatenate([np.ravel(m) for m in mask])


class MaskCodec:
    """How an env's action mask (one array, or one per head; None: all legal) becomes a padded row
    of bits (`pack_mask`).

    Agents with fewer actions than the buffer's heads get False at the padded positions.
    """

    def __init__(self, own: tuple[int, ...], padded: tuple[int, ...]) -> None:
        width = sum(padded)
        self.size = mask_bytes(width)
        offsets = np.cumsum((0, *padded[:-1])).astype(int)
        self._positions = None if own == padded else np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, own)])
        self._row = np.zeros(width, dtype=bool)
        legal = np.zeros(width, dtype=bool)
        legal[self._positions if self._positions is not None else slice(None)] = True
        self.all_legal = pack_mask(legal)

    def packed(self, mask: Any) -> np.ndarray:
        if mask is None:
            return self.all_legal
        if self._positions is None:
            return pack_mask(_flat_mask(mask))
        self._row[self._positions] = _flat_mask(mask)
        return pack_mask(self._row)

    def writer(self, store: np.ndarray) -> Callable[[int, Any], None]:
        def write(p: int, mask: Any) -> None:
            store[p] = self.packed(mask)

        return write


def held(writer: Writer, name: str, codec: ObsCodec | MaskCodec, agent: int | None, lane: int = 0) -> Held:
    """A `Held` writing ``codec``'s values for next-value field ``name`` of ``agent`` in ``lane``."""
    first = lane * writer.buffer.num_steps
    return Held(writer.chain(name), agent, codec.writer, codec.size, (first, first + writer.buffer.num_steps))


class AgentSlot:
    """Writes one agent's transitions into its slice of the buffer."""

    def __init__(self, writer: Writer, index: int, obs: ObsCodec, action: ActionCodec, lane: int) -> None:
        spec = writer.buffer.spec
        self.index = index
        self.lane = lane
        self.name = spec.agent_ids[index]
        self.split_mask = obs.split_mask
        self.obs = held(writer, "obs_", obs.compact() if spec.obs_categories else obs, index, lane)
        self._write_obs = self.obs.write
        self._write_action = action.writer(
            writer.column("discrete_actions")[index] if action.cardinalities else np.zeros((0, 0)),
            writer.column("continuous_actions")[index][:, : action.continuous_dim]
            if action.continuous_dim
            else np.zeros((0, 0)),
        )
        self.rewards = writer.column("individual_rewards")[index]
        self.terminated = writer.column("terminated")[index]
        self.truncated = writer.column("truncated")[index]
        self.active = writer.column("active")[index]
        self.mask: Held | None = None  # action masks, once recorded
        self._mask_codec = MaskCodec(action.cardinalities, spec.discrete_action_cardinalities)
        self.own_width = sum(action.cardinalities)

    def enable_masks(self, writer: Writer) -> None:
        """Start recording this agent's action masks."""
        self.mask = held(writer, "action_mask_", self._mask_codec, self.index, self.lane)
        self.mask.hold(None)

    def undo(self, row: int) -> None:
        """``row`` is given back: hold again what this agent held before it."""
        self.obs.undo(row)
        if self.mask is not None:
            self.mask.undo(row)

    def split(self, obs: Any, info: Mapping[str, Any]) -> tuple[Any, Any]:
        """(observation value, its action mask or None) from what the env returned."""
        if self.split_mask:
            return obs["observation"], obs["action_mask"]
        return obs, info.get("action_mask")

    def begin(self, obs: Any, info: Mapping[str, Any]) -> None:
        """Hold the first observation of an episode until the step that leaves it."""
        value, mask = self.split(obs, info)
        self.obs.hold(value)
        if self.mask is not None:
            if mask is not None and np.size(_flat_mask(mask)) != self.own_width:
                raise SpecMismatchError(
                    f"action_mask of agent {self.name!r} has {np.size(_flat_mask(mask))} entries but its "
                    f"discrete action heads have {self.own_width} actions in all"
                )
            self.mask.hold(mask)

    def replace(self, obs_: Any, info: Mapping[str, Any]) -> None:
        """``obs_`` is held instead, and is the next observation of this agent's last row."""
        if self.mask is None:
            self.obs.replace(obs_)
        else:
            value, mask_ = self.split(obs_, info)
            self.obs.replace(value)
            self.mask.replace(mask_)

    def write(
        self, row: int, action: Any, obs_: Any, reward: Any, terminated: Any, truncated: Any, info: Mapping[str, Any]
    ) -> None:
        """Record the transition that left the held observation; hold ``obs_`` for the next one."""
        self.write_values(row, action, obs_, reward, terminated, truncated, info)
        self.active[row] = True

    def write_values(
        self, row: int, action: Any, obs_: Any, reward: Any, terminated: Any, truncated: Any, info: Mapping[str, Any]
    ) -> None:
        """`write` without marking the agent active (a single-agent buffer's rows always are)."""
        if self.mask is None:
            self._write_obs(row, obs_)
        else:
            value, mask_ = self.split(obs_, info)
            self._write_obs(row, value)
            self.mask.write(row, mask_)
        self._write_action(row, action)
        self.rewards[row] = reward
        self.terminated[row] = terminated
        self.truncated[row] = truncated


class LaneRecorder:
    """Records the episodes of one env lane (all its agents) into a buffer.

    An agent's transition runs from its action to its next action (or its end): a step it sits
    out adds its reward to that transition and its observation becomes the transition's ``obs_``.
    A reward it receives before its first action goes into its first transition, and one it
    receives without ever acting lands, inactive, in a row of the episode: no reward is lost.

    A step is recorded with Ctrl-C held (`flexibuff_envs.interrupts`): an interrupt lands
    before or after it, never inside. A step that cannot be recorded (the env returned something
    its spaces do not allow, or a user callback raised) goes through `abandon`: the buffer keeps
    the episode up to its last whole step, and recording resumes at the next reset.
    """

    def __init__(
        self,
        writer: Writer,
        obs: Sequence[ObsCodec],
        actions: Sequence[ActionCodec],
        *,
        lane: int = 0,
        bootstrap_fn: BootstrapFn | None = None,
        global_reward: GlobalReward = "sum",
        state: ObsCodec | None = None,
    ) -> None:
        self.writer = writer
        self.lane = lane
        self.bootstrap_fn = bootstrap_fn
        self.slots = [AgentSlot(writer, i, o, a, lane) for i, (o, a) in enumerate(zip(obs, actions))]
        self._single = self.slots[0]
        self.annotations = Annotations(writer, len(self.slots))
        self._annotated = self.annotations.fields  # the same list: empty until a first annotation
        self.previous_rows: list[int] = []  # the last episode's rows, for feedback after a reset
        self.reduce = reducer(global_reward)
        self.global_rewards = writer.column("global_rewards") if self.reduce is not None else None
        # "sum" is kept as a running sum per row; other reductions look at the finished row
        self._summing = global_reward == "sum"
        self.state = None if state is None else held(writer, "state_", state, None, lane)
        self.running = False
        n = len(self.slots)
        self.open = [False] * n  # which agents are in the running episode
        self.steps = [0] * n  # transitions each agent has written in the running episode
        self.last = [-1] * n  # the row of each agent's latest transition (-1: none yet)
        self.carry = [0.0] * n  # reward received before the agent's first transition
        self.rows: list[int] = []  # the rows of the running episode, in order
        # the episode ends when its last open agent does (AEC: when the env has no agents left,
        # as agents that have not acted yet are not open)
        self.end_with_last_agent = True
        self._claim = writer.row_claimer(lane)
        if writer.buffer.spec.action_mask:
            for slot in self.slots:
                slot.enable_masks(writer)

    def _discover_masks(self, info: Mapping[str, Any]) -> None:
        # info["action_mask"] is visible only once the env has been reset: turn masks on then.
        if "action_mask" in info and self.slots[0].mask is None and self.slots[0].own_width:
            self.writer.enable_action_mask()
            for slot in self.slots:
                slot.enable_masks(self.writer)

    @holding
    def begin(self, agents: Iterable[tuple[int, Any, Mapping[str, Any]]], state: Any = None) -> None:
        """A reset: close any episode still running (as truncated by the user), start a new one.

        Args:
            agents: ``(agent index, observation, info)`` of every agent present at the reset.
            state: the global state after the reset, when one is recorded.
        """
        if self.running:
            self.cut()
        self.writer.begin_episode(self.lane)
        self.previous_rows = self.rows
        self.rows = []
        n = len(self.slots)
        self.steps, self.last, self.carry = [0] * n, [-1] * n, [0.0] * n
        for index, obs, info in agents:
            self.join(index, obs, info)
        if self.state is not None:
            if state is None:
                self.state.hold_missing()
            else:
                self.state.hold(state)
        self.running = True

    def join(self, index: int, obs: Any, info: Mapping[str, Any], reward: Any = 0.0) -> None:
        """Agent ``index`` appears with its first observation (at a reset, or spawning later) and
        the reward it received so far, which its first transition will carry."""
        self._discover_masks(info)
        self.slots[index].begin(obs, info)
        if not self.open[index] and self.steps[index]:  # back after its own episode ended: a new one
            self.writer.rejoin_agent(self.lane, index)
            self.steps[index], self.last[index] = 0, -1
        self.carry[index] += number(reward, f"reward of agent {self.slots[index].name!r}")
        self.open[index] = True

    def observe(self, index: int, obs: Any) -> None:
        """Agent ``index`` acts next on ``obs``, which need not be what its last step left it (a
        replay buffer's adds need not follow one another): its next row starts from ``obs``."""
        self.slots[index].obs.hold_unless_held(obs)

    def step_single(
        self, action: Any, obs_: Any, reward: Any, terminated: bool, truncated: bool, info: Mapping[str, Any]
    ) -> None:
        """One step of a single-agent lane (the fast path: no row clearing, no team reduction)."""
        with HOLD:
            rows = len(self.rows)
            try:  # claiming may forget the oldest episode: that is part of the step, guarded with it
                row = self._claim()
                self.rows.append(row)  # one agent: it filled every row
                self.last[0] = row
                if reward.__class__ not in _NUMBERS:
                    reward = number(reward, "reward")
                self._single.write_values(row, action, obs_, reward, terminated, truncated, info)
                if self._summing:
                    self.global_rewards[row] = reward  # type: ignore[index]
                if self._annotated:
                    self.annotations.write(row, 0)
                if terminated or truncated:
                    self.close([0], [truncated and not terminated])
            except BaseException as error:
                self.abandon(rows, error)
                raise
            if not self.running:
                self.writer.flush_log([self.lane])

    def record(self, step: Callable[..., None], *args: Any) -> None:
        """Record one step of the running episode through ``step(*args)`` (an adapter's, which
        claims its rows through `next_row` and `row`), with Ctrl-C held; if it fails, `abandon`."""
        with HOLD:
            rows = len(self.rows)
            try:
                step(*args)
            except BaseException as error:
                self.abandon(rows, error)
                raise
            if not self.running:
                self.writer.flush_log([self.lane])

    def row(self, k: int) -> int:
        """The buffer row of the running episode's ``k``-th step, claimed and cleared if new."""
        while len(self.rows) <= k:
            self.rows.append(self.writer.claim_cleared_row(self.lane))
        return self.rows[k]

    def next_row(self) -> int:
        """A new row for a step whose agents are all written next; `clear_absent` after them."""
        row = self._claim()
        self.rows.append(row)
        if self._summing:
            self.global_rewards[row] = 0.0  # type: ignore[index]
        return row

    def clear_absent(self, row: int, written: list[int]) -> None:
        """Clear the agents of ``row`` that `write` did not reach (dead, not yet spawned, or
        sitting the step out)."""
        if len(written) < len(self.slots):
            self.writer.clear_row(row, [i for i in range(len(self.slots)) if i not in written])

    def write(
        self,
        row: int,
        index: int,
        action: Any,
        obs_: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        info: Mapping[str, Any],
        given: dict[str, Any] | None = None,
    ) -> None:
        """Agent ``index``'s transition into ``row``, with the annotations ``given`` for it (by
        default those held for the agent's next step)."""
        if reward.__class__ not in _NUMBERS:
            reward = number(reward, f"reward of agent {self.slots[index].name!r}")
        if self.carry[index]:
            reward, self.carry[index] = reward + self.carry[index], 0.0
        self.slots[index].write(row, action, obs_, reward, terminated, truncated, info)
        self.steps[index] += 1
        self.last[index] = row
        if self._annotated:
            self.annotations.write(row, index, given)
        if self._summing:
            self.global_rewards[row] += reward  # type: ignore[index]

    def sit_out(
        self, index: int, obs_: Any, reward: Any, terminated: Any, truncated: Any, info: Mapping[str, Any]
    ) -> None:
        """Agent ``index`` is in a step without acting: its latest transition runs on (this
        reward added, ``obs_`` its next observation, these end flags); before its first action,
        ``obs_`` is what it will act on and the reward waits for its first transition."""
        reward = number(reward, f"reward of agent {self.slots[index].name!r}")
        last = self.last[index]
        if last >= 0 and self.slots[index].obs.pending != last:  # the ring has forgotten that row
            self.last[index] = last = -1
        if last < 0:
            self.slots[index].begin(obs_, info)
            self.carry[index] += reward
            return
        slot = self.slots[index]
        slot.replace(obs_, info)
        slot.terminated[last] = terminated
        slot.truncated[last] = truncated
        self._add_reward(index, last, reward)

    def _add_reward(self, index: int, row: int, reward: float) -> None:
        self.slots[index].rewards[row] += reward
        if self._summing:
            self.global_rewards[row] += reward  # type: ignore[index]
        else:
            self.team_reward(row)

    def unrewarded(self, index: int, reward: Any, row: int) -> None:
        """Agent ``index`` leaves the episode without a transition: what it received (``reward``
        and anything carried) is kept in ``row``, where it stays inactive."""
        total = self.carry[index] + number(reward, f"reward of agent {self.slots[index].name!r}")
        self.carry[index] = 0.0
        if total:
            self._add_reward(index, row, total)

    def team_reward(self, row: int) -> None:
        """The row's team reward, from its agents' rewards (after they are written)."""
        if self.reduce is not None and not self._summing:
            field = self.writer.column
            self.global_rewards[row] = self.reduce(  # type: ignore[index]
                field("individual_rewards")[:, row], field("active")[:, row]
            )

    def write_state(self, row: int, state_: Any) -> None:
        """``state[row]`` = the held state, ``state_[row]`` = ``state_`` (None: missing)."""
        if self.state is not None:
            if state_ is None:
                self.state.write_missing(row)
            else:
                self.state.write(row, state_)

    def own_rows(self, index: int, rows: list[int]) -> np.ndarray:
        """The rows among ``rows`` (in order) that hold a transition of agent ``index``."""
        rows_ = np.asarray(rows, dtype=np.int64)
        return rows_ if len(self.slots) == 1 else rows_[self.writer.column("active")[index, rows_]]

    def feedback(self, index: int, value: float, step: int) -> None:
        """Add a human reward to agent ``index``'s ``step``-th transition of the running episode
        (negative: counted from its latest; with no step yet, of the episode before)."""
        rows = self.own_rows(index, self.rows)
        if not len(rows):
            rows = self.own_rows(index, self.previous_rows)
        if not -len(rows) <= step < len(rows):
            raise InvalidArgumentError(
                f"add_feedback: step={step} is not a recorded step of agent "
                f"{self.slots[index].name!r} ({len(rows)} in its current episode)"
            )
        add_feedback(self.writer, int(rows[step]), index, value)

    def close(self, indices: Sequence[int], bootstrap: Sequence[bool]) -> None:
        """Agents ``indices`` are done: write their ``G``; the episode ends with its last agent."""
        values: np.ndarray | None = None  # V(obs_) of the truncated ones, when bootstrapped
        for index, boot in zip(indices, bootstrap):
            if self.last[index] < 0:  # it never acted: keep what it received
                if self.carry[index]:
                    self.unrewarded(index, 0.0, self.rows[-1] if self.rows else self.row(0))
            elif boot and self.bootstrap_fn is not None:
                values = np.zeros(len(self.slots)) if values is None else values
                values[index] = self.bootstrap_fn(self.writer.next_obs(self.last[index], index), self.slots[index].name)
            self.open[index] = False
        if self.end_with_last_agent and not any(self.open):  # the episode ends with these agents
            self.writer.end_episode(self.lane, values)
            self.running = False
            return
        for index in indices:
            self.writer.end_agent(self.lane, index, None if values is None else values[index])

    def abandon(self, rows: int, error: BaseException) -> None:
        """The step being recorded failed with ``error``: give back the rows it claimed (beyond
        the first ``rows`` of the episode), end the episode at its last whole step, and say so
        on ``error``."""
        popped = set()
        while len(self.rows) > rows:
            row = self.rows.pop()
            popped.add(row)
            for slot in self.slots:
                slot.undo(row)
            if self.state is not None:
                self.state.undo(row)
            self.writer.unclaim_row(self.lane)
        for index in range(len(self.slots)):
            if self.last[index] in popped:  # its latest transition is gone: the one before is latest
                own = self.own_rows(index, self.rows)
                self.last[index] = int(own[-1]) if len(own) else -1
                self.steps[index] = max(self.steps[index] - 1, 0)
        if self.running:
            self.cut(bootstrap=False, flush=False)  # a log that fails too must not hide ``error``
        add_note = getattr(error, "add_note", None)  # Python 3.11+
        if add_note is not None:
            add_note(
                f"flexibuff_envs: this step was not recorded; the episode is kept up to step "
                f"{len(self.rows)} (as truncated) and recording resumes at the next reset"
            )

    @holding
    def cut(self, bootstrap: bool = True, *, flush: bool = True) -> None:
        """End the running episode where it stands: each open agent's last row becomes truncated.

        Args:
            bootstrap: call ``bootstrap_fn`` for the truncated agents (when one was given).
            flush: send it to the buffer's log now (else with the next episode that ends).
        """
        still = [i for i, is_open in enumerate(self.open) if is_open]
        for index in still:
            if self.last[index] >= 0:
                self.slots[index].truncated[self.last[index]] = True
        self.close(still, [bootstrap] * len(still))
        if self.running:  # no agent was open: close the episode itself
            self.writer.end_episode(self.lane)
            self.running = False
        if flush:
            self.writer.flush_log([self.lane])
