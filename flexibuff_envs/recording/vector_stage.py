"""A block of vector steps as the sub-envs returned them, staged for `BatchRecorder`, and their
rewards, end flags and actions written through the row writers when the block is."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from flexibuff_envs.errors import EnvValueError, short_repr
from flexibuff_envs.log.stage_files import Layout, StageFile
from flexibuff_envs.recording.writer import Writer
from flexibuff_envs.spec.actions import ActionCodec
from flexibuff_envs.spec.observations import ObsCodec

#: gymnasium's autoreset modes, in the order a stage file numbers them
MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED)


def stage_for(
    writer: Writer,
    codec: ObsCodec,
    action: ActionCodec,
    lanes: list[int],
    block: int,
    mode: AutoresetMode,
    *,
    durable: bool,
) -> Stage:
    """A `Stage` of ``block`` steps of the buffer lanes ``lanes``: in a file of the buffer's
    episode log when ``durable`` and the log keeps the buffer's ring in files."""
    masks = len(action.cardinalities) and writer.mask_encoder(action).size
    layout = Layout(
        len(lanes),
        block,
        codec.size,
        codec.dtype,
        len(action.cardinalities),
        action.continuous_dim,
        masks,
        MODES.index(mode),
        writer.capacity,
    )
    return Stage(writer, codec, action, len(lanes), block, writer.stage_file(layout, lanes) if durable else None)


class Stage:
    """Up to ``block`` vector steps of ``n`` sub-envs, one copy per field per step.

    ``obs[0]`` is what each lane held when the block began and ``obs[j + 1]`` what it held after
    step ``j``; ``final[j]`` (SAME_STEP) the last ``obs_`` of the sub-envs that finished in step
    ``j`` (``has_final[j]``); ``flags[0]`` / ``flags[1]`` terminated / truncated.

    With a ``file`` (`log.stage_files.StageFile`, where the buffer's ring is in files), the arrays are
    the file's: a killed recording's staged steps are replayed from it (`recording.stage_replay`).
    """

    def __init__(
        self, writer: Writer, codec: ObsCodec, action: ActionCodec, n: int, block: int, file: StageFile | None = None
    ) -> None:
        self.n, self.codec, self.action, self.file = n, codec, action, file
        arrays = file.arrays if file is not None else {}

        def made(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            return arrays[name] if name in arrays else np.zeros(shape, dtype=dtype)

        self.obs = made("obs", (block + 1, n, codec.size), codec.dtype)
        # allocated at the first finished sub-env (SAME_STEP), or the file's
        self.final: np.ndarray | None = arrays["final"] if len(arrays.get("final", ())) else None
        self.has_final = made("has_final", (block,), bool)
        self.actions = (
            made("discrete", (block, n, len(action.cardinalities)), np.int64),
            made("continuous", (block, n, action.continuous_dim), np.float32),
        )
        self.rewards = made("rewards", (block, n), np.float32)
        self.flags = made("flags", (2, block, n), bool)
        # legal-action masks as bits, as ``obs`` and ``final`` (allocated once masks are on)
        self.mask_codec = writer.mask_encoder(action)
        self.masks = self.final_masks = np.zeros((0, 0, 0), dtype=np.uint8)
        # where a block's transitions go
        self.values = writer.agent_rows(0, action)
        self._team = writer.team_rows(None) if writer.has("global_rewards") else None
        #: ``staged(k)``: ``k`` steps are staged (the file says so: a replay takes them)
        self.staged: Callable[[int], None] = file.staged if file is not None else _unfiled

    @property
    def durable(self) -> bool:
        """Whether the staged steps are in a file of the episode log the buffer keeps."""
        return self.file is not None and self.file.live

    def settled(self) -> None:
        """No step is staged; the file's newest snapshot holds the lanes (`StageFile.settled`)."""
        if self.file is not None:
            self.file.settled()

    def snapshot(
        self, pos: np.ndarray, start: np.ndarray, running: np.ndarray, resetting: np.ndarray, clipped: np.ndarray
    ) -> None:
        """The lanes as the steps written leave them, to the file (`StageFile.snapshot`)."""
        if self.file is not None:
            self.file.snapshot(pos, start, running, resetting, clipped)

    def stop(self) -> None:
        """Stage in memory only from now on."""
        if self.file is not None:
            self.file.stop()
        self.staged = _unfiled

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
            if self.final is None:  # the file's is made with it
                self.final = np.zeros_like(self.obs[1:])
            lanes, values = final
            self.final[k][lanes] = np.stack([self.codec.flatten(value) for value in values])

    def enable_masks(self, held: np.ndarray) -> None:
        """Stage masks from now on; the lanes hold ``held``."""
        shape = (len(self.has_final) + 1, *held.shape)
        file = self.file if self.durable else None
        if file is not None and file.arrays["masks"].shape != shape:
            self.stop()  # no room for them in the file: each step that ends an episode is written at once
            file = None
        if file is not None:
            self.masks, self.final_masks = file.arrays["masks"], file.arrays["final_masks"]
        else:
            self.masks = np.zeros(shape, dtype=np.uint8)
            self.final_masks = np.zeros_like(self.masks[1:])
        self.masks[0] = held

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

    def load(self, arrays: Mapping[str, np.ndarray], k: int) -> int:
        """Hold the ``k`` steps a killed recorder staged (its stage file's ``arrays``,
        `log.stage_files`); returns ``k``."""
        self.obs[: k + 1] = arrays["obs"][: k + 1]
        for mine, theirs in zip(self.actions, (arrays["discrete"], arrays["continuous"])):
            mine[:k] = theirs[:k]
        self.rewards[:k], self.flags[:, :k] = arrays["rewards"][:k], arrays["flags"][:, :k]
        self.has_final[:k] = arrays["has_final"][:k]
        if len(arrays["final"]):
            self.final = arrays["final"].copy()
        if len(self.masks):
            self.masks[: k + 1] = arrays["masks"][: k + 1]
            self.final_masks[:k] = arrays["final_masks"][:k]
        return k

    def restart(self, k: int) -> None:
        """The block's ``k`` steps were written: the next block begins from what the lanes hold now."""
        self.obs[0] = self.obs[k]
        if len(self.masks):
            self.masks[0] = self.masks[k]
        self.has_final[:] = False


def _unfiled(k: int) -> None:
    """`Stage.staged` of a stage in memory only."""
