"""Compressed episode logs against raw ones, side by side in one run: real envs recorded with the
same seeds and random actions to a log with ``compress="auto"`` (zstd frames, one a row) and with
``compress=None``; prints the bytes a step each log takes on disk and the ratio to the raw
observation bytes, the recording time a step (median over rounds, the log on in both), and
``sample_transitions(256)`` of obs and obs_ from the compressed log opened mapped against the
same sample from the uncompressed recording in RAM: the first sample after opening (cold) and
the median of the next ones (warm). Every compressed log is checked equal to the raw one,
episode by episode.

Envs: Pong and Breakout (``AtariPreprocessing``, a 4-frame stack: 28,224 bytes a step), and
pistonball (20 agents, 457x120x3 each and a 560x880x3 state; its raw log is not written: its
size is the compressed log's rows times the bytes of a raw row).

Run: python benchmarks/bench_log_compress.py [--steps 5000] [--rounds 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe
from flexibuff_envs import log
from flexibuff_envs.log.read import state_of


def atari(game: str) -> Callable[[], gym.Env]:
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    return lambda: FrameStackObservation(AtariPreprocessing(gym.make(f"ALE/{game}-v5", frameskip=1)), 4)


def record(make: Callable[[], Any], directory: str, compress: Any, steps: int, seed: int) -> float:
    """``steps`` random steps of ``make()`` logged to ``directory``: seconds a step."""
    env = make()
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=min(steps + 1, 4000))
    buffer.log_to(directory, compress=compress)
    env = fe.record(env, buffer)
    parallel = hasattr(env, "possible_agents")
    env.reset(seed=seed)
    if parallel:
        for k, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(seed + k)
    else:
        env.action_space.seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        if parallel:
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
            if not env.agents:
                env.reset()
        elif any(env.step(env.action_space.sample())[2:4]):
            env.reset()
    buffer.close_log()
    return (time.perf_counter() - start) / steps


def sample_times(buffer: fe.FlexibleBuffer, draws: int) -> tuple[float, float]:
    """The first ``sample_transitions(256)`` of obs and obs_, and the median of ``draws`` more (ms)."""
    fields = ("obs", "obs_")
    start = time.perf_counter()
    buffer.sample_transitions(256, fields=fields)
    cold = time.perf_counter() - start
    warm = []
    for _ in range(draws):
        start = time.perf_counter()
        buffer.sample_transitions(256, fields=fields)
        warm.append(time.perf_counter() - start)
    return 1e3 * cold, 1e3 * statistics.median(warm)


def raw_bytes(directory: str) -> int:
    """Bytes the log ``directory`` would take with every column raw."""
    state = state_of(directory)
    return sum(state.commit.count(c) * c.row_bytes for c in state.files) + (state.commit.number + 1) * 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.steps:,} random steps a recording, seed {args.seed}; medians of {args.rounds} rounds")
    root = tempfile.mkdtemp()
    try:
        for game in ("Pong", "Breakout"):
            times: dict[str, list[float]] = {"zstd": [], "raw": []}
            for _ in range(args.rounds):
                for label, compress in (("raw", None), ("zstd", "auto")):
                    shutil.rmtree(os.path.join(root, label), ignore_errors=True)
                    seconds = record(atari(game), os.path.join(root, label), compress, args.steps, args.seed)
                    times[label].append(seconds)
            packed, raw = (fe.FlexibleBuffer.open(os.path.join(root, label)) for label in ("zstd", "raw"))
            for mine, want in zip(packed.episodes(), raw.episodes(), strict=True):
                if not (np.array_equal(mine.obs, want.obs) and np.array_equal(mine.obs_, want.obs_)):
                    raise SystemExit(f"{game}: the compressed log differs from the raw one")
            sizes = {label: log.report(os.path.join(root, label)).nbytes for label in ("zstd", "raw")}
            rows = len(packed)
            overhead = statistics.median(times["zstd"]) / statistics.median(times["raw"])
            print(f"{game} (AtariPreprocessing, stack of 4), {rows:,} rows")
            print(f"  log on disk: raw {sizes['raw'] / rows:,.0f} B a step, zstd {sizes['zstd'] / rows:,.0f} B a step")
            print(f"  compressed / raw observation bytes (28,224 a step): 1/{28224 * rows / sizes['zstd']:,.0f}")
            print(
                f"  recording, log on: raw {1e6 * statistics.median(times['raw']):,.0f} us a step, zstd "
                f"{1e6 * statistics.median(times['zstd']):,.0f} us; zstd / raw: {overhead:.2f}x"
            )
            ram = fe.FlexibleBuffer.open(os.path.join(root, "raw"), mmap=False)
            mapped = fe.FlexibleBuffer.open(os.path.join(root, "zstd"))
            (ram_cold, ram_warm), (zstd_cold, zstd_warm) = sample_times(ram, 50), sample_times(mapped, 50)
            print(
                f"  sample_transitions(256) obs+obs_: RAM raw cold {ram_cold:.1f} ms warm {ram_warm:.1f} ms; "
                f"zstd log cold {zstd_cold:.1f} ms warm {zstd_warm:.1f} ms; zstd / RAM warm: {zstd_warm / ram_warm:.2f}x"
            )
        from pettingzoo.butterfly import pistonball_v6

        directory = os.path.join(root, "pistonball")
        seconds = record(pistonball_v6.parallel_env, directory, "auto", min(args.steps, 500), args.seed)
        stored, raw = log.report(directory).nbytes, raw_bytes(directory)
        rows = log.report(directory).rows
        print(f"pistonball (20 agents, image obs and state), {rows:,} rows, {1e3 * seconds:.1f} ms a step")
        print(
            f"  log on disk: zstd {stored / rows:,.0f} B a step, raw would be {raw / rows:,.0f}; 1/{raw / stored:,.0f}"
        )
        print(
            f"  100 episodes of 125 steps: {stored / rows * 12_500 / 1e6:,.0f} MB (raw {raw / rows * 12_500 / 1e9:,.0f} GB)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
