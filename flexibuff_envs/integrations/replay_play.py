"""Stepping recorded actions through a fresh env, recorded by the recorder of its API into a
buffer of the replay's own (`replay`): Gymnasium (a vector recording's lane too), parallel and
AEC PettingZoo envs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Box

from flexibuff_envs.files.chunk import check_layout
from flexibuff_envs.index import episode_table
from flexibuff_envs.integrations.tables import episode_arrays
from flexibuff_envs.recording import GymRecorder
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.actions import action_decoder, actions_of

#: one block of episodes, back to back, as `episode_arrays` gives them
Arrays = dict[str, np.ndarray]
#: the fields a replay must give again (actions are what it gives the env; values, log probs
#: and feedback are the agent's and the user's, not the env's)
COMPARED = (
    "obs",
    "obs_",
    "individual_rewards",
    "terminated",
    "truncated",
    "active",
    "action_mask",
    "action_mask_",
    "state",
    "state_",
)
#: what a replay gathers of the recording and of its replay: what it compares, and the actions
GATHERED = (*COMPARED, "discrete_actions", "continuous_actions")
_NONE = np.zeros(0)


class Replayer:
    """One env ``make()`` makes, recorded into a buffer of ``capacity`` rows: `play` replays
    blocks of a chain's episodes in turn, each reset with its seed and stepped with its actions."""

    def __init__(self, spec: BufferSpec, api: str, make: Callable[[], Any], capacity: int) -> None:
        self.spec, self.env = spec, make()
        try:
            if api in ("gymnasium", "vector"):
                self.recorder: Any = GymRecorder(self.env, num_steps=capacity)
                self._episode = _gym
            else:  # PettingZoo's: imported only when asked for
                from flexibuff_envs.recording import AECRecorder, ParallelRecorder

                made = ParallelRecorder if api == "parallel" else AECRecorder
                self.recorder = made(self.env, num_steps=capacity, global_reward="none")
                self._episode = _parallel if api == "parallel" else _aec
            check_layout(self.recorder.buffer.spec, spec, "the env made again")
        except BaseException:
            self.env.close()
            raise
        # a Gymnasium env of array observations, without masks or a state: stepped bare, its rows
        # made as the recorder makes them (the values in the layout's dtype), at the env's own speed
        space = getattr(self.env, "observation_space", None)
        self._bare = api in ("gymnasium", "vector") and isinstance(space, Box) and not spec.action_mask
        self._obs_dtype = self.recorder.buffer.field("obs").dtype
        self.cut: list[int] = []  # of the block played: AEC games the user cut mid-game (their last moves are not kept)

    def _play_bare(
        self, seeds: Sequence[int], d: np.ndarray | None, c: np.ndarray | None, bounds: np.ndarray
    ) -> tuple[Arrays, np.ndarray]:
        """`play` of the bare env (`_bare`): its rows gathered in lists, made arrays once."""
        env = self.env
        actions = actions_of(env.action_space, None if d is None else d[0], None if c is None else c[0])
        steps: list[tuple[Any, ...]] = []
        lengths = []
        for k, seed in enumerate(seeds):
            lo, hi, before = int(bounds[k]), int(bounds[k + 1]), len(steps)
            now, _ = env.reset(seed=seed if seed >= 0 else None)
            step = env.step
            for action in actions[lo:hi]:
                then, reward, terminated, truncated, _ = step(action)
                steps.append((now, then, reward, terminated, truncated))
                now = then
                if terminated or truncated:
                    break
            else:  # it outlived its actions: cut there, as a recorder's truncate() cuts
                steps[-1] = (*steps[-1][:4], True)
            lengths.append(len(steps) - before)
        obs, after, rewards, ended, cut = zip(*steps) if steps else ((),) * 5
        rows = len(steps)
        flags = np.array([ended, cut], dtype=bool).reshape(2, -1).T
        arrays = {
            "obs": np.asarray(obs).astype(self._obs_dtype, copy=False).reshape(1, rows, -1),
            "obs_": np.asarray(after).astype(self._obs_dtype, copy=False).reshape(1, rows, -1),
            "individual_rewards": np.asarray(rewards, dtype=np.float32).reshape(1, rows),
            "terminated": flags[None, :, 0],
            "truncated": flags[None, :, 1],
            "active": np.ones((1, rows), dtype=bool),
        }
        return arrays, np.array(lengths, dtype=np.int64)

    def play(self, seeds: Sequence[int], recorded: Arrays, lengths: np.ndarray) -> tuple[Arrays, np.ndarray]:
        """The episodes of ``recorded`` (back to back, of ``lengths``) replayed: their rows back
        to back and their lengths. An episode that outlives its recorded actions is cut there,
        as a recording cut by the user was."""
        d, c = recorded.get("discrete_actions"), recorded.get("continuous_actions")
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        self.cut.clear()
        if self._bare:
            return self._play_bare(seeds, d, c, bounds)
        buffer = self.recorder.buffer
        buffer.clear()
        for k, seed in enumerate(seeds):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            self.recorder.reset(seed=seed if seed >= 0 else None)
            if self._episode(
                self.recorder,
                self.spec,
                None if d is None else d[:, lo:hi],
                None if c is None else c[:, lo:hi],
                recorded["active"][:, lo:hi],
            ):
                self.cut.append(k)
        table = episode_table(buffer._index.read())
        arrays = episode_arrays(buffer.gather(table.all_rows()[0], fields=GATHERED), buffer.spec)
        return arrays, table.lengths

    def close(self) -> None:
        self.env.close()


def _action(decode: Callable[..., Any], d: np.ndarray | None, c: np.ndarray | None, agent: int, t: int) -> Any:
    return decode(_NONE if d is None else d[agent, t], _NONE if c is None else c[agent, t])


def _gym(recorder: Any, spec: BufferSpec, d: np.ndarray | None, c: np.ndarray | None, active: np.ndarray) -> bool:
    decode = action_decoder(recorder.action_space)
    for t in range(active.shape[1]):
        _, _, terminated, truncated, _ = recorder.step(_action(decode, d, c, 0, t))
        if terminated or truncated:
            return False
    recorder.truncate()
    return False


def _parallel(recorder: Any, spec: BufferSpec, d: np.ndarray | None, c: np.ndarray | None, active: np.ndarray) -> bool:
    index = {agent: i for i, agent in enumerate(spec.agent_ids)}
    decode = {agent: action_decoder(recorder.action_space(agent)) for agent in spec.agent_ids}
    for t in range(active.shape[1]):
        if not recorder.agents:
            return False
        recorder.step({a: _action(decode[a], d, c, index[a], t) for a in recorder.agents})
    if recorder.agents:
        recorder.truncate()
    return False


def _aec(recorder: Any, spec: BufferSpec, d: np.ndarray | None, c: np.ndarray | None, active: np.ndarray) -> bool:
    """Row ``k`` holds each agent's ``k``-th turn: an agent plays its recorded turns (its active
    rows), and the episode is cut where one of them has none left, as the recording was (True:
    then the moves of turns left open at the cut, which a recording does not keep, are missing)."""
    index = {agent: i for i, agent in enumerate(spec.agent_ids)}
    decode = {agent: action_decoder(recorder.action_space(agent)) for agent in spec.agent_ids}
    turns, recorded = [0] * len(index), active.sum(axis=1).tolist()
    for agent in recorder.agent_iter():
        _, _, terminated, truncated, _ = recorder.last()  # as a loop calls it: it closes the agent's transition
        if terminated or truncated:
            recorder.step(None)
            continue
        i = index[agent]
        if turns[i] >= recorded[i]:  # past its recorded turns: the user cut the game here
            recorder.truncate()
            return True
        recorder.step(_action(decode[agent], d, c, i, turns[i]))
        turns[i] += 1
    return False
