"""Recorder for a Gymnasium ``VectorEnv``: each sub-env is a lane with its own whole episodes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import InvalidArgumentError
from flexibuff_envs.interrupts import HOLD
from flexibuff_envs.recording.annotations import lane_feedback
from flexibuff_envs.recording.setup import LogPath, Sourced, prepare_buffer
from flexibuff_envs.recording.vector import BatchRecorder, VectorBootstrapFn
from flexibuff_envs.recording.writer import Unpicklable, Writer
from flexibuff_envs.spec import BufferSpec, infer_spec
from flexibuff_envs.spec.actions import action_codec
from flexibuff_envs.spec.observations import obs_codec


def batch_masks(info: Mapping[str, Any], n: int) -> np.ndarray | None:
    """The legal-action flags ``[n, actions]`` of a batched info (None: it has none); sub-envs
    whose info has no mask (``_action_mask`` False) get every action legal."""
    masks = info.get("action_mask")
    if masks is None:
        return None
    flags = np.asarray(masks, dtype=bool).reshape(n, -1)
    present = info.get("_action_mask")
    if present is not None and not np.all(present):
        flags = flags.copy()
        flags[~np.asarray(present, dtype=bool)] = True
    return flags


class VectorRecorder(Sourced, Unpicklable, VectorWrapper):
    """Records every sub-env step of a Gymnasium vector env into ``self.buffer``.

    Sub-env ``i`` writes lane ``i`` of the buffer, so its episodes are contiguous and whole. A
    step of all sub-envs is staged and written in blocks of steps (`BatchRecorder`). The
    autoreset mode comes from ``metadata["autoreset_mode"]``: under NEXT_STEP the reset step of a
    finished sub-env is not a transition; under SAME_STEP its last transition ends in
    ``info["final_obs"]``; under DISABLED, ``reset(options={"reset_mask": ...})`` starts new
    episodes in the masked sub-envs only.

    Args: as `GymRecorder`; ``num_steps`` is per sub-env, and a given buffer needs a free lane
    per sub-env.
    """

    def __init__(
        self,
        env: VectorEnv,
        buffer: FlexibleBuffer | None = None,
        *,
        num_steps: int = 100_000,
        gamma: float | None = None,
        gae_lambda: float | None = None,
        bootstrap_fn: VectorBootstrapFn | None = None,
        seed: int | None = None,
        alpha: float | None = None,
        extra_fields: Mapping[str, Any] | None = None,
        log: LogPath | None = None,
        policy: str = "",
    ) -> None:
        super().__init__(env)
        self.buffer = prepare_buffer(
            infer_spec(env),
            buffer,
            num_steps=num_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            seed=seed,
            alpha=alpha,
            extra_fields=extra_fields,
            log=log,
        )
        self._log_opened = log is not None
        mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self._same_step = mode == AutoresetMode.SAME_STEP
        writer = Writer(self.buffer, self)
        self._recorder = BatchRecorder(
            writer,
            obs_codec(env.single_observation_space),
            action_codec(env.single_action_space),
            writer.claim_lanes(env.num_envs),
            mode=mode,
            bootstrap_fn=bootstrap_fn,
        )
        self._begin_session(env, "vector", policy)  # once its lanes are its own
        self._tag_origins(self._recorder.origins)
        # a vector env of its own (CartPole's) seeds its sub-envs together: they replay only as one
        self._recorder.origins.apart = isinstance(env.unwrapped, (SyncVectorEnv, AsyncVectorEnv))

    @property
    def buffer_spec(self) -> BufferSpec:
        """The layout the buffer records in."""
        return self.buffer.spec

    @property
    def lanes(self) -> list[int]:
        """The buffer lane each sub-env writes, in sub-env order."""
        return self._recorder.lane_ids

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        mask = (options or {}).get("reset_mask")  # read first: SyncVectorEnv pops it from options
        obs, info = self.env.reset(seed=seed, options=options)
        lanes = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        self._recorder.begin(lanes, obs, batch_masks(info, self.num_envs), seed)
        return obs, info

    def step(self, actions: Any) -> Any:
        try:
            result = self.env.step(actions)
            self._record(actions, *result)
        except BaseException as error:  # Ctrl-C after the envs moved included: `abandon`
            self._recorder.abandon(error)
            raise
        return result

    def _record(self, actions: Any, obs: Any, rewards: Any, terminations: Any, truncations: Any, info: Any) -> None:
        final = masks_ = None
        masks = batch_masks(info, self.num_envs)
        if self._same_step and "final_obs" in info:
            done = terminations | truncations
            ended = np.flatnonzero(done)
            final = (ended, [info["final_obs"][i] for i in ended.tolist()])
            final_masks = batch_masks(info.get("final_info", {}), self.num_envs)
            if final_masks is not None:  # each finished sub-env's last mask in place of its reset one
                masks_ = final_masks if masks is None else np.where(done[:, None], final_masks, masks)
        self._recorder.step(actions, obs, rewards, terminations, truncations, final=final, masks=masks, masks_=masks_)

    def truncate(self) -> None:
        """End every sub-env's running episode at its last recorded step, as truncated (see
        `GymRecorder.truncate`). Each sub-env's recording resumes at its next reset."""
        self._recorder.truncate()

    def close(self, **kwargs: Any) -> None:
        """Close the envs; the buffer's lanes are free for another recorder; the log
        it opened (``log=``) is closed, a log the buffer keeps otherwise synced."""
        self._recorder.writer.release_lanes(close_log=self._log_opened)
        super().close(**kwargs)

    def annotate(self, agent: None = None, **fields: Any) -> None:
        """Per sub-env annotations of the step about to be taken: each field has a leading
        ``[num_envs]`` axis (see `GymRecorder.annotate`)."""
        self._recorder.annotate(fields)

    def add_feedback(self, value: float, agent: None = None, step: int = -1, *, lane: int = 0) -> None:
        """Add a human reward to sub-env ``lane``'s ``step``-th recorded step of its episode."""
        if not 0 <= lane < self.num_envs:
            raise InvalidArgumentError(f"add_feedback: lane must be in [0, {self.num_envs}), got {lane!r}")
        recorder = self._recorder
        with HOLD:
            lane_feedback(recorder.writer, recorder.lane_ids[lane], lane, value, step)
