"""Collect experience on many Ray workers into one learner buffer (the ``ray`` extra).

Each worker is a Ray actor that builds its env with the user's ``env_fn``, wraps it with the
recorder of its kind and steps it with the user's policy, in its own process (on any machine of
the cluster). Every ``chunk_steps`` steps it sends the episodes that ended as one `Chunk` of numpy
arrays through Ray's object store; nothing crosses per step. The learner appends each chunk to its
`FlexibleBuffer` (`FlexibleBuffer.extend`) as it arrives, so episodes land whole, with the ``G``,
masks and annotations the worker recorded. Given a `ReplayService`, workers insert their chunks
into its shards themselves instead, and `RayCollector.start` keeps them at it on their own.

A worker that dies (its process or machine is lost) is replaced by a new one with a fresh seed;
the episodes it had not sent yet (the running one, and those ended since its last chunk) are
lost with it, and nothing of them reaches the learner's buffer.

>>> from flexibuff_envs.integrations.ray import RayCollector
>>> ray.init(num_cpus=2)                                                    # doctest: +SKIP
>>> collector = RayCollector(lambda: gym.make("CartPole-v1"), n_workers=2)  # doctest: +SKIP
>>> collector.collect(10_000).steps                                         # doctest: +SKIP
10000
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    MissingExtraError,
    WorkerError,
    WorkerTimeoutError,
    needs,
    positive_int,
)
from flexibuff_envs.files.chunk import check_layout
from flexibuff_envs.integrations.ray_worker import ChunkInfo, Collected, Result, Worker
from flexibuff_envs.recording.rollout import Policy
from flexibuff_envs.spec import BufferSpec

if TYPE_CHECKING:
    from flexibuff_envs.integrations.ray_replay import ReplayService

__all__ = ["ChunkInfo", "Collected", "RayCollector"]

#: chunks each worker has queued, so it steps on while the learner merges the one before
_QUEUED = 2
#: threads of a worker: its queued chunks, `run`, and the learner's calls while they wait
_THREADS = 2 * _QUEUED + 4


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError(needs("flexibuff_envs.integrations.ray", "ray", "ray")) from exc
    return ray


class RayCollector:
    """Step ``n_workers`` copies of an env on Ray actors and merge their episodes into `buffer`.

    Worker ``i`` plays as one process would after ``reset(seed=seed + i)``, so its episodes are
    the ones the same recorder records in one process with that seed. A replacement for a dead
    worker gets the seed ``seed + i + n_workers * k`` (its ``k``-th restart).

    Args:
        env_fn: builds the bare env (a Gymnasium env or vector env, a PettingZoo parallel or AEC
            env) inside each worker; it and ``policy`` are sent to the workers by Ray.
        policy: see `flexibuff_envs.recording.rollout.Policy`; a ``torch.nn.Module`` runs under
            ``torch.no_grad()`` and takes `set_weights`. None: uniformly random legal actions.
        n_workers: Ray actors to start.
        seed: seed of worker 0 (see above) and of the learner buffer's sampling.
        chunk_steps: env steps per chunk a worker sends (vector envs: steps of all sub-envs).
        num_steps: rows of the learner buffer (one lane) when ``buffer`` is not given.
        buffer: the learner buffer to fill; worker ``i``'s chunks go to lane ``i % n_envs``.
        service: a `ReplayService` the workers insert their chunks into themselves (worker ``i``
            into its shard ``i % shards``, table ``table``) instead of sending them to the
            learner; no learner buffer is made then (`buffer` is None). `start` keeps them
            collecting on their own (Ape-X).
        recorder_options: keywords of `flexibuff_envs.record` in each worker (``gamma``,
            ``global_reward``, ``bootstrap_fn``, ...). Its ``num_steps`` (default
            ``chunk_steps + 10_000``) must hold a chunk plus the longest episode.
        worker_options: Ray actor options (default ``{"num_cpus": 1}``), e.g. ``runtime_env``.
        max_restarts: restarts of dead workers allowed in all, before giving up.
        start_timeout: seconds to wait for the workers to start (Ray holds back actors the
            cluster has no free CPUs for).
    """

    def __init__(
        self,
        env_fn: Callable[[], Any],
        policy: Policy | None = None,
        *,
        n_workers: int = 2,
        seed: int = 0,
        chunk_steps: int = 1000,
        num_steps: int = 100_000,
        buffer: FlexibleBuffer | None = None,
        service: ReplayService | None = None,
        table: str = "default",
        recorder_options: Mapping[str, Any] | None = None,
        worker_options: Mapping[str, Any] | None = None,
        max_restarts: int = 10,
        start_timeout: float = 120.0,
    ) -> None:
        ray = _ray()
        self._ray = ray
        self.n_workers = positive_int("n_workers", n_workers)
        self.chunk_steps = positive_int("chunk_steps", chunk_steps)
        self.seed = int(seed)
        self.max_restarts = int(max_restarts)
        self.restarts = 0
        self.weights_version = 0
        self._env_fn, self._policy = env_fn, policy
        if service is not None and buffer is not None:
            raise InvalidArgumentError("RayCollector: pass a buffer or a service, not both")
        self.service = service
        self._sinks = None if service is None else [service.sink(i, table) for i in range(self.n_workers)]
        self._running: dict[Any, int] = {}  # a running worker's `run` call -> its index
        self._runs = 0  # the token of the workers' `run`s: `stop` names it
        self._options = {"num_steps": self.chunk_steps + 10_000, **(recorder_options or {})}
        options = {"num_cpus": 1, "max_concurrency": _THREADS, **(worker_options or {})}
        self._actor = ray.remote(Worker).options(**options)
        self._weights: Any = None  # the object ref of the last weights broadcast
        self._incarnations = [0] * self.n_workers
        self.workers = [self._start(i) for i in range(self.n_workers)]
        try:  # an env_fn that fails raises here, with the worker's traceback; no worker is left behind
            spec, gamma, gae_lambda = self._describe(start_timeout, options["num_cpus"])
            if buffer is not None or service is not None:
                held = buffer.spec if buffer is not None else service.spec  # type: ignore[union-attr]
                check_layout(held, spec, "RayCollector: the workers' env")
        except BaseException:
            self.close()
            raise
        self.buffer: FlexibleBuffer | None = (
            buffer
            if buffer is not None or service is not None
            else FlexibleBuffer.from_spec(
                dataclasses.replace(spec, n_envs=1),
                num_steps=num_steps,
                gamma=gamma,
                gae_lambda=gae_lambda,
                seed=seed,
                global_reward=False,
                individual_reward=False,
            )
        )

    def _describe(self, timeout: float, cpus: float) -> tuple[BufferSpec, float, float]:
        """Worker 0's layout and discounts, once every worker has started."""
        ray = self._ray
        try:
            return ray.get([w.describe.remote() for w in self.workers], timeout=timeout)[0]
        except ray.exceptions.GetTimeoutError as exc:
            raise WorkerTimeoutError(
                f"RayCollector: {self.n_workers} workers did not start within start_timeout={timeout:g} s; "
                f"each asks for {cpus:g} CPU, the cluster has {ray.cluster_resources().get('CPU', 0):g} "
                "in all and other actors may hold some (pass fewer n_workers, close other collectors, or "
                "set worker_options={'num_cpus': ...})"
            ) from exc

    def _start(self, i: int) -> Any:
        seed = self.seed + i + self.n_workers * self._incarnations[i]
        sink = None if self._sinks is None else self._sinks[i]
        worker = self._actor.remote(self._env_fn, self._policy, seed, self._options, sink)
        if self._weights is not None:
            worker.set_weights.remote(self._weights, self.weights_version)
        return worker

    def _restart(self, i: int, cause: Exception) -> None:
        if self.restarts >= self.max_restarts:
            raise WorkerError(
                f"worker {i} died and the {self.max_restarts} restarts allowed (max_restarts) are used up: {cause}"
            ) from cause
        self.restarts += 1
        self._replace(i)

    def _replace(self, i: int) -> None:
        """Worker ``i`` killed, and a new one in its place with the next seed."""
        self._ray.kill(self.workers[i], no_restart=True)
        self._incarnations[i] += 1
        self.workers[i] = self._start(i)

    # ------------------------------------------------------------------ collecting

    def collect(self, steps: int) -> Collected:
        """Step ``steps`` env steps in all (shared between the workers), merge every ended episode
        into `buffer`, and return. Episodes still running go on at the next call."""
        share, extra = divmod(positive_int("steps", steps), self.n_workers)
        left = [share + (i < extra) for i in range(self.n_workers)]
        start, restarts, chunks = time.perf_counter(), self.restarts, []
        queue = _Queue(self, left)
        while queue.pending:
            info = queue.next()
            if info is not None:
                chunks.append(info)
        return Collected(
            steps=sum(c.steps for c in chunks),
            episodes=sum(c.episodes for c in chunks),
            rows=sum(c.rows for c in chunks),
            nbytes=sum(c.nbytes for c in chunks),
            seconds=time.perf_counter() - start,
            merge_seconds=sum(c.merge_seconds for c in chunks),
            restarts=self.restarts - restarts,
            chunks=chunks,
        )

    def stream(self) -> Iterator[ChunkInfo]:
        """Keep every worker collecting chunk after chunk while the caller trains: each chunk is
        merged into `buffer` as it arrives, then its `ChunkInfo` is yielded.

        Leave the loop to stop; the chunks already under way are merged first.
        """
        queue = _Queue(self, None)
        try:
            while True:
                info = queue.next()
                if info is not None:
                    yield info
        finally:
            queue.stop()
            while queue.pending:
                queue.next()

    def set_weights(self, weights: Any) -> int:
        """Send ``weights`` (a ``state_dict``) to every worker's policy, once through the object
        store; returns the new weights version. Each worker loads them after the chunks it has
        queued (at most 2 while streaming); `ChunkInfo.weights_version` says what a chunk used."""
        if not callable(getattr(self._policy, "load_state_dict", None)):
            raise ArgumentTypeError(
                f"set_weights: the policy ({type(self._policy).__name__}) has no "
                "load_state_dict; pass a torch.nn.Module as the policy"
            )
        self.weights_version += 1
        self._weights = self._ray.put(weights)
        for worker in self.workers:
            worker.set_weights.remote(self._weights, self.weights_version)
        return self.weights_version

    def _merge(self, i: int, result: Result) -> ChunkInfo:
        start, appended = time.perf_counter(), result.appended
        if result.chunk is not None and self.buffer is not None:
            appended = self.buffer.extend(result.chunk, lane=i % self.buffer.spec.n_envs)
        return ChunkInfo(
            worker=i,
            steps=result.steps,
            episodes=int(appended or 0),
            rows=result.rows,
            nbytes=result.nbytes,
            weights_version=result.version,
            seconds=result.seconds,
            merge_seconds=time.perf_counter() - start if result.chunk is not None else 0.0,
            returns=result.returns,
        )

    # ------------------------------------------------------------------ on their own (a service)

    def start(self) -> None:
        """Keep every worker collecting chunk after chunk into the service, on its own, until
        `stop`: the learner only samples the service (and calls `poll` now and then)."""
        if self.service is None:
            raise InvalidArgumentError("RayCollector.start: workers collect on their own into a service; pass service=")
        for i, worker in enumerate(self.workers):
            if i not in self._running.values():
                self._running[worker.run.remote(self.chunk_steps, self._runs)] = i

    def poll(self) -> list[ChunkInfo]:
        """The chunks the workers collected since the last poll; a worker that died is started
        again (its running episodes and unsent chunk are lost), one whose insert timed out
        raises."""
        ray = self._ray
        done, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=0)
        for ref in done:
            i = self._running.pop(ref)
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                self._restart(i, exc)
                self._running[self.workers[i].run.remote(self.chunk_steps, self._runs)] = i
        infos = []
        for i, worker in enumerate(self.workers):
            try:
                infos += [self._merge(i, result) for result in ray.get(worker.report.remote())]
            except ray.exceptions.RayActorError:
                continue  # found dead at the next poll
        return infos

    def stop(self, timeout: float = 30.0) -> list[ChunkInfo]:
        """Stop the workers started by `start` after the chunk each has under way, and return
        the chunks not polled yet. A worker still waiting after ``timeout`` seconds (on the rate
        limiter, for samples no one takes any more) is started again, its chunk lost."""
        ray, token = self._ray, self._runs
        self._runs += 1  # a `start` after this one runs on, whatever happens below
        for worker in self.workers:
            worker.stop.remote(token)
        _, waiting = ray.wait(list(self._running), num_returns=len(self._running), timeout=timeout)
        for ref in waiting:
            self._replace(self._running.pop(ref))
        for ref in list(self._running):  # ended: a worker lost at the end is not started again
            i = self._running.pop(ref)
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                self._restart(i, exc)
        return self.poll()

    def close(self) -> None:
        """Stop the workers (their unsent episodes are dropped)."""
        self._running.clear()
        for worker in self.workers:
            self._ray.kill(worker, no_restart=True)
        self.workers = []


class _Queue:
    """The chunks under way: ``_QUEUED`` per worker, resubmitted as each arrives.

    Args:
        left: env steps each worker still has to take (None: no end).
    """

    def __init__(self, collector: RayCollector, left: list[int] | None) -> None:
        self.collector = collector
        self.left = left
        self.stopped = False
        self.pending: dict[Any, tuple[int, int]] = {}  # object ref -> (worker, steps asked)
        for i in range(collector.n_workers):
            for _ in range(_QUEUED):
                self.submit(i)

    def submit(self, i: int) -> None:
        n = self.collector.chunk_steps if self.left is None else min(self.collector.chunk_steps, self.left[i])
        if n <= 0 or self.stopped:
            return
        if self.left is not None:
            self.left[i] -= n
        self.pending[self.collector.workers[i].collect.remote(n, self.collector.weights_version)] = (i, n)

    def stop(self) -> None:
        """Submit no more chunks."""
        self.stopped = True

    def next(self) -> ChunkInfo | None:
        """Wait for a chunk and merge it; None when its worker had died (it was restarted)."""
        ray = self.collector._ray
        (ref,), _ = ray.wait(list(self.pending), num_returns=1)
        i, n = self.pending.pop(ref)
        try:
            result = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
            # every chunk asked of the dead worker is asked again of its replacement
            lost = [r for r, (w, _) in self.pending.items() if w == i]
            if self.left is not None:
                self.left[i] += n + sum(self.pending[r][1] for r in lost)
            for r in lost:
                del self.pending[r]
            self.collector._restart(i, exc)
            for _ in range(_QUEUED):
                self.submit(i)
            return None
        info = self.collector._merge(i, result)
        self.submit(i)
        return info
