"""A `RayCollector` worker (the ``ray`` extra): a Ray actor stepping one recorded env with the
policy, chunk by chunk, handing each chunk to the learner or inserting it into a
`ReplayService` shard itself."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.recording.rollout import Policy, steps
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.env_kinds import env_kind

if TYPE_CHECKING:
    from flexibuff_envs.integrations.ray_replay import Sink


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk the learner merged: which worker sent it, what it held, what it cost.

    ``weights_version`` is the `RayCollector.set_weights` call whose weights the worker acted
    with (0: its initial policy); ``seconds`` is the worker's time to collect it; ``returns``
    ``[episodes, n_agents]`` each ended episode's return per agent. With a `ReplayService`,
    ``episodes`` are those the service appended and ``merge_seconds`` is 0.
    """

    worker: int
    steps: int
    episodes: int
    rows: int
    nbytes: int
    weights_version: int
    seconds: float
    merge_seconds: float
    returns: np.ndarray


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


class Worker:
    """A Ray actor: one recorded env, stepped by the policy chunk by chunk (threaded: `run`
    goes on while `stop`, `set_weights` and `report` are called)."""

    def __init__(
        self,
        env_fn: Callable[[], Any],
        policy: Policy | None,
        seed: int,
        recorder_options: Mapping[str, Any],
        sink: Sink | None,
    ) -> None:
        from flexibuff_envs.recording import record

        bare = env_fn()
        self.env = record(bare, **recorder_options)  # raises for what is not an env
        kind = str(env_kind(bare))
        self.policy = policy
        torch = sys.modules.get("torch")  # a torch module's unpickling imported torch
        act = torch.no_grad()(policy) if torch is not None and isinstance(policy, torch.nn.Module) else policy
        self.steps = steps(self.env, kind, seed=seed, policy=act)
        self.sink = sink
        self.version = 0
        self.weights: tuple[Any, int] | None = None  # the newest weights, loaded before the next chunk
        self.stopped: set[int] = set()  # the `run`s `stop` ended (a chunk the limiter holds back is dropped)
        self.run_now = -1  # the `run` going on
        self.reported: list[Result] = []
        self.lock = threading.Lock()  # the weights and reports, shared with the caller's thread
        self.arrived = threading.Condition(self.lock)  # weights came
        self.latest = 0  # the newest weights version received
        self.stepping = threading.Lock()

    def describe(self) -> tuple[BufferSpec, float, float]:
        buffer = self.env.buffer
        return buffer.spec, buffer.gamma, buffer.gae_lambda

    def collect(self, n: int, version: int = 0) -> Result:
        """Step at least ``n`` env steps with weights ``version`` or newer, and hand out the
        episodes that ended (to the sink, when there is one). Calls may run out of the order
        they were made in (a threaded actor): the learner names the weights it sent before."""
        with self.arrived:
            self.arrived.wait_for(lambda: self.latest >= version)
        with self.stepping:  # one chunk at a time, whichever thread asks
            return self._collect(n)

    def _collect(self, n: int) -> Result:
        with self.lock:
            weights, self.weights = self.weights, None
        if weights is not None:
            self.policy.load_state_dict(weights[0])  # type: ignore[union-attr]
            self.version = weights[1]
        start, done, version = time.perf_counter(), 0, self.version
        for stepped, _ in self.steps:
            done += stepped
            if done >= n:
                break
        buffer = self.env.buffer
        returns = buffer.episode_stats()["returns"]
        chunk = buffer.take_episodes()
        seconds = time.perf_counter() - start
        if self.sink is None:
            return Result(chunk, done, version, seconds, None, chunk.rows, chunk.nbytes, returns)
        appended = self.sink.insert(chunk, lambda: self.run_now in self.stopped)
        return Result(None, done, version, seconds, appended, chunk.rows, chunk.nbytes, returns)

    def run(self, n: int, token: int) -> None:
        """Collect chunks of ``n`` steps into the sink until `stop` names ``token`` (it may
        come first: a threaded actor's calls run in any order)."""
        self.run_now = token
        try:
            while token not in self.stopped:
                result = self.collect(n)
                with self.lock:
                    self.reported.append(result)
        finally:
            self.run_now = -1

    def stop(self, token: int) -> None:
        self.stopped.add(token)

    def report(self) -> list[Result]:
        """What `run` collected since the last report."""
        with self.lock:
            out, self.reported = self.reported, []
        return out

    def set_weights(self, weights: Any, version: int) -> None:
        with self.arrived:
            if version > self.latest:
                self.weights, self.latest = (weights, version), version
                self.arrived.notify_all()


class Result(NamedTuple):
    """A worker's chunk (None: it went to the sink) and what it cost."""

    chunk: Chunk | None
    steps: int
    version: int
    seconds: float
    appended: int | None  # episodes the sink appended (None: no sink)
    rows: int
    nbytes: int
    returns: np.ndarray  # [episodes, n_agents]
