"""Which rows to gather: the live rows of a set of lanes, drawn uniformly or by weight."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flexibuff_envs.episodes import Lane


def live_rows(lanes: Sequence[Lane]) -> np.ndarray:
    """Every live row, lane by lane, each lane oldest first."""
    return np.concatenate([lane.offset + np.arange(lane.live_start, lane.written) % lane.capacity
                           for lane in lanes])


def uniform_rows(lanes: Sequence[Lane], rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` live rows drawn uniformly with replacement over all lanes."""
    if len(lanes) == 1:
        lane = lanes[0]
        first = lane.live_start % lane.capacity
        if first + lane.size <= lane.capacity:  # the live rows do not wrap: one draw
            return rng.integers(lane.offset + first, lane.offset + first + lane.size, n)
        return lane.offset + (first + rng.integers(0, lane.size, n)) % lane.capacity
    sizes = np.array([lane.size for lane in lanes])
    firsts = np.cumsum(sizes) - sizes
    k = rng.integers(0, sizes.sum(), n)
    which = np.searchsorted(firsts, k, side="right") - 1
    starts = np.array([lane.live_start for lane in lanes])
    offsets = np.array([lane.offset for lane in lanes])
    capacity = lanes[0].capacity
    return offsets[which] + (starts[which] + k - firsts[which]) % capacity


def weighted_rows(lanes: Sequence[Lane], weights: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` live rows drawn with replacement in proportion to ``weights`` (per buffer row)."""
    live = live_rows(lanes)
    w = weights[live].astype(np.float64)
    total = w.sum()
    if not np.isfinite(total) or total <= 0 or (w < 0).any():
        raise ValueError("weighted sampling needs finite, non-negative memory_weights with a "
                         f"positive sum; the live rows sum to {total!r}")
    cdf = np.cumsum(w)
    return live[np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right").clip(max=live.size - 1)]


def sequence_rows(lanes: Sequence[Lane], rng: np.random.Generator, n: int,
                  seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of ``seq_len`` steps, each inside one episode, starting at uniform live rows.

    Returns:
        rows ``[n, seq_len]`` (past an episode's end: its last row again) and valid ``[n, seq_len]``.
    """
    starts = uniform_rows(lanes, rng, n)
    capacity = lanes[0].capacity
    rows = np.empty((n, seq_len), dtype=np.int64)
    valid = np.empty((n, seq_len), dtype=bool)
    which = starts // capacity
    steps = np.arange(seq_len)
    for lane_index in np.unique(which):
        lane = lanes[lane_index]
        pick = which == lane_index
        local = starts[pick] - lane.offset
        # the absolute position of each start: live positions are [live_start, written)
        position = lane.live_start + (local - lane.live_start) % capacity
        episode_starts, episode_ends = lane.bounds()
        end = episode_ends[np.searchsorted(episode_starts, position, side="right") - 1]
        window = position[:, None] + steps
        valid[pick] = window < end[:, None]
        rows[pick] = lane.offset + np.minimum(window, end[:, None] - 1) % capacity
    return rows, valid
