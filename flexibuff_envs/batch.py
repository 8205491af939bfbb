"""`FlexiBatch`: what sampling returns, with FlexiBuff's attribute names; the one torch conversion."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flexibuff_envs.errors import require_torch


@dataclass
class FlexiBatch:
    """A batch of rows. Absent fields are None.

    Axis order: per-agent fields are ``[n_agents, batch, ...]`` and global fields ``[batch, ...]``;
    with one agent the agent axis is dropped (FlexiBuff's rule). ``action_mask`` and
    ``action_mask_`` are lists over discrete heads of ``[n_agents, batch, cardinality]``.
    Sequences (`FlexibleBuffer.sample_sequences`) put ``seq_len`` after ``batch``.

    numpy batches keep the stored dtypes (bool flags and masks, int64 actions, uint8 images).
    torch batches follow FlexiBuff: discrete actions int64, uint8 observations stay uint8 (scale
    them in the network), everything else float32.
    """

    obs: Any = None
    obs_: Any = None
    state: Any = None
    state_: Any = None
    global_rewards: Any = None
    global_auxiliary_rewards: Any = None
    individual_rewards: Any = None
    individual_auxiliary_rewards: Any = None
    discrete_actions: Any = None
    continuous_actions: Any = None
    discrete_log_probs: Any = None
    continuous_log_probs: Any = None
    action_mask: Any = None
    action_mask_: Any = None
    terminated: Any = None
    truncated: Any = None
    active: Any = None
    G: Any = None
    values: Any = None
    advantages: Any = None
    returns: Any = None
    memory_weights: Any = None
    #: buffer rows this batch was gathered from: ``[batch]`` (or ``[batch, seq_len]``)
    idx: Any = None
    #: sequences only: ``[batch, seq_len]``, False where a window ran past its episode's end
    valid: Any = None

    def to_torch(self, device: Any = None) -> FlexiBatch:
        """A copy holding torch tensors on ``device`` (numpy memory is shared where possible)."""
        convert = torch_converter(device)
        return FlexiBatch(**{f.name: convert(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)})

    def __len__(self) -> int:
        return 0 if self.idx is None else int(self.idx.shape[0])


#: fields kept as uint8 in torch batches: images stay a byte per value (normalise in the network)
IMAGES = frozenset({"obs", "obs_"})


def torch_converter(device: Any = None) -> Callable[[str, Any], Any]:
    """``convert(field_name, numpy_value)``: the torch form of one batch field (None stays None)."""
    torch = require_torch()
    as_long = {"discrete_actions", "idx"}

    long = torch.int64

    def convert(name: str, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, list):
            return [convert(name, v) for v in value]
        tensor = torch.from_numpy(value)
        if name in as_long:
            tensor = tensor if tensor.dtype == long else tensor.long()
        elif tensor.dtype != torch.float32 and not (tensor.dtype == torch.uint8 and name in IMAGES):
            tensor = tensor.float()
        return tensor if device is None else tensor.to(device)

    return convert
