"""``flexibuff-envs plot``: each agent's episode returns over episodes, and the episode lengths."""

from __future__ import annotations

import numpy as np

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import EmptyBufferError, MissingExtraError, needs
from flexibuff_envs.view.data import agent_groups


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each ``window`` consecutive values (``len(values) - window + 1`` of them)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    return (sums[window:] - sums[:-window]) / window


def plot_buffer(buffer: FlexibleBuffer, out: str, *, title: str) -> list[str]:
    """Write a PNG with per-agent episode returns (raw and smoothed; a line per group of agents
    when there are more than 8, their mean) and a length histogram. Returns the lines' labels."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never open a window, work on machines without a display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingExtraError(needs("plot", "matplotlib", "plot")) from exc
    stats = buffer.episode_stats()
    lengths, returns = stats["lengths"], stats["returns"]
    if not len(lengths):
        raise EmptyBufferError(f"{title}: no episode has ended whole, so there is nothing to plot")
    from matplotlib.ticker import MaxNLocator

    window = max(1, len(lengths) // 20)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    episodes = np.arange(1, len(lengths) + 1)
    for label, members in agent_groups(list(buffer.spec.agent_ids)):  # a line per agent, or per group of many
        r = returns[:, members].mean(axis=1)
        (raw,) = left.plot(
            episodes, r, alpha=0.25 if window > 1 else 1.0, linewidth=0.8, marker="." if len(r) < 30 else None
        )
        if window > 1:
            left.plot(episodes[window - 1 :], moving_mean(r, window), color=raw.get_color(), label=label)
        else:
            raw.set_label(label)
    smoothing = f" (lines: mean of {window})" if window > 1 else ""
    left.set(xlabel="episode", ylabel="return", title=f"episode return per agent{smoothing}")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.legend(loc="best", fontsize="small")
    lo, hi = lengths.min(), lengths.max()
    right.hist(lengths, bins=np.arange(lo, hi + 2) - 0.5 if hi - lo < 40 else 40, color="tab:gray")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    counts = f"all {len(lengths)} episodes: {lo} rows" if lo == hi else f"{len(lengths)} episodes"
    right.set(xlabel="episode length (rows)", ylabel="episodes", title=counts)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return [text.get_text() for text in left.get_legend().get_texts()]
