"""The commands on what was recorded: ``inspect``, ``plot``, ``export`` (Minari, vaults, Parquet),
``verify``, ``repair`` and ``merge`` of buffer files and episode logs."""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import warnings
from typing import Any

import flexibuff_envs as fe
from flexibuff_envs.cli.envs import UsageError, make, resolve
from flexibuff_envs.cli.report import (
    inspect_dataset_report,
    inspect_log_report,
    inspect_report,
    size,
)


def cmd_inspect(args: argparse.Namespace) -> int:
    path = args.file
    if args.hashes:  # one a line, numbered as the view and the card number them: `diff` compares two datasets
        from flexibuff_envs.view.data import Run

        for k, digest in enumerate(Run(path).buffer.episode_hashes()):
            print(f"{k}\t{digest}")
        return 0
    if args.card is not None:
        from flexibuff_envs.cli.card import card

        text = card(path)
        if args.card == "-":
            print(text, end="")
            return 0
        with open(args.card, "w") as out:
            out.write(text)
        print(f"wrote {args.card}: the dataset card of {path}")
        return 0
    if not os.path.isdir(path):
        print(inspect_report(path, fe.FlexibleBuffer.load(path, mmap=True)))
        return 0
    from flexibuff_envs.log import is_log

    if is_log(path):
        print(inspect_log_report(path))
        return 0
    vault = _vault_in(path)
    if vault is not None:
        from flexibuff_envs.integrations.vault import summary

        print(inspect_dataset_report(vault, summary(vault)))
    elif os.path.isdir(os.path.join(path, "agents")):
        from flexibuff_envs.integrations.parquet import summary as parquet_summary

        print(inspect_dataset_report(path, parquet_summary(path)))
    else:
        raise fe.BufferFileError(
            f"{path}: neither an episode log, a flashbax vault nor a Parquet dataset of flexibuff_envs"
        )
    return 0


def _vault_in(path: str) -> str | None:
    """The vault ``path`` is, or the one vault under it (``vault_uid`` or ``vault_name/vault_uid``),
    or None; several under it are a usage error naming them."""
    found = [
        d
        for d in [
            path,
            *sorted(glob.glob(os.path.join(glob.escape(path), "*"))),
            *sorted(glob.glob(os.path.join(glob.escape(path), "*", "*"))),
        ]
        if os.path.isfile(os.path.join(d, "metadata.json"))
    ]
    if len(found) > 1 and found[0] != path:
        raise UsageError(f"{path} holds {len(found)} vaults; name one: {', '.join(found)}")
    return found[0] if found else None


def cmd_plot(args: argparse.Namespace) -> int:
    from flexibuff_envs.cli.plot import plot_buffer

    out = args.out or os.path.splitext(os.path.normpath(args.file))[0] + ".png"
    buffer = _opened(args.file, mmap=True)
    plot_buffer(buffer, out, title=os.path.basename(args.file))
    print(f"wrote {out}: returns of {buffer.n_episodes} episodes for {buffer.spec.n_agents} agent(s)")
    return 0


#: what Minari asks a dataset for, as ``export`` flags: keyword -> flag
DATASET_CREDITS = {"author": "--author", "author_email": "--author-email", "code_permalink": "--code-permalink"}


def _opened(path: str, *, mmap: bool) -> fe.FlexibleBuffer:
    """The buffer file or episode log ``path``, mapped or read (and checked) whole."""
    if os.path.isdir(path):
        return fe.FlexibleBuffer.open(path, mmap=mmap)
    return fe.FlexibleBuffer.load(path, mmap=mmap)


def cmd_export(args: argparse.Namespace) -> int:
    if args.vault is not None:
        from flexibuff_envs.integrations.vault import to_vault

        name = args.vault_name or os.path.splitext(os.path.basename(os.path.normpath(args.file)))[0] + ".vlt"
        path = to_vault(
            _opened(args.file, mmap=True),
            args.vault,
            vault_name=name,
            vault_uid=args.vault_uid,
            compression=args.compression,
            next_values=args.next_values,
        )
        print(
            f"wrote vault {path}: flashbax reads it as Vault({name!r}, rel_dir={args.vault!r}, "
            f"vault_uid={os.path.basename(path)!r})"
        )
        return 0
    if args.parquet is not None:
        from flexibuff_envs.integrations.parquet import to_parquet

        print(
            f"wrote Parquet dataset {to_parquet(_opened(args.file, mmap=True), args.parquet)}: tables agents/ "
            "and steps/"
        )
        return 0
    return _export_minari(args)


def _export_minari(args: argparse.Namespace) -> int:
    from flexibuff_envs.integrations.minari import to_minari, to_minari_agents

    buffer = _opened(args.file, mmap=False)
    ids = buffer.spec.agent_ids
    if args.all_agents and args.agent is not None:
        raise UsageError("--all-agents writes every agent's dataset; drop --agent NAME")
    if buffer.spec.n_agents > 1 and not args.all_agents and args.agent not in ids:
        raise UsageError(
            f"{args.file} holds {len(ids)} agents ({', '.join(ids)}) and a Minari dataset holds one: "
            + (
                "pass --agent NAME, or --all-agents for one dataset per agent"
                if args.agent is None
                else f"--agent {args.agent} is none of them"
            )
        )
    credits = {key: getattr(args, key) for key in DATASET_CREDITS if getattr(args, key) is not None}
    if args.description is not None:
        credits["description"] = args.description
    env = None
    if args.env is not None:
        choice = resolve(args.env, api=None, num_envs=1)
        env = make(choice, num_envs=1, kwargs={})
    with warnings.catch_warnings():  # Minari's own warnings about missing credits: one note below instead
        warnings.filterwarnings("ignore", message=r"`(author|author_email|code_permalink)` is set to None")
        try:
            if args.all_agents:
                namespace, version = _namespace(args.minari)
                datasets = to_minari_agents(buffer, namespace, env, version=version, **credits)
            else:
                datasets = {args.agent: to_minari(buffer, args.minari, env, agent=args.agent, **credits)}
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    for dataset in datasets.values():
        print(
            f"wrote Minari dataset {dataset.spec.dataset_id}: {dataset.total_episodes} episodes, "
            f"{dataset.total_steps} steps"
        )
    missing = [flag for key, flag in DATASET_CREDITS.items() if key not in credits]
    if missing:
        print(
            f"flexibuff-envs export: note: Minari asks datasets to say who made them; pass {', '.join(missing)}",
            file=sys.stderr,
        )
    return 0


def _namespace(name: str) -> tuple[str, int]:
    """``--minari NAME --all-agents``: the namespace and version, from ``spread/recorded`` or
    ``spread/recorded-v2``."""
    match = re.fullmatch(r"(.+)-v(\d+)", name)
    return (match[1], int(match[2])) if match else (name, 0)


def cmd_verify(args: argparse.Namespace) -> int:
    from flexibuff_envs import log

    if args.replay:
        from flexibuff_envs.cli.replay import cmd_replay

        return cmd_replay(args)
    if args.env or args.episodes:
        raise UsageError("--env and --episodes go with --replay")

    report = log.verify(args.log)
    print(f"{args.log}: {report.episodes:,} whole episodes, {report.rows:,} rows, every checksum holds")
    if report.unfolded:
        print(
            f"{report.unfolded:,} of those episodes are in its journal, not yet in its columns (a recording "
            "that is running, or was killed: opening, resuming or repairing the log folds them)"
        )
    if report.staged:
        print(
            f"{report.staged:,} vector steps are staged by a vector recorder that was killed: the episodes that "
            "ended in them are not counted above (opening, resuming or repairing the log replays them)"
        )
    if report.live:
        print(
            "a writer has it open: what lies past its newest commit and record is the writer's own (its "
            "reserved blocks, or an append under way), checked here once it closes"
        )
    if report.torn:
        files = ", ".join(os.path.basename(torn.path) for torn in report.torn)
        print(
            f"torn tail: {sum(torn.size for torn in report.torn):,} bytes past the last whole append, left by a "
            f"writer that was killed or a crash ({files}); readers leave them out, and opening or resuming the "
            f"log, or `flexibuff-envs repair {args.log}`, cuts them"
        )
    return 1 if report.torn else 0


def cmd_repair(args: argparse.Namespace) -> int:
    from flexibuff_envs import log

    report = log.repair(args.log)
    cut = "; ".join(f"cut {torn.size:,} torn bytes from {os.path.basename(torn.path)}" for torn in report.torn)
    print(f"{args.log}: {report.episodes:,} whole episodes kept, every one in its columns; {cut or 'nothing to cut'}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from flexibuff_envs import log

    before = log.report(args.out).episodes if log.is_log(args.out) else 0
    report = log.merge(args.logs, args.out)
    print(
        f"{args.out}: {report.episodes - before:,} whole episodes appended from {len(args.logs)} log(s); it holds "
        f"{report.episodes:,} episodes and {report.rows:,} rows ({size(report.nbytes)})"
    )
    return 0


def add_export(commands: Any) -> None:
    """The ``export`` command, among ``commands``."""
    export = commands.add_parser(
        "export",
        help="write the whole episodes of a buffer file or episode log as a "
        "Minari dataset, a flashbax vault or Parquet tables",
    )
    export.add_argument("file")
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--minari",
        metavar="DATASET_ID",
        help="the dataset id, like cartpole/recorded-v0 (pip install -e '.[minari]')",
    )
    target.add_argument(
        "--vault",
        metavar="DIR",
        help="a flashbax vault in OG-MARL's layout, under DIR (flashbax's rel_dir; pip install -e '.[vault]')",
    )
    target.add_argument(
        "--parquet",
        metavar="DIR",
        help="Parquet tables in the new directory DIR (pip install -e '.[parquet]')",
    )
    export.add_argument("--vault-name", help="the vault's name (default: FILE's name with .vlt)")
    export.add_argument(
        "--next-values",
        choices=["all", "sparse"],
        default="all",
        help="the vault's next observations at every step (default), or only where the next step's differ (sparse)",
    )
    export.add_argument("--vault-uid", help="the vault's uid (default: the time, as flashbax names it)")
    export.add_argument(
        "--compression",
        choices=["lz4", "zstd", "gzip", "none"],
        default="lz4",
        help="the vault's compressor: lz4 (default) writes fastest, zstd smallest, gzip as flashbax does by default",
    )
    export.add_argument(
        "--env",
        help="the env the buffer recorded, as record takes it: its spaces, and Minari's "
        "record of a Gymnasium env (default: spaces rebuilt from the buffer's layout)",
    )
    export.add_argument("--agent", help="for a multi-agent buffer: the agent to export (a dataset per agent)")
    export.add_argument(
        "--all-agents",
        action="store_true",
        help="one Minari dataset per agent, NAME/AGENT-v0 each, under the namespace --minari NAME",
    )
    export.add_argument("--author", help="who made the dataset (Minari's author)")
    export.add_argument("--author-email", help="how to reach them (Minari's author_email)")
    export.add_argument("--code-permalink", help="a link to the code that recorded it (Minari's code_permalink)")
    export.add_argument("--description", help="what the dataset holds (default: the episodes recorded)")
    export.set_defaults(run=cmd_export)
