"""Sampling an episode log in place (`FlexibleBuffer.open`), against the same log read into RAM.

1. A log of CartPole x64 (native vector env, random actions) is recorded, ``--rows`` rows.
2. Cached: ``sample_transitions(256, fields=<the five a DQN reads>)`` from the log mapped (its
   pages in the page cache) and from the log read into memory (``mmap=False``), interleaved
   rounds, medians per batch.
3. Larger than memory: the log merged with itself ``--copies`` times is opened in a child process
   confined to ``--limit-mib`` of memory by a cgroup (v1 ``memory.limit_in_bytes``, page cache
   included; where no cgroup can be made the child runs unconfined and says so). It samples
   batches with the log's pages cold (each batch after ``posix_fadvise(DONTNEED)`` on every
   column) and as they stand after many batches, and reports medians and its resident memory.

Prints the machine, date, commit and the medians. Run: python benchmarks/bench_log_read.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated")
CGROUP = Path("/sys/fs/cgroup/memory")


def record(directory: Path, rows: int) -> None:
    venv = gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="vector_entry_point")
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(venv), num_steps=4096)
    buffer.log_to(directory, per_block=True)
    env = fe.record(venv, buffer)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(rows // 64 + 1):
        env.step(rng.integers(0, 2, 64))
    env.close()
    buffer.close_log()  # the buffer made the log: folded, synced, its ring's files gone


def per_batch(buffer: fe.FlexibleBuffer, batches: int) -> list[float]:
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        buffer.sample_transitions(256, fields=FIELDS)
        times.append(time.perf_counter() - start)
    return times


def cached(directory: Path, rounds: int) -> None:
    ram = fe.FlexibleBuffer.open(directory, mmap=False)
    mapped = fe.FlexibleBuffer.open(directory)
    for path in directory.iterdir():  # every page in the cache
        if path.is_file():
            path.read_bytes()
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(statistics.median(per_batch(ram, 200)))
        b.append(statistics.median(per_batch(mapped, 200)))
    ram_us, mapped_us = statistics.median(a) * 1e6, statistics.median(b) * 1e6
    print(
        f"  cached, {len(ram):,} rows: RAM {ram_us:.1f} us, mapped {mapped_us:.1f} us per batch "
        f"({mapped_us / ram_us:.2f}x; target <= 2x)"
    )


def child(directory: str, batches: int) -> None:
    """In the confined process: open, sample cold and warm, report."""
    start = time.perf_counter()
    buffer = fe.FlexibleBuffer.open(directory)
    opened = time.perf_counter() - start
    columns = [os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".col")]

    def evict() -> None:
        for path in columns:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

    cold = []
    for _ in range(batches // 4):
        evict()
        cold.extend(per_batch(buffer, 1))
    warm = per_batch(buffer, batches)
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    print(
        json.dumps(
            {
                "rows": len(buffer),
                "open_s": opened,
                "cold_us": statistics.median(cold) * 1e6,
                "warm_us": statistics.median(warm) * 1e6,
                "rss_anon_mib": int(status["RssAnon"].split()[0]) / 1024,
                "rss_file_mib": int(status["RssFile"].split()[0]) / 1024,
            }
        )
    )


def confined(directory: Path, limit_mib: int, batches: int) -> None:
    size = sum(path.stat().st_size for path in directory.iterdir() if path.is_file())
    group = CGROUP / f"flexibuff-bench-{os.getpid()}"
    command = [sys.executable, __file__, "--child", str(directory), "--batches", str(batches)]
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_mib << 20))
        where = f"a cgroup of {limit_mib} MiB (page cache included)"
    except OSError as exc:
        group, where = None, f"no cgroup ({exc.strerror}): unconfined"  # type: ignore[assignment]
    try:
        run = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=None if group is None else lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
    finally:
        if group is not None:
            group.rmdir()
    result = json.loads(run.stdout)
    print(
        f"  {size / 2**30:.2f} GiB log ({result['rows']:,} rows, {size / (limit_mib << 20):.1f}x the memory) in "
        f"{where}: opened in {result['open_s']:.2f} s; per batch cold {result['cold_us']:,.0f} us, after "
        f"{batches} batches {result['warm_us']:,.0f} us; resident {result['rss_anon_mib']:.0f} MiB anonymous + "
        f"{result['rss_file_mib']:.0f} MiB of mapped log pages"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--copies", type=int, default=20, help="the larger log: the first merged this many times")
    parser.add_argument("--limit-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--dir", default=None, help="where the logs go (default: a temporary directory)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batches)
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    print(
        f"episode log sampled in place: {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}), "
        f"{datetime.date.today()}, commit {commit}, seed 0; sample_transitions(256, fields={list(FIELDS)})"
    )
    root = Path(args.dir or tempfile.mkdtemp(prefix="flexibuff-bench-"))
    try:
        record(root / "one", args.rows)
        cached(root / "one", args.rounds)
        fe.merge_logs([root / "one"] * args.copies, root / "many")
        confined(root / "many", args.limit_mib, args.batches)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
