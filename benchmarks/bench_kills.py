"""The long run of the kill test: what a SIGKILL at a random moment loses from an episode log.

For each kind of recording (Gymnasium CartPole, a vector env x8, a PettingZoo parallel and AEC
env, Atari frames), ``--kills`` times: a recording to a fresh log (``python -m tests.killed``,
fixed seeds and actions in a cycle, printing how many episodes the env has reported ended after
each call returns) is killed with SIGKILL from this process after a random 0-1.5 s; then the log
is read back. Counted per kind:
- episodes reported ended before the kill, and of those, missing from the log (lost);
- logged episodes that no plain loop over the bare env with the same seeds and actions played
  (a part of an episode, or rows of two): read back wrong;
- resumes (3 more episodes) that rewrote an earlier episode or left a torn tail.
The same checks as ``tests/test_log.py``'s kill test, which CI runs with 3 kills per kind.
Run: python benchmarks/bench_kills.py [--kills N] [--seed S]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import flexibuff_envs as fe
from flexibuff_envs import log

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import killed  # the recording the kill test kills, and its plain loops


def same(a: fe.FlexiBatch, b: fe.FlexiBatch) -> bool:
    return bool(np.array_equal(a.obs, b.obs) and np.array_equal(a.individual_rewards, b.individual_rewards))


def run(kind: str, kills: int, rng: np.random.Generator, root: Path) -> dict[str, int]:
    reference = killed.reference(kind)
    counts = dict.fromkeys(("reported", "logged", "lost", "wrong", "resume_faults"), 0)
    for kill in range(kills):
        directory = root / f"{kind}{kill}"
        reported = killed.kill_after(kind, directory, rng.uniform(0.0, 1.5))
        logged = list(fe.FlexibleBuffer.open(directory).episodes())
        counts["reported"] += reported
        counts["logged"] += len(logged)
        counts["lost"] += max(0, reported - len(logged))
        counts["wrong"] += sum(
            not np.array_equal(reference.get(batch.obs.tobytes(), np.nan), batch.individual_rewards) for batch in logged
        )
        resumed = killed.recording(kind, directory, "3")
        resumed.communicate(timeout=120)
        again = list(fe.FlexibleBuffer.open(directory).episodes())
        whole = (
            resumed.returncode == 0
            and len(again) >= len(logged) + 3
            and all(same(a, b) for a, b in zip(logged, again))
            and log.verify(directory).torn == ()
        )
        counts["resume_faults"] += not whole
        shutil.rmtree(directory)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=10, help="kills per kind")
    parser.add_argument("--seed", type=int, default=0, help="seed of the moments the kills land")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"SIGKILL at a random moment (0-1.5 s into a recording), {args.kills} kills per kind, seed {args.seed}")
    print(
        f"  {'recording':<46} {'kills':>5} {'ended':>8} {'logged':>8} {'ended, lost':>12} "
        f"{'read back wrong':>16} {'resume faults':>14}"
    )
    total = dict.fromkeys(("kills", "reported", "logged", "lost", "wrong", "resume_faults"), 0)
    names = {
        "gym": "CartPole-v1",
        "vector": "CartPole-v1 x8 (SyncVectorEnv)",
        "parallel": "simple_spread_v3 (parallel)",
        "aec": "connect_four_v3 (AEC)",
        "atari": "ALE/Pong-v5 frames",
        "atari vector": "ALE/Pong-v5 frame stacks x4 (SyncVectorEnv)",
    }
    with tempfile.TemporaryDirectory() as root:
        for kind in killed.KINDS:
            counts = run(kind, args.kills, rng, Path(root))
            print(
                f"  {names[kind]:<46} {args.kills:>5} {counts['reported']:>8} {counts['logged']:>8} "
                f"{counts['lost']:>12} {counts['wrong']:>16} {counts['resume_faults']:>14}"
            )
            total["kills"] += args.kills
            for key in counts:
                total[key] += counts[key]
    print(
        f"  {'all':<46} {total['kills']:>5} {total['reported']:>8} {total['logged']:>8} {total['lost']:>12} "
        f"{total['wrong']:>16} {total['resume_faults']:>14}"
    )
    print(
        "ended: episodes the env had reported ended when the kill landed; logged: episodes the log "
        "held after it (more: episodes that ended after the last report); lost: ended ones missing"
    )


if __name__ == "__main__":
    main()
