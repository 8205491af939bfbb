"""The header of a buffer file, checked whole before anything is allocated or mapped.

A file is data from anyone. `parse` turns its JSON header into a `Header` only when every key,
type, size, position and array extent agrees with the format and with the bytes the file holds;
otherwise it raises `BadHeader` saying what is wrong (`io` adds the path). What a file can make the
loader allocate then follows from the file: arrays are exactly the extents checked here, and the
ring is allocated as zeros the system hands out only as they are used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs.errors import short_repr
from flexibuff_envs.files.header_values import (
    MAX_POSITION,
    MAX_ROWS,
    MAX_WIDTH,
    BadHeader,
    finite,
    fraction,
    integer,
    integers,
    keys_of,
    of_kind,
    origin_columns,
    parse_spec,
    with_stored_state,
)
from flexibuff_envs.sampling.priorities import ALPHA
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.provenance import sessions
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.compression import CODECS, MAX_RATIO, chunks
from flexibuff_envs.storage.fields import MASKS, NEXT, field_table

#: fields every buffer allocates when made, so every file holds them
REQUIRED = ("obs", "terminated", "truncated", "active", "G")
#: the array of prioritized replay's ``priority ** alpha`` per row (files of buffers that used it)
PRIORITY = "priority"


class Truncated(BadHeader):
    """The header describes more (or fewer) bytes of arrays than the file holds."""


@dataclass(frozen=True)
class LaneInfo:
    """One lane as a file describes it: positions, the ring rows ``[lo, hi)`` it stores, episodes."""

    written: int
    live_start: int
    lo: int
    hi: int
    ended: list[tuple[int, int, bool]]
    running: tuple[int, int, bool] | None
    agent_start: list[int] | None
    origins: np.ndarray | None = None  # of the ended episodes (`index.origins`)


@dataclass(frozen=True)
class Header:
    """A checked header."""

    spec: BufferSpec
    num_steps: int
    gamma: float
    gae_lambda: float
    path: str
    name: str
    rng: dict[str, Any]
    lanes: list[LaneInfo]
    fields: list[dict[str, Any]]
    log_prob_width: int
    alpha: float = ALPHA
    #: the highest priority given, when the file holds priorities
    max_priority: float | None = None
    #: the recording sessions that wrote it (`spec.provenance`)
    sessions: tuple[dict[str, Any], ...] = ()


def _sessions(value: Any) -> list[dict[str, Any]]:
    try:
        return sessions(value, "sessions")
    except ValueError as exc:
        raise BadHeader(str(exc)) from None


def stored_range(live_start: int, written: int, capacity: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a lane (counted from its first) a file holds: the live ones as
    one range in ring order, the whole lane when they wrap around its end."""
    size = written - live_start
    if size == 0:
        return 0, 0
    first = live_start % capacity
    return (first, first + size) if first + size <= capacity else (0, capacity)


# ----------------------------------------------------------------------------- parts


def _rng(value: Any) -> dict[str, Any]:
    data = keys_of(value, "rng", {"bit_generator", "state", "has_uint32", "uinteger"})
    if data["bit_generator"] != "PCG64":
        raise BadHeader(f"rng bit_generator must be 'PCG64', got {short_repr(data['bit_generator'])}")
    state = keys_of(data["state"], "rng state", {"state", "inc"})
    for key in ("state", "inc"):
        integer(state[key], f"rng state {key}", 0, (1 << 128) - 1)
    integer(data["has_uint32"], "rng has_uint32", 0, 1)
    integer(data["uinteger"], "rng uinteger", 0, (1 << 32) - 1)
    return data


def _episode(value: Any, what: str) -> tuple[int, int, bool]:
    items = of_kind(value, list, what)
    if len(items) != 3 or not isinstance(items[2], bool):
        raise BadHeader(f"{what} must be [start, end, whole], got {short_repr(items)}")
    return (
        integer(items[0], f"{what} start", 0, MAX_POSITION),
        integer(items[1], f"{what} end", 0, MAX_POSITION),
        items[2],
    )


def _ended(value: Any, what: str, live_start: int, written: int) -> tuple[list[tuple[int, int, bool]], int]:
    """The ended episodes, each ``[start, end, whole]``, checked to tile the positions from
    ``live_start`` on in a few numpy passes (a file may list hundreds of thousands); and where
    the last one ends."""
    items = of_kind(value, list, f"{what} ended")
    if not items:
        return [], live_start
    try:
        table = np.array(items)
    except (ValueError, TypeError, OverflowError):  # ragged, or not numbers
        table = np.zeros(0)
    if table.dtype.kind not in "ib" or table.shape != (len(items), 3):
        raise BadHeader(f"{what} ended must list [start, end, whole] integers, got {short_repr(items)}")
    starts, ends, whole = table.T.astype(np.int64)
    previous = np.concatenate([[live_start], ends[:-1]])
    bad = (starts != previous) | (starts >= ends) | (ends > written) | (whole < 0) | (whole > 1)
    if bad.any():
        k = int(np.argmax(bad))
        raise BadHeader(
            f"{what} episode {k} starts at {starts[k]} and ends at {ends[k]}: it is empty, does not "
            f"start where the one before ended ({previous[k]}), lies past the recorded positions "
            f"[{live_start}, {written}) or is not marked whole or not"
        )
    return list(zip(starts.tolist(), ends.tolist(), whole.astype(bool).tolist())), int(ends[-1])


def _lane(value: Any, i: int, version: int, capacity: int, n_agents: int) -> LaneInfo:
    what = f"lane {i}"
    if version >= 4:
        data = keys_of(
            value, what, {"written", "live_start", "rows", "ended", "running", "agent_start"}, frozenset({"origins"})
        )
        written = integer(data["written"], f"{what} written", 0, MAX_POSITION)
        live_start = integer(data["live_start"], f"{what} live_start", max(0, written - capacity), written)
        lo, hi = integers(data["rows"], f"{what} rows", 0, capacity, 2)
        if (lo, hi) != stored_range(live_start, written, capacity):
            raise BadHeader(
                f"{what} rows [{lo}, {hi}) are not where positions {live_start}-{written} of a {capacity}-row lane lie"
            )
        starts = data["agent_start"]
        agent_start = None if starts is None else list(integers(starts, f"{what} agent_start", -1, written, n_agents))
    else:
        data = keys_of(value, what, {"size", "ended", "running"})
        written = integer(data["size"], f"{what} size", 0, capacity)
        live_start, lo, hi, agent_start = 0, 0, written, None
    # the episodes tile the recorded positions: each starts where the one before ended
    ended, previous = _ended(data["ended"], what, live_start, written)
    running = None if data["running"] is None else _episode(data["running"], f"{what} running episode")
    if running is not None and not previous == running[0] <= running[1] == written:
        raise BadHeader(
            f"{what} running episode [{running[0]}, {running[1]}) does not run from the last "
            f"ended one ({previous}) to the newest position {written}"
        )
    if running is None and previous != written:
        raise BadHeader(f"{what} episodes end at position {previous}, not at the newest one {written}")
    origins = data.get("origins")
    if origins is not None:
        origins = origin_columns(origins, f"{what} origins", len(ended))
    return LaneInfo(written, live_start, lo, hi, ended, running, agent_start, origins)


def _field_meta(value: Any, k: int, version: int, known: Collection[str]) -> dict[str, Any]:
    optional = frozenset({"width", "part", "codec", "stored"} if version >= 5 else {"width", "part"})
    meta = keys_of(value, f"field {k}", {"name", "dtype", "shape", "offset"}, optional)
    name = meta["name"]
    if not isinstance(name, str) or name not in known:
        raise BadHeader(f"field {k} has an unknown name {short_repr(name)}")
    part = meta.get("part")
    if part is not None and (part not in ("index", "tail") or name not in NEXT or version < 3):
        raise BadHeader(f"field {k} ({name}) has an unknown part {short_repr(part)}")
    return meta


def _expected(storage: Storage, meta: dict[str, Any], version: int) -> tuple[np.dtype, tuple[int, ...] | None]:
    """The dtype and shape field ``meta`` must have (None: a tail, checked apart)."""
    name, part = meta["name"], meta.get("part")
    if name == PRIORITY:
        return np.dtype(np.float64), (storage.rows,)
    if part == "index":
        return np.dtype(np.int32), storage.shape(name)[:-1] if storage.fields[name].width else storage.shape(name)
    if part == "tail":
        return storage.dtype(NEXT[name]), None
    if name in MASKS and version <= 2:  # a bool per action
        shape = storage.shape(name)[:-1] + (sum(storage.spec.discrete_action_cardinalities),)
        return np.dtype(bool), shape
    return storage.dtype(name), storage.shape(name)


def _fields(value: Any, spec: BufferSpec, rows: int, version: int, data_bytes: int) -> tuple[list[dict[str, Any]], int]:
    known = {*field_table(spec), PRIORITY}
    metas = [_field_meta(v, k, version, known) for k, v in enumerate(of_kind(value, list, "fields"))]
    seen = {(m["name"], m.get("part")) for m in metas}
    if len(seen) != len(metas):
        raise BadHeader("fields name one array twice")
    for name in REQUIRED:
        if (name, None) not in seen:
            raise BadHeader(f"fields lack {name!r}, which every buffer holds")
    for name, base in NEXT.items():
        parts = {part for n, part in seen if n == name}
        if parts not in ({None}, {"index", "tail"}) if (base, None) in seen else parts:
            raise BadHeader(f"fields must hold {name!r} (both its parts) exactly when they hold {base!r}")
    log_prob = next((m for m in metas if m["name"] == "continuous_log_probs"), None)
    width = 0 if log_prob is None else integer(log_prob.get("width"), "continuous_log_probs width", 1, MAX_WIDTH)
    storage = Storage(spec, rows, log_prob_continuous=width)
    end = 0
    metas.sort(
        key=lambda m: m["offset"] if isinstance(m["offset"], int) and not isinstance(m["offset"], bool) else -1
    )  # file order
    for meta in metas:
        what = f"field {meta['name']!r}" + (f" ({meta['part']})" if meta.get("part") else "")
        dtype, shape = _expected(storage, meta, version)
        if meta["dtype"] != dtype.str:
            raise BadHeader(f"{what} has dtype {short_repr(meta['dtype'])}; this buffer's layout stores {dtype.str}")
        given = integers(meta["shape"], f"{what} shape", 0, MAX_ROWS)
        if shape is None:  # a tail store: its slots (slot 0 first) of the base's width
            shape = (given[0] if given and given[0] >= 1 else -1, storage.shape(NEXT[meta["name"]])[-1])
        if given != shape:
            raise BadHeader(f"{what} has shape {list(given)}; {rows} stored rows of this layout need {list(shape)}")
        offset = integer(meta["offset"], f"{what} offset", end, data_bytes)
        nbytes = math.prod(shape) * dtype.itemsize
        if "codec" in meta or "stored" in meta:
            nbytes = _stored(meta, what, nbytes, data_bytes)
        end = offset + nbytes
        if end > data_bytes:
            raise BadHeader(f"{what} runs to byte {end} of the data, which has {data_bytes}")
    return metas, width


def _stored(meta: dict[str, Any], what: str, nbytes: int, data_bytes: int) -> int:
    """The bytes a compressed part (of ``nbytes`` decoded) takes in the file, checked: a codec
    this reads, room for each chunk's size, and a ratio no file legitimately reaches."""
    if meta.get("codec") not in CODECS:
        raise BadHeader(f"{what} has codec {short_repr(meta.get('codec'))}; this reads {list(CODECS)}")
    stored = integer(meta.get("stored"), f"{what} stored bytes", 8 * chunks(nbytes), data_bytes)
    if nbytes > MAX_RATIO * stored:
        raise BadHeader(
            f"{what} claims {nbytes:,} bytes from {stored:,} stored, more than {MAX_RATIO:,}x: a decompression bomb"
        )
    return stored


# ----------------------------------------------------------------------------- whole


_TOP = {"format", "spec", "num_steps", "gamma", "path", "name", "rng", "lanes", "fields"}


def parse(blob: bytes, version: int, data_bytes: int) -> Header:
    """The header in ``blob`` (format ``version``), checked against the ``data_bytes`` of arrays
    the file holds, or `BadHeader`."""
    try:
        data = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise BadHeader(f"not JSON ({type(exc).__name__})") from None
    data = keys_of(
        data,
        "the header",
        _TOP | ({"data_bytes"} if version >= 2 else set()),
        frozenset({"gae_lambda", "alpha", "max_priority", "sessions"}),
    )
    if version >= 2 and data["data_bytes"] != data_bytes:
        raise Truncated(
            f"truncated: the header describes {short_repr(data['data_bytes'])} bytes of arrays but the file "
            f"holds {data_bytes}"
        )
    if data["format"] != "flexibuff_envs buffer":
        raise BadHeader(f"format is {short_repr(data['format'])}, not 'flexibuff_envs buffer'")
    spec = with_stored_state(parse_spec(data["spec"]), data["fields"])
    num_steps = integer(data["num_steps"], "num_steps", 1, MAX_ROWS // spec.n_envs)
    lanes = [
        _lane(v, i, version, num_steps, spec.n_agents) for i, v in enumerate(of_kind(data["lanes"], list, "lanes"))
    ]
    if len(lanes) != spec.n_envs:
        raise BadHeader(f"lanes lists {len(lanes)} lanes but the spec has n_envs {spec.n_envs}")
    rows = sum(lane.hi - lane.lo for lane in lanes)
    fields, width = _fields(data["fields"], spec, rows, version, data_bytes)
    holds_priorities = any(meta["name"] == PRIORITY for meta in fields)
    if holds_priorities != ("max_priority" in data):
        raise BadHeader("the header must give max_priority exactly when the fields hold priority")
    return Header(
        spec=spec,
        num_steps=num_steps,
        gamma=fraction(data["gamma"], "gamma"),
        gae_lambda=fraction(data.get("gae_lambda", 0.95), "gae_lambda"),
        path=of_kind(data["path"], str, "path"),
        name=of_kind(data["name"], str, "name"),
        rng=_rng(data["rng"]),
        lanes=lanes,
        fields=fields,
        log_prob_width=width,
        alpha=finite(data.get("alpha", ALPHA), "alpha", 0.0),
        max_priority=finite(data["max_priority"], "max_priority", 0.0) if holds_priorities else None,
        sessions=tuple(_sessions(data.get("sessions", []))),
    )
