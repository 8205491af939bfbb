"""Checking a recording by replaying it: each episode's env made again from its session (or by a
factory of your own), reset with the episode's seed, stepped with its recorded actions, and every
observation, reward, end flag, mask and state compared with what was recorded.

An episode can be replayed when its origin (`FlexibleBuffer.episode_origins`) says how its env
was reset: with a seed, or without one right after its lane's previous episode (then that one is
replayed first, back to a seeded one, in one env, as the recording went). The others are named
with the reason (no seed; its lane's episode before is not in the dataset; no env id).

The replay records into a buffer of its own through the same recorder the API calls for, so both
sides are encoded alike. A chain whose replay differs from the recording is replayed a second
time: if the two replays differ from each other, the env is not deterministic and its episodes
are reported as such, not as divergences.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, SpecMismatchError
from flexibuff_envs.index import EpisodeTable, episode_table
from flexibuff_envs.index.origins import FOLLOWS, KNOWN, SEEDED
from flexibuff_envs.integrations.replay_play import COMPARED, GATHERED, Arrays, Replayer
from flexibuff_envs.integrations.tables import GLOBAL, Source, episode_arrays, open_source

#: rows replayed and compared at a time (an episode longer is one block)
BLOCK_ROWS = 1 << 16
#: what `gymnasium.make_vec` adds to the keywords of its sub-envs' spec
_VECTOR_KWARGS = frozenset({"num_envs", "vectorization_mode", "vector_kwargs", "wrappers"})
#: `replay`'s verdict on an episode beside "clean"
DIVERGED, NONDETERMINISTIC = "diverged", "not deterministic"


@dataclass(frozen=True)
class Divergence:
    """Where a replay first differed from the recording: the episode (its number in the
    dataset), the step (row of the episode), the agent, the field, and both values."""

    episode: int
    step: int
    agent: str
    field: str
    recorded: Any
    replayed: Any

    def __str__(self) -> str:
        return (
            f"episode {self.episode}, step {self.step}, agent {self.agent!r}: {self.field} was "
            f"{_shown(self.recorded)} in the recording, {_shown(self.replayed)} in the replay"
        )


@dataclass
class ReplayReport:
    """What `replay` found: each episode's verdict, the first divergence of each chain, and
    the episodes that could not be replayed, with why."""

    episodes: int
    clean: list[int] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    nondeterministic: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)
    #: episodes of a chain after its first divergence: replayed from a state that already differed
    unchecked: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No episode diverged (episodes skipped or of a non-deterministic env aside)."""
        return not self.divergences


def replay(
    source: Source,
    *,
    env: Callable[[], Any] | None = None,
    episodes: Sequence[int] | None = None,
) -> ReplayReport:
    """Replay the episodes of ``source`` (a buffer, a buffer file or an episode log; by default
    every one, else those numbered ``episodes``, with the episodes of their lanes before them
    back to a seeded one) and compare them with the recording.

    ``env``: makes the env to replay in (of the API the recording used; for a vector recording,
    one sub-env), where the sessions' env ids cannot (an env made by hand, wrappers of your own).
    """
    buffer = open_source(source)
    records, sessions = episode_table(buffer._index.read()).origins, buffer.sessions
    assert records is not None  # ended episodes' tables have them
    report = ReplayReport(len(records))
    wanted = None if episodes is None else {int(k) for k in episodes}
    if wanted and not all(0 <= k < len(records) for k in wanted):
        raise InvalidArgumentError(f"episodes {sorted(wanted)[:8]}: the dataset holds episodes 0 to {len(records) - 1}")
    flags = records["flags"]
    seeds = [int(seed) if flag & SEEDED else -1 for seed, flag in zip(records["seed"].tolist(), flags.tolist())]
    for chain, why in _chains(records):
        if why:
            report.skipped.update({k: why for k in chain if wanted is None or k in wanted})
            continue
        if wanted is not None and wanted.isdisjoint(chain):
            continue
        if wanted is not None:  # up to the last episode asked for
            chain = chain[: max(i for i, k in enumerate(chain) if k in wanted) + 1]
        begun = int(records["session"][chain[0]])
        session = sessions[begun] if 0 <= begun < len(sessions) else None
        api = buffer.spec.env_api or (session or {}).get("api", "")
        make, why = _maker(session, api, env)
        if make is None:
            report.skipped.update({k: why for k in chain})
            continue
        _check_chain(buffer, chain, seeds, api, make, report)
    return report


def _chains(records: np.ndarray) -> Iterable[tuple[list[int], str]]:
    """The episodes in chains a replay goes through in one env, each with "" or why it cannot be
    replayed: a seeded one, then each of its lane that follows it, or a seeded one right after it
    (replayed in the same env, as recorded: a wrapper may keep state across episodes). Within a
    lane, episodes go in the dataset's order (a log merged twice holds them twice)."""
    flags = records["flags"]
    known = (flags & KNOWN) > 0
    for k in np.flatnonzero(~known).tolist():
        yield (
            [k],
            (
                "its origin was not kept (filled by hand, recorded before origins were kept, or in the last "
                "block of a vector recording that was killed)"
            ),
        )
    numbers = np.flatnonzero(known)
    order = np.lexsort((numbers, records["lane"][known], records["env"][known]))
    chain: list[int] = []
    why = ""
    previous: tuple[int, int, int] | None = None
    for k in numbers[order].tolist():
        here = (int(records["env"][k]), int(records["lane"][k]), int(records["ordinal"][k]))
        continues = previous is not None and here[:2] == previous[:2] and here[2] == (previous[2] + 1) % 2**32
        if chain and continues and (flags[k] & FOLLOWS or (flags[k] & SEEDED and not why)):
            chain.append(k)  # (one that follows an episode that cannot be replayed cannot be either)
        elif flags[k] & SEEDED:
            if chain:
                yield chain, why
            chain, why = [k], ""
        else:
            if chain:
                yield chain, why
            chain = [k]
            why = (
                "its lane's episode before it is not in the dataset"
                if flags[k] & FOLLOWS
                else "its env was reset without a seed"
            )
        previous = here
    if chain:
        yield chain, why


def _maker(session: dict[str, Any] | None, api: str, env: Callable[[], Any] | None) -> tuple[Any, str]:
    """A function making the env a chain is replayed in, or None and why there is none."""
    if env is not None:
        return env, ""
    if session is None:
        return None, "its session is unknown: give the env (--env module:factory)"
    env_id, kwargs = session["env_id"], session["env_kwargs"]
    if api in ("gymnasium", "vector") and (env_id or session["gym_spec"]):
        import gymnasium as gym
        from gymnasium.envs.registration import EnvSpec

        if api == "gymnasium" and session["gym_spec"]:
            spec = EnvSpec.from_json(session["gym_spec"])
            return (lambda: gym.make(spec)), ""
        made = {k: v for k, v in (kwargs or {}).items() if k not in _VECTOR_KWARGS}  # a vector env's: its sub-env's
        if (kwargs or {}).get("wrappers"):
            return None, "its sub-envs were wrapped (make_vec(wrappers=...)), which no spec keeps: give it (--env)"
        if api == "gymnasium" and _wrappers(gym.make(env_id, **made)) != session["wrappers"]:
            return None, "it was wrapped in ways its Gymnasium spec does not keep: give it (--env module:factory)"
        return (lambda: gym.make(env_id, **made)), ""
    if api in ("parallel", "aec") and env_id:
        if kwargs is None:
            return None, (
                "the keywords its env was made with were not recorded (fe.record(..., env_kwargs=) keeps "
                "them; the CLI does): give it (--env module:factory)"
            )
        try:
            module = importlib.import_module(env_id)
        except ImportError as exc:
            return None, f"its env module {env_id} cannot be imported ({exc})"
        factory = getattr(module, "parallel_env" if api == "parallel" else "env", None)
        if factory is None:
            return None, f"{env_id} has no {'parallel_env' if api == 'parallel' else 'env'}()"
        return (lambda: factory(**kwargs)), ""
    return None, "its env was made by hand (no env id recorded): give it (--env module:factory)"


def _wrappers(env: Any) -> list[str]:
    """The classes around ``env``, outermost first, as a session names them (`spec.provenance`)."""
    from flexibuff_envs.spec.provenance import session

    try:
        return list(session(env, "gymnasium")["wrappers"])
    finally:
        env.close()


def _check_chain(
    buffer: FlexibleBuffer, chain: list[int], seeds: list[int], api: str, make: Callable[[], Any], report: ReplayReport
) -> None:
    """Replay ``chain`` a block of episodes at a time and set each one's verdict in ``report``."""
    table = episode_table(buffer._index.read())
    lengths = table.lengths[chain]
    blocks = _blocks(lengths)
    capacity = max(int(lengths[lo:hi].sum()) for lo, hi in blocks) + 2
    try:
        replayer = Replayer(buffer.spec, api, make, capacity)
    except SpecMismatchError as exc:
        why = f"the env made again does not match the recording ({exc}): give it (--env)"
        report.skipped.update({k: why for k in chain})
        return
    found = None
    try:
        for lo, hi in blocks:
            recorded = _recorded(buffer, table, chain[lo:hi])
            replayed = replayer.play([seeds[k] for k in chain[lo:hi]], recorded, lengths[lo:hi])
            found = _first_difference(chain[lo:hi], recorded, lengths[lo:hi], *replayed, buffer.spec.agent_ids)
            if found is not None:
                break
            report.clean.extend(chain[lo:hi])
    finally:
        replayer.close()
    if found is None:
        return
    at, divergence = found
    if at in replayer.cut:  # an AEC game cut mid-game: its last rows close moves the recording lacks
        why = "the user cut it mid-game: the moves of the turns left open are not in the recording"
        report.skipped.update({k: why for k in chain[lo + at :]})
        report.clean.extend(chain[lo : lo + at])
        return
    again = Replayer(buffer.spec, api, make, capacity)  # from the chain's head, up to that block
    try:
        for lo2, hi2 in blocks[: blocks.index((lo, hi))]:
            earlier = chain[lo2:hi2]
            again.play([seeds[k] for k in earlier], _recorded(buffer, table, earlier), lengths[lo2:hi2])
        second = again.play([seeds[k] for k in chain[lo:hi]], recorded, lengths[lo:hi])
    finally:
        again.close()
    if _first_difference(chain[lo:hi], replayed[0], replayed[1], *second, buffer.spec.agent_ids) is not None:
        report.nondeterministic.extend(chain[lo + at :])
    else:
        report.divergences.append(divergence)
        report.unchecked.extend(chain[lo + at + 1 :])
    report.clean.extend(chain[lo : lo + at])


def _blocks(lengths: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive episodes of at most `BLOCK_ROWS` rows together (one at least)."""
    out, lo, rows = [], 0, 0
    for k, n in enumerate(lengths.tolist()):
        if k > lo and rows + n > BLOCK_ROWS:
            out.append((lo, k))
            lo, rows = k, 0
        rows += n
    out.append((lo, len(lengths)))
    return out


def _recorded(buffer: FlexibleBuffer, table: EpisodeTable, episodes: list[int]) -> Arrays:
    """The rows of ``episodes`` (back to back) as `episode_arrays` gives them: one gather."""
    ks = np.array(episodes)
    some = EpisodeTable(table.starts[ks], table.ends[ks], table.offsets[ks], table.capacity)
    return episode_arrays(buffer.gather(some.all_rows()[0], fields=GATHERED), buffer.spec)


def _first_difference(
    chain: list[int],
    recorded: Arrays,
    lengths: np.ndarray,
    replayed: Arrays,
    replayed_lengths: np.ndarray,
    agents: Sequence[str],
) -> tuple[int, Divergence] | None:
    """The first episode of ``chain`` (its place) where ``replayed`` (back to back, of
    ``replayed_lengths``) differs from ``recorded`` (of ``lengths``), and where."""
    n = min(len(lengths), len(replayed_lengths))
    unequal = np.flatnonzero(lengths[:n] != replayed_lengths[:n])
    last = int(unequal[0]) if unequal.size else n  # episodes before it line up row for row
    shorter = min(int(lengths[last]), int(replayed_lengths[last])) if last < n else 0
    rows = int(lengths[:last].sum()) + shorter
    ends = np.cumsum(lengths)
    best: tuple[int, str, int, Any, Any] | None = None  # row, field, agent, values
    for name in COMPARED:
        x, y = recorded.get(name), replayed.get(name)
        if x is None and y is None:
            continue
        if x is None or y is None:
            return 0, Divergence(
                chain[0], 0, "", name, "recorded" if x is not None else None, "recorded" if y is not None else None
            )
        per_agent = name not in GLOBAL
        x2, y2 = (x, y) if per_agent else (x[None], y[None])
        same = _equal(x2[:, :rows], y2[:, :rows])
        if same.all():
            continue
        agent, row = np.argwhere(~same.T)[0][::-1].tolist()
        if best is None or row < best[0]:
            best = (row, name, agent if per_agent else -1, x2[agent, row], y2[agent, row])
    if best is None and last >= n and len(replayed_lengths) >= len(lengths):
        return None
    if best is None:  # the rows held agree: an episode ended at another step
        at = min(n, last)
        step = shorter
        recorded_length = int(lengths[at])
        replayed_length = int(replayed_lengths[at]) if at < len(replayed_lengths) else 0
        return at, Divergence(chain[at], step, "", "length", recorded_length, replayed_length)
    row, name, agent, a, b = best
    at = int(np.searchsorted(ends, row, side="right"))
    step = row - (int(ends[at - 1]) if at else 0)
    return at, Divergence(chain[at], step, agents[agent] if agent >= 0 else "", name, a, b)


def _equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[agents, steps]``: whether each row is equal (NaN equal to NaN)."""
    if x.shape != y.shape:
        return np.zeros(x.shape[:2], bool)
    same = x == y
    if x.dtype.kind == "f":
        same |= np.isnan(x) & np.isnan(y)
    return same.all(axis=tuple(range(2, same.ndim)))


def _shown(value: Any) -> str:
    """A value as a report shows it: every digit a float needs to differ from another."""
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=12, floatmode="unique")
    return repr(value.item() if isinstance(value, np.generic) else value)


def parse_factory(text: str) -> Callable[[], Any]:
    """``module:factory`` (``--env``): the callable that makes the env."""
    module_name, _, name = text.partition(":")
    if not module_name or not name:
        raise InvalidArgumentError(f"--env must be module:factory (say, my_envs:make), got {text!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(f"--env {text}: cannot import {module_name} ({exc})") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InvalidArgumentError(f"--env {text}: {module_name} has no callable {name!r}")
    return factory
