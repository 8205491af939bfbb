"""The fields a buffer can hold (`FIELDS`, and fields of your own), how each is laid out, and
the encodings some are stored in: legal-action masks as bits, categorical observations as
indices, next values (`NEXT`) in their base field's next row (`flexibuff_envs.storage.next_values`)."""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs.batch import FlexiBatch
from flexibuff_envs.errors import ArgumentTypeError, InvalidArgumentError, SpecMismatchError, plain_dtype
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec, index_dtype


@dataclass(frozen=True)
class Field:
    """How one field is laid out."""

    per_agent: bool
    #: a numpy dtype name, or "obs" / "state": the spec's ``obs_dtype`` / ``state_dtype``
    dtype: str
    fill: float | bool
    #: which spec size gives the trailing dimension ("" for a scalar per row)
    width: str = ""
    #: a fixed trailing shape (fields of your own, `extra_fields`)
    shape: tuple[int, ...] = ()


FIELDS: dict[str, Field] = {
    "obs": Field(True, "obs", 0, "obs_size"),
    "obs_": Field(True, "obs", 0, "obs_size"),
    "state": Field(False, "state", 0, "state_size"),
    "state_": Field(False, "state", 0, "state_size"),
    "discrete_actions": Field(True, "int64", 0, "n_heads"),
    "continuous_actions": Field(True, "float32", 0, "continuous_action_dimension"),
    # legal-action masks as bits, eight actions a byte (`pack_mask`); 255: all legal
    "action_mask": Field(True, "uint8", 255, "mask_bytes"),
    "action_mask_": Field(True, "uint8", 255, "mask_bytes"),
    "individual_rewards": Field(True, "float32", 0),
    "individual_auxiliary_rewards": Field(True, "float32", 0),
    "global_rewards": Field(False, "float32", 0),
    "global_auxiliary_rewards": Field(False, "float32", 0),
    "discrete_log_probs": Field(True, "float32", np.nan, "n_heads"),
    "continuous_log_probs": Field(True, "float32", np.nan, "log_prob_continuous"),
    "values": Field(True, "float32", np.nan),
    "advantages": Field(True, "float32", np.nan),
    "returns": Field(True, "float32", np.nan),
    "terminated": Field(True, "bool", False),
    "truncated": Field(True, "bool", False),
    "active": Field(True, "bool", False),
    "G": Field(True, "float32", np.nan),
    "memory_weights": Field(False, "float32", 1.0),
}

#: batch fields an n-step draw makes (`nstep.gather`) rather than gathers
N_STEP_MADE = ("discounts", "n_steps")
#: names a field of your own cannot take: the batch's own attributes
RESERVED = frozenset({*FIELDS, *(f.name for f in dataclasses.fields(FlexiBatch))})
#: most values one row of a field of your own may hold
MAX_EXTRA_SIZE = 1 << 24


def extra_fields(fields: Mapping[str, object] | None) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """Fields of your own as a spec holds them, ``(name, shape, dtype name)``, from ``{name:
    shape}`` or ``{name: (shape, dtype)}`` (dtype float32 unless given), or ValueError naming the
    field that is not a new identifier with a shape of positive sizes and a plain numeric dtype."""
    if fields is None:
        return ()
    if not isinstance(fields, Mapping):
        raise ArgumentTypeError(f"extra_fields must map names to shapes, e.g. {{'hidden': (64,)}}, got {fields!r}")
    out = []
    for name, given in fields.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in RESERVED:
            raise InvalidArgumentError(
                f"extra_fields: {name!r} must be a Python name that is not a batch field "
                f"already ({', '.join(sorted(RESERVED))})"
            )
        shape, dtype = (
            given
            if (isinstance(given, (tuple, list)) and len(given) == 2 and isinstance(given[1], (str, type, np.dtype)))
            else (given, "float32")
        )
        shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
        if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape
        ):
            raise InvalidArgumentError(
                f"extra_fields: {name!r} needs a shape of positive sizes such as (64,), got {given!r}"
            )
        if int(np.prod(shape)) > MAX_EXTRA_SIZE:
            raise InvalidArgumentError(
                f"extra_fields: {name!r} holds {int(np.prod(shape)):,} values a row, more than {MAX_EXTRA_SIZE:,}"
            )
        out.append((name, tuple(int(d) for d in shape), plain_dtype(f"extra_fields {name!r} dtype", dtype).name))
    return tuple(out)


def field_table(spec: BufferSpec) -> dict[str, Field]:
    """Every field a buffer of ``spec`` can hold: the built-ins and the spec's own (NaN, or 0 for
    integers, until given)."""
    return {
        **FIELDS,
        **{
            name: Field(True, dtype, np.nan if np.dtype(dtype).kind == "f" else 0, "", shape)
            for name, shape, dtype in spec.extra_fields
        },
    }


#: the legal-action mask fields
MASKS = ("action_mask", "action_mask_")


def mask_bytes(width: int) -> int:
    """Bytes a mask of ``width`` actions takes as bits."""
    return -(-width // 8)


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """Legal-action flags (any nonzero is legal) as bits along the last axis, first action lowest."""
    return np.packbits(mask, axis=-1, bitorder="little")


def unpack_mask(bits: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` flags `pack_mask` packed, as bools."""
    return np.unpackbits(bits, axis=-1, count=width, bitorder="little").view(bool)


def one_hot(indices: np.ndarray, categories: tuple[int, ...]) -> np.ndarray:
    """Stored category indices (``[..., k]``, index + 1; 0: none) as their one-hot flattening."""
    offsets = np.cumsum((-1, *categories[:-1]))  # index + 1 -> position in the flattening
    out = np.zeros((*indices.shape[:-1], sum(categories)), dtype=np.float32)
    flat, stored = out.reshape(-1, out.shape[-1]), indices.reshape(-1, len(categories))
    rows, which = np.nonzero(stored)
    flat[rows, stored[rows, which] + offsets[which]] = 1.0
    return out


def category_indices(flat: np.ndarray, categories: tuple[int, ...]) -> np.ndarray:
    """One-hot flattenings (``[..., sum(categories)]``) as the indices `one_hot` reads (index + 1;
    0 where a category has no value set)."""
    bounds = np.cumsum(categories)
    out = np.zeros((*flat.shape[:-1], len(categories)), dtype=index_dtype(categories))
    rows, at = np.nonzero(flat.reshape(-1, flat.shape[-1]))
    which = np.searchsorted(bounds, at, side="right")
    out.reshape(-1, len(categories))[rows, which] = at - (bounds[which] - np.asarray(categories)[which]) + 1
    return out


def encode(spec: BufferSpec, name: str, values: np.ndarray) -> np.ndarray:
    """Values of field ``name`` as a batch shows them (masks joined over heads) as a buffer of
    ``spec`` stores them: the inverse of `Storage.decode`, for filling a buffer by hand."""
    if name in MASKS:
        return pack_mask(values)
    if name in ("obs", "obs_") and spec.obs_categories:
        return category_indices(values, spec.obs_categories)
    return values


#: each next-value field and the field whose next row holds it
NEXT = {"obs_": "obs", "state_": "state", "action_mask_": "action_mask"}
#: fields stored in another form than batches show (`Storage.decode`)
DECODED = ("obs", "obs_", *MASKS)


def stored_obs(spec: BufferSpec, codec: ObsCodec) -> ObsCodec:
    """The codec whose rows a buffer of ``spec`` keeps for observations ``codec`` reads: category
    indices where the spec has categories (`one_hot` undoes them), else ``codec`` itself."""
    return codec.compact() if spec.obs_categories else codec


def stored_mask(spec: BufferSpec, action: ActionCodec) -> MaskCodec:
    """The codec whose rows a buffer of ``spec`` keeps for the legal actions of ``action``'s
    space: bits, padded to the buffer's heads."""
    return MaskCodec(action.cardinalities, spec.discrete_action_cardinalities)


def encoder(spec: BufferSpec, name: str, codec: ObsCodec | ActionCodec) -> ObsCodec | MaskCodec:
    """What a buffer of ``spec`` writes next-value field ``name`` through, given the codec of the
    space its values come from (for masks, the action space's)."""
    if isinstance(codec, ActionCodec):
        return stored_mask(spec, codec)
    return stored_obs(spec, codec) if name == "obs_" else codec


def flat_mask(mask: Any) -> Any:
    """A mask given per head (tuple of arrays) becomes one flat array; an array passes as is."""
    return mask if isinstance(mask, np.ndarray) else np.concatenate([np.ravel(m) for m in mask])


class MaskCodec:
    """How an env's action mask (one array, or one per head; None: all legal) becomes a padded row
    of bits (`pack_mask`).

    Agents with fewer actions than the buffer's heads get False at the padded positions.
    """

    def __init__(self, own: tuple[int, ...], padded: tuple[int, ...]) -> None:
        width = sum(padded)
        self.size = mask_bytes(width)
        offsets = np.cumsum((0, *padded[:-1])).astype(int)
        self._positions = None if own == padded else np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, own)])
        self._row = np.zeros(width, dtype=bool)
        legal = np.zeros(width, dtype=bool)
        legal[self._positions if self._positions is not None else slice(None)] = True
        self.all_legal = pack_mask(legal)

    def packed(self, mask: Any) -> np.ndarray:
        if mask is None:
            return self.all_legal
        if self._positions is None:
            return pack_mask(flat_mask(mask))
        self._row[self._positions] = flat_mask(mask)
        return pack_mask(self._row)

    def batch(self, masks: np.ndarray | None, n: int) -> np.ndarray:
        """``n`` rows of bits from the flags ``[n, actions]`` of ``n`` envs whose heads are all
        the buffer's (None: all legal)."""
        if masks is None:
            return np.broadcast_to(self.all_legal, (n, self.size))
        if masks.shape[-1] != self._row.size:
            raise SpecMismatchError(
                f"action_mask has {masks.shape[-1]} entries but the discrete action "
                f"heads have {self._row.size} actions in all"
            )
        return pack_mask(masks)

    def writer(self, store: np.ndarray) -> Callable[[int, Any], None]:
        def write(p: int, mask: Any) -> None:
            store[p] = self.packed(mask)

        return write
