"""Stepping recorded actions through a fresh env, recorded by the recorder of its API into a
buffer of the replay's own (`replay`): Gymnasium (a vector recording's lane too), parallel and
AEC PettingZoo envs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flexibuff_envs.files.chunk import check_layout
from flexibuff_envs.integrations.tables import episode_arrays
from flexibuff_envs.recording import GymRecorder
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.actions import action_decoder

Arrays = dict[str, np.ndarray]
_NONE = np.zeros(0)


def play(
    spec: BufferSpec, seeds: Sequence[int], recorded: Sequence[Arrays], api: str, make: Callable[[], Any]
) -> list[Arrays]:
    """Each of ``recorded`` (a chain: `episode_arrays` of its episodes) replayed in turn in one
    env ``make()`` makes: reset with its seed (-1: none), stepped with its actions; an episode
    that outlives its recorded actions is cut there, as a recording cut by the user was."""
    env = make()
    steps = max(r["terminated"].shape[1] for r in recorded) + 2
    try:
        if api in ("gymnasium", "vector"):
            recorder: Any = GymRecorder(env, num_steps=steps)
            episode = _gym
        else:  # PettingZoo's: imported only when asked for
            from flexibuff_envs.recording import AECRecorder, ParallelRecorder

            made = ParallelRecorder if api == "parallel" else AECRecorder
            recorder, episode = (
                made(env, num_steps=steps, global_reward="none"),
                _parallel if api == "parallel" else _aec,
            )
        check_layout(recorder.buffer.spec, spec, "the env made again")
        out = []
        for seed, arrays in zip(seeds, recorded):
            recorder.buffer.clear()
            recorder.reset(seed=seed if seed >= 0 else None)
            episode(recorder, spec, arrays)
            held = list(recorder.buffer.episodes())
            out.append(episode_arrays(held[0], recorder.buffer.spec) if held else {})
        return out
    finally:
        env.close()


def _actions(arrays: Arrays) -> tuple[np.ndarray | None, np.ndarray | None]:
    return arrays.get("discrete_actions"), arrays.get("continuous_actions")


def _action(decode: Callable[..., Any], d: np.ndarray | None, c: np.ndarray | None, agent: int, t: int) -> Any:
    return decode(_NONE if d is None else d[agent, t], _NONE if c is None else c[agent, t])


def _gym(recorder: GymRecorder, spec: BufferSpec, arrays: Arrays) -> None:
    decode = action_decoder(recorder.action_space)
    d, c = _actions(arrays)
    for t in range(arrays["terminated"].shape[1]):
        _, _, terminated, truncated, _ = recorder.step(_action(decode, d, c, 0, t))
        if terminated or truncated:
            return
    recorder.truncate()


def _parallel(recorder: Any, spec: BufferSpec, arrays: Arrays) -> None:
    index = {agent: i for i, agent in enumerate(spec.agent_ids)}
    decode = {agent: action_decoder(recorder.action_space(agent)) for agent in spec.agent_ids}
    d, c = _actions(arrays)
    for t in range(arrays["terminated"].shape[1]):
        if not recorder.agents:
            return
        recorder.step({a: _action(decode[a], d, c, index[a], t) for a in recorder.agents})
    if recorder.agents:
        recorder.truncate()


def _aec(recorder: Any, spec: BufferSpec, arrays: Arrays) -> None:
    index = {agent: i for i, agent in enumerate(spec.agent_ids)}
    decode = {agent: action_decoder(recorder.action_space(agent)) for agent in spec.agent_ids}
    d, c = _actions(arrays)
    turns, rows = [0] * len(index), arrays["terminated"].shape[1]
    for agent in recorder.agent_iter():
        _, _, terminated, truncated, _ = recorder.last(observe=False)
        if terminated or truncated:
            recorder.step(None)
            continue
        i = index[agent]
        if turns[i] >= rows:  # past the recorded turns
            recorder.truncate()
            return
        recorder.step(_action(decode[agent], d, c, i, turns[i]))
        turns[i] += 1
