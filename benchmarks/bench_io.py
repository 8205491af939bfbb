"""Buffer files: save and load of a ~1 GiB buffer against copying the same file, in one run.

The buffer holds 84x84x4 uint8 observations (Atari frames) in 100-step episodes. Each round
times, on the same disk, with dirty pages flushed before each step: ``buffer.save`` (which fsyncs)
against a bare write of the same arrays from memory followed by fsync (the floor of a durable
save), ``cp`` of the file it wrote, and ``cp`` followed by ``sync`` of the copy; ``FlexibleBuffer.load`` (reads and checks every byte) against
a bare read of the same file into fresh memory (one ``readinto``); and ``load(mmap=True)``. The file
is in the page cache, as after a save, unless ``--cold`` (needs root) drops the cache before each
read so that they read the disk; medians over the rounds.
With ``--episodes N`` it times instead the opening of a file that lists N two-step episodes
(the header is parsed and checked whole, then each episode indexed): load and load(mmap=True).
Run: python benchmarks/bench_io.py [--gib 1.0] [--rounds 5] [--dir DIR] [--cold]
     python benchmarks/bench_io.py --episodes 200000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np

import flexibuff_envs as fe

FRAME = 84 * 84 * 4


def filled_buffer(gib: float) -> fe.FlexibleBuffer:
    rows = int(gib * 2**30 / (2 * FRAME)) // 100 * 100
    buffer = fe.FlexibleBuffer(rows, FRAME, [6], obs_dtype="uint8", individual_reward=True, seed=0)
    rng = np.random.default_rng(0)
    for name in ("obs", "obs_"):  # random bytes, so nothing about the data makes it easy
        array = buffer.field(name)
        for lo in range(0, rows, 1000):
            array[0, lo : lo + 1000] = rng.integers(0, 256, (min(1000, rows - lo), FRAME), dtype=np.uint8)
    buffer.field("individual_rewards")[...] = rng.normal(size=(1, rows))
    buffer.field("active")[...] = True
    for _ in range(rows // 100):
        buffer.begin_episode()
        for _ in range(100):
            buffer.claim_row()
        buffer.end_episode()
    return buffer


CHUNK = 1 << 25


def bare_read(path: str) -> np.ndarray:
    """The file's bytes into fresh memory, 32 MiB per read: the floor of any load."""
    data = np.empty(os.path.getsize(path), dtype=np.uint8)
    view = memoryview(data)
    with open(path, "rb", buffering=0) as handle:
        for start in range(0, len(view), CHUNK):
            handle.readinto(view[start : start + CHUNK])
    return data


def bare_write(arrays: list[np.ndarray], path: str) -> None:
    """The arrays' bytes to a file, 32 MiB per write, then fsync: the floor of any durable save."""
    with open(path, "wb", buffering=0) as handle:
        for array in arrays:
            view = array.data.cast("B")
            handle.writelines(view[start : start + CHUNK] for start in range(0, len(view), CHUNK))
        os.fsync(handle.fileno())


def seconds(fn: Callable[[], object], cold: bool = False) -> float:
    os.sync()  # the previous step's writeback does not land on this one
    if cold:
        with open("/proc/sys/vm/drop_caches", "w") as caches:
            caches.write("3")
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def many_episodes(n: int, rounds: int) -> None:
    buffer = fe.FlexibleBuffer(2 * n, 4, [2], individual_reward=True)
    for _ in range(n):
        buffer.begin_episode()
        buffer.claim_row()
        buffer.claim_row()
        buffer.end_episode()
    with tempfile.TemporaryDirectory() as directory:
        path = buffer.save(os.path.join(directory, "episodes.fbuf"))
        for mmap in (False, True):
            median = statistics.median(
                seconds(lambda mmap=mmap: fe.FlexibleBuffer.load(path, mmap=mmap)) for _ in range(rounds)
            )
            print(f"load(mmap={mmap}) of {n:,} episodes: {median:.2f} s, {median / n * 1e6:.2f} us an episode")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temporary directory)")
    parser.add_argument("--cold", action="store_true", help="read from disk, not the page cache (root only)")
    parser.add_argument("--episodes", type=int, default=0, help="time opening a file of this many episodes")
    args = parser.parse_args()
    if args.episodes:
        many_episodes(args.episodes, args.rounds)
        return
    buffer = filled_buffer(args.gib)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        path, copy = os.path.join(directory, "run.fbuf"), os.path.join(directory, "copy.fbuf")
        runs: dict[str, list[float]] = {
            name: [] for name in ("save", "bare write", "cp", "cp + sync", "load", "bare read", "load(mmap=True)")
        }
        for _ in range(args.rounds):
            runs["save"].append(seconds(lambda: buffer.save(path)))
            runs["bare write"].append(seconds(lambda: bare_write([buffer.field("obs"), buffer.field("obs_")], copy)))
            os.unlink(copy)
            runs["cp"].append(seconds(lambda: subprocess.run(["cp", path, copy], check=True)))
            os.unlink(copy)
            runs["cp + sync"].append(
                seconds(lambda: subprocess.run(["sh", "-c", f'cp "{path}" "{copy}" && sync "{copy}"'], check=True))
            )
            os.unlink(copy)
            runs["load"].append(seconds(lambda: fe.FlexibleBuffer.load(path), args.cold))
            runs["bare read"].append(seconds(lambda: bare_read(path), args.cold))
            runs["load(mmap=True)"].append(seconds(lambda: fe.FlexibleBuffer.load(path, mmap=True), args.cold))
        size = os.path.getsize(path)
    print(
        f"buffer file: {size / 2**30:.2f} GiB, {len(buffer)} rows of 2 x 84x84x4 uint8 observations, "
        f"{args.rounds} rounds, medians, reads from {'disk' if args.cold else 'the page cache'}"
    )
    median = {name: statistics.median(times) for name, times in runs.items()}
    for name, value in median.items():
        print(f"  {name:<16} {value:7.3f} s  {size / value / 1e6:8.0f} MB/s")
    print(
        f"save / bare write: {median['save'] / median['bare write']:.2f}x   "
        f"save / (cp + sync): {median['save'] / median['cp + sync']:.2f}x   "
        f"save / cp: {median['save'] / median['cp']:.2f}x   load / bare read: {median['load'] / median['bare read']:.2f}x   "
        f"load(mmap=True): {median['load(mmap=True)'] * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
