"""`FlexiBatch`: what sampling returns, with FlexiBuff's attribute names; the one torch conversion."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexibuff_envs.errors import InvalidArgumentError, MissingExtraError, UnknownNameError, needs, require_torch


class ByAgent(Mapping[str, Any]):
    """One field of a batch by agent name (`FlexiBatch.by_agent`): ``field[name]`` is that
    agent's slice of the agent axis, a view made on access (a list of heads for a mask); a
    ``column`` field (a scalar a row) gets a trailing axis of 1."""

    __slots__ = ("_column", "_index", "_single", "_value")

    def __init__(self, value: Any, index: dict[str, int], single: bool, *, column: bool = False) -> None:
        self._value, self._index, self._single, self._column = value, index, single, column

    def __getitem__(self, name: str) -> Any:
        k = self._index[name]
        if isinstance(self._value, list):  # a mask's heads
            return self._value if self._single else [head[k] for head in self._value]
        value = self._value if self._single else self._value[k]
        return value[..., None] if self._column else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"ByAgent({', '.join(self._index)})"


@dataclass
class FlexiBatch:
    """A batch of rows. Absent fields are None.

    Axis order: per-agent fields are ``[n_agents, batch, ...]`` and global fields ``[batch, ...]``;
    with one agent the agent axis is dropped (FlexiBuff's rule). ``action_mask`` and
    ``action_mask_`` are lists over discrete heads of ``[n_agents, batch, cardinality]``.
    Sequences (`FlexibleBuffer.sample_sequences`) put ``seq_len`` after ``batch``.

    numpy batches keep the stored dtypes (bool flags and masks, int64 actions, uint8 images).
    torch batches follow FlexiBuff: discrete actions int64, uint8 observations and states stay
    uint8 (scale them in the network), everything else float32.
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
    #: prioritized draws only: ``[batch]`` importance-sampling weights, float32
    weights: Any = None
    #: n-step draws only: per agent ``gamma ** k`` for the ``k`` steps summed, float32 (the
    #: factor of the bootstrap ``V(obs_)``; HARL's ``sp_gamma``)
    discounts: Any = None
    #: n-step draws only: per agent the ``k`` steps each reward sums, int64 (TorchRL's
    #: ``steps_to_next_obs``)
    n_steps: Any = None
    #: the buffer's fields of your own (``extra_fields``), laid out as the per-agent fields; each
    #: is also an attribute: ``batch.hidden`` is ``batch.extra["hidden"]``
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the agents' names along the agent axis (the env's), for `by_agent`
    agents: Any = None

    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra")
        if extra is not None and name in extra:
            return extra[name]
        raise UnknownNameError(
            f"FlexiBatch has no field {name!r}" + (f"; the buffer's own fields are {sorted(extra)}" if extra else "")
        )

    def by_agent(self) -> FlexiBatch:
        """This batch keyed by agent, as AgileRL's ``MultiAgentReplayBuffer.sample`` gives it and
        its learners index it (``batch.obs[agent_id]``): every per-agent field a mapping `ByAgent`
        ``{agent name: that agent's [batch, ...] rows}`` in the env's agent order (a field of one
        value a row, rewards, dones, ``active``, ``G``, values, ... as a column ``[batch, 1]``, as
        AgileRL's are), masks a mapping of their heads, fields of your own likewise; the fields
        held once per row (``state``,
        ``global_rewards``, ``idx``, ``weights``, ``valid``, ...) as they are. An agent's value is
        a view of this batch's (numpy or torch, on its device), made when it is asked for:
        nothing is copied.

        Raises:
            InvalidArgumentError: the batch has no agent names (it was not sampled from a buffer).
        """
        if self.agents is None:
            raise InvalidArgumentError("by_agent: this batch has no agent names; batches a buffer samples carry them")
        index = {name: k for k, name in enumerate(self.agents)}
        single = len(index) == 1  # the agent axis is dropped: the whole field is the agent's
        out = dict(self.__dict__)
        for name in PER_AGENT:
            value = out[name]
            if value is not None:
                out[name] = ByAgent(value, index, single, column=name in COLUMNS)
        out["extra"] = {key: ByAgent(value, index, single) for key, value in self.extra.items()}
        return FlexiBatch(**out)

    def to_torch(self, device: Any = None) -> FlexiBatch:
        """A copy holding torch tensors on ``device`` (numpy memory is shared where possible)."""
        convert = torch_converter(device)
        return FlexiBatch(**{f.name: convert(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)})

    def __len__(self) -> int:
        return 0 if self.idx is None else int(self.idx.shape[0])

    def to_tensordict(self, device: Any = None) -> Any:
        """This batch as a ``tensordict.TensorDict`` keyed as TorchRL's losses and collectors read.

        ``"observation"``, ``"action"`` (a discrete action's index, or ``[heads]`` indices; continuous
        values; both: ``"action"`` the discrete, ``"continuous_action"`` the rest), ``("next",
        "observation")``, ``("next", "reward")``, ``("next", "done" | "terminated" | "truncated")``
        (``[..., 1]``), ``"action_mask"`` (heads side by side), ``"action_log_prob"`` (``[...]``,
        the joint log prob: every head's and dimension's summed, as ``ProbabilisticActor`` gives
        it), ``"state_value"``, ``"advantage"``, ``"value_target"`` (``[..., 1]``, as
        ``ValueOperator`` and TorchRL's ``GAE`` give them), ``"G"``, ``"index"``,
        ``"steps_to_next_obs"`` (n-step batches: ``n_steps``, ``[..., 1]``), and each field of your
        own (``extra_fields``) under its name, in its dtype. With several
        agents these are per agent under ``"agents"`` (``[batch, n_agents, ...]``, as TorchRL's
        multi-agent envs lay them out); the root holds ``"state"``, the team ``("next",
        "reward")`` and ``("next", "done")`` (all agents done). Needs ``pip install
        'flexibuff-envs[torchrl]'``.
        """
        try:
            import torch
            from tensordict import TensorDict
        except ImportError as exc:
            raise MissingExtraError(needs("to_tensordict", "torchrl", "torchrl")) from exc
        dims = tuple(self.idx.shape)
        multi = np.ndim(self.obs) == len(dims) + 2  # per-agent fields lead with the agent axis

        def tensor(value: Any, kind: str = "float") -> Any:
            if isinstance(value, list):  # a mask's heads, side by side
                value = np.concatenate(value, axis=-1) if isinstance(value[0], np.ndarray) else torch.cat(value, -1)
            out = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
            if kind == "bool":
                return out.bool()
            if kind == "long":
                return out.long()
            if kind == "keep":
                return out
            return out if out.dtype in (torch.float32, torch.uint8) else out.float()

        def own(value: Any, kind: str = "float", flag: bool = False) -> Any:
            """A per-agent field, batch dims first; ``flag``: a trailing axis of 1, as TorchRL's."""
            out = tensor(value, kind)
            if multi:
                out = out.movedim(0, len(dims))
            return out.unsqueeze(-1) if flag else out

        data: dict[str, Any] = {}
        agents: dict[str, Any] = {}
        after: dict[str, Any] = {}
        agents_after: dict[str, Any] = {}
        mine, mine_after = (agents, agents_after) if multi else (data, after)
        mine["observation"] = own(self.obs)
        mine_after["observation"] = own(self.obs_)
        if self.discrete_actions is not None:
            discrete = own(self.discrete_actions, "long")
            mine["action"] = discrete[..., 0] if discrete.shape[-1] == 1 else discrete
        if self.continuous_actions is not None:
            mine["continuous_action" if self.discrete_actions is not None else "action"] = own(self.continuous_actions)
        if self.individual_rewards is not None:
            mine_after["reward"] = own(self.individual_rewards, flag=True)
        terminated, truncated = own(self.terminated, "bool", True), own(self.truncated, "bool", True)
        mine_after.update(done=terminated | truncated, terminated=terminated, truncated=truncated)
        if self.action_mask is not None:
            mine["action_mask"] = own(self.action_mask, "bool")
        for name, key in (("G", "G"), ("individual_auxiliary_rewards", "auxiliary_reward")):
            value = getattr(self, name)
            if value is not None:
                mine[key] = own(value)
        # as TorchRL's modules give them: the action's log prob [...] (the joint one: its heads' and
        # dims' summed, as a composite distribution's), values [..., 1] (ValueOperator, GAE)
        log_probs = [
            own(value).sum(-1) for value in (self.discrete_log_probs, self.continuous_log_probs) if value is not None
        ]
        if log_probs:
            mine["action_log_prob"] = sum(log_probs[1:], log_probs[0])
        for name, key in (("values", "state_value"), ("advantages", "advantage"), ("returns", "value_target")):
            value = getattr(self, name)
            if value is not None:
                mine[key] = own(value, flag=True)
        if self.action_mask_ is not None:
            mine_after["action_mask"] = own(self.action_mask_, "bool")
        if self.n_steps is not None:  # n-step batches: TorchRL's value estimators raise gamma to it
            mine["steps_to_next_obs"] = own(self.n_steps, "long", flag=True)
        for name, value in self.extra.items():  # fields of your own, under their names, as stored
            mine[name] = own(value, "keep")
        if multi:
            agent_axis = len(dims)
            after.update(
                done=agents_after["done"].all(agent_axis),
                terminated=agents_after["terminated"].all(agent_axis),
                truncated=agents_after["truncated"].any(agent_axis),
            )
            if self.global_rewards is not None:
                after["reward"] = tensor(self.global_rewards).unsqueeze(-1)
            data["agents"] = agents
            after["agents"] = agents_after
        for name, key in (("state", "state"), ("state_", "state")):
            value = getattr(self, name)
            if value is not None:
                (data if name == "state" else after)[key] = tensor(value)
        data["index"] = tensor(self.idx, "long")
        if self.valid is not None:
            data["valid"] = tensor(self.valid, "bool")
        data["next"] = after
        return TensorDict(data, batch_size=dims, device=device)


#: fields kept as uint8 in torch batches: images stay a byte per value (normalise in the network)
IMAGES = frozenset({"obs", "obs_", "state", "state_"})
#: fields with one value per row, not per agent
ONCE_PER_ROW = frozenset(
    {"state", "state_", "global_rewards", "global_auxiliary_rewards", "memory_weights", "idx", "valid", "weights"}
)
#: fields with a value per agent (`FlexiBatch.by_agent` keys them; fields of your own too)
PER_AGENT = tuple(f.name for f in dataclasses.fields(FlexiBatch) if f.name not in {*ONCE_PER_ROW, "agents", "extra"})
#: the per-agent fields of one value a row: `FlexiBatch.by_agent` gives each agent's as a column
#: ``[batch, 1]``, as AgileRL's buffers give rewards and dones (a critic's ``[batch, 1]`` output
#: then meets ``r + (1 - d) * gamma * Q'`` without broadcasting to ``[batch, batch]``)
COLUMNS = frozenset(
    {
        "individual_rewards",
        "individual_auxiliary_rewards",
        "terminated",
        "truncated",
        "active",
        "G",
        "values",
        "advantages",
        "returns",
        "discounts",
        "n_steps",
    }
)


def torch_converter(device: Any = None) -> Callable[[str, Any], Any]:
    """``convert(field_name, numpy_value)``: the torch form of one batch field (None stays None).

    Dtype changes happen in numpy before ``torch.from_numpy`` (a bool to float32 there is half
    the time of torch's ``.float()``)."""
    return _converter(require_torch(), device)


@functools.lru_cache(maxsize=16)  # one per device a training loop uses
def _converter(torch: Any, device: Any) -> Callable[[str, Any], Any]:
    as_long = {"discrete_actions", "idx", "n_steps"}
    f32, i64, u8 = np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint8)

    def convert(name: str, value: Any) -> Any:
        if type(value) is not np.ndarray:
            if isinstance(value, dict):  # the fields of your own
                return {key: convert(key, v) for key, v in value.items()}
            if isinstance(value, list):
                return [convert(name, v) for v in value]
            if value is None or isinstance(value, tuple):  # absent, or the agents' names
                return value
        dtype = value.dtype
        if name in as_long:
            if dtype != i64:
                value = value.astype(i64)
        elif dtype != f32 and not (dtype == u8 and name in IMAGES):
            value = value.astype(f32)
        tensor = torch.from_numpy(value)
        return tensor if device is None else tensor.to(device)

    return convert
