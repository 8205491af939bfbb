"""A block of vector steps as the sub-envs returned them, staged for `BatchRecorder`, and their
rewards, end flags and actions written through the row writers when the block is."""

from __future__ import annotations

from typing import Any

import numpy as np

from flexibuff_envs.action_codecs import ActionCodec
from flexibuff_envs.codecs import ObsCodec
from flexibuff_envs.errors import EnvValueError, short_repr
from flexibuff_envs.writer import Writer


class Stage:
    """Up to ``block`` vector steps of ``n`` sub-envs, one copy per field per step.

    ``obs[0]`` is what each lane held when the block began and ``obs[j + 1]`` what it held after
    step ``j``; ``final[j]`` (SAME_STEP) the last ``obs_`` of the sub-envs that finished in step
    ``j`` (``has_final[j]``); ``flags[0]`` / ``flags[1]`` terminated / truncated.
    """

    def __init__(self, writer: Writer, codec: ObsCodec, action: ActionCodec, n: int, block: int) -> None:
        self.n, self.codec, self.action = n, codec, action
        self.obs = np.zeros((block + 1, n, codec.size), dtype=codec.dtype)
        self.final: np.ndarray | None = None  # allocated at the first finished sub-env (SAME_STEP)
        self.has_final = [False] * block
        self.actions = (
            np.zeros((block, n, len(action.cardinalities)), dtype=np.int64),
            np.zeros((block, n, action.continuous_dim), dtype=np.float32),
        )
        self.rewards = np.zeros((block, n), dtype=np.float32)
        self.flags = np.zeros((2, block, n), dtype=bool)
        # legal-action masks as bits, as ``obs`` and ``final`` (allocated once masks are on)
        self.mask_codec = writer.mask_encoder(action)
        self.masks = self.final_masks = np.zeros((0, 0, 0), dtype=np.uint8)
        # where a block's transitions go
        self.values = writer.agent_rows(0, action)
        self._team = writer.team_rows(None) if writer.has("global_rewards") else None

    def put(
        self,
        k: int,
        actions: Any,
        obs: Any,
        rewards: Any,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final: tuple[np.ndarray, list[Any]] | None,
    ) -> None:
        """Stage step ``k`` (raises `EnvValueError` for a value its space does not allow)."""
        self.obs[k + 1] = self.codec.batch(obs)
        self.rewards[k] = self._checked_rewards(rewards)
        self.action.write_batch(self.actions[0][k], self.actions[1][k], actions)
        self.flags[0, k] = terminated
        self.flags[1, k] = truncated
        self.has_final[k] = final is not None
        if final is not None:  # one sub-env at a time: they come as separate objects
            if self.final is None:
                self.final = np.zeros_like(self.obs[1:])
            lanes, values = final
            self.final[k][lanes] = np.stack([self.codec.flatten(value) for value in values])

    def enable_masks(self, held: np.ndarray) -> None:
        """Stage masks from now on; the lanes hold ``held``."""
        self.masks = np.zeros((len(self.has_final) + 1, *held.shape), dtype=np.uint8)
        self.masks[0] = held
        self.final_masks = np.zeros_like(self.masks[1:])

    def put_masks(self, k: int, masks: np.ndarray | None, masks_: np.ndarray | None) -> None:
        """The legal actions of step ``k``'s observations, and of its transitions' next ones."""
        self.masks[k + 1] = self.mask_codec.batch(masks, self.n)
        self.final_masks[k] = self.masks[k + 1] if masks_ is None else self.mask_codec.batch(masks_, self.n)

    def _checked_rewards(self, rewards: Any) -> np.ndarray:
        if rewards.__class__ is np.ndarray and rewards.dtype.kind in "biuf" and rewards.shape == (self.n,):
            return rewards
        values = np.asarray(rewards)
        if values.shape != (self.n,) or values.dtype.kind not in "biuf":
            raise EnvValueError(f"rewards must be {self.n} numbers, one per sub-env, got {short_repr(rewards)}")
        return values

    def write(self, rows: np.ndarray, flat: np.ndarray, k: int) -> None:
        """Rewards, end flags and actions of the transitions ``flat`` (indices into the block's
        ``[k, n]`` steps) into ``rows``."""
        rewards = self.rewards[:k].reshape(-1).take(flat)
        discrete, continuous = (a[:k].reshape(k * self.n, a.shape[-1]).take(flat, axis=0) for a in self.actions)
        self.values.write_rows(
            rows,
            discrete,
            continuous,
            rewards,
            self.flags[0, :k].reshape(-1).take(flat),
            self.flags[1, :k].reshape(-1).take(flat),
        )
        if self._team is not None:
            self._team.set(rows, rewards)

    def restart(self, k: int) -> None:
        """The block's ``k`` steps were written: the next block begins from what the lanes hold now."""
        self.obs[0] = self.obs[k]
        if len(self.masks):
            self.masks[0] = self.masks[k]
        self.has_final = [False] * len(self.has_final)
