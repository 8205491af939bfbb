"""The recording core every env adapter shares: env values in, buffer rows out.

An adapter translates its API's calls into `LaneRecorder.begin` / `LaneRecorder.step`; the core
owns the per-agent writers, the observation that waits for its step, mask handling and episode
ends. Writers are chosen once, from the codecs, so a step runs straight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import SpecMismatchError
from flexibuff_envs.spec import ActionCodec, ObsCodec

#: ``bootstrap_fn(obs_)`` -> V of the flat stored observation after a truncated episode's last step
BootstrapFn = Callable[[np.ndarray], Any]


def _flat_mask(mask: Any) -> Any:
    """A mask given per head (tuple of arrays) becomes one flat array; an array passes as is."""
    return mask if isinstance(mask, np.ndarray) else np.concatenate([np.ravel(m) for m in mask])


class AgentSlot:
    """Writes one agent's transitions into its slice of the buffer."""

    def __init__(self, buffer: FlexibleBuffer, index: int, obs: ObsCodec, action: ActionCodec) -> None:
        self.index = index
        self.name = buffer.spec.agent_ids[index]
        self.split_mask = obs.split_mask
        self.obs = buffer.field("obs")[index]
        self.obs_ = buffer.field("obs_")[index]
        self._scratch = np.zeros((1, self.obs.shape[1]), dtype=self.obs.dtype)
        self._write_scratch = obs.writer(self._scratch)
        self._write_obs_ = obs.writer(self.obs_)
        self._write_action = action.writer(
            buffer.field("discrete_actions")[index] if action.cardinalities else np.zeros((0, 0)),
            buffer.field("continuous_actions")[index] if action.continuous_dim else np.zeros((0, 0)),
        )
        self.rewards = buffer.field("individual_rewards")[index]
        self.terminated = buffer.field("terminated")[index]
        self.truncated = buffer.field("truncated")[index]
        self.active = buffer.field("active")[index]
        self._source, self._source_row = self._scratch, 0
        self.mask_width = sum(buffer.spec.discrete_action_cardinalities)
        self.masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def enable_masks(self, buffer: FlexibleBuffer) -> None:
        """Start recording this agent's action masks."""
        scratch = np.ones((1, self.mask_width), dtype=bool)
        self.masks = (buffer.field("action_mask")[self.index], buffer.field("action_mask_")[self.index], scratch)
        self._mask_source, self._mask_row = scratch, 0

    def split(self, obs: Any, info: Mapping[str, Any]) -> tuple[Any, Any]:
        """(observation value, its action mask or None) from what the env returned."""
        if self.split_mask:
            return obs["observation"], obs["action_mask"]
        return obs, info.get("action_mask")

    def begin(self, obs: Any, info: Mapping[str, Any]) -> None:
        """Hold the first observation of an episode until the step that leaves it."""
        value, mask = self.split(obs, info)
        self._write_scratch(0, value)
        self._source, self._source_row = self._scratch, 0
        if self.masks is not None:
            scratch = self.masks[2]
            if mask is None:
                scratch[0] = True
            else:
                flat = _flat_mask(mask)
                if np.size(flat) != self.mask_width:
                    raise SpecMismatchError(
                        f"action_mask of agent {self.name!r} has {np.size(flat)} entries but its "
                        f"discrete action heads have {self.mask_width} actions in all")
                scratch[0] = flat
            self._mask_source, self._mask_row = scratch, 0

    def write(self, row: int, action: Any, obs_: Any, reward: Any, terminated: Any, truncated: Any,
              info: Mapping[str, Any]) -> None:
        """Record the transition that left the held observation; hold ``obs_`` for the next one."""
        self.obs[row] = self._source[self._source_row]
        if self.masks is None:
            self._write_obs_(row, obs_)
        else:
            value, mask_ = self.split(obs_, info)
            self._write_obs_(row, value)
            before, after, _ = self.masks
            before[row] = self._mask_source[self._mask_row]
            after[row] = True if mask_ is None else _flat_mask(mask_)
            self._mask_source, self._mask_row = after, row
        self._write_action(row, action)
        self.rewards[row] = reward
        self.terminated[row] = terminated
        self.truncated[row] = truncated
        self.active[row] = True
        self._source, self._source_row = self.obs_, row


class LaneRecorder:
    """Records the episodes of one env lane (all its agents) into a buffer."""

    def __init__(
        self,
        buffer: FlexibleBuffer,
        obs: Sequence[ObsCodec],
        actions: Sequence[ActionCodec],
        *,
        lane: int = 0,
        bootstrap_fn: BootstrapFn | None = None,
    ) -> None:
        self.buffer = buffer
        self.lane = lane
        self.bootstrap_fn = bootstrap_fn
        self.slots = [AgentSlot(buffer, i, o, a) for i, (o, a) in enumerate(zip(obs, actions))]
        self.global_rewards = buffer.field("global_rewards")
        self.running = False
        self._last_row = -1
        self._claim = buffer.row_claimer(lane)
        if buffer.spec.action_mask:
            for slot in self.slots:
                slot.enable_masks(buffer)

    def _discover_masks(self, info: Mapping[str, Any]) -> None:
        # info["action_mask"] is visible only once the env has been reset: turn masks on then.
        if "action_mask" in info and self.slots[0].masks is None and self.slots[0].mask_width:
            self.buffer.enable_action_mask()
            for slot in self.slots:
                slot.enable_masks(self.buffer)

    def begin(self, obs: Sequence[Any], infos: Sequence[Mapping[str, Any]]) -> None:
        """A reset: close any episode still running (as truncated by the user), start a new one."""
        if self.running:
            self.cut()
        self._discover_masks(infos[0])
        for slot, o, info in zip(self.slots, obs, infos):
            slot.begin(o, info)
        self.buffer.begin_episode(self.lane)
        self.running = True
        self._last_row = -1

    def step_single(self, action: Any, obs_: Any, reward: Any, terminated: bool, truncated: bool,
                    info: Mapping[str, Any]) -> None:
        """One step of a single-agent lane."""
        row = self._claim()
        self.slots[0].write(row, action, obs_, reward, terminated, truncated, info)
        self.global_rewards[row] = reward
        self._last_row = row
        if terminated or truncated:
            self.end(row, truncated and not terminated)

    def end(self, row: int, bootstrap: bool) -> None:
        """Close the running episode whose last row is ``row``; ``bootstrap`` on truncation."""
        values = None
        if bootstrap and self.bootstrap_fn is not None:
            values = np.array([float(self.bootstrap_fn(slot.obs_[row])) for slot in self.slots])
        self.buffer.end_episode(self.lane, bootstrap=values)
        self.running = False

    def cut(self) -> None:
        """End the running episode where it stands: its last row becomes truncated."""
        row = self._last_row
        if row >= 0:
            for slot in self.slots:
                slot.truncated[row] |= bool(slot.active[row])
        self.end(row, row >= 0)
