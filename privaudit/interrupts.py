"""Critical sections that Ctrl-C must not cut (an interrupt checkpoint being written)."""

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
