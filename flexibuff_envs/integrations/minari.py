"""Minari, Farama's standard for recorded datasets: `to_minari` writes a buffer's whole episodes as
a dataset, `from_minari` reads one into a `FlexibleBuffer` for offline RL, with ``G`` computed.

Minari datasets are single-agent: a multi-agent buffer is exported one agent at a time
(``agent=``), that agent's own transitions making its episodes. Observations and actions go out
in the env's own spaces (given ``env``, or rebuilt from the buffer's layout). Needs
``pip install 'flexibuff_envs[minari]'``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array

from flexibuff_envs.batch import FlexiBatch
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.codecs import action_codec, obs_codec
from flexibuff_envs.errors import EmptyBufferError, MissingExtraError
from flexibuff_envs.spec import BufferSpec, spec_from_codecs

try:
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer
except ImportError as error:  # pragma: no cover - the test extra installs it
    raise MissingExtraError("flexibuff_envs.integrations.minari needs Minari: "
                            "pip install 'flexibuff_envs[minari]'") from error


def _spaces(spec: BufferSpec) -> tuple[spaces.Space, spaces.Space]:
    """Observation and action spaces a buffer's layout stands for (when no env is given)."""
    if spec.obs_categories:
        obs: spaces.Space = (spaces.Discrete(spec.obs_categories[0]) if len(spec.obs_categories) == 1
                             else spaces.MultiDiscrete(list(spec.obs_categories)))
    else:
        obs = spaces.Box(-np.inf, np.inf, spec.obs_shape, np.dtype(spec.obs_dtype))
    cards, starts = spec.discrete_action_cardinalities, spec.discrete_action_starts
    discrete = (spaces.Discrete(cards[0], start=starts[0]) if len(cards) == 1
                else spaces.MultiDiscrete(list(cards), start=list(starts)) if cards else None)
    continuous = (spaces.Box(-np.inf, np.inf, (spec.continuous_action_dimension,), np.float32)
                  if spec.continuous_action_dimension else None)
    if discrete is not None and continuous is not None:
        return obs, spaces.Tuple((discrete, continuous))
    return obs, discrete if discrete is not None else continuous  # type: ignore[return-value]


def _observations(batch: FlexiBatch, agent: int | None, space: spaces.Space) -> Any:
    """An episode's observations and its final one (``T + 1``), as values of ``space``."""
    flat = np.concatenate([_agent(batch.obs, agent), _agent(batch.obs_, agent)[-1:]])
    if isinstance(space, spaces.Box):
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


def to_minari(buffer: FlexibleBuffer, dataset_id: str, env: Any = None, *, agent: str | None = None,
              **metadata: Any) -> Any:
    """Write ``buffer``'s whole ended episodes as the Minari dataset ``dataset_id`` and return it
    (`minari.MinariDataset`). Each episode's observations are its steps' and its final one.

    Args:
        env: the env (or its id) the buffer recorded: its spaces, and Minari's record of it.
            None: spaces rebuilt from the buffer's layout.
        agent: for a multi-agent buffer, the agent whose own transitions to export.
        metadata: more of ``minari.create_dataset_from_buffers``'s keywords (``author``,
            ``author_email``, ``code_permalink``: Minari warns when they are missing;
            ``description`` defaults to what was recorded, ``eval_env`` to ``env``).

    Raises:
        ValueError: a multi-agent buffer without ``agent`` (or an unknown one); no whole episode.
    """
    spec = buffer.spec
    index: int | None = None
    if spec.n_agents > 1:
        if agent not in spec.agent_ids:
            raise ValueError(f"Minari datasets are single-agent and this buffer holds {spec.n_agents} agents "
                             f"{list(spec.agent_ids)}: export one dataset per agent, "
                             f"to_minari(buffer, dataset_id, agent=...)" if agent is None
                             else f"to_minari: agent {agent!r} is not one of {list(spec.agent_ids)}")
        index = spec.agent_ids.index(agent)
    if env is not None and isinstance(env, str):
        import gymnasium as gym

        env = gym.make(env)
    obs_space, action_space = (env.observation_space, env.action_space) if env is not None else _spaces(spec)
    episodes: list[EpisodeBuffer] = []
    for batch in buffer.episodes():
        if index is not None:  # its own transitions only
            batch = _own(batch, index)
            if not len(batch):
                continue
        episodes.append(EpisodeBuffer(
            id=len(episodes), observations=_observations(batch, index, obs_space),
            actions=_actions(batch, index, action_space),
            rewards=np.asarray(_agent(batch.individual_rewards, index), dtype=np.float64),
            terminations=_agent(batch.terminated, index), truncations=_agent(batch.truncated, index), infos={}))
    if not episodes:
        raise EmptyBufferError("to_minari: the buffer holds no whole ended episode" +
                               (f" of agent {agent!r}" if agent else ""))
    metadata.setdefault("algorithm_name", "flexibuff_envs")
    metadata.setdefault("description", f"{len(episodes)} whole episodes recorded with flexibuff_envs"
                        + (f" (agent {agent!r} of {list(spec.agent_ids)})" if agent is not None else ""))
    if env is not None:
        metadata.setdefault("eval_env", env.spec if getattr(env, "spec", None) is not None else None)
    return minari.create_dataset_from_buffers(dataset_id, episodes, env=env, observation_space=obs_space,
                                              action_space=action_space, **metadata)


def _own(batch: FlexiBatch, agent: int) -> FlexiBatch:
    """The rows of a multi-agent episode where ``agent`` acted (its own transitions)."""
    active = np.asarray(batch.active[agent])
    return FlexiBatch(**{name: (value[:, active] if name != "idx" else value[active])
                         for name, value in vars(batch).items()
                         if value is not None and not isinstance(value, list) and name in _PER_AGENT | {"idx"}})


_PER_AGENT = {"obs", "obs_", "discrete_actions", "continuous_actions", "individual_rewards", "terminated",
              "truncated", "active"}


def from_minari(dataset_or_id: Any, **buffer_options: Any) -> FlexibleBuffer:
    """A `FlexibleBuffer` holding every episode of a Minari dataset (an id or a loaded dataset),
    with ``G`` (and GAE once values are given) computed as when recording.

    ``buffer_options`` go to `FlexibleBuffer.from_spec` (``num_steps`` defaults to the dataset's
    steps; ``gamma``, ``seed``, ...).
    """
    dataset = minari.load_dataset(dataset_or_id) if isinstance(dataset_or_id, str) else dataset_or_id
    obs, action = obs_codec(dataset.observation_space), action_codec(dataset.action_space)
    spec = spec_from_codecs(obs, action)
    buffer_options.setdefault("num_steps", max(int(dataset.total_steps), 1))
    buffer = FlexibleBuffer.from_spec(spec, **buffer_options)
    stored = obs.compact() if spec.obs_categories else obs
    fields = {name: buffer.field(name) for name in ("obs", "obs_", "individual_rewards", "global_rewards",
                                                      "terminated", "truncated")}
    discrete = buffer.field("discrete_actions") if action.cardinalities else None
    continuous = buffer.field("continuous_actions") if action.continuous_dim else None
    for episode in dataset.iterate_episodes():
        steps = len(episode.rewards)
        if not steps:
            continue
        buffer.begin_episode()
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
            continuous[0, rows, :action.continuous_dim] = values
        fields["individual_rewards"][0, rows] = fields["global_rewards"][rows] = episode.rewards
        fields["terminated"][0, rows] = episode.terminations
        fields["truncated"][0, rows] = episode.truncations
        buffer.end_episode()
    buffer.compact()  # each observation stored once, final ones apart
    return buffer
