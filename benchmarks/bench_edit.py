"""Editing a large log: `filter` (half the episodes, by return) and `split` (90/10) of a CartPole
log against copying the log's files (`shutil.copytree`, the disk's speed here), in one run.

A CartPole x64 log (native vector env, random actions, seed 0) of ``--rows`` rows is merged with
itself ``--copies`` times; each operation runs ``--rounds`` times (its output removed between),
and the medians are printed with the bytes a second each moves (the source log's bytes over its
time).

Run: python benchmarks/bench_edit.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from bench_view import cartpole  # beside this script
from stamp import commit, machine

import flexibuff_envs as fe
from flexibuff_envs.integrations.editing import select, split, where


def timed(call: Callable[[], object], clean: Path, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        shutil.rmtree(clean, ignore_errors=True)
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    shutil.rmtree(clean, ignore_errors=True)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"editing a log: {machine()}, commit {commit()}, seed 0, medians of {args.rounds}")
    root = Path(tempfile.mkdtemp(prefix="flexibuff-bench-edit-"))
    try:
        cartpole(root / "one", args.rows)
        fe.merge_logs([root / "one"] * args.copies, root / "log")
        log = root / "log"
        nbytes = sum(p.stat().st_size for p in log.rglob("*") if p.is_file())
        episodes = fe.FlexibleBuffer.open(log).n_episodes
        returns = fe.FlexibleBuffer.open(log).episode_stats()["returns"][:, 0]
        median = float(np.median(returns))
        print(f"the log: {nbytes / 1e9:.2f} GB, {episodes:,} episodes")
        rows = [
            ("copy its files", lambda: shutil.copytree(log, root / "out"), root / "out"),
            (
                f"filter 'return > {median:g}' (half)",
                lambda: select(log, where(log, f"return > {median}"), root / "out", edit="bench"),
                root / "out",
            ),
            ("split --train 0.9 --val 0.1", lambda: split(log, {"train": 0.9, "val": 0.1}, root / "out"), root / "out"),
        ]
        base = None
        for name, call, clean in rows:
            seconds = timed(call, clean, args.rounds)
            base = base or seconds
            print(f"  {name:<34} {seconds:6.2f} s  {nbytes / seconds / 1e6:7.0f} MB/s  {seconds / base:5.1f}x the copy")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
