"""The episode browser's screenshots in the docs (docs/images/view-*.png), made as a user would
see them: CartPole, connect four and pistonball recorded to logs (random actions, seed 0), served by
``flexibuff_envs.view`` and photographed in Debian's chromium through Playwright.

Run: python docs/view_screenshots.py
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
from pettingzoo.butterfly import pistonball_v6
from pettingzoo.classic import connect_four_v3
from playwright.sync_api import sync_playwright

import flexibuff_envs as fe
from flexibuff_envs.view.data import Run
from flexibuff_envs.view.server import Browser

IMAGES = Path(__file__).resolve().parent / "images"


def record(root: Path) -> list[str]:
    """Three logs in ``root``: 300 CartPole episodes, 200 connect four games, 3 pistonball
    episodes of 10 pistons."""
    env = fe.record(gym.make("CartPole-v1"), num_steps=5000, log=root / "cartpole")
    env.action_space.seed(0)
    for k in range(300):
        env.reset(seed=k)
        while not any(env.step(env.action_space.sample())[2:4]):
            pass
    env.close()
    games = fe.record(connect_four_v3.env(), num_steps=5000, log=root / "connect_four")
    rng = np.random.default_rng(0)
    for k in range(200):
        games.reset(seed=k)
        for _ in games.agent_iter():
            obs, _, terminated, truncated, _ = games.last()
            games.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"]))))
    games.close()
    pistons = fe.record(pistonball_v6.parallel_env(n_pistons=10, max_cycles=60), num_steps=200, log=root / "pistonball")
    for k in range(3):
        pistons.reset(seed=k)
        while pistons.agents:
            pistons.step({agent: rng.uniform(-1, 1, 1).astype(np.float32) for agent in pistons.agents})
    pistons.close()
    return [str(root / name) for name in ("cartpole", "connect_four", "pistonball")]


def main() -> None:
    root = Path(tempfile.mkdtemp())
    try:
        server = Browser([Run(path) for path in record(root)])
        threading.Thread(target=server.serve_forever, daemon=True).start()
        IMAGES.mkdir(exist_ok=True)
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = chromium.new_page(viewport={"width": 1280, "height": 800})
            page.goto(server.url)
            page.wait_for_selector("#episodes tbody tr")
            page.locator("#runs").screenshot(path=str(IMAGES / "view-runs.png"))
            page.click("th[data-sort=return]")
            page.wait_for_function("document.querySelector('th[data-sort=return]').classList.contains('sorted')")
            page.wait_for_timeout(300)
            page.locator("#table").screenshot(path=str(IMAGES / "view-episodes.png"))
            page.click("#episodes tbody tr >> nth=0")  # CartPole's best: its observation as small plots
            page.wait_for_selector("#observation-plots .small")
            page.wait_for_timeout(300)
            page.locator("#episode").screenshot(path=str(IMAGES / "view-vector.png"))
            page.select_option("#run-select", "2")
            page.wait_for_function("document.querySelector('#count').textContent === '3 episodes'")
            page.click("#episodes tbody tr >> nth=0")
            page.wait_for_selector("#observations canvas.frame")
            page.eval_on_selector("#step", "s => { s.value = 40; s.dispatchEvent(new Event('input')); }")
            page.wait_for_function("document.querySelector('#observations').dataset.step === '40'")
            page.locator("#episode").screenshot(path=str(IMAGES / "view-episode.png"))
            chromium.close()
        server.shutdown()
        print(f"wrote {', '.join(p.name for p in sorted(IMAGES.glob('view-*.png')))} in {IMAGES}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
