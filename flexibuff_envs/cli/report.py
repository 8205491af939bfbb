"""The text the command line prints about a buffer: its layout, episodes, returns and bytes."""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
from typing import Any

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.cli.envs import EnvChoice
from flexibuff_envs.integrations.tables import Summary
from flexibuff_envs.recording.rollout import Rollout
from flexibuff_envs.spec import BufferSpec

API_NAMES = {
    "gymnasium": "Gymnasium",
    "vector": "Gymnasium vector",
    "parallel": "PettingZoo parallel",
    "aec": "PettingZoo AEC",
}


def size(n: float) -> str:
    """``n`` bytes for a person: ``912 B``, ``17.2 kB``, ``1.4 MB``, ``2.1 GB``, ... ``43.0 EB``."""
    k = min(int(math.log10(max(n, 1)) // 3), 6)
    return f"{n:.0f} B" if k == 0 else f"{n / 1000**k:.1f} {('kB', 'MB', 'GB', 'TB', 'PB', 'EB')[k - 1]}"


def _line(key: str, text: str) -> str:
    return f"  {key:<9} {text}"


def record_report(
    choice: EnvChoice, rollout: Rollout, buffer: FlexibleBuffer, path: str, logged: tuple[int, int] | None = None
) -> str:
    """What a ``record`` run did and what it left: the report printed at the end (``logged``: the
    episodes and rows a run appended to the episode log ``path``)."""
    spec = buffer.spec
    stop = (
        ""
        if not rollout.interrupted
        else " (stopped by Ctrl-C)"
        if rollout.interrupted == signal.SIGINT
        else f" (stopped by {signal.Signals(rollout.interrupted).name})"
    )
    lines = [(f"recorded {choice.name} ({API_NAMES[choice.api]}, {_agents(spec)}) with random legal actions{stop}")]
    kept = buffer.n_episodes
    forgotten = (
        ""
        if kept >= rollout.episodes or logged is not None
        else f"; the ring kept the last {kept:,} whole (raise --capacity to keep more)"
    )
    lines.append(
        _line(
            "episodes",
            f"{rollout.episodes:,} ended, {rollout.steps:,} env steps in "
            f"{rollout.seconds:.2f} s ({rollout.steps / max(rollout.seconds, 1e-9):,.0f} "
            f"steps/s){forgotten}",
        )
    )
    if logged is not None and kept < logged[0]:
        lines.append(_line("newest", f"{kept:,} whole episodes, still in memory:"))
    lines += _episode_lines(buffer)
    lines.append(_line("layout", _layout(spec)))
    empty = buffer.num_steps * spec.n_envs - len(buffer)  # the rest is held rows and final observations
    lines.append(
        _line(
            "memory",
            f"{size(buffer.nbytes - buffer.nbytes_per_row * empty)} in {len(buffer):,} rows "
            f"({size(buffer.nbytes)} reserved for {buffer.num_steps:,} rows"
            f"{' per lane' if spec.n_envs > 1 else ''})",
        )
    )
    if logged is None:
        held = os.path.getsize(path)
        lines.append(_line("file", f"{os.path.abspath(path)} ({size(held)}, {_per_row(held, len(buffer))})"))
    else:
        from flexibuff_envs.log import report

        log = report(path)
        lines.append(
            _line(
                "log",
                f"{os.path.abspath(path)} ({size(log.nbytes)}, {_per_row(log.nbytes, log.rows)}): {logged[0]:,} "
                f"whole episodes and {logged[1]:,} rows appended",
            )
        )
    return "\n".join(lines)


def _per_row(nbytes: int, rows: int) -> str:
    """What a file of ``nbytes`` holding ``rows`` rows takes a step (a row: every agent's step)."""
    return f"{size(nbytes / max(rows, 1))} a step"


def inspect_report(path: str, buffer: FlexibleBuffer) -> str:
    """Everything a buffer file holds, without reading its rows into memory."""
    spec = buffer.spec
    lines = [
        (
            f"{path}: {size(os.path.getsize(path))} ({_per_row(os.path.getsize(path), len(buffer))}), "
            f"{_agents(spec)}, {spec.n_envs} lane{'s' if spec.n_envs > 1 else ''} x {buffer.num_steps:,} rows"
        )
    ]
    lines.append(_line("agents", ", ".join(spec.agent_ids)))
    lines.append(_line("obs", _obs(spec)))
    lines.append(_line("actions", _actions(spec)))
    lines.append(_line("masks", _masks(spec)))
    lines.append(_line("state", _state(spec)))
    lines += _held_lines(buffer)
    lines.append(_line("stored", _stored(path)))
    if spec.extra_fields:
        lines.append(
            _line("yours", ", ".join(f"{name} {list(shape)} {dtype}" for name, shape, dtype in spec.extra_fields))
        )
    if buffer.max_priority is not None:
        lines.append(_line("priority", f"alpha {buffer.alpha}, highest given {buffer.max_priority:g}"))
    return "\n".join([*lines, _seeds_line(buffer), *_session_lines(buffer.sessions)])


def _seeds_line(buffer: FlexibleBuffer) -> str:
    """How the episodes' envs were reset (`FlexibleBuffer.episode_origins`): what can be replayed."""
    origins = buffer.episode_origins()
    seeds = origins["seed"][origins["seed"] >= 0]
    shown = ", ".join(map(str, seeds[:5].tolist())) + (", ..." if seeds.size > 5 else "")
    return _line(
        "seeds",
        f"{seeds.size:,} episode{'s' if seeds.size != 1 else ''} reset with a seed ({shown or 'none'}), "
        f"{int(origins['follows'].sum()):,} "
        f"right after their lane's episode before, {int(np.isnan(origins['started']).sum()):,} of unknown origin",
    )


def _session_lines(sessions: list[dict[str, Any]]) -> list[str]:
    """A line per recording session (the first 20, the last 5 of more): who recorded what, from which env."""
    if not sessions:
        return [_line("recorded", "by no session this file knows of (made before flexibuff_envs kept them)")]
    shown = list(enumerate(sessions))
    if len(shown) > 25:
        shown = shown[:20] + shown[-5:]
    lines = []
    for k, s in shown:
        made = s["env_id"] or "an env made by hand"
        kwargs = f" {json.dumps(s['env_kwargs'])}" if s["env_kwargs"] else ""
        if s["api"] == "edit":  # a log an edit wrote (`integrations.editing`)
            made, kwargs = f"edited: {(s['env_kwargs'] or {}).get('edit', '')}", ""
        when = datetime.datetime.fromtimestamp(s["started"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        versions = ", ".join(f"{name} {version}" for name, version in s["versions"].items())
        first = f"from episode {s['first_episode']}, " if s["first_episode"] is not None else ""
        policy = f"policy {s['policy']!r}, " if s["policy"] else ""
        lines.append(
            _line(
                "recorded" if k == 0 else "",
                f"{first}{policy}{made}{kwargs} ({s['api']}), {when} on {s['host']} (pid {s['pid']}); {versions}",
            )
        )
        if s["wrappers"]:
            lines.append(_line("", f"  wrapped in {', '.join(w.rsplit('.', 1)[-1] for w in s['wrappers'])}"))
    if len(sessions) > 25:
        lines.insert(2 * 20, _line("", f"... {len(sessions) - 25} sessions more"))
    return lines


def _stored(path: str) -> str:
    """How the buffer file ``path`` stores its parts: each compressed one's bytes and ratio."""
    from flexibuff_envs.files.io import BufferFile

    with BufferFile(path) as file:
        metas = file.header.fields
    packed = []
    for meta in metas:
        if "codec" in meta:
            nbytes = int(np.prod(meta["shape"], dtype=np.int64)) * np.dtype(meta["dtype"]).itemsize
            name = meta["name"] + (f".{meta['part']}" if meta.get("part") else "")
            packed.append(
                f"{name} {size(meta['stored'])} of {size(nbytes)} ({nbytes / meta['stored']:,.0f}x, {meta['codec']})"
            )
    return ("; ".join(packed) + "; the rest raw") if packed else "every part raw"


def _log_stored(path: str) -> str:
    """How the log ``path`` stores its columns: each compressed one's bytes and ratio."""
    from flexibuff_envs.log.read import state_of

    state = state_of(path)
    packed = []
    for column in state.columns:
        if column.codec is not None:
            stored = state.frames_end(column) + state.commit.length(column)
            nbytes = state.commit.count(column) * column.row_bytes
            name = column.name + (f".{column.part}" if column.part else "")
            packed.append(f"{name} {size(stored)} of {size(nbytes)} ({nbytes / max(stored, 1):,.0f}x, {column.codec})")
    return ("; ".join(packed) + "; the rest raw") if packed else "every column raw"


def inspect_log_report(path: str) -> str:
    """What an episode log holds, its columns mapped (the rows a report reads, not the log, cost
    memory)."""
    from flexibuff_envs.log import report

    buffer = FlexibleBuffer.open(path)  # first: it folds what a killed recording left in the journal
    logged = report(path)
    spec = buffer.spec
    lines = [f"{path}: episode log, {size(logged.nbytes)} ({_per_row(logged.nbytes, logged.rows)}), {_agents(spec)}"]
    lines.append(_line("agents", ", ".join(spec.agent_ids)))
    lines.append(_line("layout", _layout(spec)))
    lines += _held_lines(buffer)
    lines.append(_line("stored", _log_stored(path)))
    if logged.live:
        lines.append(_line("writer", "open: a recording appends to it (readers see what it had folded)"))
    lines += [_seeds_line(buffer), *_session_lines(buffer.sessions)]
    for torn in logged.torn:
        lines.append(
            _line(
                "torn",
                f"{torn.size:,} bytes at the end of {os.path.basename(torn.path)}, "
                f"left out (flexibuff-envs repair {path} cuts them)",
            )
        )
    return "\n".join(lines)


def inspect_dataset_report(path: str, summary: Summary) -> str:
    """What a vault or Parquet dataset holds (`flexibuff_envs.integrations.tables.Summary`)."""
    return "\n".join(
        [
            f"{path}: {summary.kind}, {len(summary.agents)} agent{'s' if len(summary.agents) != 1 else ''}",
            _line("agents", ", ".join(summary.agents)),
            _line(
                "rows",
                f"{summary.steps:,} steps, {summary.episodes:,} whole episode{'' if summary.episodes == 1 else 's'}",
            ),
            _line("fields", ", ".join(f"{name} {what}" for name, what in summary.fields.items())),
            *_session_lines(list(summary.sessions)),
        ]
    )


def _held_lines(buffer: FlexibleBuffer) -> list[str]:
    """The discounts, rows, episodes and fields a file or a log holds, a line each."""
    whole = buffer.n_episodes
    return [
        _line("returns", f"gamma {buffer.gamma}, gae_lambda {buffer.gae_lambda}"),
        _line("rows", f"{len(buffer):,} held, {whole:,} whole episode{'' if whole == 1 else 's'}"),
        *_episode_lines(buffer),
        _line("fields", ", ".join(buffer.fields)),
    ]


def _agents(spec: BufferSpec) -> str:
    return f"{spec.n_agents} agent{'s' if spec.n_agents > 1 else ''}"


def _obs(spec: BufferSpec) -> str:
    shape = "x".join(map(str, spec.obs_shape)) if len(spec.obs_shape) > 1 else ""
    text = f"{spec.obs_size} x {spec.obs_dtype}" + (f" (shape {shape})" if shape else "")
    if len(set(spec.agent_obs_sizes)) > 1:
        text += ", per agent " + ", ".join(f"{a} {n}" for a, n in zip(spec.agent_ids, spec.agent_obs_sizes))
    return text


def _actions(spec: BufferSpec) -> str:
    parts = []
    if spec.discrete_action_cardinalities:
        parts.append(f"discrete heads {list(spec.discrete_action_cardinalities)}")
    if spec.continuous_action_dimension:
        parts.append(f"{spec.continuous_action_dimension} continuous")
    if len(set(spec.agent_discrete_action_cardinalities)) > 1:
        parts.append(
            "per agent "
            + ", ".join(f"{a} {list(c)}" for a, c in zip(spec.agent_ids, spec.agent_discrete_action_cardinalities))
        )
    return ", ".join(parts) or "none"


def _masks(spec: BufferSpec) -> str:
    return "yes" if spec.action_mask else "no"


def _state(spec: BufferSpec) -> str:
    return "no" if spec.state_size is None else f"{spec.state_size} x {spec.state_dtype}"


def _layout(spec: BufferSpec) -> str:
    return f"obs {_obs(spec)}, actions {_actions(spec)}, masks {_masks(spec)}, state {_state(spec)}"


def _episode_lines(buffer: FlexibleBuffer) -> list[str]:
    stats = buffer.episode_stats()
    lengths, returns = stats["lengths"], stats["returns"]
    if not len(lengths):
        return [_line("length", "no whole episode in the buffer")]
    return _stat_lines(lengths, returns, buffer.spec)


def _stat_lines(lengths: np.ndarray, returns: np.ndarray | None, spec: BufferSpec) -> list[str]:
    """Episode lengths and each agent's returns (``[episodes, agents]``), a line each."""
    lines = [_line("length", f"mean {lengths.mean():.1f} rows (min {lengths.min()}, max {lengths.max()})")]
    width = max(map(len, spec.agent_ids))
    for key, agent, r in zip(["return"] + [""] * spec.n_agents, spec.agent_ids, [] if returns is None else returns.T):
        lines.append(
            _line(
                key,
                f"{agent:<{width}}  mean {r.mean():+.3g}  std {np.std(r):.3g}  min {r.min():+.3g}  max {r.max():+.3g}",
            )
        )
    return lines
