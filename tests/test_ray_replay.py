"""The sharded replay service on a local Ray cluster of separate nodes (`integrations.ray_replay`):
samples follow the uniform and prioritized laws over all shards with importance weights over the
whole replay; the rate limiter holds its ratio while collectors insert into shards themselves; a
shard lost with its actor, then with its node, comes back from its log while sampling goes on;
tables are apart; episodes go whole to one shard."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

ray = pytest.importorskip("ray")

import flexibuff_envs as fe
from flexibuff_envs.integrations.ray import RayCollector
from flexibuff_envs.integrations.ray_replay import RateLimiter, ReplayService


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head and a second node (raylets of their own, as `ray start` would make)."""
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    made.add_node(num_cpus=2)
    ray.init(address=made.address, log_to_driver=False)
    made.wait_for_nodes()
    yield made
    ray.shutdown()
    made.shutdown()


def recorded(steps: int, seed: int = 0) -> fe.FlexibleBuffer:
    env = fe.record(gym.make("CartPole-v1"), num_steps=steps + 600)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(steps):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    return env.buffer


def shard_logs(root: Path, table: str = "default") -> list[fe.FlexibleBuffer]:
    return [fe.FlexibleBuffer.open(path) for path in sorted(root.glob(f"shard-*/{table}"))]


def chi2(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def test_samples_follow_the_uniform_and_prioritized_laws_over_every_shard(cluster: Any, tmp_path: Path) -> None:
    buffer = recorded(800)
    service = ReplayService(buffer.spec, shards=2, capacity=10_000, log_dir=tmp_path, alpha=0.6, seed=1)
    try:
        assert service.insert(buffer) == buffer.n_episodes
        sizes, whole = service.sizes(), int(buffer.episode_stats()["lengths"].sum())  # not the running one
        assert sum(sizes) == whole and min(sizes) > 0  # spread over both, episodes whole

        draws = np.concatenate([service.sample(2000).idx for _ in range(100)])
        keys, counts = np.unique(draws, return_counts=True)
        assert keys.size == whole  # every row of both shards drawn, nothing else
        assert chi2(counts, np.full(keys.size, draws.size / keys.size)) < 2 * keys.size + 30

        # priorities that differ by row and make shard 1 heavier: the law is over the whole replay
        priority = 0.5 + (keys * 7919 % 97) / 20 + (keys % 2) * 3.0
        service.update_priorities(keys, priority)
        leaf = priority**0.6
        batches = [service.sample(2000, prioritized=True, beta=0.5) for _ in range(100)]
        drawn = np.concatenate([b.idx for b in batches])
        where = np.searchsorted(keys, drawn)
        np.testing.assert_array_equal(keys[where], drawn)
        got = np.bincount(where, minlength=keys.size)
        assert chi2(got, drawn.size * leaf / leaf.sum()) < 2 * keys.size + 30
        weights = np.concatenate([b.weights for b in batches])
        np.testing.assert_allclose(weights, (leaf[where] / leaf.min()) ** -0.5, rtol=1e-5)  # min over both shards
        assert weights.max() == pytest.approx(1.0)

        three = service.sample(64, n_step=3, fields=("obs", "obs_", "individual_rewards", "discounts"))
        assert three.obs.shape == (64, 4) and three.discounts.shape == (64,) and three.terminated is None
        torch = pytest.importorskip("torch")
        assert isinstance(service.sample(8, as_torch=True).obs, torch.Tensor)
    finally:
        service.close()
    held = [log.episode_hashes() for log in shard_logs(tmp_path)]  # each episode whole in one shard's log
    assert sorted(held[0] + held[1]) == sorted(buffer.episode_hashes())
    with pytest.raises(fe.InvalidArgumentError, match="holds logs already"):  # not a second run over the first
        ReplayService(buffer.spec, shards=2, capacity=10_000, log_dir=tmp_path)
    again = ReplayService(buffer.spec, shards=2, capacity=10_000, log_dir=tmp_path, resume=True)
    try:
        assert again.sizes() == sizes  # a run continued: every episode back in its shard
    finally:
        again.close()


def test_weights_are_over_the_whole_replay_when_the_lightest_shard_is_not_drawn(cluster: Any) -> None:
    buffer = recorded(800)
    service = ReplayService(buffer.spec, shards=4, capacity=10_000, alpha=0.6, seed=2)
    try:
        service.insert(buffer)
        keys = np.unique(np.concatenate([service.sample(2000).idx for _ in range(20)]))
        # shard 3 light (it holds the smallest priority, and is rarely drawn), the others heavy
        priority = np.where(keys % 4 == 3, 0.05, 1.0 + (keys * 7919 % 13))
        service.update_priorities(keys, priority)
        leaf = priority**0.6
        without_3 = 0
        for _ in range(300):
            batch = service.sample(4, prioritized=True, beta=0.7)
            where = np.searchsorted(keys, batch.idx)
            without_3 += not (batch.idx % 4 == 3).any()
            np.testing.assert_allclose(batch.weights, (leaf[where] / leaf.min()) ** -0.7, rtol=1e-5)
        assert without_3 > 250  # most batches miss the shard holding the minimum: their weights still use it
    finally:
        service.close()


def test_priorities_for_rows_of_a_shard_started_again_are_dropped(cluster: Any, tmp_path: Path) -> None:
    buffer = recorded(600)
    service = ReplayService(buffer.spec, shards=2, capacity=10_000, log_dir=tmp_path, alpha=1.0)
    try:
        service.insert(buffer)
        before = service.sample(512, prioritized=True)
        assert set(before.idx % 2) == {0, 1}
        ray.kill(service.shards[1], no_restart=False)  # Ray starts it again: its rows are other rows
        for _ in range(600):  # until it is back with its episodes
            if service.sizes()[1] > 0:
                break
            time.sleep(0.1)
        service.sample(64, prioritized=True)  # draws from its new start
        service.update_priorities(before.idx, 0.001)  # of the old start on shard 1: dropped there
        stats = [ray.get(shard.draw.remote("default", 0, {"prioritized": True}, 1.0)) for shard in service.shards]
        _, _, rows, total, minimum = stats[1]
        assert minimum == pytest.approx(1.0) and total == pytest.approx(rows)  # every row as it came back
        assert stats[0][4] == pytest.approx(0.001)  # shard 0 took them
    finally:
        service.close()


def test_tables_are_apart_and_bad_input_is_named(cluster: Any, tmp_path: Path) -> None:
    buffer = recorded(300)
    service = ReplayService(buffer.spec, shards=2, capacity=5_000, tables=("learner", "league"))
    try:
        with pytest.raises(fe.InvalidArgumentError, match="holds no rows"):
            service.sample(8, table="league")
        buffer.save(tmp_path / "b.fbuf")
        assert service.insert(tmp_path / "b.fbuf", table="league") == buffer.n_episodes
        whole = int(buffer.episode_stats()["lengths"].sum())
        assert sum(service.sizes("league")) == whole and sum(service.sizes("learner")) == 0
        with pytest.raises(fe.InvalidArgumentError, match="no table 'default'"):
            service.sample(8)
        with pytest.raises(TypeError, match="a Chunk, a FlexibleBuffer or a path"):
            service.insert([1, 2, 3], table="learner")
        other = recorded(100).copy_episodes()
        with pytest.raises(fe.SpecMismatchError):  # a chunk of other discounts: refused, nothing lost
            service.insert(type(other)(other.spec, 0.5, other.gae_lambda, other.lengths, other.parts), table="league")
        assert sum(service.sizes("league")) == whole
        # an insert sent again after its shard was lost in it: skipped when it had arrived, not doubled
        chunk = recorded(200, seed=3).copy_episodes()
        shard = service.shards[0]
        assert ray.get(shard.insert.remote(chunk, "learner", True)) == chunk.n_episodes  # had not arrived
        assert ray.get(shard.insert.remote(chunk, "learner", True)) == 0
        assert ray.get(shard.insert.remote(chunk[:-1], "learner", True)) == 0  # the newest of the last one
        with pytest.raises(fe.InvalidArgumentError, match="no sample of this service gave"):
            service.update_priorities(np.array([-1]), 1.0, table="league")
        with pytest.raises(fe.InvalidArgumentError, match="priorities for"):
            service.update_priorities(np.arange(4), np.ones(3), table="league")
    finally:
        service.close()
    with pytest.raises(fe.InvalidArgumentError, match="samples_per_insert needs a finite tolerance"):
        RateLimiter(samples_per_insert=4)


def test_the_rate_limiter_holds_its_ratio_while_collectors_insert_into_shards(cluster: Any) -> None:
    spi, min_size, tolerance = 2.0, 300, 400.0
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    limiter = RateLimiter(min_size=min_size, samples_per_insert=spi, tolerance=tolerance, timeout=60)
    service = ReplayService(spec, shards=2, capacity=50_000, limiter=limiter)
    collector = RayCollector(lambda: gym.make("CartPole-v1"), n_workers=2, service=service, chunk_steps=50)
    try:
        collector.start()
        infos, sampled, diffs = [], 0, []
        began = time.monotonic()
        while time.monotonic() - began < 6:
            service.sample(32)
            sampled += 32
            inserted, counted = service.counts()
            diffs.append(inserted * spi - counted)
            infos += collector.poll()
        infos += collector.stop()
        inserted, counted = service.counts()
        assert counted == sampled and inserted >= min_size
        # every chunk in a shard, but one a worker held back at the stop (dropped: 0 episodes appended)
        assert inserted == sum(info.rows for info in infos if info.episodes) == sum(service.sizes())
        longest = max(info.rows for info in infos)  # an insert is never cut: it may overshoot by one
        assert min(diffs) >= spi * min_size - tolerance
        assert max(diffs) <= spi * min_size + tolerance + 2 * spi * longest
        # both sides waited: collectors alone would have inserted far more in 6 s than the learner sampled
        assert inserted < 20_000
        assert {info.worker for info in infos} == {0, 1} and all(info.returns.shape[1] == 1 for info in infos)
    finally:
        collector.close()
        service.close()
    starved = ReplayService(spec, shards=1, capacity=1000, limiter=RateLimiter(min_size=10, timeout=1))
    try:
        with pytest.raises(fe.WorkerTimeoutError, match="waited 1 s for the rate limiter"):
            starved.sample(8)
        filled = recorded(200)
        starved.insert(filled, limited=False)  # a replay filled before training: counted, not held back
        assert starved.counts()[0] == sum(starved.sizes()) > 10 and len(starved.sample(8).idx) == 8
    finally:
        starved.close()


def test_a_shard_lost_with_its_actor_then_its_node_comes_back_from_its_log(cluster: Any, tmp_path: Path) -> None:
    spare = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    head = ray.get_runtime_context().get_node_id()
    spec = fe.infer_spec(gym.make("CartPole-v1"))
    service = ReplayService(
        spec,
        shards=2,
        capacity=100_000,
        log_dir=tmp_path,
        nodes=[head, spare.node_id],
        patience=1,
        limiter=RateLimiter(min_size=400, samples_per_insert=1, tolerance=3000, timeout=120),
    )
    collector = RayCollector(
        lambda: gym.make("CartPole-v1"),
        n_workers=2,
        service=service,
        chunk_steps=100,
        worker_options={"num_cpus": 0.5},
    )
    infos: list[Any] = []

    def sample_for(seconds: float) -> int:
        """Sample (prioritized, updating) for a while; returns the samples that drew from shard 1."""
        with_1, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            batch = service.sample(64, prioritized=True)
            service.update_priorities(batch.idx, np.random.default_rng(0).random(64) + 0.1)
            with_1 += bool((batch.idx % 2 == 1).any())
            infos.extend(collector.poll())
        return with_1

    def shard_1() -> tuple[str, int, int, str]:
        incarnation, recovered, held, node, _ = ray.get(service.shards[1].describe.remote())
        return incarnation, recovered, held["default"][1], node

    def back_after(loss: Any) -> tuple[int, int, str]:
        """Lose shard 1 by ``loss()`` while sampling goes on; its episodes recovered and held
        when it is back, and its node."""
        before, _, held, _ = shard_1()
        loss()
        sample_for(1)  # the other shard serves meanwhile
        incarnation, recovered, now, node = shard_1()  # waits for its new start
        assert incarnation != before
        assert recovered >= held  # every episode it held came back from its log
        return recovered, now, node

    try:
        collector.start()
        assert sample_for(2) > 0
        assert shard_1()[3] == spare.node_id
        back_after(lambda: ray.kill(service.shards[1], no_restart=False))  # its process lost
        assert sample_for(1) > 0
        _, _, node = back_after(lambda: cluster.remove_node(spare))  # its node lost: on another now
        assert node != spare.node_id
        assert sample_for(1) > 0  # sampling reaches it again
        infos += collector.stop()
    finally:
        collector.close()
        service.close()
    logs = shard_logs(tmp_path)
    hashes = [h for log in logs for h in log.episode_hashes()]
    assert len(hashes) == len(set(hashes))  # no episode held twice (an insert sent again is not doubled)
    assert len(hashes) >= sum(info.episodes for info in infos) > 0  # none of those appended was lost


def pong() -> Any:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", max_episode_steps=60)


def test_image_rows_through_shards_whose_rings_wrap_replay_as_the_bare_env_plays(cluster: Any, tmp_path: Path) -> None:
    """Pong frames collected into two shards of 120 rows (rings that wrap), each shard's log
    replayed in the bare env from the recorded seeds and actions, and every sampled transition
    one the bare env made."""
    pytest.importorskip("ale_py")
    from flexibuff_envs.integrations.replay import replay

    service = ReplayService(fe.infer_spec(pong()), shards=2, capacity=240, log_dir=tmp_path)
    collector = RayCollector(pong, n_workers=2, service=service, chunk_steps=60, seed=7)
    try:
        assert collector.collect(720).episodes == 12
        assert service.sizes() == [120, 120]  # each ring wrapped: 6 episodes of 60 through 120 rows
        batches = [service.sample(32, prioritized=bool(i % 2)) for i in range(10)]
    finally:
        collector.close()
        service.close()
    made = set()
    for log in shard_logs(tmp_path):
        report = replay(log, env=pong)
        assert report.clean == list(range(6)) and not report.divergences and not report.skipped
        made |= {(o.tobytes(), o_.tobytes()) for e in log.episodes() for o, o_ in zip(e.obs, e.obs_)}
    assert all((o.tobytes(), o_.tobytes()) in made for b in batches for o, o_ in zip(b.obs, b.obs_))
