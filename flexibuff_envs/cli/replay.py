"""``verify --replay``: each episode replayed in its env and compared with the recording
(`integrations.replay`)."""

from __future__ import annotations

import argparse
import time

from flexibuff_envs.cli.envs import UsageError
from flexibuff_envs.errors import InvalidArgumentError


def cmd_replay(args: argparse.Namespace) -> int:
    from flexibuff_envs.integrations.replay import parse_factory, replay

    try:
        env = parse_factory(args.env) if args.env else None
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from None
    try:
        episodes = None if args.episodes is None else [int(k) for k in args.episodes.split(",") if k.strip()]
    except ValueError:
        raise UsageError(f"--episodes must be episode numbers separated by commas, got {args.episodes!r}") from None
    start = time.perf_counter()
    try:
        report = replay(args.log, env=env, episodes=episodes)
    except InvalidArgumentError as exc:  # episodes the dataset does not hold
        raise UsageError(str(exc)) from None
    seconds = time.perf_counter() - start
    checked = len(report.clean) + len(report.divergences) + len(report.nondeterministic)
    print(f"{args.log}: {report.episodes:,} episodes; replayed {checked:,} in {seconds:.1f} s")
    if report.clean:
        print(f"{len(report.clean):,} replay exactly as recorded: every observation, reward, end flag, mask and state")
    for divergence in report.divergences:
        print(f"DIVERGES: {divergence}")
    if report.unchecked:
        print(
            f"not checked: {_listed(report.unchecked)} (after a divergence in their lane, the env's state already differed)"
        )
    if report.nondeterministic:
        print(
            f"not deterministic: {_listed(report.nondeterministic)} (two replays of the same seed and actions "
            "differ from each other, so the env's randomness is not all in its seed: not counted as divergences)"
        )
    reasons: dict[str, list[int]] = {}
    for k, why in sorted(report.skipped.items()):
        reasons.setdefault(why, []).append(k)
    for why, ks in reasons.items():
        print(f"cannot replay {_listed(ks)}: {why}")
    return 0 if report.ok else 1


def _listed(episodes: list[int]) -> str:
    shown = ", ".join(map(str, sorted(episodes)[:8]))
    more = f" and {len(episodes) - 8:,} more" if len(episodes) > 8 else ""
    return f"{'episode' if len(episodes) == 1 else 'episodes'} {shown}{more}"
