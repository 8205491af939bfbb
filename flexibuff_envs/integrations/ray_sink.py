"""How episodes reach a `ReplayService` shard (the ``ray`` extra): a `Sink` (the limiter's
admission, then the shard's insert, sent again while the shard is lost under it), and the
sources a learner inserts cut into pieces of whole episodes."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import ArgumentTypeError, WorkerError, WorkerTimeoutError
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.integrations.ray import _ray

#: attempts of a call whose shard is lost under it, before giving up
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
                raise WorkerTimeoutError(held_back("an insert", self.timeout, inserted, sampled))

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


def held_back(what: str, timeout: float, inserted: int, sampled: int) -> str:
    return (
        f"ReplayService: {what} waited {timeout:g} s for the rate limiter ({inserted} rows inserted, "
        f"{sampled} sampled): the other side stopped (no collector inserting, or no learner sampling)"
    )


def chunk_of(source: Any) -> Chunk:
    if isinstance(source, Chunk):
        return source
    if isinstance(source, FlexibleBuffer):
        return source.copy_episodes()
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        held = FlexibleBuffer.open(path) if os.path.isdir(path) else FlexibleBuffer.load(path, mmap=True)
        return held.copy_episodes()
    raise ArgumentTypeError(f"insert: source must be a Chunk, a FlexibleBuffer or a path, got {type(source).__name__}")
