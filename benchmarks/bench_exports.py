"""Exporting a recording to a flashbax vault and to Parquet, and reading them back, against the
bare library call writing (or reading) the same arrays.

A log of mpe2's simple_spread (3 agents, global state; fixed cyclic actions) of ``--steps``
steps is recorded. Then, in interleaved rounds (medians of ``--rounds``):

- ``to_vault(log)`` against TensorStore writing the same leaves (already laid out, time first)
  with the spec flashbax uses, and ``from_vault`` against TensorStore reading them back;
- ``to_parquet(log)`` against ``pyarrow.parquet.write_table`` of the same columns (already
  built), and ``from_parquet`` against ``pyarrow.parquet.read_table`` of them.

The ratios say what our own work costs (reading the log episode by episode, laying fields out,
filling a buffer with G computed) over the library's. Prints the machine, date, commit.
Run: python benchmarks/bench_exports.py
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
from flexibuff_envs.integrations import parquet, vault
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


def timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_exports."))
    try:
        log = root / "spread.log"
        record(log, args.steps)
        buffer = fe.FlexibleBuffer.open(log)
        spec = buffer.spec
        (lengths, arrays), = list(blocks(buffer, 10**12))  # the same data, laid out once for the baselines
        leaves = {vault._leaf_of(name, spec): vault._laid_out(name, values, spec) for name, values in arrays.items()}
        columns = parquet._tables((lengths, arrays), spec, 0)

        def bare_vault(base: Path) -> None:
            os.makedirs(base)
            stores = {leaf: ts.open({**vault._store_spec(str(base), leaf),
                                     "metadata": {"compressor": {"id": "gzip", "level": 5}}},
                                    shape=(1, vault.TIME_AXIS, *values.shape[1:]), dtype=values.dtype.name,
                                    create=True).result() for leaf, values in leaves.items()}
            for write in [stores[leaf][0, :len(values)].write(values) for leaf, values in leaves.items()]:
                write.result()

        def bare_vault_read(base: Path) -> None:
            for leaf in leaves:
                ts.open(vault._store_spec(str(base), leaf)).result()[0, :int(lengths.sum())].read().result()

        def bare_parquet(base: Path) -> None:
            for table, cols in columns.items():
                os.makedirs(base / table)
                pq.write_table(pa.table(cols), base / table / "part-00000.parquet")

        def bare_parquet_read(base: Path) -> None:
            for table in columns:
                pq.read_table(base / table)

        times: dict[str, list[float]] = {key: [] for key in
                                         ("to_vault", "tensorstore", "from_vault", "tensorstore read",
                                          "to_parquet", "pyarrow", "from_parquet", "pyarrow read")}
        for k in range(args.rounds):
            ours, bare = root / f"v{k}", root / f"bv{k}"
            times["to_vault"].append(timed(vault.to_vault, log, ours, vault_uid="u"))
            times["tensorstore"].append(timed(bare_vault, bare))
            times["from_vault"].append(timed(vault.from_vault, ours / "recording.vlt" / "u"))
            times["tensorstore read"].append(timed(bare_vault_read, bare))
            ours, bare = root / f"p{k}", root / f"bp{k}"
            times["to_parquet"].append(timed(parquet.to_parquet, log, ours))
            times["pyarrow"].append(timed(bare_parquet, bare))
            times["from_parquet"].append(timed(parquet.from_parquet, ours))
            times["pyarrow read"].append(timed(bare_parquet_read, bare))
        med = {key: statistics.median(value) for key, value in times.items()}
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        print(f"exports: {platform.node()} ({os.cpu_count()} cores, {platform.python_version()}), "
              f"{datetime.date.today()}, commit {commit}; simple_spread x3 agents, {int(lengths.sum()):,} steps in "
              f"{len(lengths):,} episodes, medians of {args.rounds} rounds")
        for ours, bare in (("to_vault", "tensorstore"), ("from_vault", "tensorstore read"),
                           ("to_parquet", "pyarrow"), ("from_parquet", "pyarrow read")):
            print(f"  {ours:<13} {med[ours] * 1e3:8.1f} ms   {bare:<17} {med[bare] * 1e3:8.1f} ms   "
                  f"{med[ours] / med[bare]:5.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
