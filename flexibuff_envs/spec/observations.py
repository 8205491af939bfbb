"""One small codec per Gymnasium observation space kind, registered with ``functools.singledispatch``.

A codec knows the flat size of a value and how to write one into a preallocated row, choosing
its fastest writer once. The action codecs are `action_codecs`'; these two modules are the only
ones that test space types.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from flexibuff_envs.errors import EnvValueError, UnsupportedSpaceError, short_repr

#: Box dtypes stored as they come: images stay one byte per value.
COMPACT_DTYPES = (np.dtype(bool), np.dtype(np.uint8), np.dtype(np.int8))
OBS_SPACES = "Box, Discrete, MultiDiscrete, MultiBinary, Tuple and Dict"

RowWriter = Callable[[int, Any], None]


# ----------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class ObsCodec:
    """How one observation space becomes a flat row."""

    size: int
    dtype: np.dtype
    shape: tuple[int, ...]
    flatten: Callable[[Any], np.ndarray]
    #: Box values are written through a view of the row with the space's shape (no flatten copy).
    direct: bool
    #: values of a vector env (``[n, ...]``, one per sub-env) -> ``[n, size]`` rows in one numpy
    #: operation per part of the space, checked
    batch: Callable[[Any], np.ndarray]
    #: PettingZoo classic: the value is a dict whose "action_mask" is the mask, not obs.
    split_mask: bool = False
    #: a space of categories only (Discrete, MultiDiscrete, Tuple or Dict of those): each one's
    #: size, in flattening order; its one-hot flattening is rebuilt from stored indices
    categories: tuple[int, ...] = ()
    #: value -> each category's index + 1 (0 stays free for "no observation")
    indices: Callable[[Any], np.ndarray] | None = None
    #: what the space is, for errors ("observation space of agent 'a'")
    where: str = "observation space"
    #: `batch` of the category indices (`indices` for a whole batch)
    batch_indices: Callable[[Any], np.ndarray] | None = None

    def compact(self) -> ObsCodec:
        """The codec storing this space's category indices instead of its one-hot flattening."""
        assert self.indices is not None and self.batch_indices is not None, (
            "compact() is only asked of codecs with categories"
        )
        k = len(self.categories)
        return dataclasses.replace(
            self,
            size=k,
            dtype=index_dtype(self.categories),
            shape=(k,),
            flatten=self.indices,
            direct=False,
            batch=self.batch_indices,
        )

    def row_view(self, store: np.ndarray) -> np.ndarray | None:
        """``store`` (``[rows, size]``) seen as ``[rows, *shape]`` for direct assignment of Box
        values; None for other spaces, or if the reshape could not be a view (it must not copy)."""
        if not self.direct:
            return None
        view = store.reshape((store.shape[0], *self.shape))
        return view if np.shares_memory(view, store) else None

    def writer(self, store: np.ndarray) -> RowWriter:
        """A function writing one value into row ``p`` of ``store`` (shape ``[rows, size]``)."""
        view = self.row_view(store)
        if view is not None:
            shape, size, where, ndarray = self.shape, self.size, self.where, np.ndarray
            numeric = np.dtype(np.float64)  # the last dtype seen to hold numbers: an identity test

            def write_direct(p: int, value: Any) -> None:
                nonlocal numeric
                # an array of numbers of the space's size passes with three attribute reads
                if value.__class__ is not ndarray or value.size != size or value.dtype is not numeric:
                    value = box_value(value, shape, where)
                    numeric = value.dtype
                try:
                    view[p] = value
                except ValueError:  # the right size in another shape
                    raise EnvValueError(f"{where}: expected shape {shape}, got shape {value.shape}") from None

            return write_direct
        flatten = self.flatten

        def write_flat(p: int, value: Any) -> None:
            store[p] = flatten(value)

        return write_flat


@functools.singledispatch
def _obs_codec(space: Any, where: str) -> ObsCodec:
    raise UnsupportedSpaceError(f"{where}: {space!r} is not supported; supported observation spaces: {OBS_SPACES}")


def box_value(value: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    """``value`` as an array of a Box of ``shape``: numbers (bool, int or float, converted to
    the stored dtype) of exactly that shape, else `EnvValueError`. Values outside the bounds,
    NaN and infinities are kept as given."""
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise EnvValueError(f"{where}: expected numbers of shape {shape}, got {short_repr(value)}")
    if array.shape != shape:
        raise EnvValueError(f"{where}: expected shape {shape}, got shape {array.shape} ({short_repr(value)})")
    return array


def numbers_batch(values: Any, shape: tuple[int, ...], kinds: str, where: str) -> np.ndarray:
    """``values`` of a vector env: an array ``[n, *shape]`` of numbers of ``kinds``, else
    `EnvValueError` naming ``where``."""
    if values.__class__ is not np.ndarray or values.dtype.kind not in kinds:
        values = np.asarray(values)
        if values.dtype.kind not in kinds:
            raise EnvValueError(f"{where}: expected numbers of shape {shape} per sub-env, got {short_repr(values)}")
    if values.shape[1:] != shape:
        raise EnvValueError(f"{where}: expected shape {shape} per sub-env, got shape {values.shape[1:]}")
    return values


@_obs_codec.register
def _(space: spaces.Box, where: str) -> ObsCodec:
    dtype = space.dtype if space.dtype in COMPACT_DTYPES else np.dtype(np.float32)
    size = int(math.prod(space.shape))
    shape = tuple(space.shape)

    def batch(values: Any) -> np.ndarray:
        return numbers_batch(values, shape, "biuf", where).reshape(-1, size)

    return ObsCodec(size, dtype, shape, lambda x: box_value(x, shape, where).reshape(-1), True, batch, where=where)


def index_dtype(categories: tuple[int, ...]) -> np.dtype:
    """The smallest unsigned dtype holding an index + 1 of every category."""
    return np.min_scalar_type(max(categories))


#: values the flattening of a non-Box observation (a categorical one's one-hot) may have per agent:
#: a batch row of it takes 4 MiB as float32 (a 256-row batch 1 GiB)
MAX_ONE_HOT = 1 << 20


def one_hot_problem(categories: Sequence[int], what: str = "obs_categories add up to") -> str | None:
    """Why observations of ``categories`` (or of a flattening that long) cannot be handed out, or None."""
    width = sum(categories)
    if width <= MAX_ONE_HOT:
        return None
    return (
        f"{what} {width:,} one-hot values per agent and row ({width * 4 / 2**30:,.1f} GiB as float32), more "
        f"than the {MAX_ONE_HOT:,} a batch presents; record such observations as a Box of indices instead"
    )


def _flattened(space: spaces.Space, where: str, batch: Callable[[Any], np.ndarray]) -> ObsCodec:
    """A space stored as Gymnasium's flattening (float32); ``batch`` encodes a vector env's values."""
    size = int(spaces.flatdim(space))
    problem = one_hot_problem((size,), f"{where}: {space!r} flattens to")
    if problem:
        raise UnsupportedSpaceError(problem)

    def flatten(value: Any) -> np.ndarray:
        return np.asarray(spaces.flatten(space, value))

    return ObsCodec(size, np.dtype(np.float32), (size,), flatten, False, batch, where=where)


def _of_parts(space: spaces.Tuple | spaces.Dict, where: str, parts: list[ObsCodec]) -> ObsCodec:
    """A Tuple or Dict of the spaces ``parts`` encode, each part's batch side by side."""
    if not parts:
        raise UnsupportedSpaceError(f"{where}: {space!r} holds no values to record")
    pick = (lambda value: [value[k] for k in space.spaces]) if isinstance(space, spaces.Dict) else list

    def batch(values: Any) -> np.ndarray:  # Gymnasium's flattening: the parts' in order
        return np.concatenate([part.batch(v) for part, v in zip(parts, pick(values))], axis=1, dtype=np.float32)

    codec = _flattened(space, where, batch)
    if all(part.categories for part in parts):

        def indices(value: Any) -> np.ndarray:
            return np.concatenate([part.indices(v) for part, v in zip(parts, pick(value))])  # type: ignore[misc]

        def batch_indices(values: Any) -> np.ndarray:
            return np.concatenate(
                [part.batch_indices(v) for part, v in zip(parts, pick(values))],  # type: ignore[misc]
                axis=1,
            )

        codec = dataclasses.replace(
            codec, categories=sum((p.categories for p in parts), ()), indices=indices, batch_indices=batch_indices
        )
    return codec


def _one_hot(indices: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """``[n, k]`` category indices (from 0) as their one-hot flattening ``[n, sum(sizes)]``."""
    offsets = np.cumsum((0, *sizes[:-1]))
    out = np.zeros((len(indices), sum(sizes)), dtype=np.float32)
    out[np.arange(len(indices))[:, None], indices + offsets] = 1.0
    return out


def _checked_indices(indices: np.ndarray, sizes: np.ndarray, space: spaces.Space, where: str) -> np.ndarray:
    """``indices`` (each category's index + 1), or `EnvValueError` naming ``where`` when one lies
    outside its category (a value outside ``space``: stored, it could never be read back)."""
    if indices.size and ((indices < 1) | (indices > sizes)).any():
        raise EnvValueError(f"{where}: a value outside {space!r}")
    return indices


def _integers(value: Any, shape: tuple[int, ...], where: str) -> np.ndarray:
    """``value`` as integers of ``shape``, else `EnvValueError` naming ``where``."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or array.shape != shape:
        raise EnvValueError(f"{where}: expected integers of shape {shape}, got {short_repr(value)}")
    return array


@_obs_codec.register
def _(space: spaces.Discrete, where: str) -> ObsCodec:
    shift, n = int(space.start) - 1, int(space.n)
    sizes = np.array([n])

    def indices(value: Any) -> np.ndarray:
        if value.__class__ is not int and value.__class__ is not np.int64:
            value = _integers(value, (), where)
        index = int(value) - shift
        if not 1 <= index <= n:
            raise EnvValueError(f"{where}: {value!r} is outside {space!r}")
        return np.array([index])

    def batch_indices(values: Any) -> np.ndarray:
        return _checked_indices((numbers_batch(values, (), "iu", where) - shift).reshape(-1, 1), sizes, space, where)

    categories = (n,)
    return dataclasses.replace(
        _flattened(space, where, lambda values: _one_hot(batch_indices(values) - 1, categories)),
        categories=categories,
        indices=indices,
        batch_indices=batch_indices,
    )


@_obs_codec.register
def _(space: spaces.MultiDiscrete, where: str) -> ObsCodec:
    shift = np.asarray(space.start).reshape(-1) - 1
    shape = tuple(space.shape)
    sizes = np.asarray(space.nvec).reshape(-1)

    def indices(value: Any) -> np.ndarray:
        return _checked_indices(_integers(value, shape, where).reshape(-1) - shift, sizes, space, where)

    def batch_indices(values: Any) -> np.ndarray:
        return _checked_indices(
            numbers_batch(values, shape, "iu", where).reshape(-1, shift.size) - shift, sizes, space, where
        )

    categories = tuple(int(n) for n in sizes)
    return dataclasses.replace(
        _flattened(space, where, lambda values: _one_hot(batch_indices(values) - 1, categories)),
        categories=categories,
        indices=indices,
        batch_indices=batch_indices,
    )


@_obs_codec.register
def _(space: spaces.MultiBinary, where: str) -> ObsCodec:
    shape = tuple(space.shape)
    return _flattened(space, where, lambda values: numbers_batch(values, shape, "biu", where).reshape(len(values), -1))


@_obs_codec.register
def _(space: spaces.Tuple, where: str) -> ObsCodec:
    return _of_parts(space, where, [_obs_codec(sub, f"{where}[{i}]") for i, sub in enumerate(space.spaces)])


@_obs_codec.register
def _(space: spaces.Dict, where: str) -> ObsCodec:
    if set(space.spaces) == {"observation", "action_mask"}:
        inner = _obs_codec(space["observation"], f"{where}['observation']")
        return dataclasses.replace(inner, split_mask=True)
    return _of_parts(space, where, [_obs_codec(sub, f"{where}[{key!r}]") for key, sub in space.spaces.items()])


def obs_codec(space: spaces.Space, where: str = "observation space") -> ObsCodec:
    """The codec for an observation space; `UnsupportedSpaceError` names ``where`` if none fits."""
    return _obs_codec(space, where)
