"""Recorder for a Gymnasium ``VectorEnv``: each sub-env is a lane with its own whole episodes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.codecs import action_codec, obs_codec
from flexibuff_envs.spec import BufferSpec, infer_spec
from flexibuff_envs.wrappers.core import BootstrapFn, LaneRecorder, prepare_buffer

_NO_INFO: Mapping[str, Any] = {}


def lane_info(info: Mapping[str, Any], lane: int) -> Mapping[str, Any]:
    """What the core reads from one sub-env's part of a batched info: its action mask."""
    if "action_mask" not in info:
        return _NO_INFO
    present = info.get("_action_mask")
    return {"action_mask": info["action_mask"][lane]} if present is None or present[lane] else _NO_INFO


class VectorRecorder(VectorWrapper):
    """Records every sub-env step of a Gymnasium vector env into ``self.buffer``.

    Sub-env ``i`` writes lane ``i`` of the buffer, so its episodes are contiguous and whole. The
    autoreset mode comes from ``metadata["autoreset_mode"]``: under NEXT_STEP the reset step of a
    finished sub-env is not a transition; under SAME_STEP its last transition ends in
    ``info["final_obs"]``; under DISABLED, ``reset(options={"reset_mask": ...})`` starts new
    episodes in the masked sub-envs only.

    Args: as `GymRecorder`; ``num_steps`` is per sub-env, and a given buffer needs a free lane
    per sub-env.
    """

    def __init__(self, env: VectorEnv, buffer: FlexibleBuffer | None = None, *, num_steps: int = 100_000,
                 gamma: float | None = None, gae_lambda: float | None = None,
                 bootstrap_fn: BootstrapFn | None = None, seed: int | None = None) -> None:
        super().__init__(env)
        self.buffer = prepare_buffer(infer_spec(env), buffer, num_steps=num_steps, gamma=gamma,
                                     gae_lambda=gae_lambda, seed=seed)
        obs, action = obs_codec(env.single_observation_space), action_codec(env.single_action_space)
        single_bootstrap = None if bootstrap_fn is None else (lambda obs_, agent: bootstrap_fn(obs_))
        self._lanes = [LaneRecorder(self.buffer, [obs], [action], lane=lane, bootstrap_fn=single_bootstrap)
                       for lane in self.buffer.claim_lanes(env.num_envs, self)]
        self._mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self._resetting = np.zeros(env.num_envs, dtype=bool)  # NEXT_STEP: the next step is a reset

    @property
    def buffer_spec(self) -> BufferSpec:
        """The layout the buffer records in."""
        return self.buffer.spec

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        mask = (options or {}).get("reset_mask")  # read first: SyncVectorEnv pops it from options
        obs, info = self.env.reset(seed=seed, options=options)
        for i, lane in enumerate(self._lanes):
            if mask is None or mask[i]:
                lane.begin([(0, obs[i], lane_info(info, i))])
                self._resetting[i] = False
        return obs, info

    def step(self, actions: Any) -> Any:
        result = self.env.step(actions)
        obs, rewards, terminations, truncations, info = result
        final_obs = info.get("final_obs") if self._mode == AutoresetMode.SAME_STEP else None
        for i, lane in enumerate(self._lanes):
            if self._resetting[i]:  # NEXT_STEP: this step only reset sub-env i
                lane.begin([(0, obs[i], lane_info(info, i))])
                self._resetting[i] = False
                continue
            if not lane.running:
                continue
            done = terminations[i] or truncations[i]
            if final_obs is not None and done:
                lane.step_single(actions[i], final_obs[i], rewards[i], terminations[i], truncations[i],
                                 lane_info(info.get("final_info", _NO_INFO), i))
                lane.begin([(0, obs[i], lane_info(info, i))])
                continue
            lane.step_single(actions[i], obs[i], rewards[i], terminations[i], truncations[i], lane_info(info, i))
            if done and self._mode == AutoresetMode.NEXT_STEP:
                self._resetting[i] = True
        return result

    def close(self, **kwargs: Any) -> None:
        """Close the envs; the buffer's lanes are free for another recorder."""
        self.buffer.release_lanes(self)
        super().close(**kwargs)

    def annotate(self, agent: None = None, **fields: Any) -> None:
        """Per sub-env annotations of the step about to be taken: each field has a leading
        ``[num_envs]`` axis (see `GymRecorder.annotate`)."""
        for name, value in fields.items():
            if np.shape(value)[:1] != (self.num_envs,):
                raise ValueError(f"annotate: {name} needs a leading axis of {self.num_envs} sub-envs, "
                                 f"got shape {np.shape(value)}")
        for i, lane in enumerate(self._lanes):
            lane.annotations.add(0, f"sub-env {i}", {name: np.asarray(v)[i] for name, v in fields.items()})

    def add_feedback(self, value: float, agent: None = None, step: int = -1, *, lane: int = 0) -> None:
        """Add a human reward to sub-env ``lane``'s ``step``-th recorded step of its episode."""
        if not 0 <= lane < self.num_envs:
            raise ValueError(f"add_feedback: lane must be in [0, {self.num_envs}), got {lane!r}")
        self._lanes[lane].feedback(0, value, step)
