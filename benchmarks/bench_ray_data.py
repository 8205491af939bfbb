"""Reading a set of episode logs as a Ray Data dataset against reading them in one process, in
one run.

A CartPole x64 log (native vector env, random actions, seed 0) of ``--rows`` rows is merged with
itself into ``--logs`` logs of about ``--gb`` GB together. One process opens each log mapped and
gathers every row into the arrays a batch holds (`FlexibleBuffer.open` and one gather a log); Ray
Data reads the same logs on a local cluster of two nodes (`ray.cluster_utils.Cluster`, a CPU each:
this machine has two cores) with `read_logs`, and a pass of `iter_batches` consumes every row.
Prints rows a second of each, medians of ``--rounds``, and what two cores cannot show.

Run: python benchmarks/bench_ray_data.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_log_read import record as cartpole  # beside this script: CartPole x64, random actions
from stamp import commit, machine

import flexibuff_envs as fe
from flexibuff_envs.index import episode_table


def one_process(paths: list[str]) -> int:
    rows = 0
    for path in paths:
        buffer = fe.FlexibleBuffer.open(path)
        table = episode_table(buffer._index.read())
        for lo in range(0, len(table), 50_000):  # a gather of at most 50,000 episodes at a time
            some = table.starts[lo : lo + 50_000]
            sub = type(table)(some, table.ends[lo : lo + 50_000], table.offsets[lo : lo + 50_000], table.capacity)
            rows += len(buffer.gather(sub.all_rows()[0]).obs)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=250_000, help="rows of the recorded log")
    parser.add_argument("--gb", type=float, default=5.0, help="bytes of the log set")
    parser.add_argument("--logs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    from flexibuff_envs.integrations.ray_data import read_logs

    print(f"reading logs with Ray Data: {machine()}, commit {commit()}, seed 0, medians of {args.rounds}")
    root = Path(tempfile.mkdtemp(prefix="flexibuff-bench-ray-data-"))
    cluster = None
    try:
        cartpole(root / "one", args.rows)
        one = sum(p.stat().st_size for p in (root / "one").iterdir() if p.is_file())
        copies = max(1, round(args.gb * 1e9 / one / args.logs))
        paths = []
        for k in range(args.logs):
            fe.merge_logs([root / "one"] * copies, root / f"log{k}")
            paths.append(str(root / f"log{k}"))
        nbytes = sum(p.stat().st_size for d in paths for p in Path(d).iterdir() if p.is_file())
        total = sum(fe.FlexibleBuffer.open(p).n_episodes for p in paths)
        print(f"the logs: {args.logs} of {nbytes / args.logs / 1e9:.2f} GB ({nbytes / 1e9:.2f} GB, {total:,} episodes)")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        placed = {p: nodes[k % len(nodes)] for k, p in enumerate(paths)}
        times: dict[str, list[float]] = {"one process": [], "Ray Data, 2 nodes": []}
        rows = 0
        for _ in range(args.rounds):
            start = time.perf_counter()
            rows = one_process(paths)
            times["one process"].append(time.perf_counter() - start)
            start = time.perf_counter()
            seen = sum(
                len(b["step"])
                for b in read_logs(paths, nodes=placed).iter_batches(batch_format="numpy", batch_size=None)
            )
            times["Ray Data, 2 nodes"].append(time.perf_counter() - start)
            if seen != rows:
                raise SystemExit(f"Ray Data read {seen:,} rows, one process {rows:,}")
        base = statistics.median(times["one process"])
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(
                f"  {name:<20} {median:6.2f} s  {rows / median / 1e6:6.2f} M rows/s  {nbytes / median / 1e9:5.2f} GB/s  {median / base:5.2f}x"
            )
        print(
            "two cores: the cluster's two nodes share them, so Ray Data cannot run faster than one process here;"
            " what it costs beside one is its tasks, the Arrow blocks and the object store. On a cluster each node"
            " reads its own disk: rows/s grows with the nodes until the consumer saturates."
        )
    finally:
        if cluster is not None:
            ray.shutdown()
            cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
