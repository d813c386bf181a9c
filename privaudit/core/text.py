"""What every command prints the same way: numbers and progress bars (light: no torch)."""

from __future__ import annotations

import math

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def sig(x: float | None, digits: int = 3, none: str = "—") -> str:
    """``digits`` significant digits, ∞ (or −∞), or ``none`` for nothing."""
    if x is None:
        return none
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:.{digits}g}"


def progress(
    total: int, description: str, enabled: bool = True, *, elapsed: bool = False, completed: int = 0
) -> tuple[Progress, TaskID]:
    """A transient progress bar over ``total`` steps (off unless ``enabled``), showing the
    count and the time remaining (or, ``elapsed``, the time spent), and its task: use the
    bar as a context manager and ``bar.advance(task)``."""
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn() if elapsed else TimeRemainingColumn(),
        disable=not enabled,
        transient=True,
    )
    return bar, bar.add_task(description, total=total, completed=completed)
