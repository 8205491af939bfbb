"""What the agent adds beside the env API: annotations of the next step, and human feedback."""

from __future__ import annotations

from typing import Any

import numpy as np

from flexibuff_envs.writer import Writer

#: annotation -> (what it is, per agent?)
ANNOTATIONS = {
    "discrete_log_probs": "one log probability per discrete action head",
    "continuous_log_probs": "log probabilities of the continuous action (any fixed width)",
    "values": "the critic's V(obs) as one number",
    "memory_weights": "a non-negative sampling weight for the row",
}


class Annotations:
    """Holds each agent's annotations until its next transition is written, then writes them.

    Once a field has been annotated it is written on every later row (NaN, or weight 1, when not
    given for that step), so a reused ring row never shows a stale value.
    """

    def __init__(self, writer: Writer, n_agents: int) -> None:
        self.writer = writer
        self.buffer = writer.buffer
        self.pending: list[dict[str, Any]] = [{} for _ in range(n_agents)]
        self.fields: list[str] = []
        self._stores: dict[str, np.ndarray] = {}  # each annotated field's storage

    def add(self, index: int, agent: str, fields: dict[str, Any]) -> None:
        """Check ``fields`` and hold them for agent ``index``'s next step."""
        checked = {name: self._check(name, agent, value) for name, value in fields.items()}
        # storage is allocated only once every field passed: a refused call changes nothing
        for name, value in checked.items():
            if name not in self.fields:
                self._stores[name] = self.writer.column(
                    name, width=np.size(value) if name == "continuous_log_probs" else None)
                self.fields.append(name)
        self.pending[index].update(checked)

    def _check(self, name: str, agent: str, value: Any) -> Any:
        if name not in ANNOTATIONS:
            raise ValueError(f"annotate: unknown field {name!r} for agent {agent!r}; known fields: "
                             + ", ".join(f"{k} ({v})" for k, v in ANNOTATIONS.items()))
        array = np.asarray(value, dtype=np.float32).reshape(-1)
        heads = len(self.buffer.spec.discrete_action_cardinalities)
        expected = {"discrete_log_probs": heads, "values": 1, "memory_weights": 1}.get(name)
        if name == "continuous_log_probs":
            expected = self._width(name, array.size)
        if array.size != expected or expected == 0:
            raise ValueError(f"annotate: {name} of agent {agent!r} must have {expected} value(s) "
                             f"({ANNOTATIONS[name]}); got shape {np.shape(value)}")
        if name == "memory_weights" and not (np.isfinite(array[0]) and array[0] >= 0):
            raise ValueError(f"annotate: memory_weights must be finite and >= 0, got {value!r}")
        return array if name in ("discrete_log_probs", "continuous_log_probs") else float(array[0])

    def write(self, row: int, index: int) -> None:
        """Write agent ``index``'s held annotations (or the "not given" value) into ``row``."""
        pending = self.pending[index]
        for name in self.fields:
            value = pending.pop(name, 1.0 if name == "memory_weights" else np.nan)
            if name == "memory_weights":
                self._stores[name][row] = value
            else:
                self._stores[name][index, row] = value

    def _width(self, name: str, given: int) -> int:
        """The width field ``name`` is stored with (``given``, before its storage exists)."""
        return self.writer.column(name).shape[-1] if self.writer.has(name) else given


def add_feedback(writer: Writer, row: int, index: int, value: float) -> None:
    """Add a human reward to agent ``index`` at ``row`` (individual and team auxiliary rewards)."""
    number = float(value)
    if not np.isfinite(number):
        raise ValueError(f"add_feedback: value must be a finite number, got {value!r}")
    writer.column("individual_auxiliary_rewards")[index, row] += number
    writer.column("global_auxiliary_rewards")[row] += number
