"""What the episode browser shows of a recording, read lazily: a `Run` opens a log mapped (or a
buffer file mapped) and answers with plain JSON-ready values: the episodes' table (returns per
agent and the team's, lengths, how each ended; sorted, filtered and paged with numpy), one
episode's timeline per agent, and one observation as pixels or values. A log another process is
still appending to is opened again when it holds more than what was read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs import log
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, OutOfRangeError
from flexibuff_envs.index import episode_table

#: how an episode ended, by its last row's flags: every agent's, the team's
ENDINGS = ("terminated", "truncated", "cut")
#: the columns the table sorts by
SORTS = ("episode", "length", "return", "ended")


@dataclass
class Table:
    """The ended episodes of a run, as arrays: episode ``k`` the ``k``-th to end in a log (one
    lane); a buffer file's lane after lane, each oldest first."""

    lengths: np.ndarray  # [E]
    returns: np.ndarray  # [E, n_agents]
    team: np.ndarray  # [E]: the team's return (the global reward's sum, else the agents')
    ended: np.ndarray  # [E]: an index into ENDINGS


class Run:
    """One recording (an episode log's directory, or a ``.fbuf`` file) opened for the browser."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.is_log = os.path.isdir(self.path)
        self._rows = -1  # rows the opened buffer holds (a log: its newest whole commit's)
        self.buffer = self._open()
        self.table = self._table()

    def _open(self) -> FlexibleBuffer:
        if self.is_log:
            buffer = FlexibleBuffer.open(self.path, settle=False)  # mapped, and never written
            self._rows = len(buffer)
            return buffer
        return FlexibleBuffer.load(self.path, mmap=True)

    def refresh(self) -> bool:
        """Open a log again if another process appended whole episodes since; whether it did."""
        if not self.is_log or log.report(self.path).rows <= self._rows:
            return False
        self.buffer = self._open()
        self.table = self._table()
        return True

    def _table(self) -> Table:
        buffer = self.buffer
        stats = buffer.episode_stats()
        episodes = episode_table(buffer._index.read())
        rows, last = episodes.all_rows()
        ends = rows[last]
        store = buffer._store.arrays
        terminated = store["terminated"][:, ends].any(axis=0)
        truncated = store["truncated"][:, ends].any(axis=0)
        ended = np.where(terminated, 0, np.where(truncated, 1, 2)).astype(np.int8)
        team = stats["returns"].sum(axis=1)
        if "global_rewards" in store and rows.size:
            team = np.add.reduceat(store["global_rewards"][rows].astype(np.float64), last - stats["lengths"] + 1)
        return Table(stats["lengths"], stats["returns"], team, ended)

    def summary(self) -> dict[str, Any]:
        """The run as the page's charts draw it: a value per episode."""
        t = self.table
        return {
            "path": self.path,
            "kind": "log" if self.is_log else "file",
            "agents": list(self.buffer.spec.agent_ids),
            "episodes": len(t.lengths),
            "lengths": t.lengths.tolist(),
            "returns": t.returns.T.round(6).tolist(),  # [n_agents][E]
            "team": t.team.round(6).tolist(),
            "ended": [ENDINGS[k] for k in t.ended.tolist()],
            "image": self.image_shape() is not None,
        }

    def episodes(
        self,
        *,
        sort: str = "episode",
        descending: bool = False,
        agent: int | None = None,
        ended: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """A page of the table: ``limit`` episodes from ``offset``, sorted by ``sort`` (by
        ``agent``'s return, or the team's), only those that ended as ``ended``."""
        t = self.table
        if sort not in SORTS:
            raise InvalidArgumentError(f"sort must be one of {list(SORTS)}, got {sort!r}")
        if agent is not None and not 0 <= agent < t.returns.shape[1]:
            raise OutOfRangeError(f"agent {agent} is not one of the {t.returns.shape[1]} agents")
        value = t.team if agent is None else t.returns[:, agent]
        keys = {"episode": np.arange(len(t.lengths)), "length": t.lengths, "return": value, "ended": t.ended}[sort]
        order = np.argsort(keys, kind="stable")
        if descending:
            order = order[::-1]
        if ended is not None:
            if ended not in ENDINGS:
                raise InvalidArgumentError(f"ended must be one of {list(ENDINGS)}, got {ended!r}")
            order = order[t.ended[order] == ENDINGS.index(ended)]
        page = order[offset : offset + limit]
        return {
            "total": int(order.size),
            "rows": [
                {
                    "episode": int(k),
                    "length": int(t.lengths[k]),
                    "return": float(value[k]),
                    "returns": t.returns[k].round(6).tolist(),
                    "ended": ENDINGS[t.ended[k]],
                }
                for k in page.tolist()
            ],
        }

    def episode(self, k: int) -> dict[str, Any]:
        """Episode ``k``'s timeline: per agent and step, reward, return so far, action, active,
        legal actions; and its length."""
        rows = self._rows_of(k)
        batch = self.buffer.gather(rows)
        rewards = np.asarray(batch.individual_rewards, dtype=np.float64).reshape(-1, rows.size)
        out: dict[str, Any] = {
            "episode": k,
            "length": rewards.shape[1],
            "agents": list(self.buffer.spec.agent_ids),
            "rewards": rewards.round(6).tolist(),
            "return_so_far": np.cumsum(rewards, axis=1).round(6).tolist(),
            "active": np.asarray(batch.active).reshape(rewards.shape).astype(int).tolist(),
        }
        if batch.discrete_actions is not None:
            out["actions"] = np.asarray(batch.discrete_actions)[..., 0].reshape(rewards.shape).tolist()
        if batch.action_mask is not None:
            legal = sum(np.asarray(head).sum(axis=-1) for head in batch.action_mask)
            out["legal"] = np.asarray(legal).reshape(rewards.shape).tolist()
        return out

    def _rows_of(self, k: int) -> np.ndarray:
        episodes = episode_table(self.buffer._index.read())
        if not 0 <= k < len(episodes):
            raise OutOfRangeError(f"episode {k} is not one of the {len(episodes)} episodes of {self.path}")
        return episodes.rows(k)

    def image_shape(self) -> tuple[int, int, int] | None:
        """(height, width, channels) of an agent's observation shown as an image, or None: bytes
        (uint8) of 2 axes of 16 or more, or 3 with 1, 3 or 4 channels last, or a stack of frames
        on its first or last axis, the shorter (the newest frame is shown)."""
        spec = self.buffer.spec
        shape = tuple(spec.obs_shape)
        if np.dtype(spec.obs_dtype) != np.uint8 or len(shape) not in (2, 3):
            return None
        if len(shape) == 3 and shape[-1] in (1, 3, 4):
            height, width, channels = shape
        elif len(shape) == 3:  # a stack: [k, height, width] (Gymnasium) or [height, width, k] (SB3, SuperSuit)
            (height, width), channels = (shape[1:] if shape[0] < shape[-1] else shape[:2]), 1
        else:
            (height, width), channels = shape, 1
        return (height, width, channels) if min(height, width) >= 16 else None

    def frame(self, k: int, step: int, agent: int) -> dict[str, Any]:
        """Agent ``agent``'s observation at ``step`` of episode ``k``: ``pixels`` (bytes, rows of
        ``width`` x ``channels``) for an image, else its ``values``."""
        rows = self._rows_of(k)
        if not 0 <= step < rows.size:
            raise OutOfRangeError(f"step {step} is not one of episode {k}'s {rows.size} steps")
        obs = np.asarray(self.buffer.gather(rows[step : step + 1], fields=["obs"]).obs)
        obs = obs[agent, 0] if self.buffer.spec.n_agents > 1 else obs[0]
        image = self.image_shape()
        if image is None:
            return {"values": np.asarray(obs, dtype=np.float64).reshape(-1).round(6).tolist()}
        height, width, channels = image
        shape = tuple(self.buffer.spec.obs_shape)
        frame = np.asarray(obs).reshape(shape)
        if len(shape) == 3 and shape[-1] not in (1, 3, 4):
            frame = frame[-1] if shape[0] < shape[-1] else frame[..., -1]
        return {"width": width, "height": height, "channels": channels, "pixels": frame.tobytes()}
