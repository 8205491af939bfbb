"""Holding Ctrl-C across the buffer's bookkeeping, so that a signal never lands half way.

A recorder step, a block commit or a buffer change touches several arrays and counters that
must agree (a lane's positions, its episode index, the next-value chains, ``G``). Python runs
a signal's handler between any two bytecodes, so a ``KeyboardInterrupt`` could otherwise leave
them half changed. `HOLD` is a re-entrant context manager: a signal that arrives inside it is
noted, and its handler runs as soon as the outermost ``with HOLD`` is left, so the interrupt
reaches the caller as itself, after the change is whole.

It holds SIGINT, SIGTERM and SIGHUP whenever their handler is a Python function (Python's own
``default_int_handler`` for Ctrl-C, or one the program installed, such as the CLI's for
SIGTERM); signals left to the operating system (``SIG_DFL``) end the process as they always do.
Only the main thread runs signal handlers, so only the main thread holds them. User code the
recorder calls inside (``bootstrap_fn``, a ``global_reward`` function) runs with Ctrl-C held.
"""

from __future__ import annotations

import _signal
import functools
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

_INT, _TERM = signal.SIGINT, signal.SIGTERM
_HUP = getattr(signal, "SIGHUP", signal.SIGTERM)  # Windows has no SIGHUP: SIGTERM stands in
#: the signals whose Python handlers are held
SIGNALS = (_INT, _TERM, _HUP)

_MAIN = threading.main_thread().ident
_get_ident = threading.get_ident
_getsignal = _signal.getsignal  # the C function: signal.getsignal wraps it in an enum lookup costing microseconds

F = TypeVar("F", bound=Callable[..., Any])


class _Hold:
    """The one `HOLD`: a depth counter and the signals noted while held, each with the handler
    it goes to."""

    __slots__ = ("depth", "pending", "seen")

    def __init__(self) -> None:
        self.depth = 0
        self.pending: list[tuple[Callable[[int, FrameType | None], Any], int, FrameType | None]] = []
        # the handlers of `SIGNALS` as they stood after the last `_watch` (none yet)
        self.seen: tuple[Any, ...] = (object(),) * len(SIGNALS)

    def __enter__(self) -> None:
        if _get_ident() == _MAIN:
            if not self.depth:
                seen = self.seen
                if (
                    _getsignal(_INT) is not seen[0]
                    or _getsignal(_TERM) is not seen[1]
                    or _getsignal(_HUP) is not seen[2]
                ):
                    self._watch()
            self.depth += 1

    def __exit__(self, *exc: object) -> None:
        if _get_ident() == _MAIN:
            self.depth -= 1
            if not self.depth and self.pending:
                self._deliver()

    def _watch(self) -> None:
        """Put a `_Note` in front of every Python handler of `SIGNALS` that has none (one
        installed since the last look included; one of ours put back by whoever replaced it
        keeps passing on to the handler it was made for)."""
        for signum in SIGNALS:
            handler = _getsignal(signum)
            if callable(handler) and not isinstance(handler, _Note):
                signal.signal(signum, _Note(handler))
        self.seen = tuple(map(_getsignal, SIGNALS))

    def _deliver(self) -> None:
        """Run the handlers of the signals noted while held, in order (the first that raises
        ends it: one interrupt reaches the caller)."""
        pending, self.pending = self.pending, []
        for handler, signum, frame in pending:
            handler(signum, frame)


HOLD = _Hold()


class _Note:
    """The handler `HOLD` puts in front of ``handler``: it notes the signal while held, else
    passes it on at once."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[int, FrameType | None], Any]) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if HOLD.depth:
            HOLD.pending.append((self.handler, signum, frame))
            return
        HOLD.pending.clear()
        self.handler(signum, frame)


def holding(method: F) -> F:
    """``method`` with every signal `HOLD` covers held while it runs."""

    @functools.wraps(method)
    def held(*args: Any, **kwargs: Any) -> Any:
        with HOLD:
            return method(*args, **kwargs)

    return held  # type: ignore[return-value]
