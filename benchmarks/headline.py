"""Write the README's headline figures from the benchmark outputs `benchmarks/run.py` last wrote
(``docs/benchmarks/results/``): each figure is read out of the output that printed it, with that
run's date and commit, so the table never says what no run printed. ``make bench`` runs this last.

Run: python benchmarks/headline.py
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks" / "results"
README = ROOT / "README.md"
START, END = "<!-- headline figures: written by benchmarks/headline.py -->", "<!-- end of headline figures -->"


def find(pattern: str) -> Callable[[str], str]:
    """The first group of ``pattern``'s first match in an output."""

    def read(text: str) -> str:
        match = re.search(pattern, text)
        if match is None:
            raise SystemExit(f"headline.py: no {pattern!r} in the output; rerun the benchmark")
        return match.group(1)

    return read


def per_speedup(text: str) -> str:
    """How many times less a prioritized sample + update takes here than in cpprb's C++ buffer."""
    ours = float(find(r"flexibuff_envs prioritized\s+sample\s+[\d.]+\s+update\s+[\d.]+\s+total\s+([\d.]+)")(text))
    cpprb = float(
        find(r"cpprb PrioritizedReplayBuffer \(C\+\+\)\s+sample\s+[\d.]+\s+update\s+[\d.]+\s+total\s+([\d.]+)")(text)
    )
    return f"{cpprb / ours:.2f}x faster than cpprb's C++ ({ours:.0f} against {cpprb:.0f} us)"


#: (what, the output's page, what to read out of it, the command that printed it)
ROWS: list[tuple[str, str, Callable[[str], str], str]] = [
    (
        "recording 64 vector CartPoles, against the same loop with SB3's `ReplayBuffer`",
        "bench_vector.md",
        find(r"recorded / SB3 ReplayBuffer\.add each step: ([\d.]+x)"),
        "python benchmarks/bench_vector.py",
    ),
    (
        "`sample_transitions(256)`, a DQN's five fields, each observation stored once",
        "bench_sample-fields.md",
        lambda text: (
            find(r"flexibuff_envs / bare gather \+ torch, obs once: ([\d.]+x)")(text)
            + " a bare gather from the same arrays"
        ),
        "python benchmarks/bench_sample.py --fields",
    ),
    (
        "prioritized replay at 1M rows, sample + update of 256, exact weights",
        "bench_per.md",
        per_speedup,
        "python benchmarks/bench_per.py",
    ),
    (
        "recording with an episode log, CartPole with random actions (22-step episodes) / 500-step episodes",
        "bench_log-rounds-5.md",
        lambda text: (
            find(r"CartPole-v1\s+RAM only\s+[\d.]+ us\s+with log\s+[\d.]+ us\s+([\d.]+x)")(text)
            + " / "
            + find(r"a balancing policy\s+RAM only\s+[\d.]+ us\s+with log\s+[\d.]+ us\s+([\d.]+x)")(text)
            + " the same loop in RAM only"
        ),
        "python benchmarks/bench_log.py --rounds 5",
    ),
    (
        'a buffer file of Atari frames (Pong, raw 210x160x3), `compress="auto"` (zstd)',
        "bench_compress.md",
        lambda text: (
            find(r"raw frames \(210x160x3\)\s+raw[^\n]*\n\s+zstd\s+([\d,]+)")(text)
            + " bytes a step, "
            + find(r"raw frames \(210x160x3\)\s+raw[^\n]*\n\s+zstd\s+[\d,]+\s+([\d,]+x)")(text)
            + " smaller than raw, bit-exact"
        ),
        "python benchmarks/bench_compress.py",
    ),
    (
        "an episode log of Atari frames (Pong, `AtariPreprocessing`, stack of 4), compressed by default",
        "bench_log_compress.md",
        lambda text: (
            find(r"Pong \(Atari[^\n]*\n\s+log on disk: raw [\d,]+ B a step, zstd ([\d,]+) B a step")(text)
            + " bytes a step on disk (1/"
            + find(r"Pong \(Atari(?:[^\n]*\n){2}\s+compressed / raw [^:]*: 1/([\d,]+)")(text)
            + " of raw), recorded in "
            + find(r"Pong \(Atari(?:[^\n]*\n){3}[^\n]*zstd / raw: ([\d.]+x)")(text)
            + " a raw log's time"
        ),
        "python benchmarks/bench_log_compress.py",
    ),
    (
        'a replay buffer of Atari frames (Pong, stack of 4) kept compressed in memory, `compress="auto"`',
        "bench_ram_compress.md",
        lambda text: (
            find(r"Pong \(Atari[^\n]*\n\s+obs in memory: ([\d,]+) B a row")(text)
            + " bytes a row (1/"
            + find(r"Pong \(Atari[^\n]*\n\s+obs in memory: [\d,]+ B a row, 1/([\d,]+)")(text)
            + " of raw), recorded in "
            + find(r"Pong \(Atari(?:[^\n]*\n){3}[^\n]*compressed / raw: ([\d.]+x)")(text)
            + " a raw buffer's time; sample_transitions(256) in "
            + find(r"Pong \(Atari(?:[^\n]*\n){4}[^\n]*compressed / raw warm: ([\d.]+x)")(text)
            + " its time"
        ),
        "python benchmarks/bench_ram_compress.py",
    ),
    (
        "a 100-million-step recording streamed to a log by the CLI",
        "bench_log_memory.md",
        lambda text: (
            "resident memory "
            + find(r"resident ([\d.]+ -> [\d.]+ MiB \([\d.]+x\))")(text)
            + " from the first million rows to the last"
        ),
        "python benchmarks/bench_log_memory.py",
    ),
    (
        "SIGKILL at random moments of logged recordings (Gymnasium, vector, PettingZoo parallel and AEC, Atari)",
        "bench_kills-kills-10.md",
        lambda text: (
            "ended episodes lost: "
            + find(r"\n  all\s+\d+\s+\d+\s+\d+\s+(\d+)")(text)
            + " of "
            + find(r"\n  all\s+\d+\s+(\d+)")(text)
            + " in "
            + find(r"\n  all\s+(\d+)")(text)
            + " kills; episodes read back wrong: "
            + find(r"\n  all\s+\d+\s+\d+\s+\d+\s+\d+\s+(\d+)")(text)
        ),
        "python benchmarks/bench_kills.py --kills 10",
    ),
]


def stamp(text: str) -> str:
    """The run's date and commit, from the line `benchmarks/run.py` writes under the title."""
    match = re.search(r"on (\d{4}-\d\d-\d\d) [\d:]+ UTC, commit (\w+)", text)
    return "" if match is None else f"{match.group(1)}, {match.group(2)}"


def table() -> str:
    lines = ["| what | result (run of) | command |", "|---|---|---|"]
    for what, page, read, command in ROWS:
        text = (RESULTS / page).read_text()
        link = f"[{stamp(text)}](docs/benchmarks/results/{page})"
        lines.append(f"| {what} | {read(text)} ({link}) | `{command}` |")
    return "\n".join(lines)


def main() -> int:
    readme = README.read_text()
    if START not in readme or END not in readme:
        print(f"headline.py: README.md lacks the markers {START} ... {END}", file=sys.stderr)
        return 1
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
