"""Examples are smoke-run with tiny step counts: they must keep working as the package changes."""

from __future__ import annotations

import importlib.util
import os
import re
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


def test_ppo_cartpole_runs_a_few_rollouts_and_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    ppo = load("ppo_cartpole")
    png = tmp_path / "curve.png"
    monkeypatch.setattr(
        sys, "argv", ["ppo_cartpole.py", "--total-timesteps", "2048", "--num-steps", "64", "--plot", str(png)]
    )
    ppo.main()
    assert "2048 steps in" in capsys.readouterr().out
    assert png.stat().st_size > 1000


def test_ppo_args_help_comes_from_the_dataclass_comments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ppo = load("ppo_cartpole")
    monkeypatch.setattr(sys, "argv", ["ppo_cartpole.py", "--help"])
    with pytest.raises(SystemExit):
        ppo.parse_args()
    assert "steps per sub-env per rollout" in capsys.readouterr().out


def test_connect_four_masks_prints_a_batch_and_a_game(capsys: pytest.CaptureFixture[str]) -> None:
    load("connect_four_masks").main(["--games", "5", "--batch-size", "3"])
    out = capsys.readouterr().out
    assert "recorded 5 games" in out and "masks True" in out
    assert "discrete_actions     (2, 3, 1)" in out and "legal columns" in out and "player_1: [" in out


def test_reinforce_cartpole_learns_from_recorded_returns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    png = tmp_path / "reinforce.png"
    load("reinforce_cartpole").main(["--episodes", "16", "--batch-episodes", "4", "--plot", str(png)])
    assert "16 episodes in" in capsys.readouterr().out
    assert png.stat().st_size > 1000


def test_dqn_tictactoe_reports_win_rates_before_and_after(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    png = tmp_path / "dqn.png"
    load("dqn_tictactoe").main(
        ["--episodes", "40", "--eval-games", "4", "--curve-games", "2", "--batch-size", "16", "--plot", str(png)]
    )
    out = capsys.readouterr().out
    assert "40 games in" in out and "moving first   before" in out and "after" in out
    assert png.stat().st_size > 1000


def test_ray_collect_collects_and_trains_on_two_workers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the workers import the example's actor by its module name: let the Ray it starts find it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), *sys.path]))
    load("ray_collect").main(["--steps", "2000", "--chunks", "3", "--chunk-steps", "200", "--batch-size", "64"])
    out = capsys.readouterr().out
    assert "collected 2,000 steps (80 episodes)" in out and "on 2 workers" in out
    assert "trained on 3 chunks" in out and "whole episodes" in out


def test_apex_dqn_cartpole_trains_from_a_sharded_replay(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), *sys.path]))
    load("apex_dqn_cartpole").main(["--seeds", "0", "--steps", "1500", "--learning-starts", "300"])
    out = capsys.readouterr().out
    assert "seed 0: not solved in 1500 steps" in out and "mean return of the last 20" in out
    ratio = float(out.split("; ")[-1].split(" rows sampled")[0])
    assert 20 < ratio < 70  # the limiter held about 64 sampled rows per inserted row


def test_sb3_ppo_cartpole_records_what_sb3_trains_on(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    load("sb3_ppo_cartpole").main(["--timesteps", "512"])
    out = capsys.readouterr().out
    assert "512 SB3 steps in" in out and "512 recorded in" in out and "obs (256, 4)" in out


def test_sb3_dqn_buffers_trains_sb3_s_dqn_on_either_buffer(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    load("sb3_dqn_buffers").main(["--steps", "1300"])
    assert re.fullmatch(
        r"seed 0, 1300 steps: SB3's buffer [\d.]+, ours [\d.]+ \(mean return, 10 episodes\)\n", capsys.readouterr().out
    )


def test_torchrl_dqn_learns_from_tensordict_batches(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchrl")
    load("torchrl_dqn").main(["--steps", "500", "--updates", "20"])
    assert "20 DQNLoss updates on TensorDict batches" in capsys.readouterr().out


def test_minari_roundtrip_writes_and_reads_a_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("minari")
    pytest.importorskip("h5py")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    load("minari_roundtrip").main(["--episodes", "5"])
    out = capsys.readouterr().out
    assert "5 episodes" in out and "in 5 whole episodes" in out


def test_supersuit_spread_sb3_records_every_agent(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ("torch", "stable_baselines3", "supersuit", "mpe2"):
        pytest.importorskip(extra)
    load("supersuit_spread_sb3").main(["--timesteps", "1536"])
    out = capsys.readouterr().out
    assert "1536 SB3 steps (6 agent lanes)" in out and "1536 recorded" in out and "[25] steps" in out


def test_dqn_per_cartpole_trains_two_seeds_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    png = tmp_path / "dqn_per.png"
    load("dqn_per_cartpole").main(
        ["--seeds", "0", "1", "--steps", "600", "--learning-starts", "200", "--plot", str(png)]
    )
    out = capsys.readouterr().out
    assert "seed 0: not solved in 600 steps" in out and "seed 1:" in out and "mean return of the last 20" in out
    assert png.stat().st_size > 1000


def test_og_marl_vault_bc_reads_the_vault_without_jax_and_clones(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ("torch", "tensorstore", "mpe2"):
        pytest.importorskip(extra)
    load("og_marl_vault_bc").main(["--episodes", "8", "--updates", "20", "--evaluate", "2", "--seeds", "0"])
    out = capsys.readouterr().out
    assert "vault simple_spread.vlt/Scripted: 200 steps of 3 agents in 8 episodes" in out
    assert "behaviour clone" in out and "random" in out


def test_minari_agents_writes_one_dataset_per_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ("minari", "h5py", "mpe2"):
        pytest.importorskip(extra)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    load("minari_agents").main(["--episodes", "2"])
    out = capsys.readouterr().out
    assert all(f"wrote simple_spread/random/agent_{i}-v0: 2 episodes, 50 steps" in out for i in range(3))
    assert "a critic's input (obs, state, joint action) (25, 75)" in out


def test_parquet_tables_reads_with_pandas_and_datasets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ("pyarrow", "pandas", "datasets", "pettingzoo"):
        pytest.importorskip(extra)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    load("parquet_tables").main(["--episodes", "1"])
    out = capsys.readouterr().out
    assert "pandas: " in out and "of 4 agents in 1 episodes" in out
    assert "datasets: " in out and "obs (64, 135) torch.float32" in out


def test_the_readme_quickstart_is_examples_quickstart_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's quickstart is `examples/quickstart.py` word for word (`make package` runs
    that file from an installed wheel), and it runs: its log holds what its buffer ended."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (EXAMPLES / "quickstart.py").read_text()
    monkeypatch.chdir(tmp_path)
    load("quickstart")
    rows, episodes, logged = map(int, re.findall(r"\d+", capsys.readouterr().out))
    assert rows == 10_000 and episodes == logged > 100 and (tmp_path / "cartpole.fbuf").stat().st_size > 0


def test_the_readme_figures_are_what_the_benchmark_outputs_say() -> None:
    """`benchmarks/headline.py` reads each headline figure out of its benchmark's latest output:
    every pattern still finds its figure there, and the README holds exactly that table (a
    figure edited by hand, or an output rewritten without the table, fails here)."""
    spec = importlib.util.spec_from_file_location("headline", EXAMPLES.parent / "benchmarks" / "headline.py")
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    table = headline.table()
    assert len(table.splitlines()) == 2 + len(headline.ROWS)
    readme = (EXAMPLES.parent / "README.md").read_text()
    assert f"{headline.START}\n{table}\n{headline.END}" in readme


def test_figures_writes_the_demo_transcript_between_its_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`examples/figures.py --part cli` runs `make demo`'s command and writes what it printed
    (and the plot of its log) into the page, touching nothing outside the markers."""
    pytest.importorskip("pettingzoo")
    pytest.importorskip("matplotlib")
    figures = load("figures")
    page, images = tmp_path / "cli.md", tmp_path / "images"
    images.mkdir()
    page.write_text(f"before\n{figures.BEGIN}\nold\n{figures.END}\nafter\n")
    monkeypatch.setattr(figures, "CLI_PAGE", page)
    monkeypatch.setattr(figures, "PAGE", tmp_path / "examples.md")
    monkeypatch.setattr(figures, "HERE", tmp_path / "examples")  # the page's path is printed relative to its parent
    figures.cli_transcript("abc1234")
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old" not in text
    assert "commit abc1234" in text
    assert "episodes  100 ended" in text and "rows      1,130 held, 100 whole episodes" in text
    assert (images / "connect_four_v3.png").stat().st_size > 1000
