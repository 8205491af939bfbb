"""Run one benchmark script and write what it printed, with the machine, the date and the commit,
to ``docs/benchmarks/results/<script>[-<args>].md``: the pages the documentation shows (``make
bench`` runs every script through this).

Run: python benchmarks/run.py bench_log.py [its arguments...]
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path

from stamp import commit, machine  # beside this script

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "docs" / "benchmarks" / "results"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    script, args = sys.argv[1], sys.argv[2:]
    command = ["python", f"benchmarks/{script}", *args]
    started = datetime.datetime.now(datetime.timezone.utc)
    stamp = commit()  # the code that runs: taken before the run, while files may still change
    run = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, check=False)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    if run.returncode:
        return run.returncode
    name = Path(script).stem + "".join("-" + re.sub(r"[^A-Za-z0-9]+", "", a) for a in args if a.strip("-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    page = RESULTS / f"{name}.md"
    page.write_text(
        f"# `{' '.join(command[1:])}`\n\n"
        f"Written by `python benchmarks/run.py {' '.join([script, *args])}` on {started:%Y-%m-%d %H:%M} UTC, "
        f"commit {stamp}, on {machine()}.\n\n"
        f"```text\n{run.stdout.rstrip()}\n```\n"
    )
    print(f"wrote {page.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
