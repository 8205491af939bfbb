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
    episode = _get(browser, "api/episode?run=1&episode=0")
    want = next(iter(pistonball.episodes()))
    np.testing.assert_allclose(episode["rewards"], want.individual_rewards, atol=1e-6)
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
        assert _get(browser, "api/runs")[0]["team"] == [None, None]  # valid JSON: NaN is null
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
        page.select_option("#run-select", "1")  # pistonball: image observations, an agent each
        page.wait_for_function("document.querySelector('#count').textContent === '2 episodes'")
        page.click("#episodes tbody tr >> nth=0")
        page.wait_for_selector("#observations canvas.frame")
        assert page.locator("#observations canvas.frame").count() == 4  # one a piston
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
        _cartpole(root / "cartpole", 3, seed=100)  # appended while the page is open
        page.wait_for_function("document.querySelector('#count').textContent === '15 episodes'", timeout=15_000)
        assert errors == []
        chromium.close()
