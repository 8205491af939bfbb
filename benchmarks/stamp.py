"""What a written figure is stamped with: the commit of the code that ran and the machine it ran
on (`benchmarks/run.py` and `examples/figures.py` write both beside their results)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checkout's commit, marked when tracked files other than the docs differ from it (the
    docs are what the runs write: a results page rewritten by an earlier run is no change to the
    code that runs)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return head + (" (with uncommitted changes)" if changed else "")


def machine() -> str:
    """The processor, cores, memory and Python of this machine."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0
    return f"{platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"
