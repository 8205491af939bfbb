"""``flexibuff-envs view``: the episode browser, served until Ctrl-C."""

from __future__ import annotations

import argparse
import errno
import webbrowser
from typing import Any

from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.view.data import Run
from flexibuff_envs.view.server import Browser

#: the port asked for by default
PORT = 8765


def add_view(commands: Any) -> None:
    """The ``view`` command, among ``commands``."""
    view = commands.add_parser(
        "view", help="browse recordings in a local web page: runs, episodes, an episode's timeline and frames"
    )
    view.add_argument(
        "paths", metavar="PATH", nargs="+", help="episode logs, buffer files, vaults or Parquet exports (only read)"
    )
    view.add_argument("--port", type=port, default=PORT, help=f"the port on 127.0.0.1 (default {PORT}; 0: a free one)")
    view.add_argument("--no-browser", action="store_true", help="serve without opening a browser")
    view.set_defaults(run=cmd_view)


def port(text: str) -> int:
    """A TCP port number, 0 to 65535 (argparse's type for ``--port``)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is no TCP port (0 to 65535)")
    return value


def cmd_view(args: argparse.Namespace) -> int:
    runs = [Run(path) for path in args.paths]  # a bad path: its one-line error, before anything is served
    try:
        server = Browser(runs, args.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise InvalidArgumentError(
                f"port {args.port} is in use: pass --port N, or --port 0 for a free one"
            ) from None
        raise
    print(
        f"serving {sum(len(r.table.lengths) for r in runs):,} episodes of {len(runs)} run(s) at {server.url} (Ctrl-C stops)"
    )
    if not args.no_browser:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
