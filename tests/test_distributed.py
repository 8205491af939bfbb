"""Collection on Ray workers, on a local Ray instance these tests start and stop."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from itertools import accumulate, takewhile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3
from pettingzoo.classic import connect_four_v3

import flexibuff_envs as fe
from flexibuff_envs.integrations.ray import Collected, RayCollector
from flexibuff_envs.recording.rollout import steps
from flexibuff_envs.spec.env_kinds import env_kind
from tests.batches import assert_same_batches, key, whole_episodes

KINDS: dict[str, Callable[[], Any]] = {
    "cartpole": lambda: gym.make("CartPole-v1"),
    "cartpole vector": lambda: gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"),
    "simple_spread parallel": lambda: simple_spread_v3.parallel_env(max_cycles=15),
    "connect four AEC": lambda: connect_four_v3.env(),
}


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def collector() -> Iterator[Callable[..., RayCollector]]:
    """Makes collectors and stops their workers after the test (each holds a CPU of the two)."""
    made: list[RayCollector] = []

    def make(*args: Any, **kwargs: Any) -> RayCollector:
        made.append(RayCollector(*args, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def alone(make: Callable[[], Any], seed: int, n: int, policy: Any = None) -> list[fe.FlexiBatch]:
    """The whole episodes the same recorder records in one process: ``n`` env steps from ``seed``."""
    env = fe.record(make(), num_steps=50_000)
    played = steps(env, str(env_kind(env)), seed=seed, policy=policy)
    for _ in takewhile(lambda total: total < n, accumulate(stepped for stepped, _ in played)):
        pass
    return whole_episodes(env.buffer)


def worker_steps(*runs: Collected) -> list[int]:
    """Env steps each worker took in these runs."""
    totals = [0, 0]
    for run in runs:
        for chunk in run.chunks:
            totals[chunk.worker] += chunk.steps
    return totals


def assert_same_episodes(merged: list[fe.FlexiBatch], expected: list[fe.FlexiBatch]) -> None:
    """The same episodes, whatever the order they arrived in."""
    assert len(merged) == len(expected)
    for a, b in zip(sorted(merged, key=key), sorted(expected, key=key)):
        assert_same_batches(a, b)


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_rows_merged_from_workers_equal_one_process_with_the_same_seeds(
    make: Callable[[], Any], collector: Callable[..., RayCollector]
) -> None:
    c = collector(make, n_workers=2, seed=10, chunk_steps=100)
    runs = c.collect(700), c.collect(500)  # episodes running at the end of one call go on in the next
    assert sum(r.steps for r in runs) >= 1200 and all(r.restarts == 0 for r in runs)
    totals = worker_steps(*runs)
    expected = alone(make, 10, totals[0]) + alone(make, 11, totals[1])
    assert_same_episodes(whole_episodes(c.buffer), expected)
    assert c.buffer.n_episodes == sum(r.episodes for r in runs)
    assert sum(r.merge_seconds for r in runs) < sum(r.seconds for r in runs)


def kill(actor: Any) -> None:
    """Kill ``actor`` and wait until Ray knows it is dead (``ray.kill`` returns before)."""
    ray.kill(actor)
    for _ in range(600):
        try:
            ray.get(actor.describe.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed worker still answers")


def test_a_killed_worker_loses_only_its_unfinished_episode(collector: Callable[..., RayCollector]) -> None:
    make = KINDS["cartpole"]
    c = collector(make, n_workers=2, seed=0, chunk_steps=100)
    before = c.collect(600)
    kill(c.workers[0])
    after = c.collect(600)
    assert after.restarts == 1 and after.steps == 600
    # worker 0 died after 300 steps; its replacement (seed 0 + 2 workers) took the next 300
    expected = alone(make, 0, 300) + alone(make, 1, 600) + alone(make, 2, 300)
    assert_same_episodes(whole_episodes(c.buffer), expected)
    unfinished = alone(make, 0, 600)[len(alone(make, 0, 300))]
    assert key(unfinished) not in {key(e) for e in whole_episodes(c.buffer)}
    assert before.episodes + after.episodes == c.buffer.n_episodes


class CrashOnce:
    """Balances CartPole by the pole's angle; the first process to reach its 150th step dies."""

    def __init__(self, flag: Path) -> None:
        self.flag, self.calls = str(flag), 0

    def __call__(self, obs: np.ndarray, info: dict) -> int:
        self.calls += 1
        if self.calls == 150:
            try:
                os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return int(obs[2] > 0)


def test_a_worker_dying_mid_chunk_is_replaced_and_nothing_half_is_merged(
    tmp_path: Path, collector: Callable[..., RayCollector]
) -> None:
    make, policy = KINDS["cartpole"], CrashOnce(tmp_path / "crashed")
    c = collector(make, policy, n_workers=2, seed=0, chunk_steps=100)
    run = c.collect(800)
    assert run.restarts == 1 and run.steps == 800  # the lost chunks were asked of the replacement
    played = {key(e): e for seed in range(4) for e in alone(make, seed, 800, lambda obs, info: int(obs[2] > 0))}
    merged = whole_episodes(c.buffer)
    assert merged and c.buffer.n_episodes == run.episodes
    for episode in merged:  # each one whole, exactly as some worker played it
        assert_same_batches(episode, played[key(episode)])


class Greedy(torch.nn.Module):
    """Picks the CartPole action with the larger linear score."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        torch.nn.init.zeros_(self.linear.weight)
        self.linear.bias.data = torch.tensor([1.0, 0.0])  # always push left

    def forward(self, obs: np.ndarray, info: dict) -> int:
        return int(self.linear(torch.as_tensor(obs)).argmax())


def test_set_weights_reaches_a_torch_policy_before_its_next_chunk(collector: Callable[..., RayCollector]) -> None:
    c = collector(KINDS["cartpole"], Greedy(), n_workers=2, seed=0, chunk_steps=100)
    first = c.collect(400)
    assert {chunk.weights_version for chunk in first.chunks} == {0}
    assert all((e.discrete_actions == 0).all() for e in whole_episodes(c.buffer))
    right = Greedy()
    right.linear.bias.data = torch.tensor([0.0, 1.0])  # always push right
    assert c.set_weights(right.state_dict()) == 1
    c.buffer.clear()
    second = c.collect(400)
    assert {chunk.weights_version for chunk in second.chunks} == {1}
    episodes = whole_episodes(c.buffer)
    mixed = [e for e in episodes if not (e.discrete_actions == 1).all()]
    assert len(episodes) > 20 and len(mixed) <= 2  # only episodes under way at the switch mix both
    c.close()
    with pytest.raises(TypeError, match="load_state_dict"):
        collector(KINDS["cartpole"], n_workers=1).set_weights(right.state_dict())


def test_stream_merges_chunks_while_the_learner_trains_and_stops_cleanly(
    collector: Callable[..., RayCollector],
) -> None:
    make = KINDS["simple_spread parallel"]
    c = collector(make, n_workers=2, seed=5, chunk_steps=150)
    seen = []
    for info in c.stream():
        seen.append(info)
        c.buffer.sample_transitions(64)  # the learner trains meanwhile
        if len(seen) == 6:
            break
    assert {info.worker for info in seen} == {0, 1} and all(info.steps == 150 for info in seen)
    # chunks under way when the loop ended were merged too: the buffer holds whole episodes only
    assert c.buffer.n_episodes >= sum(info.episodes for info in seen)
    played = {key(e): e for seed in (5, 6) for e in alone(make, seed, 150 * 8)}
    for episode in whole_episodes(c.buffer):
        assert_same_batches(episode, played[key(episode)])
    assert c.collect(300).steps == 300  # the workers carry on


def test_bad_setup_is_reported_before_any_collection(collector: Callable[..., RayCollector]) -> None:
    def broken() -> Any:
        raise ValueError("no such env: Nope-v0")

    with pytest.raises(ray.exceptions.RayActorError, match="no such env: Nope-v0"):
        collector(broken, n_workers=1)
    with pytest.raises(fe.SpecMismatchError, match="the workers' env does not match the buffer: obs_size is 4"):
        collector(KINDS["cartpole"], n_workers=2, buffer=fe.FlexibleBuffer(10, obs_size=6))
    with pytest.raises(ValueError, match="n_workers must be a positive integer"):
        collector(KINDS["cartpole"], n_workers=0)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        collector(KINDS["cartpole"], n_workers=1).collect(0)
    with pytest.raises(
        TimeoutError,
        match="3 workers did not start within start_timeout=5 s; each asks for 1 CPU, the cluster has 2 in all",
    ):
        collector(KINDS["cartpole"], n_workers=3, start_timeout=5)
