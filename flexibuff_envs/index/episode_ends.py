"""What an episode's end writes: ``G`` (and GAE where values were annotated) over each agent's
own rows, for one episode or many single-agent ones at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flexibuff_envs.index.returns import episode_gae, episode_returns, gae, segmented_scan

if TYPE_CHECKING:
    from flexibuff_envs.index.lanes import Episode, Lane
    from flexibuff_envs.storage import Storage


def write_episode_returns(
    storage: Storage,
    lane: Lane,
    episode: Episode,
    bootstrap: np.ndarray | float | None,
    gamma: float,
    lam: float,
    only: int | None = None,
) -> None:
    """``G`` (and GAE) of the agents still in ``episode`` of ``lane`` (or of agent ``only``),
    each over its own rows: those since it joined where it is active, discounted transition by
    transition; ``bootstrap`` is V after each agent's last step (None: 0)."""
    first = lane.offset + episode.start % lane.capacity
    steps = episode.end - episode.start
    # an episode that does not wrap is a slice: no index array on the per-episode path
    rows: slice | np.ndarray = (
        slice(first, first + steps) if first + steps <= lane.offset + lane.capacity else lane.rows(episode)
    )
    n_agents = storage.spec.n_agents
    boot = None if bootstrap is None else np.broadcast_to(np.asarray(bootstrap, dtype=np.float64), (n_agents,))
    if n_agents == 1:
        _write_returns(storage, slice(None), rows, boot, gamma, lam)
        return
    agents = [only] if only is not None else lane.agents.running()
    if not agents:
        return
    begun = [lane.agents.first(agent, episode.start) for agent in agents]
    active = storage.arrays["active"][:, rows]
    if len(agents) == n_agents and max(begun) == episode.start and active.all():
        _write_returns(storage, slice(None), rows, boot, gamma, lam)  # every agent acted at every step: one pass
        return
    all_rows = None
    for agent, start in zip(agents, begun):
        mine = active[agent, start - episode.start :]
        skipped = steps - mine.size
        acted = int(np.count_nonzero(mine))
        boot_ = None if boot is None else boot[agent : agent + 1]
        if isinstance(rows, slice) and mine[:acted].all():  # its rows are one run (AEC turns): a slice
            own: slice | np.ndarray = slice(first + skipped, first + skipped + acted)
        else:
            all_rows = lane.rows(episode) if all_rows is None else all_rows
            own = all_rows[skipped:][mine]
        if acted:
            _write_returns(storage, slice(agent, agent + 1), own, boot_, gamma, lam)


def write_run_returns(
    storage: Storage, rows: np.ndarray, last: np.ndarray, bootstrap: np.ndarray, gamma: float, lam: float
) -> None:
    """``G`` (and GAE where values were annotated) of many single-agent episodes in one pass:
    ``rows`` hold them back to back, ``last`` is the position there of each one's last row
    and ``bootstrap`` the value after it."""
    arrays = storage.arrays
    rewards = arrays["individual_rewards"][0].take(rows).astype(np.float64)
    ends = np.zeros(rows.size, dtype=bool)
    ends[last] = True
    if "values" in arrays:
        boots = np.zeros(rows.size)
        boots[last] = bootstrap
        advantages, value_targets = gae(rewards, arrays["values"][0].take(rows), ends, gamma, lam, boots)
        storage.ensure("advantages")[0, rows] = advantages
        storage.ensure("returns")[0, rows] = value_targets
    rewards[last] += gamma * bootstrap
    arrays["G"][0, rows] = segmented_scan(rewards, gamma, ends)


def _write_returns(
    storage: Storage, agents: slice, rows: slice | np.ndarray, bootstrap: np.ndarray | None, gamma: float, lam: float
) -> None:
    """``G`` (and GAE where values were annotated) of ``agents`` over ``rows``, one transition
    after the other."""
    arrays = storage.arrays
    if "individual_rewards" in arrays:
        rewards = arrays["individual_rewards"][agents, rows]
    elif "global_rewards" in arrays:  # a hand-made buffer holding the team reward only
        team = arrays["global_rewards"][rows]
        rewards = np.broadcast_to(team, (storage.spec.n_agents, team.shape[0]))[agents]
    else:
        return
    arrays["G"][agents, rows] = episode_returns(rewards, gamma, bootstrap)
    if "values" in arrays:
        advantages, value_targets = episode_gae(rewards, arrays["values"][agents, rows], gamma, lam, bootstrap)
        storage.ensure("advantages")[agents, rows] = advantages
        storage.ensure("returns")[agents, rows] = value_targets
