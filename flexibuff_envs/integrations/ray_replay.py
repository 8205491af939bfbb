"""A replay that outgrows one machine: `ReplayService`, its tables split into shards, each a Ray
actor holding a `FlexibleBuffer` that logs to an episode log of its own (the ``ray`` extra).

Episodes go whole to one shard: a learner's `ReplayService.insert` spreads a buffer's, a log's
or a chunk's episodes over the shards; `RayCollector` workers given the service insert their
chunks into a shard each themselves, never through the learner. `ReplayService.sample` draws
from every shard at once, as one buffer of all their rows would: each shard's share of the
batch is drawn multinomially in proportion to its rows (uniform) or its sum of ``priority **
alpha`` (prioritized), each shard draws its share, and the importance weights are ``(p_i /
p_min) ** -beta`` with ``p_min`` the smallest over the whole replay, not the shard's. The
batch's ``idx`` names shard and row (``row * shards + shard``), which is what
`ReplayService.update_priorities` takes back.

What survives what: a shard's episodes reach its log when it appends them (`FlexibleBuffer.log_to`),
so a shard whose process or node is lost is started again by Ray (on another node when its own
is gone: ``log_dir`` must then be a disk every node shares) and takes its episodes back from
its log; priorities start again from the highest (every row equal), and priorities sent for rows
drawn before the restart are dropped. Only episodes still running in a collector (and an
insert under way, sent again) are lost. While a shard is away the others serve: samples and
inserts go to the shards that answer.

>>> service = ReplayService(fe.infer_spec(env), shards=2, capacity=100_000)   # doctest: +SKIP
>>> service.insert(buffer)                                                    # doctest: +SKIP
>>> batch = service.sample(256, prioritized=True, n_step=3)                   # doctest: +SKIP
>>> service.update_priorities(batch.idx, td.abs() + 1e-6)                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs.batch import FlexiBatch, torch_converter
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    WorkerError,
    WorkerTimeoutError,
    positive_int,
)
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.integrations.ray import _ray
from flexibuff_envs.integrations.ray_shard import Limiter, RateLimiter, Shard, join
from flexibuff_envs.spec import BufferSpec

__all__ = ["RateLimiter", "ReplayService", "Sink"]

#: rows of one insert the learner sends to a shard at most (a chunk is cut between episodes)
ROWS_PER_INSERT = 1 << 16
#: attempts of a sample whose shards are lost under it, before giving up
ATTEMPTS = 5


@dataclass(frozen=True)
class Sink:
    """Where a `RayCollector` worker inserts its chunks itself: a shard, the rate limiter (None:
    none), the table. Sent to the worker by Ray."""

    shard: Any
    limiter: Any
    table: str
    timeout: float

    def insert(self, chunk: Chunk, cancelled: Callable[[], bool] | None = None) -> int:
        """Ask the limiter, then insert the chunk; an insert the shard was lost in is sent
        again once it is back (skipped there when it had arrived). Returns episodes appended;
        0 when ``cancelled()`` turned true while the limiter held it back (the chunk dropped)."""
        if not chunk.n_episodes or not self.admit(chunk.rows, cancelled):
            return 0
        return self.deliver(chunk, None)

    def admit(self, rows: int, cancelled: Callable[[], bool] | None = None) -> bool:
        """Wait for the limiter to admit an insert of ``rows`` rows; False when ``cancelled()``
        turned true meanwhile."""
        if self.limiter is None:
            return True
        ray, waited = _ray(), 0.0
        while True:  # in slices of a second, to see a cancel
            ok, inserted, sampled = ray.get(self.limiter.insert.remote(self.table, rows, 1.0))
            waited += 1.0
            if ok:
                return True
            if cancelled is not None and cancelled():
                return False
            if waited >= self.timeout:
                raise WorkerTimeoutError(_waited("an insert", self.timeout, inserted, sampled))

    def deliver(self, chunk: Chunk, sent: Any) -> int:
        """Insert the chunk (``sent``: the call that already took it there, None: none yet),
        sending it again while its shard is lost under it."""
        ray = _ray()
        for attempt in range(ATTEMPTS):
            try:
                if sent is None:
                    sent = self.shard.insert.remote(chunk, self.table, attempt > 0)
                return int(ray.get(sent))
            except ray.exceptions.RayActorError:
                sent = self.shard.insert.remote(chunk, self.table, True)
        raise WorkerError(f"the shard of table {self.table!r} was lost {ATTEMPTS} times in a row during an insert")


def _waited(what: str, timeout: float, inserted: int, sampled: int) -> str:
    return (
        f"ReplayService: {what} waited {timeout:g} s for the rate limiter ({inserted} rows inserted, "
        f"{sampled} sampled): the other side stopped (no collector inserting, or no learner sampling)"
    )


class ReplayService:
    """A replay of ``capacity`` rows per table, split among ``shards`` Ray actors (`module docs`).

    Args:
        spec: the layout of every table (`flexibuff_envs.infer_spec` of the env).
        shards: Ray actors holding the tables, ``capacity // shards`` rows of each.
        capacity: rows of each table over all shards; a shard forgets its oldest episodes first.
        tables: names of the tables (one per policy of a league, per agent group, ...).
        log_dir: each shard logs table ``t`` to ``log_dir/shard-k/t`` and takes it back after a
            restart (None: no logs; a lost shard comes back empty).
        limiter: the `RateLimiter` of every table (None: sampling waits for nothing).
        nodes: the Ray node id each shard prefers (soft: it moves when its node is lost).
        patience: seconds a shard has to answer a sample's first call before it is left out
            (taken for away, as while Ray starts it again) until it answers.
        seed: seeds each shard's sampling and the split of each batch among shards.
        shard_options: Ray actor options of the shards (default ``{"num_cpus": 0.01}``).
        options: keywords of `FlexibleBuffer` for each table's buffers (``gamma``,
            ``gae_lambda``, ``alpha``, ...); ``gamma`` and ``gae_lambda`` must be the inserted
            episodes'.
    """

    def __init__(
        self,
        spec: BufferSpec,
        *,
        shards: int = 2,
        capacity: int = 1_000_000,
        tables: Sequence[str] = ("default",),
        log_dir: str | os.PathLike[str] | None = None,
        limiter: RateLimiter | None = None,
        nodes: Sequence[str] | None = None,
        patience: float = 5.0,
        seed: int = 0,
        shard_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        ray = self._ray = _ray()
        if not isinstance(spec, BufferSpec):
            raise ArgumentTypeError(f"ReplayService: spec must be a BufferSpec (fe.infer_spec(env)), got {spec!r}")
        self.spec = spec
        self.n_shards = positive_int("shards", shards)
        self.capacity = positive_int("capacity", capacity)
        if isinstance(tables, str) or not tables or len(set(tables)) != len(tables):
            raise InvalidArgumentError(f"tables must be distinct names, at least one, got {tables!r}")
        self.tables = tuple(str(t) for t in tables)
        if nodes is not None and len(nodes) != self.n_shards:
            raise InvalidArgumentError(f"nodes names {len(nodes)} nodes for {self.n_shards} shards")
        self.limiter = limiter
        self.patience = float(patience)
        self.rng = np.random.default_rng(seed)
        self.options = {"global_reward": False, "individual_reward": False, **options}
        log = None if log_dir is None else os.path.abspath(os.fspath(log_dir))
        per_shard = -(-self.capacity // self.n_shards)
        actor = ray.remote(Shard)
        self.shards = []
        for k in range(self.n_shards):
            # a hundredth of a CPU: Ray places an actor asking for none anywhere, whatever its affinity
            chosen = {"num_cpus": 0.01, "max_restarts": -1, "max_task_retries": 0, **(shard_options or {})}
            if nodes is not None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                chosen["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes[k], soft=True)
            self.shards.append(
                actor.options(**chosen).remote(k, spec, per_shard, self.tables, self.options, log, seed + 7919 * k)
            )
        self._limiter = None
        self._known: dict[str, tuple[int, int]] = {}  # each table's counts at the last sample
        self._shares: dict[str, dict[int, float]] = {}  # each table's masses per shard at the last sample
        if limiter is not None:  # beside the learner; started again where lost, its counts then taken up again
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
            self._limiter = (
                ray.remote(Limiter)
                .options(
                    num_cpus=0.01,
                    max_concurrency=1000,
                    max_restarts=-1,
                    max_task_retries=-1,
                    scheduling_strategy=here,
                )
                .remote(limiter)
            )
        self._incarnations: dict[int, str] = {}
        self._away: dict[int, Any] = {}  # shard -> a call that answers once it is back
        self._next = 0  # the shard the learner's next insert goes to
        try:
            for k, (incarnation, *_) in enumerate(ray.get([s.describe.remote() for s in self.shards])):
                self._incarnations[k] = incarnation
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ shards

    def _serving(self) -> list[int]:
        """The shards that answer: those away come back once their call does."""
        for k, ref in list(self._away.items()):
            ready, _ = self._ray.wait([ref], timeout=0)
            if ready:
                try:
                    self._incarnations[k] = self._ray.get(ref)[0]
                    del self._away[k]
                except self._ray.exceptions.RayActorError:
                    self._away[k] = self.shards[k].describe.remote()
        serving = [k for k in range(self.n_shards) if k not in self._away]
        if not serving:
            raise WorkerError("ReplayService: every shard is lost (Ray is starting them again); try later")
        return serving

    def _lost(self, k: int) -> None:
        if k not in self._away:
            self._away[k] = self.shards[k].describe.remote()

    def sink(self, worker: int, table: str = "default") -> Sink:
        """Where `RayCollector` worker ``worker`` inserts its chunks: shard ``worker % shards``."""
        self._table(table)
        timeout = self.limiter.timeout if self.limiter is not None else math.inf
        return Sink(self.shards[worker % self.n_shards], self._limiter, table, timeout)

    def _table(self, table: str) -> str:
        if table not in self.tables:
            raise InvalidArgumentError(f"ReplayService has no table {table!r}; its tables are {list(self.tables)}")
        return table

    # ------------------------------------------------------------------ inserting

    def insert(self, source: Chunk | FlexibleBuffer | str | os.PathLike[str], table: str = "default") -> int:
        """Insert the ended whole episodes of ``source`` (a `Chunk`, a buffer, which keeps them,
        or the path of an episode log or buffer file) into ``table``, spread over the shards in
        pieces of whole episodes; returns the episodes appended."""
        self._table(table)
        chunk = _chunk_of(source)
        spread = -(-chunk.rows // len(self._serving()))  # rows for each shard serving
        bounds = _pieces(chunk.lengths, max(1, min(ROWS_PER_INSERT, spread)))
        sent = []  # every piece under way at once: the shards take theirs side by side
        for lo, hi in itertools.pairwise(bounds):
            serving = self._serving()
            sink = Sink(self.shards[serving[self._next % len(serving)]], self._limiter, table, self._timeout)
            self._next += 1
            piece = chunk[lo:hi]
            sink.admit(piece.rows)
            sent.append((sink, piece, sink.shard.insert.remote(piece, table, False)))
        return sum(sink.deliver(piece, ref) for sink, piece, ref in sent)

    @property
    def _timeout(self) -> float:
        return self.limiter.timeout if self.limiter is not None else math.inf

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        batch_size: int = 256,
        *,
        table: str = "default",
        prioritized: bool = False,
        beta: float = 0.4,
        n_step: int | None = None,
        fields: Collection[str] | None = None,
        as_torch: bool = False,
        device: Any = None,
    ) -> FlexiBatch:
        """``batch_size`` rows of ``table`` drawn with replacement over every shard, as
        `FlexibleBuffer.sample_transitions` draws them from one buffer (``prioritized``,
        ``beta``, ``n_step`` and ``fields`` as there), waiting for the rate limiter first."""
        n = positive_int("batch_size", batch_size)
        self._table(table)
        options = {"prioritized": prioritized, "beta": beta, "n_step": n_step, "fields": fields}
        for _ in range(ATTEMPTS):
            batch = self._draw(n, table, options, self._admit(table, n) if self._limiter is not None else None)
            if batch is not None:
                if as_torch:
                    convert = torch_converter(device)
                    batch = FlexiBatch(**{name: convert(name, value) for name, value in batch.__dict__.items()})
                return batch
        raise WorkerError(f"ReplayService: shards were lost under {ATTEMPTS} samples in a row")

    def _admit(self, table: str, n: int) -> Any:
        """The limiter's answer to a sample of ``n`` rows, under way."""
        return self._limiter.sample.remote(table, n, self._timeout, self._known.get(table, (0, 0)))  # type: ignore[union-attr]

    def _admitted(self, table: str, answer: Any) -> float:
        """Wait for the limiter's ``answer``; the seconds it took (raises when it timed out)."""
        began = time.monotonic()
        ok, inserted, sampled = self._ray.get(answer)
        self._known[table] = (inserted, sampled)
        if not ok:
            raise WorkerTimeoutError(_waited("a sample", self._timeout, inserted, sampled))
        return time.monotonic() - began

    def stream(self, batch_size: int = 256, *, depth: int = 2, **options: Any) -> Iterator[FlexiBatch]:
        """Batches as `sample` draws them (``options`` as there), ``depth`` drawn ahead on a
        thread while the caller trains on the one before: the round trips to the limiter and the
        shards overlap the learner's work. Priorities updated meanwhile reach the batches drawn
        after the update (at most ``depth`` batches late, as in Ape-X's learner). Leave the loop
        to stop; the batches drawn ahead are dropped (the limiter counted them)."""
        ahead: queue.Queue[Any] = queue.Queue(maxsize=positive_int("depth", depth))
        stop = threading.Event()

        def fill() -> None:
            try:
                while not stop.is_set():
                    batch = self.sample(batch_size, **options)
                    while not stop.is_set():
                        try:
                            ahead.put(batch, timeout=0.1)
                            break
                        except queue.Full:
                            continue
            except Exception as exc:  # noqa: BLE001 - any failure, raised in the caller's thread
                ahead.put(exc)

        thread = threading.Thread(target=fill, name="ReplayService.stream", daemon=True)
        thread.start()
        try:
            while True:
                item = ahead.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # a put waiting for room sees the stop within 0.1 s
                with contextlib.suppress(queue.Empty):
                    ahead.get(timeout=0.1)

    def _draw(self, n: int, table: str, options: Mapping[str, Any], admission: Any) -> FlexiBatch | None:
        """One try, in one round trip most often: every shard serving draws a little more than
        its share was at the last sample while the limiter is asked; the shares are then drawn
        (multinomially, from the masses each shard had at its draw) and each shard's rows taken
        from its draws (drawn with replacement, independently: any of them are a draw of its
        share), a shard that drew too few asked for the rest. None when a shard was lost."""
        serving = self._serving()
        last = self._shares.get(table, {})
        share = np.array([last.get(k, 1.0) for k in serving])
        share = share / share.sum() if share.sum() > 0 else np.full(len(serving), 1 / len(serving))
        asked = np.minimum(n, np.ceil(n * share + 3 * np.sqrt(n * share * (1 - share))) + 1).astype(int)

        def draw() -> dict[int, Any]:
            return {k: self.shards[k].draw.remote(table, int(a), options) for k, a in zip(serving, asked)}

        refs = draw()
        if admission is not None and self._admitted(table, admission) > 0.05:  # the limiter held it: draw anew
            refs = draw()
        for _ in range(100):  # admitted, the rows it counted may still be on their way to a shard
            replies = self._replies(refs)
            if len(replies) < len(refs):
                return None
            mass = np.array([reply[3] for reply in replies.values()])
            if mass.sum() > 0 or admission is None:
                break
            time.sleep(0.01)
            refs = draw()
        if mass.sum() <= 0:
            raise InvalidArgumentError(f"ReplayService: table {table!r} holds no rows to sample yet")
        self._shares[table] = dict(zip(replies, mass))
        counts = dict(zip(replies, self.rng.multinomial(n, mass / mass.sum())))
        drawn = {k: [] if reply[1] is None else [reply] for k, reply in replies.items()}
        short = {k: c - sum(len(r[1].idx) for r in drawn[k]) for k, c in counts.items()}
        refs = {k: self.shards[k].draw.remote(table, int(c), options) for k, c in short.items() if c > 0}
        more = self._replies(refs)
        if len(more) < len(refs):
            return None
        for k, reply in more.items():
            drawn[k].append(reply)
        pieces = [(k, reply) for k in counts if counts[k] for reply in drawn[k]]
        minimum = min(reply[4] for _, reply in pieces)
        batches, taken, left = [], [], dict(counts)
        for k, (incarnation, batch, _, _, shard_min) in pieces:
            self._incarnations[k] = incarnation
            batch.idx = batch.idx * self.n_shards + k
            if options["prioritized"]:
                batch.weights = batch.weights * np.float32((shard_min / minimum) ** -options["beta"])
            batches.append(batch)
            taken.append(min(len(batch.idx), left[k]))
            left[k] -= taken[-1]
        return FlexiBatch(**join(batches, self.spec.n_agents, self.rng.permutation(n), taken))

    def _replies(self, refs: dict[int, Any]) -> dict[int, Any]:
        """The answer to each call of ``refs`` (shard -> call) but of shards lost or giving
        none within ``patience`` seconds (Ray is starting them again): they are away from now on."""
        ray = self._ray
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.patience)
        replies = {}
        for k, ref in refs.items():
            try:
                if ref in ready:
                    replies[k] = ray.get(ref)
                    continue
            except ray.exceptions.RayActorError:
                pass
            self._lost(k)
        return replies

    def update_priorities(self, idx: Any, priorities: Any, *, table: str = "default") -> None:
        """New priorities of the rows ``idx`` of a prioritized sample (its ``batch.idx``); either
        may be a torch tensor. Rows a shard held before it was started again are left out."""
        self._table(table)
        rows = np.asarray(idx.detach().cpu() if hasattr(idx, "detach") else idx, dtype=np.int64).reshape(-1)
        values = np.asarray(
            priorities.detach().cpu() if hasattr(priorities, "detach") else priorities, dtype=np.float64
        )
        values = np.broadcast_to(values, rows.shape) if values.ndim == 0 else values.reshape(-1)
        if values.shape != rows.shape:
            raise InvalidArgumentError(
                f"update_priorities: {values.size} priorities for {rows.size} rows (idx and priorities differ in size)"
            )
        shard = rows % self.n_shards
        for k in np.unique(shard):
            mine = shard == k
            self.shards[k].update_priorities.remote(
                table, self._incarnations.get(int(k), ""), rows[mine] // self.n_shards, values[mine]
            )

    # ------------------------------------------------------------------ state

    def sizes(self, table: str = "default") -> list[int]:
        """Rows of ``table`` each shard holds (0 for a shard that is away)."""
        self._table(table)
        out = [0] * self.n_shards
        for k, stats in self._replies({k: self.shards[k].stats.remote(table) for k in self._serving()}).items():
            out[k] = stats[1]
        return out

    def counts(self, table: str = "default") -> tuple[int, int]:
        """Rows of ``table`` inserted and sampled, as the rate limiter counted them."""
        if self._limiter is None:
            raise InvalidArgumentError("ReplayService: counts are kept by the rate limiter; this service has none")
        return tuple(self._ray.get(self._limiter.counts_of.remote(self._table(table))))  # type: ignore[return-value]

    def close(self) -> None:
        """Close the shards' logs and stop the actors (the logs stay on disk)."""
        ray = self._ray
        try:
            ray.get([shard.close.remote() for k, shard in enumerate(self.shards) if k not in self._away], timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # a shard that is lost has no log open; its log stays whole
        for actor in [*self.shards, self._limiter]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        self.shards = []


def _chunk_of(source: Any) -> Chunk:
    if isinstance(source, Chunk):
        return source
    if isinstance(source, FlexibleBuffer):
        return source.copy_episodes()
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        held = FlexibleBuffer.open(path) if os.path.isdir(path) else FlexibleBuffer.load(path, mmap=True)
        return held.copy_episodes()
    raise ArgumentTypeError(f"insert: source must be a Chunk, a FlexibleBuffer or a path, got {type(source).__name__}")


def _pieces(lengths: np.ndarray, rows: int) -> list[int]:
    """Episode bounds cutting episodes of ``lengths`` into runs of about ``rows`` rows (one
    longer episode a run of its own)."""
    ends = np.cumsum(lengths)
    bounds = [0]
    while bounds[-1] < lengths.size:
        done = ends[bounds[-1] - 1] if bounds[-1] else 0
        bounds.append(max(bounds[-1] + 1, int(np.searchsorted(ends, done + rows, side="right"))))
    return bounds
