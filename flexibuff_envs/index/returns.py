"""Discounted returns and GAE on numpy arrays, with episode cuts and bootstrapping.

Everything here is one reverse linear recurrence, ``x_t = b_t + c_t * x_{t+1}`` (``c_t >= 0``),
solved without a Python loop over steps, three ways:
- `episode_returns` / `episode_gae`: one episode per row, as a reversed cumulative sum scaled by
  powers of gamma (the buffer's path, at every episode end);
- `segmented_scan` / `gae`: a whole rollout of back-to-back episodes, in blocks of 64 steps
  (recursive doubling for short ones);
- `reverse_scan`: recursive doubling, for any per-step coefficients (the general fallback).

NaN and infinite inputs give what the plain loop gives: they reach every earlier step of their own
episode and nothing across a cut (where ``c_t = 0``, the loop adds nothing, not ``0 * x``). The
fast paths run on the finite values; `_carry_non_finite` then writes where the others reach.
"""

from __future__ import annotations

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError


def check_gamma(gamma: float, name: str = "gamma") -> float:
    """Return ``gamma`` as a float, or raise InvalidArgumentError unless ``0 <= gamma <= 1``."""
    value = float(gamma)
    if not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(f"{name} must be within [0, 1], got {gamma!r}")
    return value


def _carry_non_finite(x: np.ndarray, cut: np.ndarray, out: np.ndarray) -> None:
    """Write NaN / +-inf into ``out`` wherever the plain loop carries a non-finite ``x`` back to.

    Args:
        x, cut: ``[T]``; ``cut[t]``: nothing links step ``t`` to ``t + 1`` (the last step must cut).
        out: ``[T]`` solution of the recurrence with the non-finite ``x`` taken as 0.
    """
    steps = np.arange(x.size)
    ends = np.flatnonzero(cut)
    segment_end = ends[np.searchsorted(ends, steps)]

    def reached(bad: np.ndarray) -> np.ndarray:  # is there a bad step in [t, end of t's segment]?
        positions = np.flatnonzero(bad)
        if positions.size == 0:
            return np.zeros(x.size, dtype=bool)
        following = np.searchsorted(positions, steps)
        return (following < positions.size) & (positions[following.clip(max=positions.size - 1)] <= segment_end)

    plus, minus = reached(x == np.inf), reached(x == -np.inf)
    out[plus] = np.inf
    out[minus] = -np.inf
    out[reached(np.isnan(x)) | (plus & minus)] = np.nan


def reverse_scan(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Solve ``x_t = b_t + c_t * x_{t+1}`` along the last axis, with ``x`` past the end zero.

    Args:
        b: ``[..., T]`` the constant terms.
        c: ``[..., T]`` the coefficients linking each step to the next (0 cuts the chain).

    Returns:
        ``[..., T]`` float64 solution.
    """
    x = np.array(b, dtype=np.float64)
    a = np.array(np.broadcast_to(c, x.shape), dtype=np.float64)
    finite = np.isfinite(x)
    if not finite.all():
        cut = a == 0
        cut[..., -1:] = True
        raw = x.copy()
        x[~finite] = 0.0
        solved = reverse_scan(x, a)
        _carry_non_finite(raw.reshape(-1), cut.reshape(-1), solved.reshape(-1))
        return solved
    steps = x.shape[-1]
    shift = 1
    while shift < steps:
        x[..., :-shift] += a[..., :-shift] * x[..., shift:]
        a[..., :-shift] *= a[..., shift:]
        a[..., -shift:] = 0.0
        shift *= 2
        if not a.any():
            break
    return x


_BLOCK = 64
#: below this many steps, `reverse_scan`'s recursive doubling beats the blocked scan's fixed cost
#: (about 130 us, whatever the size)
_DOUBLING = 8192
#: scratch arrays reused across calls: fresh ~1 MB temporaries cost more in page faults than in math
_WORK: dict[str, np.ndarray] = {}


def _scratch(name: str, size: int) -> np.ndarray:
    array = _WORK.get(name)
    if array is None or array.size < size:
        array = _WORK[name] = np.empty(size)
    return array[:size]


def segmented_scan(x: np.ndarray, c: float, ends: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Solve ``y_t = x_t + c * y_{t+1}`` along a 1-D array, the chain cut after every ``ends_t``.

    The array is seen as blocks of 64 steps, ``[64 offsets, n_blocks]``; the recurrence runs
    backwards over the 64 offsets, each step vectorized across all blocks, while also tracking how
    much of a block's end reaches each step. The carries between blocks are one `reverse_scan`
    over ``n_blocks`` values, and one multiply-add applies them. Not thread-safe (shared scratch).

    ``out``: ``[T]`` array to write into (e.g. buffer storage); saves allocating the result.
    Up to a few thousand steps, `reverse_scan` solves it instead (about 20 us for a few dozen).
    """
    if x.size <= _DOUBLING:
        solved = reverse_scan(x, np.where(ends, 0.0, c))
        if out is None:
            return solved
        out[...] = solved
        return out
    if not np.isfinite(x).all():
        cut = np.array(ends, dtype=bool) | (c == 0)
        cut[-1:] = True
        out = segmented_scan(np.where(np.isfinite(x), x, 0.0), c, ends, out)
        _carry_non_finite(x, cut, out)
        return out
    n = x.size
    blocks = -(-n // _BLOCK)
    whole, rest = divmod(n, _BLOCK)

    def work(name: str) -> np.ndarray:  # contiguous [offset, block] scratch
        return _scratch(name, blocks * _BLOCK).reshape(_BLOCK, blocks)

    X, C, Y, reach = work("x"), work("links"), work("y"), work("reach")
    X.T[:whole] = x[: whole * _BLOCK].reshape(whole, _BLOCK)  # X[j, b] = x[b * 64 + j]
    if rest:
        X.T[whole, :rest] = x[whole * _BLOCK :]
        X.T[whole, rest:] = 0.0
    C.fill(c)  # c where step t continues into t+1; 0 at a cut and past the end
    cuts = np.concatenate([np.flatnonzero(ends), np.arange(n, blocks * _BLOCK)])
    C[cuts % _BLOCK, cuts // _BLOCK] = 0.0
    Y[-1] = X[-1]
    reach[-1] = C[-1]  # product of links from a step to its block's end
    for j in range(_BLOCK - 2, -1, -1):
        np.multiply(C[j], Y[j + 1], out=Y[j])
        Y[j] += X[j]
        np.multiply(C[j], reach[j + 1], out=reach[j])
    starts = reverse_scan(Y[0], reach[0])  # each block's first step, with all later blocks in
    following = np.zeros(blocks)
    following[:-1] = starts[1:]
    reach *= following
    Y += reach
    if out is None:
        out = np.empty(n)
    out[: whole * _BLOCK].reshape(whole, _BLOCK)[...] = Y.T[:whole]
    if rest:
        out[whole * _BLOCK :] = Y.T[whole, :rest]
    return out


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    ends: np.ndarray,
    gamma: float,
    lam: float,
    bootstrap: np.ndarray | float = 0.0,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE(lambda) over a whole rollout of back-to-back episodes, in a fixed number of numpy passes.

    Args:
        rewards, values: ``[T]`` in time order.
        ends: ``[T]`` bool, True at each episode's last step (and at a rollout cut).
        bootstrap: ``[T]`` (or scalar) V after each end: 0 after a termination, ``V(obs_)`` after
            a truncation or cut; ignored where ``ends`` is False.
        out: ``(advantages, returns)`` arrays ``[T]`` to write into, e.g. a buffer's storage.

    Returns:
        (advantages, returns = advantages + values), ``[T]`` float64.
    """
    gamma, lam = check_gamma(gamma), check_gamma(lam, "gae_lambda")
    v = np.asarray(values)  # no float64 copy: the mixed-dtype ops below convert on the fly
    delta = _scratch("delta", v.size)  # r_t + gamma V_{t+1} - V_t, built in place
    delta[:-1] = v[1:]
    delta[-1:] = 0.0
    cut = np.asarray(ends, dtype=bool)
    delta[cut] = np.asarray(bootstrap)[cut] if np.ndim(bootstrap) else bootstrap
    delta *= gamma
    delta += rewards
    delta -= v
    advantages = segmented_scan(delta, gamma * lam, cut, out=None if out is None else out[0])
    return advantages, np.add(advantages, v, out=None if out is None else out[1])


def discounted_returns(
    rewards: np.ndarray,
    gamma: float,
    *,
    ends: np.ndarray | None = None,
    bootstrap: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Discounted return-to-go ``G_t = r_t + gamma * G_{t+1}`` along the last axis.

    Args:
        rewards: ``[..., T]`` rewards in time order.
        gamma: discount in ``[0, 1]``.
        ends: ``[..., T]`` bool, True at each episode's last step (the chain is cut after it).
            The last step always ends. None: one episode.
        bootstrap: value of the state after each step, added as ``gamma * bootstrap`` at ends
            only (0 after a termination; ``V(obs_)`` after a truncation or a rollout cut).

    Returns:
        ``[..., T]`` float64 returns.

    >>> discounted_returns(np.array([1.0, 1.0, 1.0]), 0.5).tolist()
    [1.75, 1.5, 1.0]
    """
    gamma = check_gamma(gamma)
    r = np.asarray(rewards, dtype=np.float64)
    cut = np.zeros(r.shape, dtype=bool) if ends is None else np.array(ends, dtype=bool)
    cut[..., -1:] = True
    b = r + gamma * np.where(cut, bootstrap, 0.0)
    return reverse_scan(b, np.where(cut, 0.0, gamma))


_POWERS: dict[float, np.ndarray] = {}
#: below this, gamma**t loses precision (denormals); longer episodes take the scan instead
_TINY = 1e-250


def _powers(gamma: float, n: int) -> np.ndarray:
    """``gamma ** arange(n)`` from a cache that grows by doubling."""
    cached = _POWERS.get(gamma)
    if cached is None or cached.size < n:
        cached = gamma ** np.arange(max(n, 2 * (0 if cached is None else cached.size), 64), dtype=np.float64)
        _POWERS[gamma] = cached
    return cached[:n]


def episode_returns(rewards: np.ndarray, gamma: float, bootstrap: np.ndarray | float | None = None) -> np.ndarray:
    """`discounted_returns` of one episode per row of ``rewards [..., L]``, in a few numpy ops.

    ``G_t = gamma**-t * sum_{k>=t} gamma**k r_k``: one reversed cumulative sum instead of a scan.
    Episodes so long that ``gamma**L`` underflows fall back to `discounted_returns`.
    """
    steps = rewards.shape[-1]
    powers = _powers(gamma, steps + 1)
    if steps == 0 or powers[-1] < _TINY:
        boot = np.asarray(0.0 if bootstrap is None else bootstrap, dtype=np.float64)
        return discounted_returns(rewards, gamma, bootstrap=boot[..., None] if boot.ndim else boot)
    finite = np.isfinite(rewards)
    if not finite.all():
        cut = np.zeros(rewards.shape, dtype=bool)
        cut[..., -1] = True
        solved = np.array(episode_returns(np.where(finite, rewards, 0.0), gamma, bootstrap), dtype=np.float64)
        _carry_non_finite(
            np.ascontiguousarray(rewards, dtype=np.float64).reshape(-1), cut.reshape(-1), solved.reshape(-1)
        )
        return solved
    suffix = (rewards[..., ::-1] * powers[steps - 1 :: -1]).cumsum(axis=-1)[..., ::-1]
    if bootstrap is not None:
        suffix += np.multiply.outer(bootstrap, powers[steps:])
    return suffix / powers[:steps]


def episode_gae(
    rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float, bootstrap: np.ndarray | float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """GAE(lambda) of one episode per row of ``rewards``/``values`` ``[..., L]``.

    ``delta_t = r_t + gamma V_{t+1} - V_t``, with ``V_L = bootstrap`` (0 after a termination),
    and ``A_t = delta_t + gamma lam A_{t+1}``.

    Returns:
        (advantages, returns = advantages + values), both ``[..., L]`` float64.
    """
    v = np.asarray(values, dtype=np.float64)
    following = np.empty_like(v)
    following[..., :-1] = v[..., 1:]
    following[..., -1:] = 0.0 if bootstrap is None else np.reshape(bootstrap, (-1, 1))
    delta = rewards + gamma * following - v
    advantages = episode_returns(delta, gamma * check_gamma(lam, "gae_lambda"))
    return advantages, advantages + v
