"""``flexibuff-envs inspect PATH --card FILE``: a dataset card, a README in Markdown for a
Hugging Face or Minari dataset page: the env, the spaces, the episodes and their returns per
agent, how they ended, the sessions that recorded them, and how to load it."""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

import numpy as np

from flexibuff_envs.cli.report import API_NAMES, _actions, _masks, _obs, _state, size
from flexibuff_envs.view.data import ENDINGS, Run


def card(path: str) -> str:
    """The card of the recording ``path`` (a log, a buffer file, a vault or a Parquet export)."""
    run = Run(path)
    buffer, table = run.buffer, run.table
    spec, sessions = buffer.spec, buffer.sessions
    name = os.path.basename(os.path.normpath(path))
    envs = sorted({s["env_id"] for s in sessions if s["env_id"]})
    env = ", ".join(f"`{e}`" for e in envs) or "an env made by hand"
    api = API_NAMES.get(spec.env_api, "unknown API")
    steps = int(table.lengths.sum())
    nbytes = (
        sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
        if os.path.isdir(path)
        else os.path.getsize(path)
    )
    tags = ["reinforcement-learning", "flexibuff_envs", *(e.rsplit(".", 1)[-1] for e in envs)]
    lines = [
        "---",
        "task_categories:",
        "- reinforcement-learning",
        "tags:",
        *(f"- {json.dumps(tag)}" for tag in tags),
        "---",
        "",
        f"# {name}",
        "",
        (
            f"{len(table.lengths):,} episodes ({steps:,} steps) of {env} ({api}, {len(spec.agent_ids)} "
            f"agent{'s' if len(spec.agent_ids) != 1 else ''}), recorded with flexibuff_envs by the sessions "
            f"listed below. A {run.kind} of {size(nbytes)}."
        ),
        "",
        "## Layout",
        "",
        "| | |",
        "| --- | --- |",
        f"| agents | {', '.join(spec.agent_ids)} |",
        f"| observation | {_obs(spec)} |",
        f"| actions | {_actions(spec)} |",
        f"| action masks | {_masks(spec)} |",
        f"| global state | {_state(spec)} |",
        f"| fields | {', '.join(buffer.fields)} |",
        f"| discount | gamma {buffer.gamma}, GAE lambda {buffer.gae_lambda} (`G` is the discounted return) |",
        "",
        "## Episodes",
        "",
        *_episodes(run),
        "",
        "## Provenance",
        "",
        _seeds(run),
        "",
        *_sessions(sessions),
        "",
        "## Loading",
        "",
        "```python",
        *_loader(run.kind, name),
        "batch = buffer.sample_transitions(256)  # or sample_episodes, sample_sequences, minibatches",
        "```",
        "",
        f"Card written by `flexibuff-envs inspect {name} --card` on {datetime.date.today()}.",
    ]
    return "\n".join(lines) + "\n"


def _seeds(run: Run) -> str:
    """How the episodes' envs were reset: what `verify --replay` can replay."""
    origins = run.buffer.episode_origins()
    seeded, follows = int((origins["seed"] >= 0).sum()), int(origins["follows"].sum())
    unknown = int(np.isnan(origins["started"]).sum())
    return (
        f"Of the {len(origins['seed']):,} episodes, {seeded:,} were reset with a seed they keep and {follows:,} "
        f"without one right after their lane's episode before ({unknown:,} of unknown origin): "
        f"`flexibuff-envs verify --replay` replays those from their seed and recorded actions and compares them."
    )


def _episodes(run: Run) -> list[str]:
    t = run.table
    if not len(t.lengths):
        return ["No episode has ended whole."]
    counts = np.bincount(t.ended, minlength=len(ENDINGS))
    ended = ", ".join(f"{n:,} {ending}" for ending, n in zip(ENDINGS, counts.tolist()) if n)
    lines = [
        f"Lengths: mean {t.lengths.mean():.1f}, min {t.lengths.min():,}, max {t.lengths.max():,} steps; {ended}"
        + (f"; {int(t.deaths.sum()):,} agents terminated before their episode ended." if run.dies else "."),
        "",
        "| return of | mean | std | min | max |",
        "| --- | --- | --- | --- | --- |",
    ]
    columns: list[tuple[str, np.ndarray]] = [("the team", t.team)] if len(run.agent_ids) > 1 else []
    columns += [(agent, t.returns[:, a]) for a, agent in enumerate(run.agent_ids)]
    for label, values in columns:
        lines.append(
            f"| {label} | {values.mean():.3g} | {values.std():.3g} | {values.min():.3g} | {values.max():.3g} |"
        )
    return lines


def _sessions(sessions: list[dict[str, Any]]) -> list[str]:
    if not sessions:
        return ["Not known: made before flexibuff_envs kept the sessions that recorded a dataset."]
    lines = [
        "| from episode | policy | env | keywords | recorded | host | versions |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in sessions:
        when = datetime.datetime.fromtimestamp(s["started"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        kwargs = "unknown" if s["env_kwargs"] is None else f"`{json.dumps(s['env_kwargs'])}`"
        first = "" if s["first_episode"] is None else f"{s['first_episode']:,}"
        lines.append(
            f"| {first} | {s['policy'] or '-'} | `{s['env_id'] or 'by hand'}` ({s['api']}) | {kwargs} | {when} "
            f"| {s['host']} | {versions} |"
        )
    wrappers = sorted({w.rsplit(".", 1)[-1] for s in sessions for w in s["wrappers"]})
    if wrappers:
        lines += ["", f"Wrappers: {', '.join(wrappers)}."]
    return lines


def _loader(kind: str, name: str) -> list[str]:
    if kind == "log":
        return [
            "import flexibuff_envs as fe",
            "",
            f'buffer = fe.FlexibleBuffer.open("{name}")  # mapped: larger than memory is fine',
        ]
    if kind == "file":
        return ["import flexibuff_envs as fe", "", f'buffer = fe.FlexibleBuffer.load("{name}")']
    if kind == "vault":
        return ["from flexibuff_envs.integrations.vault import from_vault", "", f'buffer = from_vault("{name}")']
    return ["from flexibuff_envs.integrations.parquet import from_parquet", "", f'buffer = from_parquet("{name}")']
