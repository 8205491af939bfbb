"""Examples are smoke-run with tiny step counts: they must keep working as the package changes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_ppo_cartpole_runs_a_few_rollouts_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    ppo = load("ppo_cartpole")
    png = tmp_path / "curve.png"
    monkeypatch.setattr(sys, "argv", ["ppo_cartpole.py", "--total-timesteps", "2048", "--num-steps", "64",
                                      "--plot", str(png)])
    ppo.main()
    assert "2048 steps in" in capsys.readouterr().out
    assert png.stat().st_size > 1000


def test_ppo_args_help_comes_from_the_dataclass_comments(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ppo = load("ppo_cartpole")
    monkeypatch.setattr(sys, "argv", ["ppo_cartpole.py", "--help"])
    with pytest.raises(SystemExit):
        ppo.parse_args()
    assert "steps per sub-env per rollout" in capsys.readouterr().out
