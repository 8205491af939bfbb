"""Long Atari recordings by the command line, to an episode log: ``flexibuff-envs record`` of an
ALE game with ``AtariPreprocessing`` and a 4-frame stack (28,224 bytes a step raw), random
actions, for the steps given; prints the log's size on disk, the bytes a step and the ratio to
the raw stacked bytes, the recording's wall time, and the process's peak resident memory (what
"flat memory" means: it does not grow with the log). Each step is 4 emulator frames.

Run: python benchmarks/bench_cli_atari.py [--games Pong Breakout] [--steps 1000000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from flexibuff_envs import log

RAW = 4 * 84 * 84  # bytes of a stacked observation
_PEAK = (
    "import resource, runpy, sys\n"
    "sys.argv[0] = 'flexibuff-envs'\n"
    "try:\n    runpy.run_module('flexibuff_envs', run_name='__main__')\n"
    "finally:\n    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", default=["Pong", "Breakout"])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cli-atari-")
    print(f"{args.steps:,} steps ({4 * args.steps:,} frames) a game, random actions, seed {args.seed}")
    try:
        for game in args.games:
            out = os.path.join(root, f"{game}.log")
            command = [  # the CLI, its own peak resident memory printed last on stderr
                *(sys.executable, "-c", _PEAK, "record", f"ALE/{game}-v5"),
                *("--env-kwargs", '{"frameskip": 1}', "--wrap", "gymnasium.wrappers.AtariPreprocessing"),
                *("--wrap", 'gymnasium.wrappers.FrameStackObservation:{"stack_size": 4}'),
                *("--steps", str(args.steps), "--seed", str(args.seed), "--out", out),
            ]
            start = time.perf_counter()
            run = subprocess.run(command, check=True, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            peak = int(run.stderr.split()[-1])  # KiB
            report = log.verify(out)
            nbytes = report.nbytes
            print(
                f"{game}: {report.episodes:,} whole episodes, {report.rows:,} rows; log {nbytes / 1e6:,.1f} MB, "
                f"{nbytes / report.rows:,.0f} B a step (raw stacked {RAW:,}: 1/{RAW * report.rows / nbytes:,.0f}); "
                f"{seconds / 60:,.1f} min; peak resident memory {peak / 1024:,.0f} MiB"
            )
            shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
