"""The buffer layout (`BufferSpec`) and its inference from Gymnasium spaces.

Every space kind gets one small codec, registered with ``functools.singledispatch``: it knows the
flat size of a value and how to write one into a preallocated row. Nothing else in the package
tests space types.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from flexibuff_envs import kinds
from flexibuff_envs.errors import NotAnEnvError, SpecMismatchError, UnsupportedSpaceError

#: Box dtypes stored as they come: images stay one byte per value.
COMPACT_DTYPES = (np.dtype(bool), np.dtype(np.uint8), np.dtype(np.int8))
OBS_SPACES = "Box, Discrete, MultiDiscrete, MultiBinary, Tuple and Dict"
ACTION_SPACES = "Discrete, MultiDiscrete, MultiBinary, Box, and Tuple or Dict of those"
ENV_KINDS = "gymnasium.Env, pettingzoo ParallelEnv or pettingzoo AECEnv"

RowWriter = Callable[[int, Any], None]


@dataclass(frozen=True)
class BufferSpec:
    """What one row of the buffer holds; inferred from an env or given by hand.

    Attributes:
        obs_size: length of one agent's flattened observation (the largest agent's, when padded).
        obs_dtype: numpy dtype name observations are stored in.
        discrete_action_cardinalities: one entry per discrete action head.
        continuous_action_dimension: number of continuous action values per agent.
        action_mask: whether legal-action masks are recorded.
        n_agents: agents per row; 1 drops the agent axis from batches.
        agent_ids: the agents' names, in buffer order.
        state_size: length of the global state, or None when the env has none.
        n_envs: independent lanes (sub-envs of a vector env).
        discrete_action_starts: each head's ``start``; stored actions are ``action - start``.
        obs_shape: the observation's shape before flattening (Box only, else ``(obs_size,)``).
        state_dtype: numpy dtype name the global state is stored in.
        agent_obs_sizes, agent_discrete_action_cardinalities, agent_continuous_action_dimensions:
            each agent's true sizes when agents differ only in size (the buffer holds the largest,
            zero-padded; padded actions are masked out).
    """

    obs_size: int
    obs_dtype: str = "float32"
    discrete_action_cardinalities: tuple[int, ...] = ()
    continuous_action_dimension: int = 0
    action_mask: bool = False
    n_agents: int = 1
    agent_ids: tuple[str, ...] = ("agent_0",)
    state_size: int | None = None
    n_envs: int = 1
    discrete_action_starts: tuple[int, ...] = ()
    obs_shape: tuple[int, ...] = ()
    state_dtype: str = "float32"
    agent_obs_sizes: tuple[int, ...] = ()
    agent_discrete_action_cardinalities: tuple[tuple[int, ...], ...] = ()
    agent_continuous_action_dimensions: tuple[int, ...] = ()

    #: Fields that decide array shapes; a user-supplied buffer must agree on these.
    LAYOUT_FIELDS = (
        "obs_size",
        "obs_dtype",
        "discrete_action_cardinalities",
        "continuous_action_dimension",
        "action_mask",
        "n_agents",
        "state_size",
        "n_envs",
    )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BufferSpec:
        """Rebuild a spec from `to_dict` output (lists become tuples)."""
        known = {f.name for f in dataclasses.fields(cls)}
        def frozen(value: Any) -> Any:
            return tuple(frozen(v) for v in value) if isinstance(value, list) else value

        values: dict[str, Any] = {k: frozen(v) for k, v in data.items() if k in known}
        return cls(**values)


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
    #: PettingZoo classic: the value is a dict whose "action_mask" is the mask, not obs.
    split_mask: bool = False

    def writer(self, store: np.ndarray) -> RowWriter:
        """A function writing one value into row ``p`` of ``store`` (shape ``[rows, size]``)."""
        if self.direct:
            view = store.reshape((store.shape[0], *self.shape))

            def write_direct(p: int, value: Any) -> None:
                view[p] = value

            return write_direct
        flatten = self.flatten

        def write_flat(p: int, value: Any) -> None:
            store[p] = flatten(value)

        return write_flat


@functools.singledispatch
def _obs_codec(space: Any, where: str) -> ObsCodec:
    raise UnsupportedSpaceError(
        f"{where}: {space!r} is not supported; supported observation spaces: {OBS_SPACES}"
    )


@_obs_codec.register
def _(space: spaces.Box, where: str) -> ObsCodec:
    dtype = space.dtype if space.dtype in COMPACT_DTYPES else np.dtype(np.float32)
    size = int(math.prod(space.shape))
    return ObsCodec(size, dtype, tuple(space.shape), lambda x: np.asarray(x).reshape(-1), True)


def _flattened(space: spaces.Space, where: str) -> ObsCodec:
    size = int(spaces.flatdim(space))
    def flatten(value: Any) -> np.ndarray:
        return np.asarray(spaces.flatten(space, value))

    return ObsCodec(size, np.dtype(np.float32), (size,), flatten, False)


for _kind in (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary):
    _obs_codec.register(_kind, _flattened)


@_obs_codec.register
def _(space: spaces.Tuple, where: str) -> ObsCodec:
    for i, sub in enumerate(space.spaces):
        _obs_codec(sub, f"{where}[{i}]")
    return _flattened(space, where)


@_obs_codec.register
def _(space: spaces.Dict, where: str) -> ObsCodec:
    if set(space.spaces) == {"observation", "action_mask"}:
        inner = _obs_codec(space["observation"], f"{where}['observation']")
        return dataclasses.replace(inner, split_mask=True)
    for key, sub in space.spaces.items():
        _obs_codec(sub, f"{where}[{key!r}]")
    return _flattened(space, where)


def obs_codec(space: spaces.Space, where: str = "observation space") -> ObsCodec:
    """The codec for an observation space; `UnsupportedSpaceError` names ``where`` if none fits."""
    return _obs_codec(space, where)


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class ActionCodec:
    """How one action space becomes discrete heads plus continuous values."""

    cardinalities: tuple[int, ...]
    starts: tuple[int, ...]
    continuous_dim: int
    #: action -> (discrete int64 [n_heads], continuous float32 [continuous_dim])
    encode: Callable[[Any], tuple[np.ndarray, np.ndarray]]
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
    raise UnsupportedSpaceError(
        f"{where}: {space!r} is not supported; supported action spaces: {ACTION_SPACES}"
    )


@_action_codec.register
def _(space: spaces.Discrete, where: str) -> ActionCodec:
    start = int(space.start)

    def make_writer(discrete: np.ndarray, continuous: np.ndarray) -> RowWriter:
        def write(p: int, action: Any) -> None:
            discrete[p, 0] = action - start

        return write

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.array([int(action) - start], dtype=np.int64), _NO_FLOATS

    return ActionCodec((int(space.n),), (start,), 0, encode, make_writer)


@_action_codec.register
def _(space: spaces.MultiDiscrete, where: str) -> ActionCodec:
    starts = np.asarray(space.start, dtype=np.int64).reshape(-1)

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(action, dtype=np.int64).reshape(-1) - starts, _NO_FLOATS

    cards = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
    return ActionCodec(cards, tuple(int(s) for s in starts), 0, encode)


@_action_codec.register
def _(space: spaces.MultiBinary, where: str) -> ActionCodec:
    heads = int(np.prod(space.n))

    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(action, dtype=np.int64).reshape(-1), _NO_FLOATS

    return ActionCodec((2,) * heads, (0,) * heads, 0, encode)


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

    return ActionCodec((), (), int(math.prod(shape)), encode, make_writer)


def _composite(children: list[ActionCodec], pick: Callable[[Any], list[Any]]) -> ActionCodec:
    def encode(action: Any) -> tuple[np.ndarray, np.ndarray]:
        parts = [child.encode(a) for child, a in zip(children, pick(action))]
        return (
            np.concatenate([d for d, _ in parts]) if parts else _NO_INTS,
            np.concatenate([c for _, c in parts]) if parts else _NO_FLOATS,
        )

    return ActionCodec(
        sum((c.cardinalities for c in children), ()),
        sum((c.starts for c in children), ()),
        sum(c.continuous_dim for c in children),
        encode,
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


# ----------------------------------------------------------------------------- inference


def spec_from_codecs(
    obs: ObsCodec, action: ActionCodec, *, action_mask: bool = False, **extra: Any
) -> BufferSpec:
    """The spec one agent's codecs describe (``extra`` sets n_agents, agent_ids, ...)."""
    return BufferSpec(
        obs_size=obs.size,
        obs_dtype=obs.dtype.name,
        discrete_action_cardinalities=action.cardinalities,
        continuous_action_dimension=action.continuous_dim,
        action_mask=(obs.split_mask or action_mask) and bool(action.cardinalities),
        discrete_action_starts=action.starts,
        obs_shape=obs.shape,
        **extra,
    )


def _structure(action: ActionCodec) -> str:
    kinds = [f"{len(action.cardinalities)} discrete head(s)"] if action.cardinalities else []
    kinds += ["continuous values"] if action.continuous_dim else []
    return " and ".join(kinds) or "no action"


def combine_agents(
    agent_ids: Sequence[str],
    obs: Sequence[ObsCodec],
    actions: Sequence[ActionCodec],
    *,
    state: ObsCodec | None = None,
    action_mask: bool = False,
) -> BufferSpec:
    """One spec for agents that share a buffer: the largest sizes, per-agent true sizes kept.

    Raises:
        SpecMismatchError: the agents' action spaces differ in structure, not just in size.
    """
    first = actions[0]
    for agent, action in zip(agent_ids, actions):
        if (len(action.cardinalities), bool(action.continuous_dim), action.starts) != (
                len(first.cardinalities), bool(first.continuous_dim), first.starts):
            raise SpecMismatchError(
                f"agents {agent_ids[0]!r} ({_structure(first)}, starts {first.starts}) and {agent!r} "
                f"({_structure(action)}, starts {action.starts}) have differently structured action "
                "spaces and cannot share one buffer; record each group of alike agents with its own recorder")
    cards = tuple(max(c) for c in zip(*(a.cardinalities for a in actions)))
    dtypes = {o.dtype for o in obs}
    padded = any(a.cardinalities != cards for a in actions)
    return BufferSpec(
        obs_size=max(o.size for o in obs),
        obs_dtype=dtypes.pop().name if len(dtypes) == 1 else "float32",
        discrete_action_cardinalities=cards,
        continuous_action_dimension=max(a.continuous_dim for a in actions),
        action_mask=bool(cards) and (action_mask or padded or any(o.split_mask for o in obs)),
        n_agents=len(agent_ids),
        agent_ids=tuple(agent_ids),
        state_size=None if state is None else state.size,
        state_dtype="float32" if state is None else state.dtype.name,
        discrete_action_starts=first.starts,
        obs_shape=obs[0].shape if len({o.shape for o in obs}) == 1 else (max(o.size for o in obs),),
        agent_obs_sizes=tuple(o.size for o in obs),
        agent_discrete_action_cardinalities=tuple(a.cardinalities for a in actions),
        agent_continuous_action_dimensions=tuple(a.continuous_dim for a in actions),
    )


def infer_spec(env: Any, *, info: Mapping[str, Any] | None = None) -> BufferSpec:
    """Infer the buffer layout of ``env`` from its spaces.

    Args:
        env: a ``gymnasium.Env``, a PettingZoo ``ParallelEnv`` or ``AECEnv``.
        info: a reset ``info`` dict (of any agent); an ``"action_mask"`` key turns masks on.

    Raises:
        UnsupportedSpaceError: a space has no flat layout (Text, Graph, Sequence, ...).
        SpecMismatchError: agents whose action spaces differ in structure.
        NotAnEnvError: ``env`` is not one of the supported kinds.

    >>> infer_spec(gym.make("CartPole-v1")).obs_size
    4
    """
    masked = info is not None and "action_mask" in info
    if isinstance(env, gym.Env):
        return spec_from_codecs(obs_codec(env.observation_space), action_codec(env.action_space),
                                action_mask=masked)
    if kinds.env_kind(env) is None:
        raise NotAnEnvError(f"infer_spec(env): expected one of {ENV_KINDS}, got {type(env).__name__}")
    ids = list(env.possible_agents)
    return combine_agents(
        [str(a) for a in ids],
        [obs_codec(env.observation_space(a), f"observation space of agent {a!r}") for a in ids],
        [action_codec(env.action_space(a), f"action space of agent {a!r}") for a in ids],
        state=state_codec(env),
        action_mask=masked,
    )


def state_codec(env: Any) -> ObsCodec | None:
    """The codec of a PettingZoo env's global state, or None when it has none.

    A state is recorded when the env both declares a ``state_space`` and overrides ``state()``
    (rps_v2, for one, has neither a working ``state()`` nor a ``state_space``).
    """
    if not kinds.implements_state(env):
        return None
    try:
        space = env.state_space
    except (AttributeError, NotImplementedError):
        return None
    return obs_codec(space, "state space")
