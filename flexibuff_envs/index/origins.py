"""Where each episode came from: its origin, one fixed record per episode, kept beside its
positions in a lane (`ended.Ended`), in a buffer file's header and in an episode log's
``origins.fblog`` (`log.origins`).

An origin says which recording session began the episode (`FlexibleBuffer.sessions`: the policy
acting, the env), in which env instance (a random token per recorder) and which of its lanes (a
vector env's sub-env; 0 otherwise), as that lane's how-manyth episode (``ordinal``), when
(wall-clock seconds), and how its env was reset: with a seed (``SEEDED``, the seed kept), or
without one right after the lane's previous episode, every step of which was recorded
(``FOLLOWS``: replaying the lane's episodes ``ordinal - 1``, ``ordinal - 2``, ... back to a seeded
one reproduces it). Without ``KNOWN``, nothing is known (an episode filled by hand without
`FlexibleBuffer.begin_episode`, or from a log written before origins were kept).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

#: an origin's fields, in a record's order, and their types
FIELDS = {
    "seed": "<u8",
    "started": "<f8",
    "env": "<u4",
    "ordinal": "<u4",
    "session": "<i4",
    "lane": "<i4",
    "flags": "<u4",
}
ORIGIN = np.dtype(list(FIELDS.items()))
KNOWN, SEEDED, FOLLOWS = 1, 2, 4
#: the origin of an episode nothing is known of
UNKNOWN = (0, 0.0, 0, 0, -1, -1, 0)
Origin = tuple[int, float, int, int, int, int, int]


def origin(session: int, env: int, lane: int, ordinal: int, seed: Any = None, *, follows: bool = False) -> Origin:
    """The origin of the ``ordinal``-th episode of lane ``lane`` of the env ``env``, begun now
    by ``session`` after a reset with ``seed`` (an int in ``[0, 2**64)``; any other: none kept)
    or, ``follows``, without one right after the lane's episode before."""
    seeded = isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and 0 <= seed < 2**64
    flags = KNOWN | (SEEDED if seeded else FOLLOWS if follows and seed is None else 0)
    return int(seed) if seeded else 0, time.time(), env, ordinal % 2**32, session, lane, flags


def following(before: Origin, session: int, follows: bool = True) -> Origin:
    """The origin of the episode an env lane began by resetting itself (a vector env's sub-env)
    right after the episode of origin ``before``, recorded by ``session``; ``follows``: replaying
    that one reproduces it (its sub-env is an env of its own)."""
    if not before[6] & KNOWN:
        return UNKNOWN
    flags = KNOWN | (FOLLOWS if follows else 0)
    return 0, time.time(), before[2], (before[3] + 1) % 2**32, session, before[5], flags


def table(records: np.ndarray) -> dict[str, np.ndarray]:
    """``records`` (of `ORIGIN`) as columns a user reads: ``seed`` (int64, -1 where the env was
    not reset with one a signed int64 holds), ``follows`` (reset without a seed right after the
    lane's previous episode), ``started`` (seconds since the epoch, NaN where unknown),
    ``session`` and ``lane`` (-1 where unknown), ``env`` and ``ordinal`` (the env instance's
    token, 0 where unknown, and the episode's number in its lane)."""
    flags = records["flags"]
    known, seeded = (flags & KNOWN) > 0, (flags & SEEDED) > 0
    seed = np.full(records.size, -1, dtype=np.int64)
    fits = seeded & (records["seed"] < 2**63)
    seed[fits] = records["seed"][fits].astype(np.int64)
    return {
        "seed": seed,
        "follows": (flags & FOLLOWS) > 0,
        "started": np.where(known, records["started"], np.nan),
        "session": np.where(known, records["session"], -1).astype(np.int32),
        "env": np.where(known, records["env"], 0).astype(np.uint32),
        "lane": np.where(known, records["lane"], -1).astype(np.int32),
        "ordinal": np.where(known, records["ordinal"], 0).astype(np.uint32),
    }


def checked(records: np.ndarray, sessions: int) -> np.ndarray:
    """``records`` as read from a file, each that is not a plausible origin (flags outside those
    known, a session this file does not name, a negative lane, a start that is not a finite
    time) read as unknown: an origin is information, never a reason to refuse the data."""
    flags = records["flags"]
    good = (
        ((flags & KNOWN) > 0)
        & (flags < 2 * FOLLOWS)
        & ((flags & (SEEDED | FOLLOWS)) != (SEEDED | FOLLOWS))
        & (records["session"] >= -1)
        & (records["session"] < sessions)
        & (records["lane"] >= 0)
        & np.isfinite(records["started"])
    )
    if good.all():
        return records
    out = records.copy()
    out[~good] = UNKNOWN
    return out
