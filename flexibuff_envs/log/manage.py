"""Looking after whole episode logs: folding what a killed recording left in a journal,
repairing, merging (`flexibuff_envs.log`)."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence

from flexibuff_envs.errors import BufferFileError, BufferSaveError, InvalidArgumentError, SpecMismatchError
from flexibuff_envs.files.chunk import check_layout
from flexibuff_envs.log.format import LogReport
from flexibuff_envs.log.journal import scan, writing
from flexibuff_envs.log.read import report, state_of
from flexibuff_envs.log.ring_files import RING
from flexibuff_envs.log.stage_files import staged
from flexibuff_envs.log.writer import LogWriter


def repair(directory: str | os.PathLike[str]) -> LogReport:
    """Fold the journal's whole records into the columns and cut every file's torn tail (the
    bytes past the newest whole commit or record; every whole episode stays); returns what the
    log holds, and the tails cut.

    Raises:
        BufferFileError: not an episode log, or a writer has it open.
    """
    path = os.fspath(directory)
    before = report(path)
    LogWriter(path, state_of(path).header).close()
    return dataclasses.replace(report(path), torn=before.torn)


def settle(directory: str) -> None:
    """Fold the episodes a recording killed before it folded them left in the journal of the log
    ``directory``, unless a writer has the log open (its records are its own to fold) or the
    directory cannot be written (readers then see the folded episodes only); so they do when
    the disk is full (a `RuntimeWarning` says so: the episodes stay in the journal, folded by
    the next to open the log once there is room)."""
    state = state_of(directory)
    left = scan(directory, state.columns, state.commit)[0] or staged(os.path.join(directory, RING))
    if left and os.access(directory, os.W_OK) and not writing(directory):
        try:
            LogWriter(directory, state.header).close()
        except BufferSaveError as exc:
            warnings.warn(
                f"{directory}: the episodes a killed recording left in its journal are left out: they "
                f"cannot be folded ({exc}); free space and open the log again",
                RuntimeWarning,
                stacklevel=3,
            )


def merge(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> LogReport:
    """Append every whole episode of the logs ``sources``, in order, to the log ``out`` (made,
    or continued when it holds a log of the same layout and discounts): one commit per source,
    so a merge cut short by a kill leaves ``out`` with the sources before it, whole. A source's
    torn tail is left out. The sources are only read, but for the episodes a recording killed
    before folding them left in a source's journal: those are folded into it first (`settle`),
    as opening it would.

    Raises:
        BufferFileError: a source is not an episode log, is damaged, or differs from the others
            in layout or discounts; or ``out`` is one of them.
        BufferSaveError: ``out`` cannot be written (a full disk: it keeps what it held).
    """
    paths = [os.fspath(source) for source in sources]
    if not paths:
        raise InvalidArgumentError("merge: give at least one episode log to merge")
    for path in paths:
        settle(path)
    target = os.path.realpath(out)
    for path in paths:
        if os.path.realpath(path) == target:
            raise BufferFileError(f"{path}: a log cannot be merged into itself")
    headers = [state_of(path).header for path in paths]
    for path, header in zip(paths, headers):
        if header != headers[0]:
            try:
                check_layout(headers[0].spec, header.spec, f"the episode log {path}")
            except SpecMismatchError as exc:
                raise BufferFileError(f"{path}: {exc}") from None
            raise BufferFileError(
                f"{path}: its discounts (gamma {header.gamma}, gae_lambda {header.gae_lambda}) differ from {paths[0]}'s"
            )
    writer = LogWriter(out, headers[0], fsync="close")
    try:
        for path in paths:
            writer.absorb(path)
    finally:
        writer.close()
    return report(out)
