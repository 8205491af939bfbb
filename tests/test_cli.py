"""The command line: record any env, inspect and plot files, and one clear line for bad input."""

from __future__ import annotations

import importlib.abc
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs import cli
from flexibuff_envs.recording import rollout


def run(argv: list[str]) -> int:
    """``main(argv)``'s exit code, also when argparse exits on a usage error."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # record's default --out is ./<env>.log
    return tmp_path


def every_row(buffer: fe.FlexibleBuffer) -> fe.FlexiBatch:
    return next(buffer.minibatches(len(buffer), shuffle=False))


def test_default_records_connect_four_with_legal_actions_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["record", "--episodes", "30"]) == 0
    report = capsys.readouterr().out
    assert report.startswith("recorded pettingzoo.classic.connect_four_v3 (PettingZoo AEC, 2 agents)")
    assert "30 ended" in report and "masks yes" in report and "player_0  mean" in report
    path = Path("connect_four_v3.log").resolve()
    assert f"log       {path}" in report and "30 whole episodes and" in report
    buffer = fe.FlexibleBuffer.open(path)
    assert buffer.n_episodes == 30 and buffer.spec.agent_ids == ("player_0", "player_1")
    batch = every_row(buffer)
    chosen = np.take_along_axis(batch.action_mask[0], batch.discrete_actions[..., :1], axis=-1)[..., 0]
    assert chosen[batch.active].all()  # the random policy never played a full column
    returns = buffer.episode_stats()["returns"]
    assert set(np.unique(returns)) <= {-1.0, 0.0, 1.0} and (returns.sum(axis=1) == 0).all()


def test_each_run_without_out_logs_to_a_new_directory(capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):
        assert run(["record", "CartPole-v1", "--episodes", "3"]) == 0
    assert "CartPole-v1-2.log" in capsys.readouterr().out
    assert [fe.FlexibleBuffer.open(path).n_episodes for path in ("CartPole-v1.log", "CartPole-v1-2.log")] == [3, 3]


def test_steps_budget_records_exactly_that_many_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["record", "CartPole-v1", "--steps", "300", "--out", "c.fbuf"]) == 0
    assert "300 env steps" in capsys.readouterr().out
    buffer = fe.FlexibleBuffer.load("c.fbuf")
    assert len(buffer) == 300 and buffer.num_steps == 300  # the ring is sized to the budget


def test_same_seed_same_file_other_seed_other_file() -> None:
    """The same command writes the same rows, index and sampler state: the files differ only in
    their session's start time and process (`FlexibleBuffer.sessions`), and their episodes' start
    times and env token (`FlexibleBuffer.episode_origins`)."""
    for out, seed in (("a.fbuf", "3"), ("b.fbuf", "3"), ("c.fbuf", "4")):
        assert run(["record", "CartPole-v1", "--episodes", "5", "--seed", seed, "--out", out]) == 0
    a, b, c = (fe.FlexibleBuffer.load(name) for name in ("a.fbuf", "b.fbuf", "c.fbuf"))
    assert [s["policy"] for s in a.sessions] == ["random legal actions"]  # what acted
    assert [{**s, "started": 0, "pid": 0} for s in a.sessions] == [{**s, "started": 0, "pid": 0} for s in b.sessions]
    assert a.episode_origins()["seed"].tolist() == b.episode_origins()["seed"].tolist() == [3, -1, -1, -1, -1]
    for buffer in (a, b, c):  # and their episodes' start times and env tokens
        buffer._sessions = []
        for lane in buffer._index.ring:
            lane.ended.origins["started"] = lane.ended.origins["env"] = 0
    assert Path(a.save("a2.fbuf")).read_bytes() == Path(b.save("b2.fbuf")).read_bytes()
    assert Path(a.save("a2.fbuf")).read_bytes() != Path(c.save("c2.fbuf")).read_bytes()


def test_gamma_sets_the_discount_of_the_recorded_returns() -> None:
    assert run(["record", "CartPole-v1", "--episodes", "1", "--gamma", "0.5", "--out", "g.fbuf"]) == 0
    [episode] = fe.FlexibleBuffer.load("g.fbuf").sample_episodes(n_episodes=1)
    length = len(episode)
    assert length > 5 and episode.G[0] == pytest.approx(sum(0.5**k for k in range(length)))


def test_vector_env_records_one_lane_per_sub_env(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["record", "CartPole-v1", "--num-envs", "3", "--steps", "600", "--out", "v.fbuf"]) == 0
    assert "(Gymnasium vector, 1 agent)" in capsys.readouterr().out
    buffer = fe.FlexibleBuffer.load("v.fbuf")
    assert buffer.spec.n_envs == 3 and buffer.num_steps == 200


def test_vector_env_with_masks_plays_legal_actions_in_every_sub_env() -> None:
    assert run(["record", "Taxi-v4", "--num-envs", "3", "--steps", "900", "--out", "t.fbuf"]) == 0
    buffer = fe.FlexibleBuffer.load("t.fbuf")
    batch = every_row(buffer)
    chosen = np.take_along_axis(batch.action_mask[0], batch.discrete_actions[:, :1], axis=-1)[:, 0]
    assert buffer.spec.n_envs == 3 and len(buffer) > 800 and chosen.all()
    assert len(np.unique(batch.discrete_actions)) > 3  # random, not one fixed legal action


def test_parallel_pettingzoo_module_with_env_kwargs(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(["record", "mpe2.simple_spread_v3", "--episodes", "4", "--env-kwargs", '{"max_cycles": 10, "N": 2}']) == 0
    )
    assert "(PettingZoo parallel, 2 agents)" in capsys.readouterr().out
    stats = fe.FlexibleBuffer.open("simple_spread_v3.log").episode_stats()
    assert stats["lengths"].tolist() == [10] * 4


def test_api_aec_overrides_the_parallel_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(["record", "mpe2.simple_spread_v3", "--api", "aec", "--episodes", "1", "--env-kwargs", '{"max_cycles": 5}'])
        == 0
    )
    assert "(PettingZoo AEC, 3 agents)" in capsys.readouterr().out


def test_pettingzoo_registry_ids(capsys: pytest.CaptureFixture[str]) -> None:
    pettingzoo = pytest.importorskip("pettingzoo")
    if not hasattr(pettingzoo, "aec_registry"):
        pytest.skip("PettingZoo < 1.27 has no registry")
    assert run(["record", "classic/tictactoe_v3", "--episodes", "2"]) == 0
    assert capsys.readouterr().out.startswith("recorded classic/tictactoe-v3 (PettingZoo AEC, 2 agents)")
    assert run(["record", "classic/rps-v2", "--episodes", "1"]) == 0
    assert "(PettingZoo parallel, 2 agents)" in capsys.readouterr().out


def test_default_capacity_fits_the_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "MEMORY_BUDGET", 40 * 1024)
    assert run(["record", "CartPole-v1", "--episodes", "2", "--out", "m.fbuf"]) == 0
    buffer = fe.FlexibleBuffer.load("m.fbuf")

    def reserved(rows: int) -> int:  # bytes a fresh buffer of this layout takes for this many rows
        return fe.FlexibleBuffer.from_spec(buffer.spec, num_steps=rows).nbytes

    assert reserved(buffer.num_steps) <= 40 * 1024 < reserved(buffer.num_steps + 1)  # the most that fit


def test_ctrl_c_stops_early_and_keeps_what_was_recorded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = iter(range(1000))
    real = rollout.legal_sample

    def interrupted_at_500(*args: object) -> object:
        if next(calls) == 500:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(rollout, "legal_sample", interrupted_at_500)
    assert run(["record", "CartPole-v1", "--episodes", "1000", "--out", "i.fbuf"]) == 130
    report = capsys.readouterr().out
    assert "(stopped by Ctrl-C)" in report and "500 env steps" in report
    buffer = fe.FlexibleBuffer.load("i.fbuf")
    assert len(buffer) == 500 and buffer.n_episodes >= 1


def test_progress_bar_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(rollout, "PROGRESS_DELAY", 0)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert run(["record", "CartPole-v1", "--episodes", "50", "--out", "p.fbuf"]) == 0
    assert "CartPole-v1: " in sys.stderr.getvalue() and "/50 [" in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe or a file: no bar
    assert run(["record", "CartPole-v1", "--episodes", "50", "--out", "p.fbuf"]) == 0
    assert sys.stderr.getvalue() == ""


def test_inspect_describes_the_file_without_changing_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["record", "mpe2.simple_spread_v3", "--episodes", "2", "--out", "s.fbuf"]) == 0
    before = Path("s.fbuf").read_bytes()
    capsys.readouterr()
    assert run(["inspect", "s.fbuf"]) == 0
    text = capsys.readouterr().out
    for expected in (
        "3 agents",
        "agent_0, agent_1, agent_2",
        "obs       18 x float32",
        "discrete heads [5]",
        "masks     no",
        "state     54 x float32",
        "50 held, 2 whole episodes",
        "mean 25.0 rows",
        "agent_2  mean",
        "G, active, discrete_actions",
    ):
        assert expected in text, expected
    assert "yours" not in text and "priority" not in text  # neither was used
    assert Path("s.fbuf").read_bytes() == before


def test_inspect_names_fields_of_your_own_and_priorities(capsys: pytest.CaptureFixture[str]) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=50, alpha=0.7, extra_fields={"hidden": (3,)})
    env.reset(seed=0)
    env.annotate(hidden=[1, 2, 3])
    env.step(0)
    env.buffer.update_priorities(np.array([0]), 2.5)
    env.buffer.save("own.fbuf")
    assert run(["inspect", "own.fbuf"]) == 0
    text = capsys.readouterr().out
    assert "yours     hidden [3] float32" in text and "priority  alpha 0.7, highest given 2.5" in text


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert run(["record", "--episodes", "25", "--out", "c4.fbuf"]) == 0
    assert run(["plot", "c4.fbuf"]) == 0
    assert "wrote c4.png: returns of 25 episodes for 2 agent(s)" in capsys.readouterr().out
    png = Path("c4.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_plot_draws_a_line_per_group_of_many_agents() -> None:
    """Pistonball's 10 pistons: one line, their mean, not a legend of 10 identical lines."""
    pytest.importorskip("matplotlib")
    from pettingzoo.butterfly import pistonball_v6

    from flexibuff_envs.cli.plot import plot_buffer

    env = fe.record(pistonball_v6.parallel_env(n_pistons=10, max_cycles=5), num_steps=50)
    for k in range(3):
        env.reset(seed=k)
        while env.agents:
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    assert plot_buffer(env.buffer, "pistons.png", title="pistonball") == ["piston (mean of 10)"]
    assert Path("pistons.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "argv, names",
    [
        (["record", "NoSuchEnv-v0"], "NoSuchEnv"),
        (["record", "pettingzoo.classic.conect_four_v3"], "did you mean pettingzoo.classic.connect_four_v3"),
        (["record", "mpe2.nothing_v1"], "unknown env mpe2.nothing_v1"),
        (["record", "json.decoder"], "neither env() nor parallel_env()"),
        (["record", "--episodes", "2", "--steps", "5"], "--steps: not allowed with argument --episodes"),
        (["record", "--episodes", "0"], "--episodes: must be a positive integer"),
        (["record", "--gamma", "1.5"], "--gamma: must be a number in [0, 1]"),
        (["record", "--env-kwargs", "{max_cycles: 3}"], "--env-kwargs: is not valid JSON"),
        (["record", "--env-kwargs", "[3]"], "--env-kwargs: must be a JSON object"),
        (["record", "mpe2.simple_spread_v3", "--env-kwargs", '{"colour": 1}'], "could not make mpe2.simple_spread_v3"),
        (["record", "CartPole-v1", "--api", "aec"], "--api aec is for PettingZoo envs"),
        (["record", "--api", "parallel"], "has no parallel API"),
        (["record", "--num-envs", "2"], "PettingZoo envs are recorded one at a time"),
        (["record", "--out", ".."], "--out .. is a directory holding other files"),
        (["inspect", "missing.fbuf"], "missing.fbuf: no such buffer file"),
        (["plot", "missing.fbuf"], "missing.fbuf: no such buffer file"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["record", "pistonball_v6"], "pettingzoo.butterfly.pistonball_v6 or its registry id butterfly/pistonball-v6"),
        (["record", "simple_spread_v3"], "PettingZoo's is named by its module, mpe2.simple_spread_v3"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    argv: list[str], names: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flexibuff-envs") and names in lines[0], captured.err
    assert list(in_tmp.iterdir()) == []  # nothing recorded, nothing written


def test_unreadable_or_foreign_files_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    Path("notes.fbuf").write_text("not a buffer")
    assert run(["inspect", "notes.fbuf"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flexibuff-envs inspect: notes.fbuf: ")
    assert run(["record", "CartPole-v1", "--steps", "3", "--out", "short.fbuf"]) == 0
    capsys.readouterr()
    assert run(["plot", "short.fbuf"]) == 1  # its one episode is still running
    assert capsys.readouterr().err.startswith("flexibuff-envs plot: short.fbuf: no episode has ended whole")


def test_a_missing_dependency_of_an_env_module_is_named(
    in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "needs_pygame_x.py").write_text("import pygame_x\n")
    monkeypatch.syspath_prepend(str(in_tmp))
    assert run(["record", "needs_pygame_x.env_v0"]) == 2
    assert (
        "importing needs_pygame_x.env_v0 needs the module pygame_x, which is not installed" in capsys.readouterr().err
    )


def test_without_pettingzoo_the_default_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, *_: object) -> None:
            if name == "pettingzoo":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    for module in [m for m in sys.modules if m == "pettingzoo" or m.startswith("pettingzoo.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(sys, "meta_path", [NotInstalled(), *sys.meta_path])
    assert run(["record"]) == 2
    assert capsys.readouterr().err == (
        "flexibuff-envs record: importing pettingzoo.classic.connect_four_v3 needs "
        "the module pettingzoo, which is not installed "
        "(pip install -e '.[pettingzoo]' in a clone of flexibuff_envs, or pip install pettingzoo mpe2)\n"
    )


def test_console_script_and_module_entry_point(in_tmp: Path) -> None:
    script = shutil.which("flexibuff-envs", path=str(Path(sys.executable).parent))
    assert script is not None
    result = subprocess.run(
        [script, "record", "CartPole-v1", "--episodes", "2"], capture_output=True, text=True, check=True, cwd=in_tmp
    )
    assert "2 ended" in result.stdout and (in_tmp / "CartPole-v1.log").is_dir()
    result = subprocess.run(
        [sys.executable, "-m", "flexibuff_envs", "inspect", "CartPole-v1.log"],
        capture_output=True,
        text=True,
        check=True,
        cwd=in_tmp,
    )
    assert "agent_0" in result.stdout
    result = subprocess.run([script, "record", "NoSuchEnv-v0"], capture_output=True, text=True, check=False, cwd=in_tmp)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_reader_that_leaves_early_gets_no_traceback(in_tmp: Path) -> None:
    assert run(["record", "CartPole-v1", "--episodes", "2", "--out", "p.fbuf"]) == 0
    script = shutil.which("flexibuff-envs", path=str(Path(sys.executable).parent))
    assert script is not None
    inspect = subprocess.Popen(
        [script, "inspect", "p.fbuf"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=in_tmp
    )
    inspect.stdout.close()  # like `| head -0`
    with inspect.stderr:
        assert inspect.wait() == 141 and inspect.stderr.read() == b""


def test_a_ring_too_small_for_any_whole_episode_is_said_and_nothing_is_saved(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["record", "CartPole-v1", "--capacity", "5", "--episodes", "3", "--out", "c.fbuf"]) == 1
    err = capsys.readouterr().err
    assert "note: the buffer holds 5 rows per sub-env, but an episode of CartPole-v1 may last 500 rows" in err
    assert "--capacity 500" in err  # said before recording
    assert "no episode fit whole in the buffer's 5 rows per sub-env (3 ended)" in err
    assert "nothing was saved" in err
    assert not Path("c.fbuf").exists()


def test_the_default_capacity_keeps_what_the_buffer_reserves_within_the_budget() -> None:
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    env = knights_archers_zombies_v11.parallel_env(obs_method="image")  # 3 MB observations, an 11 MB state
    spec = fe.infer_spec(env)
    capacity = cli._default_capacity(spec, None)
    buffer = fe.FlexibleBuffer.from_spec(spec, num_steps=capacity)
    assert capacity > 100 and buffer.nbytes <= cli.MEMORY_BUDGET
    assert cli._longest_episode(env) == 900 > capacity  # so record says so before it starts


def test_sigint_sigterm_and_sighup_stop_a_recording_which_is_saved(tmp_path: Path) -> None:
    """What Ctrl-C, ``timeout``/``docker stop``/SLURM and a closed terminal send, as real signals
    to real processes: each stops the run, the file holds what was recorded, the exit status is
    128 + the signal."""
    import signal
    import time

    runs = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        out = tmp_path / f"{signum.name}.fbuf"
        runs[signum] = (
            out,
            subprocess.Popen(  # --capacity 400 < CartPole's 500 steps: a note when recording starts
                [
                    sys.executable,
                    "-m",
                    "flexibuff_envs",
                    "record",
                    "CartPole-v1",
                    "--steps",
                    "100000000",
                    "--capacity",
                    "400",
                    "--out",
                    str(out),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    for _, process in runs.values():
        assert "note: the buffer holds 400 rows" in process.stderr.readline()  # type: ignore[union-attr]
    time.sleep(2)  # recording
    for signum, (_, process) in runs.items():
        process.send_signal(signum)
    for signum, (out, process) in runs.items():
        report, errors = process.communicate(timeout=120)
        assert process.returncode == 128 + signum, errors[-2000:]
        name = "Ctrl-C" if signum == signal.SIGINT else signum.name
        assert f"(stopped by {name})" in report
        buffer = fe.FlexibleBuffer.load(out)
        assert len(buffer) > 300 and buffer.n_episodes > 10


def test_an_out_that_cannot_be_written_is_refused_before_recording(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["record", "CartPole-v1", "--steps", "200000", "--out", "/proc/x.fbuf"]) == 2
    assert capsys.readouterr().err.startswith("flexibuff-envs record: --out /proc/x.fbuf: cannot write in /proc (")


def test_a_directory_named_like_a_buffer_file_is_refused_before_recording(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out d.fbuf`` where ``d.fbuf`` is a directory: refused at once (it recorded, then lost
    the whole run when the save met the directory)."""
    (in_tmp / "d.fbuf").mkdir()
    assert run(["record", "CartPole-v1", "--steps", "200000", "--out", "d.fbuf"]) == 2
    assert "--out d.fbuf is a directory" in capsys.readouterr().err
    assert os.listdir(in_tmp / "d.fbuf") == []


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--help"]) == 0
    usage = capsys.readouterr().out.split("\n\n")[0]
    for command in ("record", "inspect", "plot", "export", "verify", "repair", "merge"):
        assert command in usage, command


def test_a_run_that_would_not_fit_the_disk_stops_after_its_first_episode(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A quadrillion CartPole steps (some 40 PB) fit no disk: the run stops once its first
    episode ends, saying the projected size; what it wrote is kept. A run that fits says what
    it took a step."""
    steps = str(10**15)
    assert run(["record", "CartPole-v1", "--steps", steps, "--out", "big.log"]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "the run would write about" in said and "PB more" in said
    assert "stopped after the first episode (kept in big.log); pass --force" in said
    assert 1 <= fe.FlexibleBuffer.open("big.log").n_episodes <= 2
    assert run(["record", "CartPole-v1", "--episodes", "5", "--out", "small.log"]) == 0
    assert " B a step): 5 whole episodes" in capsys.readouterr().out


def test_an_atari_id_records_without_registering_ale_py_first(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ale_py")
    assert run(["record", "ALE/Pong-v5", "--steps", "50", "--out", "pong.fbuf"]) == 0
    assert "recorded ALE/Pong-v5" in capsys.readouterr().out
    assert fe.FlexibleBuffer.load("pong.fbuf").spec.obs_dtype == "uint8"


def test_wrap_records_atari_frame_stacks_into_a_log_that_keeps_them_compressed(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--wrap`` wraps the env as given (innermost first); a log keeps image observations as
    zstd frames by default, and `inspect` says how many bytes they take of how many."""
    pytest.importorskip("ale_py")
    stack = 'gymnasium.wrappers.FrameStackObservation:{"stack_size": 4}'
    argv = ["record", "ALE/Pong-v5", "--env-kwargs", '{"obs_type": "grayscale"}', "--wrap", stack]
    assert run([*argv, "--episodes", "1", "--out", "pong.log"]) == 0
    assert fe.FlexibleBuffer.open("pong.log").spec.obs_shape == (4, 210, 160)
    capsys.readouterr()
    assert run(["inspect", "pong.log"]) == 0
    stored = next(line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("stored"))
    ratio = float(stored.split("obs ")[1].split("(")[1].split("x,")[0].replace(",", ""))
    assert ratio > 50 and "zstd" in stored
    assert run([*argv[:-1], "gymnasium.wrappers.NoSuchWrapper", "--steps", "5"]) == 2
    assert "--wrap gymnasium.wrappers.NoSuchWrapper: AttributeError" in capsys.readouterr().err
