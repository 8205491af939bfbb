"""`check_recorder` on real envs, on a broken recorder, and as a property over random spaces."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flexibuff_envs as fe
from flexibuff_envs.testing import RecorderCheckError, check_recorder
from tests.envs import ToyEnv

warnings.filterwarnings("ignore", module="pettingzoo")
pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.classic import connect_four_v3, tictactoe_v3


@pytest.mark.parametrize(
    "make",
    [
        lambda: gym.make("CartPole-v1"),
        lambda: gym.make("Taxi-v4", max_episode_steps=20),
        lambda: simple_spread_v3.parallel_env(max_cycles=12),
        lambda: knights_archers_zombies_v11.parallel_env(line_death=True, spawn_delay=1000, max_cycles=60),
        lambda: connect_four_v3.env(),
        lambda: tictactoe_v3.env(),
    ],
    ids=["CartPole", "Taxi", "simple_spread", "knights_archers_zombies", "connect_four", "tictactoe"],
)
def test_real_envs_pass(make: Any) -> None:
    report = check_recorder(make(), steps=60, seed=1)
    assert report.problems == [] and report.rows > 0 and report.episodes >= 1


def test_a_small_ring_keeps_the_newest_whole_episodes() -> None:
    report = check_recorder(gym.make("CartPole-v1"), steps=300, num_steps=50)
    assert report.rows <= 50 and report.problems == []


def test_a_recorder_that_records_wrong_is_caught_with_the_field_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from flexibuff_envs.recording import single_agent as staged

    real = staged.StagedSteps.flush

    def off_by_one_reward(self: Any, *args: Any) -> list[int]:
        rows = real(self, *args)
        if 7 in rows:
            self.slot.values.add_reward(7, 1.0)
        return rows

    monkeypatch.setattr(staged.StagedSteps, "flush", off_by_one_reward)
    with pytest.raises(RecorderCheckError, match="individual_rewards differs at step 7"):
        check_recorder(gym.make("CartPole-v1"), steps=30)
    report = check_recorder(gym.make("CartPole-v1"), steps=30, strict=False)
    assert any(p.startswith("G differs") for p in report.problems)


def test_a_non_deterministic_env_is_named_as_such() -> None:
    class Noisy(ToyEnv):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            return super().reset(seed=None)  # ignores the seed

    report = check_recorder(Noisy(), steps=20, strict=False)
    assert any("not deterministic" in p for p in report.problems)


def test_a_vector_env_or_anything_else_is_refused() -> None:
    with pytest.raises(fe.NotAnEnvError, match="one env"):
        check_recorder(gym.make_vec("CartPole-v1", num_envs=2))
    with pytest.raises(fe.NotAnEnvError, match="gymnasium.Env"):
        check_recorder("CartPole-v1")


def leaf(kind: str) -> st.SearchStrategy[spaces.Space]:
    sizes = st.integers(1, 4)
    if kind == "obs":
        box = st.builds(
            lambda shape, dtype: spaces.Box(0, 100, shape, dtype),
            st.lists(sizes, min_size=1, max_size=3).map(tuple),
            st.sampled_from([np.float32, np.float64, np.uint8, np.int32]),
        )
    else:
        box = st.builds(lambda n: spaces.Box(-1, 1, (n,), np.float32), sizes)
    return st.one_of(
        box,
        st.builds(lambda n, start: spaces.Discrete(n, start=start), st.integers(2, 5), st.integers(-2, 2)),
        st.builds(lambda nvec: spaces.MultiDiscrete(nvec), st.lists(st.integers(2, 4), min_size=1, max_size=3)),
        st.builds(spaces.MultiBinary, sizes),
    )


def space(kind: str) -> st.SearchStrategy[spaces.Space]:
    return st.one_of(
        leaf(kind),
        st.lists(leaf(kind), min_size=1, max_size=3).map(lambda s: spaces.Tuple(tuple(s))),
        st.lists(leaf(kind), min_size=1, max_size=3).map(lambda s: spaces.Dict({f"k{i}": x for i, x in enumerate(s)})),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    obs=space("obs"),
    action=space("action"),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    truncate=st.booleans(),
    masked=st.booleans(),
    steps=st.integers(1, 60),
    ring=st.integers(1, 40),
    seed=st.integers(0, 1000),
)
def test_any_spaces_any_lengths_any_ring(
    obs: spaces.Space,
    action: spaces.Space,
    lengths: list[int],
    truncate: bool,
    masked: bool,
    steps: int,
    ring: int,
    seed: int,
) -> None:
    """Every recorded row equals the reference log, and every sampled episode is whole."""
    env = ToyEnv(
        obs, action, lengths=tuple(lengths), truncate=truncate, mask_info=masked and isinstance(action, spaces.Discrete)
    )
    report = check_recorder(env, steps=steps, num_steps=ring, seed=seed, gamma=0.9, strict=False)
    assert report.problems == []
    assert report.rows <= ring
