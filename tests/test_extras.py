"""The suite runs without any one optional extra: tests that need it are skipped, never broken."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import of it raises ImportError, as when it is not installed
import pytest
raise SystemExit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"]))
"""


@pytest.mark.parametrize("missing", ["ray", "torch", "pettingzoo,mpe2", "matplotlib", "stable_baselines3",
                                     "tensordict,torchrl", "minari,h5py", "supersuit"])
def test_the_suite_collects_without_an_extra(missing: str) -> None:
    result = subprocess.run([sys.executable, "-c", BLOCKED, missing], capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "error" not in result.stdout.lower().splitlines()[-1]
