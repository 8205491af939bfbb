"""Whether a recording fits the disk: once its first episode has ended, the bytes the whole run
will write, against the free space where it writes (`flexibuff-envs record`)."""

from __future__ import annotations

import math
import shutil

from flexibuff_envs.cli.envs import UsageError
from flexibuff_envs.cli.report import size
from flexibuff_envs.recording.rollout import Budget, Progress


def guarded(progress: Progress, budget: Budget, *, step_bytes: int, where: str, kept: int | None, out: str) -> Progress:
    """``progress``, which first checks, when the run's first episode ends, that the rest of the
    run fits the free space at ``where``: ``step_bytes`` a step, all of ``budget``'s steps (its
    episodes as long as the first ones), or ``kept`` of them at the most (a file written at the
    end: what the ring keeps), none of which is written yet then.

    Raises (from the returned callable):
        UsageError: the run would not fit; the recording stops there, with what it has
            written (``out``) kept.
    """
    checked = False

    def check(episodes: int, steps: int) -> None:
        nonlocal checked
        if not checked:
            checked = True
            total = budget.steps or math.ceil(steps / max(episodes, 1) * (budget.episodes or 0))
            rest = min(total, kept) if kept is not None else total - steps
            free = shutil.disk_usage(where).free
            if rest * step_bytes > free:
                raise UsageError(
                    f"the run would write about {size(rest * step_bytes)} more ({size(step_bytes)} a step, "
                    f"{total:,} steps), beyond the {size(free)} free in {where}: stopped after the first "
                    f"episode{'' if kept is not None else f' (kept in {out})'}; pass --force to record anyway, "
                    "or a smaller --episodes or --steps"
                )
        progress(episodes, steps)

    return check
