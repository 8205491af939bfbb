"""The actors of `ReplayService` (the ``ray`` extra): a shard, holding its part of each table in
a `FlexibleBuffer` that logs to its own episode log, and the rate limiter every inserter and
sampler asks first; and the join of the shards' batches into one."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs.batch import PER_AGENT, FlexiBatch
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import BufferFileError, InvalidArgumentError, positive_int
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.log.format import HEADER
from flexibuff_envs.spec import BufferSpec

__all__ = ["RateLimiter"]


@dataclass(frozen=True)
class RateLimiter:
    """When a table may be sampled and inserted into, as Reverb's rate limiters say it.

    Sampling waits until ``min_size`` rows were inserted. With ``samples_per_insert``, the rows
    sampled are held near ``samples_per_insert`` times the rows inserted: with ``diff = inserted
    * samples_per_insert - sampled``, a sample of ``n`` rows waits while ``diff - n`` would fall
    below ``samples_per_insert * min_size - tolerance``, and an insert waits while ``diff`` is
    above ``samples_per_insert * min_size + tolerance`` (an insert is never cut: its episodes
    may carry ``diff`` past that by one insert's rows). So the faster side waits for the slower.
    A wait longer than ``timeout`` seconds raises `WorkerTimeoutError` (a learner sampling
    with no inserter left would wait for ever).
    """

    min_size: int = 1
    samples_per_insert: float | None = None
    tolerance: float = math.inf
    timeout: float = 600.0

    def __post_init__(self) -> None:
        positive_int("min_size", self.min_size)
        spi = self.samples_per_insert
        if spi is not None and not (isinstance(spi, (int, float)) and 0 < spi < math.inf):
            raise InvalidArgumentError(f"samples_per_insert must be a finite number > 0 or None, got {spi!r}")
        if not (isinstance(self.tolerance, (int, float)) and self.tolerance >= 0):
            raise InvalidArgumentError(f"tolerance must be a number >= 0, got {self.tolerance!r}")
        if not (isinstance(self.timeout, (int, float)) and 0 < self.timeout < math.inf):
            raise InvalidArgumentError(f"timeout must be a number of seconds > 0, got {self.timeout!r}")
        if spi is not None and self.tolerance == math.inf:
            raise InvalidArgumentError("samples_per_insert needs a finite tolerance (Reverb's error_buffer), in rows")

    def may_sample(self, inserted: int, sampled: int, n: int) -> bool:
        if inserted < self.min_size:
            return False
        spi = self.samples_per_insert
        return spi is None or inserted * spi - sampled - n >= spi * self.min_size - self.tolerance

    def may_insert(self, inserted: int, sampled: int) -> bool:
        spi = self.samples_per_insert
        return spi is None or inserted * spi - sampled <= spi * self.min_size + self.tolerance


class Limiter:
    """A Ray actor (async): each table's rows inserted and sampled, and the waits `RateLimiter`
    sets. Every inserter asks `insert` before it inserts and the learner `sample` before it
    samples; both answer whether they may (False: ``timeout`` passed) and the counts."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter
        self.counts: dict[str, list[int]] = {}
        self._changed: asyncio.Condition | None = None

    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:  # made in the actor's event loop, at its first use
            self._changed = asyncio.Condition()
        return self._changed

    def _counts(self, table: str) -> list[int]:
        return self.counts.setdefault(table, [0, 0])

    async def _admit(
        self, ready: Callable[[], bool], count: int, n: int, table: str, timeout: float
    ) -> tuple[bool, int, int]:
        """Wait until ``ready()``, then add ``n`` to the table's count ``count`` (0: inserted, 1:
        sampled); False when ``timeout`` seconds passed first. Returns that and the counts."""
        counts = self._counts(table)
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout)
            except asyncio.TimeoutError:
                return False, counts[0], counts[1]
            counts[count] += n
            self.changed.notify_all()
        return True, counts[0], counts[1]

    async def insert(self, table: str, rows: int, timeout: float) -> tuple[bool, int, int]:
        counts = self._counts(table)
        return await self._admit(lambda: self.limiter.may_insert(*counts), 0, rows, table, timeout)

    async def sample(self, table: str, n: int, timeout: float, known: tuple[int, int]) -> tuple[bool, int, int]:
        """``known``: the counts the sampler last saw, taken up again by a limiter started anew."""
        counts = self._counts(table)
        counts[0], counts[1] = max(counts[0], known[0]), max(counts[1], known[1])
        return await self._admit(lambda: self.limiter.may_sample(counts[0], counts[1], n), 1, n, table, timeout)

    async def count(self, table: str, rows: int) -> None:
        """Count ``rows`` inserted without a wait (an insert that passed the limiter by)."""
        async with self.changed:
            self._counts(table)[0] += rows
            self.changed.notify_all()

    def counts_of(self, table: str) -> tuple[int, int]:
        inserted, sampled = self._counts(table)
        return inserted, sampled


class Shard:
    """A Ray actor: shard ``k`` of a `ReplayService`, one `FlexibleBuffer` per table.

    With ``log_dir``, table ``t`` logs to ``log_dir/shard-k/t``, each insert synced before it
    returns; a shard started again (Ray restarts it after its process or node is lost), or
    started with ``resume``, first takes back the newest episodes of its log that fit its
    capacity. ``incarnation`` names this start: rows of an earlier one are other rows, so
    priorities sent for them are dropped.
    """

    def __init__(
        self,
        k: int,
        spec: BufferSpec,
        capacity: int,
        tables: Sequence[str],
        options: Mapping[str, Any],
        log_dir: str | None,
        resume: bool,
        seed: int,
    ) -> None:
        import ray

        self.k = k
        self.incarnation = uuid.uuid4().hex
        self.buffers: dict[str, FlexibleBuffer] = {}
        self.recovered = 0
        again = resume or ray.get_runtime_context().was_current_actor_reconstructed
        self.refused: list[str] = []  # logs found on a fresh start: the service refuses them
        for i, table in enumerate(tables):
            made = {"num_steps": capacity, "seed": seed + 1000 * i, **options}
            buffer = FlexibleBuffer.from_spec(dataclasses.replace(spec, n_envs=1), **made)
            if log_dir is not None:
                directory = os.path.join(log_dir, f"shard-{k}", table)
                if os.path.exists(os.path.join(directory, HEADER)):
                    if not again:
                        self.refused.append(directory)
                        continue
                    # the log's lock first (a start before may hold it a while), its journal folded
                    probe = FlexibleBuffer.from_spec(dataclasses.replace(spec, n_envs=1), **{**made, "num_steps": 1})
                    _log_to(probe, directory)
                    probe.close_log()
                    self.recovered += buffer.extend(FlexibleBuffer.open(directory).copy_episodes(capacity))
                _log_to(buffer, directory)
            self.buffers[table] = buffer

    def _buffer(self, table: str) -> FlexibleBuffer:
        buffer = self.buffers.get(table)
        if buffer is None:
            raise InvalidArgumentError(f"ReplayService has no table {table!r}; its tables are {sorted(self.buffers)}")
        return buffer

    def insert(self, chunk: Chunk, table: str, again: bool = False) -> int:
        """Append the chunk's episodes; ``again``: a resend after this shard was lost mid-insert,
        skipped when its newest episode is among this table's newest already."""
        buffer = self._buffer(table)
        if again and chunk.n_episodes and buffer.n_episodes and _holds(buffer, chunk):
            return 0
        return buffer.extend(chunk)

    def stats(self, table: str) -> tuple[str, int]:
        """This start's name and the rows the table holds."""
        return self.incarnation, len(self._buffer(table))

    def draw(
        self, table: str, n: int, options: Mapping[str, Any], highest: float
    ) -> tuple[str, FlexiBatch | None, int, float, float]:
        """``n`` rows drawn as the table's buffer draws them (None: none asked, or none held),
        with the table's rows, priority mass and minimum at the draw (the batch's weights are
        relative to that minimum): this start's name first. ``highest``: the highest priority
        the learner has given (rows new to prioritized replay get it)."""
        buffer = self._buffer(table)
        rows = len(buffer)
        total, minimum = float(rows), 1.0
        if rows and options.get("prioritized"):
            buffer.lift_max_priority(highest)
            total, minimum = buffer.priority_mass()
        batch = buffer.sample_transitions(n, **options) if n and total > 0 else None
        return self.incarnation, batch, rows, total, minimum

    def update_priorities(
        self, table: str, incarnation: str, rows: np.ndarray, priorities: np.ndarray, highest: float
    ) -> None:
        """New priorities of ``rows`` of this start (of a start before: other rows now, left);
        rows inserted since get ``highest``, the learner's highest."""
        if incarnation == self.incarnation:
            buffer = self._buffer(table)
            buffer.lift_max_priority(highest)
            buffer.update_priorities(rows, priorities)

    def describe(self) -> tuple[str, int, dict[str, tuple[int, int]], str, list[str]]:
        """This start's name, episodes recovered from its logs, each table's rows and episodes,
        the Ray node it runs on, and the logs it found on a fresh start (and left alone)."""
        import ray

        held = {table: (len(buffer), buffer.n_episodes) for table, buffer in self.buffers.items()}
        return self.incarnation, self.recovered, held, ray.get_runtime_context().get_node_id(), self.refused

    def close(self) -> None:
        for buffer in self.buffers.values():
            buffer.close_log()


def _log_to(buffer: FlexibleBuffer, directory: str, patience: float = 60.0) -> None:
    """``buffer.log_to(directory)``, each insert synced; while the shard's start before still
    holds the log (its node lost, its lock not yet let go), tried again for ``patience`` s."""
    deadline = time.monotonic() + patience
    while True:
        try:
            buffer.log_to(directory, fsync="always")
            return
        except BufferFileError as exc:
            if "another writer" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def start_shards(
    n: int, made: tuple[Any, ...], nodes: Sequence[str] | None, seed: int, options: Mapping[str, Any] | None
) -> list[Any]:
    """``n`` `Shard` actors, each made with ``made`` (spec, capacity, tables, buffer options,
    log_dir, resume), started again by Ray when lost; ``nodes``: the node each prefers."""
    import ray

    actor = ray.remote(Shard)
    shards = []
    for k in range(n):
        # a hundredth of a CPU: Ray places an actor asking for none anywhere, whatever its affinity
        chosen = {"num_cpus": 0.01, "max_restarts": -1, "max_task_retries": 0, **(options or {})}
        if nodes is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            chosen["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes[k], soft=True)
        shards.append(actor.options(**chosen).remote(k, *made, seed + 7919 * k))
    return shards


def start_limiter(limiter: RateLimiter) -> Any:
    """The `Limiter` actor, beside the learner; started again where lost (its counts then taken
    up again from the learner's)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return (
        ray.remote(Limiter)
        .options(num_cpus=0.01, max_concurrency=1000, max_restarts=-1, max_task_retries=-1, scheduling_strategy=here)
        .remote(limiter)
    )


def _holds(buffer: FlexibleBuffer, chunk: Chunk) -> bool:
    """Whether the chunk's newest episode is held in ``buffer``: by its origin (env instance,
    lane, ordinal, start time) where the chunk keeps one, else field by field among the newest."""
    newest = chunk[-1]
    if newest.origins is not None and newest.origins["started"][0] > 0:
        held = buffer.episode_origins()
        mine = newest.origins[0]
        keys = ("env", "lane", "ordinal", "started")
        same = np.logical_and.reduce([held[key] == mine[key] for key in keys])
        return bool(same.any())
    return _hashes(newest)[0] in _hashes(buffer.copy_episodes(64 * newest.rows))


def _hashes(episodes: Chunk) -> list[str]:
    """The content hashes (`FlexibleBuffer.episode_hashes`) of a chunk's episodes."""
    probe = FlexibleBuffer.from_spec(
        episodes.spec, num_steps=episodes.rows + 1, gamma=episodes.gamma, gae_lambda=episodes.gae_lambda
    )
    probe.extend(episodes)
    return probe.episode_hashes()


def join(batches: Sequence[FlexiBatch], n_agents: int, order: np.ndarray, counts: Sequence[int]) -> dict[str, Any]:
    """The first ``counts[i]`` rows of each of ``batches`` (from shards of one layout) joined
    along the batch axis, rows then put in ``order``; None fields stay None."""
    out: dict[str, Any] = {}
    first = batches[0]
    for field in dataclasses.fields(FlexiBatch):
        name = field.name
        value = getattr(first, name)
        if value is None or name == "agents":
            out[name] = value
            continue
        axis = 1 if n_agents > 1 and name in PER_AGENT else 0
        if name == "extra":
            out[name] = {
                key: _joined([b.extra[key] for b in batches], counts, 1 if n_agents > 1 else 0, order) for key in value
            }
        elif isinstance(value, list):  # a mask's heads
            out[name] = [
                _joined([b.__dict__[name][h] for b in batches], counts, axis, order) for h in range(len(value))
            ]
        else:
            out[name] = _joined([getattr(b, name) for b in batches], counts, axis, order)
    return out


def _joined(parts: list[np.ndarray], counts: Sequence[int], axis: int, order: np.ndarray) -> np.ndarray:
    kept = [np.take(part, np.arange(count), axis=axis) for part, count in zip(parts, counts)]
    return np.concatenate(kept, axis=axis).take(order, axis=axis)
