"""A replay that outgrows one machine: `ReplayService`, its tables split into shards, each a Ray
actor holding a `FlexibleBuffer` that logs to an episode log of its own (the ``ray`` extra).

Episodes go whole to one shard: a learner's `ReplayService.insert` spreads a buffer's, a log's
or a chunk's episodes over the shards; `RayCollector` workers given the service insert their
chunks into a shard each themselves, never through the learner. `ReplayService.sample` draws
from every shard at once, as one buffer of all their rows would: each shard's share of the
batch is drawn multinomially in proportion to its rows (uniform) or its sum of ``priority **
alpha`` (prioritized), each shard draws its share, and the importance weights are ``(p_i /
p_min) ** -beta`` with ``p_min`` the smallest over the whole replay, not the shard's. The
batch's ``idx`` names the shard, the shard's start (Ray may start it again: other rows then) and
the row, which is what `ReplayService.update_priorities` takes back.

What survives what: a shard's episodes reach the disk in its log, synced, before its insert
returns (`FlexibleBuffer.log_to` with ``fsync="always"``), so a shard whose process or node is
lost is started again by Ray (on another node when its own is gone: ``log_dir`` must then be a
disk every node shares) and takes its episodes back from its log; its rows join prioritized
replay at the highest priority the learner has given, and priorities sent for rows drawn before
the restart are dropped. Only episodes still running in a collector, and a chunk under way on a
node that died, are lost; an insert the shard died in is sent again and skipped if it had
arrived. While a shard is away the others serve the learner's samples and inserts; collectors
of that shard wait for it.

>>> service = ReplayService(fe.infer_spec(env), shards=2, capacity=100_000)   # doctest: +SKIP
>>> service.insert(buffer)                                                    # doctest: +SKIP
>>> batch = service.sample(256, prioritized=True, n_step=3)                   # doctest: +SKIP
>>> service.update_priorities(batch.idx, td.abs() + 1e-6)                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import ArgumentTypeError, InvalidArgumentError, WorkerError, positive_int
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.index import episode_ranges
from flexibuff_envs.integrations.ray import _ray
from flexibuff_envs.integrations.ray_sampling import ROW_BITS, Sampling
from flexibuff_envs.integrations.ray_shard import RateLimiter, start_limiter, start_shards
from flexibuff_envs.integrations.ray_sink import Sink, chunk_of
from flexibuff_envs.spec import BufferSpec

__all__ = ["RateLimiter", "ReplayService"]

#: rows of one insert the learner sends to a shard at most (a chunk is cut between episodes)
ROWS_PER_INSERT = 1 << 16
#: what a table's name may be (it names a folder of each shard's logs)
_TABLE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class ReplayService(Sampling):
    """A replay of ``capacity`` rows per table, split among ``shards`` Ray actors (`module docs`).

    Args:
        spec: the layout of every table (`flexibuff_envs.infer_spec` of the env).
        shards: Ray actors holding the tables, ``capacity // shards`` rows of each.
        capacity: rows of each table over all shards; a shard forgets its oldest episodes first.
        tables: names of the tables (one per policy of a league, per agent group, ...): letters,
            digits, ``_``, ``.`` and ``-``.
        log_dir: each shard logs table ``t`` to ``log_dir/shard-k/t`` (synced at each insert),
            and takes it back when Ray starts it again (None: no logs; a lost shard comes back
            empty). The logs keep every episode ever inserted: the replay as a dataset.
        resume: take the episodes of the logs in ``log_dir`` back at the start (a run continued);
            without it, logs already there are refused.
        limiter: the `RateLimiter` of every table (None: sampling waits for nothing).
        nodes: the Ray node id each shard prefers (when its node is lost it moves: with
            ``log_dir`` on a disk only that node has, it comes back empty).
        patience: seconds a shard has to answer before it is left out (taken for away, as while
            Ray starts it again) until it answers.
        seed: seeds each shard's sampling and the split of each batch among shards.
        shard_options: Ray actor options of the shards (default ``{"num_cpus": 0.01}``).
        options: keywords of `FlexibleBuffer` for each table's buffers (``gamma``,
            ``gae_lambda``, ``alpha``, ...); ``gamma`` and ``gae_lambda`` must be the inserted
            episodes'.

    Raises:
        InvalidArgumentError: a bad argument (named), or logs in ``log_dir`` without ``resume``.
    """

    def __init__(
        self,
        spec: BufferSpec,
        *,
        shards: int = 2,
        capacity: int = 1_000_000,
        tables: Sequence[str] = ("default",),
        log_dir: str | os.PathLike[str] | None = None,
        resume: bool = False,
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
        bad = [t for t in tables if not (isinstance(t, str) and _TABLE.fullmatch(t))]
        if bad:
            raise InvalidArgumentError(f"tables: {bad} are no table names (letters, digits, '_', '.', '-')")
        self.tables = tuple(tables)
        if nodes is not None and len(nodes) != self.n_shards:
            raise InvalidArgumentError(f"nodes names {len(nodes)} nodes for {self.n_shards} shards")
        if not (isinstance(patience, (int, float)) and 0 < patience < math.inf):
            raise InvalidArgumentError(f"patience must be a number of seconds > 0, got {patience!r}")
        self.limiter, self.patience = limiter, float(patience)
        self.rng = np.random.default_rng(seed)
        self.options = {"global_reward": False, "individual_reward": False, **options}
        log = None if log_dir is None else os.path.abspath(os.fspath(log_dir))
        per_shard = -(-self.capacity // self.n_shards)
        if per_shard >= 1 << ROW_BITS:
            raise InvalidArgumentError(f"capacity {capacity} gives shards of more than 2**{ROW_BITS} rows")
        made = (spec, per_shard, self.tables, self.options, log, resume)
        self.shards = start_shards(self.n_shards, made, nodes, seed, shard_options)
        self._limiter = None if limiter is None else start_limiter(limiter)
        self._known: dict[str, tuple[int, int]] = {}  # each table's counts at the last sample
        self._shares: dict[str, dict[int, float]] = {}  # each table's masses per shard at the last sample
        self._starts: list[list[str]] = [[] for _ in range(self.n_shards)]  # each shard's starts seen, in order
        self._away: dict[int, Any] = {}  # shard -> a call that answers once it is back
        self._lock = threading.Lock()  # the two above, shared with `stream`'s thread
        self._highest: dict[str, float] = {}  # each table's highest priority given: every shard's new rows get it
        self._next = 0  # the shard the learner's next insert goes to
        try:
            for k, (incarnation, *_, refused) in enumerate(ray.get([s.describe.remote() for s in self.shards])):
                self._start_of(k, incarnation)
                if refused:  # each shard looks on its own node's disk
                    raise InvalidArgumentError(
                        f"log_dir holds logs already ({refused[0]}, on shard {k}'s node): pass resume=True to "
                        "take their episodes back, or another log_dir"
                    )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ shards

    def _start_of(self, k: int, incarnation: str) -> int:
        """The number of shard ``k``'s start ``incarnation`` (kept in a batch's ``idx``)."""
        with self._lock:
            starts = self._starts[k]
            if not starts or starts[-1] != incarnation:
                starts.append(incarnation)
            return len(starts) - 1

    def _serving(self) -> list[int]:
        """The shards that answer: those away come back once their call does."""
        with self._lock:
            for k, ref in list(self._away.items()):
                ready, _ = self._ray.wait([ref], timeout=0)
                if ready:
                    try:
                        self._ray.get(ref)
                        del self._away[k]
                    except self._ray.exceptions.RayActorError:
                        self._away[k] = self.shards[k].describe.remote()
            serving = [k for k in range(self.n_shards) if k not in self._away]
        if not serving:
            raise WorkerError("ReplayService: every shard is lost (Ray is starting them again); try later")
        return serving

    def _lost(self, k: int) -> None:
        with self._lock:
            if k not in self._away:
                self._away[k] = self.shards[k].describe.remote()

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

    def sink(self, worker: int, table: str = "default") -> Sink:
        """Where `RayCollector` worker ``worker`` inserts its chunks: shard ``worker % shards``."""
        return Sink(self.shards[worker % self.n_shards], self._limiter, self._table(table), self._timeout)

    def _table(self, table: str) -> str:
        if table not in self.tables:
            raise InvalidArgumentError(f"ReplayService has no table {table!r}; its tables are {list(self.tables)}")
        return table

    @property
    def _timeout(self) -> float:
        return self.limiter.timeout if self.limiter is not None else math.inf

    # ------------------------------------------------------------------ inserting

    def insert(
        self, source: Chunk | FlexibleBuffer | str | os.PathLike[str], table: str = "default", *, limited: bool = True
    ) -> int:
        """Insert the ended whole episodes of ``source`` (a `Chunk`, a buffer, which keeps them,
        or the path of an episode log or buffer file) into ``table``, spread over the shards
        serving in pieces of whole episodes, all under way at once; returns the episodes
        appended. ``limited=False`` passes the rate limiter's wait by (filling a replay before
        training: the learner, its only sampler, would wait for itself); the rows still count
        as inserted."""
        self._table(table)
        chunk = chunk_of(source)
        spread = -(-chunk.rows // len(self._serving()))  # rows for each shard serving
        limiter = self._limiter if limited else None
        sent = []
        for lo, hi in episode_ranges(chunk.lengths, max(1, min(ROWS_PER_INSERT, spread))):
            serving = self._serving()
            sink = Sink(self.shards[serving[self._next % len(serving)]], limiter, table, self._timeout)
            self._next += 1
            piece = chunk[lo:hi]
            sink.admit(piece.rows)
            sent.append((sink, piece, sink.shard.insert.remote(piece, table, False)))
        appended = sum(sink.deliver(piece, ref) for sink, piece, ref in sent)
        if self._limiter is not None and not limited:
            self._ray.get(self._limiter.count.remote(table, chunk.rows))
        return appended

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
        for shard in self.shards:
            with contextlib.suppress(ray.exceptions.RayError):  # a lost shard has no log open; its log is whole
                ray.get(shard.close.remote(), timeout=60)
        for actor in [*self.shards, self._limiter]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        self.shards = []
