"""Ctrl-C at any instant: real SIGINTs delivered at random moments into recording.

Each trial replays a fixed sequence of seeds and actions through a recorder, over and over,
until a SIGINT sent by a timer thread lands (anywhere: in the env, in the recorder, in a block
commit, in an eviction). Then: the interrupt reached the loop as KeyboardInterrupt; every whole
episode the buffer holds equals an episode of a plain loop over the bare env with the same seeds
and actions, field by field, ``G`` included; the buffer's own save loads and holds the same;
and recording goes on from a reset. ``FLEXIBUFF_SIGNAL_TRIALS`` sets the trials per case (25 in
CI; the long run: ``FLEXIBUFF_SIGNAL_TRIALS=400 .venv/bin/python -m pytest tests/test_interrupts.py``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.testing.reference import plain_returns, play

TRIALS = int(os.environ.get("FLEXIBUFF_SIGNAL_TRIALS", "25"))
GAMMA = 0.9
#: ring sizes: one that wraps many times during a replay, one that never does
RINGS = {"tiny": 64, "large": 100_000}


@pytest.fixture(autouse=True)
def ctrl_c_as_a_terminal_delivers_it() -> Iterator[None]:
    """Python's own Ctrl-C handler, also where this process inherited SIGINT ignored (a shell
    starts background jobs so, e.g. ``nohup make test &``: Python then raises no
    KeyboardInterrupt at all)."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def interrupted(run: Callable[[], None], delay: float) -> None:
    """Call ``run`` (which loops until interrupted) with a real SIGINT sent after ``delay`` seconds."""
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    try:
        with pytest.raises(KeyboardInterrupt):  # entered first: a signal sent at once lands inside
            timer.start()
            run()
    finally:
        timer.join()


# ----------------------------------------------------------------------------- references


def episode_table(episodes: list[dict[str, np.ndarray]]) -> dict[bytes, list[dict[str, np.ndarray]]]:
    """Reference episodes by the bytes of their first observation (each seed's is its own)."""
    table: dict[bytes, list[dict[str, np.ndarray]]] = {}
    for episode in episodes:
        table.setdefault(np.ascontiguousarray(episode["obs"][..., 0, :]).tobytes(), []).append(episode)
    return table


def assert_matches(
    buffer: fe.FlexibleBuffer, table: dict[bytes, list[dict[str, np.ndarray]]], *, cut_ok: bool | None = False
) -> int:
    """Every whole episode ``buffer`` holds equals a reference episode (``cut_ok``: or its first
    steps, ended as truncated: an episode a reset cut after the interrupt; None: episodes ended
    as truncated are left out); returns how many.
    Reference fields are laid out as batches are: time on axis 1 with agents, else 0."""
    axis = 1 if buffer.spec.n_agents > 1 else 0
    n = 0
    for episode in buffer.episodes():
        if cut_ok is None and episode.truncated.any():  # an AEC cut truncates each agent at its own last row
            continue
        key = np.ascontiguousarray(episode.obs[..., 0, :]).tobytes()
        assert key in table, "an episode the bare env never played"
        length = episode.obs.shape[-2]
        candidates = [
            want
            for want in table[key]
            if length == want["obs"].shape[-2]
            or (cut_ok and length < want["obs"].shape[-2] and episode.truncated[..., -1].any())
        ]
        differing = [
            [
                name
                for name, value in want.items()
                if (name != "truncated" or length == value.shape[axis])
                and not np.allclose(
                    getattr(episode, name), value.take(np.arange(length), axis=axis), rtol=1e-5, atol=1e-6
                )
            ]
            for want in candidates
        ]
        assert [] in differing, (
            f"an episode of {length} rows equal to no reference episode "
            f"(fields differing from each that could be it: {differing})"
        )
        if length == candidates[differing.index([])]["obs"].shape[-2]:
            rewards, G = np.atleast_2d(episode.individual_rewards), np.atleast_2d(episode.G)
            active = np.ones(rewards.shape, bool) if episode.active is None else np.atleast_2d(episode.active)
            for a in range(rewards.shape[0]):  # each agent's G over its own transitions
                np.testing.assert_allclose(
                    G[a, active[a]], plain_returns(list(rewards[a, active[a]]), buffer.gamma), rtol=1e-5, atol=1e-5
                )
        n += 1
    return n


def reference_episodes(
    fields: dict[str, np.ndarray], spans: list[tuple[int, int]], axis: int
) -> list[dict[str, np.ndarray]]:
    """``fields`` (every step of a plain loop, time on ``axis``) cut into its episodes ``spans``."""
    return [
        {name: value.take(np.arange(start, end), axis=axis) for name, value in fields.items()} for start, end in spans
    ]


class Case:
    """A recording to interrupt: ``make`` builds the recorded env, ``replay`` plays the plain
    loop's seeds and actions through it, ``table`` holds the plain loop's episodes."""

    make: Callable[[], Any]
    replay: Callable[[Any], None]
    table: dict[bytes, list[dict[str, np.ndarray]]]
    #: how episodes are checked right after the interrupt (`assert_matches`): an interrupt that
    #: lands inside a step ends the running episode there, as truncated
    cuts: bool | None = True
    #: how episodes a reset cut are checked (`assert_matches`): as the first steps of the
    #: reference's, or left out (AEC: a cut drops the transitions opened by the last turns)
    cut_check: bool | None = True

    def buffer(self, env: Any) -> fe.FlexibleBuffer:
        return env.buffer


class Gym(Case):
    def __init__(self, num_steps: int) -> None:
        log = play(gym.make("CartPole-v1"), seed=0, steps=3000)
        end = log.episodes[-1][1]  # the last whole episode's end: a replay ends no episode half way
        self.actions = log.actions[:end]
        fields = {
            "obs": np.array(log.obs),
            "obs_": np.array(log.obs_),
            "discrete_actions": np.array(log.discrete),
            "individual_rewards": np.array(log.reward),
            "terminated": np.array(log.terminated),
            "truncated": np.array(log.truncated),
        }
        self.table = episode_table(reference_episodes(fields, log.episodes, 0))
        self.make = lambda: fe.record(gym.make("CartPole-v1"), num_steps=num_steps, gamma=GAMMA)

    def replay(self, env: Any) -> None:
        env.reset(seed=0)
        for action in self.actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()


class Vector(Case):
    """SyncVectorEnv of 8 CartPoles (NEXT_STEP autoreset): sub-env ``i`` is a bare CartPole
    seeded ``i``, whose step after an episode's end only resets it. ``same_step``: the sub-env
    resets within the step that ends an episode (SAME_STEP, and SB3's VecEnvs)."""

    def __init__(self, num_steps: int, n: int = 8, steps: int = 1500, *, same_step: bool = False) -> None:
        self.actions = np.random.default_rng(0).integers(0, 2, (steps, n))
        episodes = []
        for i in range(n):
            bare = gym.make("CartPole-v1")
            obs, _ = bare.reset(seed=i)
            rows: list[tuple[Any, ...]] = []
            start, resetting = 0, False
            for t in range(steps):
                if resetting:
                    obs, _ = bare.reset()
                    resetting = False
                    continue
                nxt, reward, terminated, truncated, _ = bare.step(int(self.actions[t, i]))
                if same_step:  # SB3 tells a time limit apart only where the episode did not also end
                    truncated = truncated and not terminated
                rows.append((obs, nxt, [self.actions[t, i]], reward, terminated, truncated))
                obs = nxt
                if terminated or truncated:
                    episodes += reference_episodes(self._fields(rows), [(start, len(rows))], 0)
                    start = len(rows)
                    if same_step:
                        obs, _ = bare.reset()
                    else:
                        resetting = True
            if start < len(rows):  # the running one, as the next reset cuts it: truncated at its last step
                rows[-1] = (*rows[-1][:5], True)
                episodes += reference_episodes(self._fields(rows), [(start, len(rows))], 0)
        self.table = episode_table(episodes)
        self.make = lambda: fe.record(
            gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n), num_steps=num_steps, gamma=GAMMA
        )
        self.n = n

    @staticmethod
    def _fields(rows: list[tuple[Any, ...]]) -> dict[str, np.ndarray]:
        names = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated", "truncated")
        return {name: np.array(column) for name, column in zip(names, zip(*rows))}

    def replay(self, env: Any) -> None:
        env.reset(seed=list(range(self.n)))
        for actions in self.actions:
            env.step(actions)


class SB3Vec(Vector):
    """SB3's ``RecordingVecEnv`` over a ``DummyVecEnv`` of 4 CartPoles, stepped as SB3's
    algorithms step it."""

    def __init__(self, num_steps: int) -> None:
        from stable_baselines3.common.vec_env import DummyVecEnv

        from flexibuff_envs.integrations.sb3 import RecordingVecEnv

        super().__init__(num_steps, n=4, steps=800, same_step=True)
        self.make = lambda: RecordingVecEnv(
            DummyVecEnv([lambda: gym.make("CartPole-v1")] * 4), num_steps=num_steps, gamma=GAMMA
        )

    def replay(self, env: Any) -> None:
        env.seed(0)  # sub-env i seeded i at the next reset
        env.reset()
        for actions in self.actions:
            env.step(actions)


class Parallel(Case):
    def __init__(self, num_steps: int) -> None:
        from mpe2 import simple_spread_v3

        from flexibuff_envs.testing.pz_reference import play_parallel

        self.env_fn = lambda: simple_spread_v3.parallel_env(N=3, max_cycles=25)
        expected, _ = play_parallel(self.env_fn(), seed=0, steps=600)
        self.actions = expected.actions
        fields = {
            "obs": expected.obs,
            "obs_": expected.obs_,
            "discrete_actions": expected.discrete,
            "individual_rewards": expected.rewards,
            "terminated": expected.terminated,
            "truncated": expected.truncated,
            "active": expected.active,
        }
        self.table = episode_table(reference_episodes(fields, expected.episodes, 1))
        self.make = lambda: fe.record(self.env_fn(), num_steps=num_steps, gamma=GAMMA)

    def replay(self, env: Any) -> None:
        env.reset(seed=0)
        for actions in self.actions:
            env.step(actions)
            if not env.agents:
                env.reset()


class AEC(Case):
    cuts = cut_check = None

    def __init__(self, num_steps: int, episodes: int = 40) -> None:
        from pettingzoo.classic import connect_four_v3

        from flexibuff_envs.testing.pz_reference import play_aec

        expected = play_aec(connect_four_v3.env(), seed=0, episodes=episodes)
        self.actions, self.episodes = expected.actions, episodes
        fields = {
            "obs": expected.obs,
            "obs_": expected.obs_,
            "discrete_actions": expected.discrete,
            "individual_rewards": expected.rewards,
            "terminated": expected.terminated,
            "truncated": expected.truncated,
            "active": expected.active,
            "action_mask": expected.mask,
        }
        self.table = episode_table(reference_episodes(fields, expected.episodes, 1))
        self.make = lambda: fe.record(connect_four_v3.env(), num_steps=num_steps, gamma=GAMMA)

    def replay(self, env: Any) -> None:
        from flexibuff_envs.testing.pz_reference import replay_aec

        replay_aec(env, 0, self.episodes, self.actions)


class SB3Replay(Case):
    """SB3's ``ReplayBuffer.add`` of a plain CartPole loop's transitions, one sub-env."""

    cuts = False  # the adds are the steps: one is recorded whole or not at all

    def __init__(self, num_steps: int) -> None:
        log = play(gym.make("CartPole-v1"), seed=0, steps=3000)
        self.table = Gym(num_steps).table
        self.adds = [
            (
                np.array([o]),
                np.array([o_]),
                np.array([[a]]),
                np.array([r]),
                np.array([te or tr]),
                [{"TimeLimit.truncated": tr and not te}],
            )
            for o, o_, a, r, te, tr in zip(log.obs, log.obs_, log.actions, log.reward, log.terminated, log.truncated)
        ]
        space = gym.make("CartPole-v1")

        def make() -> Any:
            from flexibuff_envs.integrations.sb3 import ReplayBuffer

            return ReplayBuffer(num_steps, space.observation_space, space.action_space, device="cpu")

        self.make = make

    def replay(self, env: Any) -> None:
        for add in self.adds:
            env.add(*add)


CASES: dict[str, Callable[[int], Case]] = {
    "gym": Gym,
    "vector": Vector,
    "parallel": Parallel,
    "aec": AEC,
    "sb3_replay": SB3Replay,
    "sb3_vec_env": SB3Vec,
}


_cases: dict[tuple[str, str], Case] = {}


def case_of(kind: str, ring: str) -> Case:
    if (kind, ring) not in _cases:
        if kind in ("parallel", "aec"):
            pytest.importorskip("pettingzoo")
            pytest.importorskip("mpe2")
        if kind.startswith("sb3"):
            pytest.importorskip("stable_baselines3")
        _cases[kind, ring] = CASES[kind](RINGS[ring])
    return _cases[kind, ring]


def rows_of(buffer: fe.FlexibleBuffer) -> int:
    """The rows one pass over the buffer reads (none: the interrupt came before the first step)."""
    if not buffer.n_episodes and not len(buffer):
        return 0
    return sum(batch.obs.shape[-2] for batch in buffer.minibatches(4096, shuffle=False))


@pytest.mark.parametrize("ring", list(RINGS))
@pytest.mark.parametrize("kind", list(CASES))
def test_ctrl_c_at_any_instant_leaves_a_buffer_that_holds_what_happened(kind: str, ring: str, tmp_path: Any) -> None:
    case = case_of(kind, ring)
    env = case.make()
    began = time.perf_counter()
    case.replay(env)  # uninterrupted: it holds the reference, and tells how long a replay lasts
    duration = time.perf_counter() - began
    assert assert_matches(case.buffer(env), case.table, cut_ok=case.cuts) > 0

    rng = np.random.default_rng(sorted(CASES).index(kind) * 10 + list(RINGS).index(ring))
    for trial in range(TRIALS):
        env = case.make()

        def run(env: Any = env) -> None:
            case.replay(env)
            late = time.monotonic() + 30
            while time.monotonic() < late:  # the interrupt is late: wait for it here
                time.sleep(0.001)
            raise AssertionError("the interrupt never reached the caller (noted and never delivered?)")

        interrupted(run, rng.uniform(0, duration))
        buffer = case.buffer(env)
        held = assert_matches(buffer, case.table, cut_ok=case.cuts)
        assert len(buffer) == rows_of(buffer) >= sum(e.obs.shape[-2] for e in buffer.episodes())
        # its own save loads, holding the same
        loaded = fe.FlexibleBuffer.load(buffer.save(tmp_path / f"{trial}.fbuf"))
        assert assert_matches(loaded, case.table, cut_ok=case.cuts) == held
        assert len(loaded) == len(buffer)
        if kind != "sb3_replay":  # SB3 has no reset: its next add would run on the interrupted episode
            case.replay(env)  # recording goes on; the interrupted episode ends, cut, at its last whole step
            assert assert_matches(buffer, case.table, cut_ok=case.cut_check) >= min(held, 1)


def test_a_handler_put_back_by_whoever_replaced_it_still_gets_the_signal() -> None:
    """A program (the CLI, around its save) sets its own SIGINT handler while recording, then puts
    the one before back: Ctrl-C raises KeyboardInterrupt again, and the program's handler, gone,
    sees nothing."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=100)
    env.reset(seed=0)
    env.step(0)  # recording held Ctrl-C once: its handler stands in front of Python's
    noted: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    env.step(0)  # held again, in front of the program's handler
    signal.signal(signal.SIGINT, before)
    env.step(1)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert noted == []


# ----------------------------------------------------- a loop that goes on after the interrupt


class SlowToReturn(gym.Wrapper):
    """CartPole that takes a millisecond to return from a step it has taken: most interrupts
    land after the env moved and before the recorder saw the step."""

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        time.sleep(0.001)
        return result


def skipped_steps(buffer: fe.FlexibleBuffer) -> int:
    """Rows whose next observation is not what CartPole's dynamics make of the observation and
    action (a transition that spans a step the recording lost)."""
    sim = gym.make("CartPole-v1").unwrapped
    sim.reset(seed=0)
    wrong = 0
    for episode in buffer.episodes():
        for obs, action, obs_ in zip(episode.obs, episode.discrete_actions[:, 0], episode.obs_):
            sim.state = obs.astype(np.float64)
            wrong += not np.allclose(sim.step(int(action))[0], obs_, atol=1e-5)
    return wrong


@pytest.mark.parametrize("kind", ["gym", "vector", "sb3_vec_env"])
def test_a_loop_that_goes_on_after_ctrl_c_records_no_transition_that_skips_a_step(kind: str) -> None:
    """A notebook's interrupted cell, run again: the loop catches KeyboardInterrupt and steps on
    without a reset. Whether the env moved in the interrupted step is unknown to the recorder, so
    the running episode ends at its last recorded step; every row recorded, before and after,
    is one CartPole step from its observation."""
    rng = np.random.default_rng(list(CASES).index(kind))
    make = lambda: SlowToReturn(gym.make("CartPole-v1"))
    if kind == "gym":
        env: Any = fe.record(make(), num_steps=10_000)
    elif kind == "vector":
        env = fe.record(gym.vector.SyncVectorEnv([make] * 2), num_steps=10_000)
    else:
        pytest.importorskip("stable_baselines3")
        from stable_baselines3.common.vec_env import DummyVecEnv

        from flexibuff_envs.integrations.sb3 import RecordingVecEnv

        env = RecordingVecEnv(DummyVecEnv([make] * 2), num_steps=10_000)
    env.reset(seed=0) if kind != "sb3_vec_env" else env.reset()
    interrupts = 0
    for _ in range(20):

        def run() -> None:
            while True:
                if kind == "gym":
                    _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
                    if terminated or truncated:
                        env.reset()
                else:
                    env.step(rng.integers(0, 2, 2))

        interrupted(run, rng.uniform(0.01, 0.1))
        interrupts += 1
    assert interrupts == 20 and sum(len(e.obs) for e in env.buffer.episodes()) > 200
    assert skipped_steps(env.buffer) == 0
