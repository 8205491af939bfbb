"""Resident memory of a long recording streamed to an episode log by the command line.

Runs ``flexibuff-envs record ENV --num-envs K --steps N --out DIR`` (the default: CartPole-v1,
64 sub-envs, 100 million steps), reads the process's resident memory (``/proc/PID/status``)
and the rows the log has committed every ``--every`` seconds, and prints them at each tenth of
the run, with the ratio of the last reading to the first after a million rows. Prints the
machine, date and commit.

Run: python benchmarks/bench_log_memory.py [--steps 100000000] [--env CartPole-v1] [--num-envs 64]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flexibuff_envs import log


def committed_rows(directory: Path) -> int:
    """Rows of the newest commit entry (0 before the first)."""
    try:
        with open(directory / log.COMMITS, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < log.ENTRY_BYTES:
                return 0
            handle.seek(size - size % log.ENTRY_BYTES - log.ENTRY_BYTES)
            return struct.unpack("<8sQQ", handle.read(24))[2]
    except FileNotFoundError:
        return 0


def resident(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of ``pid`` in MiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmRSS"].split()[0]) / 1024, int(status["RssAnon"].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100_000_000)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--dir", default=None, help="where the log goes (default: a temporary directory, removed)")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    print(
        f"resident memory of `flexibuff-envs record {args.env} --num-envs {args.num_envs} --steps {args.steps:,} "
        f"--out DIR`: {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}), "
        f"{datetime.date.today()}, commit {commit}, seed 0",
        flush=True,
    )
    root = Path(args.dir or tempfile.mkdtemp(prefix="flexibuff-bench-"))
    directory = root / "run.log"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flexibuff_envs",
            "record",
            args.env,
            "--num-envs",
            str(args.num_envs),
            "--steps",
            str(args.steps),
            "--out",
            str(directory),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    readings: list[tuple[float, int, float, float]] = []
    start = time.monotonic()
    shown = 0
    try:
        while child.poll() is None:
            time.sleep(args.every)
            try:
                rss, anon = resident(child.pid)
            except (FileNotFoundError, ProcessLookupError, KeyError):
                break
            rows = committed_rows(directory)
            readings.append((time.monotonic() - start, rows, rss, anon))
            if rows >= (shown + 1) * args.steps // 10:
                shown = rows * 10 // args.steps
                print(
                    f"  {rows:>13,} rows  {readings[-1][0]:7.0f} s  resident {rss:7.1f} MiB (anonymous {anon:7.1f})",
                    flush=True,
                )
        out, _ = child.communicate()
        after = [r for r in readings if r[1] >= 1_000_000]
        if after:
            first, last = after[0], after[-1]
            print(
                f"  from {first[1]:,} to {last[1]:,} rows: resident {first[2]:.1f} -> {last[2]:.1f} MiB "
                f"({last[2] / first[2]:.3f}x), anonymous {first[3]:.1f} -> {last[3]:.1f} MiB "
                f"({last[3] / first[3]:.3f}x); max {max(r[2] for r in after):.1f} MiB; "
                f"log {sum(p.stat().st_size for p in directory.iterdir()) / 2**30:.2f} GiB"
            )
        print(out.strip().splitlines()[1] if out.strip() else "(no report)")
    finally:
        if child.poll() is None:
            child.kill()
        if args.dir is None:
            shutil.rmtree(root)


if __name__ == "__main__":
    main()
