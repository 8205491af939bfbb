"""Episode logs as a Ray Data dataset on a local cluster of two nodes (`integrations.ray_data`):
the dataset read from three logs placed on two nodes equals the logs read locally, row by row;
episodes come whole and feed `map_batches`; a torn tail is never read; a dataset of episodes
written back is the same episodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("pyarrow")

import flexibuff_envs as fe
from flexibuff_envs.index import episode_table
from flexibuff_envs.integrations.ray_data import read_logs, write_logs
from flexibuff_envs.integrations.tables import episode_arrays
from tests.envs import parallel_games


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[str]]:
    """A head and a second node (raylets of their own, as `ray start` would make), their ids."""
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    made.add_node(num_cpus=1)
    ray.init(address=made.address, log_to_driver=False)
    made.wait_for_nodes()
    yield [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    ray.shutdown()
    made.shutdown()


def _logs(root: Path) -> list[str]:
    paths = []
    for k, steps in enumerate((400, 150, 700)):
        env = fe.record(gym.make("CartPole-v1"), num_steps=2000, log=root / f"log{k}")
        env.action_space.seed(k)
        env.reset(seed=k)
        for _ in range(steps):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
        env.close()
        paths.append(str(root / f"log{k}"))
    return paths


def _local(path: str) -> dict[str, np.ndarray]:
    buffer = fe.FlexibleBuffer.open(path)
    arrays = episode_arrays(buffer.gather(episode_table(buffer._index.read()).all_rows()[0]), buffer.spec)
    return {name: values[0] if values.ndim > 1 and values.shape[0] == 1 else values for name, values in arrays.items()}


def test_three_logs_on_two_nodes_read_as_the_logs_read_locally(cluster: list[str], tmp_path: Path) -> None:
    paths = _logs(tmp_path)
    placed = {paths[0]: cluster[0], paths[1]: cluster[1], paths[2]: cluster[1]}
    dataset = read_logs(paths, nodes=placed, rows_per_task=300, rows_per_block=100)  # tasks and blocks a log
    got = {
        name: np.concatenate([b[name] for b in dataset.iter_batches(batch_format="numpy", batch_size=None)])
        for name in dataset.schema().names
    }
    local = [_local(p) for p in paths]
    for name in local[0]:
        np.testing.assert_array_equal(got[name], np.concatenate([one[name] for one in local]), err_msg=name)
    counts = [fe.FlexibleBuffer.open(p).episode_stats()["lengths"] for p in paths]
    np.testing.assert_array_equal(got["log"], np.repeat([0, 1, 2], [int(c.sum()) for c in counts]))
    first = np.flatnonzero(got["step"] == 0)  # each episode's first step, in order
    assert len(first) == sum(len(c) for c in counts)
    np.testing.assert_array_equal(np.diff(np.append(first, len(got["step"]))), np.concatenate(counts))


def test_a_log_on_a_node_not_in_the_cluster_is_refused_not_read_elsewhere(cluster: list[str], tmp_path: Path) -> None:
    path = _logs(tmp_path)[1]
    with pytest.raises(fe.InvalidArgumentError, match=r"log1 is on node f+, which is not in the cluster"):
        read_logs([path], nodes={path: "f" * 56})


def test_episodes_come_whole_and_feed_map_batches(cluster: list[str], tmp_path: Path) -> None:
    paths = _logs(tmp_path)
    episodes = read_logs(paths, unit="episode")
    returns = episodes.map_batches(
        lambda b: {"return": np.array([float(np.sum(r)) for r in b["individual_rewards"]])}, batch_format="numpy"
    )
    got = np.concatenate([b["return"] for b in returns.iter_batches(batch_format="numpy", batch_size=None)])
    want = np.concatenate([fe.FlexibleBuffer.open(p).episode_stats()["returns"][:, 0] for p in paths])
    np.testing.assert_allclose(got, want)
    row = next(iter(episodes.iter_rows()))
    assert np.asarray(row["obs"]).shape == (row["length"], 4)


def test_a_torn_tail_is_never_read_and_episodes_written_back_are_the_same(cluster: list[str], tmp_path: Path) -> None:
    paths = _logs(tmp_path)[:2]
    before = read_logs(paths).count()
    with open(Path(paths[0]) / "obs.col", "ab") as out:  # an append a kill cut short
        out.write(bytes(160))
    assert read_logs(paths).count() == before
    spec = fe.FlexibleBuffer.open(paths[0]).spec
    write_logs(read_logs(paths, unit="episode"), tmp_path / "back", spec)
    hashes = [h for p in paths for h in fe.FlexibleBuffer.open(p).episode_hashes()]
    assert fe.FlexibleBuffer.open(tmp_path / "back").episode_hashes() == hashes


def test_a_multi_agent_log_reads_each_agent_s_values(cluster: list[str], tmp_path: Path) -> None:
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(N=3, max_cycles=10), num_steps=200, log=tmp_path / "spread")
    parallel_games(env, [0, 1, 2])
    env.close()
    dataset = read_logs([str(tmp_path / "spread")])
    batch: Any = next(iter(dataset.iter_batches(batch_format="numpy", batch_size=4)))
    assert batch["obs"].shape == (4, 3, 18) and batch["individual_rewards"].shape == (4, 3)
    assert dataset.count() == 30
