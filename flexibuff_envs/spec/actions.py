"""One small codec per Gymnasium action space kind, registered with ``functools.singledispatch``:
how an action becomes discrete heads plus continuous values, with the fastest writer chosen once.
The observation codecs are `codecs`'; these two modules are the only ones that test space types.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from flexibuff_envs.errors import UnsupportedSpaceError
from flexibuff_envs.spec.observations import RowWriter, numbers_batch

ACTION_SPACES = "Discrete, MultiDiscrete, MultiBinary, Box, and Tuple or Dict of those"


@dataclass(frozen=True)
class ActionCodec:
    """How one action space becomes discrete heads plus continuous values."""

    cardinalities: tuple[int, ...]
    starts: tuple[int, ...]
    continuous_dim: int
    #: action -> (discrete int64 [n_heads], continuous float32 [continuous_dim])
    encode: Callable[[Any], tuple[np.ndarray, np.ndarray]]
    #: writes a vector env's actions (one per sub-env) into ``[n, ...]`` arrays, one numpy
    #: operation per action head kind: (discrete ``[n, heads]``, continuous ``[n, dim]``, actions)
    write_batch: Callable[[np.ndarray, np.ndarray, Any], None]
    #: builds the fastest writer for this space: (discrete store, continuous store) -> writer
    make_writer: Callable[[np.ndarray, np.ndarray], RowWriter] | None = None

    def writer(self, discrete: np.ndarray, continuous: np.ndarray) -> RowWriter:
        """A function writing one action into row ``p`` of the two stores."""
        if self.make_writer is not None:
            return self.make_writer(discrete, continuous)
        encode = self.encode

        def write_discrete(p: int, action: Any) -> None:
            discrete[p] = encode(action)[0]

        def write_continuous(p: int, action: Any) -> None:
            continuous[p] = encode(action)[1]

        def write_both(p: int, action: Any) -> None:
            discrete[p], continuous[p] = encode(action)

        if not self.continuous_dim:
            return write_discrete
        return write_both if self.cardinalities else write_continuous


_NO_INTS = np.zeros(0, dtype=np.int64)
_NO_FLOATS = np.zeros(0, dtype=np.float32)


@functools.singledispatch
def _action_codec(space: Any, where: str) -> ActionCodec:
    raise UnsupportedSpaceError(f"{where}: {space!r} is not supported; supported action spaces: {ACTION_SPACES}")


@_action_codec.register
def _(space: spaces.Discrete, where: str) -> ActionCodec:
    start = int(space.start)

    def make_writer(discrete: np.ndarray, continuous: np.ndarray) -> RowWriter:
        def write(p: int, action: Any) -> None:
            discrete[p, 0] = action - start

        return write

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.array([int(action) - start], dtype=np.int64), _NO_FLOATS

    def write_batch(discrete: np.ndarray, continuous: np.ndarray, actions: Any) -> None:
        values = numbers_batch(actions, (), "biu", where)
        discrete[:, 0] = values - start if start else values

    return ActionCodec((int(space.n),), (start,), 0, encode, write_batch, make_writer)


@_action_codec.register
def _(space: spaces.MultiDiscrete, where: str) -> ActionCodec:
    starts = np.asarray(space.start, dtype=np.int64).reshape(-1)

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(action, dtype=np.int64).reshape(-1) - starts, _NO_FLOATS

    def write_batch(discrete: np.ndarray, continuous: np.ndarray, actions: Any) -> None:
        discrete[...] = numbers_batch(actions, tuple(space.shape), "biu", where).reshape(len(discrete), -1) - starts

    cards = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
    return ActionCodec(cards, tuple(int(s) for s in starts), 0, encode, write_batch)


@_action_codec.register
def _(space: spaces.MultiBinary, where: str) -> ActionCodec:
    heads = int(np.prod(space.n))

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(action, dtype=np.int64).reshape(-1), _NO_FLOATS

    def write_batch(discrete: np.ndarray, continuous: np.ndarray, actions: Any) -> None:
        discrete[...] = numbers_batch(actions, tuple(space.shape), "biu", where).reshape(len(discrete), -1)

    return ActionCodec((2,) * heads, (0,) * heads, 0, encode, write_batch)


@_action_codec.register
def _(space: spaces.Box, where: str) -> ActionCodec:
    shape = tuple(space.shape)

    def make_writer(discrete: np.ndarray, continuous: np.ndarray) -> RowWriter:
        view = continuous.reshape((continuous.shape[0], *shape))

        def write(p: int, action: Any) -> None:
            view[p] = action

        return write

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return _NO_INTS, np.asarray(action, dtype=np.float32).reshape(-1)

    def write_batch(discrete: np.ndarray, continuous: np.ndarray, actions: Any) -> None:
        continuous[...] = numbers_batch(actions, shape, "biuf", where).reshape(continuous.shape)

    return ActionCodec((), (), int(math.prod(shape)), encode, write_batch, make_writer)


def _composite(children: list[ActionCodec], pick: Callable[[Any], list[Any]]) -> ActionCodec:
    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        parts = [child.encode(a) for child, a in zip(children, pick(action))]
        return (
            np.concatenate([d for d, _ in parts]) if parts else _NO_INTS,
            np.concatenate([c for _, c in parts]) if parts else _NO_FLOATS,
        )

    def write_batch(discrete: np.ndarray, continuous: np.ndarray, actions: Any) -> None:
        heads = width = 0  # each child's columns, in order
        for child, values in zip(children, pick(actions)):
            child.write_batch(
                discrete[:, heads : heads + len(child.cardinalities)],
                continuous[:, width : width + child.continuous_dim],
                values,
            )
            heads, width = heads + len(child.cardinalities), width + child.continuous_dim

    return ActionCodec(
        sum((c.cardinalities for c in children), ()),
        sum((c.starts for c in children), ()),
        sum(c.continuous_dim for c in children),
        encode,
        write_batch,
    )


@_action_codec.register
def _(space: spaces.Tuple, where: str) -> ActionCodec:
    children = [_action_codec(s, f"{where}[{i}]") for i, s in enumerate(space.spaces)]
    return _composite(children, list)


@_action_codec.register
def _(space: spaces.Dict, where: str) -> ActionCodec:
    keys = list(space.spaces)
    children = [_action_codec(space[k], f"{where}[{k!r}]") for k in keys]
    return _composite(children, lambda action: [action[k] for k in keys])


def action_codec(space: spaces.Space, where: str = "action space") -> ActionCodec:
    """The codec for an action space; `UnsupportedSpaceError` names ``where`` if none fits."""
    return _action_codec(space, where)


def actions_of(space: spaces.Space, discrete: np.ndarray | None, continuous: np.ndarray | None) -> list[Any]:
    """`action_decoder` of every row of ``discrete`` (``[T, heads]``) and ``continuous``
    (``[T, dim]``): a Discrete or Box space's in one numpy operation."""
    if isinstance(space, spaces.Discrete) and discrete is not None:
        return (discrete[:, 0] + int(space.start)).tolist()
    if isinstance(space, spaces.Box) and continuous is not None:
        return list(np.asarray(continuous).astype(space.dtype).reshape(len(continuous), *space.shape))
    decode, none = action_decoder(space), np.zeros(0)
    rows = len(discrete) if discrete is not None else len(continuous) if continuous is not None else 0
    return [
        decode(none if discrete is None else discrete[t], none if continuous is None else continuous[t])
        for t in range(rows)
    ]


def action_decoder(space: spaces.Space) -> Callable[[np.ndarray, np.ndarray], Any]:
    """The inverse of `action_codec`'s encoding: ``decode(discrete, continuous)`` (a stored row's
    ``[heads]`` and ``[dim]``) is the action of ``space`` that was recorded so (a replay's)."""
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return lambda d, c: int(d[0]) + start
    if isinstance(space, spaces.MultiDiscrete):
        starts = np.asarray(space.start, dtype=np.int64).reshape(-1)
        return lambda d, c: (np.asarray(d, dtype=np.int64) + starts).astype(space.dtype).reshape(space.shape)
    if isinstance(space, spaces.MultiBinary):
        return lambda d, c: np.asarray(d).astype(space.dtype).reshape(space.shape)
    if isinstance(space, spaces.Box):
        return lambda d, c: np.asarray(c).astype(space.dtype).reshape(space.shape)
    keys: list[str] | None = None
    if isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        children = [space.spaces[k] for k in keys]
    elif isinstance(space, spaces.Tuple):
        children = list(space.spaces)
    else:
        raise UnsupportedSpaceError(f"{space!r} is not supported; supported action spaces: {ACTION_SPACES}")
    decoders, cuts = [], []
    heads = width = 0
    for child in children:
        codec = action_codec(child)
        decoders.append(action_decoder(child))
        cuts.append((heads, heads + len(codec.cardinalities), width, width + codec.continuous_dim))
        heads, width = cuts[-1][1], cuts[-1][3]

    def decode(d: np.ndarray, c: np.ndarray) -> Any:
        parts = [f(d[a:b], c[x:y]) for f, (a, b, x, y) in zip(decoders, cuts)]
        return dict(zip(keys, parts)) if keys is not None else tuple(parts)

    return decode
