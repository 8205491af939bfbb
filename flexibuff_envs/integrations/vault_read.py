"""Reading a flashbax vault with TensorStore alone, a block of whole episodes at a time: the
leaves (`Leaf`), the layout of a vault another program wrote (`foreign`, OG-MARL's), and the
blocks `from_vault` fills a buffer with (`streams`). `vault_format` holds the format, `vault` the API."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.integrations.tables import GLOBAL, Block
from flexibuff_envs.integrations.vault_format import NEXTS, store_spec, ts
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage.compression import available_memory


def vault_path(directory: str, vault_name: str | None, vault_uid: str | None) -> str:
    if vault_name is None:
        return directory
    parent = os.path.join(directory, vault_name)
    if vault_uid is not None:
        return os.path.join(parent, vault_uid)
    uids = sorted(name for name in os.listdir(parent) if not name.startswith(".")) if os.path.isdir(parent) else []
    if len(uids) != 1:
        raise BufferFileError(f"{parent}: pass vault_uid, one of {uids}" if uids else f"{parent}: no vault there")
    return os.path.join(parent, uids[0])


def flat(shapes: Any, dtypes: Any, prefix: str = "") -> Iterator[tuple[str, tuple[tuple[int, ...], str]]]:
    """Each leaf of the metadata's tree: its name (keys joined by dots), shape and dtype."""
    if isinstance(shapes, dict):
        for key, value in shapes.items():
            yield from flat(value, dtypes[key], f"{prefix}{key}.")
    else:
        shape = tuple(int(n) for n in str(shapes).strip("()[] ").split(",") if n.strip())
        yield prefix[:-1], (shape, str(dtypes))


class Leaf:
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

    def like(self, transform: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...], dtype: Any) -> Leaf:
        """This leaf read through ``transform`` (into ``shape`` and ``dtype``)."""
        return Leaf(self.store, self.filled, transform, shape, np.dtype(dtype))


#: a field of a vault: a leaf read as it goes, or values read whole
Values = Leaf | np.ndarray


def whole(values: Values) -> np.ndarray:
    return values.read() if isinstance(values, Leaf) else values


def open_leaves(path: str, leaves: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, Leaf]:
    """Every leaf, opened and checked against ``vault_index``; none of its steps read yet."""
    try:
        filled = int(ts.open(store_spec(path, "vault_index")).result().read().result()[0])
        stores = {leaf: ts.open(store_spec(path, leaf)).result() for leaf in leaves}
    except (ValueError, RuntimeError, OSError) as exc:
        raise BufferFileError(f"{path}: a vault's arrays cannot be opened ({exc})") from None
    written = _written(path)
    for leaf, store in stores.items():
        if store.rank < 2 or filled < 0 or filled > store.shape[1]:
            raise BufferFileError(
                f"{path}: leaf {leaf!r} of shape {tuple(store.shape)} cannot hold the "
                f"{filled:,} steps vault_index says it holds"
            )
        chunk = store.schema.chunk_layout.read_chunk.shape  # steps a chunk holds: its second axis
        held = written.get(leaf, 0) * (int(chunk[1] or 1) if chunk else 1)
        if filled > held:  # the rest would read as zeros, costing memory for steps never written
            raise BufferFileError(
                f"{path}: vault_index says the vault holds {filled:,} steps, but leaf {leaf!r} has {held:,} written"
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
    return {leaf: Leaf(store, filled) for leaf, store in stores.items()}


def _written(path: str) -> dict[str, int]:
    """Per leaf of the vault ``path``, how many chunks along the time axis it has written (one
    past the latest), from the names of the chunks the vault's store lists."""
    try:
        keys = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{os.path.abspath(path)}"}).result().list().result()
    except (ValueError, RuntimeError, OSError) as exc:
        raise BufferFileError(f"{path}: a vault's store cannot be listed ({exc})") from None
    written: dict[str, int] = {}
    for key in keys:
        leaf, _, chunk = key.decode(errors="replace").rpartition("./")
        index = chunk.split(".")
        if len(index) > 1 and all(part.isdigit() for part in index):
            written[leaf] = max(written.get(leaf, 0), int(index[1]) + 1)
    return written


def foreign(path: str, leaves: Mapping[str, Leaf]) -> tuple[BufferSpec, dict[str, Values]]:
    """The layout and fields of a vault another program wrote (OG-MARL's leaves): observations
    and state read as they go, the rest whole."""
    missing = [leaf for leaf in ("observations", "actions", "rewards", "terminals") if leaf not in leaves]
    if missing:
        raise BufferFileError(
            f"{path}: the vault has no {', '.join(missing)} (OG-MARL's leaves); it holds {sorted(leaves)}"
        )
    obs = leaves["observations"]
    if len(obs.shape) < 3:
        raise BufferFileError(f"{path}: leaf 'observations' is {obs.shape}, not [steps, batch, agents, ...]")
    steps, streams, agents = obs.shape[:3]
    for leaf in ("actions", "rewards", "terminals", "truncations", "infos.alive", "infos.legals"):
        if leaf in leaves and tuple(leaves[leaf].shape[:3]) != (steps, streams, agents)[: len(leaves[leaf].shape)]:
            raise BufferFileError(
                f"{path}: leaf {leaf!r} is {leaves[leaf].shape}, where 'observations' has {agents} agents "
                f"in {streams} rows of {steps:,} steps"
            )
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


def _flattened(leaf: Leaf, keep: int) -> Leaf:
    """``leaf`` with its axes after the first ``keep`` (``[T, B, ...]``) flattened into one."""
    tail = len(leaf.shape) - keep
    return leaf.like(
        lambda values: values.reshape(*values.shape[: values.ndim - tail], -1),
        (*leaf.shape[:keep], int(np.prod(leaf.shape[keep:]))),
        leaf.dtype,
    )


def streams(
    spec: BufferSpec,
    fields: Mapping[str, Values],
    ends: list[np.ndarray],
    steps: int,
    *,
    given: Mapping[str, Values] | None = None,
) -> Iterator[Block]:
    """Each stream's whole episodes (``ends``: each stream's episodes' last steps) in blocks of
    about ``steps`` steps, read a block at a time, in the module layout of `tables`; ``given``:
    per next-value field, where its leaf holds it (elsewhere it is the next step's: `to_vault`'s
    ``next_values="sparse"``)."""
    given = given or {}
    for b, where in enumerate(ends):
        first = 0
        while first < len(where):
            lo = int(where[first - 1]) + 1 if first else 0
            stop = max(first + 1, int(np.searchsorted(where, lo + steps - 1, side="right")))
            span = slice(lo, int(where[stop - 1]) + 1)
            last = where[first:stop] - lo
            out = {}
            for name, values in fields.items():
                read = values.read(span, b) if isinstance(values, Leaf) else values[span, b]
                out[name] = read if name in GLOBAL else np.moveaxis(read, 1, 0)
            for name, base in NEXTS:
                if base in out and name not in out:  # the next step's, within the episode
                    out[name] = _shifted(out[base], last, name in GLOBAL)
                elif name in given:  # the next step's where the leaf does not give it
                    mask = given[name]
                    held = (mask.read(span, b) if isinstance(mask, Leaf) else mask[span, b]) != 0
                    held = held if name in GLOBAL else np.moveaxis(held, 1, 0)
                    shifted = _shifted(out[base], last, name in GLOBAL)
                    out[name] = np.where(
                        held.reshape(*held.shape, *(1,) * (out[name].ndim - held.ndim)), out[name], shifted
                    )
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
