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
from flexibuff_envs.index.origins import FOLLOWS, KNOWN, SEEDED
from flexibuff_envs.integrations.replay_play import play
from flexibuff_envs.integrations.tables import Source, episode_arrays, open_source
from flexibuff_envs.sampling.samplers import Episodes

#: the fields a replay must give again (actions are what it gives the env; values, log probs
#: and feedback are the agent's and the user's, not the env's)
COMPARED = (
    "obs",
    "obs_",
    "individual_rewards",
    "terminated",
    "truncated",
    "active",
    "action_mask",
    "action_mask_",
    "state",
    "state_",
)
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
    origins, sessions = buffer.episode_origins(), buffer.sessions
    flags = _flags(buffer)
    report = ReplayReport(len(origins["seed"]))
    wanted = None if episodes is None else {int(k) for k in episodes}
    for chain, why in _chains(origins, flags):
        if why:
            report.skipped.update({k: why for k in chain if wanted is None or k in wanted})
            continue
        if wanted is not None and wanted.isdisjoint(chain):
            continue
        if wanted is not None:  # up to the last episode asked for
            chain = chain[: max(i for i, k in enumerate(chain) if k in wanted) + 1]
        session = sessions[origins["session"][chain[0]]] if origins["session"][chain[0]] >= 0 else None
        api = buffer.spec.env_api or (session or {}).get("api", "")
        make, why = _maker(session, api, env)
        if make is None:
            report.skipped.update({k: why for k in chain})
            continue
        _check_chain(buffer, chain, origins["seed"], api, make, report)
    return report


def _flags(buffer: FlexibleBuffer) -> np.ndarray:
    """Each episode's origin flags (`index.origins`), in `episodes`' order."""
    origins = buffer.episode_origins()
    return (
        np.where(np.isfinite(origins["started"]), KNOWN, 0)
        | np.where(origins["seed"] >= 0, SEEDED, 0)
        | np.where(origins["follows"], FOLLOWS, 0)
    )


def _chains(origins: dict[str, np.ndarray], flags: np.ndarray) -> Iterable[tuple[list[int], str]]:
    """The episodes in chains a replay goes through in one env (a seeded one, then each that
    follows it in its lane), each with "" or why it cannot be replayed."""
    known = (flags & KNOWN) > 0
    for k in np.flatnonzero(~known).tolist():
        yield [k], "its origin is unknown (filled by hand, or recorded before origins were kept)"
    key = np.stack([origins["env"].astype(np.int64), origins["lane"].astype(np.int64)], axis=1)[known]
    numbers = np.flatnonzero(known)
    order = np.lexsort((origins["ordinal"][known], key[:, 1], key[:, 0]))
    chain: list[int] = []
    why = ""
    previous: tuple[int, int, int] | None = None
    for k in numbers[order].tolist():
        here = (int(origins["env"][k]), int(origins["lane"][k]), int(origins["ordinal"][k]))
        continues = previous is not None and here[:2] == previous[:2] and here[2] == previous[2] + 1
        if flags[k] & SEEDED:
            if chain:
                yield chain, why
            chain, why = [k], ""
        elif flags[k] & FOLLOWS and continues and chain:
            chain.append(k)
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
    env_id, kwargs = session["env_id"], session["env_kwargs"] or {}
    if api in ("gymnasium", "vector") and (env_id or session["gym_spec"]):
        import gymnasium as gym
        from gymnasium.envs.registration import EnvSpec

        if api == "gymnasium" and session["gym_spec"]:
            spec = EnvSpec.from_json(session["gym_spec"])
            return (lambda: gym.make(spec)), ""
        made = {k: v for k, v in kwargs.items() if k not in _VECTOR_KWARGS}  # a vector env's: its sub-env's
        return (lambda: gym.make(env_id, **made)), ""
    if api in ("parallel", "aec") and env_id:
        try:
            module = importlib.import_module(env_id)
        except ImportError as exc:
            return None, f"its env module {env_id} cannot be imported ({exc})"
        factory = getattr(module, "parallel_env" if api == "parallel" else "env", None)
        if factory is None:
            return None, f"{env_id} has no {'parallel_env' if api == 'parallel' else 'env'}()"
        return (lambda: factory(**kwargs)), ""
    return None, "its env was made by hand (no env id recorded): give it (--env module:factory)"


def _check_chain(
    buffer: FlexibleBuffer, chain: list[int], seeds: np.ndarray, api: str, make: Callable[[], Any], report: ReplayReport
) -> None:
    """Replay ``chain`` and set each of its episodes' verdict in ``report``."""
    recorded = [episode_arrays(b, buffer.spec) for b in buffer.draw(Episodes(chosen=tuple(chain)))]
    try:
        first = _play(buffer, chain, recorded, seeds, api, make)
    except SpecMismatchError as exc:
        report.skipped.update(
            {k: f"the env made again does not match the recording ({exc}): give it (--env)" for k in chain}
        )
        return
    found = _first_difference(chain, recorded, first, buffer.spec.agent_ids)
    if found is None:
        report.clean.extend(chain)
        return
    at, divergence = found
    second = _play(buffer, chain[: at + 1], recorded[: at + 1], seeds, api, make)
    if _first_difference(chain[: at + 1], first[: at + 1], second, buffer.spec.agent_ids) is not None:
        report.nondeterministic.extend(chain[at:])
    else:
        report.divergences.append(divergence)
    report.clean.extend(chain[:at])


def _play(
    buffer: FlexibleBuffer,
    chain: list[int],
    recorded: list[dict[str, np.ndarray]],
    seeds: np.ndarray,
    api: str,
    make: Callable[[], Any],
) -> list[dict[str, np.ndarray]]:
    """The chain replayed in a fresh env: each episode's arrays as `episode_arrays` gives them
    (an episode that did not end with its recorded actions: the rows it has)."""
    return play(buffer.spec, [int(seeds[k]) for k in chain], recorded, api, make)


def _first_difference(
    chain: list[int],
    recorded: list[dict[str, np.ndarray]],
    replayed: list[dict[str, np.ndarray]],
    agents: Sequence[str],
) -> tuple[int, Divergence] | None:
    """The first episode of ``chain`` (its place) where ``replayed`` differs, and where."""
    for at, (k, a, b) in enumerate(zip(chain, recorded, replayed)):
        divergence = _difference(k, a, b, agents)
        if divergence is not None:
            return at, divergence
    if len(replayed) < len(recorded):
        return len(replayed), Divergence(chain[len(replayed)], 0, "", "episode", "recorded", "not replayed")
    return None


def _difference(k: int, a: dict[str, np.ndarray], b: dict[str, np.ndarray], agents: Sequence[str]) -> Divergence | None:
    """Where one episode's replayed arrays ``b`` first differ from its recorded ``a``."""
    best: Divergence | None = None
    for name in COMPARED:
        x, y = a.get(name), b.get(name)
        if x is None and y is None:
            continue
        if x is None or y is None:
            return Divergence(
                k, 0, "", name, "recorded" if x is not None else None, "recorded" if y is not None else None
            )
        per_agent = x.ndim >= 2 and x.shape[0] == len(agents) and name not in ("state", "state_")
        x2, y2 = (x, y) if per_agent else (x[None], y[None])
        steps = min(x2.shape[1], y2.shape[1])
        same = _equal(x2[:, :steps], y2[:, :steps])
        if steps < max(x2.shape[1], y2.shape[1]):
            same = np.concatenate([same, np.zeros((same.shape[0], 1), bool)], axis=1)
        if same.all():
            continue
        agent, step = np.argwhere(~same.T)[0][::-1].tolist()
        if best is None or step < best.step:
            past = step >= steps
            best = Divergence(
                k,
                step,
                agents[agent] if per_agent else "",
                "length" if past else name,
                x2.shape[1] if past else x2[agent, step],
                y2.shape[1] if past else y2[agent, step],
            )
    return best


def _equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[agents, steps]``: whether each row is equal (NaN equal to NaN)."""
    if x.shape != y.shape:
        return np.zeros(x.shape[:2], bool)
    same = x == y
    if x.dtype.kind == "f":
        same |= np.isnan(x) & np.isnan(y)
    return same.reshape(*x.shape[:2], -1).all(axis=-1)


def _shown(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return np.array2string(value, threshold=12, precision=6)
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
