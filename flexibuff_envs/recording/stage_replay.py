"""Replaying a killed vector recorder's stage (`log.stage_files`): the episodes that ended in the steps
it staged but had not written, recorded again by a `BatchRecorder` exactly as it would have
written them, into a buffer holding each lane's running episode as the ring it left holds it.
The next to open the log (`LogWriter`) appends them after the episodes its journal held.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from gymnasium import spaces

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.log.format import LogHeader, fail
from flexibuff_envs.log.stage_files import Left, replayers
from flexibuff_envs.recording.vector import BatchRecorder
from flexibuff_envs.recording.vector_stage import MODES
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.observations import obs_codec
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.holders import HeldBatch
from flexibuff_envs.storage.next_values import CHAINED


def replayed(stage: Left, ring: Storage, header: LogHeader) -> Chunk | None:
    """The whole episodes that ended in ``stage``'s staged steps, their first steps read from
    ``ring`` (a killed recording's, `log.ring_files.left`), as a chunk for a log of ``header``."""
    if not stage.k:
        return None
    layout, n, capacity = stage.layout, stage.layout.n, stage.layout.capacity
    spec = dataclasses.replace(
        header.spec, n_envs=n, action_mask=header.spec.action_mask or "action_mask" in ring.arrays
    )
    _check(stage, ring, spec)  # first: the buffer made next has the stage's rows
    buffer = FlexibleBuffer.from_spec(
        spec,
        num_steps=capacity,
        gamma=header.gamma,
        gae_lambda=header.gae_lambda,
        global_reward=False,
        individual_reward=False,
    )
    lengths = np.where(stage.running & ~stage.clipped, stage.pos - stage.start, 0)
    rows = _running(buffer, ring, stage, lengths)
    recorder = BatchRecorder(
        Writer(buffer, buffer),
        obs_codec(_obs_space(spec)),
        action_codec(_action_space(spec)),
        list(range(n)),
        mode=MODES[layout.mode],
    )
    if stage.k > recorder.block:  # a block of another version may be shorter, never longer
        raise fail(stage.path, f"stages {stage.k} steps, more than a block of its recorder holds ({recorder.block})")
    recorder.resume(stage.running, stage.resetting, stage.arrays, stage.k)
    _held(recorder.obs, stage.arrays["obs"][0], rows, lengths, capacity)
    if recorder.mask is not None:
        _held(recorder.mask, stage.arrays["masks"][0], rows, lengths, capacity)
    recorder.commit()
    return buffer.take_episodes()


def _check(stage: Left, ring: Storage, spec: BufferSpec) -> None:
    """Raise `BufferFileError` unless ``stage`` holds steps of a recorder of ``ring``'s buffer."""
    layout, rows = stage.layout, ring.lane_rows * len(ring.opened)
    width = len(spec.obs_categories) if spec.obs_categories else spec.obs_size
    if (
        (layout.width, layout.heads, layout.continuous)
        != (width, len(spec.discrete_action_cardinalities), spec.continuous_action_dimension)
        or layout.capacity < 1
        or int(stage.lanes.max(initial=0) + 1) * layout.capacity > rows
        or len(set(stage.lanes.tolist())) < layout.n
    ):
        raise fail(stage.path, "stages steps of another buffer than the ring's")


def _running(buffer: FlexibleBuffer, ring: Storage, stage: Left, lengths: np.ndarray) -> np.ndarray:
    """Lane ``i`` of ``buffer`` holds the running episode of ``stage``'s lane ``i`` (its first
    ``lengths[i]`` rows, copied from the ``ring`` rows it lies in), from position 0; returns
    the rows."""
    capacity = stage.layout.capacity
    for i, lane in enumerate(buffer._index.change()):
        if stage.running[i]:
            lane.begin()
            if lengths[i]:
                lane.claim_block(int(lengths[i]))
            lane.running.whole = not stage.clipped[i]  # type: ignore[union-attr]
    # every row of the running episodes, where the ring holds it and where the buffer does
    which = np.repeat(np.arange(stage.layout.n), lengths)
    at = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    theirs = stage.lanes[which] * capacity + (stage.start[which] + at) % capacity
    mine = which * capacity + at
    store = buffer._store
    for name, array in ring.arrays.items():
        if name not in store.fields:
            continue
        target = store.ensure(name, width=array.shape[-1] if name == "continuous_log_probs" else None)
        if store.fields[name].per_agent:
            target[:, mine] = array[:, theirs]
        else:
            target[mine] = array[theirs]
    return mine


def _held(holder: HeldBatch, values: np.ndarray, rows: np.ndarray, lengths: np.ndarray, capacity: int) -> None:
    """The lanes of ``holder`` hold ``values`` (the stage's), the rows of their running
    episodes ``rows`` chained, each one's newest naming what its lane holds."""
    holder.hold(np.arange(len(values)), values)
    holder.index[rows] = CHAINED
    has = np.flatnonzero(lengths)
    newest = has * capacity + lengths[has] - 1
    holder.index[newest] = holder.held[has]
    holder.pending[has] = newest


def _obs_space(spec: BufferSpec) -> spaces.Space:
    """A space whose values a stage holds as ``spec``'s buffer stores them."""
    if spec.obs_categories:
        return spaces.MultiDiscrete(list(spec.obs_categories))
    dtype = np.dtype(spec.obs_dtype)
    bounds = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype) if dtype.kind == "f" else None
    low, high = (0, 1) if bounds is None else (bounds.min, bounds.max)
    return spaces.Box(low, high, (spec.obs_size,), dtype)


def _action_space(spec: BufferSpec) -> spaces.Space:
    """An action space of ``spec``'s heads and continuous values."""
    heads, dim = spec.discrete_action_cardinalities, spec.continuous_action_dimension
    box = spaces.Box(-np.inf, np.inf, (dim,), np.float32)
    discrete = spaces.MultiDiscrete(list(heads)) if len(heads) > 1 else spaces.Discrete(heads[0]) if heads else None
    if discrete is None:
        return box
    return spaces.Tuple((discrete, box)) if dim else discrete


replayers["vector"] = replayed
