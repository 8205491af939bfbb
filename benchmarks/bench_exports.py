"""Exporting a recording to a flashbax vault and to Parquet, and reading them back, against the
bare library call writing (or reading) the same arrays.

A log of mpe2's simple_spread (3 agents, global state; fixed cyclic actions) of ``--steps``
steps is recorded. Then, in interleaved rounds (medians of ``--rounds``):

- ``to_vault(log)`` against TensorStore writing the same leaves (already laid out, time first)
  with the same spec, and ``from_vault`` against TensorStore reading them back;
- ``to_parquet(log)`` against ``pyarrow.parquet.write_table`` of the same columns (already
  built), and ``from_parquet`` against ``pyarrow.parquet.read_table`` of them.

The ratios say what our own work costs (reading the log episode by episode, laying fields out,
filling a buffer with G computed) over the library's.

Then frames, against ``cp``: a log of pistonball (3 pistons: each one's 457x120x3 view, the
whole picture as state) of about ``--frames-mb`` MB is exported with each vault compression and
to Parquet, and the default vault and the Parquet dataset are read back; each against ``cp -r``
of the log itself (the same bytes, from the page cache, as the exports read them). Medians of
``--rounds``; "speed" is cp's time over ours (the goal: 0.5 or more).

Prints the machine, date, commit.
Run: python benchmarks/bench_exports.py [--steps 200000] [--frames-mb 1024] [--rounds 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import tensorstore as ts

import flexibuff_envs as fe
from flexibuff_envs.integrations import parquet, vault, vault_format
from flexibuff_envs.integrations.tables import blocks


def record(directory: Path, steps: int) -> None:
    from mpe2 import simple_spread_v3

    env = fe.record(simple_spread_v3.parallel_env(max_cycles=25), num_steps=min(steps, 100_000), log=directory)
    env.reset(seed=0)
    for t in range(steps):
        env.step({agent: (t + i) % 5 for i, agent in enumerate(env.agents)})
        if not env.agents:
            env.reset()
    env.close()


def record_frames(directory: Path, megabytes: int) -> None:
    from pettingzoo.butterfly import pistonball_v6

    env = fe.record(
        pistonball_v6.parallel_env(n_pistons=3, continuous=False, max_cycles=125), num_steps=2_000, log=directory
    )
    env.reset(seed=0)
    t = 0
    while t % 100 or du(directory) < megabytes * 1e6:  # whole episodes of pistonball are long; check now and then
        env.step({agent: (t + i) % 3 for i, agent in enumerate(env.agents)})
        t += 1
        if not env.agents:
            env.reset()
    env.close()


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Bare:
    """The library calls alone on the same data, laid out once: TensorStore writing and reading
    the vault's leaves with the same spec, pyarrow writing and reading the same tables."""

    def __init__(self, buffer: fe.FlexibleBuffer) -> None:
        spec = buffer.spec
        ((self.lengths, arrays),) = list(blocks(buffer, 10**12, 1 << 62))
        self.leaves = {
            vault_format.leaf_of(name, spec): vault._laid_out(name, values, spec) for name, values in arrays.items()
        }
        self.columns = parquet._tables((self.lengths, arrays), spec, 0)

    def write_vault(self, base: Path) -> None:
        os.makedirs(base)
        stores = {
            leaf: ts.open(
                {
                    **vault_format.store_spec(str(base), leaf),
                    "metadata": {
                        "compressor": vault_format.COMPRESSION["lz4"],
                        "chunks": [1, max(1, vault_format.CHUNK_BYTES // values[:1].nbytes), *values.shape[1:]],
                    },
                },
                shape=(1, vault_format.TIME_AXIS, *values.shape[1:]),
                dtype=values.dtype.name,
                create=True,
            ).result()
            for leaf, values in self.leaves.items()
        }
        for write in [stores[leaf][0, : len(values)].write(values) for leaf, values in self.leaves.items()]:
            write.result()

    def read_vault(self, base: Path) -> None:
        for leaf in self.leaves:
            ts.open(vault_format.store_spec(str(base), leaf)).result()[0, : int(self.lengths.sum())].read().result()

    def write_parquet(self, base: Path) -> None:
        for table, cols in self.columns.items():
            os.makedirs(base / table)
            pq.write_table(pa.table(cols), base / table / "part-00000.parquet", **parquet.WRITE_OPTIONS)

    def read_parquet(self, base: Path) -> None:
        for table in self.columns:
            pq.read_table(base / table)


def frames(root: Path, megabytes: int, rounds: int) -> None:
    root = root / "frames"
    log = root / "pistonball.log"
    record_frames(log, megabytes)
    bare = Bare(fe.FlexibleBuffer.open(log))
    times: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    for k in range(rounds):

        def run(key: str, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
            times.setdefault(key, []).append(timed(fn, *args, **kwargs))

        run("cp -r", subprocess.run, ["cp", "-r", str(log), str(root / f"copy{k}")], check=True)
        for compression in vault_format.COMPRESSION:
            run(
                f"to_vault ({compression})",
                vault.to_vault,
                log,
                root / f"v{k}",
                vault_uid=compression,
                compression=compression,
            )
            sizes[f"to_vault ({compression})"] = du(root / f"v{k}" / "recording.vlt" / compression)
        run("  TensorStore alone", bare.write_vault, root / f"bv{k}")
        run("from_vault (lz4)", vault.from_vault, root / f"v{k}" / "recording.vlt" / "lz4")
        run("  TensorStore read", bare.read_vault, root / f"bv{k}")
        run("to_parquet", parquet.to_parquet, log, root / f"p{k}")
        sizes["to_parquet"] = du(root / f"p{k}")
        run("  pyarrow alone", bare.write_parquet, root / f"bp{k}")
        run("from_parquet", parquet.from_parquet, root / f"p{k}")
        run("  pyarrow read", bare.read_parquet, root / f"bp{k}")
        for path in (f"copy{k}", f"v{k}", f"bv{k}", f"p{k}", f"bp{k}"):
            shutil.rmtree(root / path)
    med = {key: statistics.median(value) for key, value in times.items()}
    print(
        f"frames: pistonball x3 pistons, {int(bare.lengths.sum()):,} steps in {len(bare.lengths)} episodes, "
        f"a log of {du(log) / 1e6:,.0f} MB; medians of {rounds} rounds; speed: cp -r's time over each one's"
    )
    for key, value in med.items():
        size = f"   {sizes[key] / 1e6:8,.1f} MB written" if key in sizes else ""
        print(f"  {key:<20} {value * 1e3:8,.0f} ms   speed {med['cp -r'] / value:5.2f}{size}")


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames-mb", type=int, default=1024, help="the frames log's size (0: skip it)")
    parser.add_argument("--skip-spread", action="store_true", help="only the frames against cp")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    print(
        f"exports: {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}), "
        f"{datetime.date.today()}, commit {commit}"
    )
    root = Path(tempfile.mkdtemp(prefix="bench_exports."))
    try:
        if not args.skip_spread:
            spread(root, args.steps, args.rounds)
        if args.frames_mb:
            frames(root, args.frames_mb, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def spread(root: Path, steps: int, rounds: int) -> None:
    log = root / "spread.log"
    record(log, steps)
    bare = Bare(fe.FlexibleBuffer.open(log))
    times: dict[str, list[float]] = {
        key: []
        for key in (
            "to_vault",
            "tensorstore",
            "from_vault",
            "tensorstore read",
            "to_parquet",
            "pyarrow",
            "from_parquet",
            "pyarrow read",
        )
    }
    for k in range(rounds):
        ours, theirs = root / f"v{k}", root / f"bv{k}"
        times["to_vault"].append(timed(vault.to_vault, log, ours, vault_uid="u"))
        times["tensorstore"].append(timed(bare.write_vault, theirs))
        times["from_vault"].append(timed(vault.from_vault, ours / "recording.vlt" / "u"))
        times["tensorstore read"].append(timed(bare.read_vault, theirs))
        ours, theirs = root / f"p{k}", root / f"bp{k}"
        times["to_parquet"].append(timed(parquet.to_parquet, log, ours))
        times["pyarrow"].append(timed(bare.write_parquet, theirs))
        times["from_parquet"].append(timed(parquet.from_parquet, ours))
        times["pyarrow read"].append(timed(bare.read_parquet, theirs))
    med = {key: statistics.median(value) for key, value in times.items()}
    print(
        f"simple_spread x3 agents, {int(bare.lengths.sum()):,} steps in {len(bare.lengths):,} episodes, "
        f"medians of {rounds} rounds"
    )
    for ours, theirs in (
        ("to_vault", "tensorstore"),
        ("from_vault", "tensorstore read"),
        ("to_parquet", "pyarrow"),
        ("from_parquet", "pyarrow read"),
    ):
        print(
            f"  {ours:<13} {med[ours] * 1e3:8.1f} ms   {theirs:<17} {med[theirs] * 1e3:8.1f} ms   "
            f"{med[ours] / med[theirs]:5.2f}x"
        )
    sizes = {
        compression: du(Path(vault.to_vault(log, root / "sizes", vault_uid=compression, compression=compression)))
        for compression in vault_format.COMPRESSION
    }
    print("  vault sizes: " + ", ".join(f"{key} {value / 1e6:,.1f} MB" for key, value in sizes.items()))


if __name__ == "__main__":
    main()
