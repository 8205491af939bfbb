"""Play a recorded env with a policy (by default uniformly random legal actions).

`steps` plays forever and yields after every ``step`` call, so a caller can stop anywhere and
carry on later from the same env state (a distributed worker collects chunk after chunk this
way); `play` runs it to a budget, with `progress_bar`, for the command line and for `warm`, which
fills a buffer before training (velora's ``warm``).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError, positive_int
from flexibuff_envs.recording import record
from flexibuff_envs.spec.env_kinds import env_kind

#: what a policy is called with and returns, per env kind:
#: Gymnasium ``policy(obs, info) -> action``; vector ``policy(obs, info) -> actions`` (batched);
#: PettingZoo parallel ``policy(observations, infos) -> {agent: action}``; PettingZoo AEC
#: ``policy(observation, info, agent) -> action`` for the agent to act. Any may return `Annotated`.
Policy = Callable[..., Any]


class Annotated(NamedTuple):
    """A policy's action with annotations of the step it is about to take (``values``,
    ``discrete_log_probs``, ...): see ``annotate`` of the recorders. For a parallel env,
    ``fields`` is ``{agent: {name: value}}``; for a vector env each value has a leading
    ``[num_envs]`` axis."""

    action: Any
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Budget:
    """Stop after ``episodes`` ended episodes, or after ``steps`` env steps (one is None)."""

    episodes: int | None = None
    steps: int | None = None

    @property
    def total(self) -> int:
        return self.episodes if self.episodes is not None else self.steps or 0

    def spent(self, episodes: int, steps: int) -> bool:
        return episodes >= self.episodes if self.episodes is not None else steps >= (self.steps or 0)


@dataclass(frozen=True)
class Rollout:
    """What a run did: episodes ended, env steps (``step`` calls, x sub-envs), wall seconds, and
    the signal that stopped it early (``signal.SIGINT`` for Ctrl-C; 0: it ran to its budget)."""

    episodes: int
    steps: int
    seconds: float
    interrupted: int = 0


#: called with the running (episodes, steps) whenever an episode ends
Progress = Callable[[int, int], None]


def legal_sample(space: spaces.Space, obs: Any, info: Mapping[str, Any]) -> Any:
    """A uniformly random action of ``space``, among the legal ones when the env gives a mask.

    The mask is ``info["action_mask"]`` or ``obs["action_mask"]`` (PettingZoo classic games).
    """
    mask = info.get("action_mask")
    if mask is None and isinstance(obs, Mapping):
        mask = obs.get("action_mask")
    if mask is None or not isinstance(space, spaces.Discrete):
        return space.sample()
    return space.sample(mask=np.asarray(mask, dtype=np.int8))


def _legal_draws(rng: np.random.Generator, masks: np.ndarray, given: np.ndarray | None) -> np.ndarray:
    """One uniformly random legal action index per sub-env (``masks`` is ``[num_envs, n]``).

    A sub-env whose info had no mask this step (``given`` False there) draws from all its actions.
    """
    if given is not None:
        masks = masks | ~np.asarray(given, dtype=bool)[:, None]
    keys = np.where(masks, rng.random(masks.shape), -1.0)  # the largest key among the legal ones wins
    return keys.argmax(axis=1)


def steps(env: Any, api: str, *, seed: int, policy: Policy | None = None) -> Iterator[tuple[int, int]]:
    """Play ``env`` (a recorder of kind ``api``) forever; yield ``(env steps, episodes ended)``
    after each ``step`` call. Episodes restart as they end.

    Args:
        seed: seeds the first reset and the random legal actions (later resets go on from it).
        policy: see `Policy`; None plays uniformly random legal actions.
    """
    loop = {"gymnasium": _gymnasium, "vector": _vector, "parallel": _parallel, "aec": _aec}[api]
    return loop(env, seed, policy)


def play(env: Any, api: str, *, seed: int, budget: Budget, progress: Progress, policy: Policy | None = None) -> Rollout:
    """Run ``env`` (a recorder of kind ``api``) with ``policy`` (see `steps`) until ``budget`` is
    spent or Ctrl-C is pressed.

    A Ctrl-C (a ``KeyboardInterrupt``, or a subclass with the ``signum`` that raised it) stops the
    run early and keeps what was recorded: the recorder holds it across its bookkeeping
    (`flexibuff_envs.interrupts`), so it lands between steps or inside the env's own.
    """
    counts = [0, 0]  # episodes, steps: kept outside the loop so an interrupt keeps them
    start = time.perf_counter()
    try:
        for stepped, ended in steps(env, api, seed=seed, policy=policy):
            counts[1] += stepped
            if ended:
                counts[0] += ended
                progress(*counts)
            if budget.spent(*counts):
                break
    except KeyboardInterrupt as stop:
        return Rollout(
            counts[0], counts[1], time.perf_counter() - start, interrupted=getattr(stop, "signum", signal.SIGINT)
        )
    return Rollout(counts[0], counts[1], time.perf_counter() - start)


#: seconds a run lasts before its progress bar appears (short runs show none)
PROGRESS_DELAY = 1.0


def progress_bar(budget: Budget, label: str, *, show: bool | None = None) -> tuple[Any, Progress]:
    """A tqdm bar on stderr counting ``budget``'s unit, and the `Progress` that moves it. It
    appears once a run has lasted `PROGRESS_DELAY`, and (``show`` None) only on a terminal."""
    from tqdm import tqdm

    by_episode = budget.episodes is not None
    bar = tqdm(
        total=budget.total,
        desc=label,
        unit="episode" if by_episode else "step",
        file=sys.stderr,
        disable=None if show is None else not show,
        delay=PROGRESS_DELAY,
        leave=False,
        dynamic_ncols=True,
    )

    def progress(episodes: int, steps: int) -> None:
        bar.update((episodes if by_episode else steps) - bar.n)

    return bar, progress


def warm(
    env: Any,
    buffer: FlexibleBuffer | None = None,
    *,
    steps: int | None = None,
    episodes: int | None = None,
    policy: Policy | None = None,
    seed: int = 0,
    num_envs: int = 1,
    progress: bool | None = None,
    **record_options: Any,
) -> FlexibleBuffer:
    """Fill a buffer before training, as velora's ``warm(agent, n_samples, num_envs)`` does: play
    ``env`` with ``policy`` (by default uniformly random legal actions) and record every step,
    then return the buffer.

    Args:
        env: a Gymnasium id (``num_envs`` > 1: a vector env of that many synchronous copies), or
            an env of any kind `record` takes, or a recorder already (its buffer is filled).
            The vector env made of an id resets its sub-envs in the step that ends an episode
            (Gymnasium's same-step autoreset), so every env step is a recorded row.
        buffer: the buffer to fill (None: a new one; ``record_options`` go to `record`).
        steps, episodes: the budget, one of them. ``episodes=E`` stops at the step the ``E``-th
            episode ends: with one env, ``E`` whole episodes and nothing else. ``steps=N``
            stops after ``N`` env steps (a vector env's come ``num_envs`` at a time; one made
            with Gymnasium's default next-step autoreset records no row in a reset step), the
            last episode of each sub-env possibly still running, to be continued by whoever
            records on into the buffer.
        policy: see `Policy` (the same calls as the command line's ``record`` makes).
        seed: seeds the first reset and the random actions, as `steps` does.
        progress: a progress bar on stderr (None: on a terminal, for runs over a second).

    Raises:
        InvalidArgumentError: neither or both of ``steps`` and ``episodes``; ``num_envs`` for an
            env that is not an id.
    """
    if (steps is None) == (episodes is None):
        raise InvalidArgumentError("warm: pass steps= or episodes=, one of them")
    budget = Budget(
        episodes=None if episodes is None else positive_int("episodes", episodes),
        steps=None if steps is None else positive_int("steps", steps),
    )
    label = env if isinstance(env, str) else type(getattr(env, "unwrapped", env)).__name__
    if isinstance(env, str):
        made = positive_int("num_envs", num_envs)
        env = (  # same-step autoreset: every step of every sub-env is a transition, none a reset
            gym.make_vec(
                env,
                num_envs=made,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            )
            if made > 1
            else gym.make(env)
        )
    elif num_envs != 1:
        raise InvalidArgumentError(f"warm: num_envs={num_envs} makes a vector env of a Gymnasium id; pass the id")
    recorder = (
        env if isinstance(getattr(env, "buffer", None), FlexibleBuffer) else record(env, buffer, **record_options)
    )
    api = env_kind(recorder) or "gymnasium"  # `record` refused any other kind already
    bar, moved = progress_bar(budget, f"warm {label}", show=progress)
    try:
        done = play(recorder, api, seed=seed, budget=budget, progress=moved, policy=policy)
    finally:
        bar.close()
    if done.interrupted:  # Ctrl-C: the buffer holds what was recorded, and the caller is told
        raise KeyboardInterrupt
    return recorder.buffer  # type: ignore[no-any-return]


#: `_action`'s agent for a parallel env: the annotations name their agents
_EVERY = object()


def _action(output: Any, env: Any, agent: Any = None) -> Any:
    """The action of a policy's ``output``, after handing its annotations (if `Annotated`) to the
    recorder ``env``: for ``agent`` (AEC), for none (Gymnasium) or for each they name (`_EVERY`)."""
    if not isinstance(output, Annotated):
        return output
    if agent is _EVERY:
        for name, fields in output.fields.items():
            env.annotate(name, **fields)
    elif agent is None:
        env.annotate(**output.fields)
    else:
        env.annotate(agent, **output.fields)
    return output.action


def _gymnasium(env: Any, seed: int, policy: Policy | None) -> Iterator[tuple[int, int]]:
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    while True:
        action = legal_sample(env.action_space, obs, info) if policy is None else _action(policy(obs, info), env)
        obs, _, terminated, truncated, info = env.step(action)
        ended = terminated or truncated
        yield 1, int(ended)
        if ended:
            obs, info = env.reset()


def _vector(env: Any, seed: int, policy: Policy | None) -> Iterator[tuple[int, int]]:
    single = env.single_action_space
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    while True:
        masks = info.get("action_mask")
        if policy is not None:
            actions = _action(policy(obs, info), env)
        elif masks is None or not isinstance(single, spaces.Discrete):
            actions = env.action_space.sample()
        else:
            actions = _legal_draws(rng, np.asarray(masks, dtype=bool), info.get("_action_mask")) + single.start
        obs, _, terminated, truncated, info = env.step(actions)
        yield env.num_envs, int(np.count_nonzero(terminated | truncated))


def _parallel(env: Any, seed: int, policy: Policy | None) -> Iterator[tuple[int, int]]:
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    obs, infos = env.reset(seed=seed)
    while True:
        actions = (
            {a: legal_sample(env.action_space(a), obs[a], infos.get(a, {})) for a in env.agents}
            if policy is None
            else _action(policy(obs, infos), env, _EVERY)
        )
        obs, _, terminated, truncated, infos = env.step(actions)
        ended = not env.agents or all(terminated[a] or truncated[a] for a in terminated)
        yield 1, int(ended)
        if ended:
            obs, infos = env.reset()


def _aec(env: Any, seed: int, policy: Policy | None) -> Iterator[tuple[int, int]]:
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    env.reset(seed=seed)
    while True:
        for agent in env.agent_iter():
            obs, _, terminated, truncated, info = env.last()
            if terminated or truncated:
                action = None
            elif policy is None:
                action = legal_sample(env.action_space(agent), obs, info)
            else:
                action = _action(policy(obs, info, agent), env, agent)
            env.step(action)
            yield 1, int(not env.agents)
        env.reset()
