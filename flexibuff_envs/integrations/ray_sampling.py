"""The sampling half of `ReplayService` (the ``ray`` extra): batches drawn over every shard as
one buffer of all their rows would draw them, ahead on a thread (`Sampling.stream`), and
priorities sent back to the shards and starts that drew them."""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from flexibuff_envs.batch import FlexiBatch, torch_converter
from flexibuff_envs.errors import InvalidArgumentError, WorkerError, WorkerTimeoutError, positive_int
from flexibuff_envs.integrations.ray_shard import RateLimiter, join
from flexibuff_envs.integrations.ray_sink import ATTEMPTS, held_back
from flexibuff_envs.sampling.samplers import as_array, checked_weights

#: rows a shard may hold: ``idx`` keeps a row in its low 40 bits, the shard's start above them
ROW_BITS = 40


class _Cancelled(Exception):
    """A sample whose `stream` was left while the limiter held it back (nothing admitted)."""


class Sampling:
    """The sampling half of `ReplayService`."""

    if TYPE_CHECKING:  # given by `ReplayService`
        _ray: Any
        shards: list[Any]
        n_shards: int
        spec: Any
        limiter: RateLimiter | None
        rng: np.random.Generator
        _limiter: Any
        _lock: threading.Lock
        _starts: list[list[str]]
        _known: dict[str, tuple[int, int]]
        _shares: dict[str, dict[int, float]]
        _highest: dict[str, float]

        @property
        def _timeout(self) -> float: ...

        def _table(self, table: str) -> str: ...

        def _serving(self) -> list[int]: ...

        def _replies(self, refs: dict[int, Any]) -> dict[int, Any]: ...

        def _start_of(self, k: int, incarnation: str) -> int: ...

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
        ``beta``, ``n_step`` and ``fields`` as there), once the rate limiter admits them."""
        return self._sample(batch_size, table, prioritized, beta, n_step, fields, as_torch, device, None)

    def _sample(
        self,
        batch_size: int,
        table: str,
        prioritized: bool,
        beta: float,
        n_step: int | None,
        fields: Collection[str] | None,
        as_torch: bool,
        device: Any,
        cancelled: Callable[[], bool] | None,
    ) -> FlexiBatch:
        n = positive_int("batch_size", batch_size)
        self._table(table)
        if n_step is not None:
            positive_int("n_step", n_step)
        if not (isinstance(beta, (int, float)) and 0 <= beta < math.inf):
            raise InvalidArgumentError(f"beta must be a finite number >= 0 (1 corrects fully), got {beta!r}")
        band = self.limiter.tolerance if self.limiter is not None and self.limiter.samples_per_insert else math.inf
        if n > 2 * band:
            raise InvalidArgumentError(
                f"batch_size {n} is wider than the rate limiter's band (2 * tolerance = {2 * band:g} rows): "
                "no sample of it could ever be admitted; raise tolerance"
            )
        options = {"prioritized": prioritized, "beta": beta, "n_step": n_step, "fields": fields}
        admission = None if self._limiter is None else self._admit(table, n)
        for _ in range(ATTEMPTS):
            if cancelled is not None and cancelled():
                raise _Cancelled
            batch = self._draw(n, table, options, admission, cancelled)
            if batch is not None:
                if as_torch:
                    convert = torch_converter(device)
                    batch = FlexiBatch(**{name: convert(name, value) for name, value in batch.__dict__.items()})
                return batch
            admission = None  # admitted once: a try again is the same sample
        raise WorkerError(f"ReplayService: shards of table {table!r} were lost under {ATTEMPTS} samples in a row")

    def _admit(self, table: str, n: int) -> Any:
        """The limiter's answer to a sample of ``n`` rows (a second's wait), under way."""
        return self._limiter.sample.remote(table, n, 1.0, self._known.get(table, (0, 0)))  # type: ignore[union-attr]

    def _admitted(self, table: str, n: int, answer: Any, cancelled: Callable[[], bool] | None) -> float:
        """Wait for the limiter to admit a sample of ``n`` rows (``answer``: its first answer,
        under way), a second at a time; the seconds it took (raises when ``timeout`` passed, or
        `_Cancelled` when ``cancelled()`` turned true: nothing was admitted)."""
        began = time.monotonic()
        while True:
            ok, inserted, sampled = self._ray.get(answer)
            self._known[table] = (inserted, sampled)
            if ok:
                return time.monotonic() - began
            if cancelled is not None and cancelled():
                raise _Cancelled
            if time.monotonic() - began >= self._timeout:
                raise WorkerTimeoutError(held_back("a sample", self._timeout, inserted, sampled))
            answer = self._admit(table, n)

    def stream(self, batch_size: int = 256, *, depth: int = 2, **options: Any) -> Iterator[FlexiBatch]:
        """Batches as `sample` draws them (``options`` as there), ``depth`` drawn ahead on a
        thread while the caller trains on the one before: the round trips to the limiter and the
        shards overlap the learner's work. Priorities updated meanwhile reach the batches drawn
        after the update (at most ``depth`` batches late, as in Ape-X's learner). Leave the loop
        to stop; the batches drawn ahead are dropped (the limiter counted them)."""
        ahead: queue.Queue[Any] = queue.Queue(maxsize=positive_int("depth", depth))
        stop = threading.Event()
        chosen = {
            "table": "default",
            "prioritized": False,
            "beta": 0.4,
            "n_step": None,
            "fields": None,
            "as_torch": False,
            "device": None,
            **options,
        }

        def fill() -> None:
            try:
                while not stop.is_set():
                    try:
                        batch = self._sample(batch_size, cancelled=stop.is_set, **chosen)
                    except _Cancelled:
                        return
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
            while thread.is_alive():  # a wait for room, or for the limiter, sees the stop within a second
                with contextlib.suppress(queue.Empty):
                    ahead.get(timeout=0.1)

    def _draw(
        self, n: int, table: str, options: Mapping[str, Any], admission: Any, cancelled: Callable[[], bool] | None
    ) -> FlexiBatch | None:
        """One try, in one round trip most often: every shard serving draws a little more than
        its share was at the last sample while the limiter is asked; the shares are then drawn
        (multinomially, from the masses each shard had at its draw) and each shard's rows taken
        from its draws (drawn with replacement, independently: any of them are a draw of its
        share), a shard that drew too few asked for the rest. None when a shard was lost."""
        serving = self._serving()
        last = self._shares.get(table, {})
        share = np.array([last.get(k, 1.0) for k in serving])
        share = share / share.sum() if share.sum() > 0 else np.full(len(serving), 1 / len(serving))
        asked = np.where(share > 0, np.minimum(n, np.ceil(n * share + 3 * np.sqrt(n * share * (1 - share))) + 1), 0)

        def draw(counts: Mapping[int, int]) -> dict[int, Any]:
            return {
                k: self.shards[k].draw.remote(table, int(c), options, self._highest.get(table, 1.0))
                for k, c in counts.items()
            }

        refs = draw(dict(zip(serving, asked)))
        if admission is not None and self._admitted(table, n, admission, cancelled) > 0.05:  # held: draw anew
            refs = draw(dict(zip(serving, asked)))
        for _ in range(100):  # admitted, the rows it counted may still be on their way to a shard
            replies = self._replies(refs)
            if len(replies) < len(refs):
                return None
            mass = np.array([reply[3] for reply in replies.values()])
            if mass.sum() > 0 or admission is None:
                break
            time.sleep(0.01)
            refs = draw(dict(zip(serving, asked)))
        if mass.sum() <= 0:
            raise InvalidArgumentError(f"ReplayService: table {table!r} holds no rows to sample yet")
        self._shares[table] = dict(zip(replies, mass))
        counts = dict(zip(replies, self.rng.multinomial(n, mass / mass.sum())))
        drawn = {k: [] if reply[1] is None else [reply] for k, reply in replies.items()}
        short = {k: c - sum(len(r[1].idx) for r in drawn[k]) for k, c in counts.items()}
        refs = draw({k: c for k, c in short.items() if c > 0})
        more = self._replies(refs)
        if len(more) < len(refs):
            return None
        for k, reply in more.items():
            drawn[k].append(reply)
        if any(sum(len(r[1].idx) for r in drawn[k]) < c for k, c in counts.items()):
            return None  # a shard came back empty under this sample: try again
        # the smallest priority over the whole replay: of every shard holding rows, drawn from or not
        minimum = min(reply[4] for reply in (*replies.values(), *more.values()) if reply[2] > 0)
        batches, taken, left = [], [], dict(counts)
        for k, count in counts.items():
            for incarnation, batch, _, _, shard_min in drawn[k] if count else ():
                start = self._start_of(k, incarnation)
                batch.idx = ((start << ROW_BITS) + batch.idx) * self.n_shards + k
                if options["prioritized"]:
                    batch.weights = batch.weights * np.float32((shard_min / minimum) ** -options["beta"])
                batches.append(batch)
                taken.append(min(len(batch.idx), left[k]))
                left[k] -= taken[-1]
        return FlexiBatch(**join(batches, self.spec.n_agents, self.rng.permutation(n), taken))

    def update_priorities(self, idx: Any, priorities: Any, *, table: str = "default") -> None:
        """New priorities of the rows ``idx`` of a prioritized sample (its ``batch.idx``); either
        may be a torch tensor. Rows of a shard that was started again since they were drawn are
        left out (they are other rows now).

        Raises:
            InvalidArgumentError: sizes differ, or a priority is negative or not finite.
        """
        self._table(table)
        rows = as_array(idx).reshape(-1)
        if rows.dtype.kind not in "iu":
            raise InvalidArgumentError(f"update_priorities: idx must be a batch's integer idx, got {rows.dtype}")
        values = as_array(priorities).reshape(-1)
        if values.size not in (1, rows.size):
            raise InvalidArgumentError(
                f"update_priorities: {values.size} priorities for {rows.size} rows (idx and priorities differ in size)"
            )
        values = checked_weights("update_priorities", "priorities", values if values.size > 1 else values[0], rows)
        if values.size:
            self._highest[table] = max(self._highest.get(table, 1.0), float(values.max()))
        rows = rows.astype(np.int64, copy=False)
        shard, rest = rows % self.n_shards, rows // self.n_shards
        start, row = rest >> ROW_BITS, rest & ((1 << ROW_BITS) - 1)
        with self._lock:
            starts = [list(s) for s in self._starts]
        if rows.size and (rows.min() < 0 or (start >= np.array([len(s) for s in starts])[shard]).any()):
            raise InvalidArgumentError("update_priorities: idx holds values no sample of this service gave (batch.idx)")
        highest = self._highest.get(table, 1.0)
        pairs, which = np.unique(np.stack([shard, start]), axis=1, return_inverse=True)  # (shard, start) met
        for j, (k, first) in enumerate(pairs.T.tolist()):  # one call a shard's start, not a row
            mine = which.reshape(-1) == j
            self.shards[k].update_priorities.remote(table, starts[k][first], row[mine], values[mine], highest)
