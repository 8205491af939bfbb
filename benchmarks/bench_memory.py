"""Bytes per stored transition of 84x84x4 uint8 frames: flexibuff_envs vs each peer's own buffer.

Each buffer runs in a fresh process: it is made for ``--steps`` transitions and filled by stepping
an Atari-sized env (`peers.FrameEnv`, 500-step episodes), and the growth of the process's resident
memory is divided by the transitions held. The raw frame is 28,224 bytes; 1.00x means each frame is
stored once, 2.00x means obs and next obs are both kept.
Run: python benchmarks/bench_memory.py [--steps 5000]   (peers: pip install -e '.[bench]')
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import OURS, OURS_AS, PEERS, REQUIRES, FrameEnv, fill, installed


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def child(name: str, steps: int) -> None:
    """In a fresh process: the resident bytes one buffer grows by while holding ``steps`` transitions."""
    import torch  # noqa: F401 - imported before measuring, as every peer's batches need it

    env = FrameEnv()
    if name != OURS:
        importlib.import_module(REQUIRES[name])
    before = resident_bytes()
    sample = fill(name, env, steps, capacity=steps)
    grown = resident_bytes() - before
    sample(32)  # the buffer works
    print(json.dumps({"bytes": grown}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    raw = int(FrameEnv().observation_space.sample().nbytes)
    print(
        f"bytes per stored transition, 84x84x4 uint8 frames ({raw:,} bytes raw), {args.steps:,} transitions "
        f"in episodes of 500 steps"
    )
    for name in [OURS, *OURS_AS, *PEERS]:
        if not installed(name):
            print(f"  {name:<38} not installed (pip install -e '.[bench]')")
            continue
        result = subprocess.run(
            [sys.executable, __file__, "--child", name, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        per = json.loads(result.stdout.strip().splitlines()[-1])["bytes"] / args.steps
        print(f"  {name:<38} {per:10,.0f} bytes  {per / raw:5.2f}x raw")


if __name__ == "__main__":
    main()
