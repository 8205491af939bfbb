"""A benchmark run against two commits of the package in turn, to see whether a change made
something faster or slower when the machine's speed drifts between runs.

Exports ``BASE`` (a commit, tag or branch) into a temporary directory with ``git archive`` and runs
this checkout's benchmark script ``--runs`` times with each package, alternating (``PYTHONPATH``
names the package; the script and its arguments are the same for both), then prints every run's
output under its label, the machine, the date and both commits. Compare the ratios each script
prints (recorded / bare): those are measured side by side inside one run, and the alternation
shows how much they move between runs.

Run: python benchmarks/versus.py BASE bench_record.py [its arguments...] [--runs N]
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from stamp import ROOT, commit, machine  # beside this script


def export(base: str, into: Path) -> str:
    """The package as of ``base``, written under ``into``; returns its short commit."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", f"{base}^{{commit}}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", sha, "flexibuff_envs"], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return sha


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("script")
    parser.add_argument("--runs", type=int, default=3)
    args, rest = parser.parse_known_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory() as directory:
        # a list, not a dict: BASE may name this checkout's own commit
        trees = [(export(args.base, Path(directory)), Path(directory)), (f"{commit()}, this checkout", ROOT)]
        print(f"benchmarks/{args.script} {' '.join(rest)}: {args.runs} runs against each package in turn")
        print(f"{started:%Y-%m-%d %H:%M} UTC, on {machine()}")
        for run in range(1, args.runs + 1):
            for label, tree in trees:
                result = subprocess.run(
                    [sys.executable, str(ROOT / "benchmarks" / args.script), *rest],
                    env={**os.environ, "PYTHONPATH": str(tree)},
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if result.returncode:
                    sys.stderr.write(result.stderr)
                    return result.returncode
                print(f"\n--- run {run}, package at {label}")
                print(result.stdout.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
