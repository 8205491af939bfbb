"""Fuzzing buffer files: mutate real files, load them, use what loads; anything but a
`BufferFileError` (or a buffer that works) is a finding.

Mutations act where a hostile file can: raw bytes (checksums then usually catch them), the JSON
header with its checksum recomputed (so the checks behind the checksum are reached), the
arrays with their checksum recomputed, and the length. `tests/test_fuzz_files.py` runs a short
budget of it in CI through hypothesis; a long run is::

    python tests/fuzz_files.py --runs 200000           # prints runs/s and each distinct site found
    python tests/fuzz_files.py --logs --runs 20000     # episode logs: header, commit entries, columns
    python tests/fuzz_files.py --atheris -atheris_runs=200000   # coverage-guided, if atheris is installed
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import struct
import sys
import tempfile
import time
import traceback
import warnings
import zlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import flexibuff_envs as fe

warnings.filterwarnings("ignore")

#: exceptions a loaded (possibly odd) buffer may raise when used as documented
USE_ERRORS = (fe.EmptyBufferError,)


def seed_files(directory: Path) -> list[bytes]:
    """Real files of several layouts: CartPole (Box; raw, and its observations compressed),
    FrozenLake (categories, via a vector env), Taxi with masks, and the format 1-3 fixtures."""
    out = []
    for make, steps in (
        (lambda: gym.make("CartPole-v1"), 60),
        (lambda: gym.make_vec("FrozenLake-v1", num_envs=2, max_episode_steps=6), 30),
        (lambda: gym.make("Taxi-v4", max_episode_steps=5), 40),
    ):
        env = fe.record(make(), num_steps=40, seed=0)
        env.reset(seed=0)
        env.action_space.seed(0)
        for _ in range(steps):
            result = env.step(env.action_space.sample())
            if not isinstance(result[2], np.ndarray) and (result[2] or result[3]):
                env.reset()
        path = directory / f"seed{len(out)}.fbuf"
        env.buffer.save(path)
        out.append(path.read_bytes())
        if len(out) == 1:  # and compressed (format 5): zstd frames, their sizes
            env.buffer.save(path, compress={"obs": "zstd"})
            out.append(path.read_bytes())
    own = fe.record(gym.make("CartPole-v1"), num_steps=40, seed=0, extra_fields={"hidden": (3,), "tick": ((), "int8")})
    own.reset(seed=0)
    for t in range(50):  # fields of its own and prioritized replay's priorities
        own.annotate(hidden=np.full(3, t), tick=t)
        if any(own.step(t % 2)[2:4]):
            own.reset()
    own.buffer.update_priorities(np.arange(10), 3.0)
    out.append(Path(own.buffer.save(directory / "seed_own.fbuf")).read_bytes())
    data = Path(__file__).parent / "data"
    out += [(data / f"format{v}.fbuf").read_bytes() for v in (1, 2, 3)]
    return out


def _split(raw: bytes) -> tuple[int, bytes, bytes] | None:
    if len(raw) < 20 + 16:
        return None
    _, version, length = struct.unpack("<8sIQ", raw[:20])
    start = 20 + length + -(20 + length) % 64
    if start > len(raw) - 16 or version not in (2, 3, 4, 5):
        return None
    return version, raw[20 : 20 + length], raw[start:-16]


def _join(version: int, blob: bytes, data: bytes) -> bytes:
    prefix = struct.pack("<8sIQ", b"FLEXIBUF", version, len(blob)) + blob
    prefix += b"\0" * (-len(prefix) % 64)
    return prefix + data + struct.pack("<II8s", zlib.crc32(prefix), zlib.crc32(data), b"FBUF-END")


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, 1, -1, 2**31, -(2**63), 2**64, 10**30])
    if kind == 2:
        return rng.random() * 10 ** rng.randrange(-3, 30)
    if kind == 3:
        return rng.choice(["", "|O", "<f8", "object", "x" * 100, "index", "tail", "obs", "PCG64", "zstd"])
    if kind == 4:
        return float(rng.choice(["nan", "inf", "-inf"]))
    if kind == 5:
        return [rng.randrange(-5, 10 ** rng.randrange(1, 12)) for _ in range(rng.randrange(1, 4))]
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["name", "dtype", "shape", "offset", "part", "start", "codec", "stored", "x"]
    return {rng.choice(keys): _random_json(rng, depth + 1)}


def _mutate_json(value: Any, rng: random.Random) -> Any:
    """``value`` with one randomly chosen node replaced, removed, grown or nudged."""
    if isinstance(value, (dict, list)) and value and rng.random() < 0.8:
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        key = rng.choice(keys)
        roll = rng.random()
        if roll < 0.1:
            del value[key]
        elif roll < 0.15 and isinstance(value, dict):
            value[rng.choice(["extra", "rows", "written", "part", "width", "codec", "stored"])] = _random_json(rng)
        elif roll < 0.2 and isinstance(value, list):
            value.append(_random_json(rng) if rng.random() < 0.5 else value[key])
        else:
            value[key] = _mutate_json(value[key], rng)
        return value
    if isinstance(value, bool) or value is None:
        return _random_json(rng)
    if isinstance(value, int):
        return rng.choice(
            [value + 1, value - 1, -value, value * 2, value + 64, 0, 10 ** rng.randrange(1, 25), _random_json(rng)]
        )
    return _random_json(rng)


def mutate(raw: bytes, rng: random.Random) -> bytes:
    """One hostile variant of the real file ``raw``."""
    parts = _split(raw)
    roll = rng.random()
    if parts is not None and roll < 0.6:  # the header, checksums recomputed
        version, blob, data = parts
        header = json.loads(blob)
        for _ in range(rng.randrange(1, 4)):
            header = _mutate_json(header, rng)
        return _join(version, json.dumps(header).encode(), data)
    if parts is not None and roll < 0.8 and parts[2]:  # the arrays, checksum recomputed
        version, blob, data = parts
        spoiled = bytearray(data)
        for _ in range(rng.randrange(1, 9)):
            spoiled[rng.randrange(len(spoiled))] = rng.randrange(256)
        return _join(version, blob, bytes(spoiled))
    spoiled = bytearray(raw)
    if roll < 0.9:
        for _ in range(rng.randrange(1, 5)):
            spoiled[rng.randrange(len(spoiled))] ^= 1 << rng.randrange(8)
        return bytes(spoiled)
    return bytes(spoiled[: rng.randrange(len(spoiled))]) if rng.random() < 0.7 else bytes(spoiled) + b"\0" * 64


def use(buffer: fe.FlexibleBuffer, directory: Path) -> None:
    """What a user does with a loaded buffer."""
    try:
        buffer.sample_transitions(8)
        buffer.sample_transitions(4, as_torch=False, idx=np.arange(min(len(buffer), 3)))
        if buffer.n_episodes:
            buffer.sample_episodes(n_episodes=1)
        buffer.sample_sequences(2, 3)
        next(iter(buffer.minibatches(16)))
    except USE_ERRORS:
        pass
    buffer.episode_stats()
    fe.FlexibleBuffer.load(buffer.save(directory / "again.fbuf"))


def site(error: BaseException) -> str:
    """Where ``error`` was raised, as ``Type at file:line``."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{type(error).__name__} at {Path(frame.filename).name}:{frame.lineno}"


def outcome(raw: bytes, directory: Path, mmap: bool) -> str | None:
    """None when the file loads and works, or is refused with a BufferFileError; else the site."""
    path = directory / "fuzzed.fbuf"
    path.write_bytes(raw)
    try:
        buffer = fe.FlexibleBuffer.load(path, mmap=mmap)
    except fe.BufferFileError:
        return None
    except Exception as error:  # noqa: BLE001 - every other exception is a finding
        return site(error)
    try:
        use(buffer, directory)
    except Exception as error:  # noqa: BLE001
        return "after load: " + site(error)
    return None


# ---------------------------------------------------------------------- episode logs

Log = dict[str, bytes]  # a log directory: file name -> bytes


def seed_logs(directory: Path) -> list[Log]:
    """Real logs of several layouts: CartPole (Box), FrozenLake (categories), Taxi with masks,
    each of several commits, the ring smaller than the log; and each as a recording killed
    before it folded its journal leaves it (its files read while the writer has them open)."""
    out = []
    for make, steps in (
        (lambda: gym.make("CartPole-v1"), 120),
        (lambda: gym.make("FrozenLake-v1", max_episode_steps=6), 60),
        (lambda: gym.make("Taxi-v4", max_episode_steps=5), 40),
    ):
        path = directory / f"log{len(out)}"
        env = fe.record(make(), num_steps=40, seed=0, log=path)
        env.reset(seed=0)
        env.action_space.seed(0)
        for k in range(steps):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
            if k == steps // 2:
                env.buffer.sync_log()  # the episodes so far folded, the rest in the journal
        out.append(log_files(path))  # killed here: markers in the journal, rows in the ring's files
        env.close()
        out.append(log_files(path))
    env = gym.wrappers.FrameStackObservation(  # stacks of 3 [2, 2, 1] frames, kept as zstd frames a frame a row
        gym.wrappers.ReshapeObservation(gym.make("CartPole-v1"), (2, 2, 1)), 3
    )
    buffer = fe.FlexibleBuffer.from_spec(fe.infer_spec(env), num_steps=40)
    buffer.log_to(directory / "packed", compress={"obs": "zstd"})
    env = fe.record(env, buffer)
    env.reset(seed=0)
    env.action_space.seed(0)
    for k in range(120):
        if any(env.step(env.action_space.sample())[2:4]):
            env.reset()
        if k == 60:
            buffer.sync_log()
    out.append(log_files(directory / "packed"))
    buffer.close_log()
    out.append(log_files(directory / "packed"))
    vector = fe.record(
        gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync"), num_steps=40, log=directory / "vec"
    )
    vector.reset(seed=0)
    rng = np.random.default_rng(0)
    for k in range(60):
        vector.step(rng.integers(0, 2, 4))
        if k > 40 and vector._recorder._stage.flags[:, : vector._recorder._k].any():
            break
    out.append(log_files(directory / "vec"))  # killed with episodes ended in its stage's steps
    vector.close()
    return out


def log_files(path: Path) -> Log:
    """The files of the log ``path``, its ring's (``ring/...``) among them."""
    return {str(file.relative_to(path)): file.read_bytes() for file in sorted(path.rglob("*")) if file.is_file()}


def _rejournaled(files: Log, rng: random.Random) -> Log:
    """``files`` with one number of a journal record's header changed, or bytes of its body, and
    its checksums made right, so that what lies behind them is reached."""
    from flexibuff_envs.log.journal import _RECORD, JOURNAL, RECORD_BYTES

    raw = bytearray(files[JOURNAL])
    starts, at = [], 0
    while at + RECORD_BYTES <= len(raw) and raw[at : at + 8] in (b"FBJOURNL", b"FBJRMARK"):
        starts.append(at)
        at += RECORD_BYTES + _RECORD.unpack(bytes(raw[at : at + _RECORD.size]))[-2]
    at = rng.choice(starts)
    fields = list(_RECORD.unpack(bytes(raw[at : at + _RECORD.size])))
    body = slice(at + RECORD_BYTES, at + RECORD_BYTES + fields[-2])
    if rng.random() < 0.5:  # first, episodes, rows, a chain's slots or the body's size
        k = rng.randrange(1, len(fields) - 1)
        fields[k] = rng.choice([0, 1, fields[k] + 1, max(fields[k] - 1, 0), fields[k] * 2, 2**40, 2**63])
    else:
        for _ in range(rng.randrange(1, 5)):
            raw[rng.randrange(body.start, body.stop)] = rng.randrange(256)
        fields[-1] = zlib.crc32(bytes(raw[body]))
    head = _RECORD.pack(*fields)
    raw[at : at + RECORD_BYTES] = head + struct.pack("<I", zlib.crc32(head))
    return {**files, JOURNAL: bytes(raw)}


def _restaged(files: Log, name: str, rng: random.Random) -> Log:
    """``files`` with one number of the stage file ``name`` changed (its header's, its word, a
    lane's, a snapshot's) and the checksums over it made right, so that what they guard is reached."""
    from flexibuff_envs.log.stage_files import _BYTES, _HEAD, _WORD, Layout, _crc, _views

    raw = bytearray(files[name])
    at = rng.choice([*range(8, _HEAD.size, 8), _WORD, *range(_BYTES, min(len(raw), _BYTES + 1024) - 7, 8)])
    value = int.from_bytes(raw[at : at + 8], "little", signed=True)
    new = rng.choice([0, 1, -1, value + 1, value - 1, value * 2, 1 << 40, (1 << 63) - 1])
    raw[at : at + 8] = max(min(new, (1 << 63) - 1), -(1 << 63)).to_bytes(8, "little", signed=True)
    raw[_HEAD.size : _WORD] = zlib.crc32(bytes(raw[: _HEAD.size])).to_bytes(8, "little")
    _, n, block, width, dtype, *rest = _HEAD.unpack(bytes(raw[: _HEAD.size]))
    try:  # the snapshots' checksums too, where the header still describes the file
        snapshots = _views(raw, Layout(n, block, width, np.dtype(dtype.strip().decode()), *rest))["snapshots"]  # type: ignore[arg-type]
        for slot in snapshots:
            slot[2] = _crc(slot)
    except (ValueError, TypeError, UnicodeDecodeError):
        pass
    return {**files, name: bytes(raw)}


def _recommitted(files: Log) -> Log:
    """``files`` with every commit entry's data checksum made right for the bytes as they are
    (entries as they are otherwise), so that what lies behind the checksums is reached."""
    from flexibuff_envs import log
    from flexibuff_envs.log.format import EPISODE_LENGTHS

    columns = [
        log.Column(c["name"], c["part"], c["per_agent"], np.dtype(c["dtype"]), tuple(c["shape"]), c.get("codec"))
        for c in json.loads(files[log.HEADER][20:-4])["columns"]
    ]
    raw, out, before = files.get(log.COMMITS, b""), bytearray(), log.Commit()
    for at in range(0, len(raw) - log.ENTRY_BYTES + 1, log.ENTRY_BYTES):
        fields = list(struct.unpack("<8sQQQ3QI", raw[at : at + log.ENTRY_BYTES - 4]))
        commit = log.Commit(fields[1], fields[2], fields[3], tuple(fields[4:7]))
        crc = 0
        for column in [EPISODE_LENGTHS, *columns]:
            data, lo, hi = files.get(column.file, b""), before.length(column), commit.length(column)
            if column.codec is not None:  # its frames first: from the end ``before`` counts to ``commit``'s
                start, end = (int.from_bytes(data[at - 8 : at], "little") if at >= 8 else 0 for at in (lo, hi))
                crc = zlib.crc32(files.get(column.frames_file, b"")[start:end], crc)
            crc = zlib.crc32(data[lo:hi], crc)
        fields[-1], before = crc, commit
        body = struct.pack("<8sQQQ3QI", *fields)
        out += body + struct.pack("<I", zlib.crc32(body))
    return {**files, log.COMMITS: bytes(out)}


def mutate_log(files: Log, rng: random.Random) -> Log:
    """One hostile variant of the real log ``files``."""
    from flexibuff_envs import log

    files = dict(files)
    if "synced.fblog" in files and rng.random() < 0.3:  # synced in another boot, naming any commit
        body = struct.pack("<8s40sq", b"FBSYNCED", b"another boot", rng.randrange(-3, 40))
        files["synced.fblog"] = body + struct.pack("<I", zlib.crc32(body))
    if files.get("journal.fblog", b"")[:8] in (b"FBJOURNL", b"FBJRMARK") and rng.random() < 0.4:
        return _rejournaled(files, rng)
    stages = [name for name in files if name.startswith("ring/stage")]
    if stages and rng.random() < 0.3:
        return _restaged(files, rng.choice(stages), rng)
    if "ring/ring.json" in files and rng.random() < 0.2:  # the killed recording's ring: its index
        data = _mutate_json(json.loads(files["ring/ring.json"]), rng)
        return {**files, "ring/ring.json": json.dumps(data).encode()}
    roll = rng.random()
    if roll < 0.35:  # the header's JSON, its checksum recomputed
        data = json.loads(files[log.HEADER][20:-4])
        for _ in range(rng.randrange(1, 4)):
            data = _mutate_json(data, rng)
        blob = json.dumps(data).encode()
        version = struct.unpack("<I", files[log.HEADER][8:12])[0]
        prefix = struct.pack("<8sIQ", b"FBLOGHDR", version, len(blob)) + blob
        files[log.HEADER] = prefix + struct.pack("<I", zlib.crc32(prefix))
        return files
    if roll < 0.55:  # a commit entry's numbers, its own checksum recomputed
        raw = bytearray(files[log.COMMITS])
        at = rng.randrange(max(1, len(raw) // log.ENTRY_BYTES)) * log.ENTRY_BYTES
        fields = list(struct.unpack("<8sQQQ3QI", bytes(raw[at : at + log.ENTRY_BYTES - 4])))
        k = rng.randrange(1, 7)  # number, rows, episodes or a tail count
        fields[k] = rng.choice([0, 1, fields[k] + 1, max(fields[k] - 1, 0), fields[k] * 2, 2**40, 2**63])
        body = struct.pack("<8sQQQ3QI", *fields)
        raw[at : at + log.ENTRY_BYTES] = body + struct.pack("<I", zlib.crc32(body))
        files[log.COMMITS] = bytes(raw)
        return files
    name = rng.choice(sorted(files))
    spoiled = bytearray(files[name])
    if roll < 0.8 and spoiled:  # a file's bytes, the commits' checksums recomputed
        for _ in range(rng.randrange(1, 9)):
            spoiled[rng.randrange(len(spoiled))] = rng.randrange(256)
        return _recommitted({**files, name: bytes(spoiled)}) if name != log.HEADER else {**files, name: bytes(spoiled)}
    if roll < 0.9:
        files[name] = bytes(spoiled[: rng.randrange(len(spoiled) + 1)])
    elif rng.random() < 0.5:
        files[name] = bytes(spoiled) + bytes(rng.randrange(1, 200))
    else:
        del files[name]
    return files


def outcome_log(files: Log, directory: Path, mmap: bool) -> str | None:
    """None when the log opens and works (or verifies), or is refused with a BufferFileError
    naming one of its files; else the site."""
    from flexibuff_envs import log

    target = directory / "fuzzed.log"
    shutil.rmtree(target, ignore_errors=True)
    for name, data in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)
    for read in (lambda: fe.FlexibleBuffer.open(target, mmap=mmap), lambda: log.verify(target)):
        try:
            opened = read()
        except fe.BufferFileError as error:
            if not str(error).startswith(str(target)):
                return f"BufferFileError not naming the log: {error}"
            continue
        except Exception as error:  # noqa: BLE001 - every other exception is a finding
            return site(error)
        if isinstance(opened, fe.FlexibleBuffer):
            try:
                use(opened, directory)
            except fe.BufferFileError as error:  # a mapped compressed row is checked as it is decoded
                if not (mmap and re.match(rf"{re.escape(str(target))}/\S+\.zst: row \d+.* is corrupt", str(error))):
                    return "after open: " + site(error)
            except Exception as error:  # noqa: BLE001
                return "after open: " + site(error)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--atheris", action="store_true", help="coverage-guided, with atheris")
    parser.add_argument("--logs", action="store_true", help="fuzz episode logs instead of buffer files")
    args, rest = parser.parse_known_args()
    directory = Path(tempfile.mkdtemp(prefix="fbuf-fuzz-"))
    seeds = seed_files(directory)
    logs = seed_logs(directory) if args.logs else []
    found: dict[str, int] = {}

    def one(data: bytes) -> None:
        rng = random.Random(data)
        log = mutate_log(logs[rng.randrange(len(logs))], rng) if args.logs else None
        raw = mutate(seeds[rng.randrange(len(seeds))], rng)
        for mmap in (False, True):
            where = outcome_log(log, directory, mmap) if log is not None else outcome(raw, directory, mmap)
            if where is not None:
                if where not in found:
                    print(f"new site: {where}", flush=True)
                found[where] = found.get(where, 0) + 1

    start = time.perf_counter()
    if args.atheris:
        import atheris

        atheris.instrument_all()  # coverage of everything loaded, flexibuff_envs included
        atheris.Setup([sys.argv[0], *rest], one)
        atheris.Fuzz()
    else:
        for run in range(args.runs):
            one(struct.pack("<QQ", args.seed, run))
    seconds = time.perf_counter() - start
    print(
        f"{args.runs:,} runs (each file loaded read and mapped) in {seconds:.0f} s; "
        f"{len(found)} distinct sites other than BufferFileError: {found}"
    )


if __name__ == "__main__":
    main()
