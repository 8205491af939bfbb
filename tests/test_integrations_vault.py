"""Recordings out to flashbax Vaults (OG-MARL's dataset form) and vaults back in: flashbax's own
reader sees every field as the buffer holds it, a vault comes back as it went out, and a vault
flashbax wrote in OG-MARL's layout trains through our samplers with G computed."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("tensorstore")
pytest.importorskip("flashbax")
pytest.importorskip("pettingzoo")
warnings.filterwarnings("ignore", module="pettingzoo")

import flashbax as fbx
import jax.numpy as jnp
import tensorstore as ts
from flashbax.vault import Vault

import flexibuff_envs as fe
from flexibuff_envs.integrations import vault as vault_module
from flexibuff_envs.integrations.vault import from_vault, to_vault
from flexibuff_envs.testing.reference import plain_returns
from tests.batches import assert_same_batches
from tests.envs import RECORDED_GAMMA as GAMMA
from tests.envs import RECORDED_KINDS as KINDS
from tests.envs import recorded


def _time_major(batches: list[fe.FlexiBatch], name: str, n_agents: int) -> np.ndarray:
    """Field ``name`` of every episode, back to back, time first (then agents), as a vault lays it out."""
    values = [getattr(b, name) for b in batches]
    if isinstance(values[0], list):  # masks per head
        values = [np.concatenate(v, axis=-1) for v in values]
    if name in ("state", "global_rewards"):
        return np.concatenate(values)
    if n_agents == 1:
        values = [v[None] for v in values]
    return np.concatenate([np.moveaxis(v, 0, 1) for v in values])


@pytest.mark.parametrize("kind", KINDS)
def test_flashbax_reads_every_field_as_the_buffer_holds_it(tmp_path: Path, kind: str) -> None:
    buffer = recorded(kind)
    batches = list(buffer.episodes())
    assert len(batches) >= 2
    n = buffer.spec.n_agents
    path = to_vault(buffer, tmp_path, vault_name="run.vlt", vault_uid="Good")
    assert path == os.path.join(tmp_path, "run.vlt", "Good")
    experience = Vault("run.vlt", rel_dir=str(tmp_path), vault_uid="Good").read().experience
    got = {key: np.asarray(value)[0] for key, value in experience.items() if key != "infos"}
    infos = {key: np.asarray(value)[0] for key, value in experience["infos"].items()}
    rows = sum(len(b) for b in batches)
    assert got["observations"].shape == (rows, n, buffer.spec.obs_size)
    np.testing.assert_array_equal(got["observations"], _time_major(batches, "obs", n))
    np.testing.assert_array_equal(got["actions"], _time_major(batches, "discrete_actions", n)[..., 0])
    np.testing.assert_array_equal(got["rewards"], _time_major(batches, "individual_rewards", n))
    for leaf, name in (("terminals", "terminated"), ("truncations", "truncated")):
        assert got[leaf].dtype == np.float32
        np.testing.assert_array_equal(got[leaf], _time_major(batches, name, n))
    np.testing.assert_array_equal(infos["alive"], _time_major(batches, "active", n))
    np.testing.assert_array_equal(infos["next_observations"], _time_major(batches, "obs_", n))
    np.testing.assert_array_equal(np.flatnonzero(infos["episode_ends"]), np.cumsum([len(b) for b in batches]) - 1)
    if buffer.spec.state_size:
        np.testing.assert_array_equal(infos["state"], _time_major(batches, "state", n))
    if buffer.spec.action_mask:
        np.testing.assert_array_equal(infos["legals"], _time_major(batches, "action_mask", n))
    if kind in ("dying", "spawning"):  # some agent is absent somewhere, and says so
        assert (infos["alive"] == 0).any()
    if kind == "adversary":  # the smaller agent's observation is zero-padded as the buffer pads it
        small = int(np.argmin(buffer.spec.agent_obs_sizes))
        assert (got["observations"][:, small, min(buffer.spec.agent_obs_sizes) :] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_a_vault_comes_back_as_it_went_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    buffer = recorded(kind)
    rows = np.flatnonzero(np.arange(len(buffer)) % 3 == 0)  # a field held once per row (not per agent)
    buffer.set_memory_weights(rows, np.linspace(0.1, 1.0, rows.size, dtype=np.float32))
    path = to_vault(buffer, tmp_path, vault_uid="x")
    back = from_vault(path)
    assert back.spec == buffer.spec and back.gamma == buffer.gamma
    for mine, want in zip(back.episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
    monkeypatch.setattr(vault_module, "BLOCK_BYTES", 1)  # written and read an episode at a time: the same
    monkeypatch.setattr(vault_module, "BLOCK_ROWS", 1)
    for mine, want in zip(
        from_vault(to_vault(buffer, tmp_path, vault_uid="y")).episodes(), buffer.episodes(), strict=True
    ):
        assert_same_batches(mine, want)
    assert len(back.sample_transitions(32)) == 32


def test_a_ring_smaller_than_the_vault_keeps_its_newest_episodes_whole(tmp_path: Path) -> None:
    buffer = recorded("dying")
    path = to_vault(buffer, tmp_path, vault_uid="x")
    want = list(buffer.episodes())
    back = from_vault(path, num_steps=sum(len(e) for e in want[-2:]) + 3)
    got = list(back.episodes())
    assert len(got) == 2
    for mine, theirs in zip(got, want[-2:], strict=True):
        assert_same_batches(mine, theirs)


def test_a_vault_goes_into_an_episode_log_through_a_small_ring(tmp_path: Path) -> None:
    """``log=``: every episode of the vault lands in the log, while the ring keeps the newest."""
    buffer = recorded("dying")
    want = list(buffer.episodes())
    back = from_vault(to_vault(buffer, tmp_path, vault_uid="x"), log=tmp_path / "run.log", num_steps=40)
    assert back.n_episodes < len(want) and not back.logging
    logged = fe.FlexibleBuffer.open(tmp_path / "run.log")
    for mine, theirs in zip(logged.episodes(), want, strict=True):
        assert_same_batches(mine, theirs)


def test_a_log_and_a_file_export_as_their_buffer_does(tmp_path: Path) -> None:
    env = fe.record(gym.make("CartPole-v1"), num_steps=2000, gamma=GAMMA, log=tmp_path / "run.log")
    env.reset(seed=0)
    for t in range(300):
        if any(env.step(t % 3 % 2)[2:4]):
            env.reset()
    env.close()
    env.buffer.save(tmp_path / "run.fbuf")
    sources = {"buffer": env.buffer, "log": tmp_path / "run.log", "file": str(tmp_path / "run.fbuf")}
    for uid, source in sources.items():
        back = from_vault(
            tmp_path / "vaults",
            vault_name="cartpole.vlt",
            vault_uid=to_vault(source, tmp_path / "vaults", vault_name="cartpole.vlt", vault_uid=uid).rsplit(os.sep, 1)[
                1
            ],
        )
        for mine, want in zip(back.episodes(), env.buffer.episodes(), strict=True):
            assert_same_batches(mine, want)


def _og_marl_vault(
    directory: Path,
    lengths: list[int],
    truncated: list[bool],
    tail: int,
    change: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, np.ndarray]:
    """A vault flashbax writes in OG-MARL's layout: 3 agents, episodes of ``lengths`` packed along
    T (terminals, or truncations, set for every agent at each end), then ``tail`` steps of an
    episode cut off (``change``, given, alters the arrays first). Returns the arrays written,
    ``[T, ...]``."""
    rng = np.random.default_rng(0)
    steps, n = sum(lengths) + tail, 3
    team = rng.normal(size=steps).astype(np.float32)
    ends = np.cumsum(lengths) - 1
    terminals = np.zeros((steps, n), np.float32)
    truncations = np.zeros((steps, n), np.float32)
    for end, cut in zip(ends, truncated):
        (truncations if cut else terminals)[end] = 1.0
    legals = (rng.random((steps, n, 5)) < 0.6).astype(np.float32)
    legals[..., 0] = 1.0
    data = {
        "observations": rng.normal(size=(steps, n, 4)).astype(np.float32),
        "actions": rng.integers(0, 5, size=(steps, n)).astype(np.int32),
        "rewards": np.repeat(team[:, None], n, axis=1),
        "terminals": terminals,
        "truncations": truncations,
        "infos": {"legals": legals, "state": rng.normal(size=(steps, 6)).astype(np.float32)},
    }
    if change is not None:
        change(data)
    buffer = fbx.make_flat_buffer(
        max_length=steps + 8, min_length=1, sample_batch_size=1, add_sequences=True, add_batch_size=None
    )
    state = buffer.init(
        {
            key: (jnp.asarray(value[0]) if key != "infos" else {k: jnp.asarray(v[0]) for k, v in value.items()})
            for key, value in data.items()
        }
    )
    state = buffer.add(
        state,
        {
            key: (jnp.asarray(value) if key != "infos" else {k: jnp.asarray(v) for k, v in value.items()})
            for key, value in data.items()
        },
    )
    vault = Vault("smac_3m.vlt", experience_structure=state.experience, rel_dir=str(directory), vault_uid="Good")
    assert vault.write(state) == steps
    return data


@pytest.mark.parametrize("block_bytes", [vault_module.BLOCK_BYTES, 1])  # all at once, or an episode a block
def test_an_og_marl_vault_that_flashbax_wrote_reads_without_jax_into_whole_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    monkeypatch.setattr(vault_module, "BLOCK_BYTES", block_bytes)
    lengths, truncated = [4, 7, 2], [False, True, False]
    data = _og_marl_vault(tmp_path, lengths, truncated, tail=3)
    buffer = from_vault(tmp_path, vault_name="smac_3m.vlt", gamma=GAMMA)
    assert buffer.spec.n_agents == 3 and buffer.spec.discrete_action_cardinalities == (5,)
    assert buffer.spec.state_size == 6 and buffer.spec.action_mask
    episodes = list(buffer.episodes())
    assert [len(b) for b in episodes] == lengths  # the cut-off tail is left out
    start = 0
    for batch, length, cut in zip(episodes, lengths, truncated):
        rows = slice(start, start + length)
        np.testing.assert_array_equal(batch.obs, np.moveaxis(data["observations"][rows], 0, 1))
        np.testing.assert_array_equal(batch.discrete_actions[..., 0], data["actions"][rows].T)
        np.testing.assert_array_equal(batch.action_mask[0], np.moveaxis(data["infos"]["legals"][rows], 0, 1) != 0)
        np.testing.assert_array_equal(batch.state, data["infos"]["state"][rows])
        np.testing.assert_array_equal(batch.obs_[:, :-1], batch.obs[:, 1:])
        assert batch.truncated[:, -1].all() == cut and batch.terminated[:, -1].all() == (not cut)
        assert not batch.terminated[:, :-1].any()
        team = data["rewards"][rows, 0].tolist()
        for agent in range(3):
            np.testing.assert_allclose(batch.G[agent], plain_returns(team, GAMMA), rtol=1e-5)
        np.testing.assert_allclose(batch.global_rewards, team)
        start += length
    assert buffer.sample_transitions(8, as_torch=True).obs.shape == (3, 8, 4)


def test_what_is_not_a_vault_is_one_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(fe.BufferFileError, match=str(tmp_path)):
        from_vault(tmp_path)
    (tmp_path / "metadata.json").write_text("{not json")
    with pytest.raises(fe.BufferFileError, match="metadata.json: not a flashbax vault"):
        from_vault(tmp_path)
    buffer = recorded("cartpole")
    path = Path(to_vault(buffer, tmp_path / "v", vault_uid="u"))
    meta = json.loads((path / "metadata.json").read_text())
    json.dump({**meta, "version": 2.0}, (path / "metadata.json").open("w"))
    with pytest.raises(fe.BufferFileError, match="version 2.0"):
        from_vault(path)
    with pytest.raises(fe.BufferSaveError, match="a vault is there already"):
        to_vault(buffer, tmp_path / "v", vault_uid="u")
    with pytest.raises(fe.BufferFileError, match="pass vault_uid, one of"):
        to_vault(buffer, tmp_path / "v", vault_uid="w")
        from_vault(tmp_path / "v", vault_name="recording.vlt")


@pytest.mark.parametrize("compression", ["lz4", "zstd", "gzip", "none"])
def test_each_compression_is_read_by_flashbax_and_comes_back(tmp_path: Path, compression: str) -> None:
    buffer = recorded("pistonball")
    path = to_vault(buffer, tmp_path, vault_uid="u", compression=compression)
    experience = Vault("recording.vlt", rel_dir=str(tmp_path), vault_uid="u").read().experience
    batches = list(buffer.episodes())
    np.testing.assert_array_equal(np.asarray(experience["observations"])[0], _time_major(batches, "obs", 3))
    for mine, want in zip(from_vault(path).episodes(), batches, strict=True):
        assert_same_batches(mine, want)
    with pytest.raises(ValueError, match="compression 'snappy' is none of"):
        to_vault(buffer, tmp_path, vault_uid="v", compression="snappy")


def test_a_crafted_layout_is_one_error_naming_the_vault(tmp_path: Path) -> None:
    path = Path(to_vault(recorded("spread"), tmp_path, vault_uid="u"))
    meta = json.loads((path / "metadata.json").read_text())
    meta["flexibuff_envs"]["spec"]["obs_size"] = 10**12
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(fe.BufferFileError, match=f"{path}: its layout gives obs 1,000,000,000,000 values a row"):
        from_vault(path)


def _set(data: dict[str, Any], key: str, value: np.ndarray) -> None:
    data[key] = value


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d["actions"].__setitem__((2, 1), 7), "discrete_actions holds 7 for head 0, outside its 5 actions"),
        (lambda d: d["actions"].__setitem__((0, 0), -1), "discrete_actions holds -1 for head 0"),
        (lambda d: _set(d, "rewards", d["rewards"][:, :2]), "leaf 'rewards' is"),
    ],
    ids=["action beyond the legal ones", "negative action", "rewards of 2 agents of 3"],
)
def test_an_og_marl_vault_whose_leaves_disagree_is_one_error_naming_the_vault(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], says: str
) -> None:
    """An action outside the legal actions' width (or negative), a leaf of other agents: each a
    `BufferFileError` naming the vault and what is wrong, never a buffer of wrong data."""
    _og_marl_vault(tmp_path, [4, 7, 2], [False, True, False], tail=3, change=change)
    with pytest.raises(fe.BufferFileError, match=f"{tmp_path}.*{says}"):
        from_vault(tmp_path, vault_name="smac_3m.vlt")


def test_a_vault_that_lacks_what_its_layout_says_is_one_error_naming_the_leaf(tmp_path: Path) -> None:
    """A leaf the layout names but the vault lacks, a layout of more action heads than the
    actions leaf holds, an index claiming steps never written: each a `BufferFileError`, where
    they read as zeros, copies of one head, or gigabytes of fill."""
    from flexibuff_envs.integrations.vault_format import store_spec

    buffer = recorded("spread")
    original = Path(to_vault(buffer, tmp_path / "v", vault_uid="u"))
    meta = json.loads((original / "metadata.json").read_text())

    def crafted(name: str, change: Callable[[dict[str, Any]], None]) -> Path:
        path = tmp_path / name
        shutil.copytree(original, path)
        altered = json.loads(json.dumps(meta))
        change(altered)
        (path / "metadata.json").write_text(json.dumps(altered))
        return path

    def no_observations(m: dict[str, Any]) -> None:
        del m["structure_shape"]["observations"], m["structure_dtype"]["observations"]

    def two_heads(m: dict[str, Any]) -> None:
        m["flexibuff_envs"]["spec"].update(discrete_action_cardinalities=[5, 5], discrete_action_starts=[0, 0])

    with pytest.raises(fe.BufferFileError, match="names leaf 'observations', which the vault does not hold"):
        from_vault(crafted("no_obs", no_observations))
    with pytest.raises(
        fe.BufferFileError, match=r"discrete_actions is \(3, \d+, 1\); the layout stores it as \(3, \d+, 2\)"
    ):
        from_vault(crafted("two_heads", two_heads))
    claims = crafted("claims", lambda m: None)
    ts.open(store_spec(str(claims), "vault_index")).result().write(np.array([20_000_000], np.int32)).result()
    with pytest.raises(fe.BufferFileError, match="says the vault holds 20,000,000 steps, but leaf"):
        from_vault(claims)


def test_an_empty_buffer_writes_no_vault(tmp_path: Path) -> None:
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(gym.make("CartPole-v1")), num_steps=10)
    with pytest.raises(fe.EmptyBufferError):
        to_vault(buffer, tmp_path, vault_uid="u")
    assert os.listdir(tmp_path / "recording.vlt") == []


def test_the_cli_exports_a_recording_as_a_vault_and_inspects_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flexibuff_envs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["record", "classic/connect_four_v3", "--episodes", "12", "--out", "c4.log"]) == 0
    assert main(["export", "c4.log", "--vault", "vaults", "--vault-uid", "Good"]) == 0
    assert "Vault('c4.vlt', rel_dir='vaults', vault_uid='Good')" in capsys.readouterr().out
    experience = Vault("c4.vlt", rel_dir="vaults", vault_uid="Good").read().experience
    assert int(np.asarray(experience["infos"]["episode_ends"]).sum()) == 12
    assert main(["inspect", "vaults"]) == 0
    report = capsys.readouterr().out
    assert "flashbax vault, 2 agents" in report and "12 whole episodes" in report and "infos.legals [2, 7]" in report
    (tmp_path / "other").mkdir()
    assert main(["inspect", "other"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["export", "c4.log", "--vault", "vaults", "--vault-uid", "Good"]) == 1
    assert "a vault is there already" in capsys.readouterr().err
    assert main(["export", "c4.log", "--vault", "small", "--vault-uid", "Zstd", "--compression", "zstd"]) == 0
    store = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "ocdbt", "path": "observations.", "base": f"file://{tmp_path}/small/c4.vlt/Zstd"},
        }
    ).result()
    assert store.spec().to_json()["metadata"]["compressor"]["cname"] == "zstd"
    assert Vault("c4.vlt", rel_dir="small", vault_uid="Zstd").read().experience["observations"].shape[1] > 0
    assert main(["export", "c4.log", "--vault", "small", "--vault-uid", "Sparse", "--next-values", "sparse"]) == 0
    for mine, want in zip(
        from_vault(tmp_path / "small" / "c4.vlt" / "Sparse").episodes(), fe.FlexibleBuffer.open("c4.log").episodes()
    ):
        assert_same_batches(mine, want)


@pytest.mark.parametrize("kind", ["pistonball", "spread", "connect_four"])
def test_a_vault_with_sparse_next_values_comes_back_as_it_went_out(tmp_path: Path, kind: str) -> None:
    """``next_values="sparse"`` writes a next value only where the next step does not hold it (an
    episode's end, a player's next turn): the vault reads back equal to the buffer."""
    buffer = recorded(kind)
    sparse = to_vault(buffer, tmp_path, vault_uid="sparse", next_values="sparse")
    for mine, want in zip(from_vault(sparse).episodes(), buffer.episodes(), strict=True):
        assert_same_batches(mine, want)
    with pytest.raises(fe.InvalidArgumentError, match="next_values must be 'all' or 'sparse'"):
        to_vault(buffer, tmp_path, vault_uid="x", next_values="some")
