"""The origins (`index.origins`) of the episodes a recorder's env lanes begin: each reset's seed,
or whether it follows the lane's episode before, every step of which was recorded; the episodes
a vector env's sub-env begins by resetting itself follow the one before."""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from flexibuff_envs.index.origins import ORIGIN, UNKNOWN, Origin, following, origin


def lane_seeds(seed: Any, n: int) -> list[Any]:
    """The seed each of a vector env's ``n`` sub-envs is reset with by ``reset(seed=seed)``, as
    Gymnasium's vector envs give them: ``seed + i`` for an int, a list's own, else None."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(n)]
    if isinstance(seed, (list, tuple)) and len(seed) == n:
        return list(seed)
    return [None] * n


class LaneOrigins:
    """The origin of the newest episode of each of ``n`` env lanes, and the position it began at
    (a vector recorder's lanes only tell where an episode began)."""

    def __init__(self, n: int) -> None:
        self.env = secrets.randbits(32)  # this env instance's token: its lanes' episodes chain
        self.session = -1  # the recorder's, as it stands (`Sourced`)
        self.newest: list[Origin] = [UNKNOWN] * n
        self.start = np.full(n, -1, dtype=np.int64)
        self.begun = np.zeros(n, dtype=np.int64)  # episodes begun in each lane
        self.chained = np.zeros(n, dtype=bool)  # each step since the lane's last reset was recorded
        # each lane an env of its own, reset with its own seed (not a vector env of one piece, whose
        # sub-envs share a generator): else no episode can be replayed lane by lane
        self.apart = True

    def reset(self, lane: int, seed: Any, position: int = -1) -> Origin:
        """Lane ``lane`` was reset by the user with ``seed``; its episode begins at ``position``."""
        apart, ordinal = self.apart, int(self.begun[lane])
        made = origin(
            self.session, self.env, lane, ordinal, seed if apart else None, follows=apart and bool(self.chained[lane])
        )
        self.begun[lane] += 1
        self.chained[lane] = True
        self.newest[lane], self.start[lane] = made, position
        return made

    def reset_lanes(self, lanes: np.ndarray, seed: Any, positions: np.ndarray) -> None:
        """The vector env reset sub-envs ``lanes`` with ``seed`` (its own: `lane_seeds`); each
        one's episode begins at its ``positions``."""
        seeds = lane_seeds(seed, len(self.newest))
        for i in lanes.tolist():
            self.reset(i, seeds[i], int(positions[i]))

    def broken(self, lanes: Any = slice(None)) -> None:
        """``lanes`` moved in a step that was not recorded, or reset without an episode the
        recording holds: their next episode follows nothing."""
        self.chained[lanes] = False

    def unrecorded(self, steps: np.ndarray, resets: np.ndarray | None) -> None:
        """A block of vector steps (``[k, n]``: ``steps`` recorded, ``resets`` the steps that only
        reset a sub-env, None where none does): a sub-env that moved in a step not recorded (after
        `truncate`) breaks its chain."""
        moved = ~steps if resets is None else ~steps & ~resets
        self.broken(moved.any(axis=0))

    def skipped(self, lanes: np.ndarray) -> None:
        """``lanes`` began an episode of no step by resetting themselves, which a reset by the user
        now replaces: it counts, and breaks their chains."""
        self.begun[lanes] += 1
        self.chained[lanes] = False

    def at(self, lane: int, start: int) -> Origin:
        """The origin of lane ``lane``'s episode that began at ``start`` (asked in time order):
        the newest, or one the sub-env began by resetting itself after it."""
        if start != self.start[lane]:
            self.newest[lane] = following(self.newest[lane], self.session, self.apart and bool(self.chained[lane]))
            self.start[lane] = start
            self.begun[lane] += 1
            self.chained[lane] = True
        return self.newest[lane]

    def of(self, lanes: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """`at` for each of ``lanes`` and ``starts`` (each lane's in time order), as records."""
        return np.array([self.at(i, s) for i, s in zip(lanes.tolist(), starts.tolist())], dtype=ORIGIN)
