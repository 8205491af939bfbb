"""Comparing what buffers hold, field by field."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import flexibuff_envs as fe

#: every batch field that holds recorded data (``idx`` and ``valid`` say where it came from)
DATA_FIELDS = tuple(f.name for f in dataclasses.fields(fe.FlexiBatch) if f.name not in ("idx", "valid"))


def assert_same_batches(a: fe.FlexiBatch, b: fe.FlexiBatch) -> None:
    """Every data field of ``a`` equals ``b``'s (NaN equals NaN), or both are absent."""
    for name in DATA_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict):  # fields of your own
            assert x.keys() == y.keys(), name
            x, y = list(x.values()), list(y.values())
        assert (x is None) == (y is None), f"{name}: {x is None} vs {y is None}"
        for u, v in zip(x if isinstance(x, list) else [x], y if isinstance(y, list) else [y]):
            np.testing.assert_array_equal(u, v, err_msg=name)


def whole_episodes(buffer: fe.FlexibleBuffer) -> list[fe.FlexiBatch]:
    """Every ended whole episode, lane by lane in recording order, as a batch of its rows."""
    return list(buffer.episodes())


def key(batch: fe.FlexiBatch) -> Any:
    """What tells episodes apart: their observations and actions."""
    return batch.obs.tobytes(), None if batch.discrete_actions is None else batch.discrete_actions.tobytes()
