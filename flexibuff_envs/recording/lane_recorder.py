"""The recording core every env adapter shares: env values in, buffer rows out.

An adapter translates its API's calls into `LaneRecorder` calls; the core owns the per-agent
writers, the observation each agent holds until the step that leaves it, masks (with padding for
agents of different sizes), the global state, team rewards and episode ends. Writers are chosen
once, from the codecs, so a step runs straight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.errors import FlexibuffError, InvalidArgumentError, note
from flexibuff_envs.interrupts import HOLD, holding
from flexibuff_envs.recording.agent_slots import NUMBERS, AgentSlot, number
from flexibuff_envs.recording.agent_state import AgentStates
from flexibuff_envs.recording.annotations import Annotations, add_feedback
from flexibuff_envs.recording.origins import LaneOrigins
from flexibuff_envs.recording.setup import BootstrapFn, GlobalReward, reducer
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec


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
        reduce = reducer(global_reward)
        # "sum" is kept as a running sum per row; other reductions look at the finished row
        self._summing = global_reward == "sum"
        self.team = None if reduce is None else writer.team_rows(None if self._summing else reduce)
        self.state = None if state is None else writer.holder("state_", state, None, lane)
        self.agent_states: AgentStates | None = None  # a state per agent, when the recorder takes one
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
        self.origins = LaneOrigins(1)  # of its episodes
        if writer.spec.action_mask:
            for slot in self.slots:
                slot.enable_masks(writer)

    def _discover_masks(self, info: Mapping[str, Any]) -> None:
        # info["action_mask"] is visible only once the env has been reset: turn masks on then.
        if "action_mask" in info and self.slots[0].mask is None and self.slots[0].own_width:
            self.writer.enable_action_mask()
            for slot in self.slots:
                slot.enable_masks(self.writer)

    @holding
    def begin(self, agents: Iterable[tuple[int, Any, Mapping[str, Any]]], state: Any = None, seed: Any = None) -> None:
        """A reset: close any episode still running (as truncated by the user), start a new one.

        Args:
            agents: ``(agent index, observation, info)`` of every agent present at the reset.
            state: the global state after the reset, when one is recorded.
            seed: the reset's (its episode's origin: `recording.origins`).
        """
        if self.running:
            self.cut_by_user()
        self.writer.begin_episode(self.lane, self.origins.reset(0, seed))
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
        if self.agent_states is not None:
            self.agent_states.hold(index, obs)
        if not self.open[index] and self.steps[index]:  # back after its own episode ended: a new one
            self.writer.rejoin_agent(self.lane, index)
            self.steps[index], self.last[index] = 0, -1
        if reward.__class__ not in NUMBERS:
            reward = number(reward, f"reward of agent {self.slots[index].name!r}")
        self.carry[index] += reward
        self.open[index] = True

    def record(self, step: Callable[..., None], *args: Any, kept: int | None = None) -> None:
        """Record one step of the running episode through ``step(*args)`` (an adapter's, which
        claims its rows through `next_row` and `row`), with Ctrl-C held; if it fails, `abandon`
        back to the episode's first ``kept`` rows (by default, those it had before)."""
        with HOLD:
            rows = len(self.rows) if kept is None else kept
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
            self.team.start(row)  # type: ignore[union-attr]
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
        if reward.__class__ not in NUMBERS:
            reward = number(reward, f"reward of agent {self.slots[index].name!r}")
        if self.carry[index]:
            reward, self.carry[index] = reward + self.carry[index], 0.0
        self.slots[index].write(row, action, obs_, reward, terminated, truncated, info)
        if self.agent_states is not None:
            self.agent_states.write(row, index, obs_)
        self.steps[index] += 1
        self.last[index] = row
        if self._annotated:
            self.annotations.write(row, index, given)
        if self._summing:
            self.team.add(row, reward)  # type: ignore[union-attr]

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
            if self.agent_states is not None:
                self.agent_states.hold(index, obs_)
            self.carry[index] += reward
            return
        slot = self.slots[index]
        slot.replace(obs_, info)
        if self.agent_states is not None:
            self.agent_states.replace(last, index, obs_)
        slot.values.run_on(last, reward, terminated, truncated)
        self._team_add(last, reward)

    def _add_reward(self, index: int, row: int, reward: float) -> None:
        self.slots[index].values.add_reward(row, reward)
        self._team_add(row, reward)

    def _team_add(self, row: int, reward: float) -> None:
        if self._summing:
            self.team.add(row, reward)  # type: ignore[union-attr]
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
        if self.team is not None and not self._summing:
            self.team.reduce(row)

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
        return rows_ if len(self.slots) == 1 else self.slots[index].values.acted(rows_)

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

    @holding
    def step_failed(self, error: BaseException) -> None:
        """The env's step (or its recording) raised ``error``, Ctrl-C included, before the step
        was recorded whole. Whether the env moved is unknown, so a step after it could not be
        told from this one: the running episode ends at its last recorded step, as truncated,
        and recording resumes at the next reset."""
        if self.running:
            self.abandon(len(self.rows), error)
        try:  # the episode cut, here or by the recording that failed, goes to the log now
            self.writer.flush_log([self.lane])
        except (FlexibuffError, OSError) as failure:  # a log that fails too must not hide ``error``
            note(error, f"the episode it cut could not be appended to the log: {failure}")

    def abandon(self, rows: int, error: BaseException) -> None:
        """The step being recorded failed with ``error``: give back the rows it claimed (beyond
        the first ``rows`` of the episode), end the episode at its last whole step, and say so
        on ``error``."""
        self.origins.broken()  # the env may have moved
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
        note(
            error,
            f"this step was not recorded; the episode is kept up to step {len(self.rows)} (as truncated) and "
            "recording resumes at the next reset",
        )

    @holding
    def cut_by_user(self) -> None:
        """`cut` of an episode the user ends (a reset, `truncate`): the next one follows nothing
        when this one holds no step (a reset twice) or, in an AEC env, moves it does not keep (the
        turns still open)."""
        if not self.running:
            return
        if not self.rows or not self.end_with_last_agent:
            self.origins.broken()
        self.cut()

    def cut(self, bootstrap: bool = True, *, flush: bool = True) -> None:
        """End the running episode where it stands: each open agent's last row becomes truncated.

        Args:
            bootstrap: call ``bootstrap_fn`` for the truncated agents (when one was given).
            flush: send it to the buffer's log now (else with the next episode that ends).
        """
        still = [i for i, is_open in enumerate(self.open) if is_open]
        for index in still:
            if self.last[index] >= 0:
                self.slots[index].values.truncate(self.last[index])
        self.close(still, [bootstrap] * len(still))
        if self.running:  # no agent was open: close the episode itself
            self.writer.end_episode(self.lane)
            self.running = False
        if flush:
            self.writer.flush_log([self.lane])
