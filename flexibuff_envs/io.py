"""Buffer files: one self-describing file, no pickle, written atomically.

Layout (little endian)::

    b"FLEXIBUF" | u32 version | u64 header length | JSON header | arrays, 64-byte aligned
    | u32 crc32 of everything before it | b"FBUF-END"

The header names each array's dtype, shape and offset; arrays hold each lane's live rows in
time order (oldest first), so a file holds what was recorded, not the empty part of the ring.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from flexibuff_envs.episodes import Episode
from flexibuff_envs.errors import BufferFileError
from flexibuff_envs.sampling import live_rows
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.storage import FIELDS

if TYPE_CHECKING:
    from flexibuff_envs.buffer import FlexibleBuffer

MAGIC, END = b"FLEXIBUF", b"FBUF-END"
VERSION = 1
_ALIGN = 64
_PREFIX = struct.Struct("<8sIQ")
_SUFFIX = struct.Struct("<I8s")


def _padding(position: int) -> int:
    return -position % _ALIGN


def _header(buffer: FlexibleBuffer) -> dict[str, Any]:
    lanes = []
    for lane in buffer._lanes:
        shift = lane.live_start  # positions are renumbered so each lane's oldest live row is 0
        lanes.append({
            "size": lane.size,
            "ended": [[e.start - shift, e.end - shift, e.whole] for e in lane.ended],
            "running": None if lane.running is None else
            [lane.running.start - shift, lane.running.end - shift, lane.running.whole],
        })
    return {
        "format": "flexibuff_envs buffer",
        "spec": buffer.spec.to_dict(),
        "num_steps": buffer.num_steps,
        "gamma": buffer.gamma,
        "gae_lambda": buffer.gae_lambda,
        "path": buffer.path,
        "name": buffer.name,
        "rng": buffer.rng.bit_generator.state,
        "lanes": lanes,
        "fields": [],
    }


def save(buffer: FlexibleBuffer, path: str) -> None:
    """Write ``buffer`` to ``path`` atomically: the old file stays intact until the new is whole."""
    live = live_rows(buffer._lanes)
    header = _header(buffer)
    arrays = []
    offset = 0
    for name, array in buffer._storage:
        data = np.ascontiguousarray(array[:, live] if FIELDS[name].per_agent else array[live])
        offset += _padding(offset)
        header["fields"].append({"name": name, "dtype": data.dtype.str, "shape": list(data.shape),
                                 "offset": offset, "width": array.shape[-1] if array.ndim > 1 + FIELDS[name].per_agent else None})
        arrays.append(data)
        offset += data.nbytes
    blob = json.dumps(header).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, len(blob)) + blob
    prefix += b"\0" * _padding(len(prefix))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fbuf-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            crc = _write(out, prefix, 0)
            position = 0
            for data in arrays:
                pad = _padding(position)
                crc = _write(out, b"\0" * pad, crc)
                crc = _write(out, data.data.cast("B"), crc)
                position += pad + data.nbytes
            out.write(_SUFFIX.pack(crc, END))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write(out: BinaryIO, data: Any, crc: int) -> int:
    out.write(data)
    return zlib.crc32(data, crc)


def _read_header(raw: memoryview, path: str) -> tuple[dict[str, Any], int]:
    if len(raw) < _PREFIX.size + _SUFFIX.size:
        raise BufferFileError(f"{path}: too short to be a buffer file ({len(raw)} bytes)")
    magic, version, length = _PREFIX.unpack_from(raw)
    if magic != MAGIC:
        raise BufferFileError(f"{path}: not a flexibuff_envs buffer file (bad magic bytes)")
    if version > VERSION:
        raise BufferFileError(f"{path}: written by a newer flexibuff_envs (format {version}, "
                              f"this one reads up to {VERSION}); upgrade flexibuff-envs")
    crc, end = _SUFFIX.unpack_from(raw, len(raw) - _SUFFIX.size)
    if end != END:
        raise BufferFileError(f"{path}: truncated (no end marker); the save did not finish")
    if zlib.crc32(raw[: len(raw) - _SUFFIX.size]) != crc:
        raise BufferFileError(f"{path}: corrupt (checksum mismatch)")
    start = _PREFIX.size + length
    try:
        header = json.loads(bytes(raw[_PREFIX.size:start]))
    except ValueError as exc:
        raise BufferFileError(f"{path}: corrupt header: {exc}") from exc
    return header, start + _padding(start)


def load(path: str) -> FlexibleBuffer:
    """Read a buffer file written by `save`."""
    from flexibuff_envs.buffer import FlexibleBuffer

    try:
        with open(path, "rb") as handle:
            raw = memoryview(handle.read())
    except FileNotFoundError as exc:
        raise BufferFileError(f"{path}: no such buffer file") from exc
    header, data_start = _read_header(raw, path)
    spec = BufferSpec.from_dict(header["spec"])
    fields = {f["name"]: f for f in header["fields"]}
    log_probs = fields.get("continuous_log_probs", {}).get("width") or 0
    buffer = FlexibleBuffer.from_spec(spec, num_steps=header["num_steps"], gamma=header["gamma"],
                                      gae_lambda=header.get("gae_lambda", 0.95),
                                      log_prob_continuous=log_probs, global_reward=False,
                                      individual_reward=False)
    buffer.path, buffer.name = header["path"], header["name"]
    buffer.rng.bit_generator.state = header["rng"]
    live = np.concatenate([lane.offset + np.arange(info["size"]) for lane, info
                           in zip(buffer._lanes, header["lanes"])])
    for name, meta in fields.items():
        data = np.frombuffer(raw, dtype=np.dtype(meta["dtype"]),
                             count=int(np.prod(meta["shape"])),
                             offset=data_start + meta["offset"]).reshape(meta["shape"])
        target = buffer.field(name, width=meta["width"])
        if FIELDS[name].per_agent:
            target[:, live] = data
        else:
            target[live] = data
    for lane, info in zip(buffer._lanes, header["lanes"]):
        lane.written = info["size"]
        lane.ended.extend(Episode(s, e, w) for s, e, w in info["ended"])
        lane.running = None if info["running"] is None else Episode(*info["running"])
    return buffer
