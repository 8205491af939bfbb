"""Episode logs as a Ray Data dataset, and back (the ``ray`` extra): `read_logs` reads any number
of logs, each on the node whose disk holds it, as a ``ray.data.Dataset`` of transitions or of
whole episodes; `write_logs` writes a dataset of episodes to a log.

Each log is read by tasks on its node (`NodeAffinitySchedulingStrategy`), a range of whole
episodes each (about ``rows_per_task`` rows), handing a block of about ``rows_per_block`` rows at
a time (a streaming task): a task opens the log mapped and read-only, once, as a
reader beside a running recording does (only whole commits: a torn tail is never read, and the
log is never written), gathers its range once and hands Ray Data Arrow blocks. Nothing is read
twice, and no row crosses the network but to the task that consumes it.

A transition is a row: ``log`` (its place in ``paths``), ``episode`` (its number in that log),
``step``, and every recorded field as a tensor: a per-agent field ``[n_agents, ...]`` (``[...]``
for one agent), as a batch gives it. An episode is a row: ``log``, ``episode``, ``length``, and
each field as a tensor of its steps (``[length, ...]``; per agent ``[length, n_agents, ...]``).

>>> ds = read_logs(["runs/a", "runs/b"])                                  # doctest: +SKIP
>>> for batch in ds.iter_torch_batches(batch_size=256): ...               # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, positive_int
from flexibuff_envs.index import EpisodeTable, episode_ranges, episode_table
from flexibuff_envs.integrations.ray import _ray
from flexibuff_envs.integrations.tables import GLOBAL, episode_arrays, into_buffer
from flexibuff_envs.spec import BufferSpec

__all__ = ["read_logs", "write_logs"]

#: what a dataset row names besides the fields
KEYS = ("log", "episode", "step", "length")


def read_logs(
    paths: Sequence[str | os.PathLike[str]],
    *,
    unit: str = "transition",
    nodes: Mapping[str, str] | None = None,
    rows_per_task: int = 1 << 20,
    rows_per_block: int = 1 << 16,
) -> Any:
    """A ``ray.data.Dataset`` of the whole episodes of the logs ``paths`` (`module docs`): one
    row per transition (``unit="transition"``) or per episode (``unit="episode"``), in the order
    of ``paths``, each log's episodes in order. ``nodes``: the Ray node id whose disk holds each
    path (by default, any node reads any path: a disk every node shares, or one machine).

    Raises:
        InvalidArgumentError: an unknown ``unit``, or logs of different layouts.
    """
    ray = _ray()
    if unit not in ("transition", "episode"):
        raise InvalidArgumentError(f"read_logs: unit must be 'transition' or 'episode', got {unit!r}")
    positive_int("rows_per_task", rows_per_task)
    positive_int("rows_per_block", rows_per_block)
    where = {} if nodes is None else {os.path.abspath(k): v for k, v in nodes.items()}
    plan = ray.remote(_lengths)
    read = ray.remote(num_returns="streaming")(_read)
    names = [os.path.abspath(p) for p in paths]  # a relative path: the driver's, on every node
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]} if where else set()
    for name in names:
        if name in where and where[name] not in alive:
            raise InvalidArgumentError(
                f"read_logs: {name} is on node {where[name]}, which is not in the cluster (gone, or never was); "
                "its log is not read elsewhere"
            )
    placed = [_placed(ray, where.get(name)) for name in names]
    plans = ray.get([plan.options(**how).remote(name) for name, how in zip(names, placed)])
    layouts = {json for _, json in plans}
    if len(layouts) > 1:
        raise InvalidArgumentError("read_logs: the logs differ in layout; read each on its own")
    refs = []
    for k, (name, how, (lengths, _)) in enumerate(zip(names, placed, plans)):
        tasks = [
            read.options(**how).remote(name, k, lo, hi, unit, rows_per_block)
            for lo, hi in episode_ranges(lengths, rows_per_task)
        ]
        refs += [ref for task in tasks for ref in task]  # each task's blocks, as it makes them
    return ray.data.from_arrow_refs(refs) if refs else ray.data.from_items([])


def _placed(ray: Any, node: str | None) -> dict[str, Any]:
    """The options of a task that must run on ``node`` (None: anywhere)."""
    if node is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def _lengths(path: str) -> tuple[np.ndarray, str]:
    """The log ``path``'s episode lengths and its layout (read on its node)."""
    buffer = FlexibleBuffer.open(path, settle=False)
    return episode_table(buffer._index.read()).lengths, str(buffer.spec.to_dict())


def _read(path: str, log: int, lo: int, hi: int, unit: str, rows: int) -> Iterator[Any]:
    """Episodes ``[lo, hi)`` of the log ``path`` (opened once) as Arrow tables of ``unit`` rows,
    about ``rows`` rows each."""
    buffer = FlexibleBuffer.open(path, settle=False)
    table = episode_table(buffer._index.read())
    for a, b in episode_ranges(table.lengths[lo:hi], rows):
        yield _block(buffer, table, log, lo + a, lo + b, unit)


def _block(buffer: FlexibleBuffer, table: EpisodeTable, log: int, lo: int, hi: int, unit: str) -> Any:
    """Episodes ``[lo, hi)`` of ``buffer`` (a log's) as an Arrow table of ``unit`` rows."""
    import pyarrow as pa
    from ray.data.extensions import ArrowTensorArray, ArrowVariableShapedTensorArray

    some = EpisodeTable(table.starts[lo:hi], table.ends[lo:hi], table.offsets[lo:hi], table.capacity)
    lengths = some.lengths
    arrays = episode_arrays(buffer.gather(some.all_rows()[0]), buffer.spec)
    rows = {name: _steps_first(name, values, buffer.spec.n_agents) for name, values in arrays.items()}
    if unit == "transition":
        columns: dict[str, Any] = {
            "log": pa.array(np.full(int(lengths.sum()), log, np.int32)),
            "episode": pa.array(np.repeat(np.arange(lo, hi), lengths)),
            "step": pa.array(
                (np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
            ),
        }
        for name, values in rows.items():
            columns[name] = pa.array(values) if values.ndim == 1 else ArrowTensorArray.from_numpy(values)
        return pa.table(columns)
    cuts = np.cumsum(lengths)[:-1]
    columns = {
        "log": pa.array(np.full(hi - lo, log, np.int32)),
        "episode": pa.array(np.arange(lo, hi)),
        "length": pa.array(lengths),
    }
    for name, values in rows.items():
        columns[name] = ArrowVariableShapedTensorArray.from_numpy(np.split(values, cuts))
    return pa.table(columns)


def _steps_first(name: str, values: np.ndarray, n_agents: int) -> np.ndarray:
    """An `episode_arrays` array with its steps first: ``[steps, n_agents, ...]`` for a per-agent
    field (``[steps, ...]`` for one agent), ``[steps, ...]`` for a global one."""
    if name in GLOBAL:
        return values
    return values[0] if n_agents == 1 else np.moveaxis(values, 0, 1)


def write_logs(
    dataset: Any, directory: str | os.PathLike[str], spec: BufferSpec, *, gamma: float = 0.99, gae_lambda: float = 0.95
) -> FlexibleBuffer:
    """Append the episodes of ``dataset`` (rows as `read_logs` gives them with ``unit="episode"``,
    a field per column) to the log ``directory`` (made, or continued) of layout ``spec``, a batch
    of episodes at a time, each as recorded (``G`` computed with ``gamma`` unless the rows give
    it). Returns the buffer that wrote them (its ring holds the last batch)."""
    fields = [name for name in dataset.schema().names if name not in KEYS]
    total = int(dataset.sum("length")) if dataset.count() else 0
    blocks = (_episodes_block(batch, fields, spec.n_agents) for batch in dataset.iter_batches(batch_format="numpy"))
    return into_buffer(
        spec,
        fields,
        blocks,
        rows=max(total, 1),
        where=os.fspath(directory),
        log=directory,
        num_steps=1 << 16,
        gamma=gamma,
        gae_lambda=gae_lambda,
    )


def _episodes_block(
    batch: Mapping[str, Any], fields: Sequence[str], n_agents: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A batch of episode rows as `into_buffer` takes a block: lengths, and each field's rows back
    to back, laid out as `episode_arrays` gives them."""
    lengths = np.asarray(batch["length"], dtype=np.int64)
    arrays = {}
    for name in fields:
        values = np.concatenate([np.asarray(v) for v in batch[name]])
        if name not in GLOBAL:
            values = values[None] if n_agents == 1 else np.moveaxis(values, 1, 0)
        arrays[name] = values
    return lengths, arrays
