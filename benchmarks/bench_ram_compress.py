"""Buffers kept compressed in memory against raw ones, side by side in one run: stacked Atari
frames recorded with the same seeds and random actions into ``FlexibleBuffer(compress="auto")``
(each row a zstd frame in memory) and into a raw buffer; prints the observations' bytes a row in
memory and their ratio to the raw 28,224, the buffers' whole sizes, the recording time a step
(median over rounds) and ``sample_transitions(256)`` of obs and obs_, the first draw (cold) and
the median of the next ones (warm), from each. The compressed buffer is checked equal to the raw
one, episode by episode.

Envs: Pong and Breakout (``AtariPreprocessing``, a 4-frame stack: 28,224 bytes a step).

Run: python benchmarks/bench_ram_compress.py [--steps 5000] [--rounds 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from bench_log_compress import atari, sample_times

import flexibuff_envs as fe

RAW_ROW = 4 * 84 * 84


def record(game: str, compress: Any, steps: int, seed: int) -> tuple[fe.FlexibleBuffer, float]:
    """``steps`` random steps of ``game`` into a buffer of that many rows: it, and seconds a step."""
    env = atari(game)()
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=steps + 1, compress=compress)
    env = fe.record(env, buffer)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    return buffer, (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.steps:,} random steps a recording, seed {args.seed}; medians of {args.rounds} rounds")
    for game in ("Pong", "Breakout"):
        times: dict[str, list[float]] = {"zstd": [], "raw": []}
        buffers: dict[str, fe.FlexibleBuffer] = {}
        for _ in range(args.rounds):
            for label, compress in (("raw", None), ("zstd", "auto")):
                buffers[label], seconds = record(game, compress, args.steps, args.seed)
                times[label].append(seconds)
        packed, raw = buffers["zstd"], buffers["raw"]
        for mine, want in zip(packed.episodes(), raw.episodes(), strict=True):
            if not (np.array_equal(mine.obs, want.obs) and np.array_equal(mine.obs_, want.obs_)):
                raise SystemExit(f"{game}: the compressed buffer differs from the raw one")
        rows = len(packed)
        obs = packed.field("obs").nbytes / rows
        recording = statistics.median(times["zstd"]) / statistics.median(times["raw"])
        print(f"{game} (AtariPreprocessing, stack of 4), {rows:,} rows")
        print(f"  obs in memory: {obs:,.0f} B a row, 1/{RAW_ROW / obs:,.0f} of raw ({RAW_ROW:,})")
        print(
            f"  whole buffer: raw {raw.nbytes / 1e6:,.1f} MB, compressed {packed.nbytes / 1e6:,.1f} MB "
            "(final observations are kept raw, a slot an episode)"
        )
        print(
            f"  recording: raw {1e6 * statistics.median(times['raw']):,.0f} us a step, compressed "
            f"{1e6 * statistics.median(times['zstd']):,.0f} us; compressed / raw: {recording:.2f}x"
        )
        (raw_cold, raw_warm), (zstd_cold, zstd_warm) = sample_times(raw, 50), sample_times(packed, 50)
        print(
            f"  sample_transitions(256) obs+obs_: raw cold {raw_cold:.1f} ms warm {raw_warm:.1f} ms; "
            f"compressed cold {zstd_cold:.1f} ms warm {zstd_warm:.1f} ms; compressed / raw warm: "
            f"{zstd_warm / raw_warm:.2f}x"
        )


if __name__ == "__main__":
    main()
