"""The values of a header's JSON, checked one by one (`BadHeader` saying what is wrong), and the
`BufferSpec` a buffer file's or an episode log's header holds (`parse_spec`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from flexibuff_envs.errors import plain_dtype, short_repr
from flexibuff_envs.index.origins import FIELDS, ORIGIN
from flexibuff_envs.spec import BufferSpec, one_hot_problem
from flexibuff_envs.storage.fields import extra_fields

#: bounds no real buffer comes near; a header past them is refused before any arithmetic
MAX_ROWS = 1 << 40
MAX_WIDTH = 1 << 31
MAX_AGENTS = 1 << 16
MAX_POSITION = 1 << 62


class BadHeader(Exception):
    """What is wrong with a header (without the file's path)."""


# ----------------------------------------------------------------------------- values


def integer(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadHeader(f"{what} must be an integer in [{lo}, {hi}], got {short_repr(value)}")
    return value


def fraction(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise BadHeader(f"{what} must be a number in [0, 1], got {short_repr(value)}")
    return float(value)


def finite(value: Any, what: str, lo: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value < math.inf:
        raise BadHeader(f"{what} must be a finite number >= {lo}, got {short_repr(value)}")
    return float(value)


def of_kind(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind):
        raise BadHeader(f"{what} must be a JSON {kind.__name__}, got {short_repr(value)}")
    return value


def keys_of(value: Any, what: str, required: set[str], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    data = of_kind(value, dict, what)
    missing, unknown = required - data.keys(), data.keys() - required - optional
    if missing or unknown:
        raise BadHeader(
            f"{what} "
            + "; ".join(
                [f"lacks {sorted(missing)}"] * bool(missing) + [f"has unknown keys {sorted(unknown)}"] * bool(unknown)
            )
        )
    return data


def integers(value: Any, what: str, lo: int, hi: int, length: int | None = None) -> tuple[int, ...]:
    items = of_kind(value, list, what)
    if length is not None and len(items) != length:
        raise BadHeader(f"{what} must have {length} entries, got {len(items)}")
    if len(items) > MAX_AGENTS:
        raise BadHeader(f"{what} has {len(items)} entries, more than {MAX_AGENTS}")
    return tuple(integer(v, f"{what}[{i}]", lo, hi) for i, v in enumerate(items))


def origin_columns(value: Any, what: str, n: int) -> np.ndarray:
    """The origins (`index.origins.ORIGIN`) of ``n`` episodes a header holds as one list per
    field (a record's fields are of several kinds, and a seed may not fit an int64)."""
    columns = keys_of(value, what, set(FIELDS))
    out = np.zeros(n, dtype=ORIGIN)
    for name in FIELDS:
        items = of_kind(columns[name], list, f"{what} {name}")
        dtype = ORIGIN[name]
        lo, hi = (-math.inf, math.inf) if dtype.kind == "f" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        kinds = (int, float) if dtype.kind == "f" else int
        if len(items) != n or not all(
            isinstance(v, kinds) and not isinstance(v, bool) and lo <= v <= hi for v in items
        ):
            raise BadHeader(f"{what} {name} must list {n} {dtype} values, got {short_repr(items)}")
        out[name] = np.array(items, dtype=dtype)
    return out


def dtype_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadHeader(f"{what} must be a dtype name, got {short_repr(value)}")
    try:
        return plain_dtype(what, value).name
    except ValueError as exc:
        raise BadHeader(str(exc)) from None


_SPEC_KEYS = frozenset(f.name for f in dataclasses.fields(BufferSpec))
#: the APIs a spec may say it was recorded from ("": unknown)
ENV_APIS = ("", "gymnasium", "vector", "parallel", "aec")


def parse_spec(value: Any) -> BufferSpec:
    """A `BufferSpec` from its JSON form (a file's or a log's header), or `BadHeader` saying what is wrong."""
    data = keys_of(
        value,
        "spec",
        {"obs_size", "obs_dtype", "n_agents", "agent_ids", "n_envs"},
        _SPEC_KEYS - {"obs_size", "obs_dtype", "n_agents", "agent_ids", "n_envs"},
    )
    n_agents = integer(data["n_agents"], "spec n_agents", 1, MAX_AGENTS)
    ids = of_kind(data["agent_ids"], list, "spec agent_ids")
    if len(ids) != n_agents or not all(isinstance(a, str) for a in ids):
        raise BadHeader(f"spec agent_ids must be {n_agents} names, got {short_repr(ids)}")
    cards = integers(data.get("discrete_action_cardinalities", []), "spec discrete_action_cardinalities", 1, MAX_WIDTH)
    state = data.get("state_size")
    categories = integers(data.get("obs_categories", []), "spec obs_categories", 1, MAX_WIDTH)
    obs_size = integer(data["obs_size"], "spec obs_size", 1, MAX_WIDTH)
    if categories and sum(categories) != obs_size:
        raise BadHeader(f"spec obs_categories add up to {sum(categories)}, not obs_size {obs_size}")
    if one_hot_problem(categories):
        raise BadHeader(f"spec {one_hot_problem(categories)}")
    per_agent = of_kind(
        data.get("agent_discrete_action_cardinalities", []), list, "spec agent_discrete_action_cardinalities"
    )
    if len(per_agent) not in (0, n_agents):
        raise BadHeader(f"spec agent_discrete_action_cardinalities must have {n_agents} entries")
    spec = BufferSpec(
        obs_size=obs_size,
        obs_dtype=dtype_name(data["obs_dtype"], "spec obs_dtype"),
        discrete_action_cardinalities=cards,
        continuous_action_dimension=integer(
            data.get("continuous_action_dimension", 0), "spec continuous_action_dimension", 0, MAX_WIDTH
        ),
        action_mask=of_kind(data.get("action_mask", False), bool, "spec action_mask") and bool(cards),
        n_agents=n_agents,
        agent_ids=tuple(ids),
        state_size=None if state is None else integer(state, "spec state_size", 1, MAX_WIDTH),
        n_envs=integer(data["n_envs"], "spec n_envs", 1, MAX_AGENTS),
        discrete_action_starts=integers(
            data.get("discrete_action_starts", [0] * len(cards)),
            "spec discrete_action_starts",
            -MAX_POSITION,
            MAX_POSITION,
            len(cards),
        ),
        obs_shape=integers(data.get("obs_shape", [obs_size]), "spec obs_shape", 0, MAX_WIDTH),
        state_dtype=dtype_name(data.get("state_dtype", "float32"), "spec state_dtype"),
        agent_obs_sizes=integers(data.get("agent_obs_sizes", []), "spec agent_obs_sizes", 1, obs_size),
        agent_discrete_action_cardinalities=tuple(
            integers(c, f"spec agent_discrete_action_cardinalities[{i}]", 1, MAX_WIDTH) for i, c in enumerate(per_agent)
        ),
        agent_continuous_action_dimensions=integers(
            data.get("agent_continuous_action_dimensions", []), "spec agent_continuous_action_dimensions", 0, MAX_WIDTH
        ),
        obs_categories=categories,
        extra_fields=_extra_fields(data.get("extra_fields", [])),
        env_api=of_kind(data.get("env_api", ""), str, "spec env_api"),
    )
    if spec.env_api not in ENV_APIS:
        raise BadHeader(f"spec env_api must be one of {list(ENV_APIS)}, got {short_repr(spec.env_api)}")
    if spec.agent_obs_sizes and len(spec.agent_obs_sizes) != n_agents:
        raise BadHeader(f"spec agent_obs_sizes must have {n_agents} entries")
    return spec


def _extra_fields(value: Any) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    items = of_kind(value, list, "spec extra_fields")
    if len(items) > MAX_AGENTS:
        raise BadHeader(f"spec extra_fields lists {len(items)} fields, more than {MAX_AGENTS}")
    given: dict[Any, Any] = {}
    for k, item in enumerate(items):
        entry = of_kind(item, list, f"spec extra_fields[{k}]")
        if len(entry) != 3 or not isinstance(entry[0], str) or entry[0] in given:
            raise BadHeader(f"spec extra_fields[{k}] must be a new [name, shape, dtype], got {short_repr(entry)}")
        given[entry[0]] = (integers(entry[1], f"spec extra_fields[{k}] shape", 1, MAX_WIDTH), entry[2])
    try:
        return extra_fields(given)
    except (TypeError, ValueError) as exc:
        raise BadHeader(f"spec {exc}") from None


def with_stored_state(spec: BufferSpec, described: Any) -> BufferSpec:
    """``spec`` as its file stores the global state: a file written before the state was kept at
    its space's dtype (``described``: its fields' or columns' JSON) holds it as float32 whatever
    its spec says, and reads as it was written."""
    if spec.state_dtype == "float32" or not isinstance(described, list):
        return spec
    stored = [
        d.get("dtype") for d in described if isinstance(d, dict) and d.get("name") == "state" and d.get("part") is None
    ]
    return dataclasses.replace(spec, state_dtype="float32") if stored == ["<f4"] else spec
