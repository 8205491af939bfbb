"""flexibuff-envs: record any Gymnasium or PettingZoo env, then inspect or plot what was kept.

"flexibuff-envs record [ENV]" plays ENV with random legal actions through its recorder into an
episode log (or a buffer file); "inspect PATH" describes a log, a buffer file, a vault or a
Parquet dataset; "plot PATH" draws its episodes; "export PATH" writes it as Minari, a vault or
Parquet; "verify DIR" and "repair DIR" check a log and cut a torn tail ("verify --replay PATH"
replays each episode in its env); "merge DIR... --out DIR"
appends logs to one; "view PATH..." browses them in a local web page. Bad input is one line on
stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn

import flexibuff_envs as fe
from flexibuff_envs.buffer import rows_that_fit
from flexibuff_envs.cli.disk import guarded
from flexibuff_envs.cli.edit import add_edit
from flexibuff_envs.cli.envs import DEFAULT_ENV, UsageError, make, resolve, wrapped
from flexibuff_envs.cli.files import add_export, cmd_inspect, cmd_merge, cmd_plot, cmd_repair, cmd_verify
from flexibuff_envs.cli.report import record_report
from flexibuff_envs.cli.view import add_view
from flexibuff_envs.recording.rollout import Budget, play, progress_bar

DEFAULT_EPISODES = 100
DEFAULT_CAPACITY = 100_000
#: rows per sub-env a log's ring holds at least (else twice the longest episode the env allows)
LOG_RING = 1_000
#: bytes the buffer may reserve when neither --steps nor --capacity sizes it
MEMORY_BUDGET = 2 << 30


#: what ``timeout``, ``docker stop``, SLURM and a closed terminal send: a recording stops as at Ctrl-C
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a recording: handled as Ctrl-C is (the run stops, what was
    recorded is saved), with the signal's number for the exit status (128 + it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def _handled(handlers: dict[int, Any]) -> Iterator[None]:
    """Each signal's handler of ``handlers`` while the block runs, then the handlers before."""
    previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (it prints the whole usage block by default)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def cmd_record(args: argparse.Namespace) -> int:
    choice = resolve(args.env, api=args.api, num_envs=args.num_envs)
    out = args.out or _new_log(choice.label)
    to_log = not out.endswith(".fbuf")  # a directory: an episode log, appended to as episodes end
    _writable(out, log=to_log, resume=args.resume)
    try:
        env = wrapped(make(choice, num_envs=args.num_envs, kwargs=args.env_kwargs or {}), args.wrap or [])
    except UsageError:
        raise
    except Exception as exc:  # whatever the env's constructor raises is about the user's input
        raise UsageError(f"could not make {args.env}: {type(exc).__name__}: {exc}") from exc
    budget = Budget(steps=args.steps) if args.steps else Budget(episodes=args.episodes or DEFAULT_EPISODES)
    spec = fe.infer_spec(env)
    longest = _longest_episode(env)
    if args.capacity:
        capacity = args.capacity
    elif to_log and longest is not None:  # the ring only holds episodes until they end and go to the log
        capacity = min(max(2 * longest, LOG_RING), _default_capacity(spec, None))
    else:
        capacity = _default_capacity(spec, None if to_log else args.steps)
    if longest is not None and longest > capacity:
        print(
            f"flexibuff-envs record: note: the buffer holds {capacity:,} rows per sub-env, but an episode "
            f"of {choice.label} may last {longest:,} rows; longer episodes are not kept whole. "
            f"Pass --capacity {longest} to keep them",
            file=sys.stderr,
        )
    seed = _resumed_seed(out, args.seed) if args.resume else args.seed
    try:  # seeded, so that the same command writes the same rows (its session says when and where)
        buffer = fe.FlexibleBuffer.from_spec(spec, num_steps=capacity, gamma=args.gamma, seed=seed)
    except MemoryError as exc:
        raise UsageError(f"a buffer of {capacity:,} rows does not fit in memory; pass a smaller --capacity") from exc
    if to_log:
        buffer.log_to(out)
    kwargs = (args.env_kwargs or {}) if choice.api in ("parallel", "aec") else None  # Gymnasium's spec says them
    recorder = fe.record(env, buffer, policy="random legal actions", env_kwargs=kwargs)  # said in its session
    bar, progress = progress_bar(budget, choice.label)
    if not args.force:  # does the run fit the disk? said once the first episode has ended
        where = out if to_log else os.path.dirname(os.path.abspath(out))
        kept = None if to_log else capacity * spec.n_envs
        progress = guarded(progress, budget, step_bytes=buffer.nbytes_per_row, where=where, kept=kept, out=out)
    noted: list[int] = []
    # once the run stops a signal is noted, not obeyed, so the save of what was recorded finishes
    with _handled(dict.fromkeys((signal.SIGINT, *STOP_SIGNALS), lambda signum, frame: noted.append(signum))):
        try:
            with _handled({signal.SIGINT: signal.default_int_handler, **dict.fromkeys(STOP_SIGNALS, _stop)}):
                rollout = play(recorder, choice.api, seed=seed, budget=budget, progress=progress)
            if rollout.interrupted:  # the running episodes are kept, cut where they stand
                recorder.truncate()
        finally:
            bar.close()
            recorder.close()
            logged = buffer.close_log()
        if rollout.episodes and not (logged[0] if to_log else buffer.n_episodes):
            raise fe.FlexibuffError(
                f"no episode fit whole in the buffer's {capacity:,} rows per sub-env "
                f"({rollout.episodes:,} ended), so nothing was {'logged' if to_log else 'saved'}; "
                f"pass a larger "
                f"--capacity (the longest episode's rows or more)"
            )
        path = out if to_log else buffer.save(out)
    print(record_report(choice, rollout, buffer, path, logged if to_log else None))
    stopped_by = rollout.interrupted or (noted[0] if noted else 0)
    return 128 + stopped_by if stopped_by else 0


def _new_log(label: str) -> str:
    """``./<env>.log``, or ``./<env>-2.log``, ... if that is taken: a run never continues another
    one's log unless asked (``--out DIR --resume``)."""
    candidates = (f"{label}.log" if k == 1 else f"{label}-{k}.log" for k in itertools.count(1))
    return next(path for path in candidates if not os.path.exists(path))


def _resumed_seed(out: str, seed: int) -> int:
    """The seed of a run that continues the log ``out``: drawn from ``seed`` and the episodes the
    log holds, so that it never replays the seeds of the runs before it (said on stderr)."""
    from numpy.random import SeedSequence

    from flexibuff_envs.log import report

    episodes = report(out).episodes if os.path.isdir(out) else 0
    if not episodes:
        return seed
    resumed = int(SeedSequence([seed, episodes]).generate_state(1)[0])
    print(
        f"flexibuff-envs record: note: {out} holds {episodes:,} episodes; this run goes on with seed "
        f"{resumed} (drawn from --seed {seed} and that count), so it repeats none of them",
        file=sys.stderr,
    )
    return resumed


def _writable(out: str, *, log: bool, resume: bool) -> None:
    """Check that ``out`` can be written (its missing directories made, a file made and removed
    where the save or the log will write): a long run must not end in a failed save. A log's
    directory may hold a log only to resume it."""
    if log:
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out} is a file; an episode log is a directory (a buffer file ends in .fbuf)")
        from flexibuff_envs.log import is_log

        if is_log(out) and not resume:
            raise UsageError(f"--out {out} holds an episode log already; pass --resume to continue it")
        if os.path.isdir(out) and os.listdir(out) and not is_log(out):
            raise UsageError(
                f"--out {out} is a directory holding other files; give a new directory for an "
                "episode log, or a file name ending in .fbuf"
            )
    elif resume:
        raise UsageError("--resume continues an episode log: give --out a directory")
    elif os.path.isdir(out):
        raise UsageError(f"--out {out} is a directory; a buffer file (.fbuf) is written as a file: give a file name")
    target = os.path.abspath(out) if log else os.path.dirname(os.path.abspath(out))
    parent = target
    while not os.path.isdir(parent):  # the directories still to make are made when recording starts
        if os.path.exists(parent):
            raise UsageError(f"--out {out}: {parent} is a file, not a directory")
        parent = os.path.dirname(parent)
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{os.path.basename(out)}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write in {parent} ({exc.strerror or exc})") from None


def _default_capacity(spec: fe.BufferSpec, steps: int | None) -> int:
    """Rows per lane: all of ``steps``, else as many as fit in MEMORY_BUDGET with what a buffer
    reserves besides its rows (at most 100,000)."""
    if steps:
        return math.ceil(steps / spec.n_envs)
    probe = fe.FlexibleBuffer.from_spec(spec, num_steps=1)
    per_row = probe.nbytes_per_row * spec.n_envs
    return min(DEFAULT_CAPACITY, rows_that_fit(per_row, MEMORY_BUDGET - (probe.nbytes - per_row)))


def _longest_episode(env: Any) -> int | None:
    """The most rows an episode of ``env`` can take, where the env says (a Gymnasium time limit,
    a PettingZoo env's ``max_cycles``), else None."""
    limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
    unwrapped = getattr(env, "unwrapped", env)
    return limit if isinstance(limit, int) else getattr(unwrapped, "max_cycles", None)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _gamma(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object like '{{\"max_cycles\": 50}}', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="flexibuff-envs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {fe.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    rec = commands.add_parser("record", help="record an env with random legal actions and save the buffer")
    rec.add_argument(
        "env",
        nargs="?",
        default=DEFAULT_ENV,
        help="Gymnasium id (CartPole-v1), PettingZoo id (classic/tictactoe-v3) or module "
        f"(mpe2.simple_spread_v3); default {DEFAULT_ENV}, a game with action masks",
    )
    budget = rec.add_mutually_exclusive_group()
    budget.add_argument("--episodes", type=_positive, help=f"episodes to record (default {DEFAULT_EPISODES})")
    budget.add_argument("--steps", type=_positive, help="env steps to record instead (all sub-envs count)")
    rec.add_argument(
        "--out",
        help="a directory: an episode log every episode is appended to as it ends, in "
        "flat memory (default ./<env name>.log, or -2.log, ... if taken); or a file "
        "ending in .fbuf that the whole recording is saved to at the end; missing "
        "directories are created",
    )
    rec.add_argument("--resume", action="store_true", help="continue the episode log --out names")
    rec.add_argument(
        "--force",
        action="store_true",
        help="record even when the run, projected from its first episode, would not fit the free disk space",
    )
    rec.add_argument("--seed", type=int, default=0, help="seed of the env and of the random actions (default 0)")
    rec.add_argument(
        "--num-envs",
        type=_positive,
        default=1,
        help="Gymnasium sub-envs stepped together through a vector env (default 1)",
    )
    rec.add_argument("--gamma", type=_gamma, default=0.99, help="discount of the recorded returns G (default 0.99)")
    rec.add_argument(
        "--env-kwargs", type=_json_object, metavar="JSON", help="keywords for the env's constructor, as a JSON object"
    )
    rec.add_argument(
        "--wrap",
        action="append",
        metavar="WRAPPER",
        help="a wrapper around the env: module.Name, or module.Name:JSON keywords; repeated: innermost first",
    )
    rec.add_argument(
        "--api",
        choices=("aec", "parallel"),
        help="PettingZoo API to record through (default: parallel when the env has one)",
    )
    rec.add_argument(
        "--capacity",
        type=_positive,
        metavar="ROWS",
        help=f"buffer rows per sub-env (default: --steps, else {DEFAULT_CAPACITY:,} or what "
        f"fits in {MEMORY_BUDGET >> 30} GiB); when full, the oldest episodes are "
        "forgotten whole",
    )
    rec.set_defaults(run=cmd_record)

    ins = commands.add_parser("inspect", help="describe a saved buffer, an episode log, a vault or a Parquet dataset")
    ins.add_argument("file")
    ins.add_argument("--card", metavar="FILE", help="write a dataset card (a Markdown README) to FILE; - prints it")
    ins.add_argument("--hashes", action="store_true", help="print each episode's content hash, one a line")
    ins.set_defaults(run=cmd_inspect)

    plot = commands.add_parser("plot", help="plot a saved buffer's episode returns and lengths to a PNG")
    plot.add_argument("file")
    plot.add_argument("--out", metavar="PNG", help="image to write (default: FILE with .png)")
    plot.set_defaults(run=cmd_plot)

    add_export(commands)
    add_edit(commands)

    verify = commands.add_parser(
        "verify", help="check an episode log's commits and checksums (--replay: replay each episode); exit 1 if not"
    )
    verify.add_argument("log", metavar="PATH")
    verify.add_argument("--replay", action="store_true", help="replay each episode in its env and compare")
    verify.add_argument("--env", metavar="MODULE:FACTORY", help="makes the env to replay in (an env made by hand)")
    verify.add_argument("--episodes", metavar="K,K", help="replay these episodes (and those they follow)")
    verify.set_defaults(run=cmd_verify)
    repair = commands.add_parser("repair", help="cut a torn tail off an episode log, keeping every whole episode")
    repair.add_argument("log", metavar="DIR")
    repair.set_defaults(run=cmd_repair)
    merge = commands.add_parser("merge", help="append the whole episodes of episode logs to one (made, or continued)")
    merge.add_argument("logs", metavar="DIR", nargs="+", help="the logs to merge, in order (only read)")
    merge.add_argument("--out", required=True, metavar="DIR", help="the log they are appended to")
    merge.set_defaults(run=cmd_merge)
    add_view(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except UsageError as exc:
        print(f"flexibuff-envs {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `flexibuff-envs inspect FILE | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error when Python flushes
        return 141
    except (fe.FlexibuffError, OSError) as exc:
        print(f"flexibuff-envs {args.command}: {exc}", file=sys.stderr)
        return 1
