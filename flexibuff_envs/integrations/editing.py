"""Editing a dataset without rewriting it by hand: the episodes a condition on their outcomes
selects (`where`), and a new episode log of chosen episodes (`select`), of all but some (`drop`)
or of random shares (`split`). The source is only read; each new log keeps the sessions that
recorded its episodes, numbered as its own, and names the source and the edit in a session of
its own.

A condition is a Python-like expression over one agent of one episode (an episode is chosen when
it holds for any of its agents): ``return`` (that agent's), ``team_return``, ``length`` (the
episode's rows), ``steps`` (the agent's active rows), ``ended`` ("terminated", "truncated",
"cut": the agent's), ``deaths`` (agents terminated before the episode ended, parallel
recordings), ``agent`` (its name), ``episode`` (its number), ``policy`` (the tag of the session
that began it), ``seed`` (its env's reset seed, -1 without one); comparisons, ``and``, ``or``,
``not``, parentheses, numbers and strings.
Nothing else is evaluated: it is parsed, never run as code.
"""

from __future__ import annotations

import ast
import io
import os
import socket
import time
import tokenize
from collections.abc import Sequence
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, UnknownNameError
from flexibuff_envs.files.chunk import copy
from flexibuff_envs.index import EpisodeTable, episode_ranges, episode_sums, episode_table
from flexibuff_envs.integrations.tables import Source, open_source
from flexibuff_envs.log import LogHeader, LogWriter
from flexibuff_envs.spec import provenance
from flexibuff_envs.view.data import ENDINGS, Run

#: the names a condition may use
NAMES = ("return", "team_return", "length", "steps", "ended", "deaths", "agent", "episode", "policy", "seed")
_COMPARE = {
    ast.Eq: np.equal,
    ast.NotEq: np.not_equal,
    ast.Lt: np.less,
    ast.LtE: np.less_equal,
    ast.Gt: np.greater,
    ast.GtE: np.greater_equal,
}
#: rows (and bytes) gathered at a time when a selection is copied
BLOCK_ROWS, BLOCK_BYTES = 65_536, 1 << 26
#: the session an edit adds to the log it writes, before the sessions of the episodes it keeps
_EDIT: dict[str, Any] = {
    "api": "edit",
    "env_id": "",
    "gym_spec": "",
    "wrappers": [],
    "policy": "",
    "first_episode": 0,
}


def outcomes(buffer: FlexibleBuffer) -> dict[str, np.ndarray]:
    """Each agent's outcome in each whole episode (`episodes` order), as `NAMES` name them: arrays
    of ``[episodes, agents]``."""
    run = Run.over(buffer)
    t, lanes, origins = run.table, buffer._index.read(), buffer.episode_origins()
    store = buffer._store.arrays
    n, agents = len(t.lengths), list(buffer.spec.agent_ids)
    terminated, truncated = episode_sums(store["terminated"], lanes).T, episode_sums(store["truncated"], lanes).T
    ended = np.where(terminated > 0, 0, np.where(truncated > 0, 1, 2))
    return {
        "return": t.returns,
        "team_return": np.repeat(t.team[:, None], len(agents), axis=1),
        "length": np.repeat(t.lengths[:, None], len(agents), axis=1),
        "steps": episode_sums(store["active"], lanes).T.astype(np.int64),
        "ended": np.array(ENDINGS, dtype=object)[ended].astype(str),
        "deaths": np.repeat(t.deaths[:, None], len(agents), axis=1),
        "agent": np.broadcast_to(np.array(agents), (n, len(agents))),
        "episode": np.repeat(np.arange(n)[:, None], len(agents), axis=1),
        "policy": np.repeat(policies(buffer.sessions, n, origins["session"])[:, None], len(agents), axis=1),
        "seed": np.repeat(origins["seed"][:, None], len(agents), axis=1),
    }


def policies(sessions: list[dict[str, Any]], n: int, begun: np.ndarray) -> np.ndarray:
    """The policy tag of each of ``n`` episodes, by the session that began it (``begun``, its
    origin's; where unknown, the last whose ``first_episode`` is at most its number; without
    numbers, the only session's, else "")."""
    numbered = [s for s in sessions if s["first_episode"] is not None]
    if not numbered:
        by_order = np.full(n, sessions[0]["policy"] if len(sessions) == 1 else "", dtype=object).astype(str)
    else:
        firsts = np.array([s["first_episode"] for s in numbered])
        which = np.searchsorted(firsts, np.arange(n), side="right") - 1
        by_order = np.array(["", *(s["policy"] for s in numbered)], dtype=object)[which + 1].astype(str)
    tags = np.array([s["policy"] for s in sessions] + [""], dtype=object).astype(str)
    return np.where(begun >= 0, tags[begun], by_order) if n else by_order


def where(source: Source, condition: str) -> np.ndarray:
    """The numbers of the whole episodes of ``source`` for which ``condition`` holds for some
    agent, in order.

    Raises:
        InvalidArgumentError: ``condition`` is not a condition over `NAMES` (it says where).
    """
    if len(condition) > 10_000:
        raise InvalidArgumentError(f"--where {condition[:80]!r}...: longer than 10,000 characters")
    values = outcomes(open_source(source))
    values["_return"] = values.pop("return")  # a keyword of Python's: renamed to parse
    try:
        tokens = tokenize.generate_tokens(io.StringIO(condition).readline)
        text = tokenize.untokenize(
            (t.type, "_return" if t.type == tokenize.NAME and t.string == "return" else t.string) for t in tokens
        )
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, tokenize.TokenError, RecursionError, MemoryError) as exc:
        raise InvalidArgumentError(f"--where {condition!r}: not a condition ({exc.args[0]})") from None
    try:
        return np.flatnonzero(_condition(tree.body, values, condition).any(axis=1))
    except RecursionError:
        raise InvalidArgumentError(f"--where {condition[:80]!r}...: nested too deeply") from None


def _evaluate(node: ast.AST, values: dict[str, np.ndarray], text: str) -> Any:
    if isinstance(node, ast.BoolOp):
        parts = [_condition(v, values, text) for v in node.values]
        return np.logical_and.reduce(parts) if isinstance(node.op, ast.And) else np.logical_or.reduce(parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ~_condition(node.operand, values, text)
    if isinstance(node, ast.Compare):
        left, out = _evaluate(node.left, values, text), None
        for op, right_node in zip(node.ops, node.comparators):
            compare = _COMPARE.get(type(op))
            if compare is None:
                raise InvalidArgumentError(f"--where {text!r}: {type(op).__name__} is no comparison it takes")
            right = _evaluate(right_node, values, text)
            try:
                step = compare(left, right)
            except TypeError:  # a name compared with a number
                raise InvalidArgumentError(
                    f"--where {text!r}: cannot compare {ast.unparse(node).replace('_return', 'return')}: agent, ended "
                    "and policy compare with text ('player_0', 'terminated'), the rest with numbers"
                ) from None
            out = step if out is None else out & step
            left = right
        return out
    if isinstance(node, ast.Name):
        if node.id not in values or node.id == "return":
            raise UnknownNameError(f"--where {text!r}: {node.id!r} is none of {list(NAMES)}")
        return values[node.id]
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float, str))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    raise InvalidArgumentError(f"--where {text!r}: {ast.unparse(node)!r} is not part of a condition")


def _condition(node: ast.AST, values: dict[str, np.ndarray], text: str) -> np.ndarray:
    """``node`` evaluated as a condition: ``[episodes, agents]`` of booleans, or an error."""
    value = _evaluate(node, values, text)
    if np.ndim(value) != 2 or np.asarray(value).dtype != bool:
        shown = ast.unparse(node).replace("_return", "return")
        raise InvalidArgumentError(f"--where {text!r}: {shown!r} is a value, not a condition (return > 100)")
    return np.asarray(value)


def select(source: Source, episodes: Sequence[int] | np.ndarray, out: str | os.PathLike[str], *, edit: str) -> int:
    """A new episode log ``out`` of the whole episodes ``episodes`` of ``source`` (numbers, as
    `where` gives them), in order, as recorded (``G`` included); ``edit`` says what chose them,
    kept in a session of the new log. Returns how many it holds.

    Raises:
        InvalidArgumentError: a number is not one of the source's episodes, or ``out`` exists.
    """
    buffer = open_source(source)
    chosen = np.unique(np.asarray(episodes, dtype=np.int64))
    total = buffer.n_episodes
    if chosen.size and not 0 <= chosen[0] <= chosen[-1] < total:
        raise InvalidArgumentError(f"episodes {chosen.tolist()[:5]}...: the source holds episodes 0 to {total - 1}")
    if os.path.exists(out):
        raise InvalidArgumentError(f"{os.fspath(out)}: exists already; an edit writes a new log")
    named = _name(source)
    origin = {**_EDIT, "env_kwargs": {"edit": edit, "source": named}, "host": socket.gethostname()}
    origin.update(pid=os.getpid(), started=time.time(), versions=provenance.session(buffer, "")["versions"])
    table = episode_table(buffer._index.read())
    sessions, moved = renumbered(buffer.sessions, chosen)
    origins = table.origins[chosen]  # type: ignore[index]
    origins["session"] = np.where(origins["session"] >= 0, moved[origins["session"]], -1)
    writer = LogWriter(out, LogHeader(buffer.spec, buffer.gamma, buffer.gae_lambda), fsync="close")
    try:
        writer.add_sessions([origin, *sessions])
        # blocks of whole episodes, each gathered in its stored form (one gather a field) and
        # committed at once: G, masks and annotations as recorded, next values renumbered
        per_block = max(1, min(BLOCK_ROWS, BLOCK_BYTES // max(buffer.nbytes_per_row, 1)))
        for lo, hi in episode_ranges(table.lengths[chosen], per_block):
            ks = chosen[lo:hi]
            some = EpisodeTable(table.starts[ks], table.ends[ks], table.offsets[ks], table.capacity, origins[lo:hi])
            writer.append(copy(buffer._store, some, buffer.gamma, buffer.gae_lambda))
    finally:
        writer.close()
    return int(chosen.size)


def renumbered(sessions: list[dict[str, Any]], chosen: np.ndarray) -> tuple[list[dict[str, Any]], np.ndarray]:
    """``sessions`` with each ``first_episode`` counted among the ``chosen`` episodes only (those
    that recorded none of them left out), and where each went in the new log (after the edit's
    own session; -1: left out)."""
    moved = np.full(len(sessions) + 1, -1, dtype=np.int32)
    out: list[dict[str, Any]] = []
    for k, s in enumerate(sessions):  # which episodes they recorded is unknown: all kept
        if s["first_episode"] is None:
            moved[k] = len(out) + 1
            out.append(dict(s))
    numbered = [k for k, s in enumerate(sessions) if s["first_episode"] is not None]
    for j, k in enumerate(numbered):
        end = sessions[numbered[j + 1]]["first_episode"] if j + 1 < len(numbered) else None
        first = int(np.searchsorted(chosen, sessions[k]["first_episode"]))
        last = len(chosen) if end is None else int(np.searchsorted(chosen, end))
        if last > first:
            moved[k] = len(out) + 1
            out.append({**sessions[k], "first_episode": first})
    return out, moved


def drop(source: Source, episodes: Sequence[int], out: str | os.PathLike[str]) -> int:
    """A new log ``out`` of every whole episode of ``source`` but ``episodes``; returns how many."""
    buffer = open_source(source)
    gone = np.asarray(episodes, dtype=np.int64)
    if gone.size and not (0 <= gone.min() and gone.max() < buffer.n_episodes):
        raise InvalidArgumentError(
            f"drop: the source holds episodes 0 to {buffer.n_episodes - 1}, not {gone.tolist()[:20]}"
        )
    kept = np.setdiff1d(np.arange(buffer.n_episodes), gone)
    named = sorted(set(gone.tolist()))
    listed = ", ".join(map(str, named[:20])) + (f" and {len(named) - 20:,} more" if len(named) > 20 else "")
    return select(buffer, kept, out, edit=f"drop episodes {listed} of {_name(source)}")


def split(source: Source, shares: dict[str, float], out: str | os.PathLike[str], *, seed: int = 0) -> dict[str, int]:
    """New logs ``out/NAME`` of random whole episodes of ``source``, ``shares[NAME]`` of them each
    (fractions adding up to at most 1; rounded down, the first share takes what rounding leaves
    of a total of 1), drawn with ``seed``; each in the source's order. Returns how many each holds."""
    buffer = open_source(source)
    if not shares or any(not 0 < f <= 1 for f in shares.values()) or sum(shares.values()) > 1 + 1e-9:
        raise InvalidArgumentError(f"split: shares are fractions in (0, 1] adding up to at most 1, got {shares}")
    n = buffer.n_episodes
    counts = {name: int(f * n) for name, f in shares.items()}
    if abs(sum(shares.values()) - 1) < 1e-9:  # every episode goes somewhere
        counts[next(iter(counts))] += n - sum(counts.values())
    order = np.random.default_rng(seed).permutation(n)
    os.makedirs(out, exist_ok=True)
    held, start = {}, 0
    for name, count in counts.items():
        chosen = np.sort(order[start : start + count])
        start += count
        edit = f"split {_name(source)} with seed {seed}: {name}, {shares[name]:g} of its episodes"
        held[name] = select(buffer, chosen, os.path.join(out, name), edit=edit)
    return held


def _name(source: Source) -> str:
    return "a buffer" if isinstance(source, FlexibleBuffer) else os.path.abspath(os.fspath(source))
