"""Fields of your own (recurrent state, anything per agent and step): declared at record time,
filled through annotate, on every batch, in files and chunks; bad ones refused naming them."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe


def recorded_cartpole(steps: int = 130, num_steps: int = 50, every: int = 1) -> tuple[fe.GymRecorder, list]:
    """CartPole with a 4-wide ``hidden`` (float32) and an int ``tick``, annotated on every ``every``-th
    step with values made from the step count; also returns, per step, (obs, hidden given or None)."""
    env = fe.record(
        gym.make("CartPole-v1"), num_steps=num_steps, seed=0, extra_fields={"hidden": (4,), "tick": ((), "int64")}
    )
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    seen = []
    for t in range(steps):
        given = None
        if t % every == 0:
            given = np.arange(4, dtype=np.float32) + t
            env.annotate(hidden=given, tick=t)
        seen.append((obs, given))
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    return env, seen


def expected_by_obs(steps: list) -> dict[bytes, np.ndarray | None]:
    return {obs.tobytes(): given for obs, given in steps}


def test_annotated_values_land_on_their_own_step_in_every_sampling_mode() -> None:
    env, steps = recorded_cartpole(every=2)  # the ring (50 rows) wraps: reused rows show no stale value
    buffer = env.buffer
    want = expected_by_obs(steps)

    def check(obs: np.ndarray, hidden: np.ndarray, tick: np.ndarray) -> None:
        for o, h, k in zip(obs.reshape(-1, 4), hidden.reshape(-1, 4), tick.reshape(-1)):
            given = want[o.tobytes()]
            if given is None:
                assert np.isnan(h).all() and k == 0  # not given: NaN (0 for an integer field)
            else:
                np.testing.assert_array_equal(h, given)
                assert k == given[0]

    batch = buffer.sample_transitions(200)
    assert batch.hidden.dtype == np.float32 and batch.tick.dtype == np.int64
    assert batch.extra.keys() == {"hidden", "tick"}
    check(batch.obs, batch.hidden, batch.tick)
    for episode in buffer.episodes():
        check(episode.obs, episode.hidden, episode.tick)
    for minibatch in buffer.minibatches(16):
        check(minibatch.obs, minibatch.hidden, minibatch.tick)
    windows = buffer.sample_sequences(32, 5)
    assert windows.hidden.shape == (32, 5, 4)
    check(windows.obs, windows.hidden, windows.tick)  # windows.hidden[:, 0]: each window's first step (burn-in)
    n_step = buffer.sample_transitions(idx=batch.idx, n_step=3)
    np.testing.assert_array_equal(n_step.hidden, batch.hidden)  # the row's own, not the window end's
    only = buffer.sample_transitions(8, fields=("obs", "hidden"))
    assert only.extra.keys() == {"hidden"} and only.G is None
    with pytest.raises(AttributeError, match="tick"):
        _ = only.tick


def test_torch_batches_carry_them() -> None:
    torch = pytest.importorskip("torch")
    env, _ = recorded_cartpole(steps=40)
    batch = env.buffer.sample_transitions(8, as_torch=True)
    assert isinstance(batch.hidden, torch.Tensor) and batch.hidden.shape == (8, 4)
    np.testing.assert_array_equal(batch.hidden.numpy(), env.buffer.sample_transitions(idx=batch.idx.numpy()).hidden)


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
def test_files_and_chunks_keep_them(tmp_path: Path, mmap: bool) -> None:
    env, _ = recorded_cartpole(steps=300, num_steps=120)
    buffer = env.buffer
    rows = np.sort(np.concatenate([b.idx for b in buffer.minibatches(100)]))
    loaded = fe.FlexibleBuffer.load(buffer.save(tmp_path / "own.fbuf"), mmap=mmap)
    assert loaded.spec.extra_fields == (("hidden", (4,), "float32"), ("tick", (), "int64"))
    mine, theirs = buffer.sample_transitions(idx=rows), loaded.sample_transitions(idx=rows)
    np.testing.assert_array_equal(theirs.hidden, mine.hidden)
    np.testing.assert_array_equal(theirs.tick, mine.tick)
    other = fe.FlexibleBuffer.from_spec(buffer.spec, num_steps=200)
    assert buffer.n_episodes >= 2
    chunk = buffer.take_episodes()
    assert other.extend(chunk) == chunk.n_episodes
    moved = np.concatenate([e.hidden for e in other.episodes()])
    np.testing.assert_array_equal(moved, next(p.whole() for p in chunk.parts if p.name == "hidden")[0])


def test_every_agent_and_every_sub_env_has_its_own() -> None:
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=5), num_steps=50, extra_fields={"hidden": (2,)})
    env.reset(seed=0)
    for t in range(5):
        for i, agent in enumerate(env.agents):
            env.annotate(agent, hidden=[t, i])
        env.step({agent: 0 for agent in env.agents})
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert episode.hidden.shape == (3, 5, 2)
    np.testing.assert_array_equal(episode.hidden[..., 0], np.broadcast_to(np.arange(5), (3, 5)))
    np.testing.assert_array_equal(episode.hidden[..., 1], np.broadcast_to(np.arange(3)[:, None], (3, 5)))

    vector = fe.record(gym.make_vec("CartPole-v1", num_envs=3), num_steps=20, extra_fields={"hidden": (2,)})
    vector.reset(seed=0)
    for t in range(4):
        vector.annotate(hidden=np.stack([[t, lane] for lane in range(3)]))
        vector.step(np.zeros(3, dtype=np.int64))
    batch = vector.buffer.sample_transitions(idx=np.array([0, 3, 20, 43]))  # lanes of 20 rows
    np.testing.assert_array_equal(batch.hidden, [[0, 0], [3, 0], [0, 1], [3, 2]])


def test_bad_declarations_and_annotations_are_refused_naming_the_field() -> None:
    for bad, says in (
        ({"obs": (2,)}, "'obs'"),
        ({"my field": (2,)}, "'my field'"),
        ({"h": (0,)}, "'h'"),
        ({"h": ((2,), object)}, "'h' dtype"),
        ({"h": "wide"}, "'h'"),
    ):
        with pytest.raises(ValueError, match=says):
            fe.FlexibleBuffer(10, 4, extra_fields=bad)
    env, _ = recorded_cartpole(steps=5)
    before = env.buffer.sample_transitions(idx=np.arange(5))
    with pytest.raises(ValueError, match=r"hidden of agent 'agent_0' must have shape \(4,\)"):
        env.annotate(hidden=np.zeros(5))
    with pytest.raises(ValueError, match="unknown field 'cell'.*hidden \\(yours"):
        env.annotate(cell=np.zeros(4))
    with pytest.raises(ValueError, match="hidden"):  # one bad field: the good one is not held either
        env.annotate(tick=3, hidden=np.zeros(3))
    env.step(0)
    after = env.buffer.sample_transitions(idx=np.arange(6))
    np.testing.assert_array_equal(after.hidden[:5], before.hidden)
    assert np.isnan(after.hidden[5]).all() and after.tick[5] == 0
    with pytest.raises(fe.SpecMismatchError, match="extra_fields"):
        fe.record(gym.make("CartPole-v1"), env.buffer, extra_fields={"hidden": (8,)})


def test_aec_turns_keep_each_agents_own_values() -> None:
    """An annotation given before an agent's turn belongs to that turn's transition, which AEC
    closes only at the agent's next turn (built-in annotations and fields of your own alike)."""
    pytest.importorskip("pettingzoo")
    from pettingzoo.classic import connect_four_v3

    env = fe.record(connect_four_v3.env(), num_steps=100, extra_fields={"turn": ((), "int64")})
    env.reset(seed=0)
    turns = {agent: 0 for agent in env.possible_agents}
    for agent in env.agent_iter():
        obs, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        turns[agent] += 1
        given = turns[agent] * 10 + env.possible_agents.index(agent)
        env.annotate(agent, turn=given, values=float(given))
        env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    for i, agent in enumerate(env.possible_agents):
        mine = episode.active[i]
        np.testing.assert_array_equal(episode.turn[i][mine], np.arange(1, mine.sum() + 1) * 10 + i)
        np.testing.assert_array_equal(episode.values[i][mine], np.arange(1, mine.sum() + 1) * 10.0 + i)


def test_a_loaded_buffer_records_fields_of_your_own_as_before(tmp_path: Path) -> None:
    env, _ = recorded_cartpole(steps=60, num_steps=200)
    loaded = fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "own.fbuf"))
    again = fe.record(gym.make("CartPole-v1"), loaded)  # the env has no such fields; the buffer does
    again.reset(seed=1)
    for t in range(5):
        again.annotate(hidden=np.full(4, 100.0 + t), tick=100 + t)
        again.step(0)
    newest = loaded.sample_transitions(idx=np.arange(60, 65))
    np.testing.assert_array_equal(newest.hidden[:, 0], 100.0 + np.arange(5))
    np.testing.assert_array_equal(newest.tick, 100 + np.arange(5))
