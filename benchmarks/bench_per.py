"""Prioritized replay at 1,000,000 rows: one sample(256) + update_priorities(256) cycle.

Side by side in one run, each buffer holding 1,000,000 CartPole-sized transitions (4 float obs,
a discrete action, a reward, flags) and drawing a batch of the fields a DQN reads:
- ours: `sample_transitions(256, prioritized=True, fields=...)` then `update_priorities`, and
  the same with 3-step returns (`n_step=3`, `discounts` added to the fields);
- ours while recording: one new step per cycle forgets the oldest row, which holds the
  smallest priority (the worst case for keeping the minimum: it is searched for every cycle);
- ours with 3-step returns while recording short episodes: 50,000 episodes of 20 rows held, and
  a new one each cycle (each n-step draw looks its rows' episodes up in the episode index);
- ours, FlexiBuff's way: `memory_weights` (`weighted=True`, a pass over every live row per
  batch) then `set_memory_weights`;
- Tianshou's `PrioritizedReplayBuffer` (`sample(256)` then `update_weight`);
- cpprb's `PrioritizedReplayBuffer` (C++; `sample(256, beta)` then `update_priorities`);
- TorchRL's `TensorDictPrioritizedReplayBuffer` (`sample()` then `update_priority`), when its
  compiled segment trees load; the reason is printed when they do not.
A peer that is not installed is reported, not hidden (`pip install -e '.[bench]'` installs them).
Medians of interleaved rounds, in microseconds.
Run: python benchmarks/bench_per.py [--rows 1000000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import flexibuff_envs as fe

Cycle = Callable[[], tuple[float, float]]
FIELDS = ("obs", "obs_", "discrete_actions", "individual_rewards", "terminated")


def transitions(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.random((rows, 4), dtype=np.float32),
        "act": rng.integers(0, 2, rows),
        "rew": np.ones(rows, dtype=np.float32),
        "obs_next": rng.random((rows, 4), dtype=np.float32),
        "done": np.zeros(rows, dtype=bool),
    }


def ours(rows: int, prioritized: bool, n_step: int | None = None) -> Cycle:
    buffer = fe.FlexibleBuffer(rows, 4, [2], individual_reward=True, seed=0, memory_weights=not prioritized)
    for _ in range(rows // 1000):  # episodes of 1,000 rows, claimed without stepping an env
        buffer.begin_episode()
        buffer.claim_rows(1000)
        buffer.end_episode()
    rng = np.random.default_rng(0)
    fields = FIELDS if n_step is None else (*FIELDS, "discounts")

    def cycle() -> tuple[float, float]:
        start = time.perf_counter()
        batch = buffer.sample_transitions(
            256, prioritized=prioritized, weighted=not prioritized, fields=fields, n_step=n_step
        )
        drawn = time.perf_counter()
        if prioritized:
            buffer.update_priorities(batch.idx, rng.random(256) + 1e-6)
        else:
            buffer.set_memory_weights(batch.idx, rng.random(256) + 1e-6)
        return drawn - start, time.perf_counter() - drawn

    return cycle


def ours_recording(rows: int) -> Cycle:
    buffer = fe.FlexibleBuffer(rows, 4, [2], individual_reward=True, seed=0)
    buffer.begin_episode()
    buffer.claim_rows(rows)  # a full ring; each further step forgets its oldest row
    held = np.arange(rows)
    buffer.sample_transitions(1, prioritized=True)
    buffer.update_priorities(held, 1.0 + held / rows)  # the older, the smaller
    rng = np.random.default_rng(0)

    def cycle() -> tuple[float, float]:
        buffer.claim_rows(1)
        start = time.perf_counter()
        batch = buffer.sample_transitions(256, prioritized=True, fields=FIELDS)
        drawn = time.perf_counter()
        buffer.update_priorities(batch.idx, 2.0 + rng.random(256))
        return drawn - start, time.perf_counter() - drawn

    return cycle


def ours_episodes(rows: int, length: int = 20) -> Cycle:
    buffer = fe.FlexibleBuffer(rows, 4, [2], individual_reward=True, seed=0)
    for _ in range(rows // length):
        buffer.begin_episode()
        buffer.claim_rows(length)
        buffer.end_episode()
    rng = np.random.default_rng(0)

    def cycle() -> tuple[float, float]:
        buffer.begin_episode()
        buffer.claim_rows(length)  # a new episode forgets the oldest
        buffer.end_episode()
        start = time.perf_counter()
        batch = buffer.sample_transitions(256, prioritized=True, fields=(*FIELDS, "discounts"), n_step=3)
        drawn = time.perf_counter()
        buffer.update_priorities(batch.idx, rng.random(256) + 1e-6)
        return drawn - start, time.perf_counter() - drawn

    return cycle


def tianshou_filled(rows: int) -> Any:
    """Tianshou's ``PrioritizedReplayBuffer`` (alpha 0.6, beta 0.4) holding ``rows`` transitions."""
    from tianshou.data import Batch, PrioritizedReplayBuffer

    data = transitions(rows)
    buffer = PrioritizedReplayBuffer(rows, alpha=0.6, beta=0.4)
    buffer.set_batch(
        Batch(
            obs=data["obs"],
            act=data["act"],
            rew=data["rew"],
            terminated=data["done"],
            truncated=data["done"],
            done=data["done"],
            obs_next=data["obs_next"],
            info=Batch(),
        )
    )
    buffer._size, buffer._insertion_idx = rows, 0  # filled whole, as add() would after `rows` calls
    buffer.init_weight(np.arange(rows))
    return buffer


def tianshou(rows: int) -> Cycle:
    buffer = tianshou_filled(rows)
    rng = np.random.default_rng(0)

    def cycle() -> tuple[float, float]:
        start = time.perf_counter()
        _, indices = buffer.sample(256)
        drawn = time.perf_counter()
        buffer.update_weight(indices, rng.random(256) + 1e-6)
        return drawn - start, time.perf_counter() - drawn

    return cycle


def cpprb(rows: int) -> Cycle:
    from cpprb import PrioritizedReplayBuffer

    data = transitions(rows)
    buffer = PrioritizedReplayBuffer(
        rows,
        {"obs": {"shape": 4}, "act": {"dtype": np.int64}, "rew": {}, "next_obs": {"shape": 4}, "done": {}},
        alpha=0.6,
    )
    buffer.add(obs=data["obs"], act=data["act"], rew=data["rew"], next_obs=data["obs_next"], done=data["done"])
    rng = np.random.default_rng(0)

    def cycle() -> tuple[float, float]:
        start = time.perf_counter()
        batch = buffer.sample(256, beta=0.4)
        drawn = time.perf_counter()
        buffer.update_priorities(batch["indexes"], rng.random(256) + 1e-6)
        return drawn - start, time.perf_counter() - drawn

    return cycle


def torchrl(rows: int) -> Cycle:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

    data = transitions(rows)
    buffer = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(rows), batch_size=256)
    buffer.extend(
        TensorDict(
            {
                "observation": torch.from_numpy(data["obs"]),
                "action": torch.from_numpy(data["act"]),
                "next": {"observation": torch.from_numpy(data["obs_next"]), "reward": torch.from_numpy(data["rew"])},
            },
            batch_size=[rows],
        )
    )
    rng = np.random.default_rng(0)

    def cycle() -> tuple[float, float]:
        start = time.perf_counter()
        batch = buffer.sample()
        drawn = time.perf_counter()
        buffer.update_priority(batch["index"], torch.from_numpy(rng.random(256) + 1e-6))
        return drawn - start, time.perf_counter() - drawn

    return cycle


Draw = Callable[[], tuple[np.ndarray, np.ndarray]]  # a batch's rows and their importance weights
Update = Callable[[np.ndarray, np.ndarray], None]


def weights_error(make: Callable[[int], tuple[Draw, Update]], rows: int = 10_000) -> float:
    """The largest relative error of a buffer's importance weights against Schaul et al.'s
    ``(N P(i)) ** -beta / max_j (N P(j)) ** -beta`` (alpha 0.6, beta 0.4), which is
    ``(p_i / p_min) ** (-alpha beta)`` over the priorities the rows hold, after 200 updates with
    what a DQN gives (``|TD error| + 1e-6``, the errors standard normal); ``make(rows)`` gives
    the buffer's draw and update."""
    draw, update = make(rows)
    rng = np.random.default_rng(1)
    held = np.ones(rows)  # every row starts at the highest priority given, 1
    for _ in range(200):
        idx = np.unique(draw()[0])
        priorities = np.abs(rng.normal(size=idx.size)) + 1e-6
        update(idx, priorities)
        held[idx] = priorities
    idx, weights = draw()
    expected = (held[idx] / held.min()) ** (-0.6 * 0.4)
    return float(np.max(np.abs(weights / expected - 1)))


def ours_weights(rows: int) -> tuple[Draw, Update]:
    buffer = fe.FlexibleBuffer(rows, 4, [2], seed=0, alpha=0.6)
    buffer.begin_episode()
    buffer.claim_rows(rows)
    buffer.end_episode()

    def draw() -> tuple[np.ndarray, np.ndarray]:
        batch = buffer.sample_transitions(256, prioritized=True, beta=0.4, fields=("obs",))
        return batch.idx, batch.weights

    return draw, buffer.update_priorities


def tianshou_weights(rows: int) -> tuple[Draw, Update]:
    buffer = tianshou_filled(rows)
    np.random.seed(1)  # Tianshou draws with numpy's global generator

    def draw() -> tuple[np.ndarray, np.ndarray]:
        batch, indices = buffer.sample(256)
        return indices, batch.weight

    return draw, buffer.update_weight


def cpprb_weights(rows: int) -> tuple[Draw, Update]:
    from cpprb import PrioritizedReplayBuffer

    buffer = PrioritizedReplayBuffer(rows, {"obs": {"shape": 4}}, alpha=0.6, eps=0.0)  # priorities as given
    buffer.add(obs=np.zeros((rows, 4)))

    def draw() -> tuple[np.ndarray, np.ndarray]:
        batch = buffer.sample(256, beta=0.4)
        return batch["indexes"].astype(np.int64), batch["weights"]

    return draw, buffer.update_priorities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cycles: dict[str, Cycle] = {
        "flexibuff_envs prioritized": ours(args.rows, True),
        "flexibuff_envs prioritized, n_step=3": ours(args.rows, True, 3),
        "flexibuff_envs prioritized, oldest row forgotten each cycle": ours_recording(args.rows),
        "flexibuff_envs prioritized, n_step=3, 20-row episodes, one more each cycle": ours_episodes(args.rows),
        "flexibuff_envs memory_weights (a pass per batch)": ours(args.rows, False),
    }
    for name, make in (
        ("Tianshou PrioritizedReplayBuffer", tianshou),
        ("cpprb PrioritizedReplayBuffer (C++)", cpprb),
        ("TorchRL TensorDictPrioritizedReplayBuffer", torchrl),
    ):
        try:
            cycles[name] = make(args.rows)
        except (ImportError, RuntimeError) as exc:  # not installed, or TorchRL's compiled trees do not load
            print(f"  {name}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cycles}
    for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits all alike
        for name, cycle in cycles.items():
            times[name] += [cycle() for _ in range(20)]
    print(
        "importance weights against (N P(i)) ** -beta / max, after 200 updates at 10,000 rows (largest relative error)"
    )
    for name, make in (("flexibuff_envs", ours_weights), ("Tianshou", tianshou_weights), ("cpprb", cpprb_weights)):
        try:
            print(f"  {name:<16} {weights_error(make):.2e}")
        except ImportError as exc:
            print(f"  {name:<16} not measured ({exc})")
    print(f"sample(256) + update(256) at {args.rows:,} rows, {args.rounds} rounds (median us)")
    floor = None
    for name, runs in times.items():
        draw = statistics.median(t[0] for t in runs) * 1e6
        update = statistics.median(t[1] for t in runs) * 1e6
        floor = floor or draw + update
        print(
            f"  {name:<75} sample {draw:8.1f}  update {update:8.1f}  total {draw + update:8.1f}  "
            f"{(draw + update) / floor:5.2f}x"
        )


if __name__ == "__main__":
    main()
