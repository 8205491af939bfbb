"""Recordings out to Parquet and back: pandas, polars and Hugging Face ``datasets`` read every
field as the buffer holds it, frames go out as bytes unchanged, and a dataset reads back equal."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import flexibuff_envs as fe
from flexibuff_envs.integrations import parquet
from flexibuff_envs.integrations.parquet import KEY, from_parquet, to_parquet
from tests.batches import assert_same_batches
from tests.envs import RECORDED_KINDS, recorded


def _rows(batches: list[fe.FlexiBatch], name: str, n_agents: int) -> np.ndarray:
    """Field ``name`` of every episode as the long table orders rows: episode, step, agent."""
    values = [getattr(b, name) for b in batches]
    if n_agents == 1:
        values = [v[None] for v in values]
    return np.concatenate([np.moveaxis(v, 0, 1).reshape(-1, *v.shape[2:]) for v in values])


@pytest.mark.parametrize("kind", RECORDED_KINDS)
def test_a_dataset_reads_back_equal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    buffer = recorded(kind)
    rows = np.flatnonzero(np.arange(len(buffer)) % 3 == 0)  # a field held once per row (not per agent)
    buffer.set_memory_weights(rows, np.linspace(0.1, 1.0, rows.size, dtype=np.float32))
    back = from_parquet(to_parquet(buffer, tmp_path / "data"))
    assert back.spec == buffer.spec and back.gamma == buffer.gamma
    for mine, want in zip(back.episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
    assert sorted(os.listdir(tmp_path)) == ["data"]  # no temporary left
    monkeypatch.setattr(parquet, "PART_STEPS", 1)  # an episode a part, written and read a part at a time
    path = to_parquet(buffer, tmp_path / "parts")
    assert len(os.listdir(os.path.join(path, "agents"))) == buffer.n_episodes
    for mine, want in zip(from_parquet(path).episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
    from_parquet(path, log=tmp_path / "run.log", num_steps=len(buffer) // 2)  # every episode into a log
    for mine, want in zip(fe.FlexibleBuffer.open(tmp_path / "run.log").episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)


@pytest.mark.parametrize("kind", ["spread", "spawning"])
def test_pandas_polars_and_datasets_read_every_row_as_the_buffer_holds_it(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets
    import pandas as pd
    import polars as pl

    buffer = recorded(kind)
    batches = list(buffer.episodes())
    n, ids = buffer.spec.n_agents, list(buffer.spec.agent_ids)
    path = Path(to_parquet(buffer, tmp_path / "data"))
    frame = pd.read_parquet(path / "agents")
    rows = sum(len(b) for b in batches) * n
    assert len(frame) == rows
    lengths = [len(b) for b in batches]
    np.testing.assert_array_equal(frame["episode"], np.repeat(np.arange(len(batches)), np.array(lengths) * n))
    np.testing.assert_array_equal(frame["step"], np.concatenate([np.repeat(np.arange(t), n) for t in lengths]))
    assert list(frame["agent"].astype(str)) == ids * (rows // n)
    for name in ("individual_rewards", "terminated", "truncated", "active", "G"):
        np.testing.assert_array_equal(frame[name].to_numpy(), _rows(batches, name, n), err_msg=name)
    np.testing.assert_array_equal(np.stack(frame["obs"].to_numpy()), _rows(batches, "obs", n))

    polars = pl.read_parquet(path / "agents" / "*.parquet")
    np.testing.assert_array_equal(polars["obs_"].to_numpy(), _rows(batches, "obs_", n))
    mine = polars.filter((pl.col("episode") == 1) & (pl.col("agent") == ids[-1]))
    np.testing.assert_array_equal(mine["individual_rewards"].to_numpy(), batches[1].individual_rewards[-1])

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    hf = datasets.Dataset.from_parquet(str(path / "agents" / "*.parquet"), cache_dir=str(tmp_path / "hf"))
    assert len(hf) == rows and hf.features["obs"].length == buffer.spec.obs_size
    np.testing.assert_array_equal(
        np.array(hf.with_format("numpy")["discrete_actions"]), _rows(batches, "discrete_actions", n)
    )
    if buffer.spec.state_size:  # held once per step, in the steps table
        steps = pd.read_parquet(path / "steps")
        assert len(steps) == rows // n
        np.testing.assert_array_equal(np.stack(steps["state"].to_numpy()), np.concatenate([b.state for b in batches]))


def test_frames_go_out_as_fixed_size_bytes_unchanged(tmp_path: Path) -> None:
    env = fe.record(gym.make("CarRacing-v3", max_episode_steps=4), num_steps=50)
    env.reset(seed=0)
    for t in range(12):
        if any(env.step(np.array([0.1 * (t % 3), 0.5, 0.0], dtype=np.float32))[2:4]):
            env.reset()
    buffer = env.buffer
    path = Path(to_parquet(buffer, tmp_path / "frames"))
    table = pq.read_table(path / "agents")
    width = 96 * 96 * 3
    assert table.schema.field("obs").type == pa.binary(width)
    frames = np.frombuffer(b"".join(table.column("obs").to_pylist()), dtype=np.uint8).reshape(-1, 96, 96, 3)
    np.testing.assert_array_equal(frames, np.concatenate([b.obs for b in buffer.episodes()]).reshape(-1, 96, 96, 3))
    for mine, want in zip(from_parquet(path).episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
    from_parquet(path, log=tmp_path / "run.log", num_steps=len(buffer) // 2)  # every episode into a log
    for mine, want in zip(fe.FlexibleBuffer.open(tmp_path / "run.log").episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)


def test_what_is_not_a_dataset_is_one_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(fe.BufferFileError, match=f"{tmp_path}: not a Parquet dataset"):
        from_parquet(tmp_path)
    (tmp_path / "agents").mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "agents" / "part-00000.parquet")
    with pytest.raises(fe.BufferFileError, match="part-00000.parquet: not a part of a flexibuff_envs Parquet"):
        from_parquet(tmp_path)
    buffer = recorded("spread")
    path = Path(to_parquet(buffer, tmp_path / "data"))
    with pytest.raises(fe.BufferSaveError, match="there already"):
        to_parquet(buffer, path)
    table = pq.read_table(path / "agents" / "part-00000.parquet")
    pq.write_table(table.slice(0, len(table) - 1), path / "agents" / "part-00000.parquet")
    with pytest.raises(fe.BufferFileError, match="no whole number of steps of 3 agents"):
        from_parquet(path)


@pytest.mark.parametrize("kind", ["spread", "spawning"])
def test_rows_another_tool_reordered_read_back_in_their_episodes_order(tmp_path: Path, kind: str) -> None:
    """An SQL engine writes ``agents`` ordered by episode, agent, step (or in any order): the
    rows are put back by the columns written for it, and the buffer equals the one exported."""
    buffer = recorded(kind)
    path = Path(to_parquet(buffer, tmp_path / "data"))
    agents, steps = path / "agents" / "part-00000.parquet", path / "steps" / "part-00000.parquet"
    table = pq.read_table(agents)
    rank = pc.index_in(table.column("agent"), value_set=pa.array(buffer.spec.agent_ids))
    by_agent = table.append_column("rank", rank).sort_by(
        [("episode", "ascending"), ("rank", "ascending"), ("step", "ascending")]
    )
    pq.write_table(by_agent.drop_columns(["rank"]).replace_schema_metadata(table.schema.metadata), agents)
    shuffled = np.random.default_rng(0).permutation(pq.read_table(steps).num_rows)
    pq.write_table(pq.read_table(steps).take(shuffled), steps)
    for mine, want in zip(from_parquet(path).episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)


def test_rows_that_are_not_whole_steps_or_episodes_are_one_error_naming_the_file(tmp_path: Path) -> None:
    buffer = recorded("spread")
    path = Path(to_parquet(buffer, tmp_path / "data"))
    agents, steps = path / "agents" / "part-00000.parquet", path / "steps" / "part-00000.parquet"
    table = pq.read_table(agents)
    for broken, says in [
        (table.drop_columns(["episode"]), "no column 'episode'"),
        (
            table.set_column(table.column_names.index("agent"), "agent", pa.array(["agent_9"] * len(table))),
            "not one of",
        ),
        (table.slice(3), "every agent at every step"),  # the first step gone
    ]:
        pq.write_table(broken.replace_schema_metadata(table.schema.metadata), agents)
        with pytest.raises(fe.BufferFileError, match=f"{agents}: .*{says}"):
            from_parquet(path)
    pq.write_table(table, agents)
    pq.write_table(pq.read_table(steps).slice(1), steps)
    with pytest.raises(fe.BufferFileError, match="every agent at every step"):
        from_parquet(path)
    shutil.rmtree(path / "steps")
    with pytest.raises(fe.BufferFileError, match="no steps/ table"):
        from_parquet(path)


def test_a_crafted_layout_is_one_error_naming_the_file_before_memory_is_reserved(tmp_path: Path) -> None:
    """A part whose layout claims wider rows than its columns hold (absurdly wide, or a little)
    is refused naming the dataset, without reserving a ring of the claimed width."""
    path = Path(to_parquet(recorded("spread"), tmp_path / "data"))
    part = path / "agents" / "part-00000.parquet"
    table = pq.read_table(part)
    for size in (10**12, 19):
        layout = json.loads(table.schema.metadata[KEY])
        layout["spec"]["obs_size"] = size
        pq.write_table(table.replace_schema_metadata({KEY: json.dumps(layout).encode()}), part)
        with pytest.raises(fe.BufferFileError, match=f"{path}: its layout gives obs {size:,} values a row"):
            from_parquet(path)
    layout = json.loads(table.schema.metadata[KEY])
    layout["fields"]["individual_rewards"]["shape"] = [2]
    pq.write_table(table.replace_schema_metadata({KEY: json.dumps(layout).encode()}), part)
    with pytest.raises(fe.BufferFileError, match="individual_rewards"):
        from_parquet(path)
    for key, value in (("dtype", "nonsense"), ("dtype", "O"), ("shape", [-3])):
        layout = json.loads(table.schema.metadata[KEY])
        layout["fields"]["obs"][key] = value
        pq.write_table(table.replace_schema_metadata({KEY: json.dumps(layout).encode()}), part)
        with pytest.raises(fe.BufferFileError, match=f"{part}: not a part of a flexibuff_envs Parquet dataset.*'obs'"):
            from_parquet(path)


def test_an_empty_buffer_writes_no_dataset(tmp_path: Path) -> None:
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(gym.make("CartPole-v1")), num_steps=10)
    with pytest.raises(fe.EmptyBufferError):
        to_parquet(buffer, tmp_path / "data")
    assert os.listdir(tmp_path) == []


def test_the_cli_exports_a_recording_as_parquet_and_inspects_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flexibuff_envs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "classic/connect_four_v3", "--episodes", "12", "--out", "c4.log"]) == 0
    assert main(["export", "c4.log", "--parquet", "c4"]) == 0
    logged = fe.FlexibleBuffer.open(tmp_path / "c4.log")
    for mine, want in zip(from_parquet(tmp_path / "c4").episodes(), logged.episodes(), strict=True):
        assert_same_batches(mine, want)
    capsys.readouterr()
    assert main(["inspect", "c4"]) == 0
    report = capsys.readouterr().out
    assert "Parquet dataset, 2 agents" in report and "12 whole episodes" in report and "obs [84] int8" in report
