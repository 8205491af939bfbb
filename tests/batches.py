"""Comparing what buffers hold, field by field."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

import flexibuff_envs as fe

#: every batch field that holds recorded data (``idx`` and ``valid`` say where it came from)
DATA_FIELDS = tuple(f.name for f in dataclasses.fields(fe.FlexiBatch) if f.name not in ("idx", "valid"))


def assert_same_batches(a: fe.FlexiBatch, b: fe.FlexiBatch) -> None:
    """Every data field of ``a`` equals ``b``'s bit for bit, or both are absent."""
    for name in DATA_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict):  # fields of your own
            assert x.keys() == y.keys(), name
            x, y = list(x.values()), list(y.values())
        assert (x is None) == (y is None), f"{name}: {x is None} vs {y is None}"
        for u, v in zip(x if isinstance(x, list) else [x], y if isinstance(y, list) else [y]):
            np.testing.assert_array_equal(u, v, err_msg=name)
            assert np.asarray(u).tobytes() == np.asarray(v).tobytes(), f"{name}: equal, but not bit for bit"


#: a draw of every sampling mode
DRAWS = [
    lambda b: b.sample_transitions(64),
    lambda b: b.sample_transitions(64, n_step=3),
    lambda b: b.sample_transitions(64, prioritized=True),
    lambda b: b.sample_episodes(n_episodes=2),
    lambda b: b.sample_sequences(8, 4),
    lambda b: next(b.minibatches(32)),
]


def assert_same_draws(mine: fe.FlexibleBuffer, want: fe.FlexibleBuffer) -> None:
    """Every mode of `DRAWS`, drawn with the same seed from both buffers, hands out the same batches."""
    mine.rng, want.rng = np.random.default_rng(7), np.random.default_rng(7)
    for draw in DRAWS:
        got, expected = draw(mine), draw(want)
        for x, y in zip(
            got if isinstance(got, list) else [got], expected if isinstance(expected, list) else [expected], strict=True
        ):
            assert_same_batches(x, y)


def whole_episodes(buffer: fe.FlexibleBuffer) -> list[fe.FlexiBatch]:
    """Every ended whole episode, lane by lane in recording order, as a batch of its rows."""
    return list(buffer.episodes())


def key(batch: fe.FlexiBatch) -> Any:
    """What tells episodes apart: their observations and actions."""
    return batch.obs.tobytes(), None if batch.discrete_actions is None else batch.discrete_actions.tobytes()


def filled_by_hand(directory: str | os.PathLike[str] | None = None, compress: Any = None) -> fe.FlexibleBuffer:
    """Two episodes whose ``obs_`` are filled in by hand, the first's last equal to the second's
    first ``obs`` (so stored chained to it), logged to ``directory`` as they end if given, the
    buffer's fields kept as ``compress`` says."""
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    buffer = fe.FlexibleBuffer(
        20, obs_size=2, discrete_action_cardinalities=[2], individual_reward=True, compress=compress
    )
    if directory is not None:
        buffer.log_to(directory, every=3600.0)
    for t in range(6):
        if t in (0, 3):
            buffer.begin_episode()
        row = buffer.claim_row()
        buffer.field("obs")[0, row] = obs[t]
        buffer.field("obs_")[0, row] = obs[t + 1] if t < 5 else -1.0  # episode 0 ends on episode 1's start
        buffer.field("terminated")[0, row] = t in (2, 5)
        if t in (2, 5):
            buffer.end_episode()
    return buffer
