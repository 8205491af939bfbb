"""The exceptions flexibuff_envs raises; each subclasses the builtin a user would catch."""

from __future__ import annotations

import numpy as np


class FlexibuffError(Exception):
    """Base of every error raised by flexibuff_envs."""


class UnsupportedSpaceError(FlexibuffError, ValueError):
    """A Gymnasium space the buffer cannot lay out (Text, Graph, Sequence, ...)."""


class SpecMismatchError(FlexibuffError, ValueError):
    """A user-supplied buffer or value does not match the inferred layout."""


class EmptyBufferError(FlexibuffError, ValueError):
    """Sampling asked for more than the buffer holds."""


class BufferFileError(FlexibuffError, ValueError):
    """A buffer file is missing, truncated, corrupt, foreign or from a newer format."""


class BufferSaveError(FlexibuffError, OSError):
    """A buffer could not be written to the path given (a directory, no permission, a full disk);
    ``filename`` is that path, and a file already there is intact."""


class BufferMemoryError(FlexibuffError, MemoryError):
    """A buffer's ring cannot be reserved on this machine; the message names ``num_steps`` and
    how many rows fit."""


class EnvValueError(FlexibuffError, ValueError):
    """The env returned a value its space does not allow (a wrong shape, None, text), which the
    recorder refuses instead of storing something else."""


class NotAnEnvError(FlexibuffError, TypeError):
    """``record`` was given something that is not a supported environment kind."""


class MissingExtraError(FlexibuffError, ImportError):
    """An optional dependency (torch, pettingzoo) is needed but not installed."""


def needs(what: str, requirement: str, extra: str) -> str:
    """The message of a `MissingExtraError`: ``what`` needs ``requirement`` (a pip requirement),
    and how to install it: the package's ``extra`` from a clone (it is on no index yet), or the
    requirement itself."""
    return f"{what} needs {requirement}: pip install -e '.[{extra}]' in a clone of flexibuff_envs, or pip install '{requirement}'"


def note(error: BaseException, text: str) -> None:
    """Add "flexibuff_envs: ``text``" to ``error``'s notes (Python 3.11+; 3.10 has none)."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(f"flexibuff_envs: {text}")


class InvalidArgumentError(FlexibuffError, ValueError):
    """An argument out of its range or at odds with the buffer (a size that is not positive, a
    field the buffer does not hold, an option that does not apply); the message names it."""


class ArgumentTypeError(FlexibuffError, TypeError):
    """An argument of a kind the call does not take; the message names it and what it takes."""


class UnknownNameError(FlexibuffError, AttributeError):
    """A name a batch (a field it does not hold) or a module of the package does not have."""


class OutOfRangeError(FlexibuffError, IndexError):
    """An index past the end of a sequence of episodes."""


class WorkerError(FlexibuffError, RuntimeError):
    """A collection worker failed more often than its restarts allow."""


class WorkerTimeoutError(FlexibuffError, TimeoutError):
    """A collection worker gave no result within the time allowed."""


def positive_int(name: str, value: object) -> int:
    """``value`` as an int, or ValueError naming ``name`` unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about values from outside."""
    try:
        text = repr(value)
    except RecursionError:  # nested deeper than repr goes (a crafted file's JSON)
        return f"a {type(value).__name__} nested too deep to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_dtype(name: str, value: object) -> np.dtype:
    """``value`` as a numpy dtype, or ValueError naming ``name`` unless it is a plain bool,
    integer or float dtype of at most 8 bytes: a buffer holds numbers, never Python objects."""
    try:
        dtype = np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        dtype = None
    if (
        dtype is None
        or dtype.kind not in "biuf"
        or dtype.fields is not None
        or dtype.subdtype is not None
        or dtype.itemsize > 8
    ):
        raise InvalidArgumentError(
            f"{name} must be a bool, integer or float dtype (bool, int8-int64, uint8-uint64, "
            f"float16-float64), got {value!r}"
        )
    return dtype


def require_torch():
    """Import torch lazily, naming the extra to install when it is absent."""
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError(needs("as_torch=True", "torch", "torch")) from exc
    return torch
