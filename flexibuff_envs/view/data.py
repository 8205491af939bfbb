"""What the episode browser shows of a recording, read lazily: a `Run` opens a log mapped (a
buffer file mapped, a vault or a Parquet export read) and answers with plain JSON-ready values:
the runs' curves (smoothed and thinned to what a chart draws), the episodes' table (returns per
agent and the team's, lengths, how each ended, deaths; sorted, filtered and paged with numpy),
one episode's timeline per agent, its observations as small plots, and one observation as
pixels or values. A log another process is still appending to is opened again when it holds
more than what was read."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs import log
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, MissingExtraError, OutOfRangeError, needs
from flexibuff_envs.files.format import BufferFile
from flexibuff_envs.index import EpisodeTable, episode_sums, episode_table
from flexibuff_envs.log.summaries import read_summaries
from flexibuff_envs.sampling import episode_hash

#: how an episode ended, by its last row's flags: every agent's, the team's
ENDINGS = ("terminated", "truncated", "cut")
#: the columns the table sorts by
SORTS = ("episode", "length", "return", "ended", "deaths", "seed")
#: agents drawn one line each; more are drawn one line per group (`agent_groups`)
SHOWN_AGENTS = 8
#: the points a curve is thinned to
POINTS = 2000
#: annotations a timeline shows, when recorded
ANNOTATIONS = ("values", "discrete_log_probs", "continuous_log_probs")


def agent_groups(agent_ids: list[str]) -> list[tuple[str, list[int]]]:
    """Agents as the lines of a chart: each its own when there are few, else one group per name
    without its number (``piston_0`` ... ``piston_19``: ``piston``), in order of first sight."""
    if len(agent_ids) <= SHOWN_AGENTS:
        return [(agent, [a]) for a, agent in enumerate(agent_ids)]
    groups: dict[str, list[int]] = {}
    for a, agent in enumerate(agent_ids):
        groups.setdefault(re.sub(r"[_\-]?\d+$", "", agent) or agent, []).append(a)
    return [
        (f"{name} (mean of {len(members)})" if len(members) > 1 else name, members) for name, members in groups.items()
    ]


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of the ``window`` values up to each (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values.astype(np.float64)]))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


@dataclass
class Table:
    """The ended episodes of a run, as arrays: episode ``k`` the ``k``-th to end in a log (one
    lane); a buffer file's lane after lane, each oldest first."""

    lengths: np.ndarray  # [E]
    returns: np.ndarray  # [E, n_agents]
    team: np.ndarray  # [E]: the team's return (the global reward's sum, else the agents')
    ended: np.ndarray  # [E]: an index into ENDINGS
    deaths: np.ndarray  # [E]: agents terminated before the episode's last step
    seeds: np.ndarray  # [E]: the reset seed of each (-1: none; `FlexibleBuffer.episode_origins`)


class Run:
    """One recording opened for the browser: an episode log's directory, a ``.fbuf`` file, a
    vault or a Parquet export (these two read into memory)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.kind = kind_of(self.path)
        self._rows = -1  # rows the opened buffer holds (a log: its newest whole commit's)
        self._open()

    @classmethod
    def over(cls, buffer: FlexibleBuffer, path: str = "") -> Run:
        """The run of a buffer already open (a table of its episodes, nothing read again)."""
        run = cls.__new__(cls)
        run.path, run.kind, run._rows, run.buffer = path, "buffer", len(buffer), buffer
        run.index = episode_table(buffer._index.read())
        run.table = run._table()
        return run

    def _open(self) -> None:
        if self.kind == "log":
            self.buffer = FlexibleBuffer.open(self.path, settle=False)  # mapped, and never written
            self._rows = len(self.buffer)
        elif self.kind == "file":  # mapped; compressed parts kept compressed in memory instead
            with BufferFile(self.path) as file:
                packed = any("codec" in meta for meta in file.header.fields)
            self.buffer = (
                FlexibleBuffer.load(self.path, compress="auto") if packed else FlexibleBuffer.load(self.path, mmap=True)
            )
        elif self.kind == "vault":
            from flexibuff_envs.integrations.vault import from_vault

            self.buffer = from_vault(self.path)
        else:
            from flexibuff_envs.integrations.parquet import from_parquet

            self.buffer = from_parquet(self.path)
        self.index: EpisodeTable = episode_table(self.buffer._index.read())
        self.table = self._table()

    def refresh(self) -> bool:
        """Open a log again if another process appended whole episodes since; whether it did."""
        if self.kind != "log" or log.report(self.path).rows <= self._rows:
            return False
        self._open()
        return True

    def _table(self) -> Table:
        """Every ended episode's outcome. Sums run over each lane's rows where they lie (a log's:
        its mapped columns, never copied); only their last rows are gathered."""
        buffer, episodes = self.buffer, self.index
        lengths = episodes.lengths
        seeds = buffer.episode_origins()["seed"]
        summaries = read_summaries(self.path, len(lengths), buffer.spec.n_agents) if self.kind == "log" else None
        if summaries is not None:  # a log's own: a few bytes an episode, its rows never read
            deaths = summaries["deaths"].astype(np.int64) if self.dies else np.zeros(len(lengths), np.int64)
            ended = summaries["ended"].astype(np.int8)
            return Table(lengths, summaries["returns"], summaries["team"], ended, deaths, seeds)
        store = buffer._store.arrays
        lanes = buffer._index.read()
        returns = episode_sums(buffer._store.ensure("individual_rewards"), lanes).T
        last = episodes.offsets + (episodes.ends - 1) % episodes.capacity
        terminated = store["terminated"][:, last].any(axis=0)
        truncated = store["truncated"][:, last].any(axis=0)
        ended = np.where(terminated, 0, np.where(truncated, 1, 2)).astype(np.int8)
        deaths = np.zeros(len(lengths), np.int64)
        if len(lengths) and self.dies:  # an agent terminates once in an episode
            deaths = (
                (episode_sums(store["terminated"], lanes) - store["terminated"][:, last]).sum(axis=0).astype(np.int64)
            )
        team = returns.sum(axis=1)
        if "global_rewards" in store:
            team = episode_sums(store["global_rewards"][None], lanes)[0]
        return Table(lengths, returns, team, ended, deaths, seeds)

    @property
    def dies(self) -> bool:
        """Whether an agent can end before its episode: a parallel recording's (its rows are
        simultaneous steps; an AEC recording's are turns, which end where each agent's do)."""
        return self.buffer.spec.env_api == "parallel" and self.buffer.spec.n_agents > 1

    def summary(self) -> dict[str, Any]:
        """The run at a glance, cheap enough to poll: its episodes, how they ended, its agents."""
        t = self.table
        counts = np.bincount(t.ended, minlength=len(ENDINGS))
        return {
            "path": self.path,
            "kind": self.kind,
            "agents": list(self.buffer.spec.agent_ids),
            "episodes": len(t.lengths),
            "ended": {name: int(n) for name, n in zip(ENDINGS, counts) if n},
            "deaths": int(t.deaths.sum()) if self.dies else None,
            "image": self.image_shape() is not None,
        }

    def curves(self, smooth: int = 1, points: int = POINTS) -> dict[str, Any]:
        """The charts' lines over episodes, each the mean of the last ``smooth`` episodes, thinned
        to at most ``points`` (episode numbers from 0, as in the table): the team's return, the agents' (or their
        groups'), lengths and deaths."""
        t = self.table
        n = len(t.lengths)
        at = np.unique(np.linspace(0, n - 1, min(n, points)).round().astype(np.int64)) if n else np.zeros(0, np.int64)
        line = lambda values: moving_mean(values, smooth)[at].round(6).tolist()
        returns = [("team", line(t.team))]
        returns += [(name, line(t.returns[:, members].mean(axis=1))) for name, members in agent_groups(self.agent_ids)]
        return {
            "x": at.tolist(),  # episode numbers as the table gives them, from 0
            "returns": [{"label": label, "values": values} for label, values in returns],
            "lengths": line(t.lengths),
            "deaths": line(t.deaths) if self.dies else None,
        }

    @property
    def agent_ids(self) -> list[str]:
        return list(self.buffer.spec.agent_ids)

    def episodes(
        self,
        *,
        sort: str = "episode",
        descending: bool = False,
        agent: int | None = None,
        ended: str | None = None,
        least: float | None = None,
        most: float | None = None,
        seed: int | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """A page of the table: ``limit`` episodes from ``offset``, sorted by ``sort`` (by
        ``agent``'s return, or the team's), only those that ended as ``ended`` with a return in
        ``[least, most]`` (and reset with ``seed``)."""
        t = self.table
        if sort not in SORTS:
            raise InvalidArgumentError(f"sort must be one of {list(SORTS)}, got {sort!r}")
        if agent is not None and not 0 <= agent < t.returns.shape[1]:
            raise OutOfRangeError(f"agent {agent} is not one of the {t.returns.shape[1]} agents")
        value = t.team if agent is None else t.returns[:, agent]
        columns = {"episode": np.arange(len(t.lengths)), "length": t.lengths, "return": value}
        keys = {**columns, "ended": t.ended, "deaths": t.deaths, "seed": t.seeds}[sort]
        order = np.argsort(-keys if descending else keys, kind="stable")  # ties in episode order either way
        keep = np.ones(order.size, bool)
        if ended is not None:
            if ended not in ENDINGS:
                raise InvalidArgumentError(f"ended must be one of {list(ENDINGS)}, got {ended!r}")
            keep &= t.ended[order] == ENDINGS.index(ended)
        if least is not None:
            keep &= value[order] >= least
        if most is not None:
            keep &= value[order] <= most
        if seed is not None:
            keep &= t.seeds[order] == seed
        order = order[keep]
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
                    "deaths": int(t.deaths[k]),
                    "seed": int(t.seeds[k]) if t.seeds[k] >= 0 else None,
                }
                for k in page.tolist()
            ],
        }

    def rows_of(self, k: int) -> np.ndarray:
        """Episode ``k``'s buffer rows, in time order."""
        if not 0 <= k < len(self.index):
            raise OutOfRangeError(f"episode {k} is not one of the {len(self.index)} episodes of {self.path}")
        return self.index.rows(k)

    def episode(self, k: int) -> dict[str, Any]:
        """Episode ``k``'s timeline: per agent and step, reward, return so far, action, active,
        legal actions and the annotations recorded (values, log probs); a step an agent sat out
        has no action (null)."""
        rows = self.rows_of(k)
        wanted: tuple[str, ...] = ("individual_rewards", "active", "discrete_actions", "continuous_actions")
        shown = [f for f in wanted if f in self.buffer.fields]
        shown += [f for f in ("action_mask", *ANNOTATIONS) if f in self.buffer._store.fields]
        batch = self.buffer.gather(rows, fields=shown)  # never the observations: an image episode is large
        n = rows.size
        rewards = np.asarray(batch.individual_rewards, dtype=np.float64).reshape(-1, n)
        active = np.asarray(batch.active).reshape(rewards.shape).astype(bool)
        out: dict[str, Any] = {
            "episode": k,
            "length": n,
            "agents": self.agent_ids,
            "rewards": rewards.round(6).tolist(),
            "return_so_far": np.cumsum(rewards, axis=1).round(6).tolist(),
            "active": active.astype(int).tolist(),
        }

        def per_step(values: Any) -> list[list[float | None]]:
            values = np.asarray(values, dtype=np.float64).reshape(rewards.shape[0], n, -1).sum(axis=2)
            return np.where(active, values.round(6), np.nan).tolist()

        if batch.discrete_actions is not None:
            out["actions"] = per_step(np.asarray(batch.discrete_actions)[..., :1])
        elif batch.continuous_actions is not None:
            out["actions"] = per_step(np.asarray(batch.continuous_actions)[..., :1])
        if batch.action_mask is not None:
            out["legal"] = per_step(sum(np.asarray(head).sum(axis=-1) for head in batch.action_mask))
        for name in ANNOTATIONS:
            value = getattr(batch, name)
            if value is not None and name in self.buffer._store.fields:
                out[name] = per_step(value)
        return out

    def content_hash(self, k: int) -> str:
        """Episode ``k``'s content hash (`Sampling.episode_hashes`): it reads the whole episode."""
        return episode_hash(self.buffer.gather(self.rows_of(k)))

    def observations(self, k: int, agent: int, dims: int = 16) -> dict[str, Any]:
        """Agent ``agent``'s observation over episode ``k``, as up to ``dims`` series (its first
        values; null where it sat out), for small plots of a vector observation."""
        rows = self.rows_of(k)
        obs = np.asarray(self.buffer.gather(rows, fields=["obs", "active"]).obs)
        obs = obs[agent] if self.buffer.spec.n_agents > 1 else obs
        size = self._size(agent)
        values = obs.reshape(rows.size, -1)[:, : min(size, dims)].astype(np.float64).T
        active = self._active(rows, agent)
        return {"size": size, "series": np.where(active, values.round(6), np.nan).tolist()}

    def _size(self, agent: int) -> int:
        """Agent ``agent``'s own observation size (a smaller agent's rows are padded)."""
        sizes = self.buffer.spec.agent_obs_sizes
        return int(sizes[agent]) if sizes else int(np.prod(self.buffer.spec.obs_shape))

    def _active(self, rows: np.ndarray, agent: int) -> np.ndarray:
        active = np.asarray(self.buffer.gather(rows, fields=["active"]).active).reshape(-1, rows.size)
        return active[agent if active.shape[0] > 1 else 0].astype(bool)

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
        ``width`` x ``channels``) for an image, else its ``values`` (its own size); only
        ``inactive`` at a step it sat out."""
        rows = self.rows_of(k)
        if not 0 <= step < rows.size:
            raise OutOfRangeError(f"step {step} is not one of episode {k}'s {rows.size} steps")
        row = rows[step : step + 1]
        if not self._active(row, agent)[0]:
            return {"inactive": True}
        obs = np.asarray(self.buffer.gather(row, fields=["obs"]).obs)
        obs = obs[agent, 0] if self.buffer.spec.n_agents > 1 else obs[0]
        image = self.image_shape()
        if image is None:
            return {"values": np.asarray(obs, dtype=np.float64).reshape(-1)[: self._size(agent)].round(6).tolist()}
        height, width, channels = image
        shape = tuple(self.buffer.spec.obs_shape)
        frame = np.asarray(obs).reshape(shape)
        if len(shape) == 3 and shape[-1] not in (1, 3, 4):
            frame = frame[-1] if shape[0] < shape[-1] else frame[..., -1]
        return {"width": width, "height": height, "channels": channels, "pixels": frame.tobytes()}


def kind_of(path: str) -> str:
    """What ``path`` holds, by its files: "log", "file", "vault" or "parquet"."""
    if os.path.isfile(path):
        return "file"
    if os.path.isfile(os.path.join(path, "metadata.json")):
        return "vault"
    if os.path.isdir(os.path.join(path, "agents")):
        return "parquet"
    return "log"


def episode_parquet(run: Run, k: int) -> bytes:
    """Episode ``k`` of ``run`` as a Parquet file: a row per agent and step (its timeline's
    values and its observation, as a list of its own size)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtraError(needs("an episode as Parquet", "pyarrow>=14", "parquet")) from exc
    timeline = run.episode(k)
    n, agents = timeline["length"], timeline["agents"]
    obs = np.asarray(run.buffer.gather(run.rows_of(k), fields=["obs"]).obs)
    obs = obs.reshape(len(agents), n, -1)
    columns: dict[str, Any] = {
        "episode": np.full(len(agents) * n, k),
        "agent": np.repeat(agents, n),
        "step": np.tile(np.arange(n), len(agents)),
    }
    for name in ("rewards", "return_so_far", "active", "actions", "legal", *ANNOTATIONS):
        if name in timeline:
            columns[name] = np.asarray(timeline[name], dtype=np.float64 if name != "active" else bool).reshape(-1)
    kind = pa.list_(pa.from_numpy_dtype(obs.dtype))
    columns["obs"] = pa.concat_arrays(  # each agent's of its own size
        [
            pa.FixedSizeListArray.from_arrays(pa.array(obs[a, :, : run._size(a)].reshape(-1)), run._size(a)).cast(kind)
            for a in range(len(agents))
        ]
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    return bytes(sink.getvalue().to_pybytes())
