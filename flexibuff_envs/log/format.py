"""The episode log's files: the header, the columns it names, the commit entries and what they
count (`flexibuff_envs.log`)."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from flexibuff_envs.errors import BufferFileError, plain_dtype, short_repr
from flexibuff_envs.files.header import BadHeader, parse_spec
from flexibuff_envs.files.header_values import with_stored_state
from flexibuff_envs.spec import BufferSpec
from flexibuff_envs.spec.provenance import sessions
from flexibuff_envs.storage import Storage
from flexibuff_envs.storage.compression import CODECS
from flexibuff_envs.storage.fields import NEXT
from flexibuff_envs.storage.packed import Stack
from flexibuff_envs.storage.stored_form import Part

#: the formats this reads: 2, and 3 (a log with compressed columns, `Column.codec`)
VERSIONS = (2, 3)
HEADER, COMMITS, LENGTHS = "header.fblog", "commits.fblog", "lengths.col"
_HEADER = struct.Struct("<8sIQ")
_HEADER_MAGIC, _COMMIT_MAGIC = b"FBLOGHDR", b"FBCOMMIT"
_ENTRY = struct.Struct(f"<8sQQQ{len(NEXT)}QI")  # then the entry's own crc32
ENTRY_BYTES = _ENTRY.size + 4
CHAINS = tuple(NEXT)  # the order of the tail counts in an entry
#: bytes read at a time when a column is checked or copied
PIECE = 1 << 24
#: when appended episodes reach the disk itself (they reach the OS at once, whatever the policy)
FsyncPolicy = Literal["interval", "always", "close"]


@dataclass(frozen=True)
class LogHeader:
    """The layout and discounts a log's episodes were recorded with, and the recording sessions
    that appended them (`spec.provenance`; not part of what must match to append)."""

    spec: BufferSpec
    gamma: float
    gae_lambda: float
    sessions: tuple[dict[str, Any], ...] = dataclasses.field(default=(), compare=False)


@dataclass(frozen=True)
class Column:
    """One stored part, a file of rows: ``shape`` and ``dtype`` of one row (a per-agent field's
    row holds every agent's value: ``[n_agents, ...]``). A ``codec`` column (``"zstd"``) keeps
    each row (each agent's, of a per-agent field) as a frame of its own in `frames_file`, and
    in its file where each frame ends (u64): `packed`."""

    name: str
    part: str | None  # None, "index" or "tail", as `stored_form.Part`
    per_agent: bool
    dtype: np.dtype
    shape: tuple[int, ...]
    codec: str | None = None
    stack: Stack | None = None  # a ``codec`` column of frame stacks (`packed.Stack`)

    @classmethod
    def of(cls, part: Part) -> Column:
        shape = part.shape
        return cls(part.name, part.part, part.per_agent, part.dtype, shape[: part.axis] + shape[part.axis + 1 :])

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.part

    @property
    def file(self) -> str:
        stem = self.name if self.part is None else f"{self.name}.{self.part}"
        return f"{stem}.ends.col" if self.codec is not None else f"{stem}.col"

    @property
    def frames_file(self) -> str:
        """The file of a ``codec`` column's frames."""
        return f"{self.name}.zst" if self.part is None else f"{self.name}.{self.part}.zst"

    @property
    def row_bytes(self) -> int:
        """Bytes of a row, decoded."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def per_row(self) -> int:
        """Frames a row of a ``codec`` column takes: one per agent of a per-agent field."""
        return self.shape[0] if self.per_agent else 1

    @property
    def stored_bytes(self) -> int:
        """Bytes of a row in `file`: its frames' ends, for a ``codec`` column."""
        return 8 * self.per_row if self.codec is not None else self.row_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "part": self.part,
            "per_agent": self.per_agent,
            "dtype": self.dtype.str,
            "shape": list(self.shape),
            **({"codec": self.codec} if self.codec is not None else {}),
            **({"stack": [self.stack.k, self.stack.axis]} if self.stack is not None else {}),
        }


EPISODE_LENGTHS = Column("lengths", None, False, np.dtype("<i8"), ())


class Commit(NamedTuple):
    """What a log holds as of one commit entry: rows, episodes and each chain's tail slots
    (counting slot 0, the zeros every chain starts with)."""

    number: int = -1  # -1: before the first entry
    rows: int = 0
    episodes: int = 0
    tails: tuple[int, ...] = (1,) * len(CHAINS)

    def count(self, column: Column) -> int:
        """Rows of ``column`` this commit counts (episodes, tail slots or rows)."""
        if column is EPISODE_LENGTHS:
            return self.episodes
        return self.tails[CHAINS.index(column.name)] if column.part == "tail" else self.rows

    def length(self, column: Column) -> int:
        """Bytes of ``column`` this commit counts."""
        return self.count(column) * column.stored_bytes

    def entry(self, crc: int) -> bytes:
        body = _ENTRY.pack(_COMMIT_MAGIC, self.number, self.rows, self.episodes, *self.tails, crc)
        return body + struct.pack("<I", zlib.crc32(body))


@dataclass(frozen=True)
class Torn:
    """Bytes at the end of a file that no whole commit counts: from ``offset`` on, ``size``."""

    path: str
    offset: int
    size: int


@dataclass(frozen=True)
class LogReport:
    """What a log holds (its journal's episodes counted), how many of those episodes its
    journal holds, not yet folded into the columns, the torn tails of its files (empty for a
    whole log), and whether a writer has it open (``live``: the bytes past its newest commit
    and record are then the writer's own, its reserved windows or an append under way, and
    none is counted torn); ``staged``: the vector steps a killed vector recorder staged
    (`log.stage_files`), whose ended episodes are not counted until the log is next opened, which
    replays them."""

    header: LogHeader
    episodes: int
    rows: int
    nbytes: int
    torn: tuple[Torn, ...]
    unfolded: int = 0
    live: bool = False
    staged: int = 0


def fail(path: str, problem: str) -> BufferFileError:
    return BufferFileError(f"{path}: {problem}")


def is_log(directory: str) -> bool:
    """Whether ``directory`` holds an episode log (its header file)."""
    return os.path.isfile(os.path.join(directory, HEADER))


def header_bytes(header: LogHeader, columns: Sequence[Column]) -> bytes:
    blob = json.dumps(
        {
            "format": "flexibuff_envs episode log",
            "spec": header.spec.to_dict(),
            "gamma": header.gamma,
            "gae_lambda": header.gae_lambda,
            "columns": [c.to_dict() for c in columns],
            "sessions": list(header.sessions),
        }
    ).encode()
    version = VERSIONS[any(c.codec is not None for c in columns)]
    prefix = _HEADER.pack(_HEADER_MAGIC, version, len(blob)) + blob
    return prefix + struct.pack("<I", zlib.crc32(prefix))


def read_header(directory: str) -> tuple[LogHeader, list[Column]]:
    path = os.path.join(directory, HEADER)
    if not os.path.isdir(directory):
        raise BufferFileError(
            f"{directory}: {'not a directory; an episode log is one' if os.path.exists(directory) else 'no such episode log'}"
        )
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(_HEADER.size)
            if len(head) < _HEADER.size:
                raise fail(path, f"too short to be a log header ({size} bytes)")
            magic, version, length = _HEADER.unpack(head)
            if magic != _HEADER_MAGIC:
                raise fail(path, "not a flexibuff_envs episode log header (bad magic bytes)")
            if version not in VERSIONS:
                raise fail(path, f"log format {version} is not one this flexibuff_envs reads {VERSIONS}")
            if _HEADER.size + length + 4 != size:
                raise fail(path, f"its header says {length} bytes of JSON, but the file holds {size} bytes")
            blob = handle.read(length)
            (crc,) = struct.unpack("<I", handle.read(4))
    except FileNotFoundError:
        raise fail(directory, "not an episode log (no header.fblog)") from None
    except OSError as exc:
        raise fail(path, f"cannot be read ({exc.strerror or exc})") from None
    if zlib.crc32(head + blob) != crc:
        raise fail(path, "corrupt header (checksum mismatch)")
    try:
        data = json.loads(blob)
        if not isinstance(data, dict) or set(data) - {"sessions"} != {
            "format",
            "spec",
            "gamma",
            "gae_lambda",
            "columns",
        }:
            raise BadHeader(
                f"a log header holds format, spec, gamma, gae_lambda, columns and sessions, got {short_repr(data)}"
            )
        gamma, lam = data["gamma"], data["gae_lambda"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in (gamma, lam)):
            raise BadHeader(f"gamma and gae_lambda must be numbers in [0, 1], got {short_repr((gamma, lam))}")
        spec = with_stored_state(parse_spec(data["spec"]), data["columns"])
        header = LogHeader(spec, float(gamma), float(lam), tuple(sessions(data.get("sessions", []), "sessions")))
        return header, columns_of(header.spec, data["columns"])
    except (ValueError, RecursionError, BadHeader) as exc:  # JSON errors are ValueErrors
        raise fail(path, f"corrupt header: {exc}") from None


def expected(spec: BufferSpec, name: str, part: str | None, width: int | None = None) -> Column:
    """The column a buffer of layout ``spec`` stores part ``(name, part)`` in (``width``: the
    continuous log probs' own); `BadHeader` for a part no such buffer has."""
    probe = Storage(spec, 1)
    if name in NEXT and part in ("index", "tail"):
        base = probe.ensure(NEXT[name])
        per_agent = probe.fields[name].per_agent
        if part == "index":
            return Column(name, part, per_agent, np.dtype(np.int32), (spec.n_agents,) if per_agent else ())
        return Column(name, part, False, base.dtype, base.shape[-1:])
    if part is not None or name not in probe.fields or name in NEXT:
        raise BadHeader(f"no buffer of this layout stores a part {part!r} of {name!r}")
    array = probe.ensure(name, width=width if name == "continuous_log_probs" else None)
    per_agent = probe.fields[name].per_agent
    return Column(
        name, None, per_agent, array.dtype, (spec.n_agents, *array.shape[2:]) if per_agent else array.shape[1:]
    )


def columns_of(spec: BufferSpec, described: Any) -> list[Column]:
    if not isinstance(described, list):
        raise BadHeader(f"columns must be a list, got {short_repr(described)}")
    columns: list[Column] = []
    for k, item in enumerate(described):
        if not isinstance(item, dict) or set(item) - {"codec", "stack"} != {
            "name",
            "part",
            "per_agent",
            "dtype",
            "shape",
        }:
            raise BadHeader(
                f"column {k} must hold name, part, per_agent, dtype, shape (and codec), got {short_repr(item)}"
            )
        shape = item["shape"]
        if (
            not isinstance(item["name"], str)
            or not isinstance(shape, list)
            or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape)
        ):
            raise BadHeader(f"column {k} has name {short_repr(item['name'])} and shape {short_repr(shape)}")
        width = shape[-1] if item["name"] == "continuous_log_probs" and shape else None
        column = Column(
            item["name"],
            item["part"],
            bool(item["per_agent"]),
            plain_dtype(f"column {k} dtype", item["dtype"]),
            tuple(shape),
            item.get("codec"),
        )
        if "stack" in item:
            column = dataclasses.replace(column, stack=stack_of(column, item["stack"], k))
        if column.codec is not None and (column.codec not in CODECS or column.part == "index" or not column.row_bytes):
            raise BadHeader(f"column {k} ({column.name}) names codec {short_repr(column.codec)}, not one of {CODECS}")
        plain = dataclasses.replace(column, codec=None, stack=None)
        if plain != expected(spec, column.name, column.part, width) or column.key in {c.key for c in columns}:
            raise BadHeader(f"column {k} ({column.file}) is not one a buffer of this layout stores, or twice")
        columns.append(column)
    parts = {c.key for c in columns}
    for name, part in parts:
        if part is not None and (name, "tail" if part == "index" else "index") not in parts:
            raise BadHeader(f"the next value {name!r} has a column of its {part} but none of the other part")
    return columns


def stack_of(column: Column, described: Any, k: int) -> Stack:
    """The `Stack` a header describes as ``[k, axis]`` for ``column`` (number ``k``)."""
    if (
        column.codec is None
        or column.part is not None
        or not isinstance(described, list)
        or len(described) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in described)
        or not 2 <= described[0] <= 16
        or described[1] not in (0, -1)
    ):
        raise BadHeader(f"column {k} ({column.name}) has stack {short_repr(described)}, not [2-16, 0 or -1]")
    size = column.row_bytes // column.per_row
    if size % (described[0] * column.dtype.itemsize):
        raise BadHeader(f"column {k} ({column.name}): its rows of {size} bytes are no stack of {described[0]}")
    return Stack(described[0], described[1], size, column.dtype.itemsize)


def parse_entry(entry: bytes, number: int) -> tuple[Commit, int] | None:
    """The commit entry ``number`` names and its data crc, or None if it is not whole and in place."""
    if len(entry) < ENTRY_BYTES:
        return None
    body, (crc,) = entry[: _ENTRY.size], struct.unpack("<I", entry[_ENTRY.size :])
    if zlib.crc32(body) != crc:
        return None
    magic, at, rows, episodes, *rest = _ENTRY.unpack(body)
    if magic != _COMMIT_MAGIC or at != number:
        return None
    return Commit(at, rows, episodes, tuple(rest[:-1])), rest[-1]
