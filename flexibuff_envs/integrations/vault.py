"""flashbax Vaults, the form OG-MARL publishes its offline multi-agent datasets in: `to_vault`
writes a buffer, buffer file or episode log as one, `from_vault` reads any such vault into a
buffer, with TensorStore alone (no JAX). Needs ``pip install -e '.[vault]'``.

A vault is a directory ``<vault_name>/<vault_uid>/`` holding ``metadata.json`` (the tree of
arrays: their shapes and dtypes) and one zarr array per leaf in an OCDBT store, each laid out
``(B, T, ...)``, plus ``vault_index``, how much of ``T`` is filled. OG-MARL's leaves, ``B = 1``
and episodes packed along ``T``:

=====================  ====================  ===========================================
leaf                   shape                 from the buffer
=====================  ====================  ===========================================
``observations``       ``(1, T, N, obs)``    ``obs`` (flat, as the buffer stores them)
``actions``            ``(1, T, N)``         ``discrete_actions`` (int32; ``(1, T, N, heads)``
                                             for several heads), else ``continuous_actions``
``rewards``            ``(1, T, N)``         ``individual_rewards``
``terminals``          ``(1, T, N)``         ``terminated``, float32, exactly as recorded
``truncations``        ``(1, T, N)``         ``truncated``, float32, exactly as recorded
``infos.legals``       ``(1, T, N, A)``      ``action_mask`` (heads joined), float32
``infos.state``        ``(1, T, state)``     ``state``
=====================  ====================  ===========================================

and ours beside them, which OG-MARL's code ignores: ``infos.alive`` ``(1, T, N)`` (``active``: 0
where an agent is dead, not yet spawned, or, in a turn-based game's row, not the one moving),
``infos.episode_ends`` ``(1, T)`` (1 at each episode's last step), ``infos.next_observations``
/ ``next_state`` / ``next_legals`` (each row's next values as the buffer holds them: an
agent's next turn, the final observation of a truncated episode), and ``infos.<field>`` for every
other recorded field (``global_rewards``, ``G``, ``values``, fields of your own, ...).
``metadata.json`` carries the buffer's layout, so `from_vault` gives back what was exported.

What OG-MARL's learners should assume: their tools take an episode's end from the steps where
every agent's ``terminals`` (or ``truncations``) is set. That holds in a recording where every
agent plays to the end; where agents die or spawn, or in a turn-based (AEC) recording, an agent
absent at the last step has 0 there, so use ``infos.episode_ends`` for ends and ``infos.alive``
to leave absent agents' rows out of losses. Padded agents (smaller observations or fewer
actions than the largest) are zero-padded, their padded actions illegal in ``infos.legals``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import (
    BufferFileError,
    BufferSaveError,
    EmptyBufferError,
    InvalidArgumentError,
)
from flexibuff_envs.integrations.tables import (
    GLOBAL,
    Block,
    Source,
    Summary,
    blocks,
    into_buffer,
    open_source,
)
from flexibuff_envs.integrations.vault_format import (
    BLOCK_BYTES,
    BLOCK_ROWS,
    CHUNK_BYTES,
    COMPRESSION,
    EPISODE_ENDS,
    FLAGS,
    NEXTS,
    TIME_AXIS,
    VERSION,
    leaf_of,
    store_spec,
    ts,
)
from flexibuff_envs.integrations.vault_read import Values, flat, foreign, open_leaves, streams, vault_path, whole
from flexibuff_envs.spec import BufferSpec, provenance

#: the leaf saying where a sparse next-value field is given (`to_vault`'s ``next_values="sparse"``)
GIVEN = "{}_given"


def _laid_out(name: str, values: np.ndarray, spec: BufferSpec) -> np.ndarray:
    """A field's rows as its leaf holds them: time first, then agents."""
    if name.removesuffix(GIVEN.format("")) not in GLOBAL:  # where a next value is given: as that value
        values = np.moveaxis(values, 0, 1)
    if name == "discrete_actions":
        values = values.astype(np.int32)  # JAX reads 32-bit integers
        if len(spec.discrete_action_cardinalities) == 1:
            values = values[..., 0]
    elif name in FLAGS:
        values = values.astype(np.float32)
    return values


def to_vault(
    source: Source,
    directory: str | os.PathLike[str],
    *,
    vault_name: str = "recording.vlt",
    vault_uid: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    compression: str = "lz4",
    next_values: str = "all",
) -> str:
    """Write the whole episodes of ``source`` (a buffer, or a buffer file or episode log's path,
    read episode by episode) as the vault ``directory/vault_name/vault_uid`` and return its path.

    flashbax reads it as ``Vault(vault_name, rel_dir=directory, vault_uid=vault_uid).read()``.
    ``vault_uid`` defaults to the time, as flashbax's does; ``metadata`` is saved beside the
    layout (JSON values). ``compression`` is one of `COMPRESSION`: ``"lz4"`` (blosc's, the
    default) writes at disk speed; ``"gzip"`` (flashbax's own default) writes a few percent
    smaller at a tenth of the speed. ``next_values="sparse"`` writes the next-value leaves
    (``infos.next_observations``, ...) only where the next step does not hold them (an episode's
    last step, an agent's next turn in a turn-based game), zeros elsewhere, which compress to
    nothing, and ``infos.next_observations_given`` (...; 1 where written): a vault of image observations about
    half the size, read back exactly; flashbax then reads zeros where the next step's value is
    meant. The vault is written under a temporary name and renamed when whole.

    Raises:
        BufferSaveError: the vault exists already, or cannot be written (its path named).
        EmptyBufferError: ``source`` holds no whole episode.
    """
    if compression not in COMPRESSION:
        raise InvalidArgumentError(f"to_vault: compression {compression!r} is none of {list(COMPRESSION)}")
    if next_values not in ("all", "sparse"):
        raise InvalidArgumentError(f"to_vault: next_values must be 'all' or 'sparse', got {next_values!r}")
    buffer = open_source(source)
    spec = buffer.spec
    uid = vault_uid or time.strftime("%Y%m%d%H%M%S")
    path = os.path.join(os.fspath(directory), vault_name, uid)
    if os.path.exists(path):
        raise BufferSaveError(errno.EEXIST, "a vault is there already (flashbax would append to it)", path)
    partial = os.path.join(os.path.dirname(path), f".{uid}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    try:
        source_blocks = blocks(buffer, BLOCK_ROWS)
        if next_values == "sparse":
            source_blocks = map(_sparse, source_blocks)
        options = dict(metadata or {}), COMPRESSION[compression], next_values
        rows = _write(partial, source_blocks, spec, buffer, *options)
        os.rename(partial, path)
    except (ValueError, RuntimeError) as exc:  # TensorStore's, a full disk among them
        shutil.rmtree(partial, ignore_errors=True)
        raise BufferSaveError(errno.EIO, f"cannot write the vault ({exc})", path) from exc
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if not rows:
        shutil.rmtree(path)
        raise EmptyBufferError(
            f"to_vault: {source if not isinstance(source, FlexibleBuffer) else 'the buffer'} "
            "holds no whole ended episode"
        )
    return path


def _write(
    base: str,
    source: Iterator[Block],
    spec: BufferSpec,
    buffer: FlexibleBuffer,
    metadata: dict[str, Any],
    compressor: dict[str, Any] | None,
    next_values: str,
) -> int:
    """Every block of ``source`` appended along T; then ``vault_index`` and ``metadata.json``."""
    stores: dict[str, Any] = {}
    leaves: dict[str, str] = {}
    filled = 0
    for lengths, arrays in source:
        ends = np.zeros(int(lengths.sum()), dtype=np.float32)
        ends[np.cumsum(lengths) - 1] = 1.0
        laid = {leaf_of(name, spec): _laid_out(name, values, spec) for name, values in arrays.items()}
        leaves.update({name: leaf_of(name, spec) for name in arrays})
        laid[EPISODE_ENDS] = ends
        for leaf, values in laid.items():
            if leaf not in stores:
                steps = max(1, min(len(values), CHUNK_BYTES // max(values[:1].nbytes, 1)))
                stores[leaf] = ts.open(
                    {
                        **store_spec(base, leaf),
                        "metadata": {"compressor": compressor, "chunks": [1, steps, *values.shape[1:]]},
                    },
                    shape=(1, TIME_AXIS, *values.shape[1:]),
                    dtype=values.dtype.name,
                    create=True,
                ).result()
        writes = [stores[leaf][0, filled : filled + len(ends)].write(values) for leaf, values in laid.items()]
        for write in writes:
            write.result()
        filled += len(ends)
    if not filled:
        return 0
    index = ts.open(store_spec(base, "vault_index"), dtype="int32", shape=(1,), create=True).result()
    index.write(np.array([filled], dtype=np.int32)).result()
    shapes: dict[str, Any] = {}
    dtypes: dict[str, Any] = {}
    for leaf, store in stores.items():
        _nest(shapes, leaf, str((1, filled, *store.shape[2:])))
        _nest(dtypes, leaf, store.dtype.numpy_dtype.name)
    ours = {
        "format": 1,
        "spec": spec.to_dict(),
        "gamma": buffer.gamma,
        "gae_lambda": buffer.gae_lambda,
        "fields": leaves,
        "next_values": next_values,
        "sessions": buffer.sessions,
    }
    with open(os.path.join(base, "metadata.json"), "w") as out:
        json.dump(
            {
                **metadata,
                "version": VERSION,
                "structure_shape": shapes,
                "structure_dtype": dtypes,
                "flexibuff_envs": ours,
            },
            out,
        )
    return filled


def _sparse(block: Block) -> Block:
    """``block`` with each next value zero where the next step holds it (`to_vault`'s "sparse"),
    and where it is given beside it."""
    lengths, arrays = block
    inside = np.ones(int(lengths.sum()), dtype=bool)
    inside[np.cumsum(lengths) - 1] = False  # an episode's last step: its next value is its own
    out = dict(arrays)
    for name, base in NEXTS:
        if name not in arrays or base not in arrays:
            continue
        axis = 0 if name in GLOBAL else 1
        nxt, now = np.moveaxis(arrays[name], axis, 0), np.moveaxis(arrays[base], axis, 0)
        same = np.zeros(nxt.shape[:2] if axis else nxt.shape[:1], dtype=bool)  # [T] or [T, n_agents]
        flat_next, flat_now = nxt.reshape(*same.shape, -1), now.reshape(*same.shape, -1)
        same[:-1] = (flat_next[:-1] == flat_now[1:]).all(axis=-1) & (inside[:-1, None] if axis else inside[:-1])
        values = nxt.copy()
        values[same] = 0
        out[name] = np.moveaxis(values, 0, axis)
        out[GIVEN.format(name)] = np.moveaxis(~same, 0, axis).astype(np.uint8)
    return lengths, out


def _nest(tree: dict[str, Any], leaf: str, value: Any) -> None:
    *parents, name = leaf.split(".")
    for parent in parents:
        tree = tree.setdefault(parent, {})
    tree[name] = value


def from_vault(
    directory: str | os.PathLike[str],
    vault_name: str | None = None,
    vault_uid: str | None = None,
    **buffer_options: Any,
) -> FlexibleBuffer:
    """A buffer holding every whole episode of a vault, read with TensorStore (no JAX).

    ``directory`` is the vault itself (holding ``metadata.json``), or, with ``vault_name``, the
    folder of vaults flashbax's ``rel_dir`` names (``vault_uid`` may be left out when the vault
    holds one). A vault `to_vault` wrote comes back as it was exported. Any other (OG-MARL's):
    ``observations`` ``(B, T, N, ...)`` flattened per agent; integer ``actions`` (or any with
    ``infos.legals``) discrete, with ``legals``' width as cardinality (else the largest action
    + 1), float ones continuous; ``rewards`` per agent, their mean the global reward;
    ``infos.state`` the global state, ``infos.alive`` (where given) who is present. An episode ends at a step where every agent's
    ``terminals`` or ``truncations`` is set; each of the ``B`` rows is a stream of its own, and
    its steps after its last end (an episode cut off) are left out. Next values are the next
    step's, and an episode's last step's its own (the vault has no final observation). ``G``
    is computed as when recording; ``buffer_options`` go to `FlexibleBuffer.from_spec`
    (``gamma``, ``num_steps``, ``seed``, ...), but ``log=DIR``: every episode is appended to
    that episode log too, so with a smaller ``num_steps`` a vault larger than memory becomes a
    log (read a block at a time, memory: the ring and one block).

    Raises:
        BufferFileError: no vault there, or one whose metadata or arrays cannot be read (the
            path and the problem named).
    """
    path = vault_path(os.fspath(directory), vault_name, vault_uid)
    meta_path = os.path.join(path, "metadata.json")
    try:
        with open(meta_path, "rb") as file:
            meta = json.loads(file.read(1 << 24))
        shapes, dtypes = meta["structure_shape"], meta["structure_dtype"]
        if int(float(meta["version"])) != int(VERSION):
            raise BufferFileError(f"{meta_path}: vault format version {meta['version']}; this reads {int(VERSION)}.x")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, BufferFileError):
            raise
        raise BufferFileError(f"{meta_path}: not a flashbax vault's metadata ({exc})") from None
    leaves = open_leaves(path, dict(flat(shapes, dtypes)))
    ours = meta.get("flexibuff_envs")
    fields: dict[str, Values]
    if isinstance(ours, dict) and ours.get("format") == 1:
        spec = BufferSpec.from_dict(ours["spec"])
        buffer_options.setdefault("gamma", ours["gamma"])
        buffer_options.setdefault("gae_lambda", ours["gae_lambda"])
        missing = [leaf for leaf in ours["fields"].values() if leaf not in leaves]
        if missing:
            raise BufferFileError(f"{path}: its layout names leaf {missing[0]!r}, which the vault does not hold")
        fields = {name: leaves[leaf] for name, leaf in ours["fields"].items()}
        last = leaves[EPISODE_ENDS].read() != 0 if EPISODE_ENDS in leaves else None
        buffer_options.setdefault("sessions", _sessions_of(ours, path))
        given = {name: fields.pop(GIVEN.format(name)) for name, _ in NEXTS if GIVEN.format(name) in fields}
    else:
        spec, fields = foreign(path, leaves)
        last, given = None, {}
    if last is None:
        last = ((whole(fields["terminated"]) != 0) | (whole(fields["truncated"]) != 0)).all(axis=-1)  # [T, B]
    ends = [np.flatnonzero(last[:, b]) for b in range(last.shape[1])]
    rows = sum(int(e[-1]) + 1 for e in ends if len(e))
    width = fields["continuous_log_probs"].shape[-1] if "continuous_log_probs" in fields else 0
    step_bytes = sum(int(np.prod(value.shape[2:])) * value.dtype.itemsize for value in fields.values())
    names = [*fields, *(name for name, base in NEXTS if base in fields and name not in fields)]
    return into_buffer(
        spec,
        names,
        streams(spec, fields, ends, max(1, BLOCK_BYTES // max(step_bytes, 1)), given=given),
        rows=rows,
        where=path,
        log_prob_width=width,
        **buffer_options,
    )


def is_vault(path: str) -> bool:
    """Whether ``path`` holds a vault's metadata."""
    return os.path.isfile(os.path.join(path, "metadata.json"))


def summary(path: str) -> Summary:
    """What the vault ``path`` holds: its agents, whole episodes (ends read, not the rest),
    steps and leaves."""
    try:
        with open(os.path.join(path, "metadata.json"), "rb") as file:
            meta = json.loads(file.read(1 << 24))
        leaves = dict(flat(meta["structure_shape"], meta["structure_dtype"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BufferFileError(f"{path}/metadata.json: not a flashbax vault's metadata ({exc!r})") from None
    ours = meta.get("flexibuff_envs") if isinstance(meta.get("flexibuff_envs"), dict) else None
    ends_leaf = [EPISODE_ENDS] if ours and EPISODE_ENDS in leaves else ["terminals", "truncations"]
    opened = open_leaves(path, {leaf: leaves[leaf] for leaf in ends_leaf if leaf in leaves})
    arrays = {leaf: value.read() for leaf, value in opened.items()}
    if ours:
        agents = tuple(BufferSpec.from_dict(ours["spec"]).agent_ids)
    else:
        n = leaves.get("observations", ((0, 0, 0),))[0]
        agents = tuple(f"agent_{i}" for i in range(n[2] if len(n) > 2 else 0))
    if EPISODE_ENDS in arrays:
        last = arrays[EPISODE_ENDS] != 0
    else:
        done = sum((arrays[leaf] != 0).astype(np.int8) for leaf in arrays) > 0
        last = done.reshape(*done.shape[:2], -1).all(axis=-1)
    steps = int(next(iter(arrays.values())).shape[0] * next(iter(arrays.values())).shape[1]) if arrays else 0
    return Summary(
        "flashbax vault",
        agents,
        int(np.count_nonzero(last)),
        steps,
        {leaf: f"{list(shape[2:])} {dtype}" for leaf, (shape, dtype) in sorted(leaves.items())},
        tuple(_sessions_of(ours, path)),
    )


def _sessions_of(ours: dict[str, Any] | None, path: str) -> list[dict[str, Any]]:
    """The recording sessions a vault of ours names, checked."""
    try:
        return provenance.sessions((ours or {}).get("sessions", []), "sessions")
    except ValueError as exc:
        raise BufferFileError(f"{path}/metadata.json: {exc}") from None
