"""The parallel recorder against a plain loop over the bare env with the same seeds and actions."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from gymnasium import spaces

import flexibuff_envs as fe
from flexibuff_envs.testing import same
from flexibuff_envs.testing.pz_reference import Expected, play_parallel, replay_parallel

pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")
from mpe2 import (
    simple_adversary_v3,
    simple_speaker_listener_v4,
    simple_spread_v3,
    simple_world_comm_v3,
)
from pettingzoo.butterfly import knights_archers_zombies_v11, pistonball_v6
from pettingzoo.sisl import multiwalker_v9
from pettingzoo.test import parallel_api_test
from pettingzoo.utils.env import ParallelEnv

GAMMA = 0.9
CASES: dict[str, tuple[Callable[[], Any], int, int]] = {  # make, seed, steps
    "simple_spread_v3": (lambda: simple_spread_v3.parallel_env(max_cycles=15), 0, 40),
    "simple_adversary_v3": (lambda: simple_adversary_v3.parallel_env(max_cycles=15), 0, 40),
    "simple_speaker_listener_v4": (lambda: simple_speaker_listener_v4.parallel_env(max_cycles=15), 0, 40),
    "simple_world_comm_v3": (lambda: simple_world_comm_v3.parallel_env(max_cycles=10), 0, 25),
    "knights_archers_zombies_v11": (
        lambda: knights_archers_zombies_v11.parallel_env(line_death=True, spawn_delay=1000, max_cycles=100),
        2,
        40,
    ),
    "multiwalker_v9": (lambda: multiwalker_v9.parallel_env(max_cycles=20), 0, 45),
    "pistonball_v6": (lambda: pistonball_v6.parallel_env(n_pistons=4, max_cycles=5), 0, 7),
}


def run(name: str) -> tuple[Expected, list, list, Any]:
    make, seed, steps = CASES[name]
    expected, bare_returned = play_parallel(make(), seed=seed, steps=steps)
    env = fe.record(make(), num_steps=200, gamma=GAMMA)
    return expected, bare_returned, replay_parallel(env, seed, expected.actions[:steps]), env


@pytest.mark.parametrize("name", list(CASES))
def test_every_recorded_field_equals_the_reference(name: str) -> None:
    expected, bare, wrapped, env = run(name)
    assert same(bare, wrapped)  # drop-in: exactly what the bare env returns
    buffer = env.buffer
    rows = expected.rewards.shape[1]
    assert len(buffer) == rows
    batch = buffer.sample_transitions(idx=np.arange(rows))
    np.testing.assert_array_equal(batch.active, expected.active)
    np.testing.assert_array_equal(batch.obs, expected.obs)
    np.testing.assert_array_equal(batch.obs_, expected.obs_)
    assert batch.obs.dtype == expected.obs.dtype
    np.testing.assert_allclose(batch.individual_rewards, expected.rewards, rtol=1e-6)
    np.testing.assert_allclose(batch.global_rewards, expected.rewards.sum(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(batch.terminated, expected.terminated)
    np.testing.assert_array_equal(batch.truncated, expected.truncated)
    if expected.discrete is not None:
        np.testing.assert_array_equal(batch.discrete_actions, expected.discrete)
    if expected.continuous is not None:
        np.testing.assert_allclose(batch.continuous_actions, expected.continuous)
    if expected.mask is None:
        assert batch.action_mask is None
    else:
        np.testing.assert_array_equal(np.concatenate(batch.action_mask, axis=-1), expected.mask)
        np.testing.assert_array_equal(np.concatenate(batch.action_mask_, axis=-1), expected.mask_)
    np.testing.assert_allclose(batch.G, expected.G(GAMMA), rtol=1e-5, atol=1e-5)


def test_agents_die_on_their_own_and_get_their_own_G() -> None:
    expected, _, _, env = run("knights_archers_zombies_v11")
    start, end = expected.episodes[0]
    (batch,) = env.buffer.sample_episodes(n_episodes=1)  # the first episode, whole
    assert len(batch) == end - start
    last_active = [int(np.flatnonzero(a)[-1]) for a in batch.active]
    assert len(set(last_active)) > 1  # knights and archers died at different steps
    for agent, last in enumerate(last_active):
        assert batch.terminated[agent, last]
        assert np.isnan(batch.G[agent, last + 1 :]).all() and not np.isnan(batch.G[agent, : last + 1]).any()


def test_global_state_is_the_state_before_and_after_each_step() -> None:
    make, seed, _ = CASES["simple_spread_v3"]
    bare = make()
    bare.reset(seed=seed)
    env = fe.record(make(), num_steps=100)
    env.reset(seed=seed)
    for agent in env.possible_agents:
        bare.action_space(agent).seed(3)
    before = bare.state()
    for _ in range(3):
        actions = {a: bare.action_space(a).sample() for a in bare.agents}
        bare.step(actions)
        env.step(actions)
    after = bare.state()
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.state[0], before)
    np.testing.assert_array_equal(batch.state_[2], after)
    np.testing.assert_array_equal(batch.state[1:], batch.state_[:-1])


def torch_uint8() -> object:
    return pytest.importorskip("torch").uint8


def test_an_image_state_is_stored_at_its_space_dtype_in_the_buffer_its_file_and_its_log(tmp_path: Path) -> None:
    """pistonball's ``state()`` is 560x880x3 uint8 by its ``state_space``: it is kept a byte a
    value (it was float32, 4x its bytes), equal to the bare env's, through a file and a log."""
    bare, env = (
        pistonball_v6.parallel_env(max_cycles=4),
        fe.record(pistonball_v6.parallel_env(max_cycles=4), num_steps=8, log=tmp_path / "log"),
    )
    bare.reset(seed=1)
    env.reset(seed=1)
    states = [bare.state()]
    for _ in range(3):
        actions = {a: bare.action_space(a).sample() for a in bare.agents}
        bare.step(actions)
        env.step(actions)
        states.append(bare.state())
    env.step({a: bare.action_space(a).sample() for a in bare.agents})
    env.close()
    assert env.buffer_spec.state_dtype == "uint8"
    state_bytes = 560 * 880 * 3
    assert env.buffer.nbytes_per_row < 2 * state_bytes + 20 * 457 * 120 * 3 + 4096  # a byte a value
    loaded = fe.FlexibleBuffer.load(env.buffer.save(tmp_path / "run.fbuf"))
    assert env.buffer.sample_transitions(2, as_torch=True).state.dtype == torch_uint8()  # stays a byte
    for buffer in (env.buffer, loaded, fe.FlexibleBuffer.open(tmp_path / "log")):
        (episode,) = buffer.episodes()
        assert episode.state.dtype == np.uint8
        np.testing.assert_array_equal(episode.state, np.stack(states).reshape(4, -1))


def test_a_file_written_when_states_were_float32_reads_as_written(tmp_path: Path) -> None:
    """A file whose spec names the state space's dtype (uint8) while it stores float32, as files
    written before the state kept its dtype do, reads its float32 values."""
    import json
    import struct
    import zlib

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=5), num_steps=20)
    env.reset(seed=0)
    while env.agents:
        env.step({a: 1 for a in env.agents})
    raw = Path(env.buffer.save(tmp_path / "new.fbuf")).read_bytes()
    _, version, length = struct.unpack("<8sIQ", raw[:20])
    header = json.loads(raw[20 : 20 + length])
    header["spec"]["state_dtype"] = "uint8"
    blob = json.dumps(header).encode()
    prefix = struct.pack("<8sIQ", b"FLEXIBUF", version, len(blob)) + blob
    prefix += b"\0" * (-len(prefix) % 64)
    start = 20 + length + -(20 + length) % 64
    _, data_crc, end = struct.unpack("<II8s", raw[-16:])
    (tmp_path / "old.fbuf").write_bytes(
        prefix + raw[start:-16] + struct.pack("<II8s", zlib.crc32(prefix), data_crc, end)
    )
    old = fe.FlexibleBuffer.load(tmp_path / "old.fbuf")
    assert old.spec.state_dtype == "float32"
    np.testing.assert_array_equal(next(old.episodes()).state, next(env.buffer.episodes()).state)


def test_heterogeneous_agents_share_one_buffer_with_padding_masked_out() -> None:
    env = fe.record(simple_speaker_listener_v4.parallel_env())
    spec = env.buffer_spec
    assert spec.agent_ids == ("speaker_0", "listener_0")
    assert spec.obs_size == 11 and spec.agent_obs_sizes == (3, 11)
    assert spec.discrete_action_cardinalities == (5,)
    assert spec.agent_discrete_action_cardinalities == ((3,), (5,))
    assert spec.action_mask
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    batch = env.buffer.sample_transitions(idx=np.array([0]))
    assert batch.action_mask[0][0, 0].tolist() == [True, True, True, False, False]
    assert (batch.obs[0, 0, 3:] == 0).all()


def test_structurally_different_agents_are_refused_with_the_agents_named() -> None:
    from gymnasium import spaces
    from pettingzoo.utils.env import ParallelEnv

    class Mixed(ParallelEnv):
        metadata: ClassVar[dict] = {"name": "mixed"}
        possible_agents: ClassVar[list[str]] = ["pusher", "steerer"]

        def observation_space(self, agent: str) -> spaces.Space:
            return spaces.Box(-1, 1, (2,))

        def action_space(self, agent: str) -> spaces.Space:
            return spaces.Discrete(3) if agent == "pusher" else spaces.Box(-1, 1, (2,))

    with pytest.raises(ValueError, match="'pusher'.*'steerer'.*own recorder"):
        fe.record(Mixed())


@pytest.mark.parametrize("global_reward", ["mean", "none", lambda rewards, active: float(rewards.max())])
def test_team_reward_is_configurable(global_reward: Any) -> None:
    env = fe.record(simple_adversary_v3.parallel_env(max_cycles=5), global_reward=global_reward)
    replay_parallel(env, 0, [{a: 1 for a in env.possible_agents}] * 4)
    batch = env.buffer.sample_transitions(idx=np.arange(4))
    if global_reward == "none":
        assert batch.global_rewards is None
    elif global_reward == "mean":
        np.testing.assert_allclose(batch.global_rewards, batch.individual_rewards.mean(axis=0), rtol=1e-6)
    else:
        np.testing.assert_allclose(batch.global_rewards, batch.individual_rewards.max(axis=0))


def test_truncation_bootstraps_each_agent_with_its_own_value() -> None:
    values = {"agent_0": 1.0, "agent_1": 2.0, "agent_2": 3.0}
    env = fe.record(
        simple_spread_v3.parallel_env(max_cycles=3),
        gamma=0.5,
        bootstrap_fn=lambda obs_, agent: values[agent] + float(obs_[0]),
    )
    env.reset(seed=0)
    while env.agents:
        env.step({a: 0 for a in env.agents})
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert episode.truncated[:, -1].all()
    for i, agent in enumerate(env.possible_agents):
        expected = episode.individual_rewards[i, -1] + 0.5 * (values[agent] + episode.obs_[i, -1, 0])
        assert episode.G[i, -1] == pytest.approx(expected, rel=1e-5)


def test_state_recording_can_be_turned_off() -> None:
    env = fe.record(simple_spread_v3.parallel_env(), record_state=False)
    assert env.buffer_spec.state_size is None
    env.reset(seed=0)
    env.step({a: 0 for a in env.agents})
    assert env.buffer.sample_transitions(1).state is None


def test_rps_parallel_has_no_state_and_does_not_crash() -> None:
    from pettingzoo.classic import rps_v2

    env = fe.record(rps_v2.parallel_env())
    assert env.buffer_spec.state_size is None
    env.reset(seed=0)
    env.step({a: 1 for a in env.agents})
    assert env.buffer.sample_transitions(1).state is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: simple_spread_v3.parallel_env(),
        lambda: simple_speaker_listener_v4.parallel_env(),
        lambda: simple_world_comm_v3.parallel_env(),
        lambda: multiwalker_v9.parallel_env(),
        lambda: knights_archers_zombies_v11.parallel_env(),
    ],
)
def test_parallel_api_test_passes_on_the_wrapped_env(make: Callable[[], Any]) -> None:
    env = fe.record(make(), num_steps=2000)
    parallel_api_test(env, num_cycles=200)
    assert len(env.buffer) > 0


def test_a_failing_env_state_is_recorded_as_missing_with_one_warning() -> None:
    env = fe.record(multiwalker_v9.parallel_env(max_cycles=500), num_steps=600)
    env.reset(seed=0)
    for agent in env.possible_agents:
        env.action_space(agent).seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while env.agents:  # random walkers fall; multiwalker's state() then breaks
            env.step({a: env.action_space(a).sample() for a in env.agents})
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning) and "state() of multiwalker" in str(w.message)]
    assert len(ours) == 1
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    assert np.isnan(episode.state_[-1]).all() and not np.isnan(episode.state[0]).any()


def test_finish_path_leaves_agents_that_already_died_alone() -> None:
    make, seed, _ = CASES["knights_archers_zombies_v11"]
    expected, _, _, _ = run("knights_archers_zombies_v11")
    env = fe.record(make(), num_steps=200, gamma=GAMMA)
    replay_parallel(env, seed, expected.actions[:21])  # the knights died at step 20; the archers play on
    batch = env.buffer.sample_transitions(idx=np.arange(21))
    dead = [i for i in range(4) if batch.terminated[i].any()]
    alive = [i for i in range(4) if i not in dead]
    assert dead and alive
    before = batch.G[dead].copy()
    env.buffer.finish_path(last_values=100.0)
    after = env.buffer.sample_transitions(idx=np.arange(21)).G
    np.testing.assert_array_equal(after[dead], before)  # their own termination's G, no bootstrap
    assert not np.isnan(after[alive]).any()
    last = batch.individual_rewards[alive[0], -1] + GAMMA * 100.0
    assert after[alive[0], -1] == pytest.approx(last, rel=1e-5)


def test_sequences_keep_the_agent_axis_first() -> None:
    env = fe.record(simple_spread_v3.parallel_env(max_cycles=10), num_steps=100)
    replay_parallel(env, 0, [{a: 0 for a in env.possible_agents}] * 25)
    batch = env.buffer.sample_sequences(7, 4)
    assert batch.obs.shape == (3, 7, 4, 18) and batch.individual_rewards.shape == (3, 7, 4)
    assert batch.state.shape == (7, 4, 54) and batch.valid.shape == (7, 4)
    torch_batch = env.buffer.sample_sequences(7, 4, as_torch=True)
    assert tuple(torch_batch.valid.shape) == (7, 4)


class ScriptedParallel(ParallelEnv):
    """A PettingZoo parallel env whose agents come and go on a script (agents ``a`` and ``b``).

    ``spawn[agent]`` is the step after which the agent first appears (0: at the reset);
    ``end[agent]`` the step (counted from 1) at which it terminates, or truncates when
    ``truncate``. Every agent present gets reward ``reward(step, agent)``; an agent may be given
    no action (it sits the step out). Observations are ``[step, agent number]``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "name": "scripted_v0"}
    possible_agents: ClassVar[list[str]] = ["a", "b"]

    def __init__(self, spawn: dict[str, int], end: dict[str, int], truncate: bool = False) -> None:
        self.spawn, self.end, self.truncate = spawn, end, truncate
        self.agents: list[str] = []
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0, 100, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self._t, self.possible_agents.index(agent)], dtype=np.float32)

    @staticmethod
    def reward(step: int, agent: str) -> float:
        return float(step * 10 + (1 if agent == "a" else 2))

    def reset(self, seed: int | None = None, options: dict | None = None):
        self._t = 0
        self.agents = [a for a in self.possible_agents if self.spawn[a] == 0]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict):
        self._t += 1
        present = list(self.agents)
        obs = {a: self._obs(a) for a in present}
        rewards = {a: self.reward(self._t, a) for a in present}
        done = {a: self.end[a] == self._t for a in present}
        terminations = {a: done[a] and not self.truncate for a in present}
        truncations = {a: done[a] and self.truncate for a in present}
        self.agents = [a for a in present if not done[a]]
        for a in self.possible_agents:
            if self.spawn[a] == self._t and a not in present:
                self.agents.append(a)
                obs[a], rewards[a], terminations[a], truncations[a] = self._obs(a), 0.5, False, False
        infos = {a: {} for a in obs}
        return obs, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass


def own_transitions(env: Any, plan: list[dict[str, int]]) -> dict[str, list[dict[str, Any]]]:
    """A plain loop over the bare env: each agent's transitions, from an action to its next one.

    A step an agent sits out (present, no action) adds its reward to its running transition and
    gives that transition its next observation; a reward before its first action goes into its
    first transition; one it receives without ever acting is listed apart, under ``"kept"``.
    """
    obs, _ = env.reset(seed=0)
    out: dict[str, list[dict[str, Any]]] = {a: [] for a in env.possible_agents}
    waiting = {a: 0.0 for a in env.possible_agents}
    for planned in plan:
        given = {a: action for a, action in planned.items() if a in env.agents}
        following, rewards, terminations, truncations, _ = env.step(given)
        for a, o in following.items():
            end = {"terminated": terminations[a], "truncated": truncations[a], "obs_": o}
            if a in given:
                out[a].append({"obs": obs[a], "reward": rewards[a] + waiting[a], **end})
                waiting[a] = 0.0
            elif out[a]:
                out[a][-1].update(end, reward=out[a][-1]["reward"] + rewards[a])
            else:
                waiting[a] += rewards[a]
        obs = {**obs, **following}
        if not env.agents:
            break
    for a, left in waiting.items():
        if left:
            out.setdefault("kept", []).append({"agent": a, "reward": left})
    return out


def plain_G(rewards: list[float], gamma: float, bootstrap: float = 0.0) -> list[float]:
    g, out = bootstrap, []
    for r in reversed(rewards):
        g = r + gamma * g
        out.append(g)
    return out[::-1]


SCRIPTS = {  # spawn, end, plan (agent -> action per step; an agent left out sits the step out)
    "b sits out a step": (
        {"a": 0, "b": 0},
        {"a": 5, "b": 3},
        [{"a": 0, "b": 1}, {"a": 0}, {"a": 0, "b": 2}, {"a": 1}, {"a": 1}],
    ),
    "b spawns late": (
        {"a": 0, "b": 1},
        {"a": 5, "b": 3},
        [{"a": 0}, {"a": 0, "b": 1}, {"a": 0, "b": 1}, {"a": 1}, {"a": 1}],
    ),
    "b sits out its last step": (
        {"a": 0, "b": 0},
        {"a": 4, "b": 3},
        [{"a": 0, "b": 1}, {"a": 0, "b": 1}, {"a": 0}, {"a": 2}],
    ),
    "b never acts": ({"a": 0, "b": 1}, {"a": 4, "b": 3}, [{"a": 0}, {"a": 0}, {"a": 0}, {"a": 2}]),
}


@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_agents_that_sit_out_or_spawn_late_get_their_own_transitions_and_G(script: str, truncate: bool) -> None:
    spawn, end, plan = SCRIPTS[script]
    expected = own_transitions(ScriptedParallel(spawn, end, truncate), plan)
    seen: list[tuple[np.ndarray, str]] = []
    env = fe.record(
        ScriptedParallel(spawn, end, truncate),
        num_steps=50,
        gamma=0.5,
        bootstrap_fn=lambda obs_, agent: seen.append((obs_.copy(), agent)) or 10.0,
        agent_state=lambda env, agent, obs: [env._t, *obs],  # the env's clock: taken when obs is seen
        agent_state_size=3,
    )
    assert same(own_transitions(env, plan), expected)  # drop-in
    (episode,) = env.buffer.sample_episodes(n_episodes=1)
    for i, agent in enumerate(env.possible_agents):
        mine = expected[agent]
        rows = np.flatnonzero(episode.active[i])
        assert len(rows) == len(mine)
        assert np.isnan(np.delete(episode.G[i], rows)).all()
        if not mine:
            continue
        np.testing.assert_array_equal(episode.obs[i, rows], [t["obs"] for t in mine])
        np.testing.assert_array_equal(episode.obs_[i, rows], [t["obs_"] for t in mine])
        np.testing.assert_array_equal(episode.agent_state[i, rows], [[t["obs"][0], *t["obs"]] for t in mine])
        np.testing.assert_array_equal(episode.agent_state_[i, rows], [[t["obs_"][0], *t["obs_"]] for t in mine])
        np.testing.assert_allclose(episode.individual_rewards[i, rows], [t["reward"] for t in mine])
        assert (episode.terminated if not truncate else episode.truncated)[i, rows[-1]]
        np.testing.assert_allclose(
            episode.G[i, rows], plain_G([t["reward"] for t in mine], 0.5, 10.0 if truncate else 0.0)
        )
    # no reward is lost: per agent, the episode's rows add up to what the env handed out
    given = {a: sum(t["reward"] for t in expected[a]) for a in env.possible_agents}
    for kept in expected.get("kept", []):
        given[kept["agent"]] += kept["reward"]
    np.testing.assert_allclose(episode.individual_rewards.sum(axis=1), [given[a] for a in env.possible_agents])
    np.testing.assert_allclose(episode.global_rewards.sum(), sum(given.values()))
    if truncate:  # bootstrap_fn saw each agent's final observation, as the batch shows it
        finals = {a: expected[a][-1]["obs_"] for a in env.possible_agents if expected[a]}
        assert {agent for _, agent in seen} == set(finals)
        for obs_, agent in seen:
            np.testing.assert_array_equal(obs_, finals[agent])


def test_an_agent_sitting_out_longer_than_the_ring_touches_no_other_row() -> None:
    """b acts once, then sits out while the ring (5 rows) forgets that row and hands it to later
    steps: b's end and rewards must not land on rows of steps it had no part in."""
    plan = [{"a": 0, "b": 1}] + [{"a": 0}] * 9  # b ends at step 10, sitting out
    env = fe.record(ScriptedParallel({"a": 0, "b": 0}, {"a": 12, "b": 10}), num_steps=5)
    env.reset(seed=0)
    for actions in plan:
        env.step({agent: action for agent, action in actions.items() if agent in env.agents})
    (batch,) = env.buffer.minibatches(5, shuffle=False)
    b = env.possible_agents.index("b")
    assert not batch.active[b].any()  # its one row was forgotten
    assert not (batch.terminated[b] | batch.truncated[b]).any()


def test_feedback_counts_an_agents_own_transitions() -> None:
    """add_feedback(step=k) is the agent's k-th transition, whatever steps it sat out."""
    spawn, end, plan = SCRIPTS["b sits out a step"]
    env = fe.record(ScriptedParallel(spawn, end), num_steps=50)
    env.reset(seed=0)
    for actions in plan[:3]:  # b acts at rows 0 and 2, sits out row 1
        env.step(actions)
    env.add_feedback(1.0, agent="b", step=1)
    env.add_feedback(0.5, agent="b", step=-2)
    b = env.possible_agents.index("b")
    batch = env.buffer.sample_transitions(idx=np.arange(3))
    np.testing.assert_array_equal(batch.individual_auxiliary_rewards[b], [0.5, 0.0, 1.0])


def test_pettingzoo_recorders_share_a_buffer_a_lane_each_and_free_it_when_closed() -> None:
    spec = fe.record(simple_spread_v3.parallel_env()).buffer_spec
    shared = fe.FlexibleBuffer.from_spec(spec, num_steps=100, n_envs=2)
    first, second = (fe.record(simple_spread_v3.parallel_env(max_cycles=5), buffer=shared) for _ in range(2))
    with pytest.raises(fe.SpecMismatchError, match="n_envs"):
        fe.record(simple_spread_v3.parallel_env(), buffer=shared)
    for env, seed in ((first, 0), (second, 1)):
        env.reset(seed=seed)
        while env.agents:
            env.step({a: env.action_space(a).sample() for a in env.agents})
    assert shared.n_episodes == 2 and {int(e.idx[0]) // 100 for e in shared.episodes()} == {0, 1}
    first.close()
    assert fe.record(simple_spread_v3.parallel_env(), buffer=shared)._recorder.lane == 0
