"""Run the learning examples over several seeds and write their results, with the spread over
seeds, the machine, the date and the commit, into docs/examples.md (``make figures``); and run
``make demo``'s command line (``flexibuff-envs record``, ``inspect`` and ``plot`` of its log) and
write what it printed and drew into docs/getting-started/cli.md.

Each example runs once per seed with its default arguments, in its own process; the numbers are
read from the line it prints, and seed 0's learning curves are drawn into docs/images/. Nothing
else in the pages is touched: what is written goes between their ``figures`` markers.

Run: python examples/figures.py [--seeds 0 1 2] [--part examples|cli|apex|all]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "benchmarks"))  # the stamp the benchmark pages carry

from stamp import commit, machine

PAGE = HERE.parent / "docs" / "examples.md"
CLI_PAGE = HERE.parent / "docs" / "getting-started" / "cli.md"
BEGIN, END = "<!-- figures: written by examples/figures.py -->", "<!-- end of figures -->"


@dataclass(frozen=True)
class Figure:
    """What one example reports: ``pattern``'s named groups, read from its output, as numbers."""

    example: str
    what: str  # the measure, in words
    pattern: str  # a regex with a group ``value``
    seeds: int = 3  # how many seeds (0, 1, ...) at least

    def read(self, output: str) -> float:
        found = re.search(self.pattern, output)
        if found is None:
            raise RuntimeError(f"{self.example}: no {self.what!r} in its output:\n{output}")
        return float(found["value"])


FIGURES = (
    Figure("reinforce_cartpole", "mean return of the last 50 episodes", r"last 50: (?P<value>[\d.]+)"),
    Figure("ppo_cartpole", "mean return at the end (150,000 steps)", r"final mean return (?P<value>[\d.]+)"),
    Figure("sb3_ppo_cartpole", "mean return of the last 20 episodes", r"of the last 20: (?P<value>[\d.]+)"),
    Figure("torchrl_dqn", "greedy return after training", r"greedy return [\d.]+ -> (?P<value>[\d.]+)"),
    Figure("dqn_tictactoe", "first mover's win rate against random moves (%)", r"first.*after (?P<value>[\d.]+)%"),
    Figure(
        "sb3_dqn_buffers",
        "SB3's DQN, SB3's own buffer: return after 12,000 steps",
        r"SB3's buffer (?P<value>[\d.]+)",
        5,
    ),
    Figure("sb3_dqn_buffers", "SB3's DQN, our buffer: return after 12,000 steps", r"ours (?P<value>[\d.]+)", 5),
    Figure(
        "dqn_per_cartpole",
        "mean return of the last 20 episodes (budget 60,000 steps)",
        r"mean return of the last 20: (?P<value>[\d.]+)",
    ),
)


#: Ape-X against one process: the two DQN examples side by side (``--part apex``)
APEX = (
    Figure(
        "dqn_per_cartpole",
        "one process: mean return of the last 20 episodes",
        r"mean return of the last 20: (?P<value>[\d.]+)",
    ),
    Figure(
        "dqn_per_cartpole",
        "one process: env steps to solve (the budget if not)",
        r"(?:solved at step |not solved in )(?P<value>\d+)",
    ),
    Figure(
        "apex_dqn_cartpole",
        "Ape-X: mean return of the last 20 episodes (budget 60,000 steps)",
        r"mean return of the last 20: (?P<value>[\d.]+)",
    ),
    Figure(
        "apex_dqn_cartpole",
        "Ape-X: env steps to solve (the budget if not)",
        r"(?:solved at step |not solved in )(?P<value>\d+)",
    ),
)

#: the examples that draw their learning curve; seed 0's goes to docs/images/<example>.png
PLOTTED = ("reinforce_cartpole", "ppo_cartpole", "dqn_tictactoe", "dqn_per_cartpole")


@functools.cache
def run(example: str, seed: int) -> tuple[str, float]:
    """What ``example`` printed for ``seed``, and the seconds it took (once per pair)."""
    seeds_flag = example in ("dqn_per_cartpole", "apex_dqn_cartpole")
    seed_args = ["--seeds", str(seed)] if seeds_flag else ["--seed", str(seed)]
    if example in PLOTTED and seed == 0:
        seed_args += ["--plot", str(PAGE.parent / "images" / f"{example}.png")]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(HERE / f"{example}.py"), *seed_args], capture_output=True, text=True, check=True
    )
    return done.stdout, time.perf_counter() - start


def write_between(page: Path, text: str, marker: str = "") -> None:
    """Put ``text`` between the first pair of ``figures`` markers of ``page`` (``marker``: the
    pair named so, ``<!-- figures apex: ... -->``)."""
    begin = BEGIN.replace("figures:", f"figures {marker}:") if marker else BEGIN
    head, _, rest = page.read_text().partition(begin)
    _, _, tail = rest.partition(END)
    page.write_text(f"{head}{begin}\n{text}\n{END}{tail}")
    print(f"wrote {page.relative_to(HERE.parent)}")


def cli_transcript(stamp: str, command: str = "python examples/figures.py --part cli") -> None:
    """``make demo``'s ``flexibuff-envs record`` (its default env, 100 episodes, seed 0), then
    ``inspect`` and ``plot`` of the log it wrote, run in a scratch directory; their output into
    docs/getting-started/cli.md and the plot into docs/images/connect_four_v3.png."""
    cli = Path(sys.executable).with_name("flexibuff-envs")
    image = PAGE.parent / "images" / "connect_four_v3.png"
    with tempfile.TemporaryDirectory() as scratch:

        def run_cli(*args: str) -> str:
            done = subprocess.run([str(cli), *args], cwd=scratch, capture_output=True, text=True, check=True)
            return done.stdout.replace(os.path.realpath(scratch) + os.sep, "").replace(scratch + os.sep, "").rstrip()

        recorded = run_cli("record")
        inspected = run_cli("inspect", "connect_four_v3.log")
        run_cli("plot", "connect_four_v3.log", "--out", str(image))
    write_between(
        CLI_PAGE,
        f"Written by `{command}` on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}, commit {stamp}, on {machine()}: "
        f"`flexibuff-envs record` (what `make demo` runs) prints\n\n```\n{recorded}\n```\n\n"
        f"and `flexibuff-envs inspect connect_four_v3.log` maps the log (`FlexibleBuffer.open`) and prints:"
        f"\n\n```\n{inspected}\n```",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--part", choices=("examples", "cli", "apex", "all"), default="all")
    args = parser.parse_args()
    stamp = commit()  # before the runs, which write the curves in docs/images
    if args.part in ("cli", "all"):
        cli_transcript(stamp, " ".join(["python examples/figures.py", *sys.argv[1:]]))
    if args.part == "cli":
        return
    command = " ".join(["python examples/figures.py", *sys.argv[1:]])
    when = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}, commit {stamp}, on {machine()}, torch on CPU"
    if args.part in ("apex", "all"):
        write_between(
            PAGE,
            "\n".join(
                [
                    (
                        f"Written by `{command}` on {when}. Each ran once per seed with its default arguments "
                        "(a budget of 60,000 env steps, stopping once the last 20 episodes average 475); "
                        "mean ± standard deviation over the seeds."
                    ),
                    "",
                    *table(APEX, args.seeds),
                ]
            ),
            marker="apex",
        )
    if args.part == "apex":
        return
    write_between(
        PAGE,
        "\n".join(
            [
                (
                    f"Written by `{command}` on {when}. Each example ran once per seed with its default "
                    "arguments (the SB3 comparison over five seeds); mean ± standard deviation over the seeds."
                ),
                "",
                *table(FIGURES, args.seeds),
            ]
        ),
    )


def table(figures: tuple[Figure, ...], given: list[int]) -> list[str]:
    """The Markdown table of ``figures``, each run over the seeds ``given`` (continued to its
    ``seeds``)."""
    rows = ["| example | measure | mean ± sd | per seed | time per run |", "|---|---|---|---|---|"]
    for figure in figures:
        seeds = list(given)
        while len(seeds) < figure.seeds:  # the seeds given, continued
            seeds.append(max(seeds) + 1)
        outputs, seconds = zip(*(run(figure.example, seed) for seed in seeds))
        values = [figure.read(output) for output in outputs]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{figure.example}: {figure.what}: {values} ({sum(seconds):.0f} s)")
        rows.append(
            f"| `{figure.example}.py` | {figure.what} | {statistics.mean(values):.1f} ± {spread:.1f} "
            f"| {', '.join(f'{seed}: {v:.1f}' for seed, v in zip(seeds, values))} | {statistics.mean(seconds):.0f} s |"
        )
    return rows


if __name__ == "__main__":
    main()
