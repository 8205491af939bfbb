"""Minari, Farama's standard for recorded datasets: `to_minari` writes a buffer's whole episodes as
a dataset, `from_minari` reads one into a `FlexibleBuffer` for offline RL, with ``G`` computed.

Minari datasets are single-agent (its issue #190): a multi-agent buffer goes out as one dataset
per agent (``agent=``, or `to_minari_agents` for all under one namespace), that agent's own
transitions making its episodes and the other agents' actions and the global state riding in
its infos. Observations and actions go out in the env's own spaces (given ``env``, or rebuilt
from the buffer's layout). Needs ``pip install -e '.[minari]'``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array

from flexibuff_envs.batch import ONCE_PER_ROW, PER_AGENT, FlexiBatch
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import EmptyBufferError, InvalidArgumentError, MissingExtraError, needs
from flexibuff_envs.spec import BufferSpec, spec_from_codecs
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.env_kinds import env_kind
from flexibuff_envs.spec.observations import obs_codec
from flexibuff_envs.storage.fields import stored_obs

try:
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer
    from minari.namespace import create_namespace, list_local_namespaces
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError(needs("flexibuff_envs.integrations.minari", "minari[hdf5]", "minari")) from error


def _spaces(spec: BufferSpec) -> tuple[spaces.Space, spaces.Space]:
    """Observation and action spaces a buffer's layout stands for (when no env is given)."""
    if spec.obs_categories:
        obs: spaces.Space = (
            spaces.Discrete(spec.obs_categories[0])
            if len(spec.obs_categories) == 1
            else spaces.MultiDiscrete(list(spec.obs_categories))
        )
    else:  # an image's integers span their dtype (a Box of integers takes no infinite bound)
        dtype = np.dtype(spec.obs_dtype)
        low, high = (np.iinfo(dtype).min, np.iinfo(dtype).max) if dtype.kind in "iu" else (-np.inf, np.inf)
        obs = spaces.Box(low, high, spec.obs_shape, dtype)
    cards, starts = spec.discrete_action_cardinalities, spec.discrete_action_starts
    discrete = (
        spaces.Discrete(cards[0], start=starts[0])
        if len(cards) == 1
        else spaces.MultiDiscrete(list(cards), start=list(starts))
        if cards
        else None
    )
    continuous = (
        spaces.Box(-np.inf, np.inf, (spec.continuous_action_dimension,), np.float32)
        if spec.continuous_action_dimension
        else None
    )
    if discrete is not None and continuous is not None:
        return obs, spaces.Tuple((discrete, continuous))
    return obs, discrete if discrete is not None else continuous  # type: ignore[return-value]


def _observations(batch: FlexiBatch, agent: int | None, space: spaces.Space) -> Any:
    """An episode's observations and its final one (``T + 1``), as values of ``space``."""
    flat = np.concatenate([_agent(batch.obs, agent), _agent(batch.obs_, agent)[-1:]])
    if isinstance(space, spaces.Box):  # an agent smaller than others is padded in the buffer
        flat = flat.reshape(len(flat), -1)[:, : spaces.flatdim(space)]
        return flat.reshape((len(flat), *space.shape)).astype(space.dtype, copy=False)
    if isinstance(space, spaces.Discrete):  # batches show categories one-hot
        return np.argmax(flat, axis=-1) + space.start
    return _batch(space, flat)


def _actions(batch: FlexiBatch, agent: int | None, space: spaces.Space) -> Any:
    discrete: Any = None if batch.discrete_actions is None else _agent(batch.discrete_actions, agent)
    continuous: Any = None if batch.continuous_actions is None else _agent(batch.continuous_actions, agent)
    if isinstance(space, spaces.Discrete):
        return discrete[:, 0] + space.start
    if isinstance(space, spaces.MultiDiscrete):
        return (discrete + np.asarray(space.start).reshape(-1)).reshape((len(discrete), *space.shape))
    if isinstance(space, spaces.Box):
        return continuous.reshape((len(continuous), *space.shape))
    flat = np.concatenate([part for part in (discrete, continuous) if part is not None], axis=-1).astype(np.float64)
    return _batch(space, flat)


def _batch(space: spaces.Space, flat: np.ndarray) -> Any:
    """Flattened rows as one batch of a composite ``space`` (a dict of arrays for a Dict), as
    Minari stores them; each row is unflattened on its own."""
    out = create_empty_array(space, len(flat))
    return concatenate(space, [spaces.unflatten(space, row) for row in flat], out)  # type: ignore[arg-type]


def _agent(value: np.ndarray, agent: int | None) -> np.ndarray:
    return value if agent is None else value[agent]


def to_minari(
    buffer: FlexibleBuffer, dataset_id: str, env: Any = None, *, agent: str | None = None, **metadata: Any
) -> Any:
    """Write ``buffer``'s whole ended episodes as the Minari dataset ``dataset_id`` and return it
    (`minari.MinariDataset`). Each episode's observations are its steps' and its final one.

    A multi-agent buffer goes out one agent at a time (``agent``): the episode's rows where that
    agent acted make its episode, and its ``infos`` carry the rest of the step (`_infos`).

    Args:
        env: the env (or its Gymnasium id) the buffer recorded: the agent's spaces, and for a
            Gymnasium env Minari's record of it (``recover_environment``); a PettingZoo env is
            named in the description and its library in ``requirements``. None: spaces rebuilt
            from the buffer's layout.
        agent: for a multi-agent buffer, the agent whose episodes to export.
        metadata: more of ``minari.create_dataset_from_buffers``'s keywords (``author``,
            ``author_email``, ``code_permalink``: Minari warns when they are missing;
            ``description`` defaults to what was recorded, ``eval_env`` to ``env``;
            ``jpeg_encoding`` to False: frames go out exactly as recorded).

    Raises:
        ValueError: a multi-agent buffer without ``agent`` (or an unknown one).
        EmptyBufferError: no whole episode (of that agent).
    """
    spec = buffer.spec
    index: int | None = None
    if spec.n_agents > 1:
        if agent not in spec.agent_ids:
            raise InvalidArgumentError(
                f"Minari datasets are single-agent and this buffer holds {spec.n_agents} agents "
                f"{list(spec.agent_ids)}: export one dataset per agent, "
                f"to_minari(buffer, dataset_id, agent=...) or to_minari_agents(buffer, namespace)"
                if agent is None
                else f"to_minari: agent {agent!r} is not one of {list(spec.agent_ids)}"
            )
        index = spec.agent_ids.index(agent)
    env = _made(env)
    spaces_of = _spaces_of(env, spec)
    obs_space, action_space = spaces_of(agent)
    episodes: list[EpisodeBuffer] = []
    seeds = buffer.episode_origins()["seed"].tolist()  # Minari keeps each episode's reset seed too
    for k, batch in enumerate(buffer.episodes()):
        if index is not None:  # its own rows only
            batch = _rows(batch, np.asarray(batch.active[index]))
            if not len(batch.idx):
                continue
        episodes.append(
            EpisodeBuffer(
                id=len(episodes),
                seed=seeds[k] if seeds[k] >= 0 else None,
                observations=_observations(batch, index, obs_space),
                actions=_actions(batch, index, action_space),
                rewards=np.asarray(_agent(batch.individual_rewards, index), dtype=np.float64),
                terminations=_agent(batch.terminated, index),
                truncations=_agent(batch.truncated, index),
                infos=_infos(batch, index, spec, spaces_of),
            )
        )
    if not episodes:
        raise EmptyBufferError(
            "to_minari: the buffer holds no whole ended episode" + (f" of agent {agent!r}" if agent else "")
        )
    pettingzoo = env is not None and env_kind(env) in ("parallel", "aec")
    name = (env.metadata.get("name") or type(env.unwrapped).__name__) if pettingzoo else None
    metadata.setdefault("algorithm_name", "flexibuff_envs")
    metadata.setdefault("jpeg_encoding", False)
    metadata.setdefault(
        "description",
        f"{len(episodes)} whole episodes recorded with flexibuff_envs"
        + (f" from the PettingZoo env {name}" if pettingzoo else "")
        + (f" (agent {agent!r} of {list(spec.agent_ids)})" if agent is not None else ""),
    )
    if env is not None and not pettingzoo:
        metadata.setdefault("eval_env", env.spec if getattr(env, "spec", None) is not None else None)
    with warnings.catch_warnings():
        if pettingzoo:  # Minari recovers Gymnasium envs only: its warnings of no env spec cannot be acted on
            import pettingzoo as library

            metadata.setdefault("requirements", [f"pettingzoo=={library.__version__}"])
            warnings.filterwarnings("ignore", message=r"(`eval_env` is set to None|env_spec is None)")
        return minari.create_dataset_from_buffers(
            dataset_id,
            episodes,
            env=None if pettingzoo else env,
            observation_space=obs_space,
            action_space=action_space,
            **metadata,
        )


def to_minari_agents(
    buffer: FlexibleBuffer, namespace: str, env: Any = None, *, version: int = 0, **metadata: Any
) -> dict[str, Any]:
    """One Minari dataset per agent of a multi-agent ``buffer``, ``NAMESPACE/AGENT-vVERSION``
    each (`to_minari`'s), under the namespace ``namespace`` (made when missing, described as the
    recording). Returns the datasets by agent. None is written when one of the ids is taken; a
    Ctrl-C between two agents leaves the datasets of the agents before it."""
    ids = {agent: f"{namespace}/{agent}-v{version}" for agent in buffer.spec.agent_ids}
    taken = [dataset_id for dataset_id in ids.values() if dataset_id in minari.list_local_datasets()]
    if taken:
        raise InvalidArgumentError(
            f"to_minari_agents: Minari already holds {', '.join(taken)}; "
            "pick another namespace or version, or minari.delete_dataset them"
        )
    if namespace not in list_local_namespaces():
        create_namespace(
            namespace,
            description=f"one dataset per agent of a recording with flexibuff_envs: {', '.join(ids.values())}",
        )
    env = _made(env)
    return {agent: to_minari(buffer, dataset_id, env, agent=agent, **metadata) for agent, dataset_id in ids.items()}


def _made(env: Any) -> Any:
    if isinstance(env, str):
        import gymnasium as gym

        return gym.make(env)
    return env


def _spaces_of(env: Any, spec: BufferSpec) -> Callable[[str | None], tuple[spaces.Space, spaces.Space]]:
    """An agent's observation and action spaces: the env's, or rebuilt from the buffer's layout."""
    if env is None:
        rebuilt = _spaces(spec)
        return lambda agent: rebuilt
    if env_kind(env) in ("parallel", "aec"):
        return lambda agent: (_observed(env.observation_space(agent)), env.action_space(agent))
    return lambda agent: (_observed(env.observation_space), env.action_space)


def _observed(space: spaces.Space) -> spaces.Space:
    """The part of an observation space the buffer keeps as ``obs`` (PettingZoo's classic games
    pair it with an action mask, which goes to the infos)."""
    if isinstance(space, spaces.Dict) and set(space.spaces) == {"observation", "action_mask"}:
        return space["observation"]
    return space


def _infos(
    batch: FlexiBatch,
    index: int | None,
    spec: BufferSpec,
    spaces_of: Callable[[str | None], tuple[spaces.Space, spaces.Space]],
) -> dict[str, Any]:
    """What an episode carries beside the agent's own transitions, ``T + 1`` values each as Minari
    keeps infos: ``state`` (the global state at each observation, the final one included) and
    ``action_mask`` (the agent's legal actions at each observation) when recorded, and for every
    other agent its ``actions`` (in its action space) and whether it was ``active`` at each step,
    aligned with the episode's actions and padded by one step, as Minari pads actions."""
    infos: dict[str, Any] = {}
    if batch.state is not None:
        infos["state"] = np.concatenate([batch.state, batch.state_[-1:]])
    if batch.action_mask is not None:
        mask, final = (np.concatenate(heads, axis=-1) for heads in (batch.action_mask, batch.action_mask_))
        infos["action_mask"] = np.concatenate([_agent(mask, index), _agent(final, index)[-1:]])
    if index is not None:
        others = [k for k in range(spec.n_agents) if k != index]
        infos["actions"] = {
            spec.agent_ids[k]: _padded(_actions(batch, k, spaces_of(spec.agent_ids[k])[1])) for k in others
        }
        infos["active"] = {spec.agent_ids[k]: _padded(np.asarray(batch.active[k])) for k in others}
    return infos


def _padded(values: Any) -> Any:
    if isinstance(values, dict):
        return {key: _padded(value) for key, value in values.items()}
    if isinstance(values, tuple):  # a Tuple space's parts
        return tuple(_padded(value) for value in values)
    return np.concatenate([values, np.zeros_like(values[:1])])


def _rows(batch: FlexiBatch, rows: np.ndarray) -> FlexiBatch:
    """The rows ``rows`` of an episode's batch, every agent's and the global fields."""
    kept: dict[str, Any] = {}
    for name in PER_AGENT:
        value = getattr(batch, name)
        if value is not None:
            kept[name] = [head[:, rows] for head in value] if isinstance(value, list) else value[:, rows]
    for name in ONCE_PER_ROW:
        value = getattr(batch, name)
        if value is not None:
            kept[name] = value[rows]
    return FlexiBatch(**kept)


def from_minari(dataset_or_id: Any, **buffer_options: Any) -> FlexibleBuffer:
    """A `FlexibleBuffer` holding every episode of a Minari dataset (an id or a loaded dataset),
    with ``G`` (and GAE once values are given) computed as when recording.

    ``buffer_options`` go to `FlexibleBuffer.from_spec` (``num_steps`` defaults to the dataset's
    steps; ``gamma``, ``seed``, ...).
    """
    dataset = minari.load_dataset(dataset_or_id) if isinstance(dataset_or_id, str) else dataset_or_id
    obs, action = obs_codec(dataset.observation_space), action_codec(dataset.action_space)
    spec = spec_from_codecs(obs, action, env_api="gymnasium")
    buffer_options.setdefault("num_steps", max(int(dataset.total_steps), 1))
    buffer = FlexibleBuffer.from_spec(spec, **buffer_options)
    stored = stored_obs(spec, obs)
    fields = {
        name: buffer.field(name)
        for name in ("obs", "obs_", "individual_rewards", "global_rewards", "terminated", "truncated")
    }
    discrete = buffer.field("discrete_actions") if action.cardinalities else None
    continuous = buffer.field("continuous_actions") if action.continuous_dim else None
    metadata = dataset.storage.get_episode_metadata(dataset.episode_indices)  # each one's reset seed, if any
    for episode, meta in zip(dataset.iterate_episodes(), metadata):
        steps = len(episode.rewards)
        if not steps:
            continue
        seed = meta.get("seed")
        buffer.begin_episode(seed=int(seed) if isinstance(seed, (int, np.integer)) else None)
        rows = buffer.claim_rows(steps)
        observations = stored.batch(episode.observations)
        fields["obs"][0, rows] = observations[:-1]
        fields["obs_"][0, rows] = observations[1:]
        heads = np.zeros((steps, len(action.cardinalities)), dtype=np.int64)
        values = np.zeros((steps, action.continuous_dim), dtype=np.float32)
        action.write_batch(heads, values, episode.actions)
        if discrete is not None:
            discrete[0, rows] = heads
        if continuous is not None:
            continuous[0, rows, : action.continuous_dim] = values
        fields["individual_rewards"][0, rows] = fields["global_rewards"][rows] = episode.rewards
        fields["terminated"][0, rows] = episode.terminations
        fields["truncated"][0, rows] = episode.truncations
        buffer.end_episode()
    buffer.compact()  # each observation stored once, final ones apart
    return buffer
