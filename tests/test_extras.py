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


@pytest.mark.parametrize(
    "missing",
    [
        "ray",
        "torch",
        "pettingzoo,mpe2",
        "matplotlib",
        "stable_baselines3",
        "tensordict,torchrl",
        "minari,h5py",
        "supersuit",
        "tensorstore,flashbax,jax",
        "pyarrow,polars,datasets",
    ],
)
def test_the_suite_collects_without_an_extra(missing: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED, missing], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "error" not in result.stdout.lower().splitlines()[-1]


@pytest.mark.parametrize(
    ("module", "missing", "extra"), [("vault", "tensorstore", "vault"), ("parquet", "pyarrow", "parquet")]
)
def test_an_export_without_its_library_names_the_extra_to_install(module: str, missing: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "import flexibuff_envs as fe\n"
        "try:\n"
        f"    import flexibuff_envs.integrations.{module}\n"
        "except fe.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert f"pip install 'flexibuff_envs[{extra}]'" in result.stdout, result.stderr[-2000:]
