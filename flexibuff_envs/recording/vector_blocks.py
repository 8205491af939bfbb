"""The arithmetic of a block of vector steps: from the block's ``[k, n]`` flags, which sub-env
steps are transitions, where episodes start and end, and what their next values are (pure
functions of arrays, each a fixed number of numpy operations); and `publish`, which brings the
lanes up to date with the blocks written. `BatchRecorder` applies them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gymnasium.vector import AutoresetMode

from flexibuff_envs.index.lanes import Episode, Lane
from flexibuff_envs.index.origins import Origin


@dataclass
class Transitions:
    """Which steps of a block are what, each ``[k, n]``, and the lanes' state after it."""

    steps: np.ndarray  # the sub-env step is a transition
    resets: np.ndarray  # an episode starts after the step (after its transition, if any)
    running: np.ndarray  # ``[n]``: an episode runs in the lane after the block
    resetting: np.ndarray  # ``[n]``: NEXT_STEP, the lane's next step only resets


def transitions(mode: AutoresetMode, done: np.ndarray, running: np.ndarray, resetting: np.ndarray) -> Transitions:
    """From a block's ``done`` flags ``[k, n]``, under autoreset ``mode``, with ``running`` and
    ``resetting`` as the lanes stood before it."""
    before = np.zeros_like(done)  # done at the step before
    before[1:] = done[:-1]
    if mode == AutoresetMode.NEXT_STEP:  # the step after a done only resets
        before[0] = resetting
        alive = np.logical_or.accumulate(before, axis=0) | running
        return Transitions(alive & ~before, before, alive[-1] & ~done[-1], done[-1].copy())
    if mode == AutoresetMode.SAME_STEP:  # a finished sub-env resets within its step
        alive = np.logical_or.accumulate(before, axis=0) | running
        return Transitions(alive, done, alive[-1] | done[-1], resetting)
    stopped = np.logical_or.accumulate(before, axis=0)  # DISABLED: finished ones wait for reset()
    return Transitions(running & ~stopped, np.zeros_like(done), running & ~(stopped[-1] | done[-1]), resetting)


def ends_of(held: np.ndarray, final: np.ndarray | None, has_final: np.ndarray, finished: np.ndarray) -> np.ndarray:
    """The next values of the transitions ``finished`` (flat indices into ``[k, n]``) that end an
    episode: what their lane held after the step (``held[j + 1]``), or, for the steps
    ``has_final`` marks (SAME_STEP), their final values."""
    n = held.shape[1]
    values = held[1:].reshape(-1, held.shape[-1]).take(finished, axis=0)
    if final is not None and has_final.any():
        own = np.flatnonzero(has_final[finished // n])
        values[own] = final.reshape(-1, held.shape[-1]).take(finished[own], axis=0)
    return values


def episode_spans(
    finished: np.ndarray, starts: np.ndarray, positions: np.ndarray, start: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The episodes whose last transitions are ``finished`` (flat indices, each lane's in step
    order): their step, lane, first and end positions, from each step's latest episode start
    ``starts`` and next position ``positions`` (``[k, n]``) and the lanes' ``start`` before it."""
    at, lanes = np.divmod(finished, positions.shape[1])
    before = np.where(at > 0, starts[np.maximum(at - 1, 0), lanes], -1)
    return at, lanes, np.where(before >= 0, before, start[lanes]), positions[at, lanes]


def publish(
    lanes: list[Lane],
    ended: tuple[np.ndarray, ...] | None,
    pos: np.ndarray,
    start: np.ndarray,
    running: np.ndarray,
    origin_at: Callable[[int, int], Origin],
) -> None:
    """Bring ``lanes`` up to date: the episodes ``ended`` (arrays of their lane, first and end
    positions and origins, in the order they ended; or None) end there, then each lane is
    written up to ``pos``, running the episode that began at ``start`` where ``running``, of
    the origin ``origin_at(lane, start)``."""
    if ended is not None:
        which, firsts, ends, origins = ended
        order = np.argsort(which, kind="stable")  # lane by lane, each in time order
        bounds = np.searchsorted(which[order], np.arange(len(lanes) + 1))
        first, last, origins = firsts[order], ends[order], origins[order]
        for i in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
            lane, lo, hi = lanes[i], bounds[i], bounds[i + 1]
            _running_episode(lane, int(first[lo]))  # the first may be the episode running there
            lane.running.end = int(last[lo])  # type: ignore[union-attr]
            lane.origin = origins[lo].item()
            lane.end()
            lane.ended.extend(first[lo + 1 : hi], last[lo + 1 : hi], True, origins[lo + 1 : hi])
    for i, (lane, at, begun, runs) in enumerate(zip(lanes, pos.tolist(), start.tolist(), running.tolist())):
        lane.written = at
        lane.dirty = max(lane.dirty, at)
        if runs:
            if _running_episode(lane, begun):
                lane.origin = origin_at(i, begun)
            lane.running.end = at  # type: ignore[union-attr]


def _running_episode(lane: Lane, start: int) -> bool:
    """``lane`` runs the episode that began at ``start``: whether it is a new one."""
    if lane.running is not None and lane.running.start == start:
        return False
    lane.running = Episode(start, start)
    lane.agents.begin(start)
    return True
