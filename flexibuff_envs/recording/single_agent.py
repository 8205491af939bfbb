"""Single-agent lanes (a Gymnasium env, an SB3 replay buffer's sub-env): their steps staged as
they come and written into the buffer a run at a time.

`SingleLaneRecorder.step_single` checks each step's values into staged rows (an error names the
step it came from, as when it writes them straight), and `StagedSteps.flush` puts a run of
them in the buffer in a fixed number of numpy operations: the observations through
`Held.write_run`, actions, rewards and end flags each in one assignment. A run is written when
its episode ends, when `BLOCK` steps wait (fewer for large observations), or when anything else
reads or changes the lane (the buffer commits it before it is read, as a vector recorder's block).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.index.lanes import Lane
from flexibuff_envs.interrupts import HOLD, holding
from flexibuff_envs.recording.agent_slots import NUMBERS, AgentSlot, number
from flexibuff_envs.recording.lane_recorder import LaneRecorder
from flexibuff_envs.recording.setup import BootstrapFn, GlobalReward
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec
from flexibuff_envs.storage.row_writers import TeamRows

#: steps staged at most before they are written (fewer when the ring is shorter, or when their
#: observations would take more than `STAGE_BYTES`)
BLOCK = 256
STAGE_BYTES = 16 << 20


class StagedSteps:
    """Up to ``size`` steps of ``slot``'s agent, the only one of its lane (the first ``k``):
    observation and action in their stored form, reward, and the end flags of the last (a step
    that ends the episode is written at once, so no other has any). ``team``: the lane's team
    reward column, which a single agent's reward is."""

    def __init__(self, slot: AgentSlot, size: int, team: TeamRows | None) -> None:
        self.slot, self.team, self.size = slot, team, size
        self.k = 0  # steps staged: a step is staged once this counts it
        # one row more than the steps: where `holds` checks a value
        self.obs, self.put_obs = slot.obs.stager(size + 1)
        self.discrete, self.continuous, self.put_action = slot.values.action_stager(size)
        self.rewards: list[Any] = [0.0] * size  # as given: numbers of any type

    def put(self, k: int, action: Any, obs_: Any, reward: Any) -> None:
        """Step ``k``'s values into its staged row, checked (`EnvValueError` for a value its space
        does not allow); it is staged once ``k`` counts it."""
        self.put_obs(k, obs_)
        self.put_action(k, action)
        self.rewards[k] = reward if reward.__class__ in NUMBERS else number(reward, "reward")

    def holds(self, j: int, value: Any) -> bool:
        """Whether ``value`` is, bit for bit in its stored form, step ``j``'s next observation
        (raises as `put_obs` for a value its space does not allow)."""
        self.put_obs(self.size, value)
        return bool(np.array_equal(self.obs[self.size].view(np.uint8), self.obs[j].view(np.uint8)))

    def flush(self, lane: Lane, terminated: bool, truncated: bool) -> list[int]:
        """The staged steps into rows of ``lane`` claimed for them; the last one's end flags
        ``terminated`` and ``truncated``. Returns the rows, in order."""
        k, slot = self.k, self.slot
        if k == 1:  # a read after each step: one row, written as it would have been at once
            return [self._flush_one(lane.claim(), terminated, truncated)]
        rows = lane.claim_block(k)
        slot.obs.write_run(rows, self.obs[:k])
        rewards = np.array(self.rewards[:k], dtype=np.float64)
        ends = np.zeros((2, k), dtype=bool)  # only the last step may end the episode
        ends[:, -1] = terminated, truncated
        slot.values.write_rows(rows, self.discrete[:k], self.continuous[:k], rewards, ends[0], ends[1])
        if self.team is not None:
            self.team.set(rows, rewards)
        self.k = 0
        return list(range(rows.start, rows.stop)) if isinstance(rows, slice) else rows.tolist()

    def _flush_one(self, row: int, terminated: bool, truncated: bool) -> int:
        """`flush` of one staged step into ``row``, value by value (cheaper than a run's
        arrays for one row)."""
        slot = self.slot
        slot.obs.write_run(slice(row, row + 1), self.obs[:1])  # the staged row is stored already
        reward = self.rewards[0]
        slot.values.write_rows(row, self.discrete[0], self.continuous[0], reward, terminated, truncated)
        if self.team is not None:
            self.team.set(row, reward)
        self.k = 0
        return row


class SingleLaneRecorder(LaneRecorder):
    """A `LaneRecorder` of one agent whose steps are staged (`StagedSteps`) and written a run at
    a time. Steps with action masks or annotations are written at once, as is every step with
    ``stage=False`` (for a loop that reads after nearly every step: its runs would be of one)."""

    def __init__(
        self,
        writer: Writer,
        obs: ObsCodec,
        action: ActionCodec,
        *,
        lane: int = 0,
        bootstrap_fn: BootstrapFn | None = None,
        global_reward: GlobalReward = "sum",
        stage: bool = True,
    ) -> None:
        super().__init__(writer, [obs], [action], lane=lane, bootstrap_fn=bootstrap_fn, global_reward=global_reward)
        team = self.team if self._summing else None  # a single agent's reward is the team's
        size = min(BLOCK, writer.capacity, max(1, STAGE_BYTES // (obs.size * obs.dtype.itemsize + 1)))
        self._staged = StagedSteps(self._single, size if stage else 1, team)
        self._stage = stage
        (self._lane,) = writer.lanes([lane])
        self.owner = writer.owner
        if stage:
            writer.attach(self)

    def commit(self) -> None:
        """Write the staged steps (the buffer calls this before it is read)."""
        staged = self._staged
        if staged.k:
            with HOLD:
                self.rows += staged.flush(self._lane, False, False)
                self.last[0] = self.rows[-1]

    @holding
    def begin(self, agents: Iterable[tuple[int, Any, Mapping[str, Any]]], state: Any = None, seed: Any = None) -> None:
        self.commit()
        super().begin(agents, state, seed)

    def observe(self, index: int, obs: Any) -> None:
        """The agent acts next on ``obs``, which need not be what its last step left it (a replay
        buffer's adds need not follow one another): its next row starts from ``obs``."""
        staged = self._staged
        if staged.k and staged.holds(staged.k - 1, obs):  # the staged steps go on
            return
        self.commit()
        self._single.obs.hold_unless_held(obs)

    def feedback(self, index: int, value: float, step: int) -> None:
        self.commit()
        super().feedback(index, value, step)

    @holding
    def cut(self, bootstrap: bool = True, *, flush: bool = True) -> None:
        self.commit()
        super().cut(bootstrap, flush=flush)

    def step_single(
        self, action: Any, obs_: Any, reward: Any, terminated: bool, truncated: bool, info: Mapping[str, Any]
    ) -> None:
        """One step: its values are checked now and staged, and written with the run of steps
        it ends (at once when it ends the episode)."""
        staged = self._staged
        if self._annotated or self._single.mask is not None or not self._stage:
            self._step_now(action, obs_, reward, terminated, truncated, info)
            return
        k = staged.k
        try:
            staged.put(k, action, obs_, reward)
        except BaseException as error:
            with HOLD:
                self.commit()
                self.abandon(len(self.rows), error)
            raise
        if terminated or truncated:  # written at once, with the run it ends; kept up to the run if it fails
            self.record(self._end_run, k, terminated, truncated, kept=len(self.rows) + k)
            return
        if not k:
            self.writer.uncommitted()  # first: a reader commits the staged steps from now on
        staged.k = k + 1  # one store: a signal lands before the step is staged or after it
        if k + 1 == staged.size:
            self.commit()

    def _end_run(self, k: int, terminated: bool, truncated: bool) -> None:
        """The staged run up to its ``k``-th step, which ends the episode, into the buffer; the
        episode closed."""
        staged = self._staged
        staged.k = k + 1
        self.rows += staged.flush(self._lane, terminated, truncated)
        self.last[0] = self.rows[-1]
        self.close([0], [truncated and not terminated])

    def _step_now(
        self, action: Any, obs_: Any, reward: Any, terminated: bool, truncated: bool, info: Mapping[str, Any]
    ) -> None:
        """`step_single` written at once."""
        self.commit()
        self.record(self._write_now, action, obs_, reward, terminated, truncated, info)

    def _write_now(
        self, action: Any, obs_: Any, reward: Any, terminated: bool, truncated: bool, info: Mapping[str, Any]
    ) -> None:
        """One step's values into a row claimed for it (`_step_now`)."""
        row = self._claim()  # may forget the oldest episode: part of the step, held with it
        self.rows.append(row)  # one agent: it filled every row
        self.last[0] = row
        if reward.__class__ not in NUMBERS:
            reward = number(reward, "reward")
        self._single.write(row, action, obs_, reward, terminated, truncated, info)
        if self._summing:
            self.team.set(row, reward)  # type: ignore[union-attr]
        if self._annotated:
            self.annotations.write(row, 0)
        if terminated or truncated:
            self.close([0], [truncated and not terminated])
