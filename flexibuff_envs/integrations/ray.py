"""Collect experience on many Ray workers into one learner buffer (the ``ray`` extra).

Each worker is a Ray actor that builds its env with the user's ``env_fn``, wraps it with the
recorder of its kind and steps it with the user's policy, in its own process (on any machine of
the cluster). Every ``chunk_steps`` steps it sends the episodes that ended as one `Chunk` of numpy
arrays through Ray's object store; nothing crosses per step. The learner appends each chunk to its
`FlexibleBuffer` (`FlexibleBuffer.extend`) as it arrives, so episodes land whole, with the ``G``,
masks and annotations the worker recorded.

A worker that dies (its process or machine is lost) is replaced by a new one with a fresh seed;
the episodes it had not sent yet (the running one, and those ended since its last chunk) are
lost with it, and nothing of them reaches the learner's buffer.

>>> import ray
>>> from flexibuff_envs.integrations.ray import RayCollector
>>> ray.init(num_cpus=2)                                                    # doctest: +SKIP
>>> collector = RayCollector(lambda: gym.make("CartPole-v1"), n_workers=2)  # doctest: +SKIP
>>> collector.collect(10_000).steps                                         # doctest: +SKIP
10000
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import (
    ArgumentTypeError,
    MissingExtraError,
    WorkerError,
    WorkerTimeoutError,
    needs,
    positive_int,
)
from flexibuff_envs.files.chunk import Chunk, check_layout
from flexibuff_envs.recording.rollout import Policy, steps
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.env_kinds import env_kind

__all__ = ["ChunkInfo", "Collected", "RayCollector"]

#: chunks each worker has queued, so it steps on while the learner merges the one before
_QUEUED = 2


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingExtraError(needs("flexibuff_envs.integrations.ray", "ray", "ray")) from exc
    return ray


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk the learner merged: which worker sent it, what it held, what it cost.

    ``weights_version`` is the `RayCollector.set_weights` call whose weights the worker acted
    with (0: its initial policy); ``seconds`` is the worker's time to collect it.
    """

    worker: int
    steps: int
    episodes: int
    rows: int
    nbytes: int
    weights_version: int
    seconds: float
    merge_seconds: float


@dataclass(frozen=True)
class Collected:
    """What `RayCollector.collect` did: env steps taken, episodes and rows merged into the buffer,
    bytes received, wall time, time spent merging, workers restarted."""

    steps: int
    episodes: int
    rows: int
    nbytes: int
    seconds: float
    merge_seconds: float
    restarts: int
    chunks: list[ChunkInfo]


class _Worker:
    """A Ray actor: one recorded env, stepped by the policy chunk by chunk."""

    def __init__(
        self, env_fn: Callable[[], Any], policy: Policy | None, seed: int, recorder_options: Mapping[str, Any]
    ) -> None:
        from flexibuff_envs.recording import record

        bare = env_fn()
        self.env = record(bare, **recorder_options)  # raises for what is not an env
        kind = str(env_kind(bare))
        self.policy = policy
        torch = sys.modules.get("torch")  # a torch module's unpickling imported torch
        act = torch.no_grad()(policy) if torch is not None and isinstance(policy, torch.nn.Module) else policy
        self.steps = steps(self.env, kind, seed=seed, policy=act)
        self.version = 0

    def describe(self) -> tuple[BufferSpec, float, float]:
        buffer = self.env.buffer
        return buffer.spec, buffer.gamma, buffer.gae_lambda

    def collect(self, n: int) -> tuple[Chunk, int, int, float]:
        """Step at least ``n`` env steps; the episodes that ended, steps taken, weights version,
        seconds."""
        start, done, version = time.perf_counter(), 0, self.version
        for stepped, _ in self.steps:
            done += stepped
            if done >= n:
                break
        return self.env.buffer.take_episodes(), done, version, time.perf_counter() - start

    def set_weights(self, weights: Any, version: int) -> None:
        self.policy.load_state_dict(weights)  # type: ignore[union-attr]
        self.version = version


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
        self._options = {"num_steps": self.chunk_steps + 10_000, **(recorder_options or {})}
        options = {"num_cpus": 1, **(worker_options or {})}
        self._actor = ray.remote(_Worker).options(**options)
        self._weights: Any = None  # the object ref of the last weights broadcast
        self._incarnations = [0] * self.n_workers
        self.workers = [self._start(i) for i in range(self.n_workers)]
        try:  # an env_fn that fails raises here, with the worker's traceback; no worker is left behind
            spec, gamma, gae_lambda = self._describe(start_timeout, options["num_cpus"])
            if buffer is not None:
                check_layout(buffer.spec, spec, "RayCollector: the workers' env")
        except BaseException:
            self.close()
            raise
        self.buffer = (
            buffer
            if buffer is not None
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
        worker = self._actor.remote(self._env_fn, self._policy, seed, self._options)
        if self._weights is not None:
            worker.set_weights.remote(self._weights, self.weights_version)
        return worker

    def _restart(self, i: int, cause: Exception) -> None:
        if self.restarts >= self.max_restarts:
            raise WorkerError(
                f"worker {i} died and the {self.max_restarts} restarts allowed (max_restarts) are used up: {cause}"
            ) from cause
        self._ray.kill(self.workers[i], no_restart=True)
        self.restarts += 1
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

    def _merge(self, i: int, result: tuple[Chunk, int, int, float]) -> ChunkInfo:
        chunk, stepped, version, seconds = result
        start = time.perf_counter()
        appended = self.buffer.extend(chunk, lane=i % self.buffer.spec.n_envs)
        return ChunkInfo(
            worker=i,
            steps=stepped,
            episodes=appended,
            rows=chunk.rows,
            nbytes=chunk.nbytes,
            weights_version=version,
            seconds=seconds,
            merge_seconds=time.perf_counter() - start,
        )

    def close(self) -> None:
        """Stop the workers (their unsent episodes are dropped)."""
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
        self.pending[self.collector.workers[i].collect.remote(n)] = (i, n)

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
