"""The peers' own ways to store transitions, behind one small interface, for the side-by-side benchmarks.

Each peer is a function ``make(obs_space, capacity) -> (add, sample)``: ``add(obs, action, reward,
next_obs, terminated, truncated)`` stores one transition the way that library's users do, and
``sample(batch_size)`` returns that library's batch with torch tensors. Installed by the ``bench``
extra (flexibuff 0.3.1, stable-baselines3, tianshou, torchrl); a peer that is not installed is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

#: recording's target: a recorded loop costs at most this times the same loop adding each step
#: to SB3's ``ReplayBuffer`` (README "Speed")
SB3_TARGET = 1.15

Add = Callable[[np.ndarray, int, float, np.ndarray, bool, bool], None]
Sample = Callable[[int], Any]
Peer = Callable[[spaces.Box, int], tuple[Add, Sample]]


def flexibuff_031(obs_space: spaces.Box, capacity: int) -> tuple[Add, Sample]:
    from flexibuff import FlexibleBuffer

    size = [int(np.prod(obs_space.shape))]
    buffer = FlexibleBuffer(
        num_steps=capacity,
        n_agents=1,
        discrete_action_cardinalities=[2],
        global_registered_vars={},
        individual_registered_vars={
            "obs": (size, obs_space.dtype),
            "obs_": (size, obs_space.dtype),
            "individual_rewards": (None, np.float32),
            "discrete_actions": ([1], np.int32),
        },
    )

    def add(obs: np.ndarray, action: int, reward: float, obs_: np.ndarray, terminated: bool, truncated: bool) -> None:
        buffer.save_transition(
            terminated=terminated,
            truncated=truncated,
            registered_vals={
                "obs": obs.reshape(1, -1),
                "obs_": obs_.reshape(1, -1),
                "individual_rewards": np.array([reward]),
                "discrete_actions": np.array([[action]]),
            },
            bootstrap_values=np.zeros(1),
        )

    return add, lambda n: buffer.sample_transitions(n, as_torch=True, device="cpu")


def sb3(
    obs_space: spaces.Box, capacity: int, optimize_memory_usage: bool = False, kept_in_ours: bool = False
) -> tuple[Add, Sample]:
    if kept_in_ours:  # SB3's replay buffer API, kept in a FlexibleBuffer
        from flexibuff_envs.integrations.sb3 import ReplayBuffer
    else:
        from stable_baselines3.common.buffers import ReplayBuffer

    buffer = ReplayBuffer(
        capacity,
        obs_space,
        spaces.Discrete(2),
        device="cpu",
        optimize_memory_usage=optimize_memory_usage,
        handle_timeout_termination=not optimize_memory_usage,
    )  # SB3 allows one or the other

    def add(obs: np.ndarray, action: int, reward: float, obs_: np.ndarray, terminated: bool, truncated: bool) -> None:
        buffer.add(
            obs[None],
            obs_[None],
            np.array([action]),
            np.array([reward]),
            np.array([terminated or truncated]),
            [{"TimeLimit.truncated": truncated}],
        )

    return add, buffer.sample


def sb3_optimized(obs_space: spaces.Box, capacity: int) -> tuple[Add, Sample]:
    return sb3(obs_space, capacity, optimize_memory_usage=True)


def sb3_kept_in_ours(obs_space: spaces.Box, capacity: int) -> tuple[Add, Sample]:
    return sb3(obs_space, capacity, kept_in_ours=True)


def tianshou(obs_space: spaces.Box, capacity: int, ignore_obs_next: bool = False) -> tuple[Add, Sample]:
    from tianshou.data import Batch, ReplayBuffer

    buffer = ReplayBuffer(capacity, ignore_obs_next=ignore_obs_next)

    def add(obs: np.ndarray, action: int, reward: float, obs_: np.ndarray, terminated: bool, truncated: bool) -> None:
        buffer.add(
            Batch(
                obs=obs,
                act=action,
                rew=reward,
                obs_next=obs_,
                terminated=terminated,
                truncated=truncated,
                done=terminated or truncated,
                info={},
            )
        )

    def sample(n: int) -> Any:
        batch, _ = buffer.sample(n)
        return batch.to_torch(device="cpu")

    return add, sample


def tianshou_ignore_obs_next(obs_space: spaces.Box, capacity: int) -> tuple[Add, Sample]:
    return tianshou(obs_space, capacity, ignore_obs_next=True)


def _torchrl_quiet() -> None:
    """TorchRL logs every storage it makes at INFO to stdout, which would land in the outputs."""
    logging.getLogger("torchrl").setLevel(logging.WARNING)


def torchrl(obs_space: spaces.Box, capacity: int) -> tuple[Add, Sample]:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    _torchrl_quiet()

    buffer = ReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=256)

    def add(obs: np.ndarray, action: int, reward: float, obs_: np.ndarray, terminated: bool, truncated: bool) -> None:
        buffer.add(
            TensorDict(
                {
                    "observation": torch.from_numpy(obs),
                    "action": torch.tensor(action),
                    "next": TensorDict(
                        {
                            "observation": torch.from_numpy(obs_),
                            "reward": torch.tensor([reward]),
                            "terminated": torch.tensor([terminated]),
                            "truncated": torch.tensor([truncated]),
                            "done": torch.tensor([terminated or truncated]),
                        },
                        batch_size=[],
                    ),
                },
                batch_size=[],
            )
        )

    return add, buffer.sample


PEERS: dict[str, Peer] = {
    "flexibuff 0.3.1": flexibuff_031,
    "SB3 ReplayBuffer": sb3,
    "SB3 optimize_memory_usage": sb3_optimized,
    "Tianshou ReplayBuffer": tianshou,
    "Tianshou ignore_obs_next": tianshou_ignore_obs_next,
    "TorchRL LazyTensorStorage": torchrl,
}


OURS = "flexibuff_envs"
#: our buffers behind the peers' APIs (measured like the peers)
OURS_AS = {"flexibuff_envs as SB3's ReplayBuffer": sb3_kept_in_ours}
#: the module each peer needs
REQUIRES = {
    "flexibuff 0.3.1": "flexibuff",
    "SB3 ReplayBuffer": "stable_baselines3",
    "flexibuff_envs as SB3's ReplayBuffer": "stable_baselines3",
    "SB3 optimize_memory_usage": "stable_baselines3",
    "Tianshou ReplayBuffer": "tianshou",
    "Tianshou ignore_obs_next": "tianshou",
    "TorchRL LazyTensorStorage": "torchrl",
}


def installed(name: str) -> bool:
    import importlib.util

    return name == OURS or importlib.util.find_spec(REQUIRES[name]) is not None


def loaded(
    name: str,
    data: dict[str, np.ndarray],
    episode: int = 200,
    as_torch: bool = True,
    fields: tuple[str, ...] | None = None,
    compact: bool = True,
) -> Sample:
    """A buffer of ``name`` holding ``data`` (obs, act, rew, obs_, terminated, truncated; one row
    each) in episodes of ``episode`` steps, put in place in bulk: the state that many ``add`` calls
    would leave, without waiting for them. Returns its sampler (torch batches; ours can also give
    numpy, and only ``fields``). Ours stores each observation once (`compact`), as its recorders do;
    with ``compact=False`` it keeps ``obs_`` row by row, as the peers and a bare gather do."""
    n = len(data["act"])
    dtype = data["obs"].dtype
    if name == OURS:
        import flexibuff_envs as fe

        buffer = fe.FlexibleBuffer(n, data["obs"].shape[1], [2], individual_reward=True, obs_dtype=dtype.name)
        for field, key in (
            ("obs", "obs"),
            ("obs_", "obs_"),
            ("individual_rewards", "rew"),
            ("terminated", "terminated"),
            ("truncated", "truncated"),
        ):
            buffer.field(field)[0] = data[key]
        buffer.field("discrete_actions")[0, :, 0] = data["act"]
        buffer.field("active")[...] = True
        for _ in range(n // episode):
            buffer.begin_episode()
            for _ in range(episode):
                buffer.claim_row()
            buffer.end_episode()
        if compact:
            buffer.compact()
        return lambda b: buffer.sample_transitions(b, as_torch=as_torch, fields=fields)
    if name == "flexibuff 0.3.1":
        from flexibuff import FlexibleBuffer

        size = [data["obs"].shape[1]]
        old = FlexibleBuffer(
            num_steps=n,
            n_agents=1,
            discrete_action_cardinalities=[2],
            global_registered_vars={},
            individual_registered_vars={
                "obs": (size, dtype),
                "obs_": (size, dtype),
                "individual_rewards": (None, np.float32),
                "discrete_actions": ([1], np.int32),
            },
        )
        old._registered_vals["obs"][0], old._registered_vals["obs_"][0] = data["obs"], data["obs_"]
        old._registered_vals["individual_rewards"][0] = data["rew"]
        old._registered_vals["discrete_actions"][0, :, 0] = data["act"]
        old.terminated[:], old.truncated[:] = data["terminated"], data["truncated"]
        old.steps_recorded = n
        return lambda b: old.sample_transitions(b, as_torch=True, device="cpu")
    if name.startswith("SB3"):
        from stable_baselines3.common.buffers import ReplayBuffer

        box = (
            spaces.Box(0, 255, data["obs"].shape[1:], np.uint8)
            if dtype == np.uint8
            else spaces.Box(-np.inf, np.inf, data["obs"].shape[1:], np.float32)
        )
        optimize = name == "SB3 optimize_memory_usage"
        sb = ReplayBuffer(
            n,
            box,
            spaces.Discrete(2),
            device="cpu",
            optimize_memory_usage=optimize,
            handle_timeout_termination=not optimize,
        )
        sb.observations[:, 0] = data["obs"]  # with optimize_memory_usage, next obs is the next row's
        if not optimize:
            sb.next_observations[:, 0] = data["obs_"]
            sb.timeouts[:, 0] = data["truncated"]
        sb.actions[:, 0, 0], sb.rewards[:, 0] = data["act"], data["rew"]
        sb.dones[:, 0] = data["terminated"] | data["truncated"]
        sb.full = True
        return sb.sample
    if name.startswith("Tianshou"):
        from tianshou.data import ReplayBuffer

        ts = ReplayBuffer.from_data(
            data["obs"],
            data["act"],
            data["rew"],
            data["terminated"],
            data["truncated"],
            data["terminated"] | data["truncated"],
            data["obs_"],
        )

        def sample(b: int) -> Any:
            return ts.sample(b)[0].to_torch(device="cpu")

        return sample
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    _torchrl_quiet()
    rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=256)
    rb.extend(
        TensorDict(
            {
                "observation": torch.from_numpy(data["obs"]),
                "action": torch.from_numpy(data["act"]),
                "next": TensorDict(
                    {
                        "observation": torch.from_numpy(data["obs_"]),
                        "reward": torch.from_numpy(data["rew"])[:, None],
                        "terminated": torch.from_numpy(data["terminated"])[:, None],
                        "truncated": torch.from_numpy(data["truncated"])[:, None],
                    },
                    batch_size=[n],
                ),
            },
            batch_size=[n],
        )
    )
    return rb.sample


def fill(name: str, env: gym.Env, steps: int, capacity: int) -> Sample:
    """Step ``env`` ``steps`` times, storing each transition the way users of ``name`` do; returns its sampler.

    flexibuff_envs users wrap the env (`fe.record`) and add nothing by hand; the peers' users call
    their buffer's ``add`` after every step.
    """
    add: Add | None = None
    if name == OURS:
        import flexibuff_envs as fe

        env = fe.record(env, num_steps=capacity)
        buffer = env.buffer

        def sample(n: int) -> Any:
            return buffer.sample_transitions(n, as_torch=True)
    else:
        add, sample = {**PEERS, **OURS_AS}[name](env.observation_space, capacity)
    obs, _ = env.reset(seed=0)
    for t in range(steps):
        action = t % 2
        obs_, reward, terminated, truncated, _ = env.step(action)
        if add is not None:
            add(obs, action, float(reward), obs_, terminated, truncated)
        obs = env.reset()[0] if terminated or truncated else obs_
    return sample


class FrameEnv(gym.Env):
    """Atari-sized frames (84x84x4 uint8, from a pool of 64 random ones), 2 actions, 500-step episodes."""

    def __init__(self, obs_space: spaces.Box | None = None, length: int = 500) -> None:
        self.observation_space = obs_space or spaces.Box(0, 255, (84, 84, 4), np.uint8)
        self.action_space = spaces.Discrete(2)
        self.length = length
        self.frames = np.random.default_rng(0).integers(0, 256, (64, *self.observation_space.shape), dtype=np.uint8)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.frames[0], {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self.frames[self.t % 64], 1.0, False, self.t >= self.length, {}
