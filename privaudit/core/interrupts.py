"""Ctrl-C as a request to stop at a safe point, sections it must not cut, and Ctrl-C noted
for a caller whose callee catches it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM in the block; the main thread's handlers come back after
    (off the main thread, where handlers cannot be set, the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class StopRequest:
    """Whether SIGINT or SIGTERM arrived (:func:`stop_requests`)."""

    def __init__(self) -> None:
        self.signals = 0

    @property
    def requested(self) -> bool:
        return self.signals > 0


@contextmanager
def stop_requests(at_once_after: int = 3) -> Iterator[StopRequest]:
    """Turn Ctrl-C (SIGINT) and SIGTERM into a request that the block honours at its next
    safe point (a round boundary) instead of an exception wherever the signal lands — which
    can be inside torch's C++ (a crash) or halfway through a round. The ``at_once_after``-th
    signal raises KeyboardInterrupt at once: a terminal's Ctrl-C and the distributed
    launcher's forwarded copy are two signals of one request."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: object) -> None:
        stop.signals += 1
        if stop.signals >= at_once_after:
            raise KeyboardInterrupt

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


class InterruptNote:
    """Whether Ctrl-C (SIGINT) arrived in an :func:`interrupts_noted` block."""

    def __init__(self) -> None:
        self.seen = False


@contextmanager
def interrupts_noted() -> Iterator[InterruptNote]:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt in the block as usual, and is noted first
    (``note.seen``). Code in the block that catches it to return what it has — an audit
    stops between trials and returns the trials done — leaves the note for its caller,
    which can tell a result cut short from a finished one: such a result must be neither
    kept nor followed by the next piece of work. Unlike :func:`stop_requests`, the signal
    stops the block at once. Off the main thread, where handlers cannot be set, the block
    runs as is (nothing is noted)."""
    note = InterruptNote()
    if threading.current_thread() is not threading.main_thread():
        yield note
        return

    def handler(signum: int, frame: object) -> None:
        note.seen = True
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield note
    finally:
        signal.signal(signal.SIGINT, old)
