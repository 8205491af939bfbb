"""Every Python snippet of the README and the docs runs as pasted: the blocks of a page one after
the other in a fresh interpreter (as a reader pastes them into one session), in an empty
directory, with the package and its test extras installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: a fenced Python block
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _snippets(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


@pytest.mark.parametrize("page", [p for p in PAGES if _snippets(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_snippet_of_a_page_runs_as_pasted(page: Path, tmp_path: Path) -> None:
    code = "\n\n".join(_snippets(page))
    env = {**os.environ, "MPLBACKEND": "Agg", "MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert result.returncode == 0, f"{page.relative_to(ROOT)}:\n{result.stderr[-3000:]}"
