"""Buffer files from anyone: crafted headers, memory bombs, odd paths. Each either loads, with
memory in proportion to the file, or raises one BufferFileError naming the path and the problem."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import flexibuff_envs as fe
from flexibuff_envs.files.header import MAX_POSITION
from flexibuff_envs.testing.reference import play
from tests.envs import ToyEnv

Header = dict[str, Any]


def saved(tmp_path: Path, capacity: int = 3000, steps: int = 60) -> Path:
    env = fe.record(
        ToyEnv(spaces.Box(0, 1, (4,), np.float32), spaces.Discrete(3), lengths=(7, 5), mask_info=True),
        num_steps=capacity,
    )
    play(env, seed=0, steps=steps)
    return Path(env.buffer.save(tmp_path / "good.fbuf"))


def parts(raw: bytes) -> tuple[int, Header, bytes, int]:
    """(version, header, arrays, data crc) of a format-4 file."""
    _, version, length = struct.unpack("<8sIQ", raw[:20])
    start = 20 + length + -(20 + length) % 64
    _, data_crc, _ = struct.unpack("<II8s", raw[-16:])
    return version, json.loads(raw[20 : 20 + length]), raw[start:-16], data_crc


NULL = object()  # a change that makes the header JSON null
NESTED = "[" * 5000 + "]" * 5000  # deeper than Python's JSON parser can go
NEARLY = "[" * 900 + "]" * 900  # as deep as the parser goes, deeper than numpy's dimensions


def build(header: Header | Any, data: bytes, *, version: int = 4, data_crc: int | None = None) -> bytes:
    """A file with this header and arrays, its checksums right (the header's data_bytes too)."""
    if isinstance(header, dict) and "data_bytes" in header:
        header["data_bytes"] = len(data)
    blob = json.dumps(None if header is NULL else header).replace('"NESTED"', NESTED).replace('"NEARLY"', NEARLY)
    blob = blob.encode()
    prefix = struct.pack("<8sIQ", b"FLEXIBUF", version, len(blob)) + blob
    prefix += b"\0" * (-len(prefix) % 64)
    crc = zlib.crc32(data) if data_crc is None else data_crc
    return prefix + data + struct.pack("<II8s", zlib.crc32(prefix), crc, b"FBUF-END")


def crafted(tmp_path: Path, change: Callable[[Header], Any], **options: Any) -> Path:
    _, header, data, _ = parts(saved(tmp_path, **options).read_bytes())
    header = change(header) or header
    path = tmp_path / "crafted.fbuf"
    path.write_bytes(build(header, data))
    return path


def field(header: Header, name: str, part: str | None = None) -> Header:
    return next(f for f in header["fields"] if f["name"] == name and f.get("part") == part)


def lane(header: Header) -> Header:
    return header["lanes"][0]


CRAFTED: dict[str, tuple[Callable[[Header], Any], str]] = {  # change, what the error says
    "object obs dtype in the spec": (lambda h: h["spec"].update(obs_dtype="object"), "obs_dtype"),
    "object field dtype": (lambda h: field(h, "obs").update(dtype="|O"), "dtype"),
    "wider float field dtype": (lambda h: field(h, "obs").update(dtype="<f8"), "dtype"),
    "null header": (lambda h: NULL, "JSON dict"),
    "list header": (lambda h: [1, 2], "JSON dict"),
    "unknown key": (lambda h: h.update(extra=1), "unknown keys"),
    "missing key": (lambda h: h.pop("rng"), "lacks"),
    "negative offset": (lambda h: field(h, "G").update(offset=-64), "offset"),
    "overlapping arrays": (lambda h: field(h, "G").update(offset=0), "offset"),
    "negative written": (lambda h: lane(h).update(written=-5), "written"),
    "deep nesting": (lambda h: h.update(path="NESTED"), "JSON|nested"),
    "nesting the parser takes, as a path": (lambda h: h.update(path="NEARLY"), "path"),
    "nesting the parser takes, as episodes": (lambda h: lane(h).update(ended="NEARLY"), "ended"),
    "bad rng state": (lambda h: h["rng"]["state"].update(state="x"), "rng"),
    "huge rng state": (lambda h: h["rng"]["state"].update(state=1 << 200), "rng"),
    "lane larger than num_steps": (lambda h: h.update(num_steps=10), "live_start|rows"),
    "reversed episode": (lambda h: lane(h)["ended"][0].reverse(), "episode|whole"),
    "overlapping episodes": (
        lambda h: lane(h)["ended"][1].__setitem__(0, lane(h)["ended"][0][0]),
        "does not start where",
    ),
    "negative episode": (lambda h: lane(h)["ended"][0].__setitem__(0, -3), "episode 0 start"),
    "episode past the rows": (lambda h: lane(h)["ended"].append([0, 10**9, True]), "episode"),
    "recorded rows in no episode": (lambda h: lane(h).update(ended=lane(h)["ended"][1:]), "does not start where"),
    "many episodes in few rows": (lambda h: lane(h).update(ended=[[i, i + 1, True] for i in range(20_000)]), "episode"),
    "rows not where the positions lie": (lambda h: lane(h).update(rows=[5, 65]), "rows"),
    "field of another shape": (lambda h: field(h, "obs").update(shape=[1, 61, 4]), "shape"),
    "tail of no slot": (lambda h: field(h, "obs_", "tail").update(shape=[0, 4]), "shape"),
    "unknown field": (lambda h: field(h, "G").update(name="weights"), "unknown name"),
    "field missing": (lambda h: h["fields"].remove(field(h, "active")), "active"),
    "spec of other agents": (lambda h: h["spec"].update(n_agents=2), "agent_ids"),
    "gamma out of range": (lambda h: h.update(gamma=1.5), "gamma"),
    "version 0": (lambda h: None, "format 0"),
    "one-hot observations too wide to hand out": (
        lambda h: h["spec"].update(obs_size=2**31, obs_categories=[2**31]),
        "one-hot values",
    ),
}


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_header_is_one_buffer_file_error(tmp_path: Path, case: str, mmap: bool) -> None:
    change, says = CRAFTED[case]
    path = crafted(tmp_path, change)
    if case == "version 0":
        raw = bytearray(path.read_bytes())
        raw[8:12] = struct.pack("<I", 0)
        path.write_bytes(raw)
    with pytest.raises(fe.BufferFileError, match=f"^{path}: .*({says})"):
        fe.FlexibleBuffer.load(path, mmap=mmap)


def saved_own(tmp_path: Path) -> Path:
    """A file with fields of its own (a float and an int one) and prioritized replay's priorities."""
    env = fe.record(
        ToyEnv(spaces.Box(0, 1, (4,), np.float32), spaces.Discrete(3), lengths=(7, 5)),
        num_steps=40,
        extra_fields={"hidden": (3,), "tick": ((), "int64")},
    )
    env.reset(seed=0)
    for t in range(30):
        env.annotate(hidden=np.full(3, t), tick=t)
        if any(env.step(t % 3)[2:4]):
            env.reset()
    env.buffer.update_priorities(np.arange(5), 4.0)
    return Path(env.buffer.save(tmp_path / "own.fbuf"))


def spoil_priority(header: Header, data: bytes) -> bytes:
    meta = field(header, "priority")
    raw = bytearray(data)
    raw[meta["offset"] : meta["offset"] + 8] = np.float64(-1.0).tobytes()
    return bytes(raw)


CRAFTED_OWN: dict[str, tuple[Callable[[Header], Any], str]] = {  # change, what the error says
    "an object dtype of your own": (lambda h: h["spec"]["extra_fields"][0].__setitem__(2, "object"), "dtype"),
    "a field of your own named as a built-in": (
        lambda h: h["spec"]["extra_fields"][0].__setitem__(0, "obs"),
        "extra_fields",
    ),
    "a field of your own of a billion values": (
        lambda h: h["spec"]["extra_fields"][0].__setitem__(1, [1 << 30]),
        "extra_fields",
    ),
    "a field of your own declared twice": (
        lambda h: h["spec"]["extra_fields"].append(h["spec"]["extra_fields"][0]),
        "extra_fields",
    ),
    "an array of a field not declared": (lambda h: h["spec"].update(extra_fields=[]), "unknown name"),
    "priorities without the highest priority": (lambda h: h.pop("max_priority"), "max_priority"),
    "a negative highest priority": (lambda h: h.update(max_priority=-2.0), "max_priority"),
    "priorities as float32": (lambda h: field(h, "priority").update(dtype="<f4"), "dtype"),
    "alpha not a number": (lambda h: h.update(alpha="0.6"), "alpha"),
    "a negative priority": (lambda h: None, "priority holds a value that is negative"),
}


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("case", list(CRAFTED_OWN))
def test_crafted_fields_of_your_own_and_priorities_are_one_buffer_file_error(
    tmp_path: Path, case: str, mmap: bool
) -> None:
    change, says = CRAFTED_OWN[case]
    _, header, data, _ = parts(saved_own(tmp_path).read_bytes())
    assert fe.FlexibleBuffer.load(tmp_path / "own.fbuf", mmap=mmap).spec.extra_fields  # the good file loads
    change(header)
    if case == "a negative priority":
        data = spoil_priority(header, data)
    path = tmp_path / "crafted.fbuf"
    path.write_bytes(build(header, data))
    with pytest.raises(fe.BufferFileError, match=f"^{path}: .*({says})"):
        fe.FlexibleBuffer.load(path, mmap=mmap)


def test_inspect_prints_one_line_for_a_crafted_file(tmp_path: Path) -> None:
    path = crafted(tmp_path, lambda h: lane(h)["ended"].append([0, 10**9, True]))
    result = subprocess.run(
        [sys.executable, "-m", "flexibuff_envs", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"flexibuff-envs inspect: {path}: ")


def test_next_value_indices_are_checked_once_read(tmp_path: Path) -> None:
    good = saved(tmp_path)
    _, header, data, _ = parts(good.read_bytes())
    index = field(header, "obs_", "index")
    values = np.frombuffer(data, dtype="<i4", count=int(np.prod(index["shape"])), offset=index["offset"]).copy()
    for bad, says in ((10**6, "outside"), (int(values.max()), "two rows one stored slot")):
        spoiled = values.copy()
        spoiled[0] = (
            bad
            if bad != values.max()
            else values[values > 0][0]
            if values[0] != values[values > 0][0]
            else values[values > 0][1]
        )
        raw = bytearray(data)
        raw[index["offset"] : index["offset"] + spoiled.nbytes] = spoiled.tobytes()
        path = tmp_path / "spoiled.fbuf"
        path.write_bytes(build(header, bytes(raw)))
        for mmap in (False, True):
            with pytest.raises(fe.BufferFileError, match=f"obs_ .*({says})"):
                fe.FlexibleBuffer.load(path, mmap=mmap)


#: this process's peak resident memory in bytes (ru_maxrss would carry a parent's across exec)
PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"
PROBE = """
import sys
import flexibuff_envs as fe
before = PEAK
try:
    buffer = fe.FlexibleBuffer.load(sys.argv[1], mmap=sys.argv[2] == "mmap")
    outcome = f"loaded {len(buffer)} rows"
    if len(buffer):
        buffer.sample_transitions(16)
        buffer.episode_stats()
        if buffer.max_priority is not None:  # the file holds priorities: draw by them and give new ones
            batch = buffer.sample_transitions(16, prioritized=True)
            buffer.update_priorities(batch.idx, 2.0)
            buffer.sample_transitions(16, prioritized=True)
except fe.BufferFileError as exc:
    outcome = f"refused: {exc}"
print(outcome)
print(PEAK - before)
""".replace("PEAK", PEAK)


def probe(path: Path, mmap: bool) -> tuple[str, int]:
    """(what loading ``path`` in a fresh process did, the bytes its peak memory grew by)."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), "mmap" if mmap else "read"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"killed or failed ({result.returncode}): {result.stderr[-1500:]}"
    outcome, grew = result.stdout.splitlines()[-2:]
    return outcome, int(grew)


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("claim", ["a billion-row ring", "a 400 GiB ring"])
def test_a_huge_ring_claimed_by_a_small_file_costs_no_memory(tmp_path: Path, claim: str, mmap: bool) -> None:
    def huge(header: Header) -> None:  # an empty buffer's file, its ring claimed huge
        header["num_steps"] = 10**9 if claim == "a billion-row ring" else 10**11
        header["lanes"] = [
            {"written": 0, "live_start": 0, "rows": [0, 0], "ended": [], "running": None, "agent_start": [0]}
        ]
        for meta in header["fields"]:
            meta["shape"] = [0 if n == 60 else n for n in meta["shape"]]
            meta["offset"] = 0
            if meta.get("part") == "tail":
                meta["shape"] = [1, meta["shape"][1]]

    _, header, _, _ = parts(saved(tmp_path).read_bytes())
    huge(header)
    tails = [meta for meta in header["fields"] if meta.get("part") == "tail"]
    data = bytes(64)  # the empty arrays lie at 0; each tail keeps its zero slot after them
    for meta in tails:
        meta["offset"] = len(data)
        data += bytes(meta["shape"][1] * (4 if meta["name"] == "obs_" else 1))
        data += bytes(-len(data) % 64)
    path = tmp_path / "bomb.fbuf"
    path.write_bytes(build(header, data))
    assert path.stat().st_size < 4000
    outcome, grew = probe(path, mmap)
    # a billion rows can be reserved here (and cost nothing until used); 400 GiB cannot
    assert outcome.startswith("loaded 0 rows" if claim == "a billion-row ring" else ("loaded 0 rows", "refused: ")), (
        outcome
    )
    assert grew < 100 * 2**20, f"{outcome}: peak memory grew by {grew / 2**20:.0f} MiB"


def test_a_fresh_huge_buffer_costs_memory_only_as_it_records() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import numpy as np
import flexibuff_envs as fe
from flexibuff_envs.recording.writer import Writer
buffer = fe.FlexibleBuffer(2 * 10**8, 4, [2], n_agents=2, memory_weights=True, values=True, action_mask=True)
writer = Writer(buffer, buffer)  # the rows a multi-agent recorder claims and clears
buffer.begin_episode()
for _ in range(5000):
    writer.claim_cleared_row(0)
buffer.end_episode()
assert np.isnan(buffer.sample_transitions(8).values).all() and (buffer.sample_transitions(8).memory_weights == 1).all()
print({PEAK})
""",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-1500:]
    assert int(result.stdout.split()[-1]) < 400 * 2**20  # the interpreter and numpy are most of it


def test_only_regular_files_are_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.fbuf"
    os.mkfifo(fifo)
    link = tmp_path / "link.fbuf"
    link.symlink_to(saved(tmp_path))
    assert len(fe.FlexibleBuffer.load(link)) == 60  # a link to a buffer file is one
    script = "import sys, flexibuff_envs as fe\ntry:\n fe.FlexibleBuffer.load(sys.argv[1])\nexcept fe.BufferFileError as e:\n print(e)"
    for path, says in (
        (fifo, "not a regular file"),
        (tmp_path, "not a regular file"),
        ("/proc/self/mem", "too short|cannot be read"),
    ):
        result = subprocess.run(
            [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60, check=False
        )  # a FIFO once blocked open() forever
        assert result.returncode == 0 and result.stdout.startswith(f"{path}: "), result.stderr[-500:]
        assert any(word in result.stdout for word in says.split("|"))


def test_object_dtypes_are_refused_by_the_constructor() -> None:
    for dtype in ("object", "O", "U8", "V4", "complex64", "f4,f4"):
        with pytest.raises(ValueError, match="obs_dtype"):
            fe.FlexibleBuffer(10, 3, obs_dtype=dtype)


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("where", ["spec", "field"])
def test_an_object_dtype_file_is_refused_in_a_process_that_survives(tmp_path: Path, where: str, mmap: bool) -> None:
    """Such a file once had its bytes used as Python object pointers: sampling it segfaulted."""
    if where == "spec":
        path = crafted(
            tmp_path,
            lambda h: (h["spec"].update(obs_dtype="object"), field(h, "obs").update(dtype="|O", shape=[1, 60, 4])),
        )
    else:
        path = crafted(tmp_path, lambda h: field(h, "G").update(dtype="|O"))
    outcome, _ = probe(path, mmap)  # probe asserts the process was not killed by a signal
    assert outcome.startswith(f"refused: {path}: corrupt header: ") and "dtype" in outcome


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
def test_positions_near_the_limit_load_record_and_save_again(tmp_path: Path, mmap: bool) -> None:
    """Positions only grow; a file may hold any up to 2**62. Loaded, they are renumbered by whole
    turns of the ring (rows stay where they are), so recording on and saving again work."""
    capacity = 50
    good = saved(tmp_path, capacity=capacity, steps=120)  # wrapped: the file spans the ring
    shift = (MAX_POSITION // capacity - 3) * capacity  # the newest position 30 below the limit
    _, header, data, _ = parts(good.read_bytes())
    for info in header["lanes"]:
        info["written"] += shift
        info["live_start"] += shift
        info["ended"] = [[start + shift, end + shift, whole] for start, end, whole in info["ended"]]
        if info["running"]:
            info["running"][:2] = [p + shift for p in info["running"][:2]]
        info["agent_start"] = [s + shift for s in info["agent_start"]]
    far = tmp_path / "far.fbuf"
    far.write_bytes(build(header, data))
    buffer = fe.FlexibleBuffer.load(far, mmap=mmap)
    near = fe.FlexibleBuffer.load(good, mmap=mmap)
    (a,), (b,) = (list(x.minibatches(len(x), shuffle=False)) for x in (buffer, near))
    np.testing.assert_array_equal(a.idx, b.idx)
    for each in (buffer, near):
        play(
            fe.record(
                ToyEnv(spaces.Box(0, 1, (4,), np.float32), spaces.Discrete(3), lengths=(7, 5), mask_info=True),
                buffer=each,
            ),
            seed=3,
            steps=30,
        )
    again = fe.FlexibleBuffer.load(buffer.save(tmp_path / "again.fbuf"))
    (a,), (b,) = (list(x.minibatches(len(x), shuffle=False)) for x in (again, near))
    np.testing.assert_array_equal(a.idx, b.idx)
    np.testing.assert_array_equal(a.obs, b.obs)
    assert again.n_episodes == near.n_episodes


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
def test_a_huge_ring_with_priorities_claimed_by_a_small_file_costs_no_memory(tmp_path: Path, mmap: bool) -> None:
    """The priority tree of a file's few rows in a claimed 2**28-row ring is as small as they are."""
    env = fe.record(ToyEnv(spaces.Box(0, 1, (4,), np.float32), spaces.Discrete(3), lengths=(7, 5)), num_steps=3000)
    play(env, seed=0, steps=60)
    env.buffer.update_priorities(np.arange(60), np.linspace(0.1, 3, 60))
    _, header, data, _ = parts(Path(env.buffer.save(tmp_path / "good.fbuf")).read_bytes())
    assert any(meta["name"] == "priority" for meta in header["fields"])
    header["num_steps"] = 2**28
    path = tmp_path / "bomb.fbuf"
    path.write_bytes(build(header, data))
    assert path.stat().st_size < 10_000
    outcome, grew = probe(path, mmap)
    assert outcome == "loaded 60 rows"
    assert grew < 100 * 2**20, f"peak memory grew by {grew / 2**20:.0f} MiB"
