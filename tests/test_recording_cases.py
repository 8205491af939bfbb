"""One table of recording cases, run against both write engines.

A Gymnasium env is recorded a run of its steps at a time, each episode closed as it ends
(`SingleLaneRecorder`, a `LaneRecorder`); the same env inside a one-env vector env is recorded a
block of steps at a time, many episodes closed at once (`BatchRecorder`), under each autoreset
mode. Both write rows through the same row writers (`rowwriters.AgentRows.write_rows`). Both
must hold the same episodes, field by field, as a plain loop over the bare env says they should:
the recording rules (episode ends, ``G``, next values, masks, annotations, bootstraps, ring
wraps, faults) are one set, whichever engine applies them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import flexibuff_envs as fe
from flexibuff_envs.testing.reference import play
from tests.envs import ToyEnv

STEPS = 60
GAMMA = 0.9


class BadObsAt(gym.Wrapper):
    """Returns an observation outside its (discrete) space at the ``at``-th step, counted over
    resets: a vector env still stacks it, a recorder refuses it."""

    def __init__(self, env: gym.Env, at: int) -> None:
        super().__init__(env)
        self.at, self.t = at, 0

    def step(self, action: Any) -> Any:
        self.t += 1
        obs, *rest = self.env.step(action)
        return (99 if self.t == self.at else obs), *rest


@dataclass(frozen=True)
class Case:
    """An env to record, the ring's rows per lane, and what the loop gives the recorder."""

    make: Callable[[], gym.Env]
    num_steps: int = 200
    bootstrap: bool = False  # record with a bootstrap_fn
    values: bool = False  # annotate values every step (GAE)


CASES = {
    "terminations": Case(lambda: ToyEnv(lengths=(3, 5, 2, 7))),
    "truncations with a bootstrap": Case(lambda: ToyEnv(lengths=(4, 6), truncate=True), bootstrap=True),
    "a ring that wraps": Case(lambda: ToyEnv(lengths=(3, 5, 2, 7)), num_steps=17),
    "an episode longer than the ring": Case(lambda: ToyEnv(lengths=(25, 3, 4)), num_steps=17),
    "action masks in info": Case(lambda: ToyEnv(action_space=spaces.Discrete(5), lengths=(4, 3), mask_info=True)),
    "annotated values (GAE)": Case(lambda: ToyEnv(lengths=(6, 2), truncate=True), bootstrap=True, values=True),
    "categorical observations": Case(lambda: ToyEnv(spaces.MultiDiscrete([3, 4]), spaces.Discrete(3), lengths=(5,))),
    "a step that cannot be recorded": Case(lambda: BadObsAt(ToyEnv(spaces.Discrete(5), lengths=(6, 4)), at=13)),
}


def bootstrap_fn(obs_: np.ndarray) -> np.ndarray:
    return np.asarray(obs_, dtype=np.float64).sum(axis=-1)  # one value per sub-env (or the one env)


def value_of(step: int) -> float:
    return 0.1 * (step % 7)


def actions_for(case: Case) -> list[Any]:
    env = case.make()
    env.action_space.seed(3)
    return [env.action_space.sample() for _ in range(STEPS)]


def record_single(case: Case, actions: list[Any]) -> fe.FlexibleBuffer:
    env = fe.record(
        case.make(), num_steps=case.num_steps, gamma=GAMMA, bootstrap_fn=bootstrap_fn if case.bootstrap else None
    )
    env.reset(seed=0)
    for t, action in enumerate(actions):
        if case.values:
            env.annotate(values=value_of(t))
        try:
            _, _, terminated, truncated, _ = env.step(action)
        except fe.EnvValueError:
            env.reset()
            continue
        if terminated or truncated:
            env.reset()
    return env.buffer


def record_vector(case: Case, actions: list[Any], mode: AutoresetMode) -> fe.FlexibleBuffer:
    envs = fe.record(
        SyncVectorEnv([case.make], autoreset_mode=mode),
        num_steps=case.num_steps,
        gamma=GAMMA,
        bootstrap_fn=bootstrap_fn if case.bootstrap else None,
    )
    envs.reset(seed=0)
    done = np.zeros(1, dtype=bool)
    t = 0
    while t < len(actions):
        if mode == AutoresetMode.NEXT_STEP and done[0]:  # the step after an episode's end only resets
            envs.step(np.array([actions[t]]))
            done[:] = False
            continue
        if case.values:
            envs.annotate(values=np.array([value_of(t)]))
        try:
            _, _, terminated, truncated, _ = envs.step(np.array([actions[t]]))
        except fe.EnvValueError:
            envs.reset()
            t += 1
            continue
        done = terminated | truncated
        if mode == AutoresetMode.DISABLED and done[0]:
            envs.reset()
        t += 1
    return envs.buffer


FIELDS = (
    "obs",
    "obs_",
    "discrete_actions",
    "individual_rewards",
    "terminated",
    "truncated",
    "G",
    "action_mask",
    "action_mask_",
    "values",
    "advantages",
    "returns",
)


def assert_same_episodes(got: fe.FlexibleBuffer, want: fe.FlexibleBuffer, engine: str) -> None:
    mine, theirs = list(got.episodes()), list(want.episodes())
    assert [len(e.individual_rewards) for e in mine] == [len(e.individual_rewards) for e in theirs], engine
    assert mine, "the case records whole episodes"
    for k, (a, b) in enumerate(zip(mine, theirs)):
        for name in FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), f"{engine}: episode {k} {name}"
            if x is not None:
                xs = x if isinstance(x, list) else [x]
                ys = y if isinstance(y, list) else [y]
                for p, q in zip(xs, ys):
                    np.testing.assert_allclose(p, q, rtol=1e-6, err_msg=f"{engine}: episode {k} {name}")


@pytest.mark.parametrize("name", list(CASES))
def test_both_engines_record_each_case_alike(name: str) -> None:
    case = CASES[name]
    actions = actions_for(case)
    single = record_single(case, actions)
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED):
        assert_same_episodes(record_vector(case, actions, mode), single, f"{name}, vector {mode.value}")


def test_the_single_engine_matches_a_plain_loop() -> None:
    """The table's reference, itself checked: terminations recorded step by step equal a plain
    loop over the bare env with the same seed and actions (rewards, flags and G)."""
    case = CASES["terminations"]
    actions = actions_for(case)
    log = play(case.make(), seed=0, steps=STEPS, actions=actions)
    buffer = record_single(case, actions)
    episodes = list(buffer.episodes())
    rows = sum(len(e.individual_rewards) for e in episodes)
    assert rows == log.episodes[-1][1]
    np.testing.assert_allclose(np.concatenate([e.individual_rewards for e in episodes]), log.reward[:rows], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([e.G for e in episodes]), log.G(GAMMA)[:rows], rtol=1e-5)
    np.testing.assert_array_equal(np.concatenate([e.obs_ for e in episodes]), np.array(log.obs_[:rows]))


@pytest.mark.parametrize("vector", [False, True])
def test_an_observation_outside_its_discrete_space_is_refused_by_both_engines(vector: bool) -> None:
    """Stored, such a value could never be read back (a batch would fail on it): the step raises
    `EnvValueError` naming the space, and every row recorded before reads back unchanged."""
    case = CASES["a step that cannot be recorded"]
    env: Any = fe.record(SyncVectorEnv([case.make]), num_steps=100) if vector else fe.record(case.make(), num_steps=100)
    env.reset(seed=0)
    raised = 0
    for _ in range(30):  # the wrapped env's 13th step returns 99 from Discrete(5)
        before = env.buffer.sample_transitions(idx=np.arange(len(env.buffer)))
        try:
            _, _, terminated, truncated, _ = env.step(np.array([0]) if vector else 0)
        except fe.EnvValueError as error:
            assert "outside Discrete(5)" in str(error) and "observation space" in str(error)
            after = env.buffer.sample_transitions(idx=np.arange(len(env.buffer)))
            np.testing.assert_array_equal(after.obs, before.obs)  # nothing it held was lost
            np.testing.assert_array_equal(after.individual_rewards, before.individual_rewards)
            raised += 1
            env.reset()
            continue
        if not vector and (terminated or truncated):
            env.reset()
    assert raised == 1
    assert len(list(env.buffer.episodes())) >= 3  # whole episodes before and after it, all readable
