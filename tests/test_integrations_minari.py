"""Recorded episodes out to a Minari dataset and back: what Minari reads equals what was recorded,
and an imported dataset samples as a recorded buffer, with G computed."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("minari")
pytest.importorskip("h5py")

import minari

import flexibuff_envs as fe
from flexibuff_envs.integrations.minari import from_minari, to_minari
from flexibuff_envs.testing.reference import plain_returns
from tests.envs import recorded_spread


@pytest.fixture(autouse=True)
def datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))


def recorded(name: str, steps: int = 300, **make: object) -> fe.FlexibleBuffer:
    env = fe.record(gym.make(name, **make), num_steps=1000, gamma=0.9)
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return env.buffer


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "make"), [("CartPole-v1", {}), ("FrozenLake-v1", {"max_episode_steps": 8}),
                                            ("Pendulum-v1", {"max_episode_steps": 20})])
def test_whole_episodes_go_to_minari_and_come_back(name: str, make: dict) -> None:
    buffer = recorded(name, **make)
    episodes = list(buffer.episodes())
    to_minari(buffer, f"{name.split('-')[0].lower()}/recorded-v0", env=gym.make(name, **make))
    dataset = minari.load_dataset(f"{name.split('-')[0].lower()}/recorded-v0")
    assert dataset.total_episodes == len(episodes) and dataset.total_steps == sum(len(e) for e in episodes)
    env = gym.make(name)
    for mine, theirs in zip(episodes, dataset.iterate_episodes()):
        observations = np.asarray(theirs.observations)
        flat = np.stack([gym.spaces.flatten(env.observation_space, o) for o in observations])
        np.testing.assert_allclose(flat[:-1], mine.obs, rtol=1e-6)  # in the env's own space
        np.testing.assert_allclose(flat[1:], mine.obs_, rtol=1e-6)  # the final one included
        np.testing.assert_allclose(theirs.rewards, mine.individual_rewards, rtol=1e-6)
        np.testing.assert_array_equal(theirs.terminations, mine.terminated)
        np.testing.assert_array_equal(theirs.truncations, mine.truncated)
        actions = np.asarray(theirs.actions).reshape(len(mine), -1)
        np.testing.assert_allclose(actions, mine.discrete_actions if mine.discrete_actions is not None
                                   else mine.continuous_actions, rtol=1e-6)
    back = from_minari(dataset, gamma=0.9)
    again = list(back.episodes())
    assert [len(e) for e in again] == [len(e) for e in episodes]
    for mine, theirs in zip(again, episodes):
        for field in ("obs", "obs_", "individual_rewards", "terminated", "truncated"):
            np.testing.assert_allclose(getattr(mine, field), getattr(theirs, field), rtol=1e-6, err_msg=field)
        boot = 0.0  # no bootstrap_fn: a truncation bootstraps with 0, as when recording
        np.testing.assert_allclose(mine.G, plain_returns(list(mine.individual_rewards), 0.9, boot), rtol=1e-5)


def test_a_multi_agent_buffer_is_exported_one_agent_at_a_time() -> None:
    pytest.importorskip("pettingzoo")
    pytest.importorskip("mpe2")
    buffer = recorded_spread(max_cycles=5, steps=12)
    with pytest.raises(ValueError, match="single-agent.*3 agents.*agent=") as caught:
        to_minari(buffer, "spread/all-v0")
    assert "agent_0" in str(caught.value)
    with pytest.warns(UserWarning):
        dataset = to_minari(buffer, "spread/agent_1-v0", agent="agent_1")
    assert dataset.total_episodes == buffer.n_episodes and dataset.total_steps == 10


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_cli_exports_a_saved_buffer_with_spaces_rebuilt_from_its_layout(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from flexibuff_envs.cli import main

    buffer = recorded("CartPole-v1")
    path = str(tmp_path / "cartpole.fbuf")
    buffer.save(path)
    assert main(["export", path, "--minari", "cartpole/cli-v0"]) == 0
    assert f"{buffer.n_episodes} episodes" in capsys.readouterr().out
    dataset = minari.load_dataset("cartpole/cli-v0")
    assert dataset.observation_space.shape == (4,) and dataset.action_space == gym.spaces.Discrete(2)
    first = next(iter(dataset.iterate_episodes()))
    np.testing.assert_allclose(np.asarray(first.observations)[:-1], next(iter(buffer.episodes())).obs)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_composite_observations_go_to_minari_as_minari_stores_them() -> None:
    """Blackjack's Tuple observations leave as a tuple of arrays, one per part, equal to a plain
    loop's over the bare env with the same seed and actions."""
    env, bare = fe.record(gym.make("Blackjack-v1"), num_steps=200), gym.make("Blackjack-v1")
    expected: list[list[tuple]] = []
    for episode in range(20):
        obs, _ = env.reset(seed=episode)
        plain, _ = bare.reset(seed=episode)
        assert obs == plain
        expected.append([plain])
        done = False
        while not done:
            action = episode % 2  # stick, or hit until the hand ends
            _, _, terminated, truncated, _ = env.step(action)
            plain, _, done, cut, _ = bare.step(action)
            expected[-1].append(plain)
            assert terminated == done and truncated == cut
    to_minari(env.buffer, "blackjack/recorded-v0", env=gym.make("Blackjack-v1"))
    for got, want in zip(minari.load_dataset("blackjack/recorded-v0").iterate_episodes(), expected, strict=True):
        assert isinstance(got.observations, tuple)
        assert list(zip(*(part.tolist() for part in got.observations))) == want
    back = [e.obs for e in from_minari("blackjack/recorded-v0").episodes()]
    mine = [e.obs for e in env.buffer.episodes()]
    assert len(back) == len(mine) and all(np.array_equal(b, m) for b, m in zip(back, mine))


def test_the_cli_export_passes_the_credits_minari_asks_for_and_names_agent_for_several(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No warning from Minari when the credits are given (a one-line note names the flags when
    they are not), and a multi-agent file gets told about --agent, the flag, not Python's keyword."""
    import warnings

    from flexibuff_envs.cli import main

    path = str(tmp_path / "cartpole.fbuf")
    recorded("CartPole-v1").save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the export
        assert main(["export", path, "--minari", "cartpole/credited-v0", "--env", "CartPole-v1", "--author", "me",
                     "--author-email", "me@example.org", "--code-permalink", "https://example.org/run"]) == 0
    assert capsys.readouterr().err == ""
    assert minari.load_dataset("cartpole/credited-v0").storage.metadata["author"] == {"me"}  # as Minari keeps it
    assert main(["export", path, "--minari", "cartpole/bare-v0"]) == 0
    assert capsys.readouterr().err == ("flexibuff-envs export: note: Minari asks datasets to say who made them; pass "
                                       "--author, --author-email, --code-permalink\n")
    spread = str(tmp_path / "spread.fbuf")
    recorded_spread(max_cycles=10, steps=30).save(spread)
    assert main(["export", spread, "--minari", "spread/all-v0"]) == 2
    assert "pass --agent NAME, one dataset per agent" in capsys.readouterr().err
