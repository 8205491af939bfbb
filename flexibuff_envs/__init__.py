"""Wrap any Gymnasium or PettingZoo env once; every step is recorded into a FlexiBuff-style buffer."""

from flexibuff_envs import _moved
from flexibuff_envs.batch import FlexiBatch
from flexibuff_envs.buffer import FlexibleBuffer
from flexibuff_envs.errors import (
    ArgumentTypeError,
    BufferFileError,
    BufferMemoryError,
    BufferSaveError,
    EmptyBufferError,
    EnvValueError,
    FlexibuffError,
    InvalidArgumentError,
    MissingExtraError,
    NotAnEnvError,
    OutOfRangeError,
    SpecMismatchError,
    UnknownNameError,
    UnsupportedSpaceError,
    WorkerError,
    WorkerTimeoutError,
)
from flexibuff_envs.files.chunk import Chunk
from flexibuff_envs.index.returns import discounted_returns
from flexibuff_envs.log import merge as merge_logs
from flexibuff_envs.recording import GymRecorder, VectorRecorder, record
from flexibuff_envs.recording.rollout import warm
from flexibuff_envs.spec import BufferSpec, infer_spec

_moved.install()  # the module paths of earlier releases, deprecated

__all__ = [
    "ArgumentTypeError",
    "BufferFileError",
    "BufferMemoryError",
    "BufferSaveError",
    "BufferSpec",
    "Chunk",
    "EmptyBufferError",
    "EnvValueError",
    "FlexiBatch",
    "FlexibleBuffer",
    "FlexibuffError",
    "GymRecorder",
    "InvalidArgumentError",
    "MissingExtraError",
    "NotAnEnvError",
    "OutOfRangeError",
    "SpecMismatchError",
    "UnknownNameError",
    "UnsupportedSpaceError",
    "VectorRecorder",
    "WorkerError",
    "WorkerTimeoutError",
    "discounted_returns",
    "infer_spec",
    "merge_logs",
    "record",
    "warm",
]
__version__ = "0.2.0"
