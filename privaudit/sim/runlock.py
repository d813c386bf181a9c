"""Inter-process locks of a run directory (POSIX ``flock``).

Two lock files live in a run directory:

``.lock``, the writer's lock
    Held exclusively for a whole write session: creating the run, training it, re-simulating
    rounds to capture them, a distributed launch. A second writer is refused at once, with
    the holder's PID and command line, instead of interleaving its files with the first's.
    Readers do not take it: an attack on rounds already on disk runs beside a training.
``.io.lock``
    Held exclusively while one file and the manifest are replaced, and shared while a
    reader reads the manifest and one file, so that a reader never pairs a file with the
    manifest of another write.

The kernel drops both when the holder exits, however it exits: a lock is never stale. Both
are re-entrant within a process. A distributed launch holds the writer's lock in the
launcher and hands it to rank 0 (:func:`adopt`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from privaudit.core.errors import PrivauditError

WRITER = ".lock"
IO = ".io.lock"

_writers: dict[str, list] = {}  # resolved folder -> [fd or None (adopted), depth]
_io: dict[str, list] = {}  # resolved folder -> [fd, depth]


def _key(folder: Path) -> str:
    return str(folder.resolve())


def _open(path: Path, create: bool) -> int:
    flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_NOFOLLOW
    return os.open(path, flags, 0o644)


@contextmanager
def _again(held: list) -> Iterator[None]:
    """Enter a lock this process already holds (``held``: [fd, depth])."""
    held[1] += 1
    try:
        yield
    finally:
        held[1] -= 1


def unwritable(folder: Path, exc: OSError) -> PrivauditError:
    """The error for a run directory this process cannot write."""
    why = exc.strerror or str(exc)
    return PrivauditError(
        f"cannot write the run directory {folder} ({why}): privaudit records the rounds it "
        "trains or re-simulates there; train into a writable --out, or copy the run "
        "somewhere writable (cp -r) and pass the copy"
    )


def busy(folder: Path) -> PrivauditError:
    """The error for a run directory whose writer lock another process holds."""
    return PrivauditError(
        f"{folder} is being written by another privaudit process "
        f"({holder(folder) or 'PID unknown'}); wait for it to finish, or choose another --out"
    )


def check_free(folder: Path) -> None:
    """Refuse at once (:func:`busy`) when another process holds ``folder``'s writer lock: a
    probe a command makes before it loads data, so a second writer is turned away in
    milliseconds. Taking the lock (:func:`writer`) still decides."""
    if _key(folder) in _writers:
        return
    try:
        fd = _open(folder / WRITER, create=False)
    except OSError:
        return  # no lock file (a new run) or unreadable: writer() will say
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise busy(folder) from None
    finally:
        os.close(fd)


def _note() -> bytes:
    """What the holder writes into the lock file: its PID and command line. An argument the
    locale could not decode (a UTF-8 ``--out`` under ``LC_ALL=C``) holds surrogate escapes:
    they go back to its own bytes, and anything else unencodable is backslash-escaped —
    the note never stops a command."""
    text = f"PID {os.getpid()}: {' '.join(sys.argv)}\n"
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def holder(folder: Path) -> str:
    """Who holds ``folder``'s writer lock, as its holder wrote it ("" if unknown)."""
    try:
        return (folder / WRITER).read_text(errors="replace").strip()
    except OSError:
        return ""


@contextmanager
def writer(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s writer lock (creating the folder); refuse at once if another
    process holds it."""
    key = _key(folder)
    if key in _writers:
        with _again(_writers[key]):
            yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _open(folder / WRITER, create=True)
    except OSError as e:
        raise unwritable(folder, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise unwritable(folder, e) from None
        raise busy(folder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, _note(), 0)
    _writers[key] = [fd, 1]
    try:
        yield
    finally:
        _writers[key][1] -= 1
        if _writers[key][1] == 0:
            del _writers[key]
            os.close(fd)


def holds(folder: Path) -> bool:
    """Whether this process holds (or was handed) ``folder``'s writer lock."""
    return _key(folder) in _writers


def adopt(folder: Path, pid: int) -> None:
    """Treat ``folder``'s writer lock as held by this process: its holder, process ``pid``
    (the launcher of this distributed rank), hands its write session over."""
    if not holder(folder).startswith(f"PID {pid}:"):
        raise PrivauditError(
            f"the launcher (PID {pid}) no longer holds {folder}'s lock "
            f"({holder(folder) or 'no holder'}); run privaudit train again"
        )
    _writers.setdefault(_key(folder), [None, 1])


@contextmanager
def io(folder: Path, exclusive: bool) -> Iterator[None]:
    """Hold ``folder``'s I/O lock for one file operation (briefly; waits for the holder).
    A reader of a folder it cannot write reads without it: nobody can write there either
    through this process's permissions."""
    key = _key(folder)
    if key in _io:
        with _again(_io[key]):
            yield
        return
    try:
        fd = _open(folder / IO, create=True)
    except OSError as e:
        if exclusive:
            raise unwritable(folder, e) from None
        try:
            fd = _open(folder / IO, create=False)
        except OSError:
            yield
            return
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    _io[key] = [fd, 1]
    try:
        yield
    finally:
        _io[key][1] -= 1
        if _io[key][1] == 0:
            del _io[key]
            os.close(fd)
