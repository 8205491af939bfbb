"""The episode browser's server: the standard library's threading HTTP server, bound to
127.0.0.1 only. It serves the page and its assets (a fixed list of files shipped in the package:
no path from a request ever reaches the file system) and a JSON API over the runs it was given,
which it only reads.

    GET /                               the page
    GET /static/<name>                  one of `ASSETS`
    GET /api/runs                       every run's summary (a log appended to is read again)
    GET /api/curves?run=&smooth=        a run's lines over episodes, thinned to what a chart draws
    GET /api/episodes?run=&sort=&desc=&agent=&ended=&least=&most=&seed=&offset=&limit=
    GET /api/episode?run=&episode=      an episode's timeline per agent (no observations read)
    GET /api/hash?run=&episode=         its content hash (reads the whole episode)
    GET /api/observations?run=&episode=&agent=   an agent's observation over the episode
    GET /api/frame?run=&episode=&step=&agent=
    GET /api/export?run=&episode=       the episode as a Parquet file
"""

from __future__ import annotations

import base64
import json
import math
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from flexibuff_envs.errors import FlexibuffError, OutOfRangeError, UnknownNameError
from flexibuff_envs.view.data import Run, episode_parquet

#: the files the page loads, by name: (file in the package, content type)
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
#: the host served: this machine only
HOST = "127.0.0.1"


class Browser(ThreadingHTTPServer):
    """The server of ``runs``; ``port`` 0 takes a free one (``server_address`` says which)."""

    daemon_threads = True

    def __init__(self, runs: list[Run], port: int = 0) -> None:
        self.runs = runs
        self.lock = threading.Lock()  # one request reads the runs at a time (a refresh replaces them)
        super().__init__((HOST, port), _Handler)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"


class _Handler(BaseHTTPRequestHandler):
    server: Browser

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the terminal is the user's."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        port = self.server.server_address[1]
        if self.headers.get("Host") not in (
            f"{HOST}:{port}",
            f"localhost:{port}",
        ):  # DNS rebinding: another site's page
            self._error(HTTPStatus.FORBIDDEN, "served to this machine's own addresses only")
            return
        try:
            if url.path == "/":
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", _asset("index.html"))
            elif url.path.startswith("/static/") and url.path[len("/static/") :] in ASSETS:
                name = url.path[len("/static/") :]
                self._send(HTTPStatus.OK, ASSETS[name], _asset(name))
            elif url.path == "/api/export":
                with self.server.lock:
                    run = self.server.runs[_index(query, "run", len(self.server.runs), 0)]
                    episode = _index(query, "episode", 1 << 62)
                    body = episode_parquet(run, episode)
                self._send(HTTPStatus.OK, "application/vnd.apache.parquet", body, f"episode-{episode}.parquet")
            elif url.path.startswith("/api/"):
                with self.server.lock:
                    body = self._api(url.path[len("/api/") :], query)
                self._send(HTTPStatus.OK, "application/json", _json(body))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {url.path}")
        except (FlexibuffError, ValueError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))

    def _api(self, name: str, query: dict[str, str]) -> Any:
        runs = self.server.runs
        if name == "runs":
            for run in runs:
                run.refresh()
            return [run.summary() for run in runs]
        run = runs[_index(query, "run", len(runs), 0)]
        if name == "curves":
            return run.curves(_index(query, "smooth", 100_001, 1, least=1))
        if name == "episodes":
            agent = query.get("agent", "")
            return run.episodes(
                sort=query.get("sort", "episode"),
                descending=query.get("desc", "0") == "1",
                agent=int(agent) if agent else None,
                ended=query.get("ended") or None,
                least=_number(query, "least"),
                most=_number(query, "most"),
                seed=_index(query, "seed", 1 << 63) if query.get("seed") else None,
                offset=_index(query, "offset", 1 << 62, 0),
                limit=_index(query, "limit", 1001, 50, least=1),
            )
        if name == "episode":
            return run.episode(_index(query, "episode", 1 << 62))
        if name == "hash":
            return {"hash": run.content_hash(_index(query, "episode", 1 << 62))}
        if name == "observations":
            return run.observations(
                _index(query, "episode", 1 << 62), _index(query, "agent", run.buffer.spec.n_agents, 0)
            )
        if name == "frame":
            frame = run.frame(
                _index(query, "episode", 1 << 62),
                _index(query, "step", 1 << 62),
                _index(query, "agent", run.buffer.spec.n_agents, 0),
            )
            if "pixels" in frame:
                frame["pixels"] = base64.b64encode(frame["pixels"]).decode()
            return frame
        raise UnknownNameError(f"no such API: {name}")

    def _send(self, status: HTTPStatus, kind: str, body: bytes, download: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        if download is not None:
            self.send_header("Content-Disposition", f'attachment; filename="{download}"')
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, "application/json", json.dumps({"error": message}).encode())


def _index(query: dict[str, str], key: str, count: int, default: int | None = None, *, least: int = 0) -> int:
    """The integer ``key`` of ``query`` (``default`` when absent), in ``[least, count)``."""
    text = query.get(key)
    if text is not None:
        value = int(text)
    elif default is not None:
        value = default
    else:
        raise UnknownNameError(f"the request needs {key}=")
    if not least <= value < count:
        raise OutOfRangeError(f"{key}={value} is out of range ({least} to {count - 1})")
    return value


def _number(query: dict[str, str], key: str) -> float | None:
    """The finite number ``key`` of ``query``, None when absent or empty."""
    text = query.get(key, "")
    if not text:
        return None
    value = float(text)
    if not math.isfinite(value):
        raise OutOfRangeError(f"{key}={text} is not a finite number")
    return value


def _json(body: Any) -> bytes:
    """``body`` as JSON, a value that is not finite (NaN, inf: JSON has none) as null."""
    try:
        return json.dumps(body, allow_nan=False).encode()
    except ValueError:  # seldom: walk it only then
        return json.dumps(_finite(body), allow_nan=False).encode()


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, inf) as None: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _asset(name: str) -> bytes:
    return resources.files("flexibuff_envs.view").joinpath("static").joinpath(name).read_bytes()
