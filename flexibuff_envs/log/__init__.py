"""An episode log: whole episodes appended to column files on disk as they end, readable after a
crash, and sampled in place when it is larger than memory.

A log is a directory. Each stored part of the buffer (`stored_form.Part`: ``obs``, ``obs_``'s index
and tail, masks as bits, ...) is one *column* file holding its rows one after the other, exactly
as a ring holds them, so mapping a column gives the array a buffer samples from::

    header.fblog   b"FBLOGHDR" | u32 version | u64 length | JSON | u32 crc32 of all before it
                   (layout, discounts, the columns with dtype and row shape; replaced atomically)
    commits.fblog  one 64-byte entry per append: b"FBCOMMIT" | u64 number | u64 rows
                   | u64 episodes | u64 tail slots of obs_, state_, action_mask_
                   | u32 crc32 of the bytes the append added to the columns | u32 crc32 of the entry
    lengths.col    each episode's length (int64)
    obs.col, obs_.index.col, obs_.tail.col, ...   one per column
    obs.zst, obs.ends.col  a compressed column (image observations and states by default): each
                   row's zstd frame, and where each frame ends, a u64 per frame (the top bit:
                   a frame stack kept as its newest frame); `flexibuff_envs.log.compressed`
    synced.fblog   the newest commit a sync put on the disk, and the boot it ran in
                   (`flexibuff_envs.log.syncing`)
    journal.fblog  the episodes a recording ended since it last folded, one record each
                   (`flexibuff_envs.log.journal`); its writer holds its lock

An append puts its rows at the end of every column, then writes its commit entry. A recording
(`LogWriter.append_rows`) writes each ended episode as one record of the journal instead, and
folds the journal into the columns (appends of many episodes) every few seconds and at close;
a log left with records in its journal by a killed writer is folded by the next to open it. Rows are
copied into a mapped window at each file's end, whose disk blocks are reserved before it is
mapped (large appends are written instead): all of it is with the OS when `LogWriter.append`
returns, so a process killed at any instant leaves the log as of its last whole entry plus bytes
past it that no entry counts (a torn append, or the rest of a reserved window; closing a writer
cuts those). Readers take the newest entry whose own checksum and whose appended bytes' checksum
hold (so an entry that reached the disk before its rows, in a power loss, is passed over) and
ignore everything past it; in a log last synced in another boot, every entry after the one
`synced.fblog` names is checked in turn: no part of an episode is ever read. `verify` checks every
entry and byte, `repair` cuts what lies past the newest whole entry, and opening a log to append
cuts it too. Nothing in a log is code: JSON and numbers only,
and every length is checked against the bytes the files hold before anything is allocated or
mapped, so a crafted log reads or raises `BufferFileError` naming the file.

Imports: `files` and below.
"""

from flexibuff_envs.log.follower import Follower
from flexibuff_envs.log.format import (
    COMMITS,
    ENTRY_BYTES,
    HEADER,
    LENGTHS,
    Column,
    Commit,
    FsyncPolicy,
    LogHeader,
    LogReport,
    Torn,
    expected,
    is_log,
)
from flexibuff_envs.log.manage import merge, repair, settle
from flexibuff_envs.log.read import Logged, load, report, verify
from flexibuff_envs.log.writer import LogWriter

__all__ = [
    "COMMITS",
    "ENTRY_BYTES",
    "HEADER",
    "LENGTHS",
    "Column",
    "Commit",
    "Follower",
    "FsyncPolicy",
    "LogHeader",
    "LogReport",
    "LogWriter",
    "Logged",
    "Torn",
    "expected",
    "is_log",
    "load",
    "merge",
    "repair",
    "report",
    "settle",
    "verify",
]
