"""Slots: one agent's values into its rows of a lane (its observation and mask held for the next
row, the rest through its row writer), and the checks of what an env returns."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from flexibuff_envs.errors import EnvValueError, SpecMismatchError, short_repr
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec
from flexibuff_envs.storage.fields import flat_mask
from flexibuff_envs.storage.holders import Held

#: reward types recorded as they come; anything else goes through `number`
NUMBERS = frozenset(
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
    ``value.__class__ in NUMBERS`` first and call this only for other types."""
    if isinstance(value, numbers.Real) or (
        isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "biuf"
    ):
        return float(value)
    raise EnvValueError(f"{what} must be a number, got {short_repr(value)}")


class AgentSlot:
    """Writes one agent's transitions into its slice of the buffer."""

    def __init__(self, writer: Writer, index: int, obs: ObsCodec, action: ActionCodec, lane: int) -> None:
        spec = writer.spec
        self.index = index
        self.lane = lane
        self.name = spec.agent_ids[index]
        self.split_mask = obs.split_mask
        self.obs = writer.holder("obs_", obs, index, lane)
        self._write_obs = self.obs.write
        self.values = writer.agent_rows(index, action)  # action, reward, end flags, active
        self._write_row = self.values.write
        self.mask: Held | None = None  # action masks, once recorded
        self.own_width = sum(action.cardinalities)
        self._action = action

    def enable_masks(self, writer: Writer) -> None:
        """Start recording this agent's action masks."""
        self.mask = writer.holder("action_mask_", self._action, self.index, self.lane)
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
            if mask is not None and np.size(flat_mask(mask)) != self.own_width:
                raise SpecMismatchError(
                    f"action_mask of agent {self.name!r} has {np.size(flat_mask(mask))} entries but its "
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
        if self.mask is None:
            self._write_obs(row, obs_)
        else:
            value, mask_ = self.split(obs_, info)
            self._write_obs(row, value)
            self.mask.write(row, mask_)
        self._write_row(row, action, reward, terminated, truncated)
