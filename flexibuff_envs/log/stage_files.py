"""A vector recorder's stage in a file beside its buffer's ring (`flexibuff_envs.log.ring_files`): the
steps it has not yet written into the ring, and its lanes as of the last block it wrote. A
killed recording's episodes that ended in steps still staged are then replayed by the next to
open the log (`replayers`: `flexibuff_envs.recording.stage_replay`), as the recorder would have written
them, so a vector recorder writes a block of steps at a time and still loses no ended episode.

``DIR/ring/stage<N>.fbstage``, sized at once (its blocks reserved) and mapped shared::

    b"FBSTAGE1" | i64 lanes n | block | width | b"<f4" obs dtype (8 bytes) | discrete heads
    | continuous dim | mask bytes | autoreset mode (0 NEXT_STEP, 1 SAME_STEP, 2 DISABLED)
    | rows per lane | crc32 of all before | word
    then, each at a multiple of 64 bytes: the lanes' buffer lanes [n] | two snapshots, each
    seq, first, crc32 of the rest, then per lane pos, start, running, resetting, clipped
    | obs [block + 1, n, width] | final [block, n, width] (SAME_STEP only) | has_final [block]
    | discrete [block, n, heads] | continuous [block, n, dim] | rewards [block, n]
    | flags [2, block, n] | masks [block + 1, n, bytes] | final_masks [block, n, bytes]

The *word* is ``seq << 16 | k``: ``k`` steps are staged after snapshot ``seq`` (slot
``seq % 2``, written whole before the word names it; -1: the stage is not in use). A snapshot's
``first`` is the number of the log's next episode when it was taken: the episodes of the block
written after it reach the log as one append (a marker or a commit), so a log holding more than
``first`` episodes holds them, and the stage's steps were written.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from flexibuff_envs.errors import BufferSaveError
from flexibuff_envs.log.format import fail

if TYPE_CHECKING:
    from flexibuff_envs.files.chunk import Chunk
    from flexibuff_envs.log.format import LogHeader
    from flexibuff_envs.storage import Storage

_MAGIC = b"FBSTAGE1"
_HEAD = struct.Struct("<8sqqq8sqqqqq")  # then the crc32 (i64) and the word (i64)
_WORD = _HEAD.size + 8
_BYTES = _WORD + 8
MODES = 3  # NEXT_STEP, SAME_STEP, DISABLED, in gymnasium's `AutoresetMode` order
OFF = -1  # a word saying the stage is not in use
_K = 1 << 16  # the word's ``k`` part: a block holds fewer steps (256 at most today)
_NAME = re.compile(r"stage(\d+)\.fbstage")
_LANE = 5  # a snapshot's values per lane: pos, start, running, resetting, clipped


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a stage holds: ``n`` lanes of ``block`` steps of observations ``width`` wide."""

    n: int
    block: int
    width: int
    dtype: np.dtype
    heads: int
    continuous: int
    mask_bytes: int
    mode: int
    capacity: int  # rows per lane of the buffer's ring

    def arrays(self) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """Each array of the file, in order: name, shape, dtype."""
        n, b, u8 = self.n, self.block, np.dtype(np.uint8)
        return [
            ("lanes", (n,), np.dtype(np.int64)),
            ("snapshots", (2, 3 + _LANE * n), np.dtype(np.int64)),
            ("obs", (b + 1, n, self.width), self.dtype),
            ("final", (b if self.mode == 1 else 0, n, self.width), self.dtype),
            ("has_final", (b,), np.dtype(bool)),
            ("discrete", (b, n, self.heads), np.dtype(np.int64)),
            ("continuous", (b, n, self.continuous), np.dtype(np.float32)),
            ("rewards", (b, n), np.dtype(np.float32)),
            ("flags", (2, b, n), np.dtype(bool)),
            ("masks", (b + 1, n, self.mask_bytes), u8),
            ("final_masks", (b, n, self.mask_bytes), u8),
        ]

    def size(self) -> int:
        """Bytes of the file."""
        at = _BYTES
        for _, shape, dtype in self.arrays():
            at += -at % 64 + int(np.prod(shape)) * dtype.itemsize
        return at


class StageFile:
    """A stage in the file ``path`` of ``layout``, mapped shared (``memory``); ``logged()`` tells
    the number of the log's next episode (`snapshot`)."""

    def __init__(self, path: str, layout: Layout, memory: mmap.mmap, logged: Callable[[], int]) -> None:
        self.path, self.layout, self._logged = path, layout, logged
        self.arrays = _views(memory, layout)
        self._word = memoryview(memory)[_WORD:_BYTES].cast("q")
        self.live = True  # staging here, for a log still open
        self.seq = self._at = 0  # the snapshot the word names, and the word's value naming it
        self._taken = False  # snapshot ``seq + 1`` is written, the word not yet naming it

    @classmethod
    def make(cls, directory: str, layout: Layout, lanes: list[int], logged: Callable[[], int]) -> StageFile:
        """A new stage file in ``directory`` (a ring's) for the buffer lanes ``lanes``.

        Raises:
            BufferSaveError: it cannot be made (a full disk).
        """
        taken = {int(m.group(1)) for m in map(_NAME.fullmatch, os.listdir(directory)) if m}
        path = os.path.join(directory, f"stage{min(set(range(len(taken) + 1)) - taken)}.fbstage")
        size = layout.size()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                os.posix_fallocate(fd, 0, size)
                memory = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            raise BufferSaveError(
                exc.errno, f"cannot make a vector recorder's stage ({exc.strerror or exc})", path
            ) from exc
        values = dataclasses.astuple(layout)
        head = _HEAD.pack(_MAGIC, *values[:3], layout.dtype.str.encode().ljust(8), *values[4:])
        memory[: _WORD - 8] = head
        memory[_WORD - 8 : _WORD] = struct.pack("<q", zlib.crc32(head))
        stage = cls(path, layout, memory, logged)
        stage.arrays["lanes"][:] = lanes
        stage._word[0] = OFF  # until the first snapshot
        return stage

    def staged(self, k: int) -> None:
        """``k`` steps are staged after the newest snapshot `settled` made the word name."""
        self._word[0] = self._at + k

    def settled(self) -> None:
        """The newest snapshot holds the lanes; no step is staged after it."""
        if self._taken:
            self.seq, self._taken = self.seq + 1, False
            self._at = self.seq * _K
        self._word[0] = self._at

    def snapshot(
        self, pos: np.ndarray, start: np.ndarray, running: np.ndarray, resetting: np.ndarray, clipped: np.ndarray
    ) -> None:
        """The lanes as the block written now leaves them, into the slot the word does not name
        (it names the snapshot before, and the steps staged after it, until `settled`)."""
        slot = self.arrays["snapshots"][(self.seq + 1) % 2]
        lanes = slot[3:].reshape(_LANE, self.layout.n)
        lanes[0], lanes[1], lanes[2], lanes[3], lanes[4] = pos, start, running, resetting, clipped
        slot[0], slot[1] = self.seq + 1, self._logged()
        slot[2] = _crc(slot)
        self._taken = True

    def stop(self) -> None:
        """No more steps are staged here for the log: its recorder writes each step that ends
        an episode at once, or the log was closed."""
        self._word[0] = self._at = OFF
        self._word = memoryview(bytearray(8)).cast("q")  # what is staged from now on is not the file's
        self.live = False


@dataclasses.dataclass(frozen=True)
class Left:
    """A killed recorder's stage to replay: its layout, buffer lanes, the ``k`` steps it staged
    (its arrays, read-only) and its lanes as they stood before them."""

    path: str
    layout: Layout
    lanes: np.ndarray
    k: int
    pos: np.ndarray
    start: np.ndarray
    running: np.ndarray
    resetting: np.ndarray
    clipped: np.ndarray
    arrays: dict[str, np.ndarray]


def staged(directory: str) -> bool:
    """Whether ``directory`` (a ring's) holds a vector recorder's stage file."""
    return os.path.isdir(directory) and any(_NAME.fullmatch(name) for name in os.listdir(directory))


def left(directory: str, episodes: int) -> Iterator[Left]:
    """The stages of ``directory`` (a killed recording's ring) whose staged steps a log of
    ``episodes`` episodes lacks, each checked whole.

    Raises:
        BufferFileError: a stage file is not one, or names values it cannot hold.
    """
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        if _NAME.fullmatch(name):
            stage = _read(os.path.join(directory, name), episodes)
            if stage is not None:
                yield stage


def _views(memory: mmap.mmap, layout: Layout) -> dict[str, np.ndarray]:
    """The arrays of a stage file of ``layout`` mapped as ``memory``."""
    arrays, at = {}, _BYTES
    for name, shape, dtype in layout.arrays():
        at += -at % 64
        count = int(np.prod(shape))
        arrays[name] = np.frombuffer(memory, dtype, count, at).reshape(shape)
        at += count * dtype.itemsize
    return arrays


def _crc(slot: np.ndarray) -> int:
    """The checksum of a snapshot ``slot``: of its lanes, seq and first."""
    return zlib.crc32(slot[3:].tobytes() + slot[:2].tobytes())


def _read(path: str, episodes: int) -> Left | None:
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        raw = handle.read(_BYTES)
        if len(raw) < _BYTES or raw[:8] != _MAGIC:
            raise fail(path, "is not a vector recorder's stage")
        (crc,) = struct.unpack("<q", raw[_HEAD.size : _WORD])
        if zlib.crc32(raw[: _HEAD.size]) != crc:
            raise fail(path, "has a damaged header (its checksum does not hold)")
        _, n, block, width, dtype, heads, continuous, mask_bytes, mode, capacity = _HEAD.unpack(raw[: _HEAD.size])
        try:
            kind = np.dtype(dtype.rstrip(b" ").decode())
        except (TypeError, ValueError, UnicodeDecodeError):
            raise fail(path, f"names no dtype of observations ({dtype!r})") from None
        numbers = (n, block, width, heads, continuous, mask_bytes, capacity)
        if (
            min(numbers) < 0
            or max(numbers) >= 1 << 40
            or not 0 < block < _K
            or not 0 <= mode < MODES
            or kind.kind not in "biuf"
        ):
            raise fail(path, "names sizes no stage has")
        layout = Layout(n, block, width, kind, heads, continuous, mask_bytes, mode, capacity)
        if layout.size() != size:
            raise fail(path, f"holds {size:,} bytes, not the {layout.size():,} its header names")
        (word,) = struct.unpack("<q", raw[_WORD:_BYTES])
        memory = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ)
    arrays = _views(memory, layout)
    if word == OFF:
        return None
    seq, k = divmod(word, _K)
    snapshots = arrays["snapshots"]
    now, after = snapshots[seq % 2], snapshots[(seq + 1) % 2]
    if k > block or now[0] != seq or _crc(now) != now[2]:
        raise fail(path, f"names a snapshot it does not hold whole ({seq})")
    if after[0] == seq + 1 and _crc(after) == after[2] and episodes > after[1]:
        return None  # the block after the snapshot was written, and its episodes reached the log
    pos, start, running, resetting, clipped = now[3:].reshape(_LANE, n)
    lanes = arrays["lanes"]
    if (
        (lanes < 0).any()
        or (start < 0).any()
        or (pos < start).any()
        or (pos - start > capacity).any()
        or not np.isin(np.stack([running, resetting, clipped]), (0, 1)).all()
    ):
        raise fail(path, "names lanes and positions no recording has")
    return Left(
        path,
        layout,
        lanes,
        int(k),
        pos,
        start,
        running.astype(bool),
        resetting.astype(bool),
        clipped.astype(bool),
        arrays,
    )


#: what replays a `Left` stage over the ring ``Storage`` a killed recording left, for a log of
#: ``LogHeader``: the episodes that ended in its staged steps, by the kind of recorder that
#: staged them (``"vector"``: `flexibuff_envs.recording.stage_replay`, which the package imports; the
#: log layer knows no recorder)
replayers: dict[str, Callable[[Left, Storage, LogHeader], Chunk | None]] = {}
