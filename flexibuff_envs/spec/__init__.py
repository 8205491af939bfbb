"""What a buffer holds, read off an env's spaces: `BufferSpec` and `infer_spec` here; a codec
per observation space kind (`observations`) and per action space kind (`actions`); which API an
env speaks (`env_kinds`). Imports: `errors` only."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from flexibuff_envs.errors import NotAnEnvError, SpecMismatchError, UnsupportedSpaceError
from flexibuff_envs.spec import env_kinds
from flexibuff_envs.spec.actions import ActionCodec, action_codec
from flexibuff_envs.spec.observations import ObsCodec, obs_codec, one_hot_problem

ENV_KINDS = "gymnasium.Env, gymnasium.vector.VectorEnv, pettingzoo ParallelEnv or pettingzoo AECEnv"


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
        obs_categories: for observations made of categories only (Discrete, MultiDiscrete, Tuple
            or Dict of those), each one's size: rows store one index per category, batches get
            the one-hot flattening (``obs_size = sum(obs_categories)`` float32 values).
        extra_fields: fields of your own, per agent, each ``(name, shape, dtype name)``: filled
            through ``annotate(name=value)``, returned by every sampling mode (`storage.extra_fields`).
        env_api: the API the rows were recorded from: "gymnasium", "vector", "parallel" (row
            ``k`` of an episode: the agents' ``k``-th simultaneous step) or "aec" (each agent's
            ``k``-th turn); "" when unknown (a spec made by hand, an imported dataset). Not
            part of the layout: buffers of any API can hold the same rows.
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
    obs_categories: tuple[int, ...] = ()
    extra_fields: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    env_api: str = dataclasses.field(default="", compare=False)  # provenance, not layout: never compared

    #: Fields that decide array shapes; a user-supplied buffer must agree on these.
    LAYOUT_FIELDS = (
        "obs_size",
        "obs_dtype",
        "discrete_action_cardinalities",
        "continuous_action_dimension",
        "action_mask",
        "n_agents",
        "state_size",
        "state_dtype",
        "n_envs",
        "obs_categories",
        "extra_fields",
    )

    def __post_init__(self) -> None:
        problem = one_hot_problem(self.obs_categories)
        if problem:
            raise UnsupportedSpaceError(problem)

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


# ----------------------------------------------------------------------------- inference


def spec_from_codecs(obs: ObsCodec, action: ActionCodec, *, action_mask: bool = False, **extra: Any) -> BufferSpec:
    """The spec one agent's codecs describe (``extra`` sets n_agents, agent_ids, ...)."""
    return BufferSpec(
        obs_size=obs.size,
        obs_dtype=obs.dtype.name,
        discrete_action_cardinalities=action.cardinalities,
        continuous_action_dimension=action.continuous_dim,
        action_mask=(obs.split_mask or action_mask) and bool(action.cardinalities),
        discrete_action_starts=action.starts,
        obs_shape=obs.shape,
        obs_categories=obs.categories,
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
            len(first.cardinalities),
            bool(first.continuous_dim),
            first.starts,
        ):
            raise SpecMismatchError(
                f"agents {agent_ids[0]!r} ({_structure(first)}, starts {first.starts}) and {agent!r} "
                f"({_structure(action)}, starts {action.starts}) have differently structured action "
                "spaces and cannot share one buffer; record each group of alike agents with its own recorder"
            )
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
        obs_categories=obs[0].categories if len({o.categories for o in obs}) == 1 else (),
    )


def infer_spec(env: Any, *, info: Mapping[str, Any] | None = None) -> BufferSpec:
    """Infer the buffer layout of ``env`` from its spaces.

    Args:
        env: a ``gymnasium.Env``, a ``gymnasium.vector.VectorEnv``, a PettingZoo ``ParallelEnv`` or
            ``AECEnv``.
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
        return spec_from_codecs(
            obs_codec(env.observation_space), action_codec(env.action_space), action_mask=masked, env_api="gymnasium"
        )
    if isinstance(env, gym.vector.VectorEnv):
        return spec_from_codecs(
            obs_codec(env.single_observation_space),
            action_codec(env.single_action_space),
            action_mask=masked,
            n_envs=env.num_envs,
            env_api="vector",
        )
    kind = env_kinds.env_kind(env)
    if kind is None:
        raise NotAnEnvError(f"infer_spec(env): expected one of {ENV_KINDS}, got {type(env).__name__}")
    ids = list(env.possible_agents)
    spec = combine_agents(
        [str(a) for a in ids],
        [obs_codec(env.observation_space(a), f"observation space of agent {a!r}") for a in ids],
        [action_codec(env.action_space(a), f"action space of agent {a!r}") for a in ids],
        state=state_codec(env),
        action_mask=masked,
    )
    return dataclasses.replace(spec, env_api=kind)


def state_codec(env: Any) -> ObsCodec | None:
    """The codec of a PettingZoo env's global state, or None when it has none.

    A state is recorded when the env both declares a ``state_space`` and overrides ``state()``
    (rps_v2, for one, has neither a working ``state()`` nor a ``state_space``).
    """
    if not env_kinds.implements_state(env):
        return None
    try:
        space = env.state_space
    except (AttributeError, NotImplementedError):
        return None
    return obs_codec(space, "state space")
