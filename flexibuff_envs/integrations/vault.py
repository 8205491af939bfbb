"""flashbax Vaults, the form OG-MARL publishes its offline multi-agent datasets in: `to_vault`
writes a buffer, buffer file or episode log as one, `from_vault` reads any such vault into a
buffer, with TensorStore alone (no JAX). Needs ``pip install 'flexibuff_envs[vault]'``.

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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer, available_memory
from flexibuff_envs.errors import (
    BufferFileError,
    BufferSaveError,
    EmptyBufferError,
    InvalidArgumentError,
    MissingExtraError,
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
from flexibuff_envs.spec import BufferSpec

try:
    import tensorstore as ts
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(
        "flexibuff_envs.integrations.vault needs TensorStore: pip install 'flexibuff_envs[vault]'"
    ) from error

#: flashbax's vault format version we write (and the major version we read)
VERSION = 1.2
#: the length flashbax gives a leaf's time axis (filled up to ``vault_index``)
TIME_AXIS = 10**13
#: rows of episodes written at a time
BLOCK_ROWS = 65_536
#: about the bytes of the steps read at a time
BLOCK_BYTES = 1 << 26
#: about the bytes of a leaf's chunk: whole rows (every agent, every feature) of consecutive
#: steps, so a frame is never cut into hundreds of chunks as TensorStore's default layout cuts it
CHUNK_BYTES = 1 << 22
#: the compressors a vault can be written with (`to_vault`'s ``compression``); TensorStore, and
#: so flashbax, reads each
COMPRESSION: dict[str, dict[str, Any] | None] = {
    "lz4": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
    "zstd": {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1},
    "gzip": {"id": "gzip", "level": 5},  # flashbax's default
    "none": None,
}
#: each field's leaf, where OG-MARL has a name for it (every other field goes to ``infos.<field>``)
LEAVES = {
    "obs": "observations",
    "individual_rewards": "rewards",
    "terminated": "terminals",
    "truncated": "truncations",
    "action_mask": "infos.legals",
    "state": "infos.state",
    "active": "infos.alive",
    "obs_": "infos.next_observations",
    "state_": "infos.next_state",
    "action_mask_": "infos.next_legals",
}
#: fields written as float32 0/1, as OG-MARL's datasets hold them
FLAGS = ("terminated", "truncated", "action_mask", "action_mask_", "active")
EPISODE_ENDS = "infos.episode_ends"
#: each next-value field and its base: a foreign vault's next values are its next steps'
NEXTS = (("obs_", "obs"), ("state_", "state"), ("action_mask_", "action_mask"))


def _leaf_of(name: str, spec: BufferSpec) -> str:
    if name == "discrete_actions" or (name == "continuous_actions" and not spec.discrete_action_cardinalities):
        return "actions"
    return LEAVES.get(name, f"infos.{name}")


def _laid_out(name: str, values: np.ndarray, spec: BufferSpec) -> np.ndarray:
    """A field's rows as its leaf holds them: time first, then agents."""
    if name not in GLOBAL:
        values = np.moveaxis(values, 0, 1)
    if name == "discrete_actions":
        values = values.astype(np.int32)  # JAX reads 32-bit integers
        if len(spec.discrete_action_cardinalities) == 1:
            values = values[..., 0]
    elif name in FLAGS:
        values = values.astype(np.float32)
    return values


def _store_spec(base: str, leaf: str) -> dict[str, Any]:
    return {
        "driver": "zarr",
        "kvstore": {
            "driver": "ocdbt",
            "base": f"file://{os.path.abspath(base)}",
            "path": f"{leaf}." if leaf != "vault_index" else leaf,
        },
    }


def to_vault(
    source: Source,
    directory: str | os.PathLike[str],
    *,
    vault_name: str = "recording.vlt",
    vault_uid: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    compression: str = "lz4",
) -> str:
    """Write the whole episodes of ``source`` (a buffer, or a buffer file or episode log's path,
    read episode by episode) as the vault ``directory/vault_name/vault_uid`` and return its path.

    flashbax reads it as ``Vault(vault_name, rel_dir=directory, vault_uid=vault_uid).read()``.
    ``vault_uid`` defaults to the time, as flashbax's does; ``metadata`` is saved beside the
    layout (JSON values). ``compression`` is one of `COMPRESSION`: ``"lz4"`` (blosc's, the
    default) writes at disk speed; ``"gzip"`` (flashbax's own default) writes a few percent
    smaller at a tenth of the speed. The vault is written under a temporary name and renamed
    when whole.

    Raises:
        BufferSaveError: the vault exists already, or cannot be written (its path named).
        EmptyBufferError: ``source`` holds no whole episode.
    """
    if compression not in COMPRESSION:
        raise InvalidArgumentError(f"to_vault: compression {compression!r} is none of {list(COMPRESSION)}")
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
        rows = _write(partial, blocks(buffer, BLOCK_ROWS), spec, buffer, dict(metadata or {}), COMPRESSION[compression])
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
) -> int:
    """Every block of ``source`` appended along T; then ``vault_index`` and ``metadata.json``."""
    stores: dict[str, Any] = {}
    leaves: dict[str, str] = {}
    filled = 0
    for lengths, arrays in source:
        ends = np.zeros(int(lengths.sum()), dtype=np.float32)
        ends[np.cumsum(lengths) - 1] = 1.0
        laid = {_leaf_of(name, spec): _laid_out(name, values, spec) for name, values in arrays.items()}
        leaves.update({name: _leaf_of(name, spec) for name in arrays})
        laid[EPISODE_ENDS] = ends
        for leaf, values in laid.items():
            if leaf not in stores:
                steps = max(1, min(len(values), CHUNK_BYTES // max(values[:1].nbytes, 1)))
                stores[leaf] = ts.open(
                    {
                        **_store_spec(base, leaf),
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
    index = ts.open(_store_spec(base, "vault_index"), dtype="int32", shape=(1,), create=True).result()
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
    path = _vault_path(os.fspath(directory), vault_name, vault_uid)
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
    leaves = _open(path, dict(_flat(shapes, dtypes)))
    ours = meta.get("flexibuff_envs")
    fields: dict[str, Values]
    if isinstance(ours, dict) and ours.get("format") == 1:
        spec = BufferSpec.from_dict(ours["spec"])
        buffer_options.setdefault("gamma", ours["gamma"])
        buffer_options.setdefault("gae_lambda", ours["gae_lambda"])
        fields = {name: leaves[leaf] for name, leaf in ours["fields"].items() if leaf in leaves}
        last = leaves[EPISODE_ENDS].read() != 0 if EPISODE_ENDS in leaves else None
    else:
        spec, fields = _foreign(path, leaves)
        last = None
    if last is None:
        last = ((_whole(fields["terminated"]) != 0) | (_whole(fields["truncated"]) != 0)).all(axis=-1)  # [T, B]
    ends = [np.flatnonzero(last[:, b]) for b in range(last.shape[1])]
    rows = sum(int(e[-1]) + 1 for e in ends if len(e))
    width = fields["continuous_log_probs"].shape[-1] if "continuous_log_probs" in fields else 0
    step_bytes = sum(int(np.prod(value.shape[2:])) * value.dtype.itemsize for value in fields.values())
    names = [*fields, *(name for name, base in NEXTS if base in fields and name not in fields)]
    return into_buffer(
        spec,
        names,
        _streams(spec, fields, ends, max(1, BLOCK_BYTES // max(step_bytes, 1))),
        rows=rows,
        where=path,
        log_prob_width=width,
        **buffer_options,
    )


def _vault_path(directory: str, vault_name: str | None, vault_uid: str | None) -> str:
    if vault_name is None:
        return directory
    parent = os.path.join(directory, vault_name)
    if vault_uid is not None:
        return os.path.join(parent, vault_uid)
    uids = sorted(name for name in os.listdir(parent) if not name.startswith(".")) if os.path.isdir(parent) else []
    if len(uids) != 1:
        raise BufferFileError(f"{parent}: pass vault_uid, one of {uids}" if uids else f"{parent}: no vault there")
    return os.path.join(parent, uids[0])


def _flat(shapes: Any, dtypes: Any, prefix: str = "") -> Iterator[tuple[str, tuple[tuple[int, ...], str]]]:
    """Each leaf of the metadata's tree: its name (keys joined by dots), shape and dtype."""
    if isinstance(shapes, dict):
        for key, value in shapes.items():
            yield from _flat(value, dtypes[key], f"{prefix}{key}.")
    else:
        shape = tuple(int(n) for n in str(shapes).strip("()[] ").split(",") if n.strip())
        yield prefix[:-1], (shape, str(dtypes))


class _Leaf:
    """A vault leaf's filled part, read a stretch of steps at a time: ``[T, B, ...]`` as
    `shape` says, through ``transform`` (a reshape or a cast of what is read)."""

    def __init__(
        self,
        store: Any,
        filled: int,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: np.dtype | None = None,
    ) -> None:
        self.store, self.filled, self.transform = store, filled, transform
        self.shape = shape or (filled, store.shape[0], *store.shape[2:])
        self.dtype = dtype or store.dtype.numpy_dtype

    def read(self, span: slice = slice(None), stream: int | None = None) -> np.ndarray:
        lo, hi, _ = span.indices(self.filled)
        region = self.store[:, lo:hi] if stream is None else self.store[stream, lo:hi]
        try:
            values = region.read().result()
        except (ValueError, RuntimeError, OSError) as exc:
            raise BufferFileError(f"a vault's leaf cannot be read ({exc})") from None
        values = np.moveaxis(values, 0, 1) if stream is None else values
        return values if self.transform is None else self.transform(values)

    def like(self, transform: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...], dtype: Any) -> _Leaf:
        """This leaf read through ``transform`` (into ``shape`` and ``dtype``)."""
        return _Leaf(self.store, self.filled, transform, shape, np.dtype(dtype))


#: a field of a vault: a leaf read as it goes, or values read whole
Values = _Leaf | np.ndarray


def _whole(values: Values) -> np.ndarray:
    return values.read() if isinstance(values, _Leaf) else values


def _open(path: str, leaves: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, _Leaf]:
    """Every leaf, opened and checked against ``vault_index``; none of its steps read yet."""
    try:
        filled = int(ts.open(_store_spec(path, "vault_index")).result().read().result()[0])
        stores = {leaf: ts.open(_store_spec(path, leaf)).result() for leaf in leaves}
    except (ValueError, RuntimeError, OSError) as exc:
        raise BufferFileError(f"{path}: a vault's arrays cannot be opened ({exc})") from None
    for leaf, store in stores.items():
        if store.rank < 2 or filled < 0 or filled > store.shape[1]:
            raise BufferFileError(
                f"{path}: leaf {leaf!r} of shape {tuple(store.shape)} cannot hold the "
                f"{filled:,} steps vault_index says it holds"
            )
    claimed = (
        sum(
            int(np.prod(store.shape[2:])) * store.shape[0] * store.dtype.numpy_dtype.itemsize
            for store in stores.values()
        )
        * filled
    )
    if claimed > 2 * available_memory():  # read a block at a time, into a buffer about half its size
        raise BufferFileError(
            f"{path}: its {filled:,} steps take {claimed / 2**30:,.1f} GiB, more than "
            f"the {available_memory() / 2**30:,.1f} GiB of memory available"
        )
    return {leaf: _Leaf(store, filled) for leaf, store in stores.items()}


def _foreign(path: str, leaves: Mapping[str, _Leaf]) -> tuple[BufferSpec, dict[str, Values]]:
    """The layout and fields of a vault another program wrote (OG-MARL's leaves): observations
    and state read as they go, the rest whole."""
    missing = [leaf for leaf in ("observations", "actions", "rewards", "terminals") if leaf not in leaves]
    if missing:
        raise BufferFileError(
            f"{path}: the vault has no {', '.join(missing)} (OG-MARL's leaves); it holds {sorted(leaves)}"
        )
    obs = leaves["observations"]
    steps, streams, agents = obs.shape[:3]
    fields: dict[str, Values] = {"obs": _flattened(obs, 3)}
    actions = leaves["actions"].read()
    legals = leaves["infos.legals"].read() if "infos.legals" in leaves else None
    options: dict[str, Any] = {}
    if np.issubdtype(actions.dtype, np.integer) or legals is not None:
        heads = actions.reshape(steps, streams, agents, -1).astype(np.int64)
        cards = (
            (legals.shape[-1],)
            if legals is not None and heads.shape[-1] == 1
            else tuple(int(n) + 1 for n in heads.reshape(-1, heads.shape[-1]).max(axis=0, initial=0))
        )
        fields["discrete_actions"] = heads
        options = {"discrete_action_cardinalities": cards, "discrete_action_starts": (0,) * len(cards)}
        if legals is not None:
            fields["action_mask"] = legals.reshape(steps, streams, agents, -1) != 0
            options["action_mask"] = True
    else:
        fields["continuous_actions"] = actions.reshape(steps, streams, agents, -1).astype(np.float32)
        options = {"continuous_action_dimension": fields["continuous_actions"].shape[-1]}
    rewards = leaves["rewards"].read().reshape(steps, streams, agents).astype(np.float32)
    fields.update(individual_rewards=rewards, global_rewards=rewards.mean(axis=-1))
    for name, leaf, absent in (
        ("terminated", "terminals", False),
        ("truncated", "truncations", False),
        ("active", "infos.alive", True),
    ):
        fields[name] = (
            leaves[leaf].read().reshape(steps, streams, agents) != 0
            if leaf in leaves
            else np.full(rewards.shape, absent)
        )
    if "infos.state" in leaves:
        state = fields["state"] = _flattened(leaves["infos.state"], 2)
        options.update(state_size=state.shape[-1], state_dtype=state.dtype.name)
    spec = BufferSpec(
        obs_size=fields["obs"].shape[-1],
        obs_dtype=obs.dtype.name,
        n_agents=agents,
        agent_ids=tuple(f"agent_{i}" for i in range(agents)),
        obs_shape=tuple(obs.shape[3:]),
        **options,
    )
    return spec, fields


def _flattened(leaf: _Leaf, keep: int) -> _Leaf:
    """``leaf`` with its axes after the first ``keep`` (``[T, B, ...]``) flattened into one."""
    tail = len(leaf.shape) - keep
    return leaf.like(
        lambda values: values.reshape(*values.shape[: values.ndim - tail], -1),
        (*leaf.shape[:keep], int(np.prod(leaf.shape[keep:]))),
        leaf.dtype,
    )


def _streams(spec: BufferSpec, fields: Mapping[str, Values], ends: list[np.ndarray], steps: int) -> Iterator[Block]:
    """Each stream's whole episodes (``ends``: each stream's episodes' last steps) in blocks of
    about ``steps`` steps, read a block at a time, in the module layout of `tables`."""
    for b, where in enumerate(ends):
        first = 0
        while first < len(where):
            lo = int(where[first - 1]) + 1 if first else 0
            stop = max(first + 1, int(np.searchsorted(where, lo + steps - 1, side="right")))
            span = slice(lo, int(where[stop - 1]) + 1)
            last = where[first:stop] - lo
            out = {}
            for name, values in fields.items():
                read = values.read(span, b) if isinstance(values, _Leaf) else values[span, b]
                out[name] = read if name in GLOBAL else np.moveaxis(read, 1, 0)
            for name, base in NEXTS:
                if base in out and name not in out:  # the next step's, within the episode
                    out[name] = _shifted(out[base], last, name in GLOBAL)
            yield np.diff(last, prepend=-1), {name: _cast(name, values, spec) for name, values in out.items()}
            first = stop


def _shifted(values: np.ndarray, ends: np.ndarray, is_global: bool) -> np.ndarray:
    """Each step's next step's values; an episode's last step keeps its own."""
    axis = 0 if is_global else 1
    out = np.roll(values, -1, axis=axis)
    index = (ends,) if is_global else (slice(None), ends)
    out[index] = values[index]
    return out


def _cast(name: str, values: np.ndarray, spec: BufferSpec) -> np.ndarray:
    """A leaf's values in the dtype the buffer stores ``name`` in."""
    if name in ("terminated", "truncated", "active") or name in ("action_mask", "action_mask_"):
        return values != 0
    if name == "discrete_actions":
        values = values.astype(np.int64)
        return values if values.ndim == 3 else values[..., None]
    if name in ("obs", "obs_") and not spec.obs_categories:  # categories: one-hot, as batches show them
        return values.astype(spec.obs_dtype, copy=False)
    return values


def is_vault(path: str) -> bool:
    """Whether ``path`` holds a vault's metadata."""
    return os.path.isfile(os.path.join(path, "metadata.json"))


def summary(path: str) -> Summary:
    """What the vault ``path`` holds: its agents, whole episodes (ends read, not the rest),
    steps and leaves."""
    try:
        with open(os.path.join(path, "metadata.json"), "rb") as file:
            meta = json.loads(file.read(1 << 24))
        leaves = dict(_flat(meta["structure_shape"], meta["structure_dtype"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BufferFileError(f"{path}/metadata.json: not a flashbax vault's metadata ({exc!r})") from None
    ours = meta.get("flexibuff_envs") if isinstance(meta.get("flexibuff_envs"), dict) else None
    ends_leaf = [EPISODE_ENDS] if ours and EPISODE_ENDS in leaves else ["terminals", "truncations"]
    opened = _open(path, {leaf: leaves[leaf] for leaf in ends_leaf if leaf in leaves})
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
    )
