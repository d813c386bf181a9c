"""What every command prints the same way: numbers and progress bars (light: no torch)."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

LOG_EVERY = 30.0  # seconds between two progress lines in a log (stderr not a terminal)


def sig(x: float | None, digits: int = 3, none: str = "—") -> str:
    """``digits`` significant digits, ∞ (or −∞), or ``none`` for nothing."""
    if x is None:
        return none
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:.{digits}g}"


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``2.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class LogLines:
    """Progress for a log: where stderr is not a terminal (a batch job, ``2> log``), a live
    bar would only leave blank lines; this writes one line — done, elapsed, about how long
    is left — when :data:`LOG_EVERY` seconds have passed since the last, and a last one at
    the end of a job that wrote any. The interface of the rich bar it replaces (a context
    manager; ``advance``, ``update``)."""

    def __init__(self, total: int, description: str, completed: int, stream: TextIO) -> None:
        self.total, self.description, self.done = total, description, completed
        self.first = completed
        self.stream = stream
        self.start = self.last = time.monotonic()
        self.wrote = False

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.wrote and exc[0] is None:
            self._line(time.monotonic())

    def advance(self, task: TaskID, advance: float = 1) -> None:
        self.done += int(advance)
        now = time.monotonic()
        if now - self.last >= LOG_EVERY:
            self._line(now)

    def update(self, task: TaskID, **kw: Any) -> None:
        self.description = kw.get("description", self.description)
        self.done = int(kw.get("completed", self.done))

    def _line(self, now: float) -> None:
        spent, new = now - self.start, self.done - self.first
        rest = ""
        if 0 < new and self.done < self.total:
            rest = f", about {duration(spent / new * (self.total - self.done))} left"
        print(
            f"{self.description}: {self.done}/{self.total} done, {duration(spent)} elapsed{rest}",
            file=self.stream,
            flush=True,
        )
        self.last, self.wrote = now, True


def progress(
    total: int, description: str, enabled: bool = True, *, elapsed: bool = False, completed: int = 0
) -> tuple[Progress | LogLines, TaskID]:
    """A transient progress bar on stderr over ``total`` steps (off unless ``enabled``),
    showing the count and the time remaining (or, ``elapsed``, the time spent), and its task:
    use the bar as a context manager and ``bar.advance(task)``. Stdout keeps only results.
    Where stderr is not a terminal: :class:`LogLines` instead."""
    console = Console(stderr=True)  # a terminal as rich judges it (TTY_COMPATIBLE, …)
    if enabled and not console.is_terminal:
        return LogLines(total, description, completed, sys.stderr), TaskID(0)
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn() if elapsed else TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=True,
    )
    return bar, bar.add_task(description, total=total, completed=completed)
