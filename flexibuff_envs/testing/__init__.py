"""Check the recorders on your own env, as PettingZoo's ``api_test`` checks the env itself.

`check_recorder` plays the bare env with random legal actions, logging by hand (plain loops in
`flexibuff_envs.testing.reference` and `flexibuff_envs.testing.pz_reference`, which share no code
with the recorders) what the buffer should hold. It then replays the same seeds and actions
through the recorder and compares what the wrapped env returned and every field of every row.

Imports: `recording` and below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flexibuff_envs.errors import FlexibuffError, NotAnEnvError
from flexibuff_envs.sampling.samplers import live_rows
from flexibuff_envs.spec.env_kinds import env_kind
from flexibuff_envs.testing.pz_reference import (
    Expected,
    play_aec,
    play_parallel,
    replay_aec,
    replay_parallel,
)
from flexibuff_envs.testing.reference import Log, play

__all__ = ["RecorderCheckError", "RecorderReport", "check_recorder"]


class RecorderCheckError(FlexibuffError, AssertionError):
    """The recorder did not record what the env did; the message lists every difference."""


@dataclass
class RecorderReport:
    """What `check_recorder` compared and what differed."""

    kind: str
    steps: int  # env steps (AEC: turns) played
    rows: int  # rows the buffer holds (its newest, when the ring wrapped)
    episodes: int  # whole episodes compared
    problems: list[str] = field(default_factory=list)


def check_recorder(
    env: Any,
    *,
    steps: int = 200,
    episodes: int = 4,
    seed: int = 0,
    num_steps: int | None = None,
    gamma: float = 0.99,
    strict: bool = True,
) -> RecorderReport:
    """Drive ``env`` through its recorder beside a plain reference loop; report any difference.

    The env must be deterministic under ``reset(seed=...)`` (the check plays it twice). The env is
    reset and stepped; don't pass one you are in the middle of using.

    Args:
        env: a Gymnasium env, a PettingZoo ``ParallelEnv`` or ``AECEnv`` (not yet recorded).
        steps: steps to play (Gymnasium and parallel envs); episodes reset as they end.
        episodes: whole episodes to play (AEC envs).
        seed: seeds the env and the random legal actions.
        num_steps: ring size of the buffer (default: all steps fit); smaller sizes check that
            wrap-around keeps the newest whole episodes.
        gamma: discount of ``G``.
        strict: raise `RecorderCheckError` listing the problems (else only report them).
    """
    kind = env_kind(env)
    if kind == "vector":
        raise NotAnEnvError(
            "check_recorder takes one env; a vector env's sub-envs are recorded like single "
            "envs, so check one of them (for example gymnasium.make(env_id))"
        )
    if kind is None:
        raise NotAnEnvError(
            f"check_recorder needs a gymnasium.Env or a PettingZoo ParallelEnv/AECEnv, got {type(env).__name__}"
        )
    from flexibuff_envs.recording import record

    problems: list[str] = []
    if kind == "gymnasium":
        log = play(env, seed=seed, steps=steps)
        recorder = record(env, num_steps=num_steps or max(steps, 1), gamma=gamma)
        replay = play(recorder, seed=seed, steps=steps, actions=log.actions)
        problems += _drop_in(
            log.returned, replay.returned, lambda: play(env, seed=seed, steps=steps, actions=log.actions).returned
        )
        expected, spans = _from_log(log, gamma), log.episodes
    elif kind == "parallel":
        reference, returned = play_parallel(env, seed=seed, steps=steps)
        recorder = record(env, num_steps=num_steps or max(steps, 1), gamma=gamma)
        problems += _drop_in(
            returned,
            replay_parallel(recorder, seed, reference.actions),
            lambda: replay_parallel(env, seed, reference.actions),
        )
        expected, spans = _from_expected(reference, gamma), reference.episodes
    else:
        reference = play_aec(env, seed=seed, episodes=episodes)
        recorder = record(env, num_steps=num_steps or max(reference.rewards.shape[1], 1), gamma=gamma)
        replay_aec(recorder, seed, episodes, reference.actions)
        expected, spans = _from_expected(reference, gamma), reference.episodes
        steps = len(reference.actions)
    buffer = recorder.buffer
    rows = len(buffer)
    problems += _compare_rows(buffer, expected, rows)
    whole = _compare_episodes(buffer, expected, spans, rows)
    problems += whole[1]
    report = RecorderReport(kind, steps, rows, whole[0], problems)
    if problems and strict:
        raise RecorderCheckError(f"the {kind} recorder differs from the reference loop:\n  " + "\n  ".join(problems))
    return report


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, all the way down (arrays: same dtype and elements)."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True  # a NaN reward is the same NaN reward
    return type(a) is type(b) and a == b


def _drop_in(bare: list, wrapped: list, again: Any) -> list[str]:
    """The wrapped env must return exactly what the bare env returned for the same seed and actions."""
    for call, (x, y) in enumerate(zip(bare, wrapped)):
        if not same(x, y):
            if not all(same(p, q) for p, q in zip(bare, again())):
                return [
                    (
                        "the bare env is not deterministic under reset(seed=...), so nothing was compared "
                        "with what the wrapped env returned"
                    )
                ]
            return [f"drop-in: call {call} (reset or step) of the wrapped env returned {y!r}, the bare env {x!r}"]
    if len(bare) != len(wrapped):
        return [f"drop-in: the wrapped env made {len(wrapped)} reset/step calls, the bare env {len(bare)}"]
    return []


def _from_log(log: Log, gamma: float) -> dict[str, np.ndarray | None]:
    """A Gymnasium log as the arrays of a batch of every step (no agent axis)."""
    heads, conts = np.array(log.discrete), np.array(log.continuous, dtype=np.float32)
    return {
        "obs": np.stack(log.obs),
        "obs_": np.stack(log.obs_),
        "discrete_actions": heads if heads.size else None,
        "continuous_actions": conts if conts.size else None,
        "individual_rewards": np.array(log.reward, dtype=np.float32),
        "terminated": np.array(log.terminated),
        "truncated": np.array(log.truncated),
        "action_mask": None if log.mask[0] is None else np.stack(log.mask),  # type: ignore[arg-type]
        "action_mask_": None if log.mask_[0] is None else np.stack(log.mask_),  # type: ignore[arg-type]
        "G": log.G(gamma),
    }


def _from_expected(expected: Expected, gamma: float) -> dict[str, np.ndarray | None]:
    """A PettingZoo reference as the arrays of a batch of every row (agent axis first)."""
    return {
        "active": expected.active,
        "obs": expected.obs,
        "obs_": expected.obs_,
        "discrete_actions": expected.discrete,
        "continuous_actions": expected.continuous,
        "individual_rewards": expected.rewards,
        "terminated": expected.terminated,
        "truncated": expected.truncated,
        "action_mask": expected.mask,
        "action_mask_": expected.mask_,
        "G": expected.G(gamma),
    }


def _recorded(batch: Any, name: str) -> np.ndarray | None:
    value = getattr(batch, name)
    return np.concatenate(value, axis=-1) if isinstance(value, list) else value


def _first_difference(name: str, got: np.ndarray, want: np.ndarray, first_row: int, multi: bool) -> str | None:
    """Where ``got`` first differs from ``want`` (rows on axis 0, or 1 after the agents), or None."""
    if got.shape != want.shape:
        return f"{name}: recorded shape {got.shape}, expected {want.shape}"
    if got.dtype.kind == "f" or want.dtype.kind == "f":
        equal = np.isclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    else:
        equal = got == want
    if equal.all():
        return None
    where = tuple(int(i) for i in np.argwhere(~equal)[0][: 2 if multi else 1])
    at = f"step {first_row + where[-1]}" + (f", agent {where[0]}" if multi else "")
    return f"{name} differs at {at}: recorded {got[where]!r}, expected {want[where]!r}"


def _compare_rows(buffer: Any, expected: dict[str, np.ndarray | None], rows: int) -> list[str]:
    """The buffer's live rows, oldest first, against the newest ``rows`` rows of the reference."""
    total = expected["individual_rewards"].shape[-1]  # type: ignore[union-attr]
    if rows > total:
        return [f"the buffer holds {rows} rows but only {total} steps were taken"]
    if rows == 0:
        return [] if total == 0 else [f"the buffer holds no rows after {total} steps"]
    batch = buffer.sample_transitions(idx=live_rows(buffer._index.read()))
    multi = buffer.spec.n_agents > 1
    problems = []
    for name, want in expected.items():
        got = _recorded(batch, name)
        if want is None or got is None:
            if (want is None) != (got is None):
                problems.append(
                    f"{name}: {'recorded' if got is not None else 'not recorded'}, but the "
                    f"reference {'has' if want is not None else 'has no'} such field"
                )
            continue
        tail = want[:, total - rows :] if multi else want[total - rows :]
        problem = _first_difference(name, np.asarray(got), tail, total - rows, multi)
        if problem:
            problems.append(problem)
    return problems


def _compare_episodes(
    buffer: Any, expected: dict[str, np.ndarray | None], spans: list[tuple[int, int]], rows: int
) -> tuple[int, list[str]]:
    """Every ended episode still wholly in the buffer comes back whole, in order, and no other."""
    total = expected["individual_rewards"].shape[-1]  # type: ignore[union-attr]
    ends = np.asarray(expected["terminated"]) | np.asarray(expected["truncated"])
    ended = [(s, e) for s, e in spans if e > s and ends[..., e - 1].any() and s >= total - rows]
    got = list(buffer.episodes())
    if [len(b) for b in got] != [e - s for s, e in ended]:
        lengths = ([len(b) for b in got], [e - s for s, e in ended])
        return len(got), [f"sample_episodes gave lengths {lengths[0]}, expected the whole episodes {lengths[1]}"]
    obs = np.asarray(expected["obs"])
    for n, (batch, (start, end)) in enumerate(zip(got, ended)):
        want = obs[:, start:end] if buffer.spec.n_agents > 1 else obs[start:end]
        if not np.array_equal(batch.obs, want):
            return len(got), [f"episode {n} (steps {start}-{end}) is not the episode that was played"]
    return len(got), []
