"""What a written figure is stamped with: the commit of the code that ran and the machine it ran
on (`benchmarks/run.py` and `examples/figures.py` write both beside their results)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checkout's commit, marked when tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    """The processor, cores, memory and Python of this machine."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if hasattr(os, "sysconf") else 0
    return f"{platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"
