"""Editing datasets: filter, split and drop write new logs of whole episodes (every agent's rows,
as recorded: the same content hashes), equal to the same selection made by hand with numpy over
the episodes; the source is only read; bad conditions are one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.cli import main
from flexibuff_envs.integrations.editing import drop, select, split, where


@pytest.fixture(scope="module")
def pistons(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import pistonball_v6

    root = tmp_path_factory.mktemp("edit")
    env = fe.record(pistonball_v6.parallel_env(n_pistons=4, max_cycles=10), num_steps=300, log=root / "log", policy="a")
    for k in range(12):
        if k == 6:
            env.set_policy("b")
        env.reset(seed=k)
        for a, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(10 * k + a)
        while env.agents:
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    env.close()
    return root / "log"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_filter_keeps_what_numpy_selects_with_every_agent_s_rows(pistons: Path, tmp_path: Path) -> None:
    source = fe.FlexibleBuffer.open(pistons)
    before = _files(pistons)
    returns = source.episode_stats()["returns"]  # [episodes, agents]
    threshold = float(np.median(returns[:, 2]))
    want = np.flatnonzero(returns[:, 2] > threshold)
    assert (
        main(
            [
                "filter",
                str(pistons),
                "--out",
                str(tmp_path / "f"),
                "--where",
                f"return > {threshold} and agent == 'piston_2'",
            ]
        )
        == 0
    )
    edited = fe.FlexibleBuffer.open(tmp_path / "f")
    hashes = source.episode_hashes()
    assert edited.episode_hashes() == [hashes[k] for k in want] and 0 < len(want) < 12
    np.testing.assert_allclose(edited.episode_stats()["returns"], returns[want])  # every agent's rows
    assert _files(pistons) == before  # the source is only read
    # any agent: team and per-agent names, policy tags by session, not
    assert where(pistons, "policy == 'b'").tolist() == list(range(6, 12))
    assert where(pistons, "not (policy == 'b') and episode >= 2").tolist() == [2, 3, 4, 5]
    team = np.flatnonzero(returns.sum(axis=1) < float(np.median(returns.sum(axis=1))))
    assert where(pistons, f"team_return < {float(np.median(returns.sum(axis=1)))}").tolist() == team.tolist()
    # the edit's own session, then the recording sessions of the episodes kept, numbered among them
    tags = [(s["api"], s["policy"], s["first_episode"]) for s in edited.sessions]
    kept = [("parallel", "a", 0)] * bool((want < 6).any()) + [("parallel", "b", int(np.searchsorted(want, 6)))] * bool(
        (want >= 6).any()
    )
    assert tags == [("edit", "", 0), *kept]
    assert "filter" in edited.sessions[0]["env_kwargs"]["edit"]


def test_split_and_drop_partition_the_episodes(pistons: Path, tmp_path: Path) -> None:
    hashes = fe.FlexibleBuffer.open(pistons).episode_hashes()
    held = split(pistons, {"train": 0.75, "val": 0.25}, tmp_path / "s", seed=3)
    assert held == {"train": 9, "val": 3}
    train, val = (fe.FlexibleBuffer.open(tmp_path / "s" / name).episode_hashes() for name in ("train", "val"))
    assert sorted(train + val) == sorted(hashes) and not set(train) & set(val)
    assert train == [h for h in hashes if h in set(train)]  # each in the source's order
    again = split(pistons, {"train": 0.75, "val": 0.25}, tmp_path / "again", seed=3)
    assert again == held and fe.FlexibleBuffer.open(tmp_path / "again" / "val").episode_hashes() == val
    assert drop(pistons, [3, 7], tmp_path / "d") == 10
    assert fe.FlexibleBuffer.open(tmp_path / "d").episode_hashes() == [
        h for k, h in enumerate(hashes) if k not in (3, 7)
    ]


@pytest.mark.parametrize(
    ("condition", "says"),
    [
        ("retrn > 3", "'retrn' is none of"),
        ("agent > 3", "cannot compare agent > 3"),
        ("return", "is a value, not a condition"),
        ("length > 5 and 3", "'3' is a value, not a condition"),
        ("agent == -'x'", "is not part of a condition"),
        ("__import__('os').system('true')", "is not part of a condition"),
        ("(return >", "not a condition"),
    ],
)
def test_a_bad_condition_is_one_clear_error(pistons: Path, tmp_path: Path, condition: str, says: str) -> None:
    with pytest.raises(fe.FlexibuffError, match=says.replace("(", r"\(")):
        where(pistons, condition)
    assert not (tmp_path / "x").exists()


def test_an_edit_never_writes_over_a_path(pistons: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(fe.InvalidArgumentError, match="exists already"):
        select(pistons, [0], tmp_path / "taken", edit="test")
    with pytest.raises(fe.InvalidArgumentError, match="episodes 0 to 11"):
        drop(pistons, [12], tmp_path / "d")
