"""The episode browser (``flexibuff-envs view``): its API answers with what the recordings hold
(counts, sorted returns, an episode's rewards, a frame's pixels), it serves nothing but its page,
assets and API on 127.0.0.1, bad paths and a busy port are one line; and in a real browser
(Debian's chromium, driven by Playwright) the page shows, sorts, opens an episode, scrubs its
frames, and shows episodes a recording appends while it is open."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import flexibuff_envs as fe
from flexibuff_envs.cli import main
from flexibuff_envs.log.summaries import read_summaries
from flexibuff_envs.view.data import Run
from flexibuff_envs.view.server import Browser

CHROMIUM = shutil.which("chromium")


def _cartpole(directory: Path, episodes: int, seed: int = 0) -> None:
    """``episodes`` CartPole episodes appended to the log ``directory`` (made, or continued)."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=2000, log=directory)
    env.action_space.seed(seed)
    for k in range(episodes):
        env.reset(seed=seed + k)
        while not any(env.step(env.action_space.sample())[2:4]):
            pass
    env.close()


def _pistonball(directory: Path) -> fe.FlexibleBuffer:
    pytest.importorskip("pettingzoo")
    from pettingzoo.butterfly import pistonball_v6

    env = fe.record(pistonball_v6.parallel_env(n_pistons=4, max_cycles=12), num_steps=100, log=directory)
    for episode in range(2):
        env.reset(seed=episode)
        for k, agent in enumerate(env.possible_agents):
            env.action_space(agent).seed(10 * episode + k)
        while env.agents:
            env.step({agent: env.action_space(agent).sample() for agent in env.agents})
    env.close()
    return env.buffer


def _pong(directory: Path) -> None:
    """Two episodes of Pong's grayscale frames (210x160), 60 steps each: a ball that moves."""
    import ale_py

    gym.register_envs(ale_py)
    env = fe.record(gym.make("ALE/Pong-v5", obs_type="grayscale", max_episode_steps=60), num_steps=200, log=directory)
    env.action_space.seed(0)
    for episode in range(2):
        env.reset(seed=episode)
        while not any(env.step(env.action_space.sample())[2:4]):
            pass
    env.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Browser, Path]]:
    _cartpole(tmp_path / "cartpole", 12)
    _pistonball(tmp_path / "pistonball")
    _pong(tmp_path / "pong")
    browser = Browser([Run(str(tmp_path / name)) for name in ("cartpole", "pistonball", "pong")])
    thread = threading.Thread(target=browser.serve_forever, daemon=True)
    thread.start()
    yield browser, tmp_path
    browser.shutdown()
    browser.server_close()


def _get(browser: Browser, path: str) -> Any:
    with urllib.request.urlopen(browser.url + path) as response:
        return json.loads(response.read())


def test_the_api_answers_with_what_the_recordings_hold(served: tuple[Browser, Path]) -> None:
    browser, root = served
    before = _files(root)
    assert browser.server_address[0] == "127.0.0.1"
    cartpole, pistonball = fe.FlexibleBuffer.open(root / "cartpole"), fe.FlexibleBuffer.open(root / "pistonball")
    runs = _get(browser, "api/runs")
    assert [r["episodes"] for r in runs[:2]] == [cartpole.n_episodes, pistonball.n_episodes] == [12, 2]
    assert runs[1]["agents"] == list(pistonball.spec.agent_ids) and runs[1]["image"] and not runs[0]["image"]
    lengths = cartpole.episode_stats()["lengths"]
    page = _get(browser, "api/episodes?run=0&sort=return&desc=1&limit=5")
    assert [r["return"] for r in page["rows"]] == sorted(lengths.tolist(), reverse=True)[:5]  # CartPole: 1 a step
    by_seed = _get(browser, "api/episodes?run=0&sort=seed&desc=1&limit=3")["rows"]  # each reset with its own
    assert [(r["episode"], r["seed"]) for r in by_seed] == [(11, 11), (10, 10), (9, 9)]
    assert [r["episode"] for r in _get(browser, "api/episodes?run=0&seed=4")["rows"]] == [4]
    episode = _get(browser, "api/episode?run=1&episode=0")
    want = next(iter(pistonball.episodes()))
    np.testing.assert_allclose(episode["rewards"], want.individual_rewards, atol=1e-6)
    assert "obs" not in str(sorted(episode))  # the timeline reads no observation
    assert _get(browser, "api/hash?run=1&episode=0")["hash"] == pistonball.episode_hashes()[0]  # as the dataset's
    frame = _get(browser, "api/frame?run=1&episode=0&step=3&agent=2")
    pixels = np.frombuffer(__import__("base64").b64decode(frame["pixels"]), np.uint8)
    assert (frame["height"], frame["width"], frame["channels"]) == (457, 120, 3)
    np.testing.assert_array_equal(pixels, want.obs[2, 3].reshape(-1))
    assert _files(root) == before  # it never writes into a log


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("static/../../../etc/passwd", 404),
        ("static/%2e%2e/%2e%2e/etc/passwd", 404),
        ("static/index.html", 404),  # the page is at /, the assets are a fixed list
        ("api/episode?run=7&episode=0", 400),
        ("api/frame?run=0&episode=99&step=0", 400),
        ("api/nothing?run=0", 400),
        ("api/frame?run=1&episode=0&step=0&agent=4", 400),  # pistonball's 4 agents: 0 to 3
        ("api/frame?run=1&episode=0&step=0&agent=-1", 400),
        ("api/episodes?run=0&limit=-1", 400),
        ("api/episodes?run=0&offset=-10", 400),
        ("api/episode?run=0", 400),
        ("api/episodes?run=0&least=nan", 400),
        ("api/curves?run=0&smooth=0", 400),
        ("api/observations?run=1&episode=0&agent=9", 400),
        ("api/export?run=0&episode=99", 400),
        ("api/hash?run=0&episode=99", 400),
    ],
)
def test_only_the_page_its_assets_and_the_api_are_served(served: tuple[Browser, Path], path: str, status: int) -> None:
    browser, _ = served
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(browser.url + path)
    assert caught.value.code == status
    assert "error" in json.loads(caught.value.read())


def test_a_request_for_another_host_is_refused(served: tuple[Browser, Path]) -> None:
    """DNS rebinding: a page of another site, its name pointed at 127.0.0.1, gets nothing."""
    browser, _ = served
    request = urllib.request.Request(browser.url + "api/runs", headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request)
    assert caught.value.code == 403


class _NotFinite(gym.Env):  # type: ignore[type-arg]
    """An env whose third reward is NaN and whose observation holds inf: JSON has neither."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        self.t = 0
        return np.array([0.0, np.inf], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.array([self.t, np.inf], np.float32), float("nan") if self.t == 3 else 1.0, self.t == 5, False, {}


def test_values_that_are_not_finite_reach_the_page_as_null(tmp_path: Path) -> None:
    env = fe.record(_NotFinite(), num_steps=100, log=tmp_path / "log")
    for _ in range(2):
        env.reset()
        while not any(env.step(0)[2:4]):
            pass
    env.close()
    browser = Browser([Run(str(tmp_path / "log"))])
    threading.Thread(target=browser.serve_forever, daemon=True).start()
    try:
        assert _get(browser, "api/curves?run=0")["returns"][0]["values"] == [None, None]  # valid JSON: NaN is null
        assert _get(browser, "api/episode?run=0&episode=0")["rewards"][0][2] is None
        assert _get(browser, "api/frame?run=0&episode=0&step=1")["values"] == [1.0, None]
    finally:
        browser.shutdown()
        browser.server_close()


def test_a_bad_path_and_a_busy_port_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tmp_path / "nothing"), "--no-browser"]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    _cartpole(tmp_path / "log", 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["view", str(tmp_path / "log"), "--no-browser", "--port", str(taken.getsockname()[1])]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is in use: pass --port N" in err[0]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_page_in_a_real_browser(served: tuple[Browser, Path]) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    browser, root = served
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(browser.url)
        page.wait_for_selector("#episodes tbody tr")
        assert page.inner_text("#count") == "12 episodes"
        page.click("th[data-sort=return]")  # descending first
        page.wait_for_function("document.querySelector('th[data-sort=return]').classList.contains('sorted')")
        page.wait_for_function("document.querySelector('#episodes tbody tr td').textContent !== '0'")
        returns = [float(cell) for cell in page.locator("#episodes tbody tr td:nth-child(3)").all_inner_texts()]
        assert returns == sorted(returns, reverse=True) and len(returns) == 12
        least = sorted(returns)[6]  # a filter on the return: the 6 best
        page.fill("#least", str(least))
        page.dispatch_event("#least", "change")
        page.wait_for_function("document.querySelector('#count').textContent === '6 episodes'")
        page.fill("#least", "")
        page.dispatch_event("#least", "change")
        page.wait_for_function("document.querySelector('#count').textContent === '12 episodes'")
        seeds = [cell for cell in page.locator("#episodes tbody tr td:nth-child(7)").all_inner_texts()]
        assert sorted(map(int, seeds)) == list(range(12))  # each episode's reset seed, in its column
        page.fill("#seed", "4")  # a filter on the seed: the episode reset with it
        page.dispatch_event("#seed", "change")
        page.wait_for_function("document.querySelector('#count').textContent === '1 episodes'")
        assert page.inner_text("#episodes tbody tr td:nth-child(7)") == "4" and "seed=4" in page.url
        page.fill("#seed", "")
        page.dispatch_event("#seed", "change")
        page.wait_for_function("document.querySelector('#count').textContent === '12 episodes'")
        page.click("#episodes tbody tr >> nth=0")  # CartPole: its 4 observation values as a small plot
        page.wait_for_selector("#observation-plots .small")
        assert page.locator("#observation-plots .small").count() == 1
        assert "/api/export?run=0&episode=" in page.get_attribute("#episode-parquet", "href")
        with page.expect_download() as saved:  # the chart with its title and legend
            page.click("#returns-png")
        drawn = saved.value.path().read_bytes()
        assert drawn.startswith(b"\x89PNG") and len(drawn) > 5_000
        page.select_option("#run-select", "1")  # pistonball: image observations, an agent each
        page.wait_for_function("document.querySelector('#count').textContent === '2 episodes'")
        page.click("#episodes tbody tr >> nth=0")
        page.wait_for_selector("#observations canvas.frame")
        assert page.locator("#observations canvas.frame").count() == 4  # one a piston
        page.click("#episode-hash-button")  # read only when asked: it reads the whole episode
        shown = int(page.get_attribute("#episodes tbody tr.chosen", "data-episode") or -1)
        hashed = fe.FlexibleBuffer.open(root / "pistonball").episode_hashes()[shown]
        page.wait_for_function(f"document.querySelector('#episode-hash').textContent === '{hashed}'")
        page.uncheck("#agent-picker input >> nth=3")  # shown: the pistons chosen
        page.wait_for_function("document.querySelectorAll('#observations canvas.frame').length === 3")
        assert "agents=0%2C1%2C2" in page.url
        page.select_option("#run-select", "2")  # Pong: a ball that moves
        page.wait_for_function("document.querySelector('#run-select').value === '2'")
        page.click("#episodes tbody tr >> nth=0")
        page.wait_for_function("document.querySelector('#episode-title').textContent.includes('of run 2')")
        page.wait_for_selector("#observations canvas.frame")
        frames = "[...document.querySelectorAll('canvas.frame')].map((c) => c.toDataURL())"
        first = page.evaluate(frames)
        page.eval_on_selector("#step", "slider => { slider.value = 40; slider.dispatchEvent(new Event('input')); }")
        page.wait_for_function("document.querySelector('#observations').dataset.step === '40'")
        assert page.evaluate(frames) != first  # the frame moved on
        assert "step=40" in page.url  # the view is a link
        page.select_option("#run-select", "0")
        page.wait_for_function("document.querySelector('#episode').hidden")  # the other run's episode closed
        assert "episode=-1" in page.url and page.locator("#next").is_disabled()  # 12 episodes: one page
        page.goto("about:blank")
        page.goto(browser.url + "#run=0&episode=13")  # a link to an episode the log does not hold yet
        page.wait_for_function("document.querySelector('#count').textContent === '12 episodes'")
        assert page.locator("#episode").is_hidden()
        _cartpole(root / "cartpole", 3, seed=100)  # appended while the page is open
        page.wait_for_function("document.querySelector('#count').textContent === '15 episodes'", timeout=15_000)
        page.wait_for_function("document.querySelector('#episode-title').textContent.startsWith('Episode 13 ')")
        assert errors == []
        chromium.close()


def test_curves_tables_filters_and_exports_hold_what_the_log_holds(served: tuple[Browser, Path]) -> None:
    """The charts' lines are the moving means numpy makes, thinned; a return filter selects what
    numpy selects; an episode's observations and its Parquet file are the episode's values."""
    browser, root = served
    cartpole = fe.FlexibleBuffer.open(root / "cartpole")
    lengths = cartpole.episode_stats()["lengths"].astype(np.float64)
    curves = _get(browser, "api/curves?run=0&smooth=3")
    assert curves["x"] == list(range(12)) and curves["deaths"] is None  # numbered as the table; one agent: no deaths
    want = [lengths[max(0, k - 2) : k + 1].mean() for k in range(12)]
    np.testing.assert_allclose(curves["lengths"], want, atol=1e-6)
    np.testing.assert_allclose(curves["returns"][0]["values"], want, atol=1e-6)  # CartPole: 1 a step
    least, most = np.percentile(lengths, [25, 75])
    page = _get(browser, f"api/episodes?run=0&least={least}&most={most}&limit=100")
    chosen = np.flatnonzero((lengths >= least) & (lengths <= most))
    assert [row["episode"] for row in page["rows"]] == chosen.tolist() and page["total"] == chosen.size
    first = next(iter(cartpole.episodes()))
    series = _get(browser, "api/observations?run=0&episode=0&agent=0")
    np.testing.assert_allclose(np.array(series["series"]).T, first.obs, atol=1e-5)
    pq = pytest.importorskip("pyarrow.parquet")
    import io

    with urllib.request.urlopen(browser.url + "api/export?run=1&episode=0") as response:
        assert response.headers["Content-Disposition"] == 'attachment; filename="episode-0.parquet"'
        table = pq.read_table(io.BytesIO(response.read()))
    want_piston = next(iter(fe.FlexibleBuffer.open(root / "pistonball").episodes()))
    assert table.num_rows == want_piston.individual_rewards.size  # a row per agent and step
    np.testing.assert_allclose(
        table.column("rewards").to_numpy().reshape(want_piston.individual_rewards.shape), want_piston.individual_rewards
    )
    obs = np.array(table.column("obs").to_pylist(), np.uint8)
    np.testing.assert_array_equal(obs, want_piston.obs.reshape(obs.shape))


def _dying() -> Any:
    """A ParallelEnv whose ``agent_2`` dies (terminates) at step 2; the others play on to step 5."""
    from pettingzoo import ParallelEnv

    class Dying(ParallelEnv):  # type: ignore[misc]
        """Three agents; ``agent_2`` dies (terminates) at step 2, the others play on to step 5."""

        def __init__(self) -> None:
            self.metadata = {"name": "dying"}
            self.possible_agents = ["agent_0", "agent_1", "agent_2"]

        def observation_space(self, agent: str) -> gym.spaces.Box:
            return gym.spaces.Box(0, 10, (2,), np.float32)

        def action_space(self, agent: str) -> gym.spaces.Discrete:
            return gym.spaces.Discrete(3)

        def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
            self.agents, self.t = list(self.possible_agents), 0
            return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
            self.t += 1
            obs = {a: np.full(2, self.t, np.float32) for a in self.agents}
            ended = {a: self.t == 5 or (a == "agent_2" and self.t == 2) for a in self.agents}
            rewards = {a: float(i + 1) for i, a in enumerate(self.agents)}
            self.agents = [a for a in self.agents if not ended[a]]
            return obs, rewards, ended, dict.fromkeys(ended, False), {a: {} for a in ended}

    return Dying()


def test_deaths_and_steps_an_agent_sat_out(tmp_path: Path) -> None:
    """An agent that dies mid-episode counts as a death (the table, its sort, the curve); after
    it, its frames say it is not active and its actions are null, never a padded 0."""
    pytest.importorskip("pettingzoo")
    env = fe.record(_dying(), num_steps=100, log=tmp_path / "log")
    for _ in range(3):
        env.reset()
        while env.agents:
            env.step({a: 1 for a in env.agents})
    env.close()
    run = Run(str(tmp_path / "log"))
    assert run.table.deaths.tolist() == [1, 1, 1] and run.summary()["deaths"] == 3
    assert run.episodes(sort="deaths")["rows"][0]["deaths"] == 1
    assert run.curves()["deaths"] == [1.0, 1.0, 1.0]
    timeline = run.episode(0)
    np.testing.assert_array_equal(timeline["actions"][2], [1.0, 1.0, np.nan, np.nan, np.nan])  # the page gets null
    assert timeline["active"][2] == [1, 1, 0, 0, 0]
    assert run.frame(0, 3, 2) == {"inactive": True} and run.frame(0, 1, 2)["values"] == [1.0, 1.0]
    from pettingzoo.classic import connect_four_v3

    games = fe.record(connect_four_v3.env(), num_steps=200, log=tmp_path / "games")
    for k in range(3):  # turns, not simultaneous steps: the loser's last turn comes before the winner's
        games.reset(seed=k)
        for _ in games.agent_iter():
            obs, _, terminated, truncated, _ = games.last()
            games.step(None if terminated or truncated else int(np.flatnonzero(obs["action_mask"])[0]))
    games.close()
    turns = Run(str(tmp_path / "games"))
    assert turns.summary()["deaths"] is None and turns.curves()["deaths"] is None and not turns.table.deaths.any()


def test_lines_are_per_agent_for_few_agents_and_per_group_for_many() -> None:
    from flexibuff_envs.view.data import agent_groups

    assert agent_groups(["player_0", "player_1"]) == [("player_0", [0]), ("player_1", [1])]
    pistons = [f"piston_{k}" for k in range(20)]
    assert agent_groups(pistons) == [("piston (mean of 20)", list(range(20)))]
    mixed = [f"adversary_{k}" for k in range(3)] + [f"agent_{k}" for k in range(7)]
    assert [name for name, _ in agent_groups(mixed)] == ["adversary (mean of 3)", "agent (mean of 7)"]


def test_a_parquet_export_a_vault_and_a_compressed_file_open_as_the_log(served: tuple[Browser, Path]) -> None:
    _, root = served
    log = Run(str(root / "pong"))
    buffer = fe.FlexibleBuffer.open(root / "pong")
    packed = Run(buffer.save(root / "pong.fbuf", compress="auto"))
    assert packed.kind == "file" and packed.table.lengths.tolist() == log.table.lengths.tolist()
    assert packed.frame(1, 30, 0)["pixels"] == log.frame(1, 30, 0)["pixels"]
    pytest.importorskip("pyarrow")
    from flexibuff_envs.integrations.parquet import to_parquet

    cartpole = Run(str(root / "cartpole"))
    exported = Run(to_parquet(cartpole.buffer, root / "parquet"))
    assert exported.kind == "parquet"
    np.testing.assert_allclose(exported.table.returns, cartpole.table.returns)
    pytest.importorskip("tensorstore")
    from flexibuff_envs.integrations.vault import to_vault

    vault = Run(to_vault(cartpole.buffer, root / "vaults", vault_name="cartpole.vlt"))
    assert vault.kind == "vault"
    np.testing.assert_allclose(vault.table.returns, cartpole.table.returns)


def test_the_table_of_a_ring_that_wrapped_in_several_lanes_equals_the_episodes(tmp_path: Path) -> None:
    """A vector recording's file whose lanes wrapped: each episode's return, length and ending
    equal those of the episodes the buffer hands out."""
    env = fe.record(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3), num_steps=70)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(400):
        env.step(rng.integers(0, 2, 3))
    run = Run(env.buffer.save(tmp_path / "wrapped.fbuf"))
    episodes = list(env.buffer.episodes())
    assert len(run.table.lengths) == len(episodes) >= 5
    np.testing.assert_allclose(run.table.returns[:, 0], [e.individual_rewards.sum() for e in episodes])
    assert run.table.lengths.tolist() == [len(e.individual_rewards) for e in episodes]
    assert [("terminated", "truncated", "cut")[k] for k in run.table.ended] == [
        "terminated" if e.terminated[-1] else "truncated" if e.truncated[-1] else "cut" for e in episodes
    ]


def test_a_log_s_summaries_give_the_table_its_rows_give_and_are_made_where_missing(tmp_path: Path) -> None:
    _cartpole(tmp_path / "cartpole", 6)
    _pistonball(tmp_path / "pistonball")
    from pettingzoo.classic import connect_four_v3

    from tests.envs import random_games

    games = fe.record(connect_four_v3.env(), num_steps=300, log=tmp_path / "c4")
    random_games(games, 5)
    games.close()
    for name in ("cartpole", "pistonball", "c4"):
        path = tmp_path / name
        from_rows = Run.over(fe.FlexibleBuffer.open(path)).table  # summed from the rows, as before
        for fresh in (True, False):
            if not fresh:  # a log older than summaries: a writer that opens it makes them
                (path / "summaries.fblog").unlink()
                assert Run(str(path)).table.returns.tolist() == from_rows.returns.tolist()  # summed instead
                fe.log.repair(path)
            table = Run(str(path)).table
            assert read_summaries(str(path), len(table.lengths), len(Run(str(path)).agent_ids)) is not None
            for field in ("lengths", "returns", "team", "ended", "seeds"):
                np.testing.assert_array_equal(getattr(table, field), getattr(from_rows, field), err_msg=field)
            dies = Run(str(path)).dies
            np.testing.assert_array_equal(table.deaths, from_rows.deaths if dies else 0)
    fe.merge_logs([tmp_path / "cartpole", tmp_path / "cartpole"], tmp_path / "merged")
    once = Run(str(tmp_path / "cartpole")).table.returns
    assert read_summaries(str(tmp_path / "merged"), 2 * len(once), 1) is not None  # copied from the sources
    np.testing.assert_array_equal(Run(str(tmp_path / "merged")).table.returns, np.concatenate([once, once]))
