"""Plain reference loops over bare PettingZoo envs: what the recorders should hold, by hand.

Each returns per-agent arrays ``[n_agents, rows]`` (obs ``[n_agents, rows, obs_size]``) laid out as
SPEC section 5 says, built with dicts and lists only, plus the actions to replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from flexibuff_envs.testing.reference import flat_obs, plain_returns


@dataclass
class Expected:
    actions: list[Any]  # parallel: one dict per step; AEC: one action per env.step call
    obs: np.ndarray
    obs_: np.ndarray
    discrete: np.ndarray | None
    continuous: np.ndarray | None
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    active: np.ndarray
    mask: np.ndarray | None
    mask_: np.ndarray | None
    episodes: list[tuple[int, int]]  # row ranges
    ends: dict[tuple[int, int], int]  # (episode, agent) -> rows that agent filled

    def G(self, gamma: float) -> np.ndarray:
        out = np.full(self.rewards.shape, np.nan)
        for start, end in self.episodes:
            for a in range(self.rewards.shape[0]):
                # the agent's own transitions, one after the other
                rows = [r for r in range(start, end) if self.active[a, r]]
                # an agent's G exists once its own episode ended (terminated or truncated)
                if rows and (self.terminated[a, rows[-1]] or self.truncated[a, rows[-1]]):
                    out[a, rows] = plain_returns([float(self.rewards[a, r]) for r in rows], gamma)
        return out


class Table:
    """Rows of per-agent values, filled by (agent, row)."""

    def __init__(self, env: Any) -> None:
        self.ids = list(env.possible_agents)
        self.obs_spaces = {a: env.observation_space(a) for a in self.ids}
        self.act_spaces = {a: env.action_space(a) for a in self.ids}
        self.obs_size = max(flat_obs(s, s.sample()).size for s in self.obs_spaces.values())
        self.cards = [_cards(s) for s in self.act_spaces.values()]
        self.padded = tuple(max(c) for c in zip(*self.cards)) if self.cards[0] else ()
        self.rows: list[dict[str, dict[int, Any]]] = []

    def row(self, k: int) -> dict[str, dict[int, Any]]:
        while len(self.rows) <= k:
            self.rows.append({})
        return self.rows[k]

    def put(self, k: int, agent: str, **values: Any) -> None:
        i = self.ids.index(agent)
        for name, value in values.items():
            self.row(k).setdefault(name, {})[i] = value

    def add_reward(self, k: int, agent: str, reward: float) -> None:
        """``reward`` added to what ``agent`` holds at row ``k`` (without making it active)."""
        rewards = self.row(k).setdefault("reward", {})
        i = self.ids.index(agent)
        rewards[i] = rewards.get(i, 0.0) + reward

    def flat(self, agent: str, obs: Any) -> np.ndarray:
        value = flat_obs(self.obs_spaces[agent], obs)
        out = np.zeros(self.obs_size, dtype=value.dtype)
        out[: value.size] = value
        return out

    def mask(self, agent: str, obs: Any, info: dict) -> np.ndarray:
        own = self.cards[self.ids.index(agent)]
        raw = obs["action_mask"] if isinstance(obs, dict) and "action_mask" in obs else info.get("action_mask")
        flat = np.ones(sum(own), dtype=bool) if raw is None else np.asarray(raw, dtype=bool)
        out = np.zeros(sum(self.padded), dtype=bool)
        offset, pos = 0, 0
        for head, card in enumerate(own):
            out[offset : offset + card] = flat[pos : pos + card]
            offset += self.padded[head]
            pos += card
        return out

    def build(self, actions: list[Any], episodes: list[tuple[int, int]], ends: dict) -> Expected:
        n, rows = len(self.ids), len(self.rows)

        def gather(name: str, default: Any, dtype: Any, tail: tuple[int, ...] = ()) -> np.ndarray:
            out = np.full((n, rows, *tail), default, dtype=dtype)
            for k, row in enumerate(self.rows):
                for i, value in row.get(name, {}).items():
                    out[i, k] = value
            return out

        obs_dtype = next(iter(self.rows[0]["obs"].values())).dtype
        has_discrete = bool(self.padded)
        cont = max(_cont(s) for s in self.act_spaces.values())
        masked = any(isinstance(s, spaces.Dict) and "action_mask" in s.spaces for s in self.obs_spaces.values()) or any(
            c != self.padded for c in self.cards
        )
        return Expected(
            actions=actions,
            obs=gather("obs", 0, obs_dtype, (self.obs_size,)),
            obs_=gather("obs_", 0, obs_dtype, (self.obs_size,)),
            discrete=gather("discrete", 0, np.int64, (len(self.padded),)) if has_discrete else None,
            continuous=gather("continuous", 0, np.float32, (cont,)) if cont else None,
            rewards=gather("reward", 0, np.float32),
            terminated=gather("terminated", False, bool),
            truncated=gather("truncated", False, bool),
            active=gather("active", False, bool),
            mask=gather("mask", False, bool, (sum(self.padded),)) if masked else None,
            mask_=gather("mask_", False, bool, (sum(self.padded),)) if masked else None,
            episodes=episodes,
            ends=ends,
        )


def _cards(space: Any) -> tuple[int, ...]:
    return (int(space.n),) if hasattr(space, "n") and not hasattr(space, "nvec") else ()


def _cont(space: Any) -> int:
    return int(np.prod(space.shape)) if not hasattr(space, "n") else 0


def _action_values(space: Any, action: Any) -> dict[str, Any]:
    if hasattr(space, "n"):
        return {"discrete": [int(action) - int(space.start)]}
    padded = np.asarray(action, dtype=np.float32).reshape(-1)
    return {"continuous": padded}


def play_parallel(env: Any, *, seed: int, steps: int) -> tuple[Expected, list[tuple[Any, ...]]]:
    """Step ``env`` with seeded random actions; reset when every agent is done."""
    table = Table(env)
    cont = max(_cont(s) for s in table.act_spaces.values())
    for agent in table.ids:
        env.action_space(agent).seed(seed)
    returned: list[tuple[Any, ...]] = []
    obs, infos = env.reset(seed=seed)
    returned.append((obs, infos))
    actions: list[dict] = []
    episodes, start = [], 0
    for k in range(steps):
        act = {a: env.action_space(a).sample() for a in env.agents}
        actions.append(act)
        nxt, rewards, terms, truncs, infos_ = env.step(act)
        returned.append((nxt, rewards, terms, truncs, infos_))
        for agent, o in nxt.items():
            if agent not in act:
                continue
            values = _action_values(table.act_spaces[agent], act[agent])
            if "continuous" in values:
                padded = np.zeros(cont, dtype=np.float32)
                padded[: values["continuous"].size] = values["continuous"]
                values["continuous"] = padded
            table.put(
                k,
                agent,
                obs=table.flat(agent, obs[agent]),
                obs_=table.flat(agent, o),
                reward=rewards[agent],
                terminated=terms[agent],
                truncated=truncs[agent],
                active=True,
                mask=table.mask(agent, obs[agent], infos.get(agent, {})),
                mask_=table.mask(agent, o, infos_.get(agent, {})),
                **values,
            )
        table.row(k)
        obs, infos = nxt, infos_
        if not env.agents:
            episodes.append((start, k + 1))
            start = k + 1
            obs, infos = env.reset()
            returned.append((obs, infos))
    if start < steps:
        episodes.append((start, steps))
    return table.build(actions, episodes, {}), returned


def play_aec(env: Any, *, seed: int, episodes: int) -> Expected:
    """Play ``episodes`` episodes with seeded random legal actions, attributing as SPEC section 5."""
    table = Table(env)
    for agent in table.ids:
        env.action_space(agent).seed(seed)
    actions: list[Any] = []
    spans = []
    first_row = 0
    for e in range(episodes):
        env.reset(seed=seed + e)
        pending: dict[str, tuple[Any, Any, Any]] = {}
        turns = {a: 0 for a in table.ids}
        before_first = {a: 0.0 for a in table.ids}  # received before its first turn
        acted = set()
        for agent in env.agent_iter():
            obs, reward, term, trunc, info = env.last()
            if agent in pending:
                before, mask, action = pending.pop(agent)
                table.put(
                    first_row + turns[agent],
                    agent,
                    obs=table.flat(agent, before),
                    obs_=table.flat(agent, obs),
                    reward=reward + before_first[agent],
                    terminated=term,
                    truncated=trunc,
                    active=True,
                    mask=mask,
                    mask_=table.mask(agent, obs, info),
                    **_action_values(table.act_spaces[agent], action),
                )
                before_first[agent] = 0.0
                turns[agent] += 1
            elif agent not in acted:
                before_first[agent] += reward
            if term or trunc:
                if agent not in acted and before_first[agent]:  # never acted: kept, inactive, in row 0
                    table.add_reward(first_row, agent, before_first[agent])
                action = None
            else:
                legal = table.mask(agent, obs, info)[: table.act_spaces[agent].n].astype(np.int8)
                action = env.action_space(agent).sample(legal)
                pending[agent] = (obs, table.mask(agent, obs, info), action)
                acted.add(agent)
            actions.append(action)
            env.step(action)
        rows = max(*turns.values(), 1 if first_row < len(table.rows) else 0)
        spans.append((first_row, first_row + rows))
        first_row += rows
    return table.build(actions, spans, {})


def replay_parallel(env: Any, seed: int, actions: list[dict]) -> list[tuple[Any, ...]]:
    """Step ``env`` with ``actions`` from ``reset(seed)``, resetting when every agent is done;
    return what each call returned."""
    returned: list[tuple[Any, ...]] = [env.reset(seed=seed)]
    for act in actions:
        returned.append(env.step(act))
        if not env.agents:
            returned.append(env.reset())
    return returned


def replay_aec(env: Any, seed: int, episodes: int, actions: list[Any], *, call_last: bool = True) -> None:
    """Play ``episodes`` episodes (seeds ``seed + e``) with ``actions``, one per ``env.step``."""
    taken = iter(actions)
    for e in range(episodes):
        env.reset(seed=seed + e)
        for _ in env.agent_iter():
            if call_last:
                env.last()
            env.step(next(taken))
