"""What the agent adds beside the env API: annotations of the next step, and human feedback."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.interrupts import holding
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.storage.row_writers import FieldRows

#: annotation -> (what it is, per agent?)
ANNOTATIONS = {
    "discrete_log_probs": "one log probability per discrete action head",
    "continuous_log_probs": "log probabilities of the continuous action (any fixed width)",
    "values": "the critic's V(obs) as one number",
    "memory_weights": "a non-negative sampling weight for the row",
}


def checked(writer: Writer, name: str, value: Any, rows: int, who: str) -> np.ndarray:
    """``value`` of annotation ``name`` as float32 ``[rows, width]`` (a field of your own: ``[rows,
    *shape]`` in its dtype; one agent's: 1 row; a vector env's: a row per sub-env), or ValueError
    naming the field and ``who``."""
    own = writer.own_fields()
    if name in own:
        shape, dtype = own[name]
        want = (rows, *shape) if rows > 1 else shape
        if np.shape(value) != want and not (rows == 1 and np.shape(value) == (1, *shape)):
            raise InvalidArgumentError(
                f"annotate: {name} of {who} must have shape {want} (extra_fields), got {np.shape(value)}"
            )
        return np.asarray(value).astype(dtype, copy=False).reshape(rows, *shape)
    if name not in ANNOTATIONS:
        raise InvalidArgumentError(
            f"annotate: unknown field {name!r} for {who}; known fields: "
            + ", ".join(
                [
                    *(f"{k} ({v})" for k, v in ANNOTATIONS.items()),
                    *(f"{k} (yours, {shape} {dtype})" for k, (shape, dtype) in own.items()),
                ]
            )
        )
    if rows > 1 and np.shape(value)[:1] != (rows,):
        raise InvalidArgumentError(
            f"annotate: {name} needs a leading axis of {rows} sub-envs, got shape {np.shape(value)}"
        )
    values = np.asarray(value, dtype=np.float32).reshape(rows, -1)
    expected = {
        "discrete_log_probs": len(writer.spec.discrete_action_cardinalities),
        "values": 1,
        "memory_weights": 1,
    }.get(name)
    if name == "continuous_log_probs":  # any width, the same for every step once stored
        width = writer.width(name)
        expected = values.shape[1] if width is None else width
    if values.shape[1] != expected or expected == 0:
        raise InvalidArgumentError(
            f"annotate: {name} of {who} must have {expected} value(s) ({ANNOTATIONS[name]}); "
            f"got shape {np.shape(value)}"
        )
    if name == "memory_weights" and not (np.isfinite(values).all() and (values >= 0).all()):
        raise InvalidArgumentError(f"annotate: memory_weights must be finite and >= 0 ({who}), got {value!r}")
    return values


class Annotations:
    """Holds each agent's annotations until its next transition is written, then writes them.

    Once a field has been annotated it is written on every later row (NaN, or weight 1, when not
    given for that step), so a reused ring row never shows a stale value.
    """

    def __init__(self, writer: Writer, n_agents: int) -> None:
        self.writer = writer
        self.pending: list[dict[str, Any]] = [{} for _ in range(n_agents)]
        self.fields: list[str] = []
        self._stores: dict[str, FieldRows] = {}  # what each annotated field is written through

    @holding
    def add(self, index: int, agent: str, fields: dict[str, Any]) -> None:
        """Check ``fields`` and hold them for agent ``index``'s next step."""
        checked = {name: self._check(name, agent, value) for name, value in fields.items()}
        # storage is allocated only once every field passed: a refused call changes nothing
        for name, value in checked.items():
            if name not in self.fields:
                self._stores[name] = self.writer.field_rows(
                    name, width=np.size(value) if name == "continuous_log_probs" else None
                )
                self.fields.append(name)
        self.pending[index].update(checked)

    def _check(self, name: str, agent: str, value: Any) -> Any:
        values = checked(self.writer, name, value, 1, f"agent {agent!r}")[0]
        return float(values[0]) if name in ("values", "memory_weights") else values

    def take(self, index: int) -> dict[str, Any]:
        """Agent ``index``'s annotations given so far, held no longer: for a transition that is
        written later than its step (an AEC turn closes at the agent's next turn)."""
        given, self.pending[index] = self.pending[index], {}
        return given

    def write(self, row: int, index: int, given: dict[str, Any] | None = None) -> None:
        """Write ``given`` (by default agent ``index``'s held annotations), or the "not given"
        value of each annotated field, into ``row``."""
        pending = self.pending[index] if given is None else given
        for name in self.fields:
            store = self._stores[name]
            store.write(row, index, pending.pop(name, store.missing))


class StagedAnnotations:
    """A vector recorder's annotations: given per sub-env (a leading ``[n]`` axis) for the next
    step, staged with the block's steps, written with the block (`Annotations`' rules: once a
    field has been annotated, a step not given it holds its "not given" value)."""

    def __init__(self, writer: Writer, n: int, block: int) -> None:
        self.writer, self.n, self.block = writer, n, block
        # name -> (what it is written through, staged [block, n, ...]); the ones given for the next step
        self.fields: dict[str, tuple[FieldRows, np.ndarray]] = {}
        self.given: dict[str, np.ndarray] = {}

    def add(self, fields: Mapping[str, Any], drain: Callable[[], None]) -> None:
        """Check ``fields`` and hold them for the next step; ``drain`` writes the staged steps
        before a first annotation of a field (they were not annotated)."""
        given = {name: checked(self.writer, name, value, self.n, "a sub-env") for name, value in fields.items()}
        for name, values in given.items():  # allocated only once every field passed
            if name in ("values", "memory_weights"):
                values = values[:, 0]
            if name not in self.fields:
                drain()
                store = self.writer.field_rows(name, width=values.shape[1] if name == "continuous_log_probs" else None)
                self.fields[name] = (store, np.full((self.block, *values.shape), store.missing, dtype=store.dtype))
            self.given[name] = values

    def stage(self, k: int) -> None:
        """The annotations given for step ``k`` of the block (the others: "not given")."""
        for name, (store, staged) in self.fields.items():
            staged[k] = self.given.pop(name, store.missing)

    def write(self, rows: np.ndarray, flat: np.ndarray, k: int) -> None:
        """The staged annotations of the transitions ``flat`` (into the block's ``[k, n]``) into ``rows``."""
        for store, staged in self.fields.values():
            store.write_rows(rows, staged[:k].reshape(-1, *staged.shape[2:]).take(flat, axis=0))


def add_feedback(writer: Writer, row: int, index: int, value: float) -> None:
    """Add a human reward to agent ``index`` at ``row`` (individual and team auxiliary rewards)."""
    number = float(value)
    if not np.isfinite(number):
        raise InvalidArgumentError(f"add_feedback: value must be a finite number, got {value!r}")
    writer.add_feedback(row, index, number)


def lane_feedback(writer: Writer, lane: int, sub_env: int, value: float, step: int) -> None:
    """Add a human reward to buffer lane ``lane``'s ``step``-th step of its running episode (of
    the episode before while the running one has no step); ``sub_env`` names the lane in errors."""
    ring = writer.lane(lane)
    running = ring.running
    episode = running if running is not None and running.end > running.start else ring.ended[-1] if ring.ended else None
    steps = 0 if episode is None else episode.end - episode.start
    if not -steps <= step < steps:
        raise InvalidArgumentError(
            f"add_feedback: step={step} is not a recorded step of sub-env {sub_env} ({steps} in its current episode)"
        )
    add_feedback(writer, int(ring.rows(episode)[step]), 0, value)  # type: ignore[arg-type]
