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
from flexibuff_envs.integrations.minari import from_minari, to_minari, to_minari_agents
from flexibuff_envs.testing.reference import plain_returns
from tests.envs import recorded as recorded_kind
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
@pytest.mark.parametrize(
    ("name", "make"),
    [("CartPole-v1", {}), ("FrozenLake-v1", {"max_episode_steps": 8}), ("Pendulum-v1", {"max_episode_steps": 20})],
)
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
        np.testing.assert_allclose(
            actions, mine.discrete_actions if mine.discrete_actions is not None else mine.continuous_actions, rtol=1e-6
        )
    seeds = [0] + [-1] * (len(episodes) - 1)  # the first reset had a seed, the others went on from it
    metadata = dataset.storage.get_episode_metadata(dataset.episode_indices)
    assert [m.get("seed", -1) for m in metadata] == seeds
    back = from_minari(dataset, gamma=0.9)
    assert back.episode_origins()["seed"].tolist() == seeds
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
def test_the_cli_exports_a_saved_buffer_with_spaces_rebuilt_from_its_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No warning from Minari when the credits are given (a one-line note names the flags when
    they are not), and a multi-agent file gets told about --agent, the flag, not Python's keyword."""
    import warnings

    from flexibuff_envs.cli import main

    path = str(tmp_path / "cartpole.fbuf")
    recorded("CartPole-v1").save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the export
        assert (
            main(
                [
                    "export",
                    path,
                    "--minari",
                    "cartpole/credited-v0",
                    "--env",
                    "CartPole-v1",
                    "--author",
                    "me",
                    "--author-email",
                    "me@example.org",
                    "--code-permalink",
                    "https://example.org/run",
                ]
            )
            == 0
        )
    assert capsys.readouterr().err == ""
    assert minari.load_dataset("cartpole/credited-v0").storage.metadata["author"] == {"me"}  # as Minari keeps it
    assert main(["export", path, "--minari", "cartpole/bare-v0"]) == 0
    assert capsys.readouterr().err == (
        "flexibuff-envs export: note: Minari asks datasets to say who made them; pass "
        "--author, --author-email, --code-permalink\n"
    )
    spread = str(tmp_path / "spread.fbuf")
    recorded_spread(max_cycles=10, steps=30).save(spread)
    assert main(["export", spread, "--minari", "spread/all-v0"]) == 2
    assert "pass --agent NAME, or --all-agents for one dataset per agent" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_each_agents_dataset_carries_the_other_agents_actions_and_the_state_of_a_plain_loop() -> None:
    """simple_adversary (agents of different sizes, a global state) recorded beside the bare env
    with the same seeds and actions: each agent's dataset holds its own observations (its own
    size), actions and rewards, and in its infos the state at each observation and every other
    agent's actions, as the plain loop saw them."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_adversary_v3

    env = fe.record(simple_adversary_v3.parallel_env(max_cycles=6), num_steps=500)
    bare = simple_adversary_v3.parallel_env(max_cycles=6)
    rng = np.random.default_rng(0)
    plain: list[dict] = []
    for episode in range(4):
        obs, _ = env.reset(seed=episode)
        seen, _ = bare.reset(seed=episode)
        assert all(np.array_equal(obs[agent], seen[agent]) for agent in seen)  # a drop-in
        steps: dict = {"obs": [seen], "state": [bare.state()], "actions": [], "rewards": []}
        while bare.agents:
            actions = {agent: int(rng.integers(5)) for agent in bare.agents}
            env.step(actions)
            seen, rewards, _, _, _ = bare.step(actions)
            steps["obs"].append(seen)
            steps["state"].append(bare.state())
            steps["actions"].append(actions)
            steps["rewards"].append(rewards)
        plain.append(steps)
    datasets = to_minari_agents(env.buffer, "adversary/recorded", simple_adversary_v3.parallel_env())
    assert sorted(datasets) == sorted(bare.possible_agents)
    assert minari.list_local_datasets().keys() >= {f"adversary/recorded/{agent}-v0" for agent in datasets}
    for agent, dataset in datasets.items():
        assert dataset.observation_space == bare.observation_space(agent)  # its own size, not the padded one
        assert dataset.storage.metadata["requirements"] == [f"pettingzoo=={pettingzoo_version()}"]
        others = [other for other in bare.possible_agents if other != agent]
        for got, want in zip(
            minari.load_dataset(f"adversary/recorded/{agent}-v0").iterate_episodes(), plain, strict=True
        ):
            np.testing.assert_array_equal(got.observations, [o[agent] for o in want["obs"]])
            np.testing.assert_array_equal(got.actions, [a[agent] for a in want["actions"]])
            np.testing.assert_allclose(got.rewards, [r[agent] for r in want["rewards"]], rtol=1e-6)
            np.testing.assert_array_equal(got.infos["state"], want["state"])
            assert sorted(got.infos["actions"]) == sorted(others)
            for other in others:  # aligned with the episode's actions, padded by one step as Minari pads actions
                np.testing.assert_array_equal(got.infos["actions"][other][:-1], [a[other] for a in want["actions"]])
                assert got.infos["active"][other][:-1].all() and not got.infos["active"][other][-1]


def pettingzoo_version() -> str:
    import pettingzoo

    return pettingzoo.__version__


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["dying", "spawning", "connect_four"])
def test_an_agents_dataset_holds_the_rows_it_acted_on_and_says_who_else_did(kind: str) -> None:
    """Agents that die, spawn late or take turns: an agent's episodes are the rows where it acted
    (none for an episode it sat out), the others' actions and whether they acted ride along, and
    the legal-action masks of AEC games go to the infos."""
    pytest.importorskip("pettingzoo")
    buffer = recorded_kind(kind)
    spec = buffer.spec
    datasets = to_minari_agents(buffer, f"{kind}/recorded")
    for k, agent in enumerate(spec.agent_ids):
        mine = [episode for episode in buffer.episodes() if episode.active[k].any()]
        got = list(datasets[agent].iterate_episodes())
        assert len(got) == len(mine) and datasets[agent].total_steps == sum(int(e.active[k].sum()) for e in mine)
        for theirs, episode in zip(got, mine):
            rows = episode.active[k]
            assert np.asarray(theirs.actions).tolist() == episode.discrete_actions[k, rows, 0].tolist()
            np.testing.assert_array_equal(theirs.terminations, episode.terminated[k, rows])
            for j, other in enumerate(spec.agent_ids):
                if j != k:
                    np.testing.assert_array_equal(theirs.infos["active"][other][:-1], episode.active[j, rows])
                    np.testing.assert_array_equal(
                        theirs.infos["actions"][other][:-1], episode.discrete_actions[j, rows, 0]
                    )
            if spec.action_mask:
                masks = np.concatenate([episode.action_mask[0][k, rows], episode.action_mask_[0][k, rows][-1:]])
                np.testing.assert_array_equal(theirs.infos["action_mask"], masks)


def test_the_cli_writes_one_dataset_per_agent_under_one_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mpe2")
    from flexibuff_envs.cli import main

    spread = str(tmp_path / "spread.fbuf")
    buffer = recorded_spread(max_cycles=10, steps=30)
    buffer.save(spread)
    credits = ["--author", "me", "--author-email", "me@example.org", "--code-permalink", "https://example.org"]
    assert (
        main(
            ["export", spread, "--minari", "spread/run-v2", "--all-agents", "--env", "mpe2.simple_spread_v3", *credits]
        )
        == 0
    )
    out = capsys.readouterr().out
    for agent in buffer.spec.agent_ids:
        assert f"wrote Minari dataset spread/run/{agent}-v2: 3 episodes, 30 steps" in out
        state = next(iter(minari.load_dataset(f"spread/run/{agent}-v2").iterate_episodes())).infos["state"]
        np.testing.assert_array_equal(state[:-1], next(iter(buffer.episodes())).state)
    assert "spread/run" in minari.namespace.list_local_namespaces()
    assert main(["export", spread, "--minari", "spread/run-v2", "--all-agents", *credits]) == 2
    assert "already holds spread/run/agent_0-v2" in capsys.readouterr().err
    assert main(["export", spread, "--minari", "spread/run-v3", "--all-agents", "--agent", "agent_0"]) == 2
    assert "drop --agent" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_frames_go_to_minari_byte_for_byte() -> None:
    """Minari JPEG-encodes image observations unless told not to: exports keep frames lossless."""
    pytest.importorskip("Box2D")
    env = fe.record(gym.make("CarRacing-v3", max_episode_steps=4), num_steps=50)
    env.reset(seed=0)
    env.action_space.seed(0)
    frames = []
    for _ in range(4):
        frames.append(env.step(env.action_space.sample())[0])
    dataset = to_minari(env.buffer, "carracing/frames-v0", env=gym.make("CarRacing-v3"))
    observations = np.asarray(next(iter(dataset.iterate_episodes())).observations)
    assert observations.dtype == np.uint8 and np.array_equal(observations[1:], frames)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_cli_exports_a_compressed_log_of_frame_stacks_with_its_integer_space(tmp_path: Path) -> None:
    """A log (Pong's frames, stacked, kept compressed) exports with its space rebuilt from the
    layout: integers span their dtype (a Box of integers takes no infinite bound), frames exact."""
    pytest.importorskip("ale_py")
    from flexibuff_envs.cli import main

    out = str(tmp_path / "pong.log")
    argv = ["record", "ALE/Pong-v5", "--env-kwargs", '{"obs_type": "grayscale", "max_episode_steps": 30}']
    stack = 'gymnasium.wrappers.FrameStackObservation:{"stack_size": 4}'
    assert main([*argv, "--wrap", stack, "--episodes", "2", "--out", out]) == 0
    assert main(["export", out, "--minari", "pong/stacks-v0"]) == 0
    dataset = minari.load_dataset("pong/stacks-v0")
    assert dataset.observation_space == gym.spaces.Box(0, 255, (4, 210, 160), np.uint8)
    for episode, want in zip(dataset.iterate_episodes(), fe.FlexibleBuffer.open(out).episodes(), strict=True):
        np.testing.assert_array_equal(np.asarray(episode.observations)[:-1].reshape(len(want.obs), -1), want.obs)
