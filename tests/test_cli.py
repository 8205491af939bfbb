"""The command line, run in-process and as the installed console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flexibuff_envs as fe
from flexibuff_envs.cli import main


def test_record_default_env_prints_a_report_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cartpole.fbuf"
    assert main(["record", "--episodes", "3", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "recorded CartPole-v1: 3 episodes" in report and str(out) in report
    loaded = fe.FlexibleBuffer.load(out)
    assert loaded.n_episodes == 3
    assert f"{len(loaded)} steps" in report


def test_record_with_masks_uses_only_legal_actions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "Taxi-v4", "--episodes", "1", "--capacity", "500"]) == 0
    assert "masks yes" in capsys.readouterr().out


def test_unknown_env_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "NoSuchEnv-v0", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flexibuff-envs:") and "Traceback" not in err


def test_console_script_and_module_entry_point() -> None:
    script = shutil.which("flexibuff-envs", path=str(Path(sys.executable).parent))
    assert script is not None
    result = subprocess.run([script, "record", "--episodes", "2"], capture_output=True, text=True, check=True)
    assert "2 episodes" in result.stdout
    result = subprocess.run([sys.executable, "-m", "flexibuff_envs", "record", "--episodes", "1"],
                            capture_output=True, text=True, check=True)
    assert "1 episodes" in result.stdout
