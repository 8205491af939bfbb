"""Parquet, the columnar form pandas, polars, Hugging Face ``datasets``, Spark and DuckDB read:
`to_parquet` writes a buffer, buffer file or episode log as long tables, `from_parquet` reads
them back into an equal buffer. Needs ``pip install -e '.[parquet]'`` (pyarrow).

A dataset is a directory of two tables, each split into part files that hold whole episodes
(``part-00000.parquet``, ...; a part never splits an episode, and rows are ordered by episode,
step and agent; `from_parquet` puts back in that order the rows another tool wrote in another,
by those columns, and refuses rows that are not every agent at every step):

- ``agents/``: one row per episode, step and agent (``episode``, ``step``, ``agent`` by name),
  every per-agent field (``obs``, ``obs_``, ``discrete_actions``, ``individual_rewards``,
  ``terminated``, ``truncated``, ``active``, ``action_mask`` with heads joined, ``G``, fields of
  your own, ...). Every agent has a row at every step; ``active`` says whether it was there.
- ``steps/``: one row per episode and step, the fields held once per step (``state``,
  ``state_``, ``global_rewards``, ...).

A value of several numbers is a fixed-size list column (flattened; the schema's metadata keeps
each field's shape and the buffer's layout); observations of bytes (images) are fixed-size
binary columns, so nothing is converted or lost. Categorical observations are one-hot, as
batches show them.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import (
    BufferFileError,
    BufferSaveError,
    EmptyBufferError,
    InvalidArgumentError,
    MissingExtraError,
    needs,
    plain_dtype,
)
from flexibuff_envs.index import episode_table
from flexibuff_envs.index.origins import FIELDS, ORIGIN, checked
from flexibuff_envs.integrations.tables import (
    GLOBAL,
    Block,
    Source,
    Summary,
    blocks,
    into_buffer,
    open_source,
)
from flexibuff_envs.spec import BufferSpec, provenance

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(needs("flexibuff_envs.integrations.parquet", "pyarrow", "parquet")) from error

#: each step's episode and step number, as a table's rows give them
Keys = tuple[np.ndarray, np.ndarray]
#: the schema metadata key holding the buffer's layout
KEY = b"flexibuff_envs"
#: steps of episodes per part file
PART_STEPS = 65_536
#: how parts are written: dictionary encoding for the agent names only (large binary columns
#: gain nothing from it and pay to try), zstd compression (pyarrow's default, snappy, writes
#: frames slower and several times larger)
WRITE_OPTIONS: dict[str, Any] = {"use_dictionary": ["agent"], "compression": "zstd"}
TABLES = ("agents", "steps", "episodes")


def to_parquet(source: Source, directory: str | os.PathLike[str]) -> str:
    """Write the whole episodes of ``source`` (a buffer, or a buffer file or episode log's path,
    read a part at a time) as the Parquet dataset ``directory`` (made; written under a temporary
    name and renamed when whole) and return its path.

    Raises:
        BufferSaveError: ``directory`` exists already, or cannot be written.
        EmptyBufferError: ``source`` holds no whole episode.
    """
    buffer = open_source(source)
    path = os.path.normpath(os.fspath(directory))
    if os.path.exists(path):
        raise BufferSaveError(errno.EEXIST, "a file or directory is there already", path)
    partial = f"{path}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for table in TABLES:
            os.makedirs(os.path.join(partial, table))
        episodes = 0
        origins = episode_table(buffer._index.read()).origins
        for part, block in enumerate(blocks(buffer, PART_STEPS)):
            tables = _tables(block, buffer.spec, episodes)
            held = origins[episodes : episodes + len(block[0])]  # type: ignore[index]
            tables["episodes"] = {"episode": pa.array(np.arange(episodes, episodes + len(held)))}
            tables["episodes"].update({name: pa.array(held[name]) for name in FIELDS})
            for table, columns in tables.items():
                if columns:
                    meta = {KEY: json.dumps(_layout(buffer, block)).encode()}
                    pq.write_table(
                        pa.table(columns).replace_schema_metadata(meta),
                        os.path.join(partial, table, f"part-{part:05d}.parquet"),
                        **WRITE_OPTIONS,
                    )
            episodes += len(block[0])
        if not episodes:
            raise EmptyBufferError(
                f"to_parquet: {'the buffer' if source is buffer else source} holds no whole ended episode"
            )
        os.rename(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return path


def _layout(buffer: FlexibleBuffer, block: Block) -> dict[str, Any]:
    arrays = block[1]
    return {
        "format": 1,
        "spec": buffer.spec.to_dict(),
        "gamma": buffer.gamma,
        "gae_lambda": buffer.gae_lambda,
        "sessions": buffer.sessions,
        "fields": {
            name: {"shape": list(values.shape[1 if name in GLOBAL else 2 :]), "dtype": values.dtype.name}
            for name, values in arrays.items()
        },
    }


def _tables(block: Block, spec: BufferSpec, first: int) -> dict[str, dict[str, pa.Array]]:
    """A block's columns, per table (keys in column order)."""
    lengths, arrays = block
    steps, n = int(lengths.sum()), spec.n_agents
    episode = np.repeat(np.arange(first, first + len(lengths)), lengths)
    step = np.arange(steps) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    agents: dict[str, pa.Array] = {
        "episode": pa.array(np.repeat(episode, n)),
        "step": pa.array(np.repeat(step, n).astype(np.int32)),
        "agent": pa.DictionaryArray.from_arrays(
            pa.array(np.tile(np.arange(n, dtype=np.int32), steps)), pa.array(list(spec.agent_ids))
        ),
    }
    per_step: dict[str, pa.Array] = {"episode": pa.array(episode), "step": pa.array(step.astype(np.int32))}
    for name, values in arrays.items():
        if name in GLOBAL:
            per_step[name] = _column(values.reshape(steps, -1) if values.ndim > 1 else values)
        else:  # [agents, steps, ...] -> a row per step and agent
            rows = np.moveaxis(values, 0, 1).reshape(steps * n, -1)
            agents[name] = _column(rows if values.ndim > 2 else rows[:, 0])
    return {"agents": agents, "steps": per_step if len(per_step) > 2 else {}}


def _column(values: np.ndarray) -> pa.Array:
    """Rows of one value (a plain column) or of several (fixed-size list; bytes: fixed-size binary)."""
    if values.ndim == 1:
        return pa.array(values)
    values = np.ascontiguousarray(values)
    width = values.shape[1]
    if values.dtype in (np.uint8, np.int8):
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, pa.py_buffer(values)])
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)


def from_parquet(directory: str | os.PathLike[str], **buffer_options: Any) -> FlexibleBuffer:
    """A buffer holding every episode of the Parquet dataset ``directory`` (`to_parquet`'s), equal
    to the one exported: the same layout, fields, ``G`` and discounts (``buffer_options`` go to
    `FlexibleBuffer.from_spec`: ``num_steps``, ``seed``, ...; ``log=DIR`` appends every episode
    to that episode log too, a part at a time).

    Raises:
        BufferFileError: ``directory`` is not such a dataset, or a part of it disagrees with its
            layout (the file and the problem named).
    """
    path = os.fspath(directory)
    parts = _parts(path)
    layout = _read_layout(parts[0][0])
    spec = BufferSpec.from_dict(layout["spec"])
    fields = layout["fields"]
    buffer_options.setdefault("gamma", layout["gamma"])
    buffer_options.setdefault("gae_lambda", layout["gae_lambda"])
    try:
        rows = sum(pq.ParquetFile(agents).metadata.num_rows for agents, _ in parts) // spec.n_agents
    except (OSError, pa.ArrowException) as exc:
        raise BufferFileError(f"{path}: a part cannot be read ({exc})") from None
    width = int(np.prod(fields["continuous_log_probs"]["shape"])) if "continuous_log_probs" in fields else 0
    return into_buffer(
        spec,
        fields.keys(),
        _blocks(parts, spec, fields),
        rows=rows,
        where=path,
        log_prob_width=width,
        sessions=layout["sessions"],
        origins=_origins(parts, len(layout["sessions"])),
        **buffer_options,
    )


def _origins(parts: list[tuple[str, str | None]], sessions: int) -> np.ndarray | None:
    """Each episode's origin, from the parts' ``episodes`` tables (None: a dataset without them;
    an implausible origin reads as unknown)."""
    files = [os.path.join(os.path.dirname(os.path.dirname(a)), "episodes", os.path.basename(a)) for a, _ in parts]
    if not all(os.path.exists(f) for f in files):
        return None
    out = []
    for file in files:
        try:
            table = pq.read_table(file, columns=list(FIELDS))
            records = np.zeros(table.num_rows, dtype=ORIGIN)
            for name in FIELDS:
                records[name] = table.column(name).to_numpy()
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as exc:
            raise BufferFileError(f"{file}: not a table of episode origins ({exc})") from None
        out.append(records)
    return checked(np.concatenate(out), sessions)


def _parts(path: str) -> list[tuple[str, str | None]]:
    """Each part's ``agents`` file and its ``steps`` file (None when the dataset has none)."""
    agents = os.path.join(path, "agents")
    names = sorted(n for n in os.listdir(agents) if n.endswith(".parquet")) if os.path.isdir(agents) else []
    if not names:
        raise BufferFileError(f"{path}: not a Parquet dataset of flexibuff_envs (no agents/*.parquet)")
    steps = os.path.join(path, "steps")
    return [
        (os.path.join(agents, name), os.path.join(steps, name) if os.path.exists(os.path.join(steps, name)) else None)
        for name in names
    ]


def _read_layout(file: str) -> dict[str, Any]:
    try:
        meta = pq.read_schema(file).metadata or {}
        layout = json.loads(meta[KEY])
        BufferSpec.from_dict(layout["spec"])
        if layout["format"] != 1:
            raise InvalidArgumentError(f"format {layout['format']}; this reads 1")
        provenance.sessions(layout.setdefault("sessions", []), "sessions")
        for name, field in layout["fields"].items():
            plain_dtype(f"field {name!r} dtype", field["dtype"])
            if not all(isinstance(n, int) and 0 < n < 1 << 31 for n in field["shape"]):
                raise InvalidArgumentError(f"field {name!r} has shape {field['shape']!r}")
        return layout  # type: ignore[no-any-return]
    except (OSError, KeyError, TypeError, ValueError, pa.ArrowException) as exc:
        raise BufferFileError(f"{file}: not a part of a flexibuff_envs Parquet dataset ({exc!r})") from None


def _blocks(parts: list[tuple[str, str | None]], spec: BufferSpec, fields: dict[str, Any]) -> Iterator[Block]:
    n = spec.n_agents
    seen = np.zeros(0, dtype=np.int64)  # the episodes of the parts before
    for agents_file, steps_file in parts:
        try:
            tables = {"agents": pq.read_table(agents_file)}
            if steps_file is not None:
                tables["steps"] = pq.read_table(steps_file)
        except (OSError, pa.ArrowException) as exc:
            raise BufferFileError(f"{agents_file}: cannot be read ({exc})") from None
        if steps_file is None and any(name in GLOBAL for name in fields):
            raise BufferFileError(f"{os.path.dirname(os.path.dirname(agents_file))}: no steps/ table for {agents_file}")
        rows = tables["agents"].num_rows
        if rows % n:
            raise BufferFileError(f"{agents_file}: {rows:,} rows is no whole number of steps of {n} agents")
        tables["agents"], keys = _in_order(tables["agents"], agents_file, spec.agent_ids)
        if "steps" in tables:
            tables["steps"] = _in_order(tables["steps"], str(steps_file), None, keys)[0]
        episode = keys[0]
        if np.isin(episode, seen).any():
            raise BufferFileError(
                f"{agents_file}: holds rows of an episode an earlier part holds; a part holds whole episodes"
            )
        seen = np.concatenate([seen, np.unique(episode)])
        cut = np.flatnonzero(np.diff(episode)) + 1
        lengths = np.diff(np.concatenate([[0], cut, [len(episode)]]))
        arrays = {}
        for name, field in fields.items():
            table = tables["steps" if name in GLOBAL else "agents"]
            if name not in table.column_names:
                raise BufferFileError(f"{steps_file if name in GLOBAL else agents_file}: no column {name!r}")
            where = f"{steps_file if name in GLOBAL else agents_file}: column {name!r}"
            values = _values(table.column(name), field, where)
            arrays[name] = values if name in GLOBAL else np.moveaxis(values.reshape(-1, n, *values.shape[1:]), 1, 0)
        yield lengths, arrays


def _in_order(
    table: pa.Table, file: str, agents: tuple[str, ...] | None, keys_of: Keys | None = None
) -> tuple[pa.Table, Keys]:
    """``table``'s rows ordered by episode, step and (``agents`` given) agent in the env's order,
    as `to_parquet` writes them, whatever order another tool wrote them in, and each step's
    ``(episode, step)``; a ``steps`` table must hold the steps ``keys_of`` (its ``agents``
    table's), no more, no fewer.

    Raises:
        BufferFileError: a key column is missing or not integers, an agent is not the
            layout's, or the rows are not every agent at every step of each episode from 0 on.
    """
    names = ("episode", "step") if agents is None else ("episode", "step", "agent")
    missing = [name for name in names if name not in table.column_names]
    if missing:
        raise BufferFileError(f"{file}: no column {missing[0]!r}, which orders its rows")
    try:
        keys = [table.column(name).to_numpy().astype(np.int64, casting="safe") for name in names[:2]]
        if agents is not None:
            index = pc.index_in(table.column("agent"), value_set=pa.array(agents, pa.string()))
            if index.null_count:
                raise BufferFileError(f"{file}: an agent is not one of the layout's {list(agents)}")
            keys.append(index.to_numpy().astype(np.int64))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise BufferFileError(f"{file}: its {', '.join(names)} columns are not integers and names ({exc})") from None
    order = np.lexsort(keys[::-1])
    if (order != np.arange(len(order))).any():
        table, keys = table.take(order), [key[order] for key in keys]
    n = 1 if agents is None else len(agents)
    by_step = [key.reshape(-1, n) for key in keys]
    episode, step = by_step[0][:, 0], by_step[1][:, 0]
    first = np.flatnonzero(np.diff(episode, prepend=episode[:1] - 1))  # each episode's first step
    since = np.arange(len(episode)) - np.repeat(first, np.diff(np.append(first, len(episode))))
    whole = (
        all((key == key[:, :1]).all() for key in by_step[:2])
        and (agents is None or (by_step[2] == np.arange(n)).all())
        and np.array_equal(step, since)
        and (keys_of is None or (np.array_equal(episode, keys_of[0]) and np.array_equal(step, keys_of[1])))
    )
    if not whole:
        raise BufferFileError(f"{file}: its rows are not every agent at every step of each episode, from step 0 on")
    return table, (episode, step)


def _values(column: pa.ChunkedArray, field: dict[str, Any], where: str) -> np.ndarray:
    """A column's rows as numpy, in the field's shape and dtype."""
    shape, dtype = tuple(field["shape"]), np.dtype(field["dtype"])
    array = column.combine_chunks()
    width = int(np.prod(shape))
    if pa.types.is_fixed_size_binary(array.type):
        flat = np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array) * width, offset=array.offset * width)
    elif pa.types.is_fixed_size_list(array.type):
        flat = array.flatten().to_numpy(zero_copy_only=False)
    else:
        flat = array.to_numpy(zero_copy_only=False)
    if flat.size != len(array) * width:
        raise BufferFileError(f"{where} holds {flat.size:,} values for {len(array):,} rows of {shape}")
    return flat.astype(dtype, copy=False).reshape(len(array), *shape)


def is_dataset(path: str) -> bool:
    """Whether ``path`` looks like a Parquet dataset of ours (an ``agents/`` table)."""
    return os.path.isdir(os.path.join(path, "agents"))


def summary(path: str) -> Summary:
    """What the Parquet dataset ``path`` holds, reading its ``episode`` column only."""
    parts = _parts(path)
    layout = _read_layout(parts[0][0])
    spec = BufferSpec.from_dict(layout["spec"])
    episodes = rows = 0
    for agents_file, _ in parts:
        try:
            episode = pq.read_table(agents_file, columns=["episode"]).column("episode").to_numpy()
        except (OSError, KeyError, pa.ArrowException) as exc:
            raise BufferFileError(f"{agents_file}: cannot be read ({exc})") from None
        episodes += len(np.unique(episode))
        rows += len(episode)
    return Summary(
        "Parquet dataset",
        spec.agent_ids,
        episodes,
        rows // spec.n_agents,
        {name: f"{field['shape']} {field['dtype']}" for name, field in sorted(layout["fields"].items())},
        tuple(layout["sessions"]),
    )
