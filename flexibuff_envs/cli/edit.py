"""``flexibuff-envs filter``, ``split`` and ``drop``: new episode logs of chosen episodes of a
log or file (`integrations.editing`), the source only read."""

from __future__ import annotations

import argparse
import os
from typing import Any

from flexibuff_envs.errors import InvalidArgumentError


def add_edit(commands: Any) -> None:
    """The ``filter``, ``split`` and ``drop`` commands, among ``commands``."""
    filter_ = commands.add_parser("filter", help="a new log of the episodes a condition on their outcomes chooses")
    filter_.add_argument("source", metavar="SRC", help="an episode log or buffer file (only read)")
    filter_.add_argument("--out", required=True, metavar="DST", help="the new episode log")
    filter_.add_argument(
        "--where", required=True, metavar="EXPR", help="a condition, e.g. \"return > 100 and agent == 'piston_3'\""
    )
    filter_.set_defaults(run=cmd_filter)
    split = commands.add_parser("split", help="new logs of random shares of the episodes: train, val, test")
    split.add_argument("source", metavar="SRC", help="an episode log or buffer file (only read)")
    split.add_argument("--out", required=True, metavar="DIR", help="where the logs go: DIR/train, DIR/val, ...")
    for share in ("train", "val", "test"):
        split.add_argument(f"--{share}", type=float, metavar="FRACTION", help=f"the share of episodes in DIR/{share}")
    split.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    split.set_defaults(run=cmd_split)
    drop = commands.add_parser("drop", help="a new log of every episode but those named")
    drop.add_argument("source", metavar="SRC", help="an episode log or buffer file (only read)")
    drop.add_argument("--episodes", required=True, metavar="K,K,...", help="the episodes to leave out (numbers)")
    drop.add_argument("--out", required=True, metavar="DST", help="the new episode log")
    drop.set_defaults(run=cmd_drop)


def cmd_filter(args: argparse.Namespace) -> int:
    from flexibuff_envs.integrations.editing import select, where

    chosen = where(args.source, args.where)
    held = select(args.source, chosen, args.out, edit=f"filter {os.path.abspath(args.source)} where {args.where}")
    print(f"wrote {args.out}: {held:,} episodes where {args.where}")
    return 0


def cmd_split(args: argparse.Namespace) -> int:
    from flexibuff_envs.integrations.editing import split

    shares = {name: getattr(args, name) for name in ("train", "val", "test") if getattr(args, name) is not None}
    if not shares:
        raise InvalidArgumentError("split: give the shares, e.g. --train 0.9 --val 0.1")
    held = split(args.source, shares, args.out, seed=args.seed)
    print(f"wrote {', '.join(f'{os.path.join(args.out, name)} ({n:,} episodes)' for name, n in held.items())}")
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    from flexibuff_envs.integrations.editing import drop

    try:
        episodes = [int(k) for k in args.episodes.split(",") if k.strip()]
    except ValueError:
        raise InvalidArgumentError(f"--episodes {args.episodes!r}: give episode numbers, like 3,17") from None
    held = drop(args.source, episodes, args.out)
    print(f"wrote {args.out}: {held:,} episodes ({len(set(episodes))} left out)")
    return 0
